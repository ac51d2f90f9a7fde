"""Checking TFRecord files record by record, and describing datasets.

:func:`check_file` reads one file through, checking each record's CRCs
(:func:`estimator_keras.record_files.read_records`), and reports where it breaks;
:func:`inspect` does that for a whole dataset directory or glob, and
:func:`format_report` prints the result for ``python -m experiments inspect``.
No TensorFlow is needed.

Example::

    from estimator_keras.verify import format_report, inspect

    print(format_report(inspect("/data/fashion_mnist", verify=True)))
"""

import dataclasses

from estimator_keras import io
from estimator_keras import schema as schema_lib
from estimator_keras.errors import CorruptRecordError
from estimator_keras.manifest import Manifest, compression_of, load_manifest
from estimator_keras.record_files import (  # noqa: F401  (short_tf_error: its callers')
    read_records, short_tf_error)
from estimator_keras.records import is_pattern, resolve


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
    """Reads one file through, counting records and checking the CRCs of
    each, so this is also the verification."""
    if compression is None:
        compression = compression_of(path)
    if not io.exists(path):
        return FileCheck(path, 0, f"file not found: {path}")
    count = 0
    try:
        for _ in read_records(path, compression):
            count += 1
    except CorruptRecordError as e:
        # The offset is where the broken record starts (in the decompressed
        # stream of a GZIP file).
        return FileCheck(path, count, e.reason, e.offset)
    except OSError as e:
        return FileCheck(path, count, f"unreadable: {e}")
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
