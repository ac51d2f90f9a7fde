"""Folders of images: classification by sub-folder, segmentation by stem.

:class:`ImageFolderSource` reads one sub-folder of PNG / JPEG files per
class; :class:`SegmentationFolderSource` pairs images with masks of the same
file stem. Both keep files encoded, storing them byte for byte where they can
(see :mod:`estimator_keras.sources.images`).
"""

import logging
import os

import numpy as np

from estimator_keras import io
from estimator_keras.errors import DataError
from estimator_keras.schema import FeatureSpec
from estimator_keras.sources.base import Source, as_indices, preview
from estimator_keras.sources.images import (
    channels_arg, check_same_size, choose_encoding, image_bytes, image_size_arg,
    list_images, mask_bytes, native_ok, probe_all)

logger = logging.getLogger(__name__)


class ImageFolderSource(Source):
    """Image classification data: one sub-folder of PNG / JPEG files per class.

    Class ids follow the sorted sub-folder names (``class_names[i]`` is class
    ``i``). Images stay encoded: feature ``image`` (encoding ``png`` or
    ``jpeg``, shape (height, width, channels)) and ``label`` (int64).

    Without ``image_size`` all images must have the same size, taken from the
    first one, and are stored byte for byte when they share one format; mixed
    formats (or files whose channels differ from ``channels``) make the feature
    PNG, re-encoding only the files that need it. With ``image_size`` images are
    decoded, resized and stored as PNG.

    Args:
      root: folder of class folders (local or ``tf.io.gfile`` path).
      image_size: None, an int, or (height, width).
      channels: 1 or 3.
      verify: decode every image while reading, so a corrupt file is reported
        by name when the dataset is written rather than during training.

    Example::

        source = ImageFolderSource("flowers/", image_size=96)
        source.class_names   # ['daisy', 'roses', ...]
    """

    def __init__(self, root, image_size=None, channels=3, verify=True):
        self.root = str(root)
        self.channels = channels_arg(channels)
        self.image_size = image_size_arg(image_size)
        self.verify = bool(verify)
        if not io.isdir(self.root):
            raise DataError(f"image folder {self.root} does not exist or is not a folder.")
        class_names = [n for n in io.listdir(self.root)
                       if not n.startswith(".") and io.isdir(io.join(self.root, n))]
        if not class_names:
            raise DataError(
                f"image folder {self.root} holds no class sub-folders; expected one "
                f"folder per class (e.g. {self.root}/cat/*.png, {self.root}/dog/*.png).")
        files, labels, ignored = [], [], 0
        for label, name in enumerate(class_names):
            images, others = list_images(io.join(self.root, name))
            ignored += len(others)
            if not images:
                raise DataError(
                    f"class folder {io.join(self.root, name)} holds no images (.png, .jpg, "
                    f".jpeg)"
                    f"{'; it holds ' + preview(others, 5) if others else ''}. Remove "
                    f"it or add images.")
            files.extend(f"{name}/{img}" for img in images)
            labels.extend([label] * len(images))
        if ignored:
            logger.warning("ImageFolderSource %s: ignored %d files that are not "
                           ".png/.jpg/.jpeg", self.root, ignored)
        self.class_names = class_names
        self._files = files
        self._labels = np.asarray(labels, dtype=np.int64)
        self._num_examples = len(files)

        paths = [self._path(i) for i in range(len(files))]
        infos = probe_all(paths)
        if self.image_size is None:
            check_same_size(paths, infos, "Pass image_size to resize them all.")
            height, width = infos[0].height, infos[0].width
        else:
            height, width = self.image_size
        self._encoding, self._reencode = choose_encoding(infos, self.channels, self.image_size)
        if self._reencode.any():
            logger.info("ImageFolderSource %s: %d of %d images will be re-encoded as PNG",
                        self.root, int(self._reencode.sum()), len(files))
        self.features = {
            "image": FeatureSpec("image", "uint8", (height, width, self.channels), self._encoding),
            "label": FeatureSpec("label", "int64", (), "int64"),
        }

    def _path(self, i):
        class_name, name = self._files[i].split("/", 1)
        return io.join(self.root, class_name, name)

    def read(self, indices):
        """The examples at ``indices``, as {name: array}; see the module docstring."""
        idx = as_indices(indices, len(self), self)
        images = np.empty(len(idx), dtype=object)
        shape = self.features["image"].shape
        for k, i in enumerate(idx):
            images[k] = image_bytes(self._path(i), self._reencode[i], self.channels,
                                    self.image_size, self.verify, shape)
        return {"image": images, "label": self._labels[idx]}


