"""Tests of estimator_keras.sources: the readers the dataset writer consumes."""

import gzip
import os
import pickle
import shutil
import struct
import zlib
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf

from estimator_keras import sources
from estimator_keras.errors import DataError, SchemaError, UsageError
from estimator_keras.sources import (
    DEBIAN_FASHION_MNIST_DIR, IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC, SHAPES_CLASSES,
    ArraySource, IdxSource, ImageFolderSource, SegmentationFolderSource, ShapesSource,
    download_idx, find_idx_files, read_idx, write_idx)

needs_fashion_mnist = pytest.mark.skipif(
    not os.path.isdir(DEBIAN_FASHION_MNIST_DIR),
    reason=f"{DEBIAN_FASHION_MNIST_DIR} missing (apt-get install dataset-fashion-mnist)")


def _png(array):
    return tf.io.encode_png(array).numpy()


def _jpeg(array):
    return tf.io.encode_jpeg(array, quality=95).numpy()


def _decode(data, channels=0):
    return tf.io.decode_image(data, channels=channels, expand_animations=False).numpy()


def _png_1bit(mask):
    """A 1-bit grayscale PNG of a 0/1 mask (TF cannot write one), built by hand."""
    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    h, w = mask.shape
    rows = b"".join(b"\0" + np.packbits(row.astype(np.uint8)).tobytes() for row in mask)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 1, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def _write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


def _gunzip(src, dst):
    with gzip.open(src, "rb") as fin, open(dst, "wb") as fout:
        shutil.copyfileobj(fin, fout)
    return str(dst)


# --------------------------------------------------------------------------
# IDX on the real Fashion-MNIST.

