"""``prepare``: writes a registered dataset to ``DATA_DIR/<name>`` as sharded
TFRecords with a manifest. A dataset that already has a manifest is complete
and is reused as is.
"""

import logging
import os

from estimator_keras import records
from estimator_keras.errors import DataError, UsageError
from experiments import registry
from experiments.datasets import Head, dataset_dir, is_prepared

logger = logging.getLogger(__name__)

DEFAULT_SHARDS = {"train": 8, "test": 2}


def prepare(name, data_dir, *, source_dir=None, shards=None, num_workers=1,
            compression=None, force=False, progress=True, max_examples=None):
    """Writes dataset ``name`` to ``DATA_DIR/name`` unless already complete.

    ``max_examples`` keeps only the first N examples of each split.

    Returns the dataset directory.
    """
    entry = registry.dataset(name)
    out = dataset_dir(data_dir, name)
    if not force and is_prepared(data_dir, name):
        logger.info("dataset %s is already prepared in %s", name, out)
        return out
    if source_dir and not os.path.isdir(source_dir):
        raise DataError(f"--source-dir {source_dir} is not a directory.")
    download_dir = os.path.join(str(data_dir), "_downloads", name)
    splits = entry.splits(source_dir=source_dir, download_dir=download_dir)
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
    num_shards = {split: min(num_shards.get(split, 1), max(1, len(source)))
                  for split, source in splits.items()}
    records.write_dataset(splits, out, num_shards=num_shards, compression=compression,
                          num_workers=num_workers, progress=progress, name=name,
                          created={"source": source_dir or "default",
                                   "max_examples": max_examples})
    return out
