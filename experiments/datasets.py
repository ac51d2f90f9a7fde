"""Where prepared datasets live (``DATA_DIR/<name>``) and where the built-in
ones come from; TensorFlow-free, so that listing experiments stays quick.

Datasets are registered with :func:`experiments.registry.register_dataset`;
:func:`idx_splits` serves the IDX-file ones (MNIST, Fashion-MNIST), and
:mod:`experiments.prepare` writes them.
"""

import logging
import os

from estimator_keras import io, manifest, sources

logger = logging.getLogger(__name__)


def _idx_dir(name, source_dir, download_dir):
    """Where the IDX files are: --source-dir, Debian's package, or a download."""
    if source_dir:
        return source_dir
    if name == "fashion_mnist" and os.path.isdir(sources.DEBIAN_FASHION_MNIST_DIR):
        logger.info("reading Fashion-MNIST from %s (Debian's dataset-fashion-mnist)",
                    sources.DEBIAN_FASHION_MNIST_DIR)
        return sources.DEBIAN_FASHION_MNIST_DIR
    logger.info("no --source-dir given: downloading %s to %s", name, download_dir)
    sources.download_idx(name, download_dir)
    return download_dir


def idx_splits(name):
    """The ``splits`` function of an IDX dataset (``mnist``, ``fashion_mnist``)."""

    def splits(source_dir=None, download_dir=None):
        directory = _idx_dir(name, source_dir, download_dir)
        return {split: sources.IdxSource(*sources.find_idx_files(directory, split))
                for split in ("train", "test")}

    return splits


class Head:
    """The first ``n`` examples of a source (``prepare --max-examples``), for
    quick experiments and tests on a slice of a real dataset."""

    def __init__(self, source, n):
        self.source, self.n = source, min(int(n), len(source))
        self.features = source.features

    def __len__(self):
        return self.n

    def read(self, indices):
        return self.source.read(indices)


def dataset_dir(data_dir, name):
    return io.join(str(data_dir), name)


def is_prepared(data_dir, name):
    return io.exists(manifest.manifest_path(dataset_dir(data_dir, name)))
