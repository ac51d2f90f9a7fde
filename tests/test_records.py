"""Tests of estimator_keras.records: writing, manifests, resolving, verifying.

Datasets are a few dozen tiny examples; only the spawned-writer, CLI and
killed-writer tests start processes, each bounded by a timeout.
"""

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import tensorflow as tf

from support import ROOT, child_env, flip_byte_in_record, record_frames
from estimator_keras import record_files, records, tf_optional, tfrecord_frames
from estimator_keras.errors import CorruptRecordError, DataError, SchemaError, UsageError
from estimator_keras.inputs import make_dataset
from estimator_keras.manifest import (
    FORMAT, INCOMPLETE_DIR, MANIFEST_NAME, load_manifest, shard_name)
from estimator_keras.records import resolve, write_dataset, write_records
from estimator_keras.sources import ShapesSource
from estimator_keras.verify import check_file

SHARD_FILE = re.compile(r"^[A-Za-z0-9_.]+-\d{5}-of-\d{5}\.tfrecord(\.gz)?$")


def _ids_in(path, compression=None):
    """The ``id`` feature of every record of one file, in file order."""
    return [tf.train.Example.FromString(r.numpy()).features.feature["id"].int64_list.value[0]
            for r in tf.data.TFRecordDataset(path, compression or "")]


def _read_eval(data, names, label="label", split="train", batch_size=8):
    """Every example through make_dataset(training=False), concatenated."""
    parts = {n: [] for n in names}
    labels = []
    for features, batch_labels in make_dataset(data, batch_size, training=False, split=split,
                                               features={n: n for n in names}, label=label):
        for n in names:
            parts[n].append(features[n].numpy())
        labels.append(batch_labels.numpy())
    return {n: np.concatenate(v) for n, v in parts.items()}, np.concatenate(labels)


def _dir_bytes(directory):
    return {n: open(os.path.join(directory, n), "rb").read()
            for n in sorted(os.listdir(directory)) if SHARD_FILE.match(n)}


# --------------------------------------------------------------------------- round trip

@pytest.mark.parametrize("compression", [None, "GZIP"])
def test_round_trip_is_byte_exact(tmp_path, compression):
    rng = np.random.default_rng(7)
    n = 37
    strings = [bytes(rng.integers(0, 256, int(rng.integers(0, 9)), dtype=np.uint8))
               for _ in range(n)]
    arrays = {
        "id": np.arange(n, dtype=np.int64),
        "image": rng.integers(0, 256, (n, 5, 3, 2), dtype=np.uint8),
        "vec": (rng.standard_normal((n, 4)) * 10.0 ** rng.integers(-30, 30, (n, 4))
                ).astype(np.float32),
        "weight": rng.standard_normal(n).astype(np.float32),
        # Beyond 2**53: survives only if nothing goes through float or int32.
        "label": (np.int64(2) ** 60 + rng.integers(0, 1000, n)).astype(np.int64),
        "name": np.array(strings, dtype=object),
    }
    arrays["name"][0] = b""
    arrays["name"][1] = b"\x00\xff\x00"
    manifest = write_records(arrays, tmp_path / "ds", num_shards=3, compression=compression,
                             seed=5, progress=False)
    assert [s.file.endswith(".gz") for s in manifest.splits["train"].shards] == \
        [compression == "GZIP"] * 3
    assert {n: s.encoding for n, s in manifest.schema.items()} == {
        "id": "int64", "image": "raw", "vec": "raw", "weight": "float", "label": "int64",
        "name": "bytes"}

    names = ["id", "image", "vec", "weight", "name"]
    got, labels = _read_eval(str(tmp_path / "ds"), names)
    ids = got["id"].astype(np.int64)
    assert sorted(ids.tolist()) == list(range(n))
    assert labels.dtype == np.int64 and labels.tobytes() == arrays["label"][ids].tobytes()
    # make_dataset feeds numeric inputs as float32: exact for uint8 pixels.
    assert got["image"].dtype == np.float32
    assert got["image"].astype(np.uint8).tobytes() == arrays["image"][ids].tobytes()
    assert np.array_equal(got["image"], arrays["image"][ids].astype(np.float32))
    assert got["vec"].tobytes() == arrays["vec"][ids].tobytes()
    assert got["weight"].tobytes() == arrays["weight"][ids].tobytes()
    assert got["name"].tolist() == arrays["name"][ids].tolist()


