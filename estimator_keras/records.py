"""Sharded TFRecord datasets: writing them, and finding what to read.

:func:`write_dataset` shuffles a source's examples, encodes each as a
``tf.train.Example`` (:func:`encode_example`) and writes the shards, then the
manifest (see :mod:`estimator_keras.manifest` for the layout on disk).
:func:`resolve` turns a dataset directory or a glob of TFRecord files into the
:class:`RecordFiles` an input pipeline reads (:func:`read_schema` just their
schema); files without a manifest get their schema from :func:`infer_schema`.

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
import logging
import math
import multiprocessing
import re
import sys
import time

import numpy as np
import tensorflow as tf

from estimator_keras import io
from estimator_keras import schema as schema_lib
from estimator_keras.errors import CorruptRecordError, DataError, SchemaError, UsageError
from estimator_keras.manifest import (
    INCOMPLETE_DIR, MANIFEST_NAME, SHARD_RE, Manifest, Shard, Split, check_compression,
    compression_of, load_manifest, manifest_path, shard_files_in, shard_name, write_manifest)
from estimator_keras.sources.base import ArraySource

logger = logging.getLogger(__name__)

_CHUNK = 1024


def short_tf_error(error):
    """TensorFlow's error message without its op and function-node clutter."""
    text = getattr(error, "message", str(error))
    text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", text)
    return text.split(" [Op:")[0].strip()


def encode_example(schema, values):
    """Serializes one example (a dict name -> numpy value) to bytes.

    Raises SchemaError naming the feature when a value does not fit its spec.
    """
    feature = {}
    for name, spec in schema.items():
        if name not in values:
            raise SchemaError(f"example is missing feature {name!r}; schema "
                              f"expects {sorted(schema)}, got {sorted(values)}.")
        value = values[name]
        if spec.encoding in ("bytes", "png", "jpeg"):
            if isinstance(value, np.ndarray):
                value = value.item()
            if isinstance(value, str):
                value = value.encode("utf-8")
            feature[name] = tf.train.Feature(
                bytes_list=tf.train.BytesList(value=[bytes(value)]))
            continue
        arr = np.asarray(value)
        if arr.shape != spec.shape:
            raise SchemaError(
                f"feature {name!r}: expected shape {spec.shape}, found "
                f"{arr.shape}.")
        if spec.encoding == "raw":
            arr = np.ascontiguousarray(arr, dtype=spec.dtype)
            feature[name] = tf.train.Feature(
                bytes_list=tf.train.BytesList(value=[arr.tobytes()]))
        elif spec.encoding == "int64":
            feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(
                value=arr.astype(np.int64).ravel().tolist()))
        else:
            feature[name] = tf.train.Feature(float_list=tf.train.FloatList(
                value=arr.astype(np.float32).ravel().tolist()))
    return tf.train.Example(
        features=tf.train.Features(feature=feature)).SerializeToString(deterministic=True)


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
    options = tf.io.TFRecordOptions(compression_type=compression or "")
    with tf.io.TFRecordWriter(tmp_path, options) as writer:
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


