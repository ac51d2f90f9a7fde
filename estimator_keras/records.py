"""Sharded TFRecord datasets: writing them, and finding what to read.

:func:`write_dataset` shuffles a source's examples, encodes each as a
``tf.train.Example`` (:func:`encode_example`) and writes the shards, then the
manifest (see :mod:`estimator_keras.manifest` for the layout on disk).
:func:`resolve` turns a dataset directory or a glob of TFRecord files into the
:class:`RecordFiles` an input pipeline reads (:func:`read_schema` just their
schema); files without a manifest get their schema from :func:`infer_schema`.

None of it needs TensorFlow: examples are encoded by
:mod:`~estimator_keras.example_codec` and files written and read by
:mod:`~estimator_keras.record_files`, to the bytes TensorFlow writes.

Example::

    import numpy as np
    from estimator_keras.records import write_records
    from estimator_keras.manifest import load_manifest

    write_records({"image": images, "label": labels}, "/tmp/ds", split="train",
                  num_shards=4, compression="GZIP")
    load_manifest("/tmp/ds").splits["train"].num_examples
"""

import dataclasses
import datetime
from concurrent import futures
import logging
import math
import multiprocessing
import sys
import time

import numpy as np

from estimator_keras import example_codec, io
from estimator_keras import schema as schema_lib
from estimator_keras.errors import CorruptRecordError, DataError, SchemaError, UsageError
from estimator_keras.manifest import (
    INCOMPLETE_DIR, MANIFEST_NAME, SHARD_RE, SPLIT_RE, InvalidField, Manifest, Shard, Split,
    check_compression, check_labels, compression_of, load_manifest, manifest_path,
    shard_files_in, shard_name, write_manifest)
from estimator_keras.record_files import framing_tensorflow, read_records, record_writer
from estimator_keras.sources.base import ArraySource

logger = logging.getLogger(__name__)

_CHUNK = 1024


def encode_example(schema, values):
    """Serializes one example (a dict name -> numpy value) to bytes: a
    ``tf.train.Example`` with its map keys sorted, byte for byte what
    TensorFlow serializes.

    Raises SchemaError naming the feature when a value is missing or does
    not fit its spec.
    """
    return example_codec.encode_example(schema, values)


# --------------------------------------------------------------------------
# Writing


class _Progress:
    """Progress lines on stderr at most every ``interval`` seconds."""

    def __init__(self, label, total, enabled, interval=2.0):
        self.label, self.total, self.enabled = label, total, enabled
        self.interval = interval
        self.done = 0
        self.start = self.last = time.monotonic()

    def update(self, n):
        self.done += n
        now = time.monotonic()
        if self.enabled and (now - self.last >= self.interval or self.done >= self.total):
            self.last = now
            rate = self.done / max(now - self.start, 1e-9)
            eta = (self.total - self.done) / rate if rate else float("inf")
            pct = 100.0 * self.done / max(self.total, 1)
            sys.stderr.write(f"  {self.label}: {self.done}/{self.total} examples "
                             f"({pct:.0f}%), {rate:,.0f} ex/s, ETA {eta:.0f}s\n")
            sys.stderr.flush()


def _write_shard(source, schema, indices, tmp_path, final_path, compression):
    """Writes the examples at ``indices`` to one shard, atomically.

    Runs in the parent or in a spawned worker, so it takes only picklable
    arguments.
    """
    with record_writer(tmp_path, compression) as writer:
        for start in range(0, len(indices), _CHUNK):
            batch = source.read(indices[start:start + _CHUNK])
            n = len(indices[start:start + _CHUNK])
            for i in range(n):
                writer.write(encode_example(
                    schema, {name: batch[name][i] for name in schema}))
            yield n
    io.rename(tmp_path, final_path, overwrite=True)


def _write_shard_job(args):
    source, schema, indices, tmp_path, final_path, compression = args
    total = sum(_write_shard(source, schema, indices, tmp_path, final_path, compression))
    return final_path, total, io.size(final_path)


def as_source(data):
    """``data`` as an example source: a dict of numpy arrays becomes an
    :class:`ArraySource`; a source is returned as it is (UsageError when it
    is neither)."""
    if isinstance(data, dict):
        return ArraySource(data)
    for attr in ("features", "read", "__len__"):
        if not hasattr(data, attr):
            raise UsageError(
                f"expected a dict of numpy arrays or an example source (with "
                f"`features`, `read` and `__len__`); got {type(data).__name__} "
                f"without {attr!r}.")
    return data