@pytest.mark.parametrize("compression", [None, "GZIP"])
def test_spawned_workers_write_identical_shards(tmp_path, compression):
    arrays = {"id": np.arange(60, dtype=np.int64),
              "x": np.random.default_rng(0).random((60, 8)).astype(np.float32)}
    one = write_records(arrays, tmp_path / "one", num_shards=4, compression=compression,
                        seed=11, num_workers=1, progress=False)
    two = write_records(arrays, tmp_path / "two", num_shards=4, compression=compression,
                        seed=11, num_workers=2, progress=False)
    a, b = _dir_bytes(str(tmp_path / "one")), _dir_bytes(str(tmp_path / "two"))
    assert len(a) == 4 and a == b
    assert one.to_json()["splits"] == two.to_json()["splits"]
    # Nothing but the shards and the manifest is left behind.
    assert sorted(os.listdir(tmp_path / "two")) == sorted([*b, MANIFEST_NAME])


@pytest.fixture
def tmp_dataset_dirs(tmp_path):
    counter = iter(range(100))

    def make(seed, shuffle=True):
        directory = str(tmp_path / f"d{next(counter)}")
        write_records({"id": np.arange(40, dtype=np.int64)}, directory, num_shards=4,
                      seed=seed, shuffle=shuffle, progress=False)
        return directory

    return make


def test_shuffle_before_sharding_is_real_and_seeded(tmp_dataset_dirs):
    first = tmp_dataset_dirs(seed=3)
    again = tmp_dataset_dirs(seed=3)
    other = tmp_dataset_dirs(seed=4)
    plain = tmp_dataset_dirs(seed=3, shuffle=False)

    def shard_ids(directory):
        return [_ids_in(os.path.join(directory, n)) for n in sorted(_dir_bytes(directory))]

    ids = shard_ids(first)
    assert [len(s) for s in ids] == [10, 10, 10, 10]
    assert sorted(i for s in ids for i in s) == list(range(40))
    assert ids[0] != list(range(10))
    assert ids[0] != sorted(ids[0])  # permuted within the shard too
    assert _dir_bytes(first) == _dir_bytes(again)
    assert shard_ids(other) != ids
    # The control: without shuffling, shard 0 is the first examples in order.
    assert shard_ids(plain) == [list(range(k, k + 10)) for k in range(0, 40, 10)]


# --------------------------------------------------------------------------- manifest

def test_manifest_counts_and_shard_names(tmp_path):
    arrays = {"id": np.arange(30, dtype=np.int64)}
    out = str(tmp_path / "ds")
    write_dataset({"train": {"id": arrays["id"][:23]}, "test": {"id": arrays["id"][23:]}},
                  out, num_shards={"train": 4, "test": 2}, compression="GZIP", progress=False)
    manifest = load_manifest(out)
    assert manifest.compression == "GZIP"
    train, test = manifest.splits["train"], manifest.splits["test"]
    assert [s.file for s in train.shards] == [
        f"train-{i:05d}-of-00004.tfrecord.gz" for i in range(4)]
    assert [s.file for s in test.shards] == ["test-00000-of-00002.tfrecord.gz",
                                             "test-00001-of-00002.tfrecord.gz"]
    assert [s.num_examples for s in train.shards] == [6, 6, 6, 5]
    assert [s.num_examples for s in test.shards] == [4, 3]
    assert (train.num_examples, test.num_examples) == (23, 7)
    on_disk = json.load(open(os.path.join(out, MANIFEST_NAME)))
    assert on_disk["splits"]["train"]["num_examples"] == 23
    assert on_disk["format"] == FORMAT
    for split, info in manifest.splits.items():
        seen = []
        for shard in info.shards:
            path = os.path.join(out, shard.file)
            assert os.path.getsize(path) == shard.num_bytes
            check = check_file(path)
            assert check.ok and check.num_records == shard.num_examples
            seen += _ids_in(path, "GZIP")
        assert sorted(seen) == (list(range(23)) if split == "train" else list(range(23, 30)))
    assert sorted(os.listdir(out)) == sorted(
        [MANIFEST_NAME] + [s.file for i in manifest.splits.values() for s in i.shards])
    # The writer's default is about 10k examples a shard.
    assert records.default_num_shards(100001) == 11
    assert shard_name("train", 3, 12, "GZIP") == "train-00003-of-00012.tfrecord.gz"


