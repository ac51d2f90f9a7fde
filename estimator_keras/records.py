"""Datasets on disk: sharded TFRecord files plus a JSON manifest.

A dataset directory holds ``<split>-00000-of-000NN.tfrecord[.gz]`` shards and a
``dataset.json`` manifest (schema, shards per split with their example counts
and sizes, how the dataset was made). The manifest is written last, so a
dataset is complete exactly when it has one; shards are written under
``.incomplete/`` and renamed into place only when whole, so a killed writer
never leaves a file a reader would take for a finished shard.

Example::

    import numpy as np
    from estimator_keras import write_records, load_manifest

    write_records({"image": images, "label": labels}, "/tmp/ds", split="train",
                  num_shards=4, compression="GZIP")
    load_manifest("/tmp/ds").splits["train"].num_examples
"""

import dataclasses
import datetime
import json
import logging
import math
import os
import posixpath
import re
import sys
import time

import numpy as np

from estimator_keras import schema as schema_lib
from estimator_keras.errors import CorruptRecordError, DataError, SchemaError, UsageError

logger = logging.getLogger(__name__)

MANIFEST_NAME = "dataset.json"
FORMAT = "estimator-keras/dataset/v1"
INCOMPLETE_DIR = ".incomplete"
_SHARD_RE = re.compile(r"^(?P<split>[A-Za-z0-9_.]+)-(?P<index>\d{5})-of-(?P<total>\d{5})"
                       r"\.tfrecord(?P<gz>\.gz)?$")
_CHUNK = 1024
# Each TFRecord is framed by a length, its CRC and the data's CRC.
_FRAMING_BYTES = 8 + 4 + 4


def _gfile():
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return tf.io.gfile


def _join(*parts):
    # posixpath keeps gs:// URIs intact where os.path would not on every OS.
    return posixpath.join(*parts)


def shard_name(split, index, total, compression=None):
    """The file name of shard ``index`` of ``total`` of a split."""
    suffix = ".tfrecord.gz" if compression == "GZIP" else ".tfrecord"
    return f"{split}-{index:05d}-of-{total:05d}{suffix}"


def compression_of(path):
    """'GZIP' for ``*.gz`` files, else None (TFRecord's two framings)."""
    return "GZIP" if str(path).endswith(".gz") else None


def _check_compression(compression):
    if compression in (None, "", "NONE"):
        return None
    if str(compression).upper() in ("GZIP", "GZ"):
        return "GZIP"
    raise UsageError(f"compression must be None or 'GZIP'; given {compression!r}.")


# --------------------------------------------------------------------------
# Manifest


@dataclasses.dataclass
class Shard:
    """One TFRecord file of a split.

    Attributes:
      file: file name, relative to the dataset directory.
      num_examples: number of records in the file.
      num_bytes: file size in bytes when written (a cheap truncation check).
    """

    file: str
    num_examples: int
    num_bytes: int


@dataclasses.dataclass
class Split:
    """The shards of one split ("train", "test", ...)."""

    shards: list

    @property
    def num_examples(self):
        return sum(s.num_examples for s in self.shards)


@dataclasses.dataclass
class Manifest:
    """A dataset's ``dataset.json``.

    Attributes:
      directory: where the dataset lives (not stored in the file).
      schema: ordered dict feature name -> FeatureSpec.
      splits: dict split name -> Split.
      compression: None or "GZIP", for every shard.
      name: dataset name, e.g. "fashion_mnist".
      created: free-form provenance: source, seed, time, package version.
    """

    directory: str
    schema: dict
    splits: dict
    compression: str = None
    name: str = ""
    created: dict = dataclasses.field(default_factory=dict)

    def files(self, split):
        """Full paths of a split's shards, in shard order."""
        return [_join(self.directory, s.file) for s in self.split(split).shards]

    def split(self, split):
        if split not in self.splits:
            raise DataError(
                f"dataset {self.directory} has no split {split!r}; it has "
                f"{', '.join(sorted(self.splits)) or 'none'}.")
        return self.splits[split]

    def to_json(self):
        return {
            "format": FORMAT,
            "name": self.name,
            "schema": schema_lib.schema_to_json(self.schema),
            "compression": self.compression,
            "splits": {
                name: {"num_examples": split.num_examples,
                       "shards": [dataclasses.asdict(s) for s in split.shards]}
                for name, split in self.splits.items()},
            "created": self.created,
        }


def manifest_path(directory):
    return _join(str(directory), MANIFEST_NAME)