def default_num_shards(num_examples):
    """About 10k examples a shard: enough files for parallel reads and for
    sharding across a few workers, without thousands of tiny files."""
    return max(1, math.ceil(num_examples / 10000))


def write_dataset(splits, output_dir, *, num_shards=None, compression=None, seed=0,
                  shuffle=True, num_workers=1, progress=True, name="", created=None,
                  labels=None):
    """Writes several splits to ``output_dir`` and then its manifest.

    Splits that ``output_dir`` already holds and that are not written here
    are kept, shards and manifest entries alike; they must share the new
    splits' schema and compression. Every argument, and that agreement, is
    checked before any file is removed, so a refused call loses nothing.
    While the new splits are written the manifest lists only the kept ones:
    a crash leaves those readable and the new ones absent.

    Args:
      splits: dict split name -> a dict of numpy arrays (first axis examples)
        or an example source (see :mod:`estimator_keras.sources`). Every split
        must share one schema.
      output_dir: local path or ``gs://`` URI; created if missing.
      num_shards: an int for every split, a dict split -> int, or None for
        :func:`default_num_shards`.
      compression: None or "GZIP".
      seed: seeds the shuffle that happens before sharding, so the same
        inputs and seed always give byte-identical shards.
      shuffle: shuffle examples before sharding (recommended: readers can
        then shuffle cheaply, by file and by batch).
      num_workers: processes writing shards in parallel (1 = in this process).
      progress: print progress lines on stderr.
      name: dataset name recorded in the manifest.
      created: extra provenance recorded in the manifest.
      labels: label metadata for the manifest, ``{label_feature:
        {"num_classes": N, "class_names": [...] or None}}``; None takes the
        sources' ``labels`` attribute (every split's must agree) and, when
        they have none, keeps the labels of the splits kept.

    Returns:
      The :class:`~estimator_keras.manifest.Manifest` written.

    Raises:
      UsageError: a bad argument (split name, num_shards, compression), or
        neither google-crc32c nor TensorFlow is installed.
      SchemaError: splits (new, or kept from the existing manifest) disagree
        on the schema or the labels.
      DataError: the existing manifest cannot be read, or the directory
        cannot be created.

    Example::

        write_dataset({"train": train_arrays, "test": test_arrays}, "/data/fm",
                      num_shards={"train": 8, "test": 2}, compression="GZIP")
    """
    output_dir = str(output_dir).rstrip("/")
    plan = _WritePlan(splits, output_dir, num_shards, compression, labels, num_workers)
    framing_tensorflow()  # no CRC32C at all is refused before anything changes
    compression, schema, sources = plan.compression, plan.schema, plan.sources
    try:
        io.makedirs(output_dir)
    except Exception as e:  # pylint: disable=broad-except
        raise DataError(f"cannot create dataset directory {output_dir}: {e}") from e
    old = plan.old
    if plan.kept:
        # The kept splits stay readable while the others are rewritten.
        write_manifest(Manifest(directory=output_dir, schema=schema, splits=plan.kept,
                                compression=compression, name=old.name, created=old.created,
                                labels=old.labels))
    else:
        # An old manifest would vouch for shards we are about to replace.
        io.remove(manifest_path(output_dir))
    staging = io.join(output_dir, INCOMPLETE_DIR)
    io.rmtree(staging)
    io.makedirs(staging)
    keep = {s.file for split in plan.kept.values() for s in split.shards}
    for stale in shard_files_in(output_dir):
        if stale not in keep:
            io.remove(io.join(output_dir, stale))

    written = {}
    for split, source in sources.items():
        n, shards = len(source), plan.shards[split]
        order = (np.random.default_rng(seed).permutation(n) if shuffle
                 else np.arange(n))
        jobs = []
        for index, part in enumerate(np.array_split(order, shards)):
            fname = shard_name(split, index, shards, compression)
            jobs.append((source, schema, part, io.join(staging, fname),
                         io.join(output_dir, fname), compression))
        bar = _Progress(f"{name or 'dataset'}/{split}", n, progress)
        results = []
        if num_workers > 1 and len(jobs) > 1:
            # spawn, not fork: a forked child of a process that already runs
            # TensorFlow's thread pools can deadlock.
            # A process pool that dies raises (multiprocessing.Pool would
            # replace its workers forever: a script without a __main__ guard
            # then never finishes).
            ctx = multiprocessing.get_context("spawn")
            try:
                with futures.ProcessPoolExecutor(min(num_workers, len(jobs)),
                                                 mp_context=ctx) as pool:
                    for path, count, size in pool.map(_write_shard_job, jobs):
                        results.append((path, count, size))
                        bar.update(count)
            except futures.process.BrokenProcessPool as e:
                io.rmtree(staging)
                raise UsageError(
                    f"write_dataset: a worker process (num_workers={num_workers}) died before "
                    f"it wrote its shard of split {split!r}. Workers are started with spawn, "
                    f"which imports the calling script again: a script that calls "
                    f"write_dataset with num_workers > 1 must do so under "
                    f"`if __name__ == \"__main__\":` (or pass num_workers=1). No manifest "
                    f"was written to {output_dir}.") from e
        else:
            for job in jobs:
                count = 0
                for step in _write_shard(*job):
                    count += step
                    bar.update(step)
                results.append((job[4], count, io.size(job[4])))
        written[split] = Split([Shard(io.basename(p), c, s) for p, c, s in results])
        logger.info("wrote %d examples of split %r in %d shard(s) to %s",
                    n, split, shards, output_dir)

    order = [s for s in (old.splits if old else ()) if s in written or s in plan.kept]
    order += [s for s in written if s not in order]
    manifest = Manifest(
        directory=output_dir, schema=schema,
        splits={s: written[s] if s in written else plan.kept[s] for s in order},
        compression=compression, name=name or (old.name if old else ""),
        created={"tool": "estimator-keras", "seed": seed, "shuffled": bool(shuffle),
                 "time": datetime.datetime.now(datetime.timezone.utc).isoformat(
                     timespec="microseconds"),
                 **(created or {})},
        labels=plan.labels)
    io.rmtree(staging)
    write_manifest(manifest)
    return manifest


