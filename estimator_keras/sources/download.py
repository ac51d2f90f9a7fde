"""Downloading MNIST and Fashion-MNIST as IDX files, verified by SHA-256.

:func:`download_idx` fetches what Keras' own ``keras.datasets`` loaders fetch
into a folder that doubles as the download cache (by default this user's
private :func:`~estimator_keras.sources.idx.user_cache_dir` ``("downloads",
DATASET)``). Every file, fetched or found there, must have its published
SHA-256 (:data:`KNOWN_SHA256`); one that does not is deleted and refused. Only
the first call needs the internet.
"""

import logging
import os
import shutil
import urllib.request

import numpy as np

from estimator_keras import io, tf_optional
from estimator_keras.errors import DataError, UsageError
from estimator_keras.sources.idx import (DEBIAN_FASHION_MNIST_DIR, sha256_of, user_cache_dir,
                                         write_idx)

logger = logging.getLogger(__name__)

# The URLs keras.datasets.fashion_mnist / keras.datasets.mnist download from.
KERAS_DATASETS_URL = "https://storage.googleapis.com/tensorflow/tf-keras-datasets/"

KNOWN_SHA256 = {
    # The four files Zalando publishes (their MD5s are in zalandoresearch/
    # fashion-mnist's README; these SHA-256s are those of the same bytes).
    "fashion_mnist": {
        "train-labels-idx1-ubyte.gz":
            "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
        "train-images-idx3-ubyte.gz":
            "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
        "t10k-labels-idx1-ubyte.gz":
            "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
        "t10k-images-idx3-ubyte.gz":
            "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
    },
    # The hash keras.datasets.mnist.load_data pins for mnist.npz.
    "mnist": {
        "mnist.npz": "731c5ac602752760c8e48fbffcf8c3b850d9dc2a2aedcf2cc48468fc17b673d1",
    },
}
"""dataset -> file name -> the SHA-256 every download of it must have."""


def keras_fetch(url, path):
    """Downloads ``url`` to ``path`` with ``tf.keras.utils.get_file`` (its
    proxy settings and progress bar), or with urllib where TensorFlow is not
    installed (the bytes are checked by their SHA-256 either way); the
    default fetcher of :func:`download_idx`."""
    tf = tf_optional.tensorflow()
    if tf is None:
        return url_fetch(url, path)
    folder = io.parent(path)
    # Looked up at call time so that tests can patch tf.keras.utils.get_file.
    # An absolute cache_subdir makes get_file save exactly in that folder.
    return tf.keras.utils.get_file(io.basename(path), origin=url, cache_dir=folder,
                                   cache_subdir=folder)


def url_fetch(url, path):
    """Downloads ``url`` to ``path`` with urllib (its proxy variables apply)."""
    with urllib.request.urlopen(url, timeout=60) as response, io.atomic_file(path, "wb") as out:
        shutil.copyfileobj(response, out, 1 << 20)
    return path


def verify_sha256(path, expected):
    """Deletes ``path`` and raises DataError (naming the file, the expected
    and the actual hash) unless its SHA-256 is ``expected``."""
    actual = sha256_of(path) if io.exists(path) else "(no file was written)"
    if actual != expected:
        io.remove(path)
        raise DataError(
            f"{path} does not have the published SHA-256 (expected {expected}, found "
            f"{actual}); the file was deleted. A download that was cut short, altered on "
            f"the way, or replaced at the source gives this: download again, or point "
            f"--source-dir at a folder that holds the IDX files.")


def download_idx(dataset, dest_dir=None, fetch=None):
    """Downloads ``"mnist"`` or ``"fashion_mnist"`` as four IDX ``.gz`` files.

    Uses the URLs Keras' own ``keras.datasets`` loaders use. Fashion-MNIST is
    published as the four IDX files; MNIST only as ``mnist.npz``, which is
    rewritten as the four IDX files. Each file is fetched to a temporary name,
    checked against :data:`KNOWN_SHA256` and only then renamed into place;
    files already in ``dest_dir`` are checked the same way and reused (a
    mismatching one is deleted and fetched again).

    Args:
      dataset: "mnist" or "fashion_mnist".
      dest_dir: the download folder; default this user's private cache,
        ``user_cache_dir("downloads", dataset)``.
      fetch: ``fetch(url, path)`` writes ``url``'s bytes to ``path``; default
        :func:`keras_fetch` (needs the internet).

    Returns:
      ``dest_dir``, ready for :func:`~estimator_keras.sources.idx.find_idx_files`.

    Raises:
      UsageError: for an unknown dataset.
      DataError: when the download fails (offline, blocked) or a file's hash
        differs from the published one.
    """
    if dataset not in KNOWN_SHA256:
        raise UsageError(f"download_idx: dataset must be 'mnist' or 'fashion_mnist'; "
                         f"got {dataset!r}.")
    dest_dir = os.path.abspath(str(dest_dir)) if dest_dir else user_cache_dir(
        "downloads", dataset)
    io.makedirs(dest_dir)
    fetch = fetch or keras_fetch
    paths = [_fetch_verified(dataset, name, expected, dest_dir, fetch)
             for name, expected in KNOWN_SHA256[dataset].items()]
    if dataset == "mnist":
        _npz_to_idx(paths[0], dest_dir)
    return dest_dir


def _fetch_verified(dataset, name, expected, dest_dir, fetch):
    path = io.join(dest_dir, name)
    if io.exists(path):
        if sha256_of(path) == expected:
            return path
        logger.warning("%s in the download cache does not have the published SHA-256; "
                       "deleting it and downloading it again", path)
        io.remove(path)
    url = KERAS_DATASETS_URL + name
    tmp = io.temporary_name(path)
    try:
        fetch(url, tmp)
    # get_file raises a bare Exception on URL errors, so nothing narrower works.
    except Exception as e:  # pylint: disable=broad-except
        io.remove(tmp)
        raise DataError(
            f"downloading {dataset} failed while fetching {url} into {dest_dir} "
            f"({type(e).__name__}: {e}). Without internet access, point --source-dir at a "
            f"folder that already holds the IDX files; for Fashion-MNIST, `apt-get install "
            f"dataset-fashion-mnist` installs them in {DEBIAN_FASHION_MNIST_DIR}.") from e
    try:
        verify_sha256(tmp, expected)
    except DataError as e:
        raise DataError(str(e).replace(tmp, f"the download of {url} ({path})")) from None
    io.rename(tmp, path, overwrite=True)
    return path


def _npz_to_idx(npz_path, dest_dir):
    try:
        with np.load(npz_path, allow_pickle=False) as f:
            splits = {"train": (f["x_train"], f["y_train"]),
                      "t10k": (f["x_test"], f["y_test"])}
    except (OSError, KeyError, ValueError) as e:
        raise DataError(f"the downloaded {npz_path} is not the expected MNIST "
                        f"archive ({e}); delete it and download again.") from e
    for prefix, (images, labels) in splits.items():
        write_idx(io.join(dest_dir, f"{prefix}-images-idx3-ubyte.gz"), images.astype(np.uint8))
        write_idx(io.join(dest_dir, f"{prefix}-labels-idx1-ubyte.gz"), labels.astype(np.uint8))