class SegmentationFolderSource(Source):
    """Segmentation data: images and masks in two folders, paired by file stem.

    ``images_dir/cat_01.jpg`` pairs with ``masks_dir/cat_01.png``. Feature
    ``image`` keeps the images' encoding (``png`` or ``jpeg``; PNG when mixed,
    re-encoding as :class:`ImageFolderSource` does) and feature ``mask`` is a
    PNG of shape (height, width, 1) whose pixel values are class ids. All
    images must have one size, and each mask its image's size.

    Masks must be grayscale PNGs of any bit depth (or RGB PNGs whose channels
    are equal) holding ids up to 255: JPEG would blur class ids, and TensorFlow
    expands palette PNGs to colours, losing the ids.

    Args:
      images_dir, masks_dir: the two folders (local or ``tf.io.gfile`` paths).
      channels: channels of the stored images, 1 or 3.
      verify: decode every image while reading (see :class:`ImageFolderSource`).
    """

    def __init__(self, images_dir, masks_dir, channels=3, verify=True):
        self.images_dir, self.masks_dir = str(images_dir), str(masks_dir)
        self.channels = channels_arg(channels)
        self.verify = bool(verify)
        for what, d in (("images", self.images_dir), ("masks", self.masks_dir)):
            if not io.isdir(d):
                raise DataError(f"{what} folder {d} does not exist or is not a folder.")
        images = self._by_stem(self.images_dir, "image")
        masks = self._by_stem(self.masks_dir, "mask")
        if not images:
            raise DataError(f"images folder {self.images_dir} holds no images "
                            f"(.png, .jpg, .jpeg).")
        no_mask = sorted(set(images) - set(masks))
        no_image = sorted(set(masks) - set(images))
        if no_mask or no_image:
            parts = []
            if no_mask:
                parts.append(f"{len(no_mask)} images have no mask in {self.masks_dir} "
                             f"(stems: {preview(no_mask, 20)})")
            if no_image:
                parts.append(f"{len(no_image)} masks have no image in {self.images_dir} "
                             f"(stems: {preview(no_image, 20)})")
            raise DataError("images and masks must pair up by file stem, but "
                            + "; ".join(parts) + ".")
        stems = sorted(images)
        self._images = [images[s] for s in stems]
        self._masks = [masks[s] for s in stems]
        self._num_examples = len(stems)

        image_paths = [io.join(self.images_dir, n) for n in self._images]
        mask_paths = [io.join(self.masks_dir, n) for n in self._masks]
        image_infos = probe_all(image_paths)
        mask_infos = probe_all(mask_paths)
        check_same_size(image_paths, image_infos,
                         "Resize them beforehand; segmentation pairs are not resized.")
        height, width = image_infos[0].height, image_infos[0].width
        bad = [p for p, i in zip(mask_paths, mask_infos) if i.fmt != "png" or i.palette]
        if bad:
            raise DataError(
                f"masks must be grayscale PNGs whose pixel values are class ids; "
                f"these are JPEG or palette PNG: {preview(bad, 5)}. Convert them "
                f"to 8-bit grayscale PNG (JPEG blurs class ids; palette colours "
                f"lose them).")
        mismatched = [f"{ip} is {ii.height}x{ii.width} but {mp} is {mi.height}x{mi.width}"
                      for ip, ii, mp, mi in zip(image_paths, image_infos, mask_paths, mask_infos)
                      if (ii.height, ii.width) != (mi.height, mi.width)]
        if mismatched:
            raise DataError(f"each mask must have its image's size; "
                            f"{preview(mismatched, 5)}.")
        encoding, self._reencode = choose_encoding(image_infos, self.channels)
        self._mask_reencode = np.array([not native_ok(i, 1) for i in mask_infos], dtype=bool)
        self._mask_depth = np.array([i.depth for i in mask_infos], dtype=np.uint8)
        self.features = {
            "image": FeatureSpec("image", "uint8", (height, width, self.channels), encoding),
            "mask": FeatureSpec("mask", "uint8", (height, width, 1), "png"),
        }

    @staticmethod
    def _by_stem(directory, what):
        names, _ = list_images(directory)
        by_stem = {}
        for name in names:
            stem = os.path.splitext(name)[0]
            if stem in by_stem:
                raise DataError(f"two {what} files in {directory} share the stem "
                                f"{stem!r} ({by_stem[stem]}, {name}), so pairing is "
                                f"ambiguous; keep one.")
            by_stem[stem] = name
        return by_stem

    def _mask_bytes(self, i, shape):
        return mask_bytes(io.join(self.masks_dir, self._masks[i]), self._mask_reencode[i],
                          int(self._mask_depth[i]), self.verify, shape)

    def read(self, indices):
        """The examples at ``indices``, as {name: array}; see the module docstring."""
        idx = as_indices(indices, len(self), self)
        images = np.empty(len(idx), dtype=object)
        masks = np.empty(len(idx), dtype=object)
        image_shape = self.features["image"].shape
        mask_shape = self.features["mask"].shape
        for k, i in enumerate(idx):
            images[k] = image_bytes(io.join(self.images_dir, self._images[i]),
                                    self._reencode[i], self.channels, None,
                                    self.verify, image_shape)
            masks[k] = self._mask_bytes(i, mask_shape)
        return {"image": images, "mask": masks}