class _WritePlan:
    """Every check of a write_dataset call, done before anything on disk changes.

    Attributes: sources, schema, shards (split -> count), compression, labels,
    old (the existing Manifest or None) and kept (its splits not rewritten).
    """

    def __init__(self, splits, output_dir, num_shards, compression, labels, num_workers):
        self.compression = check_compression(compression)
        if not splits or not isinstance(splits, dict):
            raise UsageError(f"write_dataset needs a dict of at least one split -> data; "
                             f"given {type(splits).__name__} {splits!r:.80}.")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int):
            raise UsageError(f"num_workers must be an integer; given {num_workers!r}.")
        for split in splits:
            if not isinstance(split, str) or not SPLIT_RE.match(split):
                raise UsageError(f"split name {split!r} must be letters, digits, '_' or '.'.")
        self.sources = {split: as_source(data) for split, data in splits.items()}
        self.schema = None
        for split, source in self.sources.items():
            if self.schema is None:
                self.schema = dict(source.features)
            elif dict(source.features) != self.schema:
                raise SchemaError(f"split {split!r} has schema "
                                  f"{schema_lib.schema_to_json(source.features)}, other "
                                  f"splits {schema_lib.schema_to_json(self.schema)}.")
        self.shards = _shard_counts(num_shards, self.sources)
        self.labels = self._labels(labels)
        self.old = self._old_manifest(output_dir)
        self.kept = {}
        if self.old is not None:
            self.kept = {s: v for s, v in self.old.splits.items() if s not in self.sources}
        if self.kept:
            self._check_agreement(output_dir)

    def _labels(self, labels):
        if labels is None:
            found = {}
            for split, source in self.sources.items():
                found[split] = self._checked(getattr(source, "labels", None),
                                             f"the labels of split {split!r}'s source")
            first = next(iter(found))
            for split, value in found.items():
                if value != found[first]:
                    raise SchemaError(
                        f"the sources disagree on the labels: split {first!r} has "
                        f"{found[first]}, split {split!r} has {value}; every split must "
                        f"record the same classes.")
            return found[first]
        return self._checked(labels, "labels")

    def _checked(self, labels, what):
        try:
            return check_labels(labels, self.schema)
        except InvalidField as e:
            raise SchemaError(f"{what}: {e}") from None

    @staticmethod
    def _old_manifest(output_dir):
        if not io.exists(manifest_path(output_dir)):
            return None
        try:
            return load_manifest(output_dir)
        except DataError as e:
            raise DataError(
                f"{output_dir} already holds a dataset whose manifest cannot be read, so "
                f"its other splits cannot be kept: {e} Fix {manifest_path(output_dir)}, or "
                f"delete {output_dir} to write a new dataset there.") from e

    def _check_agreement(self, output_dir):
        old, kept = self.old, ", ".join(sorted(self.kept))
        if self.schema != old.schema:
            raise SchemaError(
                f"{output_dir} keeps split(s) {kept} with schema "
                f"{schema_lib.schema_to_json(old.schema)}; the split(s) written now have "
                f"{schema_lib.schema_to_json(self.schema)}. A dataset has one schema: write "
                f"to another directory, or rewrite every split.")
        if self.compression != old.compression:
            raise UsageError(
                f"{output_dir} keeps split(s) {kept} with compression "
                f"{old.compression or 'none'}; the split(s) written now would have "
                f"{self.compression or 'none'}. Pass compression={old.compression!r}, or "
                f"rewrite every split.")
        if self.labels is None:
            self.labels = old.labels
        elif old.labels is not None and self.labels != old.labels:
            raise SchemaError(
                f"{output_dir} keeps split(s) {kept} with labels {old.labels}; the split(s) "
                f"written now have {self.labels}. Every split must record the same classes.")