def test_load_manifest_errors(tmp_path, tiny_dataset):
    directory, _ = tiny_dataset()
    path = os.path.join(directory, MANIFEST_NAME)
    good = open(path).read()

    os.remove(path)
    with pytest.raises(DataError) as info:
        load_manifest(directory)
    assert "incomplete" in str(info.value) and directory in str(info.value)
    assert "4 shard file(s)" in str(info.value)

    with open(path, "w") as f:
        f.write(good[:-20])
    with pytest.raises(DataError) as info:
        load_manifest(directory)
    assert "not valid JSON" in str(info.value) and path in str(info.value)

    with open(path, "w") as f:
        json.dump({"format": FORMAT, "name": "x"}, f)
    with pytest.raises(DataError) as info:
        load_manifest(directory)
    assert "missing ['schema', 'splits']" in str(info.value) and path in str(info.value)

    with open(path, "w") as f:
        f.write(good)
    assert load_manifest(directory).splits["train"].num_examples == 40

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError) as info:
        load_manifest(str(empty))
    assert "not a dataset" in str(info.value) and "incomplete" not in str(info.value)
    # A writer killed before its first shard was whole leaves only staging.
    (empty / INCOMPLETE_DIR).mkdir()
    (empty / INCOMPLETE_DIR / "train-00000-of-00002.tfrecord").write_bytes(b"x")
    with pytest.raises(DataError) as info:
        make_dataset(str(empty), 4, training=True)
    assert "incomplete" in str(info.value)


# --------------------------------------------------------------------------- seed format

def _write_seed_format(path, images, labels):
    """Exactly like the seed question's images_to_tfrecord: one Example per
    image with int64 height/width/depth/label and the raw bytes."""
    def _int64_feature(value):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))

    def _bytes_feature(value):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    rows, cols, depth = images.shape[1], images.shape[2], images.shape[3]
    with tf.io.TFRecordWriter(str(path)) as writer:
        for index in range(images.shape[0]):
            image_raw = images[index].tobytes()
            example = tf.train.Example(features=tf.train.Features(feature={
                "height": _int64_feature(rows),
                "width": _int64_feature(cols),
                "depth": _int64_feature(depth),
                "label": _int64_feature(int(labels[index])),
                "image_raw": _bytes_feature(image_raw)}))
            writer.write(example.SerializeToString())


def test_seed_format_without_manifest(tmp_path, caplog):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (13, 6, 5, 1), dtype=np.uint8)  # not square: h/w order
    labels = rng.integers(0, 10, 13)
    path = tmp_path / "train.tfrecords"
    _write_seed_format(path, images, labels)
    with caplog.at_level(logging.INFO, logger="estimator_keras.records"):
        got, got_labels = _read_eval(str(path), ["image_raw"], batch_size=4)
    assert any("seed question's format" in r.getMessage() and "(6, 5, 1)" in r.getMessage()
               for r in caplog.records)
    assert got["image_raw"].shape == (13, 6, 5, 1)
    assert np.array_equal(got["image_raw"], images.astype(np.float32))
    assert got_labels.tolist() == labels.tolist()
    schema = resolve(str(tmp_path / "*.tfrecords")).schema
    assert (schema["image_raw"].encoding, schema["image_raw"].shape) == ("raw", (6, 5, 1))


