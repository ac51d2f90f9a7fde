"""Tests of estimator_keras.record_index: TFRecord shards read by record index,
without TensorFlow (only the last test reads TensorFlow's own files). That the
module imports no TensorFlow is tests/test_layout.py's (TF_FREE)."""

import gc
from concurrent import futures
import multiprocessing
import os
import pickle
import stat

import numpy as np
import pytest

from support import flip_byte_in_record, record_frames
from estimator_keras import record_index
from estimator_keras import tfrecord_frames as frames
from estimator_keras.errors import CorruptRecordError, DataError
from estimator_keras.record_index import ShardedRecords

COMPRESSIONS = (None, "GZIP", "ZLIB")
COUNTS = (7, 0, 1, 30)


@pytest.fixture(autouse=True)
def cache_home(tmp_path, monkeypatch):
    """Each test's own per-user cache (not yet created)."""
    home = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    return home


def _cache(home):
    return home / "estimator-keras" / "record-index"


def _shards(folder, compression=None, counts=COUNTS, seed=0):
    """Shards holding ``counts`` records of random sizes (0 to 5000 bytes),
    some alike (compressible); returns (paths, the records of each)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(exist_ok=True)
    paths, contents = [], []
    for i, count in enumerate(counts):
        data = [rng.bytes(int(n)) if j % 3 else bytes([j % 256]) * int(n)
                for j, n in enumerate(rng.integers(0, 5000, count))]
        path = str(folder / f"shard-{i}.tfrecord")
        frames.write_records(path, data, compression)
        paths.append(path)
        contents.append(data)
    return paths, contents


def _every_record(paths, compression):
    return [r for path in paths for r in frames.read_records(path, compression)]


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_each_index_reads_what_read_records_yields(tmp_path, compression):
    paths, contents = _shards(tmp_path / "data", compression)
    expected = _every_record(paths, compression)
    assert expected == [r for c in contents for r in c]
    data = ShardedRecords(paths, compression)
    assert len(data) == sum(COUNTS) == len(expected)
    assert [data[i] for i in range(len(data))] == expected
    assert data[-1] == expected[-1] and data[np.int64(3)] == expected[3]
    assert [data.file_of(i) for i in (0, 6, 7, 8, 37)] == [(0, 0), (0, 6), (2, 0), (3, 0),
                                                           (3, 29)]
    for index in (len(data), -len(data) - 1):
        with pytest.raises(IndexError, match="out of range"):
            data[index]  # pylint: disable=pointless-statement
    data.close()
    assert data[5] == expected[5]  # reopened on demand


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_offsets_are_each_records_start_and_the_end(tmp_path, compression):
    paths, _ = _shards(tmp_path / "data", None, counts=(5,))
    starts = [start for start, _ in record_frames(paths[0])]
    expected = starts + [os.path.getsize(paths[0])]
    if compression:
        frames.write_records(paths[0] + ".z", frames.read_records(paths[0]), compression)
        paths[0] += ".z"
    found = record_index.offsets(paths[0], compression)
    assert found.dtype == np.int64 and found.tolist() == expected


@pytest.mark.parametrize("compression", (None, "GZIP"))
def test_read_many_returns_a_permutation_in_the_order_given(tmp_path, compression):
    paths, _ = _shards(tmp_path / "data", compression)
    expected = _every_record(paths, compression)
    data = ShardedRecords(paths, compression)
    order = np.random.default_rng(1).permutation(len(data)).tolist()
    assert data.read_many(order) == [expected[i] for i in order]
    picks = [3, 3, 37, 0, -1, 8, 9, 10, 2]
    assert data.read_many(picks) == [expected[i] for i in picks]
    assert data.read_many([]) == []
    with pytest.raises(IndexError, match=f"index {len(data)} is out of range"):
        data.read_many([0, len(data)])


def test_threads_read_at_once(tmp_path):
    # Grain reads from threads: the files open lazily, once, under a lock.
    paths, _ = _shards(tmp_path / "data")
    expected = _every_record(paths, None)
    data = ShardedRecords(paths)
    order = np.random.default_rng(3).permutation(len(data)).tolist() * 4
    with futures.ThreadPoolExecutor(8) as pool:
        assert list(pool.map(data.__getitem__, order)) == [expected[i] for i in order]
    assert sorted(data._handles) == [0, 2, 3]  # pylint: disable=protected-access


def _read_in_child(data, indices):
    return os.getpid(), data.read_many(indices), data[indices[0]]


def test_a_pickled_copy_reads_in_a_spawned_process(tmp_path):
    paths, _ = _shards(tmp_path / "data", "ZLIB")
    expected = _every_record(paths, "ZLIB")
    data = ShardedRecords(paths, "ZLIB")
    assert data[0] == expected[0]  # a file open in this process: not pickled
    copy = pickle.loads(pickle.dumps(data))
    assert not copy._handles  # pylint: disable=protected-access
    assert copy.read_many([4, 1]) == [expected[4], expected[1]]
    indices = [20, 2, 11, 37]
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        pid, many, one = pool.apply_async(_read_in_child, (data, indices)).get(timeout=120)
    assert pid != os.getpid()
    assert many == [expected[i] for i in indices] and one == expected[20]


def _corrupt_error(read):
    with pytest.raises(CorruptRecordError) as caught:
        read()
    return caught.value


def test_a_flipped_data_byte_names_the_file_and_the_record(tmp_path):
    paths, contents = _shards(tmp_path / "data")
    start = flip_byte_in_record(paths[3], 4)
    data = ShardedRecords(paths)  # the scan skips the data
    for read in (lambda: data[8 + 4], lambda: data.read_many([9, 12, 13])):
        error = _corrupt_error(read)
        assert (error.path, error.record, error.offset) == (paths[3], 4, start)
        assert f"{paths[3]}: record 4 (at byte {start})" in str(error)
        assert "CRC of its data" in str(error)
    assert data[8 + 5] == contents[3][5]  # the records around it stay readable


def test_a_flipped_length_byte_is_found_by_the_scan(tmp_path):
    paths, _ = _shards(tmp_path / "data")
    start, _ = record_frames(paths[0])[2]
    with open(paths[0], "r+b") as f:
        f.seek(start + 1)
        byte = f.read(1)
        f.seek(start + 1)
        f.write(bytes([byte[0] ^ 0x10]))
    error = _corrupt_error(lambda: ShardedRecords(paths))
    assert (error.path, error.record, error.offset) == (paths[0], 2, start)
    assert "CRC of its length" in str(error)


@pytest.mark.parametrize("cut", [1, 10, 300])
def test_a_truncated_file_is_corrupt_at_its_last_record(tmp_path, cut):
    paths, contents = _shards(tmp_path / "data", counts=(3, 12))
    frames.write_records(paths[1], contents[1] + [b"x" * 400])
    start, _ = record_frames(paths[1])[12]
    os.truncate(paths[1], os.path.getsize(paths[1]) - cut)
    error = _corrupt_error(lambda: ShardedRecords(paths))
    assert (error.path, error.record, error.offset) == (paths[1], 12, start)
    assert "ends inside the record" in str(error)


@pytest.mark.parametrize("compression", ("GZIP", "ZLIB"))
def test_a_damaged_compressed_shard_is_named_as_read_records_names_it(tmp_path, compression):
    paths, _ = _shards(tmp_path / "data", compression, counts=(4, 20))
    os.truncate(paths[1], os.path.getsize(paths[1]) - 5)
    theirs = _corrupt_error(lambda: list(frames.read_records(paths[1], compression)))
    ours = _corrupt_error(lambda: ShardedRecords(paths, compression))
    assert str(ours) == str(theirs) and ours.path == paths[1]
    # The first shard's index and copy, and nothing of the second's.
    assert sorted(p.suffix for p in _cache(tmp_path / "xdg").iterdir()) == [".index",
                                                                          ".tfrecord"]


def test_counts_that_disagree_with_the_manifest_name_the_file(tmp_path):
    paths, _ = _shards(tmp_path / "data")
    assert len(ShardedRecords(paths, counts=list(COUNTS))) == sum(COUNTS)
    with pytest.raises(DataError, match=f"{paths[2]}: the manifest says it holds 2 records, "
                                        f"the file holds 1"):
        ShardedRecords(paths, counts=[7, 0, 2, 30])
    with pytest.raises(DataError, match="3 record counts given for 4 files"):
        ShardedRecords(paths, counts=[7, 0, 1])


def _no_indexing(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"indexed again: {args}")
    monkeypatch.setattr(record_index, "offsets", refuse)
    monkeypatch.setattr(record_index, "_decompressed", refuse)


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_a_second_construction_reads_the_cached_index(tmp_path, cache_home, monkeypatch,
                                                      compression):
    paths, _ = _shards(tmp_path / "data", compression)
    expected = _every_record(paths, compression)
    ShardedRecords(paths, compression)
    cached = sorted(_cache(cache_home).iterdir())
    assert len([p for p in cached if p.suffix == ".index"]) == len(paths)
    assert len([p for p in cached if p.suffix == ".tfrecord"]) == (len(paths) if compression
                                                                   else 0)
    times = {p: p.stat().st_mtime_ns for p in cached}
    with monkeypatch.context() as patch:
        _no_indexing(patch)
        data = ShardedRecords(paths, compression)
    assert [data[i] for i in range(len(data))] == expected
    assert {p: p.stat().st_mtime_ns for p in sorted(_cache(cache_home).iterdir())} == times
    for folder in (cache_home, cache_home / "estimator-keras", _cache(cache_home)):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder


def _flip_last_byte(path):
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        byte = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0x01]))


@pytest.mark.parametrize("compression, damaged", [(None, ".index"), ("GZIP", ".index"),
                                                  ("GZIP", ".tfrecord")])
def test_a_damaged_cache_file_is_found_by_its_checksum_and_rebuilt(tmp_path, cache_home,
                                                                   monkeypatch, compression,
                                                                   damaged):
    paths, _ = _shards(tmp_path / "data", compression, counts=(9,))
    expected = _every_record(paths, compression)
    ShardedRecords(paths, compression)
    (path,) = _cache(cache_home).glob("*" + damaged)
    good = path.read_bytes()
    _flip_last_byte(path)
    with monkeypatch.context() as patch:
        _no_indexing(patch)
        with pytest.raises(AssertionError, match="indexed again"):
            ShardedRecords(paths, compression)
    data = ShardedRecords(paths, compression)
    assert [data[i] for i in range(len(data))] == expected
    assert path.read_bytes() == good


def test_a_cached_index_of_another_shard_is_not_trusted(tmp_path, cache_home, monkeypatch):
    paths, contents = _shards(tmp_path / "data", counts=(4, 4))
    ShardedRecords(paths)
    index = {b"shard-0" in p.read_bytes().split(b"\n", 1)[0]: p
             for p in _cache(cache_home).iterdir()}
    index[False].write_bytes(index[True].read_bytes())  # the second's name, the first's index
    with monkeypatch.context() as patch:
        _no_indexing(patch)
        with pytest.raises(AssertionError, match="indexed again"):
            ShardedRecords(paths)
    assert ShardedRecords(paths).read_many(range(8)) == contents[0] + contents[1]


@pytest.mark.parametrize("compression", (None, "ZLIB"))
def test_a_shard_changed_after_caching_is_indexed_again(tmp_path, compression):
    paths, _ = _shards(tmp_path / "data", compression, counts=(5, 6))
    ShardedRecords(paths, compression)
    frames.write_records(paths[1], [b"new record %d" % i for i in range(3)], compression)
    data = ShardedRecords(paths, compression)
    assert len(data) == 8
    assert data.read_many([5, 6, 7]) == [b"new record 0", b"new record 1", b"new record 2"]


def test_without_a_usable_cache_it_works_and_leaves_nothing(tmp_path):
    paths, _ = _shards(tmp_path / "data", "GZIP", counts=(3, 4))
    expected = _every_record(paths, "GZIP")
    (tmp_path / "a-file").write_text("")
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # writable by others: its checksums could be forged
    for cache_dir in (tmp_path / "a-file" / "cache", shared):
        data = ShardedRecords(paths, "GZIP", cache_dir=cache_dir)
        assert data.read_many(range(7)) == expected
        copies = data._temp  # pylint: disable=protected-access
        assert os.path.isdir(copies) and not os.listdir(shared)
        del data
        gc.collect()
        assert not os.path.exists(copies)


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_tensorflows_own_files_read_the_same_by_index(tmp_path, compression):
    tf = pytest.importorskip("tensorflow")
    _, contents = _shards(tmp_path / "ours", counts=(12, 0, 5))
    paths = []
    for folder in (str(tmp_path), "ram://record-index-test"):
        for i, records in enumerate(contents):
            paths.append(f"{folder}/tf-{compression}-{i}")
            options = tf.io.TFRecordOptions(compression_type=compression or "")
            with tf.io.TFRecordWriter(paths[-1], options) as writer:
                for record in records:
                    writer.write(record)
    expected = [r.numpy() for r in tf.data.TFRecordDataset(paths, compression or "")]
    data = ShardedRecords(paths, compression)
    assert [data[i] for i in range(len(data))] == expected
    order = np.random.default_rng(2).permutation(len(data)).tolist()
    assert data.read_many(order) == [expected[i] for i in order]