def _shard_counts(num_shards, sources):
    """split -> number of shards, each between 1 and the split's examples."""
    if isinstance(num_shards, dict):
        unknown = sorted(map(str, set(num_shards) - set(sources)))
        if unknown:
            raise UsageError(f"num_shards names split(s) {', '.join(unknown)} that are not "
                             f"written; the splits are {', '.join(sources)}.")
    counts = {}
    for split, source in sources.items():
        n = len(source)
        shards = num_shards.get(split) if isinstance(num_shards, dict) else num_shards
        if shards is None:
            shards = default_num_shards(n)
        if (isinstance(shards, (bool, np.bool_)) or not isinstance(shards, (int, np.integer))
                or shards < 1 or (n and shards > n)):
            raise UsageError(f"split {split!r}: num_shards must be between 1 and the "
                             f"number of examples ({n}); given {shards!r}.")
        counts[split] = int(shards)
    return counts


def write_records(data, output_dir, split="train", **kwargs):
    """Writes one split and the manifest; the dataset's other splits are kept
    (see :func:`write_dataset`).

    Example::

        write_records({"image": images, "label": labels}, "/tmp/ds", num_shards=4)
    """
    return write_dataset({split: data}, output_dir, **kwargs)


# --------------------------------------------------------------------------
# Resolving what to read


@dataclasses.dataclass
class RecordFiles:
    """What an input pipeline reads: files, their schema and framing.

    Attributes:
      files: full paths, sorted.
      schema: ordered dict feature name -> FeatureSpec.
      compression: None or "GZIP".
      num_examples: total examples when known (from a manifest), else None.
      manifest: the Manifest when the files come from one, else None.
    """

    files: list
    schema: dict
    compression: str
    num_examples: int = None
    manifest: Manifest = None


def is_pattern(path):
    """True when ``path`` holds glob characters, so it names files, not a folder."""
    return any(c in str(path) for c in "*?[")


