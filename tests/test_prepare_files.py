"""``prepare images|segmentation|tfrecords`` on real Fashion-MNIST images
written as a user's files (see tests/user_data.py), and ``prepare NAME``
through the same command module."""

import argparse
import contextlib
import io as text_io
import json
import os
import pickle

import numpy as np
import pytest

from estimator_keras.errors import DataError, UsageError
from estimator_keras.sources import DEBIAN_FASHION_MNIST_DIR, layouts, tfrecords
from experiments.commands import prepare as prepare_cmd

import user_data as ud

pytestmark = pytest.mark.skipif(
    not os.path.isdir(DEBIAN_FASHION_MNIST_DIR),
    reason=f"{DEBIAN_FASHION_MNIST_DIR} missing (apt-get install dataset-fashion-mnist)")


def prepare(*argv):
    """Runs ``prepare ARGV`` through prepare_cmd; returns its stdout."""
    parser = argparse.ArgumentParser()
    prepare_cmd.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["prepare", *map(str, argv)])
    out = text_io.StringIO()
    with contextlib.redirect_stdout(out):
        assert prepare_cmd.run(args) == 0
    return out.getvalue()


def manifest(directory):
    with open(os.path.join(str(directory), "dataset.json"), encoding="utf-8") as f:
        return json.load(f)


def counts(out):
    line = next(l for l in out.splitlines() if l.startswith("dataset "))
    return {k: int(v) for k, v in (p.split() for p in line.split("(")[1][:-1].split(", "))}


# --------------------------------------------------------------------------
# prepare images

@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """20 real images per class: PNG 28x28 grey, every 5th an RGB JPEG of
    36x36, some GIF and BMP, plus a truncated PNG and a text file."""
    return ud.make_image_folder(tmp_path_factory.mktemp("photos") / "photos", per_class=20,
                                gif_every=7, bmp_every=9)


def test_images_records_counts_class_names_and_reports_bad_files(photos, tmp_path, capsys):
    out = prepare("images", "--source-dir", photos.root, "--name", "photos",
                  "--data-dir", tmp_path)
    # 10% of each class, by a hash of the path: 2 of 20 per class.
    assert counts(out) == {"train": 180, "test": 20}
    assert "checking 201 images" in capsys.readouterr().err  # the progress line
    found = manifest(tmp_path / "photos")
    assert found["labels"] == {"label": {"num_classes": 10, "class_names": photos.class_names}}
    assert photos.class_names[0] == "ankle_boot"  # sorted folder names, not label order
    # Most files are 28x28 grey: the JPEGs are resized and made grey, so raw pixels.
    assert found["schema"]["image"] == {"dtype": "uint8", "shape": [28, 28, 1],
                                        "encoding": "raw"}
    assert "image 28x28 (the most common size; 40 of 200 resized)" in out
    assert "skipped 2 files: t-shirt_top/broken.png (decoding failed: Invalid PNG data" in out
    assert "t-shirt_top/notes.txt (not an image: extension .txt)" in out
    assert found["created"]["skipped"] == 2

    # Every image that is stored exactly (PNG, GIF, BMP) carries its class.
    exact = {f[2].tobytes(): f[1] for f in photos.files if not f[0].endswith(".jpg")}
    per_split = {}
    for split in ("train", "test"):
        images, labels = ud.read_back(tmp_path / "photos", split)
        seen = [(exact.get(img[..., 0].tobytes()), photos.class_names[label])
                for img, label in zip(images, labels)]
        assert all(want == got for want, got in seen if want is not None)
        per_split[split] = sum(want is not None for want, _ in seen)
        assert np.bincount(labels, minlength=10).min() == (18 if split == "train" else 2)
    assert sum(per_split.values()) == len(exact) == 160


def test_images_strict_refuses_naming_the_bad_files(photos, tmp_path):
    with pytest.raises(DataError) as info:
        prepare("images", "--source-dir", photos.root, "--name", "photos",
                "--data-dir", tmp_path, "--strict")
    message = str(info.value)
    assert "2 files are not readable and --strict is set" in message
    assert "broken.png" in message and "notes.txt" in message
    assert not (tmp_path / "photos").exists()


