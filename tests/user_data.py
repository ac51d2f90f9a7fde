"""A user's own data, made from the real Fashion-MNIST for the tests: image
folders (PNG, JPEG at another size, GIF, BMP, plus a corrupt file and a text
file), ImageNet-style, seed-question-style and TFDS-style TFRecord files, and
segmentation folders. Every maker returns what it wrote, so that tests can
check what ``prepare`` records.

Example::

    folder = make_image_folder(tmp_path / "photos", per_class=20)
    folder.counts["trouser"]   # 20 readable images (bad files not counted)
"""

import dataclasses
import os
import struct

import numpy as np
import tensorflow as tf

from estimator_keras.inputs import make_dataset
from estimator_keras.sources import (
    DEBIAN_FASHION_MNIST_DIR, IdxSource, find_idx_files, read_idx)

FASHION_CLASSES = ("t-shirt_top", "trouser", "pullover", "dress", "coat", "sandal", "shirt",
                   "sneaker", "bag", "ankle_boot")
"""Fashion-MNIST's classes in label order, as folder names."""


def fashion_examples(per_class, split="train", classes=10, skip=0):
    """(images (N, 28, 28) uint8, labels (N,)): the first ``per_class`` images
    of each of the first ``classes`` classes after ``skip`` of each, in file
    order, interleaved by class."""
    images_path, labels_path = find_idx_files(DEBIAN_FASHION_MNIST_DIR, split)
    source = IdxSource(images_path, labels_path)
    labels = read_idx(labels_path)
    picked = [np.flatnonzero(labels == c)[skip:skip + per_class] for c in range(classes)]
    if min(len(p) for p in picked) < per_class:
        raise ValueError(f"not enough examples for {per_class} per class after {skip}")
    order = np.stack(picked, axis=1).reshape(-1)
    batch = source.read(order)
    return batch["image"][..., 0], batch["label"].astype(np.int64)


def encode(image, fmt):
    """Encoded bytes of a uint8 (h, w) or (h, w, c) image: png, jpeg, gif or bmp."""
    image = image if image.ndim == 3 else image[..., None]
    if fmt == "png":
        return tf.io.encode_png(image).numpy()
    if fmt == "jpeg":
        return tf.io.encode_jpeg(image, quality=95).numpy()
    if fmt == "gif":
        return gif_bytes(image)
    if fmt == "bmp":
        return bmp_bytes(image)
    raise ValueError(fmt)


def resized(image, size, channels=1):
    """A grey (h, w) image resized to ``size`` with ``channels`` (RGB copies grey)."""
    out = tf.image.resize(image[..., None].astype(np.float32), size, antialias=True)
    out = np.clip(np.round(out.numpy()), 0, 255).astype(np.uint8)
    return np.repeat(out, channels, axis=2)


def bmp_bytes(image, palette=None):
    """An uncompressed BMP: 8-bit for 1 channel (a grey palette, or ``palette``
    (256, 3) RGB with ``image`` holding its indices), else 24-bit."""
    height, width, channels = image.shape
    grey = channels == 1
    row = width * (1 if grey else 3)
    pad = (-row) % 4
    pixels = image if grey else image[..., ::-1]  # BGR
    rows = b"".join(pixels[y].tobytes() + b"\0" * pad for y in range(height - 1, -1, -1))
    if palette is None:
        palette = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 3, axis=1)
    palette = (b"".join(bytes([b, g, r, 0]) for r, g, b in np.asarray(palette, np.uint8))
               if grey else b"")
    offset = 14 + 40 + len(palette)
    header = b"BM" + struct.pack("<IHHI", offset + len(rows), 0, 0, offset)
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 8 if grey else 24, 0,
                       len(rows), 2835, 2835, 256 if grey else 0, 0)
    return header + info + palette + rows


