"""estimator_keras.io: one set of path and atomic-write rules, local and remote
(``ram://`` stands in for ``gs://``: both go through tf.io.gfile; without
TensorFlow fsspec's ``memory://`` does, through fsspec)."""

import importlib.util
import os
import stat
import sys

import numpy as np
import pytest

from estimator_keras import io, records, tf_optional, verify
from estimator_keras.errors import UsageError


def test_atomic_write_replaces_whole_or_not_at_all(tmp_path):
    path = str(tmp_path / "a.json")
    io.atomic_write(path, "old")
    with pytest.raises(RuntimeError):
        with io.atomic_file(path) as f:
            f.write("half of the new")
            raise RuntimeError("killed midway")
    assert io.read_text(path) == "old"
    assert os.listdir(tmp_path) == ["a.json"]  # the temporary file is gone
    io.atomic_write(path, b"new")
    assert io.read_bytes(path) == b"new"


def test_atomic_file_gets_the_umask_permissions(tmp_path):
    old = os.umask(0o027)
    try:
        io.atomic_write(str(tmp_path / "f"), "x")
        folder = io.new_dir(str(tmp_path), ".stage-")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "f").st_mode) == 0o640
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o750


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a/../../b", "gs://b/x", "", "a//b",
                                  "./a"])
def test_child_refuses_names_that_leave_the_folder(name):
    with pytest.raises(ValueError, match="shard"):
        io.child("/data/ds", name, what="shard")


def test_child_and_join_and_parent():
    assert io.child("gs://b/ds", "train-00000-of-00001.tfrecord") == \
        "gs://b/ds/train-00000-of-00001.tfrecord"
    assert io.child("/d", "sub/f") == "/d/sub/f"
    assert io.join("gs://b/x/", "y", "z") == "gs://b/x/y/z"
    assert io.parent("gs://b/x/y/") == "gs://b/x"
    assert io.parent("gs://b") == "gs://b"
    assert io.parent("/a/b") == "/a" and io.parent("b") == "."
    assert io.is_remote("gs://b") and not io.is_remote("/a")


def test_swap_in_and_recover_after_a_crash_between_the_renames(tmp_path):
    dest = str(tmp_path / "export")
    os.makedirs(dest)
    (tmp_path / "export" / "v").write_text("1")
    new = io.new_dir(str(tmp_path), ".export.tmp-")
    with open(os.path.join(new, "v"), "w") as f:
        f.write("2")
    io.swap_in(new, dest)
    assert io.read_text(os.path.join(dest, "v")) == "2"
    assert sorted(os.listdir(tmp_path)) == ["export"]
    # A crash after the first rename leaves only the old copy aside.
    os.rename(dest, dest + io.OLD_MARK + "12345")
    assert io.recover_swap(dest)
    assert io.read_text(os.path.join(dest, "v")) == "2"
    assert not io.recover_swap(dest)


def test_copy_tree_and_stale_entries(tmp_path):
    src = tmp_path / "src"
    (src / "a" / "b").mkdir(parents=True)
    (src / "top").write_text("t")
    (src / "a" / "b" / "deep").write_text("d")
    written = io.copy_tree(str(src), str(tmp_path / "dst"))
    assert sorted(os.path.relpath(p, tmp_path / "dst") for p in written) == ["a/b/deep", "top"]
    assert (tmp_path / "dst" / "a" / "b" / "deep").read_text() == "d"
    for name in (".x.tmp-1-aa", f".x.tmp-{os.getpid()}-bb", ".x.tmp-999-cc", "other"):
        (tmp_path / name).mkdir()
    dead = io.stale_entries(str(tmp_path), ".x.tmp-*", alive=lambda pid: pid == 999)
    assert sorted(dead) == [".x.tmp-1-aa", f".x.tmp-{os.getpid()}-bb"]


