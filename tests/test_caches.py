"""The IDX caches: a private per-user folder, downloads checked against the
published SHA-256 of MNIST and Fashion-MNIST, and decompressed files reused
only while their recorded hashes hold. Nothing here touches the network:
downloads go through a fake fetcher serving local files.
"""

import gzip
import hashlib
import os
import stat
import struct
import tempfile

import numpy as np
import pytest

from support import FASHION
from estimator_keras.errors import DataError
from estimator_keras.sources import download, idx
from estimator_keras.sources.idx import IdxSource, find_idx_files, read_idx, user_cache_dir, write_idx

needs_fashion_mnist = pytest.mark.skipif(not os.path.isdir(FASHION),
                                         reason="dataset-fashion-mnist is not installed")

# MD5s zalandoresearch/fashion-mnist's README publishes for its four files.
PUBLISHED_MD5 = {
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
}
# Debian's package holds the same deflate streams with the gzip header's
# file name dropped and its time reset; these are the original times.
ORIGINAL_MTIME = {"train": 1504176606, "t10k": 1504176627}


def published_bytes(name):
    """The file Zalando publishes, rebuilt from Debian's copy: the original
    gzip header (FNAME flag, time, name) before the same compressed data."""
    data = open(os.path.join(FASHION, name), "rb").read()
    assert data[:4] == b"\x1f\x8b\x08\x00"
    mtime = ORIGINAL_MTIME[name.split("-")[0]]
    return (b"\x1f\x8b\x08\x08" + struct.pack("<I", mtime) + data[8:10]
            + name[:-3].encode() + b"\0" + data[10:])


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "estimator-keras"


# --------------------------------------------------------------------------- the folder

def test_cache_folder_is_private_and_per_user(tmp_path, private_cache, monkeypatch):
    path = user_cache_dir("idx")
    assert path == str(private_cache / "idx")
    for folder in (private_cache, private_cache / "idx"):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    # A relative XDG_CACHE_HOME is ignored, as the spec says: ~/.cache then.
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert user_cache_dir() == str(tmp_path / "home" / ".cache" / "estimator-keras")


@pytest.mark.parametrize("mode, needle", [(0o777, "writable by group and others"),
                                          (0o720, "writable by group"),
                                          (0o702, "writable by others")])
def test_cache_folder_writable_by_others_is_refused(private_cache, mode, needle):
    user_cache_dir("idx")
    os.chmod(private_cache, mode)
    with pytest.raises(DataError) as info:
        user_cache_dir("idx")
    assert needle in str(info.value) and str(private_cache) in str(info.value)


def test_cache_folder_of_another_user_is_refused(private_cache, monkeypatch):
    user_cache_dir()
    monkeypatch.setattr(idx.os, "getuid", lambda: os.stat(private_cache).st_uid + 1)
    with pytest.raises(DataError, match="belongs to uid .*, not to you"):
        user_cache_dir()


# --------------------------------------------------------------------------- decompression cache

def _gz_pair(folder, n=50, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, 6, 5), dtype=np.uint8)
    labels = rng.integers(0, 10, n).astype(np.uint8)
    os.makedirs(folder, exist_ok=True)
    ip, lp = os.path.join(folder, "a-images.gz"), os.path.join(folder, "a-labels.gz")
    write_idx(ip, images)
    write_idx(lp, labels)
    return ip, lp, images, labels


def test_default_decompression_cache_is_the_private_folder(tmp_path, private_cache,
                                                          monkeypatch):
    shared_tmp = tmp_path / "shared-tmp"
    shared_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(shared_tmp))
    ip, lp, images, _ = _gz_pair(tmp_path / "src")
    source = IdxSource(ip, lp)
    cached = sorted(os.listdir(private_cache / "idx"))
    assert len(cached) == 2 and all(n.startswith("a-") for n in cached)
    assert not os.listdir(shared_tmp)
    np.testing.assert_array_equal(source.read([3])["image"][0, ..., 0], images[3])


def test_altered_cache_file_of_the_same_size_is_not_trusted(tmp_path):
    ip, lp, images, _ = _gz_pair(tmp_path / "src")
    cache = tmp_path / "cache"
    IdxSource(ip, lp, cache_dir=str(cache))
    cached = next(cache / n for n in os.listdir(cache) if "images" in n)
    size = os.path.getsize(cached)
    with open(cached, "r+b") as f:       # one pixel of example 7, same size
        f.seek(16 + 7 * 30 + 4)
        f.write(bytes([(int(images[7, 0, 4]) + 1) % 256]))
    again = IdxSource(ip, lp, cache_dir=str(cache))
    assert os.path.getsize(cached) == size
    np.testing.assert_array_equal(again.read([7])["image"][0, ..., 0], images[7])