def gif_bytes(image):
    """A GIF of a grey image (a grey palette, so pixels are exact) or an RGB one
    (a 6x6x6 colour cube). LZW codes stay 9 bits wide: a clear code comes
    before the table would grow."""
    height, width, channels = image.shape
    if channels == 1:
        palette = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 3, axis=1)
        indices = image[..., 0].reshape(-1)
    else:
        levels = np.round(image.astype(np.float32) / 51).astype(np.int64)
        indices = (levels[..., 0] * 36 + levels[..., 1] * 6 + levels[..., 2]).reshape(-1)
        cube = np.stack(np.meshgrid(*[np.arange(6) * 51] * 3, indexing="ij"), -1)
        palette = np.zeros((256, 3), np.uint8)
        palette[:216] = cube.reshape(-1, 3)
    clear, end = 256, 257
    codes = []
    for start in range(0, len(indices), 250):
        codes.append(clear)
        codes.extend(int(i) for i in indices[start:start + 250])
    codes.append(end)
    bits = "".join(format(c, "09b")[::-1] for c in codes)
    bits += "0" * ((-len(bits)) % 8)
    data = bytes(int(bits[i:i + 8][::-1], 2) for i in range(0, len(bits), 8))
    blocks = b"".join(bytes([len(data[i:i + 255])]) + data[i:i + 255]
                      for i in range(0, len(data), 255))
    return (b"GIF89a" + struct.pack("<HHBBB", width, height, 0xF7, 0, 0)
            + palette.tobytes() + b"," + struct.pack("<HHHHB", 0, 0, width, height, 0)
            + bytes([8]) + blocks + b"\0;")


def write_file(path, data):
    """Writes bytes to ``path``, creating its folder; returns the path."""
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


@dataclasses.dataclass
class ImageFolder:
    """What :func:`make_image_folder` wrote.

    Attributes:
      root: the folder to pass as ``--source-dir``.
      class_names: sorted class folder names (class id = position).
      counts: readable images per class name (per split for layout "split":
        {"train": {...}, "test": {...}}).
      bad: the unreadable files, relative to ``root``.
      files: (path, class name, the 28x28 grey pixels it was made from) of
        every readable image.
    """

    root: str
    class_names: list
    counts: dict
    bad: list
    files: list


def make_image_folder(root, per_class=20, *, split="train", classes=10, skip=0,
                      jpeg_every=5, jpeg_size=(36, 36), gif_every=0, bmp_every=0,
                      bad_files=True, layout="flat", test_per_class=5):
    """Real Fashion-MNIST images as files in class folders.

    Most are 28x28 grey PNGs; every ``jpeg_every``-th is an RGB JPEG of
    ``jpeg_size``; every ``gif_every``-th a GIF and every ``bmp_every``-th a
    BMP (28x28 grey). With ``bad_files`` the first class gets a truncated PNG
    (``broken.png``) and a text file (``notes.txt``). ``layout`` "split"
    writes ``root/train`` (``per_class``) and ``root/test``
    (``test_per_class``, from Fashion-MNIST's test split).
    """
    root = str(root)
    names = list(FASHION_CLASSES[:classes])
    if layout == "split":
        train = make_image_folder(os.path.join(root, "train"), per_class, split="train",
                                  classes=classes, skip=skip, jpeg_every=jpeg_every,
                                  jpeg_size=jpeg_size, gif_every=gif_every,
                                  bmp_every=bmp_every, bad_files=bad_files)
        test = make_image_folder(os.path.join(root, "test"), test_per_class, split="test",
                                 classes=classes, skip=skip, jpeg_every=jpeg_every,
                                 jpeg_size=jpeg_size, bad_files=False)
        return ImageFolder(root, train.class_names, {"train": train.counts,
                                                     "test": test.counts},
                           [f"train/{b}" for b in train.bad], train.files + test.files)
    images, labels = fashion_examples(per_class, split, classes, skip)
    files, counts = [], {n: 0 for n in names}
    for k, (image, label) in enumerate(zip(images, labels)):
        name = names[label]
        # The examples take turns by class: counting turns, not examples,
        # gives every class its share of each file format.
        turn = k // classes
        if jpeg_every and turn % jpeg_every == jpeg_every - 1:
            fmt, pixels = "jpeg", resized(image, jpeg_size, 3)
        elif gif_every and turn % gif_every == gif_every - 2:
            fmt, pixels = "gif", image[..., None]
        elif bmp_every and turn % bmp_every == bmp_every - 3:
            fmt, pixels = "bmp", image[..., None]
        else:
            fmt, pixels = "png", image[..., None]
        ext = {"jpeg": "jpg"}.get(fmt, fmt)
        path = write_file(os.path.join(root, name, f"{split}_{k:05d}.{ext}"), encode(pixels, fmt))
        files.append((path, name, image))
        counts[name] += 1
    bad = []
    if bad_files:
        bad = [f"{names[0]}/broken.png", f"{names[0]}/notes.txt"]
        write_file(os.path.join(root, bad[0]), encode(images[0][..., None], "png")[:100])
        write_file(os.path.join(root, bad[1]), b"These are my favourite shirts.\n")
    return ImageFolder(root, sorted(names), counts, bad, files)