def resolve(path_or_pattern, split="train", schema=None, check_sizes=True):
    """Finds the files and schema for a dataset directory or a glob.

    A directory with a manifest yields the split's shards (shards on disk
    that the manifest does not list are ignored with a warning). A glob
    yields every matching file; its schema comes from a ``dataset.json``
    beside the files, else from ``schema``, else is inferred from the first
    record (the seed question's format included).

    Raises:
      DataError: nothing matches, the dataset is incomplete, or a shard is
        missing or shorter than the manifest says.
    """
    path = str(path_or_pattern)
    if not is_pattern(path) and not io.exists(path):
        raise DataError(f"{path} does not exist: expected a dataset directory with "
                        f"{MANIFEST_NAME}, a TFRecord file, or a glob matching TFRecord files.")
    if not is_pattern(path) and io.isdir(path):
        manifest = load_manifest(path)
        files = manifest.files(split)
        listed = {s.file for s in manifest.split(split).shards}
        extra = [n for n in shard_files_in(path)
                 if SHARD_RE.match(n).group("split") == split and n not in listed]
        if extra:
            logger.warning("ignoring %d shard file(s) in %s not listed in its "
                           "manifest: %s", len(extra), path, ", ".join(extra[:5]))
        if check_sizes:
            for shard, full in zip(manifest.split(split).shards, files):
                if not io.exists(full):
                    raise DataError(f"shard {full} listed in {manifest_path(path)} is "
                                    f"missing; the dataset is damaged, rerun prepare.")
                size = io.size(full)
                if size != shard.num_bytes:
                    raise CorruptRecordError(
                        f"shard {full} is {size} bytes but its manifest says "
                        f"{shard.num_bytes}: the file is truncated or was replaced. "
                        f"Run `python -m experiments inspect {path} --verify`.",
                        path=full, offset=min(size, shard.num_bytes))
        return RecordFiles(files, schema or manifest.schema, manifest.compression,
                           manifest.split(split).num_examples, manifest)
    files = sorted(f for f in io.glob(path) if not io.isdir(f)
                   and io.basename(f) != MANIFEST_NAME)
    if not files:
        raise DataError(f"no TFRecord files match {path!r}: expected a dataset "
                        f"directory with {MANIFEST_NAME} or a glob matching "
                        f"TFRecord files.")
    compressions = {compression_of(f) for f in files}
    if len(compressions) > 1:
        raise DataError(f"{path!r} matches both .gz and plain files; give a "
                        f"pattern that matches one kind.")
    compression = compressions.pop()
    if schema is None:
        folder = io.parent(files[0])
        if io.exists(manifest_path(folder)):
            schema = load_manifest(folder).schema
        else:
            schema = infer_schema(files[0], compression)
    return RecordFiles(files, schema, compression)


def read_schema(path_or_pattern, split="train"):
    """The schema (feature name -> FeatureSpec) of a dataset directory or glob."""
    return resolve(path_or_pattern, split, check_sizes=False).schema


# --------------------------------------------------------------------------
# Schema inference (files without a manifest)

_SEED_KEYS = {"height", "width", "depth", "label", "image_raw"}


def infer_schema(path, compression=None):
    """Infers a schema from the first record of ``path``.

    Files written like the seed question's ``images_to_tfrecord`` (int64
    ``height``/``width``/``depth``/``label`` and bytes ``image_raw``) get
    ``image_raw`` as a raw uint8 image of shape (height, width, depth).
    Otherwise int64 and float lists map to int64/float features of their
    length and bytes to opaque ``bytes`` features.
    """
    found = read_records(path, compression)
    try:
        first = next(found, None)
    except CorruptRecordError as e:
        raise CorruptRecordError(f"cannot read the first record of {path}: {e.reason}",
                                 path=path, offset=0, record=0, reason=e.reason) from e
    except OSError as e:
        raise CorruptRecordError(f"cannot read the first record of {path}: {e}",
                                 path=path, offset=0, record=0) from e
    finally:
        found.close()
    if first is None:
        raise DataError(f"{path} holds no records; cannot infer a schema from it.")
    try:
        features = example_codec.decode_features(first)
    except SchemaError as e:
        raise SchemaError(f"the first record of {path} is not a tf.train.Example "
                          f"({type(e.__cause__).__name__}); cannot infer a schema.") from e
    if not features:
        raise SchemaError(f"the first record of {path} has no features; cannot "
                          f"infer a schema.")
    schema = {}
    if _SEED_KEYS <= set(features):
        dims = [features[k] for k in ("height", "width", "depth")]
        if all(isinstance(d, np.ndarray) and d.dtype == np.int64 and len(d) == 1
               for d in dims):
            shape = tuple(int(d[0]) for d in dims)
            schema["image_raw"] = schema_lib.FeatureSpec("image_raw", "uint8", shape, "raw")
            logger.info("%s has no manifest: inferred the seed question's format "
                        "(image_raw uint8 %s, label int64) from its first record",
                        path, shape)
    for name in sorted(features):
        if name in schema:
            continue
        values = features[name]
        if isinstance(values, np.ndarray) and values.dtype == np.int64:
            n = len(values)
            schema[name] = schema_lib.FeatureSpec(name, "int64", () if n == 1 else (n,), "int64")
        elif isinstance(values, np.ndarray):
            n = len(values)
            schema[name] = schema_lib.FeatureSpec(name, "float32", () if n == 1 else (n,), "float")
        else:
            schema[name] = schema_lib.FeatureSpec(name, "string", (), "bytes")
    if "image_raw" not in schema or schema["image_raw"].encoding != "raw":
        logger.info("%s has no manifest: inferred its schema from the first "
                    "record:\n%s", path, schema_lib.describe(schema))
    return schema
