"""Tests of estimator_keras.tfrecord_frames: TFRecord files without TensorFlow.

Every file is checked against TensorFlow's own writer and reader: the bytes
written, and the records each reads from the other's files. That the module
imports no TensorFlow is tests/test_layout.py's (TF_FREE).
"""

import os
import sys

import numpy as np
import pytest
import tensorflow as tf

from support import flip_byte_in_record, generated_examples, record_frames
from estimator_keras import example_codec, records
from estimator_keras import tfrecord_frames as frames
from estimator_keras.errors import CorruptRecordError, UsageError

COMPRESSIONS = (None, "GZIP", "ZLIB")


def _tf_write(path, data, compression):
    options = tf.io.TFRecordOptions(compression_type=compression or "")
    with tf.io.TFRecordWriter(str(path), options) as writer:
        for record in data:
            writer.write(record)


def _tf_read(path, compression):
    return [r.numpy() for r in tf.data.TFRecordDataset(str(path), compression or "")]


def _raw_records():
    """Byte strings of many sizes: empty, tiny, and past TensorFlow's 256 KiB
    zlib buffers, compressible and not."""
    rng = np.random.default_rng(7)
    sizes = [0, 1, 11, 300, 4096, 70000, 600000] + list(rng.integers(0, 2000, 40))
    return [rng.bytes(int(n)) if i % 2 else bytes(int(n) % 251 for _ in range(1)) * int(n)
            for i, n in enumerate(sizes)]


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_examples_are_written_byte_for_byte_as_tensorflow_writes_them(tmp_path, compression):
    schema, examples = generated_examples(200, seed=3)
    _tf_write(tmp_path / "tf", [records.encode_example(schema, e) for e in examples],
              compression)
    with frames.RecordWriter(tmp_path / "ours", compression) as writer:
        for example in examples:
            writer.write(example_codec.encode_example(schema, example))
    theirs, ours = (tmp_path / "tf").read_bytes(), (tmp_path / "ours").read_bytes()
    assert len(ours) == len(theirs)
    assert ours == theirs


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_records_of_every_size_match_tensorflow_both_ways(tmp_path, compression):
    data = _raw_records()
    _tf_write(tmp_path / "tf", data, compression)
    assert frames.write_records(tmp_path / "ours", data, compression) == len(data)
    assert (tmp_path / "ours").read_bytes() == (tmp_path / "tf").read_bytes()
    assert _tf_read(tmp_path / "ours", compression) == data
    assert list(frames.read_records(tmp_path / "tf", compression)) == data


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_tensorflow_reads_our_examples_and_we_read_its(tmp_path, compression):
    schema, examples = generated_examples(50, seed=4)
    frames.write_records(tmp_path / "ours",
                         (example_codec.encode_example(schema, e) for e in examples),
                         compression)
    _tf_write(tmp_path / "tf", [records.encode_example(schema, e) for e in examples],
              compression)
    read_by_tf = [tf.train.Example.FromString(r) for r in _tf_read(tmp_path / "ours",
                                                                    compression)]
    expected = [tf.train.Example.FromString(records.encode_example(schema, e))
                for e in examples]
    assert read_by_tf == expected
    for data, example in zip(frames.read_records(tmp_path / "tf", compression), examples):
        decoded = example_codec.decode_example(schema, data)
        for name, spec in schema.items():
            if spec.encoding == "bytes":
                assert decoded[name] == example[name], name
            else:
                np.testing.assert_array_equal(decoded[name], example[name], err_msg=name)


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_an_empty_file_holds_no_records_as_tensorflow_reads_it(tmp_path, compression):
    (tmp_path / "empty").write_bytes(b"")
    assert _tf_read(tmp_path / "empty", compression) == []
    assert list(frames.read_records(tmp_path / "empty", compression)) == []
    frames.write_records(tmp_path / "none", [], compression)
    assert (tmp_path / "none").read_bytes() == _tf_empty(tmp_path, compression)


def _tf_empty(tmp_path, compression):
    _tf_write(tmp_path / "tf-empty", [], compression)
    return (tmp_path / "tf-empty").read_bytes()