# --------------------------------------------------------------------------- bytes


def _old_tensorflow_shards(tf, source, schema, out, shards, compression, seed=0):
    """Writes ``source`` as write_dataset shards it, the way it wrote them
    with TensorFlow: tf.train.Example built feature by feature, serialized
    with sorted keys, framed by tf.io.TFRecordWriter. Returns the file names."""
    def encode(values):
        feature = {}
        for name, spec in schema.items():
            value = values[name]
            if spec.encoding in ("bytes", "png", "jpeg"):
                value = value.item() if isinstance(value, np.ndarray) else value
                feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(
                    value=[value.encode() if isinstance(value, str) else bytes(value)]))
            elif spec.encoding == "raw":
                feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[
                    np.ascontiguousarray(value, dtype=spec.dtype).tobytes()]))
            elif spec.encoding == "int64":
                feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(
                    value=np.asarray(value).astype(np.int64).ravel().tolist()))
            else:
                feature[name] = tf.train.Feature(float_list=tf.train.FloatList(
                    value=np.asarray(value).astype(np.float32).ravel().tolist()))
        return tf.train.Example(features=tf.train.Features(
            feature=feature)).SerializeToString(deterministic=True)

    order = np.random.default_rng(seed).permutation(len(source))
    names = []
    for index, part in enumerate(np.array_split(order, shards)):
        names.append(shard_name("train", index, shards, compression))
        options = tf.io.TFRecordOptions(compression_type=compression or "")
        with tf.io.TFRecordWriter(os.path.join(out, names[-1]), options) as writer:
            batch = source.read(part)
            for i in range(len(part)):
                writer.write(encode({name: batch[name][i] for name in schema}))
    return names


def _mixed_arrays(n=57):
    rng = np.random.default_rng(3)
    return {"id": np.arange(n, dtype=np.int64),
            "image": rng.integers(0, 256, (n, 5, 4, 3), dtype=np.uint8),
            "depth": rng.random((n, 2, 2), dtype=np.float32),
            "vec": (rng.normal(size=(n, 3)) * 10.0 ** rng.integers(-30, 30, (n, 3))
                    ).astype(np.float32),
            "ids": rng.integers(-2**63, 2**63 - 1, (n, 4), dtype=np.int64),
            "name": np.array([rng.bytes(int(k)) for k in rng.integers(0, 30, n)], dtype=object),
            "label": rng.integers(0, 10, n).astype(np.int64)}


@pytest.mark.parametrize("compression", [None, "GZIP"])
@pytest.mark.parametrize("framing", ["installed", "tensorflow"])
def test_shards_are_the_bytes_tensorflows_writer_wrote(tmp_path, monkeypatch, compression,
                                                        framing):
    # "installed": tfrecord_frames where google-crc32c is installed;
    # "tensorflow": the writer without google-crc32c, TensorFlow's.
    tf = pytest.importorskip("tensorflow")
    if framing == "tensorflow":
        monkeypatch.setattr(tfrecord_frames, "have_crc32c", lambda: False)
    arrays = _mixed_arrays()
    manifest = write_records(arrays, str(tmp_path / "new"), num_shards=3,
                             compression=compression, progress=False)
    (tmp_path / "old").mkdir()
    names = _old_tensorflow_shards(tf, records.as_source(arrays), manifest.schema,
                                   str(tmp_path / "old"), 3, compression)
    assert [s.file for s in manifest.splits["train"].shards] == names
    for name in names:
        assert (tmp_path / "new" / name).read_bytes() == (tmp_path / "old" / name).read_bytes()


def test_records_read_back_without_google_crc32c_through_tensorflow(tmp_path, monkeypatch):
    pytest.importorskip("tensorflow")
    directory = str(tmp_path / "ds")
    write_records(_mixed_arrays(20), directory, num_shards=1, progress=False)
    path = load_manifest(directory).files("train")[0]
    monkeypatch.setattr(tfrecord_frames, "have_crc32c", lambda: False)
    assert len(list(record_files.read_records(path))) == 20
    start = flip_byte_in_record(path, 4)
    with pytest.raises(CorruptRecordError) as caught:
        list(record_files.read_records(path))
    assert (caught.value.record, caught.value.offset) == (4, start)
    assert check_file(path).num_records == 4