@needs_fashion_mnist
@pytest.mark.parametrize("split,count", [("train", 60000), ("test", 10000)])
def test_real_fashion_mnist_counts_classes_and_random_reads(tmp_path, split, count):
    images_path, labels_path = find_idx_files(DEBIAN_FASHION_MNIST_DIR, split)
    images = read_idx(images_path, IDX_IMAGES_MAGIC)
    labels = read_idx(labels_path, IDX_LABELS_MAGIC)
    assert images.shape == (count, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (count,)
    # Fashion-MNIST is exactly balanced: 10 classes of count / 10.
    np.testing.assert_array_equal(np.bincount(labels), [count // 10] * 10)

    source = IdxSource(images_path, labels_path, cache_dir=str(tmp_path))
    assert len(source) == count
    assert source.features["image"].shape == (28, 28, 1)
    assert source.features["image"].encoding == "raw"
    assert source.features["label"].dtype == "int64"
    idx = np.random.default_rng(0).integers(0, count, 300)
    idx[:3] = [count - 1, 0, count - 1]  # unsorted, repeated, both ends
    batch = source.read(idx)
    np.testing.assert_array_equal(batch["image"], images[idx][..., None])
    np.testing.assert_array_equal(batch["label"], labels[idx])
    assert batch["label"].dtype == np.int64


@needs_fashion_mnist
def test_gz_and_uncompressed_idx_are_identical(tmp_path):
    gz_images, gz_labels = find_idx_files(DEBIAN_FASHION_MNIST_DIR, "test")
    plain = tmp_path / "plain"
    plain.mkdir()
    images = _gunzip(gz_images, plain / "t10k-images-idx3-ubyte")
    labels = _gunzip(gz_labels, plain / "t10k-labels-idx1-ubyte")
    np.testing.assert_array_equal(read_idx(images), read_idx(gz_images))
    np.testing.assert_array_equal(read_idx(labels), read_idx(gz_labels))

    # Uncompressed files are memory-mapped in place: no cache file appears.
    cache = tmp_path / "cache"
    plain_source = IdxSource(images, labels, cache_dir=str(cache))
    assert not cache.exists()
    gz_source = IdxSource(gz_images, gz_labels, cache_dir=str(cache))
    assert len(os.listdir(cache)) == 2
    idx = np.array([9999, 3, 3, 0, 5000])
    a, b = plain_source.read(idx), gz_source.read(idx)
    np.testing.assert_array_equal(a["image"], b["image"])
    np.testing.assert_array_equal(a["label"], b["label"])

    # With both present, the uncompressed file wins (memory-mapped in place).
    shutil.copy(gz_images, plain)
    assert find_idx_files(str(plain), "test")[0] == images


# --------------------------------------------------------------------------
# IDX on small synthetic files.

@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16", "int32", "float32", "float64"])
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_write_read_idx_round_trip_every_dtype(tmp_path, dtype, suffix):
    array = (np.arange(2 * 3 * 5) - 7).reshape(2, 3, 5).astype(dtype)
    path = str(tmp_path / f"a.idx{suffix}")
    write_idx(path, array)
    back = read_idx(path)
    assert back.dtype == np.dtype(dtype) and back.dtype.isnative
    np.testing.assert_array_equal(back, array)


def test_idx_bytes_are_big_endian_per_spec(tmp_path):
    path = str(tmp_path / "x.idx")
    write_idx(path, np.array([258, -2], dtype=np.int16))
    with open(path, "rb") as f:
        assert f.read() == b"\x00\x00\x0b\x01" + b"\x00\x00\x00\x02" + b"\x01\x02\xff\xfe"
    # A hand-made labels file (magic 0x801) reads back as written.
    _write(str(tmp_path / "l.idx"), struct.pack(">II", 0x801, 3) + bytes([7, 0, 9]))
    np.testing.assert_array_equal(read_idx(tmp_path / "l.idx", IDX_LABELS_MAGIC), [7, 0, 9])


def _small_idx(tmp_path, n=6, suffix=""):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (n, 4, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, n).astype(np.uint8)
    ip, lp = str(tmp_path / f"img{suffix}"), str(tmp_path / f"lab{suffix}")
    write_idx(ip, images)
    write_idx(lp, labels)
    return ip, lp, images, labels


def test_truncated_idx_raises_data_error_naming_file(tmp_path):
    ip, lp, _, _ = _small_idx(tmp_path)
    with open(ip, "rb") as f:
        data = f.read()
    truncated = _write(str(tmp_path / "cut-images"), data[:-3])
    for fn in (lambda: read_idx(truncated),
               lambda: IdxSource(truncated, lp, cache_dir=str(tmp_path / "c"))):
        with pytest.raises(DataError, match="truncated") as info:
            fn()
        assert truncated in str(info.value)
    # Cut inside the header itself.
    with pytest.raises(DataError, match="cut-header"):
        read_idx(_write(str(tmp_path / "cut-header"), data[:6]))
    # Compressed, cut: both the gzip stream and the IDX data are short.
    cut_gz = _write(str(tmp_path / "cut.gz"), gzip.compress(data)[:-20])
    for fn in (lambda: read_idx(cut_gz),
               lambda: IdxSource(cut_gz, lp, cache_dir=str(tmp_path / "c"))):
        with pytest.raises(DataError, match="truncated") as info:
            fn()
        assert cut_gz in str(info.value)
    # Longer than the header says.
    longer = _write(str(tmp_path / "long-images"), data + b"\0\0")
    with pytest.raises(DataError, match="long-images"):
        read_idx(longer)
    with pytest.raises(DataError, match="long-images"):
        IdxSource(longer, lp)


def test_bad_magic_raises_data_error_naming_file(tmp_path):
    bad = _write(str(tmp_path / "bad-magic"), b"\x12\x34\x56\x78" + bytes(100))
    with pytest.raises(DataError, match="magic") as info:
        read_idx(bad)
    assert bad in str(info.value)
    ip, lp, _, _ = _small_idx(tmp_path)
    # Labels given where images are expected: the message says what was expected.
    with pytest.raises(DataError, match="0x00000803") as info:
        IdxSource(lp, lp)
    assert lp in str(info.value)
    # A .gz name on a file that is not gzip.
    not_gz = _write(str(tmp_path / "fake.gz"), b"plain bytes, not gzip")
    with pytest.raises(DataError, match="fake.gz"):
        read_idx(not_gz)


def test_idx_source_checks_counts_and_reads_gz_through_cache(tmp_path):
    ip, lp, images, labels = _small_idx(tmp_path, suffix=".gz")
    source = IdxSource(ip, lp, image_feature="x", label_feature="y",
                       cache_dir=str(tmp_path / "cache"))
    assert list(source.features) == ["x", "y"]
    idx = np.array([5, 0, 5, 2])
    batch = source.read(idx)
    np.testing.assert_array_equal(batch["x"], images[idx][..., None])
    np.testing.assert_array_equal(batch["y"], labels[idx])
    assert source.read(np.array([], dtype=np.int64))["x"].shape == (0, 4, 3, 1)
    with pytest.raises(IndexError, match="6 examples"):
        source.read(np.array([6]))
    with pytest.raises(UsageError):
        source.read(np.zeros((2, 2), dtype=np.int64))

    other = str(tmp_path / "labels7")
    write_idx(other, np.zeros(7, np.uint8))
    with pytest.raises(DataError, match="6 examples.*7") as info:
        IdxSource(ip, other, cache_dir=str(tmp_path / "cache"))
    assert other in str(info.value)


def test_find_idx_files_name_variants_and_missing(tmp_path):
    for name in ("train-images-idx3-ubyte.gz", "train-labels.idx1-ubyte",
                 "t10k-images.idx3-ubyte.gz"):
        _write(str(tmp_path / name), b"")
    assert find_idx_files(str(tmp_path), "train") == (
        str(tmp_path / "train-images-idx3-ubyte.gz"), str(tmp_path / "train-labels.idx1-ubyte"))
    with pytest.raises(DataError) as info:
        find_idx_files(str(tmp_path), "test")
    message = str(info.value)
    assert "t10k-labels-idx1-ubyte.gz" in message and "t10k-labels.idx1-ubyte" in message
    assert "t10k-images" not in message  # found, so not reported
    with pytest.raises(UsageError, match="'validation'"):
        find_idx_files(str(tmp_path), "validation")
    with pytest.raises(DataError, match="does not exist"):
        find_idx_files(str(tmp_path / "nope"), "train")


# --------------------------------------------------------------------------
# download_idx, with get_file mocked: it must never touch the network here.

KERAS_URL = "https://storage.googleapis.com/tensorflow/tf-keras-datasets/"


# The URLs and the npz conversion, with hashes checked: tests/test_caches.py.


def test_download_failure_is_a_data_error_with_advice(tmp_path):
    error = Exception("URL fetch failure on https://...: None -- [Errno -3] "
                      "Temporary failure in name resolution")
    with mock.patch.object(tf.keras.utils, "get_file", side_effect=error):
        with pytest.raises(DataError) as info:
            download_idx("fashion_mnist", str(tmp_path))
    message = str(info.value)
    assert "failed" in message and "--source-dir" in message
    assert "apt-get install dataset-fashion-mnist" in message
    assert info.value.__cause__ is error
    with pytest.raises(UsageError):
        download_idx("cifar10", str(tmp_path))


# --------------------------------------------------------------------------
# ArraySource.

def test_array_source_reads_in_order_and_checks_lengths():
    x = np.arange(20, dtype=np.float32).reshape(10, 2)
    y = np.arange(10)
    names = np.array([f"n{i}" for i in range(10)])
    source = ArraySource({"x": x, "y": y, "name": names}, encodings={"x": "float"})
    assert len(source) == 10
    assert source.features["x"].encoding == "float"
    assert source.features["y"].encoding == "int64"
    assert source.features["name"].encoding == "bytes"
    batch = source.read(np.array([7, 1, 7]))
    np.testing.assert_array_equal(batch["x"], x[[7, 1, 7]])
    np.testing.assert_array_equal(batch["y"], [7, 1, 7])
    assert batch["name"].dtype == object and list(batch["name"]) == [b"n7", b"n1", b"n7"]

    with pytest.raises(DataError) as info:
        ArraySource({"image": np.zeros((5, 2)), "label": np.zeros(4)})
    assert "'image': 5" in str(info.value) and "'label': 4" in str(info.value)
    with pytest.raises(UsageError, match="nope"):
        ArraySource({"x": x}, encodings={"nope": "raw"})
    with pytest.raises(SchemaError):
        ArraySource({"o": np.array([1, b"a"], dtype=object)}).read(np.array([0]))


# --------------------------------------------------------------------------
# Image folders.

def _rgb(seed, h=8, w=6, c=3):
    return np.random.default_rng(seed).integers(0, 256, (h, w, c), dtype=np.uint8)


def test_image_folder_round_trip_png(tmp_path):
    written = {}
    # Sorted folder names decide class ids: a_cats -> 0, b_dogs -> 1.
    for seed, (cls, name) in enumerate([("b_dogs", "x.png"), ("a_cats", "2.png"),
                                        ("a_cats", "1.png"), ("b_dogs", "y.png")]):
        written[f"{cls}/{name}"] = _rgb(seed)
        _write(str(tmp_path / cls / name), _png(written[f"{cls}/{name}"]))
    _write(str(tmp_path / "a_cats" / "notes.txt"), b"ignored")
    source = ImageFolderSource(str(tmp_path))
    assert source.class_names == ["a_cats", "b_dogs"]
    assert len(source) == 4
    assert source.features["image"].encoding == "png"
    assert source.features["image"].shape == (8, 6, 3)
    batch = source.read(np.array([3, 0, 1, 2, 0]))
    order = ["b_dogs/y.png", "a_cats/1.png", "a_cats/2.png", "b_dogs/x.png", "a_cats/1.png"]
    np.testing.assert_array_equal(batch["label"], [1, 0, 0, 1, 0])
    assert batch["image"].dtype == object
    for data, key in zip(batch["image"], order):
        # Stored byte for byte, and decoding gives back the pixels written.
        assert data == _png(written[key])
        np.testing.assert_array_equal(_decode(data), written[key])


def test_image_folder_jpeg_mixed_gray_and_resize(tmp_path):
    jpegs = tmp_path / "jpegs"
    arrays = [_rgb(s, 16, 16) for s in range(3)]
    files = [_jpeg(a) for a in arrays]
    # An APP1 (EXIF-like) segment before the frame header must be skipped.
    files[1] = files[1][:2] + b"\xff\xe1" + struct.pack(">H", 34) + bytes(32) + files[1][2:]
    for i, data in enumerate(files):
        _write(str(jpegs / "k" / f"{i}.jpg"), data)
    source = ImageFolderSource(str(jpegs))
    assert source.features["image"].encoding == "jpeg"
    assert source.features["image"].shape == (16, 16, 3)
    assert list(source.read(np.arange(3))["image"]) == files

    # Mixed formats: PNG; the PNG stays as is and the JPEG is re-encoded
    # losslessly from its decoded pixels.
    mixed = tmp_path / "mixed"
    _write(str(mixed / "k" / "a.jpg"), files[0])
    _write(str(mixed / "k" / "b.png"), _png(arrays[1]))
    gray = _rgb(9, 16, 16, 1)
    _write(str(mixed / "k" / "c.png"), _png(gray))
    source = ImageFolderSource(str(mixed), channels=3)
    assert source.features["image"].encoding == "png"
    a, b, c = source.read(np.arange(3))["image"]
    np.testing.assert_array_equal(_decode(a), _decode(files[0]))
    assert b == _png(arrays[1])
    decoded_gray = _decode(c)
    assert decoded_gray.shape == (16, 16, 3)  # re-encoded with 3 channels
    np.testing.assert_array_equal(decoded_gray, np.repeat(gray, 3, axis=2))

    # Different sizes: an error naming the odd file, unless image_size is given.
    sizes = tmp_path / "sizes"
    _write(str(sizes / "k" / "a.png"), _png(_rgb(1, 5, 5)))
    _write(str(sizes / "k" / "b.png"), _png(_rgb(2, 9, 7)))
    with pytest.raises(DataError, match="b.png") as info:
        ImageFolderSource(str(sizes))
    assert "image_size" in str(info.value)
    source = ImageFolderSource(str(sizes), image_size=5)
    assert source.features["image"].shape == (5, 5, 3)
    a, b = source.read(np.arange(2))["image"]
    np.testing.assert_array_equal(_decode(a), _rgb(1, 5, 5))  # right size: untouched
    assert _decode(b).shape == (5, 5, 3)


def test_image_folder_errors_name_the_culprit(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        ImageFolderSource(str(tmp_path / "missing"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="no class sub-folders"):
        ImageFolderSource(str(empty))
    root = tmp_path / "root"
    _write(str(root / "a" / "ok.png"), _png(_rgb(0)))
    _write(str(root / "b" / "readme.txt"), b"no images here")
    with pytest.raises(DataError, match="holds no images") as info:
        ImageFolderSource(str(root))
    assert os.path.join(str(root), "b") in str(info.value)

    # Garbage with an image name: caught by the header probe.
    _write(str(root / "b" / "garbage.png"), b"this is not a png at all")
    with pytest.raises(DataError, match="garbage.png"):
        ImageFolderSource(str(root))
    # A valid header over truncated data: caught when read (verify=True).
    _write(str(root / "b" / "garbage.png"), _png(_rgb(1))[:60])
    source = ImageFolderSource(str(root))
    source.read(np.array([0]))
    with pytest.raises(DataError, match="garbage.png.*corrupt"):
        source.read(np.array([1]))
    with pytest.raises(UsageError):
        ImageFolderSource(str(root), channels=2)


def test_gif_and_bmp_probe_decode_and_join_an_image_folder(tmp_path):
    from user_data import bmp_bytes, gif_bytes  # pylint: disable=import-outside-toplevel
    from estimator_keras.sources import images as image_files  # pylint: disable=import-outside-toplevel

    grey, rgb = _rgb(3, 9, 7, 1), _rgb(4, 9, 7)
    palette = np.random.default_rng(5).integers(0, 256, (256, 3), dtype=np.uint8)
    files = {"grey.gif": gif_bytes(grey), "grey.bmp": bmp_bytes(grey),
             "rgb.bmp": bmp_bytes(rgb), "palette.bmp": bmp_bytes(grey, palette=palette)}
    want = {"grey.gif": np.repeat(grey, 3, 2), "grey.bmp": grey, "rgb.bmp": rgb,
            "palette.bmp": palette[grey[..., 0]]}  # the colours, not the indices
    for name, data in files.items():
        info = image_files.inspect_image(data)
        assert (info.fmt, info.size) == (name[-3:], (9, 7))
        assert info.grey == name.startswith("grey")
        np.testing.assert_array_equal(image_files.decode_pixels(data, want[name].shape[2]),
                                      want[name])
    # Converting channels: grey made RGB copies it, RGB made grey is one channel.
    assert image_files.decode_pixels(files["rgb.bmp"], 1).shape == (9, 7, 1)
    with pytest.raises(image_files.BadImage, match="4 bits per pixel"):
        image_files.probe_bytes(files["rgb.bmp"][:28] + b"\x04\x00" + files["rgb.bmp"][30:])
    with pytest.raises(image_files.BadImage, match="decoding failed: "):
        image_files.inspect_image(files["grey.gif"][:-40])

    # In a class folder they are re-encoded as PNG (TF decodes them, but they
    # are not stored byte for byte).
    for name, data in files.items():
        _write(str(tmp_path / ("a" if name.startswith("grey") else "b") / name), data)
    source = ImageFolderSource(str(tmp_path))
    assert source.features["image"].encoding == "png"
    batch = source.read(np.arange(4))
    names = ["grey.bmp", "grey.gif", "palette.bmp", "rgb.bmp"]
    for data, name in zip(batch["image"], names):
        np.testing.assert_array_equal(_decode(data), want[name] if want[name].shape[2] == 3
                                      else np.repeat(want[name], 3, 2))


# --------------------------------------------------------------------------
# Segmentation folders.

def test_segmentation_pairs_masks_and_errors(tmp_path):
    images, masks = tmp_path / "images", tmp_path / "masks"
    rng = np.random.default_rng(5)
    want_images, want_masks = {}, {}
    for seed, stem in enumerate(("s1", "s0", "s2", "s3")):
        want_images[stem] = _rgb(seed, 10, 12)
        want_masks[stem] = rng.integers(0, 4, (10, 12, 1), dtype=np.uint8)
        _write(str(images / f"{stem}.png"), _png(want_images[stem]))
    _write(str(masks / "s0.png"), _png(want_masks["s0"]))
    # A gray mask saved as RGB, a 16-bit one and a 1-bit (binary) one: all
    # become 8-bit gray holding the same class ids.
    _write(str(masks / "s1.png"), _png(np.repeat(want_masks["s1"], 3, axis=2)))
    _write(str(masks / "s2.png"), _png(want_masks["s2"].astype(np.uint16)))
    want_masks["s3"] = want_masks["s3"] % 2
    _write(str(masks / "s3.png"), _png_1bit(want_masks["s3"][..., 0]))
    source = SegmentationFolderSource(str(images), str(masks))
    assert len(source) == 4
    assert source.features["image"].shape == (10, 12, 3)
    assert source.features["image"].encoding == "png"
    assert source.features["mask"].shape == (10, 12, 1)
    assert source.features["mask"].encoding == "png"
    batch = source.read(np.array([2, 0, 3, 1]))
    for k, stem in enumerate(["s2", "s0", "s3", "s1"]):
        np.testing.assert_array_equal(_decode(batch["image"][k]), want_images[stem])
        mask = _decode(batch["mask"][k])
        assert mask.dtype == np.uint8 and mask.shape == (10, 12, 1)
        np.testing.assert_array_equal(mask, want_masks[stem])

    # Unpaired files on both sides are listed by stem.
    _write(str(images / "lonely_image.png"), _png(_rgb(1, 10, 12)))
    _write(str(masks / "lonely_mask.png"), _png(want_masks["s0"]))
    with pytest.raises(DataError) as info:
        SegmentationFolderSource(str(images), str(masks))
    assert "lonely_image" in str(info.value) and "lonely_mask" in str(info.value)
    os.remove(images / "lonely_image.png")
    os.remove(masks / "lonely_mask.png")

    # A mask of the wrong size, and a JPEG mask.
    _write(str(masks / "s0.png"), _png(want_masks["s0"][:5]))
    with pytest.raises(DataError, match="s0.png"):
        SegmentationFolderSource(str(images), str(masks))
    os.remove(masks / "s0.png")
    _write(str(masks / "s0.jpg"), _jpeg(want_masks["s0"]))
    with pytest.raises(DataError, match="s0.jpg"):
        SegmentationFolderSource(str(images), str(masks))


# --------------------------------------------------------------------------
# Generated shapes.

def test_shapes_are_deterministic_per_index():
    source = ShapesSource(50, image_size=32, seed=4)
    assert source.features["image"].shape == (32, 32, 3)
    assert source.features["mask"].shape == (32, 32, 1)
    whole = source.read(np.arange(50))
    assert whole["image"].dtype == np.uint8 and whole["mask"].dtype == np.uint8
    # Every index is its own example, not a few repeated ones.
    assert len({image.tobytes() for image in whole["image"]}) == 50
    idx = np.array([49, 3, 17, 3, 0])
    again = ShapesSource(50, image_size=32, seed=4).read(idx)
    np.testing.assert_array_equal(again["image"], whole["image"][idx])
    np.testing.assert_array_equal(again["mask"], whole["mask"][idx])
    single = source.read(np.array([17]))
    np.testing.assert_array_equal(single["image"][0], whole["image"][17])
    other_seed = ShapesSource(50, image_size=32, seed=5).read(np.array([17]))
    assert not np.array_equal(other_seed["image"][0], whole["image"][17])


def test_shapes_masks_hold_every_class_and_match_images():
    source = ShapesSource(40, image_size=64, seed=0)
    batch = source.read(np.arange(40))
    masks, images = batch["mask"][..., 0], batch["image"].astype(np.int32)
    assert set(np.unique(masks)) == set(range(len(SHAPES_CLASSES)))
    assert all((m > 0).any() for m in masks)  # the last shape is always visible
    for image, mask in zip(images, masks):
        # Within one example, shape pixels differ in colour from the background
        # on average (noise aside): the mask is where the shapes are drawn.
        bg = image[mask == 0].mean(axis=0)
        fg = image[mask > 0].mean(axis=0)
        assert np.abs(fg - bg).sum() > 40
    with pytest.raises(UsageError):
        ShapesSource(10, image_size=8)


# --------------------------------------------------------------------------
# Pickling: sources travel to spawned workers.

def _every_source(tmp_path):
    ip, lp, _, _ = _small_idx(tmp_path, suffix=".gz")
    _write(str(tmp_path / "folder" / "a" / "0.png"), _png(_rgb(0)))
    _write(str(tmp_path / "folder" / "b" / "0.png"), _png(_rgb(1)))
    _write(str(tmp_path / "seg" / "im" / "0.png"), _png(_rgb(2)))
    _write(str(tmp_path / "seg" / "ma" / "0.png"), _png(_rgb(3, c=1) % 3))
    return [
        ArraySource({"x": np.arange(6), "s": np.array([b"a"] * 6)}),
        IdxSource(ip, lp, cache_dir=str(tmp_path / "cache")),
        ImageFolderSource(str(tmp_path / "folder")),
        SegmentationFolderSource(str(tmp_path / "seg" / "im"), str(tmp_path / "seg" / "ma")),
        ShapesSource(6, image_size=16),
    ]


def test_every_source_pickles_small_and_reads_the_same(tmp_path):
    for source in _every_source(tmp_path):
        idx = np.array([0, 0])
        before = source.read(idx)  # opens memmaps / caches first
        data = pickle.dumps(source)
        assert len(data) < 10_000, type(source).__name__
        clone = pickle.loads(data)
        after = clone.read(idx)
        assert clone.features == source.features and len(clone) == len(source)
        for name in source.features:
            assert before[name].shape[0] == 2
            for x, y in zip(before[name], after[name]):
                if isinstance(x, bytes):
                    assert x == y
                else:
                    np.testing.assert_array_equal(x, y)


def test_module_constants():
    assert DEBIAN_FASHION_MNIST_DIR == "/usr/share/datasets/fashion-mnist"
    assert SHAPES_CLASSES == ("background", "circle", "rectangle", "triangle")
    assert sources.IDX_IMAGES_MAGIC == 0x00000803 and sources.IDX_LABELS_MAGIC == 0x00000801