def _three_records(tmp_path):
    path = tmp_path / "three.tfrecord"
    frames.write_records(path, [b"first" * 10, b"second" * 10, b"third" * 10])
    return str(path)


def _read_error(path, compression=None):
    with pytest.raises(CorruptRecordError) as caught:
        list(frames.read_records(path, compression))
    error = caught.value
    assert error.path == path and str(path) in str(error)
    assert f"record {error.record} (at byte {error.offset}" in str(error)
    return error


def test_a_flipped_data_byte_names_the_file_record_and_offset(tmp_path):
    path = _three_records(tmp_path)
    start = flip_byte_in_record(path, 1)
    error = _read_error(path)
    assert (error.record, error.offset) == (1, start) and start > 0
    assert "CRC of its data" in str(error)


def test_a_flipped_length_byte_names_the_file_record_and_offset(tmp_path):
    path = _three_records(tmp_path)
    start, _ = record_frames(path)[2]
    with open(path, "r+b") as f:
        f.seek(start)
        byte = f.read(1)
        f.seek(start)
        f.write(bytes([byte[0] ^ 0x01]))
    error = _read_error(path)
    assert (error.record, error.offset) == (2, start)
    assert "CRC of its length" in str(error)


@pytest.mark.parametrize("cut", [1, 6, 20])
def test_a_truncated_file_names_the_file_record_and_offset(tmp_path, cut):
    path = _three_records(tmp_path)
    start, _ = record_frames(path)[2]
    os.truncate(path, os.path.getsize(path) - cut)
    error = _read_error(path)
    assert (error.record, error.offset) == (2, start)
    assert "ends inside the record" in str(error)
    # TensorFlow refuses the same file.
    with pytest.raises(tf.errors.DataLossError):
        _tf_read(path, None)


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB"])
def test_a_truncated_compressed_file_is_corrupt(tmp_path, compression):
    path = str(tmp_path / "cut")
    frames.write_records(path, _raw_records()[:6], compression)
    os.truncate(path, os.path.getsize(path) - 3)
    error = _read_error(path, compression)
    assert f"{compression}-decompressed stream" in str(error)
    assert "truncated" in str(error)


def test_damaged_compressed_bytes_are_corrupt(tmp_path):
    path = str(tmp_path / "damaged")
    frames.write_records(path, [bytes(range(256)) * 40] * 3, "ZLIB")
    with open(path, "r+b") as f:
        f.seek(40)
        f.write(b"\xff\xff\xff\xff")
    error = _read_error(path, "ZLIB")
    assert "damaged" in str(error)


def test_a_failed_write_leaves_no_file_and_the_old_one_stays(tmp_path):
    path = tmp_path / "kept.tfrecord"
    frames.write_records(path, [b"old"])
    with pytest.raises(ValueError, match="boom"):
        with frames.RecordWriter(path) as writer:
            writer.write(b"new")
            raise ValueError("boom")
    assert list(frames.read_records(path)) == [b"old"]
    assert os.listdir(tmp_path) == ["kept.tfrecord"]


def test_a_writer_aborted_or_never_closed_leaves_nothing(tmp_path):
    writer = frames.RecordWriter(tmp_path / "aborted", "GZIP")
    writer.write(b"x")
    writer.abort()
    writer = frames.RecordWriter(tmp_path / "dropped")
    writer.write(b"x")
    del writer
    assert os.listdir(tmp_path) == []


def test_an_unknown_compression_is_refused():
    with pytest.raises(UsageError, match="'GZIP' or 'ZLIB'.*'BZ2'"):
        frames.check_compression("BZ2")
    assert [frames.check_compression(c) for c in ("", "NONE", "gzip", "zlib")] == [
        None, None, "GZIP", "ZLIB"]


def test_without_google_crc32c_the_error_names_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "google_crc32c", None)
    # Past the cache of an import that an earlier test made.
    uncached = frames._crc32c.__wrapped__  # pylint: disable=protected-access
    monkeypatch.setattr(frames, "_crc32c", uncached)
    with pytest.raises(UsageError, match="pip install google-crc32c"):
        frames.frame(b"data")

