"""``prepare``, ``inspect`` and ``inspect --verify`` on an install without
TensorFlow: tests/no_tensorflow.py makes it unimportable in the child that
runs them. Each source they read (a registered dataset's IDX files, the
generated shapes, image and segmentation folders, other tools' TFRecord
files) gives the bytes a prepare with TensorFlow writes; what needs
TensorFlow says so in one paragraph. The data is made without TensorFlow
too, so this module runs where it is not installed.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from support import ROOT, child_env, png_bytes
from estimator_keras import example_codec, record_files, tf_optional
from estimator_keras.errors import UsageError
from estimator_keras.schema import FeatureSpec
from estimator_keras.sources import download, images, write_idx

BLOCKER = os.path.join(ROOT, "tests", "no_tensorflow.py")
CLASSES = ("coat", "dress", "shirt")


def _cli(*args, blocked=True):
    """``python -m experiments ARGS``, without TensorFlow when ``blocked``;
    (returncode, stdout, stderr)."""
    command = [sys.executable] + ([BLOCKER] if blocked else []) + ["-m", "experiments"]
    proc = subprocess.run(command + [str(a) for a in args], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


def _write(path, data):
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def _grey(rng, size=(12, 10)):
    return rng.integers(0, 256, size + (1,), dtype=np.uint8)


def _idx_files(root):
    rng = np.random.default_rng(1)
    os.makedirs(root)
    for prefix, n in (("train", 30), ("t10k", 12)):
        write_idx(os.path.join(root, f"{prefix}-images-idx3-ubyte.gz"),
                  rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))
        write_idx(os.path.join(root, f"{prefix}-labels-idx1-ubyte.gz"),
                  rng.integers(0, 10, n).astype(np.uint8))
    return ["mnist", "--source-dir", root]


def _image_folder(root):
    """Grey PNGs of one size in three class folders, a truncated PNG and a
    text file (both skipped)."""
    rng = np.random.default_rng(2)
    for k in range(18):
        _write(os.path.join(root, CLASSES[k % 3], f"{k:03d}.png"), png_bytes(_grey(rng)))
    _write(os.path.join(root, CLASSES[0], "broken.png"), png_bytes(_grey(rng))[:70])
    _write(os.path.join(root, CLASSES[1], "notes.txt"), b"not an image\n")
    return ["images", "--source-dir", root, "--name", "folder"]


def _segmentation_folder(root):
    rng = np.random.default_rng(3)
    for k in range(20):
        _write(os.path.join(root, "images", f"{k:03d}.png"), png_bytes(_grey(rng, (9, 11))))
        mask = rng.integers(0, 3, (9, 11, 1), dtype=np.uint8)
        _write(os.path.join(root, "masks", f"{k:03d}.png"), png_bytes(mask))
    return ["segmentation", "--source-dir", root, "--name", "seg"]


def _seed_records(root):
    """The seed question's records (int64 height/width/depth/label, bytes
    image_raw), written without TensorFlow."""
    rng = np.random.default_rng(4)
    schema = {name: FeatureSpec(name, "int64", (), "int64")
              for name in ("height", "width", "depth", "label")}
    schema["image_raw"] = FeatureSpec("image_raw", "string", (), "bytes")
    os.makedirs(root)
    with record_files.record_writer(os.path.join(root, "train.tfrecords")) as writer:
        for _ in range(24):
            writer.write(example_codec.encode_example(schema, {
                "height": 6, "width": 5, "depth": 1, "label": int(rng.integers(0, 4)),
                "image_raw": rng.integers(0, 256, 30, dtype=np.uint8).tobytes()}))
    return ["tfrecords", "--source", os.path.join(root, "*.tfrecords"), "--name", "seed"]


SOURCES = {
    "mnist": _idx_files,
    "shapes": lambda root: ["shapes", "--max-examples", 24, "--compression", "gzip"],
    "images": _image_folder,
    "segmentation": _segmentation_folder,
    "tfrecords": _seed_records,
}


def _files(directory):
    """A dataset folder's files: the shards' bytes, and its manifest without
    what differs between runs (when it was written, and why an input was
    skipped: TensorFlow's and Pillow's decoders word it differently)."""
    found = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            found[name] = f.read()
    manifest = json.loads(found.pop("dataset.json"))
    manifest["created"].pop("time")
    if "skipped_first" in manifest["created"]:
        manifest["created"]["skipped_first"] = [
            s.split(" (")[0] for s in manifest["created"]["skipped_first"]]
    return found, manifest


@pytest.mark.parametrize("kind", SOURCES)
def test_prepare_inspect_and_verify_without_tensorflow_write_what_a_prepare_with_it_does(
        tmp_path, kind):
    args = SOURCES[kind](str(tmp_path / "source"))
    name = args[args.index("--name") + 1] if "--name" in args else args[0]
    rc, out, err = _cli("prepare", *args, "--data-dir", tmp_path / "without")
    assert rc == 0, err
    assert f"dataset {name} ready in" in out
    rc, _, err = _cli("prepare", *args, "--data-dir", tmp_path / "with", blocked=False)
    assert rc == 0, err
    without = str(tmp_path / "without" / name)
    shards, manifest = _files(without)
    assert shards and (shards, manifest) == _files(str(tmp_path / "with" / name))
    if kind == "images":
        assert manifest["created"]["skipped_first"] == [f"{CLASSES[0]}/broken.png",
                                                         f"{CLASSES[1]}/notes.txt"]

    rc, out, err = _cli("inspect", without)
    assert rc == 0, err
    assert "schema:" in out and "verified" not in out
    rc, out, err = _cli("inspect", without, "--verify")
    assert rc == 0, err
    assert "all records verified" in out


def test_inspect_verify_without_tensorflow_names_the_broken_record(tmp_path):
    rc, _, err = _cli("prepare", "shapes", "--max-examples", 30, "--data-dir", tmp_path)
    assert rc == 0, err
    shard = tmp_path / "shapes" / "train-00000-of-00001.tfrecord"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    rc, out, _ = _cli("inspect", tmp_path / "shapes", "--verify")
    assert rc == 1
    assert "train-00000-of-00001.tfrecord  30 examples  CORRUPT after" in out
    assert "1 corrupt file(s)" in out


def _two_sizes(root):
    rng = np.random.default_rng(5)
    for k in range(12):
        _write(os.path.join(root, CLASSES[k % 3], f"{k:03d}.png"),
               png_bytes(_grey(rng, (12, 10) if k % 4 else (8, 8))))


def _one_colour(root):
    rng = np.random.default_rng(6)
    for k in range(12):
        pixels = rng.integers(0, 256, (12, 10, 3 if k == 5 else 1), dtype=np.uint8)
        _write(os.path.join(root, CLASSES[k % 3], f"{k:03d}.png"), png_bytes(pixels))


@pytest.mark.parametrize("make, step", [
    (_two_sizes, "storing images as raw pixels, decoded and resized to one size"),
    (_one_colour, "re-encoding 1 of the images as PNG (the first: "),
])
def test_what_needs_tensorflow_says_so_in_one_paragraph(tmp_path, make, step):
    make(str(tmp_path / "photos"))
    rc, out, err = _cli("prepare", "images", "--source-dir", tmp_path / "photos", "--name",
                        "photos", "--data-dir", tmp_path / "data")
    assert rc == 2, (out, err)
    error = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and "Traceback" not in err, err
    assert step in error[0]
    assert "needs TensorFlow, which is not installed here: pip install -e '.[cpu]'" in error[0]
    assert not os.path.exists(tmp_path / "data" / "photos")


def test_the_blocker_makes_tensorflow_missing_and_says_when_it_was_loaded():
    code = ("import importlib.util\n"
            "assert importlib.util.find_spec('tensorflow') is None\n"
            "try:\n"
            "    import tensorflow\n"
            "except ModuleNotFoundError as e:\n"
            "    assert e.name == 'tensorflow'\n"
            "else:\n"
            "    raise SystemExit('imported')\n")
    proc = subprocess.run([sys.executable, BLOCKER, "-c", code], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr) == (0, "")
    proc = subprocess.run(
        [sys.executable, BLOCKER, "-c", "import sys; sys.modules['tensorflow'] = sys"],
        cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and "loaded tensorflow" in proc.stderr


# -- images checked by Pillow where TensorFlow is absent: the same verdicts


def _damaged(data, stride=1):
    """Every truncation of ``data``, and a flipped bit at every ``stride``-th byte."""
    yield from (data[:k] for k in range(1, len(data)))
    for pos in range(0, len(data), stride):
        for bit in (0x01, 0x80):
            flipped = bytearray(data)
            flipped[pos] ^= bit
            yield bytes(flipped)


def _verdict(data):
    try:
        return images.decoded_shape(data)
    except images.BadImage:
        return "unreadable"
    except UsageError:
        return "needs TensorFlow"


def _both(monkeypatch, data, check=_verdict):
    found = check(data)
    with monkeypatch.context() as patched:
        patched.setattr(tf_optional, "tensorflow", lambda: None)
        return found, check(data)


@pytest.mark.parametrize("channels", [1, 3])
def test_pillow_finds_the_pngs_tensorflow_refuses(monkeypatch, channels):
    tf = pytest.importorskip("tensorflow")
    pytest.importorskip("PIL")
    pixels = np.random.default_rng(7).integers(0, 256, (13, 17, channels), dtype=np.uint8)
    for data in (png_bytes(pixels), tf.io.encode_png(pixels).numpy()):
        for variant in _damaged(data):
            with_tf, without = _both(monkeypatch, variant)
            # A damaged header can make the file look like a kind only
            # TensorFlow checks; refused, not skipped, where it is missing.
            assert with_tf == without or (with_tf == "unreadable"
                                          and without == "needs TensorFlow"), variant


@pytest.mark.parametrize("channels", [1, 3])
def test_pillow_finds_the_truncated_jpegs_tensorflow_refuses(monkeypatch, channels):
    # Damage inside a JPEG's entropy-coded data can be a libjpeg warning,
    # which TensorFlow refuses and Pillow passes: truncations only.
    tf = pytest.importorskip("tensorflow")
    pytest.importorskip("PIL")
    pixels = np.random.default_rng(8).integers(0, 256, (13, 17, channels), dtype=np.uint8)
    data = tf.io.encode_jpeg(pixels).numpy()
    for cut in range(1, len(data)):
        assert _both(monkeypatch, data[:cut]) in (
            ("unreadable",) * 2, ("unreadable", "needs TensorFlow")), cut
    assert _both(monkeypatch, data) == ((13, 17, channels),) * 2


def test_mask_class_ids_are_tensorflows_without_it(monkeypatch):
    pytest.importorskip("tensorflow")
    pytest.importorskip("PIL")
    ids = np.random.default_rng(9).integers(0, 5, (9, 11, 1), dtype=np.uint8)
    data = png_bytes(ids)
    with_tf, without = _both(monkeypatch, data, lambda d: images.mask_ids(d, 8, "m.png"))
    assert without.dtype == with_tf.dtype and np.array_equal(without, with_tf)
    assert np.array_equal(without, ids)


def test_gif_and_bmp_files_need_tensorflow_to_be_checked(monkeypatch):
    monkeypatch.setattr(tf_optional, "tensorflow", lambda: None)
    gif = b"GIF89a" + bytes([4, 0, 3, 0, 0, 0, 0]) + b"\0" * 20
    with pytest.raises(UsageError, match="checking and re-encoding GIF images needs TensorFlow"):
        images.inspect_image(gif)


def test_downloads_without_tensorflow_go_through_urllib(tmp_path, monkeypatch):
    monkeypatch.setattr(tf_optional, "tensorflow", lambda: None)
    source = tmp_path / "published.gz"
    source.write_bytes(bytes(range(256)) * 5)
    target = tmp_path / "cache" / "fetched.gz"
    target.parent.mkdir()
    download.keras_fetch(source.as_uri(), str(target))
    assert target.read_bytes() == source.read_bytes()