def example(features):
    """A serialized tf.train.Example of bytes and int values."""
    def value(v):
        if isinstance(v, bytes):
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v)]))
    return tf.train.Example(features=tf.train.Features(
        feature={k: value(v) for k, v in features.items()})).SerializeToString()


def write_records(path, examples, compression=None):
    """Writes serialized examples to one TFRecord file; returns its path."""
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    with tf.io.TFRecordWriter(str(path), compression or "") as writer:
        for record in examples:
            writer.write(record)
    return str(path)


@dataclasses.dataclass
class RecordFiles:
    """What a TFRecord maker wrote: the files, and the label and the 28x28
    grey source pixels of each record, in file order."""

    files: list
    labels: np.ndarray
    images: np.ndarray


def make_imagenet_tfrecords(directory, per_class=20, *, split="train", classes=10,
                            num_files=3, sizes=((28, 28), (40, 40), (36, 44)), colour=True,
                            label_offset=0, skip=0, prefix="train"):
    """ImageNet-style records (as Inception's build_imagenet_data writes):
    ``image/encoded`` JPEG of varying ``sizes`` (RGB when ``colour``),
    ``image/class/label`` (class id + ``label_offset``; ImageNet's own files
    count from 1), ``image/class/text``, ``image/height``, ``image/width``,
    ``image/format`` and ``image/filename``, over ``num_files`` files named
    ``PREFIX-0000N-of-0000M``."""
    images, labels = fashion_examples(per_class, split, classes, skip)
    examples = []
    for k, (image, label) in enumerate(zip(images, labels)):
        size = sizes[k % len(sizes)]
        pixels = resized(image, size, 3 if colour else 1)
        examples.append(example({
            "image/encoded": encode(pixels, "jpeg"), "image/format": b"JPEG",
            "image/height": size[0], "image/width": size[1],
            "image/colorspace": b"RGB" if colour else b"Grayscale",
            "image/channels": 3 if colour else 1,
            "image/class/label": label + label_offset,
            "image/class/text": FASHION_CLASSES[label].encode(),
            "image/filename": f"{split}_{k:05d}.JPEG".encode()}))
    files = [write_records(os.path.join(str(directory),
                                         f"{prefix}-{i:05d}-of-{num_files:05d}"),
                            examples[i::num_files]) for i in range(num_files)]
    order = np.concatenate([np.arange(len(labels))[i::num_files] for i in range(num_files)])
    return RecordFiles(files, labels[order], images[order])


def make_seed_tfrecords(path, per_class=20, *, split="train", classes=10, skip=0,
                        compression=None):
    """One file in the seed question's layout: int64 ``height``, ``width``,
    ``depth``, ``label`` and bytes ``image_raw`` (28x28x1 uint8)."""
    images, labels = fashion_examples(per_class, split, classes, skip)
    examples = [example({"height": 28, "width": 28, "depth": 1, "label": label,
                          "image_raw": image.tobytes()})
                for image, label in zip(images, labels)]
    return RecordFiles([write_records(path, examples, compression)], labels, images)


