"""Folders of images: classification by sub-folder, segmentation by stem.

:class:`ImageListSource` reads labelled image files, and
:class:`SegmentationPairsSource` image / mask pairs, as an importer decided
to store them (see :func:`estimator_keras.sources.images.plan_storage`).
:class:`ImageFolderSource` (one sub-folder of images per class) and
:class:`SegmentationFolderSource` (images and masks paired by file stem) list
a folder themselves and keep files encoded, storing them byte for byte where
they can.
"""

import logging
import os

import numpy as np

from estimator_keras import io
from estimator_keras.errors import DataError
from estimator_keras.schema import FeatureSpec
from estimator_keras.sources.base import Source, as_indices, preview
from estimator_keras.sources.images import (
    IMAGE_EXTENSIONS, channels_arg, check_same_size, check_storage, choose_encoding,
    decode_pixels, image_bytes, image_size_arg, list_images, mask_bytes, mask_ids, native_ok,
    probe_all, resize_pixels)

logger = logging.getLogger(__name__)

_KINDS = "/".join(e[1:] for e in IMAGE_EXTENSIONS)


def class_folders(root):
    """Sorted names of the class sub-folders of ``root`` (hidden ones left out)."""
    if not io.isdir(root):
        raise DataError(f"image folder {root} does not exist or is not a folder.")
    return [n for n in io.listdir(root)
            if not n.startswith(".") and io.isdir(io.join(root, n))]


def classification_labels(class_names):
    """The manifest's label record of a classification source."""
    return {"label": {"num_classes": len(class_names), "class_names": list(class_names)}}


class ImageListSource(Source):
    """Labelled image files under one folder, stored as an importer chose.

    Feature ``image`` (uint8, ``shape`` (height, width, channels)) holds
    each file's bytes, a PNG re-encoding (where ``reencode`` is set), or for
    ``encoding`` "raw" the decoded, converted and resized pixels; ``label``
    is the int64 class id. ``labels`` records the class names for the
    manifest.

    Args:
      root: the folder; ``files`` are relative to it ("cat/001.png").
      files, label_ids: one entry per example.
      class_names: ``class_names[i]`` names class ``i``.
      shape: (height, width, channels) of the stored image.
      encoding: "png", "jpeg" or "raw".
      reencode: per file, whether its bytes are decoded and re-encoded.
      image_size: (height, width) re-encoded files are resized to, or None.
      verify: decode files stored as they are, so a corrupt one is named
        when the dataset is written.
    """

    def __init__(self, root, files, label_ids, class_names, *, shape, encoding,
                 reencode, image_size=None, verify=True):
        self.root = str(root)
        self.image_size = image_size
        self._files = list(files)
        self._label_ids = np.asarray(label_ids, dtype=np.int64)
        self.class_names = list(class_names)
        self.channels = channels_arg(int(shape[2]))
        self.verify = bool(verify)
        self._encoding = encoding
        self._reencode = np.asarray(reencode, dtype=bool)
        check_storage(encoding, self._reencode, [io.join(self.root, f) for f in self._files])
        self._num_examples = len(self._files)
        self.labels = classification_labels(self.class_names)
        self.features = {
            "image": FeatureSpec("image", "uint8", tuple(shape), encoding),
            "label": FeatureSpec("label", "int64", (), "int64"),
        }

    def _path(self, i):
        class_name, name = self._files[i].split("/", 1)
        return io.join(self.root, class_name, name)

    def read(self, indices):
        """The examples at ``indices``, as {name: array}; see the module docstring."""
        idx = as_indices(indices, len(self), self)
        shape = self.features["image"].shape
        if self._encoding == "raw":
            images = np.empty((len(idx),) + shape, dtype=np.uint8)
            for k, i in enumerate(idx):
                path = self._path(i)
                images[k] = decode_pixels(io.read_bytes(path), self.channels, shape[:2],
                                          f"image {path}")
        else:
            images = np.empty(len(idx), dtype=object)
            for k, i in enumerate(idx):
                images[k] = image_bytes(self._path(i), self._reencode[i], self.channels,
                                        self.image_size, self.verify, shape)
        return {"image": images, "label": self._label_ids[idx]}