def test_images_size_channels_split_layout_and_kept_bytes(tmp_path):
    # DIR/train and DIR/test: the splits as given, class names from train.
    folder = ud.make_image_folder(tmp_path / "split", per_class=6, classes=3, jpeg_every=0,
                                  layout="split", test_per_class=2)
    out = prepare("images", "--source-dir", folder.root, "--name", "split", "--data-dir",
                  tmp_path / "data", "--image-size", "32x30", "--channels", "3")
    assert counts(out) == {"train": 18, "test": 6}
    found = manifest(tmp_path / "data" / "split")
    assert found["schema"]["image"]["shape"] == [32, 30, 3]
    assert found["labels"]["label"]["class_names"] == ["pullover", "t-shirt_top", "trouser"]
    assert "train/t-shirt_top/broken.png" in out
    images, labels = ud.read_back(tmp_path / "data" / "split", "test")
    assert images.shape == (6, 32, 30, 3) and sorted(labels) == [0, 0, 1, 1, 2, 2]

    # Files that all fit are stored byte for byte, as ImageFolderSource does.
    plain = ud.make_image_folder(tmp_path / "plain", per_class=5, classes=2, jpeg_every=0,
                                 bad_files=False)
    out = prepare("images", "--source-dir", plain.root, "--name", "plain", "--data-dir",
                  tmp_path / "data", "--test-fraction", "0.4")
    assert counts(out) == {"train": 6, "test": 4}
    assert manifest(tmp_path / "data" / "plain")["schema"]["image"]["encoding"] == "png"
    assert "skipped nothing" in out


def test_images_folder_errors_name_the_folder(tmp_path):
    def fails(root, needle):
        with pytest.raises(DataError) as info:
            prepare("images", "--source-dir", root, "--name", "x", "--data-dir",
                    tmp_path / "data")
        assert needle in str(info.value), str(info.value)
        return str(info.value)

    one = ud.make_image_folder(tmp_path / "one", per_class=3, classes=1, bad_files=False)
    assert str(tmp_path / "one") in fails(one.root, "a single class folder (t-shirt_top)")
    empty = ud.make_image_folder(tmp_path / "empty", per_class=3, classes=2, bad_files=False)
    os.makedirs(os.path.join(empty.root, "zebra"))
    fails(empty.root, f"class folders without images: {os.path.join(empty.root, 'zebra')}")
    for name in os.listdir(os.path.join(empty.root, "trouser")):
        os.remove(os.path.join(empty.root, "trouser", name))
    (tmp_path / "empty" / "trouser" / "readme.txt").write_text("no pictures yet")
    os.rmdir(os.path.join(empty.root, "zebra"))
    fails(empty.root, os.path.join(empty.root, "trouser"))
    nothing = tmp_path / "nothing"
    for name in ("cats", "dogs"):
        os.makedirs(nothing / name)
    fails(nothing, f"image folder {nothing} holds no images in any of its 2 class folders")
    (nothing / "cats" / "a.png").write_bytes(b"not really a png")
    (nothing / "dogs" / "b.jpg").write_bytes(b"nor a jpeg")
    fails(nothing, "holds no readable images")
    fails(tmp_path / "missing", "does not exist")


def test_prepare_usage_errors(tmp_path, photos):
    with pytest.raises(UsageError, match="needs --name"):
        prepare("images", "--source-dir", photos.root)
    with pytest.raises(UsageError, match="--image-size 'big'"):
        prepare("images", "--source-dir", photos.root, "--name", "p", "--image-size", "big")
    with pytest.raises(UsageError, match="--test-fraction must be"):
        prepare("images", "--source-dir", photos.root, "--name", "p", "--data-dir",
                tmp_path, "--test-fraction", "1.5")
    with pytest.raises(UsageError, match="unknown dataset 'imagenet'.*prepare images"):
        prepare("imagenet")
    with pytest.raises(UsageError, match="--image-size does not apply to the registered"):
        prepare("fashion_mnist", "--image-size", "32")
    with pytest.raises(UsageError, match="--label does not apply to prepare images"):
        prepare("images", "--source-dir", photos.root, "--name", "p", "--label", "x")
    with pytest.raises(UsageError, match="is a registered dataset"):
        prepare("images", "--source-dir", photos.root, "--name", "mnist")
    with pytest.raises(UsageError, match="--name '../up' must be a folder name"):
        prepare("images", "--source-dir", photos.root, "--name", "../up")