def test_without_google_crc32c_or_tensorflow_the_error_names_both(tmp_path, monkeypatch):
    monkeypatch.setattr(tfrecord_frames, "have_crc32c", lambda: False)
    monkeypatch.setattr(tf_optional, "tensorflow", lambda: None)
    with pytest.raises(UsageError, match="google-crc32c package or TensorFlow's.*pip install "
                                         "google-crc32c"):
        write_records(_mixed_arrays(4), str(tmp_path / "ds"), num_shards=1, progress=False)
    assert not os.path.exists(tmp_path / "ds")  # refused before anything was written


# --------------------------------------------------------------------------- verify

def test_check_file_counts_good_records_before_corruption(tmp_path, tiny_dataset):
    directory, _ = tiny_dataset(n=40, num_shards=2, shuffle=False)
    path = os.path.join(directory, "train-00000-of-00002.tfrecord")
    start = flip_byte_in_record(path, 7)
    check = check_file(path)
    assert not check.ok and (check.num_records, check.offset) == (7, start)

    # Cut inside the 8-byte length of a record: TensorFlow's reader takes
    # that for the end of the file.
    path = os.path.join(directory, "train-00001-of-00002.tfrecord")
    start, _ = record_frames(path)[12]
    with open(path, "r+b") as f:
        f.truncate(start + 5)
    check = check_file(path)
    assert not check.ok and (check.num_records, check.offset) == (12, start)
    assert "truncated" in check.error


