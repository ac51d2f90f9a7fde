"""Named datasets that `python -m experiments prepare` writes.

Each entry turns a source (IDX files, a generator) into a dataset directory
``DATA_DIR/<name>`` of sharded TFRecords with a manifest. A dataset that
already has a manifest is complete and is reused as is.
"""

import logging
import os
import posixpath

from estimator_keras import records, sources
from estimator_keras.errors import DataError, UsageError

logger = logging.getLogger(__name__)

DEFAULT_SHARDS = {"train": 8, "test": 2}


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


def _idx_splits(name, source_dir, download_dir):
    directory = _idx_dir(name, source_dir, download_dir)
    return {split: sources.IdxSource(*sources.find_idx_files(directory, split))
            for split in ("train", "test")}


def _shapes_splits(source_dir, download_dir, num_train=8000, num_test=1000):  # pylint: disable=unused-argument
    # Different seeds keep test images out of the training set.
    return {"train": sources.ShapesSource(num_train, image_size=64, seed=0),
            "test": sources.ShapesSource(num_test, image_size=64, seed=1)}


DATASETS = {
    "fashion_mnist": ("Fashion-MNIST, 60k/10k 28x28 grey images, 10 classes (IDX files)",
                      lambda src, dl: _idx_splits("fashion_mnist", src, dl)),
    "mnist": ("MNIST, 60k/10k 28x28 grey digits (IDX files from --source-dir or downloaded)",
              lambda src, dl: _idx_splits("mnist", src, dl)),
    "shapes": ("generated 64x64 RGB shapes with per-pixel class masks, 8k/1k",
               _shapes_splits),
}


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
    return posixpath.join(str(data_dir), name)


def is_prepared(data_dir, name):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return tf.io.gfile.exists(records.manifest_path(dataset_dir(data_dir, name)))


def prepare(name, data_dir, *, source_dir=None, shards=None, num_workers=1,
            compression=None, force=False, progress=True, max_examples=None):
    """Writes dataset ``name`` to ``DATA_DIR/name`` unless already complete.

    ``max_examples`` keeps only the first N examples of each split.

    Returns the dataset directory.
    """
    if name not in DATASETS:
        raise UsageError(f"unknown dataset {name!r}; available: "
                         f"{', '.join(sorted(DATASETS))}.")
    out = dataset_dir(data_dir, name)
    if not force and is_prepared(data_dir, name):
        logger.info("dataset %s is already prepared in %s", name, out)
        return out
    if source_dir and not os.path.isdir(source_dir):
        raise DataError(f"--source-dir {source_dir} is not a directory.")
    download_dir = os.path.join(str(data_dir), "_downloads", name)
    splits = DATASETS[name][1](source_dir, download_dir)
    if max_examples:
        if int(max_examples) < 1:
            raise UsageError(f"--max-examples must be a positive integer; given {max_examples}.")
        splits = {split: Head(source, max_examples) for split, source in splits.items()}
    num_shards = dict(DEFAULT_SHARDS)
    if shards:
        if int(shards) < 1:
            raise UsageError(f"--shards must be a positive integer; given {shards}.")
        num_shards["train"] = int(shards)
        num_shards["test"] = max(1, int(shards) // 4)
    num_shards = {split: min(count, max(1, len(splits[split])))
                  for split, count in num_shards.items()}
    records.write_dataset(splits, out, num_shards=num_shards, compression=compression,
                          num_workers=num_workers, progress=progress, name=name,
                          created={"source": source_dir or "default",
                                   "max_examples": max_examples})
    return out