class ImageFolderSource(ImageListSource):
    """Image classification data: one sub-folder of image files per class.

    Class ids follow the sorted sub-folder names (``class_names[i]`` is class
    ``i``). Images stay encoded: feature ``image`` (encoding ``png`` or
    ``jpeg``, shape (height, width, channels)) and ``label`` (int64).
    PNG, JPEG, GIF and BMP files are read; other files are ignored.

    Without ``image_size`` all images must have the same size, taken from the
    first one, and are stored byte for byte when they share one format (PNG
    or JPEG); other formats, mixed formats, or files whose channels differ
    from ``channels`` make the feature PNG, re-encoding only the files that
    need it. With ``image_size`` images are decoded, resized and stored as
    PNG.

    Args:
      root: folder of class folders (a local path or a URI, see :mod:`estimator_keras.io`).
      image_size: None, an int, or (height, width).
      channels: 1 or 3.
      verify: decode every image while reading, so a corrupt file is reported
        by name when the dataset is written rather than during training.

    Example::

        source = ImageFolderSource("flowers/", image_size=96)
        source.class_names   # ['daisy', 'roses', ...]
    """

    def __init__(self, root, image_size=None, channels=3, verify=True):
        root = str(root)
        channels = channels_arg(channels)
        image_size = image_size_arg(image_size)
        class_names = class_folders(root)
        if not class_names:
            raise DataError(
                f"image folder {root} holds no class sub-folders; expected one "
                f"folder per class (e.g. {root}/cat/*.png, {root}/dog/*.png).")
        files, labels, ignored = [], [], 0
        for label, name in enumerate(class_names):
            images, others = list_images(io.join(root, name))
            ignored += len(others)
            if not images:
                raise DataError(
                    f"class folder {io.join(root, name)} holds no images ({_KINDS})"
                    f"{'; it holds ' + preview(others, 5) if others else ''}. Remove "
                    f"it or add images.")
            files.extend(io.join(name, img) for img in images)
            labels.extend([label] * len(images))
        if ignored:
            logger.warning("ImageFolderSource %s: ignored %d files that are not "
                           "images (%s)", root, ignored, _KINDS)
        paths = [io.join(root, f) for f in files]
        infos = probe_all(paths)
        if image_size is None:
            check_same_size(paths, infos, "Pass image_size to resize them all.")
            height, width = infos[0].height, infos[0].width
        else:
            height, width = image_size
        encoding, reencode = choose_encoding(infos, channels, image_size)
        if reencode.any():
            logger.info("ImageFolderSource %s: %d of %d images will be re-encoded as PNG",
                        root, int(reencode.sum()), len(files))
        super().__init__(root, files, labels, class_names,
                         shape=(height, width, channels), encoding=encoding,
                         reencode=reencode, image_size=image_size, verify=verify)


def pair_by_stem(images_dir, masks_dir):
    """(stems, image names, mask names, other names) of two folders whose
    images and masks pair up by file stem; DataError naming unpaired stems.
    ``other names`` are the files of neither folder that are not images."""
    for what, d in (("images", images_dir), ("masks", masks_dir)):
        if not io.isdir(d):
            raise DataError(f"{what} folder {d} does not exist or is not a folder.")
    images, other_images = _by_stem(images_dir, "image")
    masks, other_masks = _by_stem(masks_dir, "mask")
    if not images:
        raise DataError(f"images folder {images_dir} holds no images ({_KINDS}).")
    no_mask = sorted(set(images) - set(masks))
    no_image = sorted(set(masks) - set(images))
    if no_mask or no_image:
        parts = []
        if no_mask:
            parts.append(f"{len(no_mask)} images have no mask in {masks_dir} "
                         f"(stems: {preview(no_mask, 20)})")
        if no_image:
            parts.append(f"{len(no_image)} masks have no image in {images_dir} "
                         f"(stems: {preview(no_image, 20)})")
        raise DataError("images and masks must pair up by file stem, but "
                        + "; ".join(parts) + ".")
    stems = sorted(images)
    others = ([io.join(images_dir, n) for n in other_images]
              + [io.join(masks_dir, n) for n in other_masks])
    return stems, [images[s] for s in stems], [masks[s] for s in stems], others