def test_changed_source_with_the_same_size_and_time_is_not_served_from_cache(tmp_path):
    ip, lp, _, _ = _gz_pair(tmp_path / "src")
    cache = tmp_path / "cache"
    IdxSource(ip, lp, cache_dir=str(cache))
    info = os.stat(ip)
    data = bytearray(open(ip, "rb").read())
    data[len(data) // 2] ^= 0xFF           # damaged in place: size and time kept
    with open(ip, "wb") as f:
        f.write(data)
    os.utime(ip, ns=(info.st_atime_ns, info.st_mtime_ns))
    with pytest.raises(DataError, match=os.path.basename(ip)):
        IdxSource(ip, lp, cache_dir=str(cache))


# --------------------------------------------------------------------------- downloads

class FakeFetch:
    """fetch(url, path) writing ``files[name]`` and recording the URLs."""

    def __init__(self, files):
        self.files, self.urls = files, []

    def __call__(self, url, path):
        self.urls.append(url)
        with open(path, "wb") as f:
            f.write(self.files[url.rsplit("/", 1)[1]])


@needs_fashion_mnist
def test_known_hashes_are_those_of_the_published_fashion_mnist_files():
    for name, expected in download.KNOWN_SHA256["fashion_mnist"].items():
        data = published_bytes(name)
        assert hashlib.md5(data).hexdigest() == PUBLISHED_MD5[name], name
        assert hashlib.sha256(data).hexdigest() == expected, name
        # Debian's copy decompresses to the same IDX bytes.
        assert gzip.decompress(data) == gzip.decompress(open(os.path.join(FASHION, name),
                                                             "rb").read())


@needs_fashion_mnist
def test_verified_download_into_the_private_cache(private_cache):
    fetch = FakeFetch({n: published_bytes(n) for n in PUBLISHED_MD5})
    dest = download.download_idx("fashion_mnist", fetch=fetch)
    assert dest == str(private_cache / "downloads" / "fashion_mnist")
    assert fetch.urls == [download.KERAS_DATASETS_URL + n
                          for n in download.KNOWN_SHA256["fashion_mnist"]]
    assert sorted(os.listdir(dest)) == sorted(PUBLISHED_MD5)
    labels = read_idx(find_idx_files(dest, "test")[1])
    assert labels.shape == (10000,)
    # Cached and still valid: nothing is fetched again.
    download.download_idx("fashion_mnist", fetch=fetch)
    assert len(fetch.urls) == 4


@needs_fashion_mnist
def test_download_with_another_hash_is_deleted_and_refused(tmp_path):
    name = "t10k-labels-idx1-ubyte.gz"
    debian = open(os.path.join(FASHION, name), "rb").read()   # same data, other header
    files = {n: published_bytes(n) for n in PUBLISHED_MD5}
    files[name] = debian
    dest = tmp_path / "dl"
    with pytest.raises(DataError) as info:
        download.download_idx("fashion_mnist", dest, fetch=FakeFetch(files))
    message = str(info.value)
    assert name in message
    assert download.KNOWN_SHA256["fashion_mnist"][name] in message
    assert hashlib.sha256(debian).hexdigest() in message
    assert name not in os.listdir(dest)
    assert not [n for n in os.listdir(dest) if ".tmp-" in n]


def test_cached_file_with_another_hash_is_fetched_again(tmp_path, monkeypatch):
    good = b"the real file"
    monkeypatch.setitem(download.KNOWN_SHA256, "fashion_mnist",
                        {"x.gz": hashlib.sha256(good).hexdigest()})
    dest = tmp_path / "dl"
    dest.mkdir()
    (dest / "x.gz").write_bytes(b"planted by someone else")
    fetch = FakeFetch({"x.gz": good})
    download.download_idx("fashion_mnist", dest, fetch=fetch)
    assert (dest / "x.gz").read_bytes() == good and len(fetch.urls) == 1


def test_mnist_archive_is_verified_then_converted(tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    arrays = {"x_train": rng.integers(0, 256, (5, 28, 28), dtype=np.uint8),
              "y_train": rng.integers(0, 10, 5).astype(np.uint8),
              "x_test": rng.integers(0, 256, (3, 28, 28), dtype=np.uint8),
              "y_test": rng.integers(0, 10, 3).astype(np.uint8)}
    np.savez(tmp_path / "fake.npz", **arrays)
    fake = (tmp_path / "fake.npz").read_bytes()
    # Refused against the hash Keras pins for the real mnist.npz ...
    with pytest.raises(DataError, match=download.KNOWN_SHA256["mnist"]["mnist.npz"]):
        download.download_idx("mnist", tmp_path / "a", fetch=FakeFetch({"mnist.npz": fake}))
    # ... and converted once its hash is the expected one.
    monkeypatch.setitem(download.KNOWN_SHA256, "mnist",
                        {"mnist.npz": hashlib.sha256(fake).hexdigest()})
    dest = download.download_idx("mnist", tmp_path / "b", fetch=FakeFetch({"mnist.npz": fake}))
    for split, prefix in (("train", "train"), ("test", "test")):
        images, labels = find_idx_files(dest, split)
        np.testing.assert_array_equal(read_idx(images), arrays[f"x_{prefix}"])
        np.testing.assert_array_equal(read_idx(labels), arrays[f"y_{prefix}"])


def test_default_fetch_uses_keras_get_file_with_the_keras_urls(tmp_path, monkeypatch):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    good = b"bytes from the network"
    monkeypatch.setitem(download.KNOWN_SHA256, "fashion_mnist",
                        {"t10k-labels-idx1-ubyte.gz": hashlib.sha256(good).hexdigest()})
    calls = []

    def fake_get_file(fname, origin, cache_dir, cache_subdir):
        calls.append(origin)
        path = os.path.join(cache_subdir, fname)
        with open(path, "wb") as f:
            f.write(good)
        return path

    monkeypatch.setattr(tf.keras.utils, "get_file", fake_get_file)
    dest = download.download_idx("fashion_mnist", tmp_path / "dl")
    assert calls == [download.KERAS_DATASETS_URL + "t10k-labels-idx1-ubyte.gz"]
    assert os.listdir(dest) == ["t10k-labels-idx1-ubyte.gz"]


TAMPER_TESTS = (test_altered_cache_file_of_the_same_size_is_not_trusted,
                test_changed_source_with_the_same_size_and_time_is_not_served_from_cache,
                test_download_with_another_hash_is_deleted_and_refused,
                test_cached_file_with_another_hash_is_fetched_again,
                test_mnist_archive_is_verified_then_converted)
TAMPER_CASES = len(TAMPER_TESTS)
"""Altered, replaced or planted cache and download files tried (the README's count)."""