def test_registered_prepare_as_before(tmp_path):
    out = prepare("fashion_mnist", "--data-dir", tmp_path, "--max-examples", 300,
                  "--shards", 2)
    assert out == f"dataset fashion_mnist ready in {tmp_path / 'fashion_mnist'} " \
                  f"(train 300, test 300)\n"
    # Prepared datasets are reused; so are imported ones unless --force.
    assert "train 300, test 300" in prepare("fashion_mnist", "--data-dir", tmp_path)


# --------------------------------------------------------------------------
# prepare tfrecords

def _nearest_labels(images, records, size, channels):
    """The label of the source image closest to each stored one."""
    sources = np.stack([ud.resized(i, size, channels) for i in records.images]).astype(float)
    dist = ((images[:, None].astype(float) - sources[None]) ** 2).mean(axis=(2, 3, 4))
    # JPEG and two resizings blur a little; another image is far further off.
    closest = np.sort(dist, axis=1)
    assert (closest[:, 0] < 300).all() and (closest[:, 0] < closest[:, 1] / 4).all()
    return records.labels[dist.argmin(axis=1)]


def test_imagenet_style_records_resized_with_matching_labels(tmp_path):
    records = ud.make_imagenet_tfrecords(tmp_path / "inet", per_class=8, label_offset=1)
    out = prepare("tfrecords", "--source", tmp_path / "inet" / "train-*", "--name", "inet",
                  "--data-dir", tmp_path / "data", "--image-size", "32x32")
    assert counts(out) == {"train": 70, "test": 10}
    found = manifest(tmp_path / "data" / "inet")
    assert found["schema"]["image"] == {"dtype": "uint8", "shape": [32, 32, 3],
                                        "encoding": "raw"}
    # ImageNet's files count classes from 1: class 0 is never seen.
    assert found["labels"] == {"label": {"num_classes": 11, "class_names": None}}
    assert "label from 'image/class/label': 11 classes; the 10 class texts beside it do " \
           "not name all 11 (pass --class-names)" in out
    for split in ("train", "test"):
        images, labels = ud.read_back(tmp_path / "data" / "inet", split)
        np.testing.assert_array_equal(labels, _nearest_labels(images, records, (32, 32), 3) + 1)

    # From 0, the image/class/text values name the classes; --features names
    # the input, and --class-names overrides.
    ud.make_imagenet_tfrecords(tmp_path / "zero", per_class=4, classes=3, num_files=1)
    out = prepare("tfrecords", "--source", tmp_path / "zero" / "*", "--name", "zero",
                  "--data-dir", tmp_path / "data", "--features", "pixels=image/encoded",
                  "--test-fraction", "0.25")
    found = manifest(tmp_path / "data" / "zero")
    assert list(found["schema"]) == ["pixels", "label"]
    assert found["labels"]["label"]["class_names"] == ["t-shirt_top", "trouser", "pullover"]
    prepare("tfrecords", "--source", tmp_path / "zero" / "*", "--name", "zero", "--force",
            "--data-dir", tmp_path / "data", "--class-names", "top,trousers,jumper",
            "--test-fraction", "0.25")
    assert manifest(tmp_path / "data" / "zero")["labels"]["label"]["class_names"] == [
        "top", "trousers", "jumper"]
    with pytest.raises(DataError, match="hold label 2, but there are only 2 classes"):
        prepare("tfrecords", "--source", tmp_path / "zero" / "*", "--name", "z2",
                "--data-dir", tmp_path / "data", "--class-names", "a,b")
    with pytest.raises(UsageError, match="--class-names gives 2 names but --num-classes is 3"):
        prepare("tfrecords", "--source", tmp_path / "zero" / "*", "--name", "z2",
                "--data-dir", tmp_path / "data", "--class-names", "a,b", "--num-classes", "3")
    with pytest.raises(UsageError, match="feature name 'image/encoded'"):
        prepare("tfrecords", "--source", tmp_path / "zero" / "*", "--name", "z3",
                "--data-dir", tmp_path / "data", "--features", "image/encoded")