def load_manifest(directory):
    """Reads and validates ``DIR/dataset.json``.

    Raises:
      DataError: the manifest is missing (the dataset is incomplete), is not
        JSON, or lacks keys; the message names the file and the keys.
    """
    directory = str(directory)
    gfile = _gfile()
    path = manifest_path(directory)
    if not gfile.exists(path):
        raise DataError(_missing_manifest_message(directory))
    try:
        with gfile.GFile(path, "r") as f:
            obj = json.loads(f.read())
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{path} is not valid JSON ({e}); rewrite the dataset "
                        f"with `python -m experiments prepare`.") from e
    expected = {"format", "schema", "splits"}
    if not isinstance(obj, dict) or not expected <= set(obj):
        given = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        missing = sorted(expected - set(obj)) if isinstance(obj, dict) else sorted(expected)
        raise DataError(f"{path} is not a dataset manifest: expected keys "
                        f"{sorted(expected)}, given {given}, missing {missing}.")
    if obj["format"] != FORMAT:
        raise DataError(f"{path} has format {obj['format']!r}; this version "
                        f"reads {FORMAT!r}.")
    try:
        splits = {
            name: Split([Shard(s["file"], int(s["num_examples"]), int(s["num_bytes"]))
                         for s in split["shards"]])
            for name, split in obj["splits"].items()}
    except (KeyError, TypeError, ValueError) as e:
        raise DataError(f"{path}: malformed 'splits' entry ({e!r}); each shard "
                        f"needs file, num_examples and num_bytes.") from e
    return Manifest(directory=directory,
                    schema=schema_lib.schema_from_json(obj["schema"]),
                    splits=splits, compression=obj.get("compression"),
                    name=obj.get("name", ""), created=obj.get("created", {}))


def _missing_manifest_message(directory):
    shards = _shard_files_in(directory)
    # A writer killed before its first shard was whole leaves only staging.
    if shards or _gfile().exists(_join(directory, INCOMPLETE_DIR)):
        return (f"{directory} holds {len(shards)} shard file(s) but no "
                f"{MANIFEST_NAME}: the dataset is incomplete, it was not completely "
                f"written (an interrupted prepare?). Rerun `python -m experiments "
                f"prepare` to rewrite it.")
    return (f"{directory} is not a dataset: it has no {MANIFEST_NAME}. Expected "
            f"a directory written by `python -m experiments prepare` or "
            f"`write_records`, or a glob of TFRecord files.")


def _shard_files_in(directory):
    gfile = _gfile()
    if not gfile.isdir(directory):
        return []
    return sorted(n for n in gfile.listdir(directory) if _SHARD_RE.match(n.rstrip("/")))


def _write_text_atomic(path, text):
    gfile = _gfile()
    tmp = f"{path}.tmp-{os.getpid()}"
    with gfile.GFile(tmp, "w") as f:
        f.write(text)
    gfile.rename(tmp, path, overwrite=True)


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
    arguments and imports TensorFlow itself.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    options = tf.io.TFRecordOptions(compression_type=compression or "")
    with tf.io.TFRecordWriter(tmp_path, options) as writer:
        for start in range(0, len(indices), _CHUNK):
            batch = source.read(indices[start:start + _CHUNK])
            n = len(indices[start:start + _CHUNK])
            for i in range(n):
                writer.write(schema_lib.encode_example(
                    schema, {name: batch[name][i] for name in schema}))
            yield n
    tf.io.gfile.rename(tmp_path, final_path, overwrite=True)


def _write_shard_job(args):
    source, schema, indices, tmp_path, final_path, compression = args
    total = sum(_write_shard(source, schema, indices, tmp_path, final_path, compression))
    return final_path, total, _gfile().stat(final_path).length


