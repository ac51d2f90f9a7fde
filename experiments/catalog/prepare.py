"""``prepare``: writes a dataset to ``DATA_DIR/<name>`` as sharded TFRecords
with a manifest: a registered dataset (:func:`prepare`), or the user's own
files (:func:`import_files`: a folder of class folders, image / mask folders,
or other tools' TFRecord files). A dataset that already has a manifest is
complete and is reused as is unless ``force``.
"""

import dataclasses
import logging
import os
import re
import tempfile

from estimator_keras import io, records
from estimator_keras.errors import DataError, UsageError
from estimator_keras.manifest import load_manifest
from estimator_keras.sources import idx, layouts, tfrecords
from experiments.catalog import registry
from experiments.catalog.datasets import Head, dataset_dir, is_prepared

logger = logging.getLogger(__name__)

# Default shard counts: one per MIN_SHARD_EXAMPLES examples, up to these
# (enough files for parallel reads and a few workers); smaller data gains
# nothing from more files than that.
DEFAULT_SHARDS = {"train": 8, "test": 2}
MIN_SHARD_EXAMPLES = 500
IMPORTERS = ("images", "segmentation", "tfrecords")
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_SKIPPED_RECORDED = 50


def _num_shards(splits, shards):
    if shards:
        if int(shards) < 1:
            raise UsageError(f"--shards must be a positive integer; given {shards}.")
        num_shards = {"train": int(shards), "test": max(1, int(shards) // 4)}
    else:
        num_shards = {split: min(DEFAULT_SHARDS.get(split, 1), len(source) // MIN_SHARD_EXAMPLES)
                      for split, source in splits.items()}
    return {split: max(1, min(num_shards.get(split, 1), len(source)))
            for split, source in splits.items()}


def prepare(name, data_dir, *, source_dir=None, shards=None, num_workers=1,
            compression=None, force=False, progress=True, max_examples=None, writer=None):
    """Writes dataset ``name`` to ``DATA_DIR/name`` unless already complete.

    ``max_examples`` keeps only the first N examples of each split.
    ``writer`` replaces :func:`estimator_keras.records.write_dataset` (same
    arguments and result), e.g. with a Beam pipeline.

    Returns the dataset directory.
    """
    entry = registry.dataset(name)
    out = dataset_dir(data_dir, name)
    if not force and is_prepared(data_dir, name):
        logger.info("dataset %s is already prepared in %s", name, out)
        return out
    if source_dir and not os.path.isdir(source_dir):
        raise DataError(f"--source-dir {source_dir} is not a directory.")
    # Downloads go to this user's private cache, never a shared folder.
    download_dir = idx.user_cache_dir("downloads", name)
    # A dataset's splits may be dicts of arrays: counted as examples, not keys.
    splits = {split: records.as_source(data) for split, data in
              entry.splits(source_dir=source_dir, download_dir=download_dir).items()}
    if max_examples:
        if int(max_examples) < 1:
            raise UsageError(f"--max-examples must be a positive integer; given {max_examples}.")
        splits = {split: Head(source, max_examples) for split, source in splits.items()}
    write = writer or records.write_dataset
    write(splits, out, num_shards=_num_shards(splits, shards), compression=compression,
          num_workers=num_workers, progress=progress, name=name, labels=entry.labels,
          created={"source": source_dir or "default", "max_examples": max_examples})
    return out


@dataclasses.dataclass
class Imported:
    """What :func:`import_files` did.

    Attributes:
      directory: the dataset directory.
      manifest: its Manifest.
      found: the importer's :class:`~estimator_keras.sources.scan.Imported`
        (sources, skipped inputs, notes), or None when an already prepared
        dataset was reused.
    """

    directory: str
    manifest: object
    found: object = None


def check_name(name):
    """``--name`` as a folder name under the data dir; UsageError otherwise."""
    if not name or not _NAME_RE.match(name):
        raise UsageError(f"--name {name!r} must be a folder name: letters, digits, '_', "
                         f"'.' and '-', not starting with '.' or '-'.")
    if name in registry.dataset_names():
        raise UsageError(f"--name {name!r} is a registered dataset; choose another name "
                         f"for your own data (registered: "
                         f"{', '.join(registry.dataset_names())}).")
    return name


def import_files(kind, name, data_dir, *, shards=None, num_workers=1, compression=None,
                 force=False, progress=True, writer=None, mapper=None, **options):
    """Imports the user's files as dataset ``name`` in ``DATA_DIR/name``.

    Args:
      kind: "images" (``options``: source_dir, image_size, channels,
        test_fraction, strict), "segmentation" (the same) or "tfrecords"
        (pattern, test_pattern, features, label, image_size, channels,
        test_fraction, num_classes, class_names, strict); see
        :mod:`estimator_keras.sources.layouts` and
        :mod:`estimator_keras.sources.tfrecords`.
      shards, num_workers, compression, force, progress, writer: as for
        :func:`prepare`.
      mapper: checks the files instead of worker processes (see
        :func:`estimator_keras.sources.scan.check_images`).
    """
    if kind not in IMPORTERS:
        raise UsageError(f"unknown importer {kind!r}; expected one of {', '.join(IMPORTERS)}.")
    out = dataset_dir(data_dir, check_name(name))
    if not force and is_prepared(data_dir, name):
        logger.info("dataset %s is already prepared in %s", name, out)
        return Imported(out, load_manifest(out))
    cache = tempfile.mkdtemp(prefix="estimator-keras-import-")
    try:
        if kind == "tfrecords":
            found = tfrecords.tfrecord_splits(
                options.pop("pattern"), test_pattern=options.pop("test_pattern", None),
                num_workers=num_workers, progress=progress, cache_dir=cache, mapper=mapper,
                **options)
        else:
            source_dir = options.pop("source_dir")
            splits_of = (layouts.image_folder_splits if kind == "images"
                         else layouts.segmentation_folder_splits)
            found = splits_of(source_dir, num_workers=num_workers, progress=progress,
                              mapper=mapper, **options)
        (writer or records.write_dataset)(
            found.splits, out, num_shards=_num_shards(found.splits, shards),
            compression=compression, num_workers=num_workers, progress=progress, name=name,
            created={"source": found.origin, "importer": kind,
                     "skipped": len(found.skipped),
                     "skipped_first": [str(s) for s in found.skipped[:_SKIPPED_RECORDED]]})
    finally:
        io.rmtree(cache)
    return Imported(out, load_manifest(out), found)