def test_seed_question_records_gz_and_tfds_shards(tmp_path):
    train = ud.make_seed_tfrecords(tmp_path / "seed" / "train.mnist.tfrecord.gz",
                                   per_class=6, compression="GZIP")
    test = ud.make_seed_tfrecords(tmp_path / "seed" / "test.mnist.tfrecord",
                                  per_class=2, split="test")
    out = prepare("tfrecords", "--source", tmp_path / "seed" / "train.*", "--test-source",
                  tmp_path / "seed" / "test.*", "--name", "seed", "--data-dir", tmp_path)
    assert counts(out) == {"train": 60, "test": 20}
    assert manifest(tmp_path / "seed")["schema"]["image"]["shape"] == [28, 28, 1]
    for split, made in (("train", train), ("test", test)):
        images, labels = ud.read_back(tmp_path / "seed", split)
        want = {img.tobytes(): label for img, label in zip(made.images, made.labels)}
        assert [want[i[..., 0].tobytes()] for i in images] == list(labels)

    ud.make_tfds_tfrecords(tmp_path / "tfds", per_class=4)
    out = prepare("tfrecords", "--source", tmp_path / "tfds" / "*.tfrecord-*", "--name",
                  "tfds", "--data-dir", tmp_path, "--test-fraction", "0.25")
    found = manifest(tmp_path / "tfds")
    assert found["labels"]["label"]["class_names"] == list(ud.FASHION_CLASSES)
    assert found["schema"]["image"]["encoding"] == "png"  # every image already fits
    assert counts(out) == {"train": 30, "test": 10}


def test_damaged_records_are_skipped_and_reported(tmp_path):
    records = ud.make_imagenet_tfrecords(tmp_path / "inet", per_class=4, classes=3,
                                         num_files=2)
    # A record whose JPEG is cut short (its CRC is fine)...
    ud.write_records(tmp_path / "inet" / "extra", [ud.example({
        "image/encoded": ud.encode(ud.resized(records.images[0], (30, 30), 3), "jpeg")[:200],
        "image/class/label": 1})])
    # ... and a file whose third record's bytes are damaged (CRC mismatch).
    damaged = tmp_path / "inet" / os.path.basename(records.files[1])
    data = bytearray(damaged.read_bytes())
    lengths, pos = [], 0
    while pos < len(data):
        lengths.append(int.from_bytes(data[pos:pos + 8], "little"))
        pos += lengths[-1] + 16
    third = sum(n + 16 for n in lengths[:2]) + 12 + 40
    data[third] ^= 0xFF
    damaged.write_bytes(bytes(data))

    out = prepare("tfrecords", "--source", tmp_path / "inet" / "*", "--name", "inet",
                  "--data-dir", tmp_path / "data", "--test-fraction", "0.3")
    n = counts(out)
    assert n["train"] + n["test"] == 6 + 2  # file 0 whole, file 1 up to its damage
    assert "skipped 2 records: extra record 0 (its image 'image/encoded' is unreadable" in out
    assert "train-00001-of-00002 from record 2 (byte" in out
    with pytest.raises(DataError, match="2 records are not readable and --strict is set"):
        prepare("tfrecords", "--source", tmp_path / "inet" / "*", "--name", "strict",
                "--data-dir", tmp_path / "data", "--strict")


def test_records_without_a_known_label_or_image_say_what_to_pass(tmp_path):
    ud.write_records(tmp_path / "odd.tfrecord", [ud.example(
        {"pixels": b"\0" * 10, "kind": 3})])
    with pytest.raises(DataError, match="hold no image.*--features"):
        prepare("tfrecords", "--source", tmp_path / "odd.tfrecord", "--name", "odd",
                "--data-dir", tmp_path)
    ud.make_tfds_tfrecords(tmp_path / "t", per_class=1, classes=2, num_files=1,
                           names_file=False)
    with pytest.raises(DataError, match="--label 'kind' is not a key"):
        prepare("tfrecords", "--source", tmp_path / "t" / "*", "--name", "t",
                "--data-dir", tmp_path, "--label", "kind")
    with pytest.raises(DataError, match="matches no files"):
        prepare("tfrecords", "--source", tmp_path / "none-*", "--name", "t",
                "--data-dir", tmp_path)


# --------------------------------------------------------------------------
# prepare segmentation