def _by_stem(directory, what):
    names, others = list_images(directory)
    by_stem = {}
    for name in names:
        stem = os.path.splitext(name)[0]
        if stem in by_stem:
            raise DataError(f"two {what} files in {directory} share the stem "
                            f"{stem!r} ({by_stem[stem]}, {name}), so pairing is "
                            f"ambiguous; keep one.")
        by_stem[stem] = name
    return by_stem, others


def check_masks(image_paths, image_infos, mask_paths, mask_infos):
    """DataError unless every mask is a grayscale PNG of its image's size."""
    bad = [p for p, i in zip(mask_paths, mask_infos) if i.fmt != "png" or i.palette]
    if bad:
        raise DataError(
            f"masks must be grayscale PNGs whose pixel values are class ids; "
            f"these are not PNG or are palette PNGs: {preview(bad, 5)}. Convert them "
            f"to 8-bit grayscale PNG (JPEG blurs class ids; palette colours "
            f"lose them).")
    mismatched = [f"{ip} is {ii.height}x{ii.width} but {mp} is {mi.height}x{mi.width}"
                  for ip, ii, mp, mi in zip(image_paths, image_infos, mask_paths, mask_infos)
                  if (ii.height, ii.width) != (mi.height, mi.width)]
    if mismatched:
        raise DataError(f"each mask must have its image's size; "
                        f"{preview(mismatched, 5)}.")


class SegmentationPairsSource(Source):
    """Image / mask pairs from two folders, stored as an importer chose.

    Feature ``image`` is as in :class:`ImageListSource`; feature ``mask``
    (uint8, (height, width, 1), pixel values are class ids) is an 8-bit
    grayscale PNG, or raw pixels resized by nearest neighbour when
    ``encoding`` is "raw". With ``num_classes``, ``labels`` records it for
    the manifest.

    Args:
      images_dir, masks_dir: the folders; ``images`` and ``masks`` are file
        names in them, one pair per example.
      shape, encoding, reencode, verify: as for :class:`ImageListSource`.
      mask_infos: each mask's :class:`~estimator_keras.sources.images.ImageInfo`.
      num_classes: largest class id + 1, or None when unknown.
    """

    def __init__(self, images_dir, masks_dir, images, masks, *, shape, encoding, reencode,
                 mask_infos, num_classes=None, verify=True):
        self.images_dir, self.masks_dir = str(images_dir), str(masks_dir)
        self._images, self._masks = list(images), list(masks)
        self.channels = channels_arg(int(shape[2]))
        self.verify = bool(verify)
        self._encoding = encoding
        self._reencode = np.asarray(reencode, dtype=bool)
        self._mask_reencode = np.array([not native_ok(i, 1) for i in mask_infos], dtype=bool)
        self._mask_depth = np.array([i.depth for i in mask_infos], dtype=np.uint8)
        check_storage(encoding, self._reencode,
                      [io.join(self.images_dir, n) for n in self._images])
        check_storage("raw" if encoding == "raw" else "png", self._mask_reencode,
                      [io.join(self.masks_dir, n) for n in self._masks], "masks")
        self._num_examples = len(self._images)
        self.num_classes = num_classes
        self.labels = ({"mask": {"num_classes": int(num_classes), "class_names": None}}
                       if num_classes else None)
        height, width = shape[:2]
        self.features = {
            "image": FeatureSpec("image", "uint8", tuple(shape), encoding),
            "mask": FeatureSpec("mask", "uint8", (height, width, 1),
                                "raw" if encoding == "raw" else "png"),
        }

    def _mask_bytes(self, i, shape):
        return mask_bytes(io.join(self.masks_dir, self._masks[i]), self._mask_reencode[i],
                          int(self._mask_depth[i]), self.verify, shape)

    def _raw_pair(self, i, size):
        image_path = io.join(self.images_dir, self._images[i])
        mask_path = io.join(self.masks_dir, self._masks[i])
        image = decode_pixels(io.read_bytes(image_path), self.channels, size,
                              f"image {image_path}")
        ids = mask_ids(io.read_bytes(mask_path), int(self._mask_depth[i]), mask_path)
        return image, resize_pixels(ids, size, nearest=True)

    def read(self, indices):
        """The examples at ``indices``, as {name: array}; see the module docstring."""
        idx = as_indices(indices, len(self), self)
        image_shape = self.features["image"].shape
        mask_shape = self.features["mask"].shape
        if self._encoding == "raw":
            images = np.empty((len(idx),) + image_shape, dtype=np.uint8)
            masks = np.empty((len(idx),) + mask_shape, dtype=np.uint8)
            for k, i in enumerate(idx):
                images[k], masks[k] = self._raw_pair(i, image_shape[:2])
            return {"image": images, "mask": masks}
        images = np.empty(len(idx), dtype=object)
        masks = np.empty(len(idx), dtype=object)
        for k, i in enumerate(idx):
            images[k] = image_bytes(io.join(self.images_dir, self._images[i]),
                                    self._reencode[i], self.channels, None,
                                    self.verify, image_shape)
            masks[k] = self._mask_bytes(i, mask_shape)
        return {"image": images, "mask": masks}