def _as_source(data):
    if isinstance(data, dict):
        from estimator_keras.sources import ArraySource  # pylint: disable=import-outside-toplevel
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
      The :class:`Manifest` written.

    Example::

        write_dataset({"train": train_arrays, "test": test_arrays}, "/data/fm",
                      num_shards={"train": 8, "test": 2}, compression="GZIP")
    """
    output_dir = str(output_dir).rstrip("/")
    compression = _check_compression(compression)
    if not splits:
        raise UsageError("write_dataset needs at least one split.")
    gfile = _gfile()
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
        gfile.makedirs(output_dir)
    except Exception as e:  # pylint: disable=broad-except
        raise DataError(f"cannot create dataset directory {output_dir}: {e}") from e
    # An old manifest would vouch for shards we are about to replace.
    if gfile.exists(manifest_path(output_dir)):
        gfile.remove(manifest_path(output_dir))
    staging = _join(output_dir, INCOMPLETE_DIR)
    if gfile.exists(staging):
        gfile.rmtree(staging)
    gfile.makedirs(staging)
    # The new manifest replaces the old one whole, so every old shard goes.
    for stale in _shard_files_in(output_dir):
        gfile.remove(_join(output_dir, stale))

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
            jobs.append((source, schema, part, _join(staging, fname),
                         _join(output_dir, fname), compression))
        bar = _Progress(f"{name or 'dataset'}/{split}", n, progress)
        results = []
        if num_workers > 1 and len(jobs) > 1:
            import multiprocessing  # pylint: disable=import-outside-toplevel
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
                results.append((job[4], count, gfile.stat(job[4]).length))
        written[split] = Split([Shard(posixpath.basename(p), c, s) for p, c, s in results])
        logger.info("wrote %d examples of split %r in %d shard(s) to %s",
                    n, split, shards, output_dir)

    manifest = Manifest(
        directory=output_dir, schema=schema, splits=written, compression=compression,
        name=name,
        created={"tool": "estimator-keras", "seed": seed, "shuffled": bool(shuffle),
                 "time": datetime.datetime.now(datetime.timezone.utc).isoformat(
                     timespec="seconds"),
                 **(created or {})})
    gfile.rmtree(staging)
    _write_text_atomic(manifest_path(output_dir), json.dumps(manifest.to_json(), indent=2))
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
    gfile = _gfile()
    path = str(path_or_pattern)
    if not any(c in path for c in "*?[") and gfile.isdir(path):
        manifest = load_manifest(path)
        files = manifest.files(split)
        listed = {s.file for s in manifest.split(split).shards}
        extra = [n for n in _shard_files_in(path)
                 if _SHARD_RE.match(n).group("split") == split and n not in listed]
        if extra:
            logger.warning("ignoring %d shard file(s) in %s not listed in its "
                           "manifest: %s", len(extra), path, ", ".join(extra[:5]))
        if check_sizes:
            for shard, full in zip(manifest.split(split).shards, files):
                if not gfile.exists(full):
                    raise DataError(f"shard {full} listed in {manifest_path(path)} is "
                                    f"missing; the dataset is damaged, rerun prepare.")
                size = gfile.stat(full).length
                if size != shard.num_bytes:
                    raise CorruptRecordError(
                        f"shard {full} is {size} bytes but its manifest says "
                        f"{shard.num_bytes}: the file is truncated or was replaced. "
                        f"Run `python -m experiments inspect {path} --verify`.",
                        path=full, offset=min(size, shard.num_bytes))
        return RecordFiles(files, schema or manifest.schema, manifest.compression,
                           manifest.split(split).num_examples, manifest)
    files = sorted(f for f in gfile.glob(path) if not gfile.isdir(f)
                   and posixpath.basename(f) != MANIFEST_NAME)
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
        beside = manifest_path(posixpath.dirname(files[0]))
        if gfile.exists(beside):
            manifest = load_manifest(posixpath.dirname(files[0]))
            schema = manifest.schema
        else:
            schema = infer_schema(files[0], compression)
    return RecordFiles(files, schema, compression)


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
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

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


# --------------------------------------------------------------------------
# Verification and inspection


def short_tf_error(error):
    """TensorFlow's error message without its op and function-node clutter."""
    text = getattr(error, "message", str(error))
    text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", text)
    return text.split(" [Op:")[0].strip()


@dataclasses.dataclass
class FileCheck:
    """The outcome of reading one TFRecord file through.

    Attributes:
      path: the file.
      num_records: records read before the end or the first error.
      error: None when the file is whole, else what broke.
      offset: byte offset where the broken record starts (in the
        uncompressed stream for GZIP files); None when the file is whole.
    """

    path: str
    num_records: int
    error: str = None
    offset: int = None

    @property
    def ok(self):
        return self.error is None