def test_segmentation_pairs_by_stem_and_names_unpaired_files(tmp_path):
    made = ud.make_segmentation_folder(tmp_path / "seg", count=30, jpeg_every=10)
    out = prepare("segmentation", "--source-dir", made.root, "--name", "seg",
                  "--data-dir", tmp_path / "data")
    assert counts(out) == {"train": 27, "test": 3}
    found = manifest(tmp_path / "data" / "seg")
    assert found["labels"] == {"mask": {"num_classes": 3, "class_names": None}}
    assert found["schema"]["mask"] == {"dtype": "uint8", "shape": [28, 28, 1],
                                       "encoding": "png"}
    want = {img.tobytes(): made.masks[stem] for stem, img in made.images.items()}
    matched = 0
    for split in ("train", "test"):
        images, masks = ud.read_back(tmp_path / "data" / "seg", split, label="mask")
        for image, mask in zip(images, masks):
            if image[..., 0].tobytes() in want:  # the PNG images, stored exactly
                np.testing.assert_array_equal(mask[..., 0], want[image[..., 0].tobytes()])
                matched += 1
    assert matched == 27

    # Other sizes: resized, masks by nearest neighbour so ids stay ids.
    odd = ud.make_segmentation_folder(tmp_path / "odd", count=12, odd_size_every=4)
    out = prepare("segmentation", "--source-dir", odd.root, "--name", "odd", "--data-dir",
                  tmp_path / "data", "--test-fraction", "0.25")
    assert "3 of 12 resized" in out
    images, masks = ud.read_back(tmp_path / "data" / "odd", "train", label="mask")
    assert masks.shape[1:] == (28, 28, 1) and set(np.unique(masks)) <= {0, 1, 2}

    os.remove(os.path.join(made.root, "masks", f"{made.stems[3]}.png"))
    ud.write_file(os.path.join(made.root, "masks", "stray.png"),
              ud.encode(made.masks[made.stems[0]][..., None], "png"))
    with pytest.raises(DataError) as info:
        prepare("segmentation", "--source-dir", made.root, "--name", "seg2",
                "--data-dir", tmp_path / "data")
    assert made.stems[3] in str(info.value) and "stray" in str(info.value)


# --------------------------------------------------------------------------
# Sources travel to worker processes.

def test_imported_sources_pickle_small_and_read_the_same(tmp_path, photos):
    ud.make_imagenet_tfrecords(tmp_path / "inet", per_class=2, classes=3, num_files=2)
    seg = ud.make_segmentation_folder(tmp_path / "seg", count=10, odd_size_every=3)
    sources = [
        layouts.image_folder_splits(photos.root, progress=False).splits["train"],
        layouts.segmentation_folder_splits(seg.root, progress=False,
                                           test_fraction=0.2).splits["train"],
        tfrecords.tfrecord_splits(str(tmp_path / "inet" / "*"), progress=False,
                                  test_fraction=0.3).splits["train"],
    ]
    for source in sources:
        idx = np.array([2, 0, 2])
        before = source.read(idx)
        data = pickle.dumps(source)
        assert len(data) < 20_000, type(source).__name__
        after = pickle.loads(data).read(idx)
        for name in source.features:
            for x, y in zip(before[name], after[name]):
                np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.slow
def test_num_workers_write_the_same_shards(tmp_path, photos):
    one = prepare("images", "--source-dir", photos.root, "--name", "one",
                  "--data-dir", tmp_path)
    two = prepare("images", "--source-dir", photos.root, "--name", "two",
                  "--data-dir", tmp_path, "--num-workers", "2")
    assert counts(one) == counts(two)
    for name in sorted(os.listdir(tmp_path / "one")):
        if name.endswith(".tfrecord"):
            assert (tmp_path / "one" / name).read_bytes() == \
                (tmp_path / "two" / name).read_bytes(), name


def test_a_registered_dataset_of_arrays_gets_the_shards_asked_for(tmp_path):
    """Splits given as dicts of arrays count their examples, not their
    features, when the shard count is capped at the examples."""
    from estimator_keras.manifest import load_manifest  # pylint: disable=import-outside-toplevel
    from experiments.catalog import prepare as prepare_lib  # pylint: disable=import-outside-toplevel
    from experiments.catalog import registry  # pylint: disable=import-outside-toplevel
    rng = np.random.default_rng(0)

    def splits(source_dir=None, download_dir=None):
        del source_dir, download_dir
        return {split: {"x": rng.standard_normal((n, 2)).astype(np.float32),
                        "id": np.arange(n, dtype=np.int64),
                        "label": rng.integers(0, 3, n).astype(np.int64)}
                for split, n in (("train", 40), ("test", 12))}

    name = "ek_arrays_of_three_features"
    if name not in registry.dataset_names():
        registry.register_dataset(name, "three features as arrays", splits)
    out = prepare_lib.prepare(name, str(tmp_path), shards=8, progress=False)
    found = load_manifest(out)
    assert len(found.splits["train"].shards) == 8
    assert len(found.splits["test"].shards) == 2
    assert found.splits["train"].num_examples == 40
