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
from estimator_keras.errors import DataError, SchemaError, UsageError

MANIFEST_NAME = "dataset.json"
FORMAT = "estimator-keras/dataset/v1"
INCOMPLETE_DIR = ".incomplete"
SPLIT_RE = re.compile(r"^[A-Za-z0-9_.]+\Z")
"""A split name: letters, digits, '_' and '.'."""
SHARD_RE = re.compile(r"^(?P<split>[A-Za-z0-9_.]+)-(?P<index>\d{5})-of-(?P<total>\d{5})"
                      r"\.tfrecord(?P<gz>\.gz)?\Z")
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
      labels: None, or label feature -> ``{"num_classes": int, "class_names":
        [str, ...] or None}`` (see :func:`check_labels`).
    """

    directory: str
    schema: dict
    splits: dict
    compression: str = None
    name: str = ""
    created: dict = dataclasses.field(default_factory=dict)
    labels: dict = None

    def files(self, split):
        """Full paths of a split's shards, in shard order; a name that would
        leave the dataset directory is refused (DataError)."""
        paths = []
        for shard in self.split(split).shards:
            try:
                paths.append(io.child(self.directory, shard.file, "shard file name"))
            except ValueError as e:
                raise DataError(f"{manifest_path(self.directory)}: {e}") from e
        return paths

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
            **({"labels": self.labels} if self.labels is not None else {}),
        }


def manifest_path(directory):
    return io.join(str(directory), MANIFEST_NAME)


def load_manifest(directory):
    """Reads and validates ``DIR/dataset.json``.

    Every field is checked before it is used: types, shapes (lists of
    non-negative ints), split names, shard names (each must be a shard file
    name of its own split, :data:`SHARD_RE`, so a manifest cannot point a
    reader outside its directory), counts and the optional ``labels``.

    Raises:
      DataError: the manifest is missing (the dataset is incomplete), is not
        JSON, or a field is missing or malformed; the message names the file
        and the field.
    """
    directory = str(directory)
    path = manifest_path(directory)
    if not io.exists(path):
        raise DataError(_missing_manifest_message(directory))
    try:
        obj = json.loads(io.read_text(path))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise DataError(f"{path} is not valid JSON ({e}); rewrite the dataset "
                        f"with `python -m experiments prepare`.") from e
    expected = {"format", "schema", "splits"}
    if not isinstance(obj, dict) or not expected <= set(obj):
        given = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        missing = sorted(expected - set(obj)) if isinstance(obj, dict) else sorted(expected)
        raise DataError(f"{path} is not a dataset manifest: expected keys "
                        f"{sorted(expected)}, given {given}, missing {missing}.")
    if obj["format"] != FORMAT:
        raise DataError(f"{path} has format {_shown(obj['format'])}; this version "
                        f"reads {FORMAT!r}.")
    try:
        schema = _schema_field(obj["schema"])
        compression = obj.get("compression")
        if compression not in (None, "GZIP"):
            raise InvalidField("compression", "null or \"GZIP\"", compression)
        splits = _splits_field(obj["splits"], compression)
        name = obj.get("name", "")
        if not isinstance(name, str):
            raise InvalidField("name", "a string", name)
        created = obj.get("created", {})
        if not isinstance(created, dict):
            raise InvalidField("created", "an object", created)
        labels = check_labels(obj.get("labels"), schema)
    except InvalidField as e:
        raise DataError(f"{path}: {e}") from None
    return Manifest(directory=directory, schema=schema, splits=splits,
                    compression=compression, name=name, created=created, labels=labels)


class InvalidField(ValueError):
    """A manifest field that is missing or malformed (turned into a DataError
    naming the file by :func:`load_manifest`)."""

    def __init__(self, field, expected, found=None, detail=""):
        self.field = field
        if expected:
            text = f"field {field!r} must be {expected}; " + (detail or f"found {_shown(found)}")
        else:
            text = f"field {field!r} is invalid: {detail}"
        super().__init__(text.rstrip(".") + ".")


def _shown(value, limit=80):
    text = json.dumps(value) if _jsonable(value) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _jsonable(value):
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError, RecursionError):
        return False


def _count(value):
    # bool is an int to Python, never a count.
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


MAX_DIM = 2 ** 31 - 1


def _schema_field(obj):
    if not isinstance(obj, dict) or not obj:
        raise InvalidField("schema", "a non-empty object of feature name -> spec", obj)
    for feature, spec in obj.items():
        where = f"schema.{feature}"
        if not isinstance(spec, dict):
            raise InvalidField(where, "an object with dtype, shape and encoding", spec)
        for key in ("dtype", "encoding"):
            if not isinstance(spec.get(key), str):
                raise InvalidField(f"{where}.{key}", "a string", spec.get(key))
        shape = spec.get("shape")
        if not isinstance(shape, list) or not all(_count(d) and d <= MAX_DIM for d in shape):
            raise InvalidField(f"{where}.shape", f"a list of ints from 0 to {MAX_DIM}", shape)
    schema = {}
    for feature, spec in obj.items():
        try:
            schema[feature] = schema_lib.FeatureSpec.from_json(feature, spec)
        except SchemaError as e:
            raise InvalidField(f"schema.{feature}", "", detail=str(e)) from None
    return schema


def _splits_field(obj, compression):
    if not isinstance(obj, dict):
        raise InvalidField("splits", "an object of split name -> {shards: [...]}", obj)
    splits, seen = {}, set()
    for name, split in obj.items():
        where = f"splits.{name}"
        if not SPLIT_RE.match(name):
            raise InvalidField(where, "named with letters, digits, '_' or '.'", None,
                               detail=f"the split name {name!r} is not")
        if not isinstance(split, dict) or not isinstance(split.get("shards"), list):
            raise InvalidField(f"{where}.shards", "a list of shards",
                               split.get("shards") if isinstance(split, dict) else split)
        shards = []
        for i, shard in enumerate(split["shards"]):
            shards.append(_shard_field(f"{where}.shards[{i}]", name, shard, compression))
            if shards[-1].file in seen:
                raise InvalidField(f"{where}.shards[{i}].file", "listed once", None,
                                   detail=f"{shards[-1].file!r} is listed twice")
            seen.add(shards[-1].file)
        splits[name] = Split(shards)
        total = split.get("num_examples", splits[name].num_examples)
        if not _count(total) or total != splits[name].num_examples:
            raise InvalidField(f"{where}.num_examples",
                               f"the sum of its shards' num_examples "
                               f"({splits[name].num_examples})", total)
    return splits


def _shard_field(where, split, shard, compression):
    if not isinstance(shard, dict):
        raise InvalidField(where, "an object with file, num_examples and num_bytes", shard)
    file = shard.get("file")
    match = SHARD_RE.match(file) if isinstance(file, str) else None
    if match is None or match.group("split") != split:
        raise InvalidField(
            f"{where}.file", f"a shard file name of split {split!r} in the dataset "
            f"directory, like {shard_name(split, 0, 1, compression)!r}", file)
    if bool(match.group("gz")) != (compression == "GZIP"):
        raise InvalidField(f"{where}.file", f"named for the manifest's compression "
                           f"({compression or 'none'})", file)
    for key in ("num_examples", "num_bytes"):
        if not _count(shard.get(key)):
            raise InvalidField(f"{where}.{key}", "an int >= 0", shard.get(key))
    return Shard(file, shard["num_examples"], shard["num_bytes"])


def check_labels(labels, schema):
    """Validates label metadata: None, or label feature (in ``schema``) ->
    ``{"num_classes": int >= 1, "class_names": None or num_classes strings}``.

    Returns ``labels`` in canonical form (``class_names`` present, a list or
    None); raises :class:`InvalidField` naming the field.
    """
    if labels is None:
        return None
    if not isinstance(labels, dict):
        raise InvalidField("labels", "an object of label feature -> "
                           "{num_classes, class_names}", labels)
    result = {}
    for feature, info in labels.items():
        where = f"labels.{feature}"
        if feature not in schema:
            raise InvalidField(where, f"a feature of the schema ({', '.join(schema)})", None,
                               detail=f"{feature!r} is not one")
        if not isinstance(info, dict):
            raise InvalidField(where, "an object with num_classes and class_names", info)
        num = info.get("num_classes")
        if not _count(num) or num < 1:
            raise InvalidField(f"{where}.num_classes", "an int >= 1", num)
        names = info.get("class_names")
        if names is not None and (not isinstance(names, (list, tuple)) or len(names) != num
                                  or not all(isinstance(n, str) for n in names)):
            raise InvalidField(f"{where}.class_names", f"null or a list of {num} strings",
                               names)
        result[feature] = {"num_classes": num,
                           "class_names": None if names is None else list(names)}
    return result


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
