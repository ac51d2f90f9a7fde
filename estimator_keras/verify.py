"""Checking TFRecord files record by record, and describing datasets.

:func:`check_file` reads one file through (TensorFlow's reader checks each
record's CRC) and reports where it breaks; :func:`inspect` does that for a
whole dataset directory or glob, and :func:`format_report` prints the result
for ``python -m experiments inspect``.

Example::

    from estimator_keras.verify import format_report, inspect

    print(format_report(inspect("/data/fashion_mnist", verify=True)))
"""

import dataclasses

import tensorflow as tf

from estimator_keras import io
from estimator_keras import schema as schema_lib
from estimator_keras.manifest import Manifest, compression_of, load_manifest
from estimator_keras.records import is_pattern, resolve, short_tf_error

# Each TFRecord is framed by a length, its CRC and the data's CRC.
_FRAMING_BYTES = 8 + 4 + 4
# What TensorFlow's reader raises on a damaged record.
_RECORD_ERRORS = (tf.errors.DataLossError, tf.errors.OutOfRangeError,
                  tf.errors.InvalidArgumentError)


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
    except _RECORD_ERRORS as e:
        message = short_tf_error(e)
        # The failed batch hides how many of its records were good: recount
        # them one by one (only broken files pay for this).
        count = consumed = 0
        try:
            for record in records_ds:
                count += 1
                consumed += len(record.numpy()) + _FRAMING_BYTES
        except _RECORD_ERRORS:
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
        size = io.size(path)
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
    path = str(path_or_pattern)
    files = {}
    if not is_pattern(path) and io.isdir(path):
        manifest = load_manifest(path)
        for split, info in manifest.splits.items():
            entries = []
            for shard, full in zip(info.shards, manifest.files(split)):
                check = check_file(full, manifest.compression) if verify else None
                if not verify and not io.exists(full):
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
            lines.append(f"  {io.basename(path)}  {count} examples{status}")
    broken = report.broken
    if any(c is not None for entries in report.files.values() for _, _, c in entries):
        lines.append(f"{len(broken)} corrupt file(s)" if broken else "all records verified")
    return "\n".join(lines)