def check_file(path, compression=None):
    """Reads one file through, counting records; TensorFlow's reader checks
    every record's CRC as it goes, so this is also the verification."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    if compression is None:
        compression = compression_of(path)
    records_ds = tf.data.TFRecordDataset(path, compression or "")
    count = consumed = 0
    try:
        # Lengths are summed in Python: a dataset.map would trace a function
        # per call, which costs more than the reading for small files.
        for batch in records_ds.batch(1024):
            values = batch.numpy()
            count += len(values)
            consumed += sum(len(v) for v in values) + _FRAMING_BYTES * len(values)
    except (tf.errors.DataLossError, tf.errors.OutOfRangeError,
            tf.errors.InvalidArgumentError) as e:
        message = short_tf_error(e)
        # The failed batch hides how many of its records were good: recount
        # them one by one (only broken files pay for this).
        count = consumed = 0
        try:
            for record in records_ds:
                count += 1
                consumed += len(record.numpy()) + _FRAMING_BYTES
        except (tf.errors.DataLossError, tf.errors.OutOfRangeError,
                tf.errors.InvalidArgumentError):
            pass
        # TensorFlow's own offset points at the record's length or its data,
        # depending on what failed, and is missing for GZIP errors: report
        # where the broken record starts instead.
        return FileCheck(path, count, message, consumed)
    except tf.errors.NotFoundError as e:
        return FileCheck(path, 0, f"file not found: {short_tf_error(e)}")
    if not compression:
        # TensorFlow's reader takes a partial last record for the end of the
        # file, so a truncated file would otherwise pass as whole.
        size = _gfile().stat(path).length
        if size != consumed:
            return FileCheck(path, count, f"truncated record at {consumed}: the file "
                             f"is {size} bytes but its {count} whole records end at "
                             f"byte {consumed}", consumed)
    return FileCheck(path, count)


@dataclasses.dataclass
class Report:
    """What ``inspect`` found.

    Attributes:
      source: the directory or glob inspected.
      schema: the schema (from the manifest or inferred).
      manifest: the Manifest or None.
      files: per split, a list of (path, expected count or None, FileCheck or None).
    """

    source: str
    schema: dict
    manifest: Manifest
    files: dict

    @property
    def broken(self):
        return [check for entries in self.files.values()
                for _, expected, check in entries
                if check is not None and (not check.ok or (
                    expected is not None and check.num_records != expected))]


def inspect(path_or_pattern, verify=False):
    """Describes a dataset directory or glob; with ``verify`` reads every
    record and checks it. Use :func:`format_report` to print the result."""
    gfile = _gfile()
    path = str(path_or_pattern)
    files = {}
    if not any(c in path for c in "*?[") and gfile.isdir(path):
        manifest = load_manifest(path)
        for split, info in manifest.splits.items():
            entries = []
            for shard in info.shards:
                full = _join(path, shard.file)
                check = check_file(full, manifest.compression) if verify else None
                if not verify and not gfile.exists(full):
                    check = FileCheck(full, 0, "file is missing")
                entries.append((full, shard.num_examples, check))
            files[split] = entries
        return Report(path, manifest.schema, manifest, files)
    resolved = resolve(path)
    entries = []
    for f in resolved.files:
        # Without a manifest the only way to count is to read everything.
        entries.append((f, None, check_file(f, resolved.compression)))
    return Report(path, resolved.schema, None, {"(files)": entries})


def format_report(report):
    """Human-readable lines for ``python -m experiments inspect``."""
    lines = [f"dataset: {report.source}"]
    if report.manifest is not None:
        m = report.manifest
        lines.append(f"name: {m.name or '(unnamed)'}   compression: "
                     f"{m.compression or 'none'}   created: {m.created.get('time', '?')}")
    else:
        lines.append("no manifest: schema inferred from the first record")
    lines.append("schema:")
    lines.append(schema_lib.describe(report.schema))
    for split, entries in report.files.items():
        total = sum(e if e is not None else (c.num_records if c else 0)
                    for _, e, c in entries)
        lines.append(f"split {split}: {total} examples in {len(entries)} file(s)")
        for path, expected, check in entries:
            status = ""
            if check is not None:
                if not check.ok:
                    where = f" at byte {check.offset}" if check.offset is not None else ""
                    status = (f"  CORRUPT after {check.num_records} good records"
                              f"{where}: {check.error}")
                elif expected is not None and check.num_records != expected:
                    status = (f"  MISMATCH: {check.num_records} records, manifest "
                              f"says {expected}")
                else:
                    status = "  ok"
            count = expected if expected is not None else check.num_records
            lines.append(f"  {posixpath.basename(path)}  {count} examples{status}")
    broken = report.broken
    if any(c is not None for entries in report.files.values() for _, _, c in entries):
        lines.append(f"{len(broken)} corrupt file(s)" if broken else "all records verified")
    return "\n".join(lines)