def test_remote_paths_go_through_gfile():
    pytest.importorskip("tensorflow")
    base = "ram://io-test"
    io.makedirs(base)
    io.atomic_write(io.join(base, "m.json"), "{}")
    io.copy_file(io.join(base, "m.json"), io.join(base, "copy.json"))
    assert io.read_text(io.join(base, "copy.json")) == "{}"
    assert io.listdir(base) == ["copy.json", "m.json"]
    assert io.size(io.join(base, "m.json")) == 2
    io.remove(io.join(base, "m.json"))
    io.remove(io.join(base, "m.json"))  # missing is fine
    assert not io.exists(io.join(base, "m.json"))


def test_remote_paths_without_tensorflow_go_through_fsspec(monkeypatch):
    pytest.importorskip("fsspec")
    monkeypatch.setattr(tf_optional, "tensorflow", lambda: None)
    base = "memory://io-fsspec-test"
    io.makedirs(io.join(base, "sub", "deep"))
    io.atomic_write(io.join(base, "m.json"), "{}")
    io.atomic_write(io.join(base, "sub", "deep", "f.bin"), b"\0\1")
    io.copy_file(io.join(base, "m.json"), io.join(base, "copy.json"))
    assert io.read_text(io.join(base, "copy.json")) == "{}"
    assert io.listdir(base) == ["copy.json", "m.json", "sub"]
    assert io.glob(io.join(base, "*.json")) == [io.join(base, "copy.json"),
                                                 io.join(base, "m.json")]
    assert io.isdir(io.join(base, "sub")) and io.isfile(io.join(base, "m.json"))
    assert io.size(io.join(base, "sub", "deep", "f.bin")) == 2
    assert io.mtime_ns(io.join(base, "m.json")) > 0
    assert io.copy_tree(io.join(base, "sub"), io.join(base, "tree")) == [
        io.join(base, "tree", "deep", "f.bin")]
    io.rename(io.join(base, "copy.json"), io.join(base, "moved.json"))
    with pytest.raises(FileExistsError):
        io.rename(io.join(base, "moved.json"), io.join(base, "m.json"), overwrite=False)
    io.remove(io.join(base, "m.json"))
    io.remove(io.join(base, "m.json"))  # missing is fine
    with pytest.raises(FileNotFoundError):
        io.remove(io.join(base, "m.json"), missing_ok=False)
    io.rmtree(io.join(base, "tree"))
    assert io.listdir(base) == ["moved.json", "sub"]


def test_a_dataset_is_written_and_verified_through_fsspec(monkeypatch):
    pytest.importorskip("fsspec")
    pytest.importorskip("google_crc32c")
    monkeypatch.setattr(tf_optional, "tensorflow", lambda: None)
    base = "memory://io-fsspec-dataset"
    records.write_records({"x": np.arange(10)}, base, num_shards=2, compression="GZIP",
                          progress=False)
    found = records.resolve(base)
    assert found.files == [io.join(base, f"train-0000{i}-of-00002.tfrecord.gz")
                           for i in range(2)]
    report = verify.inspect(base, verify=True)
    assert not report.broken and "all records verified" in verify.format_report(report)


def test_gs_paths_without_tensorflow_name_what_to_install(monkeypatch):
    monkeypatch.setattr(tf_optional, "tensorflow", lambda: None)
    # Past the cache of an import that an earlier test made.
    uncached = io._fsspec_module.__wrapped__  # pylint: disable=protected-access
    monkeypatch.setattr(io, "_fsspec_module", uncached)
    monkeypatch.setitem(sys.modules, "gcsfs", None)
    if importlib.util.find_spec("fsspec") is None:
        expected = "pip install fsspec gcsfs"
    else:
        expected = "gs://bucket/data.*pip install gcsfs"
    with pytest.raises(UsageError, match=expected):
        io.exists("gs://bucket/data")
    monkeypatch.setitem(sys.modules, "fsspec", None)
    with pytest.raises(UsageError, match="neither is installed: run `pip install fsspec gcsfs`"):
        io.exists("gs://bucket/data")