def test_check_file_gzip_damage(tiny_dataset):
    directory, _ = tiny_dataset(n=40, num_shards=2, compression="GZIP")
    path = os.path.join(directory, "train-00000-of-00002.tfrecord.gz")
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[:len(data) // 2])
    check = check_file(path)
    assert not check.ok and check.num_records < 20 and check.offset is not None
    other = os.path.join(directory, "train-00001-of-00002.tfrecord.gz")
    assert check_file(other).ok and check_file(other).num_records == 20


def test_inspect_verify_names_corrupt_and_truncated_shards(tiny_dataset, run_cli):
    directory, _ = tiny_dataset(n=40, num_shards=4)
    flipped = os.path.join(directory, "train-00001-of-00004.tfrecord")
    flipped_at = flip_byte_in_record(flipped, 3)
    cut = os.path.join(directory, "train-00002-of-00004.tfrecord")
    cut_at, length = record_frames(cut)[6]
    with open(cut, "r+b") as f:
        f.truncate(cut_at + 12 + length // 2)

    rc, out, err = run_cli("inspect", directory, "--verify", timeout=90)
    assert rc == 1, (out, err)
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  train-")}
    assert f"CORRUPT after 3 good records at byte {flipped_at}" in \
        lines["train-00001-of-00004.tfrecord"]
    assert f"CORRUPT after 6 good records at byte {cut_at}" in \
        lines["train-00002-of-00004.tfrecord"]
    assert lines["train-00000-of-00004.tfrecord"].endswith(" ok")
    assert lines["train-00003-of-00004.tfrecord"].endswith(" ok")
    assert "2 corrupt file(s)" in out


def test_inspect_verify_clean_dataset(tiny_dataset, run_cli):
    directory, _ = tiny_dataset(n=40, num_shards=4, compression="GZIP")
    rc, out, err = run_cli("inspect", directory, "--verify", timeout=90)
    assert rc == 0, (out, err)
    assert "all records verified" in out
    assert "split train: 40 examples in 4 file(s)" in out
    assert sum(line.endswith(" ok") for line in out.splitlines()) == 4


def test_inspect_verify_glob_without_manifest(tmp_path, run_cli):
    rng = np.random.default_rng(2)
    for name, n in (("a.tfrecords", 5), ("b.tfrecords", 7)):
        _write_seed_format(tmp_path / name, rng.integers(0, 256, (n, 4, 4, 1), dtype=np.uint8),
                           rng.integers(0, 10, n))
    start, _ = record_frames(tmp_path / "b.tfrecords")[4]
    with open(tmp_path / "b.tfrecords", "r+b") as f:
        f.truncate(start + 3)
    rc, out, err = run_cli("inspect", str(tmp_path / "*.tfrecords"), "--verify", timeout=90)
    assert rc == 1, (out, err)
    assert "no manifest" in out and "image_raw" in out
    lines = {line.split()[0]: line for line in out.splitlines() if ".tfrecords" in line
             and line.startswith("  ")}
    assert lines["a.tfrecords"].endswith("5 examples  ok")
    assert f"CORRUPT after 4 good records at byte {start}" in lines["b.tfrecords"]
    assert "1 corrupt file(s)" in out


# --------------------------------------------------------------------------- killed writer

_SLOW_WRITER = textwrap.dedent("""
    import sys, time
    from estimator_keras import records, sources

    class SlowShapes(sources.ShapesSource):
        def read(self, indices):
            time.sleep(0.4)
            return super().read(indices)

    records.write_records(SlowShapes(600, image_size=16, seed=0), sys.argv[1],
                          num_shards=6, seed=0, progress=False)
""")


def _kill_writer_when(code, out, log_path, ready):
    """Runs the writer ``code`` on ``out`` and SIGKILLs it once ``ready()``;
    returns its exit status."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-c", code, out], cwd=ROOT,
                                env=child_env(), stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None and not ready():
                time.sleep(0.02)
            assert proc.poll() is None, "the writer ended (or timed out) before it could be killed"
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    return proc.returncode


def test_killed_write_leaves_no_complete_looking_dataset(tmp_path):
    out = str(tmp_path / "ds")
    staging = os.path.join(out, INCOMPLETE_DIR)

    def finished_shard_and_next_under_way():
        finished = os.path.isdir(out) and [n for n in os.listdir(out) if SHARD_FILE.match(n)]
        return bool(finished) and os.path.isdir(staging) and bool(os.listdir(staging))

    returncode = _kill_writer_when(_SLOW_WRITER, out, tmp_path / "writer.log",
                                   finished_shard_and_next_under_way)
    assert returncode == -signal.SIGKILL

    assert not os.path.exists(os.path.join(out, MANIFEST_NAME))
    assert os.listdir(staging)
    left = _dir_bytes(out)
    assert 1 <= len(left) < 6
    for fn in (lambda: resolve(out), lambda: make_dataset(out, 8, training=True)):
        with pytest.raises(DataError) as info:
            fn()
        assert "incomplete" in str(info.value)

    manifest = write_records(ShapesSource(600, image_size=16, seed=0), out, num_shards=6,
                             seed=0, progress=False)
    assert not os.path.exists(staging)
    counts = {s.file: s.num_examples for s in manifest.splits["train"].shards}
    again = _dir_bytes(out)
    for name, data in left.items():
        # A shard left by the killed writer was whole: the rerun writes the same bytes.
        assert data == again[name]
        assert check_file(os.path.join(out, name)).num_records == counts[name] == 100
    total = sum(int(b["image"].shape[0]) for b in make_dataset(
        out, 64, training=False, split="train", features=["image"], label=None))
    assert total == 600


# --------------------------------------------------------------------------- resolve

def test_resolve_refuses_truncated_shard_before_training(tiny_dataset):
    directory, _ = tiny_dataset(n=40, num_shards=4)
    shard = os.path.join(directory, "train-00002-of-00004.tfrecord")
    start, _ = record_frames(shard)[9]
    with open(shard, "r+b") as f:
        f.truncate(start)  # on a record boundary: the reader alone sees nothing wrong
    for fn in (lambda: resolve(directory),
               lambda: make_dataset(directory, 4, training=True),
               lambda: make_dataset(directory, 4, training=False, split="train")):
        with pytest.raises(CorruptRecordError) as info:
            fn()
        assert info.value.path == shard
        assert "train-00002-of-00004.tfrecord" in str(info.value)
        assert "truncated" in str(info.value)
    assert resolve(directory, check_sizes=False).files[2] == shard


def test_resolve_ignores_unlisted_shards_with_warning(tiny_dataset, caplog):
    directory, _ = tiny_dataset(n=40, num_shards=4)
    shutil.copy(os.path.join(directory, "train-00000-of-00004.tfrecord"),
                os.path.join(directory, "train-00000-of-00009.tfrecord"))
    with caplog.at_level(logging.WARNING, logger="estimator_keras.records"):
        resolved = resolve(directory)
    assert [os.path.basename(f) for f in resolved.files] == [
        f"train-{i:05d}-of-00004.tfrecord" for i in range(4)]
    assert resolved.num_examples == 40
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("train-00000-of-00009.tfrecord" in w and "not listed" in w for w in warnings)
    got, _ = _read_eval(directory, ["id"])
    assert sorted(got["id"].astype(int).tolist()) == list(range(40))


# --------------------------------------------------------------------------- one split at a time

def _all_bytes(directory):
    """Every file under ``directory`` (manifest included) -> its bytes."""
    found = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            found[os.path.relpath(path, directory)] = open(path, "rb").read()
    return found


def _ids(directory, split):
    got, _ = _read_eval(directory, ["id"], split=split)
    return sorted(got["id"].astype(int).tolist())


def test_write_records_of_one_split_keeps_the_others(tiny_dataset):
    directory, _ = tiny_dataset(n=40, num_shards=4)
    train_before = {n: b for n, b in _dir_bytes(directory).items() if n.startswith("train-")}
    test_arrays = {k: v[:10] for k, v in tiny_arrays_offset(100).items()}
    write_records(test_arrays, directory, split="test", num_shards=2, progress=False)
    manifest = load_manifest(directory)
    assert list(manifest.splits) == ["train", "test"]
    assert {n: b for n, b in _dir_bytes(directory).items() if n.startswith("train-")} \
        == train_before
    assert _ids(directory, "train") == list(range(40))
    assert _ids(directory, "test") == list(range(100, 110))

    # Rewriting that split replaces only its shards, whatever their number.
    write_records({k: v[:6] for k, v in tiny_arrays_offset(200).items()}, directory,
                  split="test", num_shards=3, progress=False)
    names = sorted(_dir_bytes(directory))
    assert [n for n in names if n.startswith("test-")] == [
        f"test-{i:05d}-of-00003.tfrecord" for i in range(3)]
    assert _ids(directory, "test") == list(range(200, 206))
    assert _ids(directory, "train") == list(range(40))

    # Several splits: the ones not written stay, the ones written are replaced.
    write_dataset({"extra": tiny_arrays_offset(300), "test": tiny_arrays_offset(400)},
                  directory, num_shards=1, progress=False)
    assert list(load_manifest(directory).splits) == ["train", "test", "extra"]
    assert _ids(directory, "train") == list(range(40))
    assert _ids(directory, "test") == list(range(400, 440))


def tiny_arrays_offset(offset, n=40):
    from conftest import tiny_arrays  # pylint: disable=import-outside-toplevel
    arrays = tiny_arrays(n, seed=offset)
    arrays["id"] = arrays["id"] + offset
    return arrays


REFUSED_WRITES = [
    # (what, call, error) -- each refused before any file is touched
    ("other schema", lambda d: write_records({"id": np.arange(5)}, d, split="test"),
     SchemaError),
    ("other compression", lambda d: write_records(tiny_arrays_offset(0, 8), d, split="test",
                                                  compression="GZIP"), UsageError),
    ("num_shards 0", lambda d: write_records(tiny_arrays_offset(0, 8), d, num_shards=0),
     UsageError),
    ("more shards than examples",
     lambda d: write_records(tiny_arrays_offset(0, 8), d, num_shards=9), UsageError),
    ("num_shards a string", lambda d: write_records(tiny_arrays_offset(0, 8), d, num_shards="2"),
     UsageError),
    ("num_shards for an unknown split",
     lambda d: write_dataset({"train": tiny_arrays_offset(0, 8)}, d, num_shards={"tain": 2}),
     UsageError),
    ("bad split name", lambda d: write_records(tiny_arrays_offset(0, 8), d, split="../x"),
     UsageError),
    ("unknown compression",
     lambda d: write_records(tiny_arrays_offset(0, 8), d, compression="zip"), UsageError),
    ("splits disagree", lambda d: write_dataset(
        {"train": tiny_arrays_offset(0, 8), "test": {"id": np.arange(3)}}, d), SchemaError),
    ("bad labels", lambda d: write_records(tiny_arrays_offset(0, 8), d,
                                           labels={"label": {"num_classes": -1}}), SchemaError),
    ("not a source", lambda d: write_records([1, 2, 3], d), UsageError),
]
REFUSED_WRITE_CASES = len(REFUSED_WRITES)
"""Bad write_records / write_dataset calls that must lose nothing."""


@pytest.mark.parametrize("what, call, error", REFUSED_WRITES, ids=[w[0] for w in REFUSED_WRITES])
def test_refused_write_loses_nothing(tiny_dataset, what, call, error):
    directory, _ = tiny_dataset(n=40, num_shards=4)
    write_records(tiny_arrays_offset(500, 12), directory, split="test", num_shards=2,
                  progress=False)
    before = _all_bytes(directory)
    with pytest.raises(error):
        call(directory)
    assert _all_bytes(directory) == before, what


_SLOW_SPLIT_WRITER = textwrap.dedent("""
    import sys, time
    from estimator_keras import records, sources

    class SlowShapes(sources.ShapesSource):
        def read(self, indices):
            time.sleep(0.4)
            return super().read(indices)

    records.write_records(SlowShapes(600, image_size=16, seed=1), sys.argv[1], split="test",
                          num_shards=6, seed=0, progress=False)
""")


def test_killed_rewrite_of_one_split_keeps_the_others(tmp_path):
    out = str(tmp_path / "ds")
    write_records(ShapesSource(60, image_size=16, seed=0), out, num_shards=2, progress=False)
    write_records(ShapesSource(30, image_size=16, seed=2), out, split="test", num_shards=1,
                  progress=False)
    train_before = {n: b for n, b in _dir_bytes(out).items() if n.startswith("train-")}
    staging = os.path.join(out, INCOMPLETE_DIR)
    returncode = _kill_writer_when(_SLOW_SPLIT_WRITER, out, tmp_path / "writer.log",
                                   lambda: os.path.isdir(staging) and bool(os.listdir(staging)))
    assert returncode == -signal.SIGKILL
    # The manifest lists the kept split only; its shards are untouched and readable.
    manifest = load_manifest(out)
    assert list(manifest.splits) == ["train"]
    assert {n: b for n, b in _dir_bytes(out).items() if n.startswith("train-")} == train_before
    assert resolve(out, "train").num_examples == 60
    with pytest.raises(DataError, match="no split 'test'"):
        resolve(out, "test")
    write_records(ShapesSource(30, image_size=16, seed=2), out, split="test", num_shards=1,
                  progress=False)
    assert list(load_manifest(out).splits) == ["train", "test"]


def test_workers_of_a_script_without_a_main_guard_fail_instead_of_hanging(tmp_path):
    # Spawned workers import the calling script again; without a __main__
    # guard each would start writing anew. The write must fail, and say why.
    script = tmp_path / "write_unguarded.py"
    script.write_text(
        "import numpy as np\n"
        "from estimator_keras.records import write_records\n"
        "write_records({'x': np.arange(40, dtype=np.int64)}, %r, num_shards=4,\n"
        "              num_workers=2, progress=False)\n" % str(tmp_path / "out"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode != 0
    assert 'if __name__ == "__main__":' in proc.stderr, proc.stderr[-2000:]
    assert not os.path.exists(tmp_path / "out" / MANIFEST_NAME)
