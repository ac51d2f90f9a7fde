"""Downloading MNIST and Fashion-MNIST as IDX files into a local folder.

:func:`download_idx` fetches what Keras' own ``keras.datasets`` loaders fetch
and leaves the four IDX ``.gz`` files in a folder that doubles as the download
cache: files already there are reused, so only the first call needs the
internet.
"""

import os

import numpy as np
import tensorflow as tf

from estimator_keras import io
from estimator_keras.errors import DataError, UsageError
from estimator_keras.sources.idx import DEBIAN_FASHION_MNIST_DIR, write_idx

# The URLs keras.datasets.fashion_mnist / keras.datasets.mnist (Keras 2.15)
# download from, with the sha256 Keras pins for mnist.npz.
_KERAS_DATASETS_URL = "https://storage.googleapis.com/tensorflow/tf-keras-datasets/"
_IDX_GZ_FILES = ("train-labels-idx1-ubyte.gz", "train-images-idx3-ubyte.gz",
                 "t10k-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz")
_MNIST_NPZ = "mnist.npz"
_MNIST_NPZ_SHA256 = "731c5ac602752760c8e48fbffcf8c3b850d9dc2a2aedcf2cc48468fc17b673d1"


def download_idx(dataset, dest_dir):
    """Downloads ``"mnist"`` or ``"fashion_mnist"`` as four IDX ``.gz`` files.

    Uses ``tf.keras.utils.get_file`` with the URLs Keras' own
    ``keras.datasets`` loaders use. Fashion-MNIST is published as the four IDX
    files; MNIST only as ``mnist.npz`` (checked against Keras' sha256), which is
    rewritten as the four IDX files. Files already in ``dest_dir`` are reused.
    Needs the internet.

    Returns:
      ``dest_dir``, ready for :func:`~estimator_keras.sources.idx.find_idx_files`.

    Raises:
      UsageError: for an unknown dataset.
      DataError: when the download fails (offline, blocked, bad hash).
    """
    if dataset not in ("mnist", "fashion_mnist"):
        raise UsageError(f"download_idx: dataset must be 'mnist' or 'fashion_mnist'; "
                         f"got {dataset!r}.")
    dest_dir = os.path.abspath(str(dest_dir))
    io.makedirs(dest_dir)
    # Looked up at call time so that tests can patch tf.keras.utils.get_file.
    get_file = tf.keras.utils.get_file
    names = _IDX_GZ_FILES if dataset == "fashion_mnist" else (_MNIST_NPZ,)
    current = names[0]
    try:
        paths = []
        for current in names:
            # An absolute cache_subdir makes get_file save exactly in dest_dir.
            kwargs = {"file_hash": _MNIST_NPZ_SHA256} if current == _MNIST_NPZ else {}
            paths.append(get_file(current, origin=_KERAS_DATASETS_URL + current,
                                  cache_dir=dest_dir, cache_subdir=dest_dir, **kwargs))
    # get_file raises a bare Exception on URL errors, so nothing narrower works.
    except Exception as e:  # pylint: disable=broad-except
        raise DataError(
            f"downloading {dataset} failed while fetching "
            f"{_KERAS_DATASETS_URL + current} into {dest_dir} ({type(e).__name__}: "
            f"{e}). Without internet access, point --source-dir at a folder that "
            f"already holds the IDX files; for Fashion-MNIST, `apt-get install "
            f"dataset-fashion-mnist` installs them in {DEBIAN_FASHION_MNIST_DIR}.") from e
    if dataset == "mnist":
        try:
            with np.load(paths[0], allow_pickle=False) as f:
                splits = {"train": (f["x_train"], f["y_train"]),
                          "t10k": (f["x_test"], f["y_test"])}
        except (OSError, KeyError, ValueError) as e:
            raise DataError(f"the downloaded {paths[0]} is not the expected MNIST "
                            f"archive ({e}); delete it and download again.") from e
        for prefix, (images, labels) in splits.items():
            write_idx(io.join(dest_dir, f"{prefix}-images-idx3-ubyte.gz"),
                      images.astype(np.uint8))
            write_idx(io.join(dest_dir, f"{prefix}-labels-idx1-ubyte.gz"),
                      labels.astype(np.uint8))
    return dest_dir
