"""A dataset's manifest (``dataset.json``) and the names of its shard files.

A dataset directory holds ``<split>-00000-of-000NN.tfrecord[.gz]`` shards and a
``dataset.json`` manifest (schema, shards per split with their example counts
and sizes, how the dataset was made). The manifest is written last, so a
dataset is complete exactly when it has one; shards are written under
``.incomplete/`` (:data:`INCOMPLETE_DIR`) and renamed into place only when
whole. Reading a manifest needs no TensorFlow.

Example::

    from estimator_keras.manifest import load_manifest

    load_manifest("/tmp/ds").splits["train"].num_examples
"""

import dataclasses
import json
import re

from estimator_keras import io
from estimator_keras import schema as schema_lib
from estimator_keras.errors import DataError, UsageError

MANIFEST_NAME = "dataset.json"
FORMAT = "estimator-keras/dataset/v1"
INCOMPLETE_DIR = ".incomplete"
SHARD_RE = re.compile(r"^(?P<split>[A-Za-z0-9_.]+)-(?P<index>\d{5})-of-(?P<total>\d{5})"
                      r"\.tfrecord(?P<gz>\.gz)?$")
"""A shard file name; groups ``split``, ``index``, ``total`` and ``gz``."""


def shard_name(split, index, total, compression=None):
    """The file name of shard ``index`` of ``total`` of a split."""
    suffix = ".tfrecord.gz" if compression == "GZIP" else ".tfrecord"
    return f"{split}-{index:05d}-of-{total:05d}{suffix}"


def compression_of(path):
    """'GZIP' for ``*.gz`` files, else None (TFRecord's two framings)."""
    return "GZIP" if str(path).endswith(".gz") else None


def check_compression(compression):
    """The canonical form of a compression argument: None or 'GZIP'."""
    if compression in (None, "", "NONE"):
        return None
    if str(compression).upper() in ("GZIP", "GZ"):
        return "GZIP"
    raise UsageError(f"compression must be None or 'GZIP'; given {compression!r}.")


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
        return [io.join(self.directory, s.file) for s in self.split(split).shards]

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
    return io.join(str(directory), MANIFEST_NAME)


def load_manifest(directory):
    """Reads and validates ``DIR/dataset.json``.

    Raises:
      DataError: the manifest is missing (the dataset is incomplete), is not
        JSON, or lacks keys; the message names the file and the keys.
    """
    directory = str(directory)
    path = manifest_path(directory)
    if not io.exists(path):
        raise DataError(_missing_manifest_message(directory))
    try:
        obj = json.loads(io.read_text(path))
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


def write_manifest(manifest):
    """Writes ``manifest`` to its directory's ``dataset.json``, atomically:
    readers see the old manifest or the new one, never a partial file."""
    io.atomic_write(manifest_path(manifest.directory),
                    json.dumps(manifest.to_json(), indent=2))


def _missing_manifest_message(directory):
    shards = shard_files_in(directory)
    # A writer killed before its first shard was whole leaves only staging.
    if shards or io.exists(io.join(directory, INCOMPLETE_DIR)):
        return (f"{directory} holds {len(shards)} shard file(s) but no "
                f"{MANIFEST_NAME}: the dataset is incomplete, it was not completely "
                f"written (an interrupted prepare?). Rerun `python -m experiments "
                f"prepare` to rewrite it.")
    return (f"{directory} is not a dataset: it has no {MANIFEST_NAME}. Expected "
            f"a directory written by `python -m experiments prepare` or "
            f"`write_records`, or a glob of TFRecord files.")


def shard_files_in(directory):
    """Sorted names of the shard files directly in ``directory`` (none when
    it is not a folder)."""
    if not io.isdir(directory):
        return []
    return [n for n in io.listdir(directory) if SHARD_RE.match(n)]