class SegmentationFolderSource(SegmentationPairsSource):
    """Segmentation data: images and masks in two folders, paired by file stem.

    ``images_dir/cat_01.jpg`` pairs with ``masks_dir/cat_01.png``. Feature
    ``image`` keeps the images' encoding (``png`` or ``jpeg``; PNG when mixed
    or of another format, re-encoding as :class:`ImageFolderSource` does) and
    feature ``mask`` is a PNG of shape (height, width, 1) whose pixel values
    are class ids. All images must have one size, and each mask its image's
    size.

    Masks must be grayscale PNGs of any bit depth (or RGB PNGs whose channels
    are equal) holding ids up to 255: JPEG would blur class ids, and TensorFlow
    expands palette PNGs to colours, losing the ids.

    Args:
      images_dir, masks_dir: the two folders (local paths or URIs).
      channels: channels of the stored images, 1 or 3.
      verify: decode every image while reading (see :class:`ImageFolderSource`).
      num_classes: recorded in ``labels`` for the manifest when given.
    """

    def __init__(self, images_dir, masks_dir, channels=3, verify=True, num_classes=None):
        images_dir, masks_dir = str(images_dir), str(masks_dir)
        channels = channels_arg(channels)
        _, images, masks, _ = pair_by_stem(images_dir, masks_dir)
        image_paths = [io.join(images_dir, n) for n in images]
        mask_paths = [io.join(masks_dir, n) for n in masks]
        image_infos = probe_all(image_paths)
        mask_infos = probe_all(mask_paths)
        check_same_size(image_paths, image_infos,
                        "Resize them beforehand; segmentation pairs are not resized.")
        check_masks(image_paths, image_infos, mask_paths, mask_infos)
        encoding, reencode = choose_encoding(image_infos, channels)
        super().__init__(images_dir, masks_dir, images, masks,
                         shape=image_infos[0].size + (channels,), encoding=encoding,
                         reencode=reencode, mask_infos=mask_infos,
                         num_classes=num_classes, verify=verify)
