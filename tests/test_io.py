"""estimator_keras.io: one set of path and atomic-write rules, local and remote
(``ram://`` stands in for ``gs://``: both go through tf.io.gfile)."""

import os
import stat

import pytest

from estimator_keras import io


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