def make_tfds_tfrecords(directory, per_class=20, *, split="train", classes=10,
                        num_files=2, skip=0, names_file=True):
    """TFDS-style shards: ``fashion_mnist-SPLIT.tfrecord-0000N-of-0000M`` with
    ``image`` (PNG) and ``label``, and TFDS's ``label.labels.txt``."""
    images, labels = fashion_examples(per_class, split, classes, skip)
    examples = [example({"image": encode(image[..., None], "png"), "label": label})
                for image, label in zip(images, labels)]
    files = [write_records(os.path.join(str(directory), f"fashion_mnist-{split}.tfrecord-"
                                         f"{i:05d}-of-{num_files:05d}"), examples[i::num_files])
             for i in range(num_files)]
    if names_file:
        write_file(os.path.join(str(directory), "label.labels.txt"),
               "\n".join(FASHION_CLASSES[:classes]).encode() + b"\n")
    order = np.concatenate([np.arange(len(labels))[i::num_files] for i in range(num_files)])
    return RecordFiles(files, labels[order], images[order])


@dataclasses.dataclass
class SegmentationFolder:
    """What :func:`make_segmentation_folder` wrote: the root, the stems, and
    each stem's image and mask pixels."""

    root: str
    stems: list
    images: dict
    masks: dict


def fashion_mask(image, label, classes=3):
    """Class ids of a Fashion-MNIST image: 0 background; the garment's pixels
    1 (or, with ``classes`` 3, 1 for tops and 2 for everything else)."""
    foreground = image > 20
    kind = 1 if classes == 2 or label in (0, 2, 4, 6) else 2
    return (foreground * kind).astype(np.uint8)


def make_segmentation_folder(root, count=40, *, split="train", classes=3, skip=0,
                             jpeg_every=0, odd_size_every=0):
    """``root/images/NNNNN.png`` (grey Fashion-MNIST images; every
    ``jpeg_every``-th a JPEG) paired with ``root/masks/NNNNN.png`` (class ids
    from :func:`fashion_mask`); every ``odd_size_every``-th pair is 32x32."""
    per_class = -(-count // 10)
    images, labels = fashion_examples(per_class, split, 10, skip)
    stems, want_images, want_masks = [], {}, {}
    for k in range(count):
        stem = f"{split}_{k:05d}"
        image, mask = images[k], fashion_mask(images[k], labels[k], classes)
        # Fashion-MNIST's classes take turns (class k % 10): shifting by one
        # each round spreads every variant over the classes.
        turn = k + k // 10
        if odd_size_every and turn % odd_size_every == odd_size_every - 1:
            image = resized(image, (32, 32))[..., 0]
            mask = tf.image.resize(mask[..., None], (32, 32), "nearest").numpy()[..., 0]
        fmt = "jpeg" if jpeg_every and turn % jpeg_every == jpeg_every - 1 else "png"
        write_file(os.path.join(str(root), "images", f"{stem}.{'jpg' if fmt == 'jpeg' else 'png'}"),
               encode(image[..., None], fmt))
        write_file(os.path.join(str(root), "masks", f"{stem}.png"), encode(mask[..., None], "png"))
        stems.append(stem)
        want_images[stem], want_masks[stem] = image, mask
    return SegmentationFolder(str(root), stems, want_images, want_masks)


def read_back(directory, split, label="label"):
    """(images as uint8, labels) of a prepared dataset's split, in file order."""
    images, labels = [], []
    for features, target in make_dataset(str(directory), 4096, training=False, split=split,
                                         features={"image": "image"}, label=label):
        images.append(np.round(features["image"].numpy()).astype(np.uint8))
        labels.append(target.numpy())
    return np.concatenate(images), np.concatenate(labels)