def _as_source(data):
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
                  shuffle=True, num_workers=1, progress=True, name="", created=None):
    """Writes several splits to ``output_dir`` and then its manifest.

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

    Returns:
      The :class:`~estimator_keras.manifest.Manifest` written.

    Example::

        write_dataset({"train": train_arrays, "test": test_arrays}, "/data/fm",
                      num_shards={"train": 8, "test": 2}, compression="GZIP")
    """
    output_dir = str(output_dir).rstrip("/")
    compression = check_compression(compression)
    if not splits:
        raise UsageError("write_dataset needs at least one split.")
    sources = {split: _as_source(data) for split, data in splits.items()}
    schema = None
    for split, source in sources.items():
        if not re.match(r"^[A-Za-z0-9_.]+$", split):
            raise UsageError(f"split name {split!r} must be letters, digits, '_' or '.'.")
        if schema is None:
            schema = dict(source.features)
        elif dict(source.features) != schema:
            raise SchemaError(f"split {split!r} has schema "
                              f"{schema_lib.schema_to_json(source.features)}, other "
                              f"splits {schema_lib.schema_to_json(schema)}.")
    try:
        io.makedirs(output_dir)
    except Exception as e:  # pylint: disable=broad-except
        raise DataError(f"cannot create dataset directory {output_dir}: {e}") from e
    # An old manifest would vouch for shards we are about to replace.
    io.remove(manifest_path(output_dir))
    staging = io.join(output_dir, INCOMPLETE_DIR)
    io.rmtree(staging)
    io.makedirs(staging)
    # The new manifest replaces the old one whole, so every old shard goes.
    for stale in shard_files_in(output_dir):
        io.remove(io.join(output_dir, stale))

    written = {}
    for split, source in sources.items():
        n = len(source)
        shards = num_shards.get(split) if isinstance(num_shards, dict) else num_shards
        shards = int(shards or default_num_shards(n))
        if shards < 1 or (n and shards > n):
            raise UsageError(f"split {split!r}: num_shards must be between 1 and the "
                             f"number of examples ({n}); given {shards}.")
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
            ctx = multiprocessing.get_context("spawn")
            with ctx.Pool(min(num_workers, len(jobs))) as pool:
                for path, count, size in pool.imap(_write_shard_job, jobs):
                    results.append((path, count, size))
                    bar.update(count)
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

    manifest = Manifest(
        directory=output_dir, schema=schema, splits=written, compression=compression,
        name=name,
        created={"tool": "estimator-keras", "seed": seed, "shuffled": bool(shuffle),
                 "time": datetime.datetime.now(datetime.timezone.utc).isoformat(
                     timespec="seconds"),
                 **(created or {})})
    io.rmtree(staging)
    write_manifest(manifest)
    return manifest


def write_records(data, output_dir, split="train", **kwargs):
    """Writes one split and the manifest; see :func:`write_dataset`.

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
    try:
        first = next(iter(tf.data.TFRecordDataset(path, compression or "").take(1)), None)
    except tf.errors.OpError as e:
        raise CorruptRecordError(f"cannot read the first record of {path}: "
                                 f"{short_tf_error(e)}", path=path, offset=0) from e
    if first is None:
        raise DataError(f"{path} holds no records; cannot infer a schema from it.")
    try:
        example = tf.train.Example.FromString(first.numpy())
    except Exception as e:  # pylint: disable=broad-except  (protobuf's DecodeError)
        raise SchemaError(f"the first record of {path} is not a tf.train.Example "
                          f"({type(e).__name__}); cannot infer a schema.") from e
    features = example.features.feature
    if not features:
        raise SchemaError(f"the first record of {path} has no features; cannot "
                          f"infer a schema.")
    schema = {}
    if _SEED_KEYS <= set(features):
        dims = [features[k].int64_list.value for k in ("height", "width", "depth")]
        if all(len(d) == 1 for d in dims):
            shape = tuple(int(d[0]) for d in dims)
            schema["image_raw"] = schema_lib.FeatureSpec("image_raw", "uint8", shape, "raw")
            logger.info("%s has no manifest: inferred the seed question's format "
                        "(image_raw uint8 %s, label int64) from its first record",
                        path, shape)
    for name in sorted(features):
        if name in schema:
            continue
        feat = features[name]
        kind = feat.WhichOneof("kind")
        if kind == "int64_list":
            n = len(feat.int64_list.value)
            schema[name] = schema_lib.FeatureSpec(name, "int64", () if n == 1 else (n,), "int64")
        elif kind == "float_list":
            n = len(feat.float_list.value)
            schema[name] = schema_lib.FeatureSpec(name, "float32", () if n == 1 else (n,), "float")
        else:
            schema[name] = schema_lib.FeatureSpec(name, "string", (), "bytes")
    if "image_raw" not in schema or schema["image_raw"].encoding != "raw":
        logger.info("%s has no manifest: inferred its schema from the first "
                    "record:\n%s", path, schema_lib.describe(schema))
    return schema
