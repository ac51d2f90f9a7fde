"""A dataset.json is data from a file: every malformed field is a DataError
naming the file and the field, and no shard name can lead a reader outside
the dataset directory. Also the manifest's label metadata.
"""

import json
import os

import numpy as np
import pytest

from estimator_keras import verify
from estimator_keras.errors import DataError, SchemaError
from estimator_keras.inputs import make_dataset
from estimator_keras.manifest import MANIFEST_NAME, load_manifest
from estimator_keras.records import resolve, write_dataset, write_records


def _set(path, value):
    def apply(obj):
        target = obj
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return apply


def _drop(path):
    def apply(obj):
        target = obj
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
    return apply


SHARD0 = ("splits", "train", "shards", 0)

MALFORMED = [
    # (what is wrong, the field the message must name, mutation)
    ("schema not an object", "schema", _set(("schema",), ["image"])),
    ("spec not an object", "schema.label", _set(("schema", "label"), "int64")),
    ("shape not a list", "schema.image.shape", _set(("schema", "image", "shape"), 4)),
    ("shape of strings", "schema.image.shape", _set(("schema", "image", "shape"), ["4", "3"])),
    ("shape of floats", "schema.image.shape", _set(("schema", "image", "shape"), [4.5, 3, 1])),
    ("shape of bools", "schema.image.shape", _set(("schema", "image", "shape"), [True, 3])),
    ("negative dimension", "schema.image.shape", _set(("schema", "image", "shape"), [-4, 3, 1])),
    ("huge dimension", "schema.image.shape", _set(("schema", "image", "shape"), [2 ** 40])),
    ("dtype not a string", "schema.image.dtype", _set(("schema", "image", "dtype"), 8)),
    ("unknown encoding", "schema.image", _set(("schema", "image", "encoding"), "webp")),
    ("encoding missing", "schema.image.encoding", _drop(("schema", "image", "encoding"))),
    ("splits not a mapping", "splits", _set(("splits",), [{"shards": []}])),
    ("split not a mapping", "splits.train.shards", _set(("splits", "train"), 3)),
    ("shards not a list", "splits.train.shards", _set(("splits", "train", "shards"), {})),
    ("shard not an object", "splits.train.shards[0]", _set(SHARD0, "train-00000-of-00004")),
    ("num_examples a string", "splits.train.shards[0].num_examples",
     _set(SHARD0 + ("num_examples",), "10")),
    ("num_examples a float", "splits.train.shards[0].num_examples",
     _set(SHARD0 + ("num_examples",), 10.0)),
    ("num_examples negative", "splits.train.shards[0].num_examples",
     _set(SHARD0 + ("num_examples",), -1)),
    ("num_bytes missing", "splits.train.shards[0].num_bytes", _drop(SHARD0 + ("num_bytes",))),
    ("split total not an int", "splits.train.num_examples",
     _set(("splits", "train", "num_examples"), "40")),
    ("split total wrong", "splits.train.num_examples",
     _set(("splits", "train", "num_examples"), 41)),
    ("bad split name", "splits.a/b", lambda obj: obj["splits"].update({"a/b": {"shards": []}})),
    ("compression unknown", "compression", _set(("compression",), "ZLIB")),
    ("name not a string", "name", _set(("name",), ["x"])),
    ("created not an object", "created", _set(("created",), "today")),
    ("labels not an object", "labels", _set(("labels",), [10])),
    ("labels of unknown feature", "labels.colour",
     _set(("labels",), {"colour": {"num_classes": 3, "class_names": None}})),
    ("num_classes zero", "labels.label.num_classes",
     _set(("labels",), {"label": {"num_classes": 0, "class_names": None}})),
    ("class_names too short", "labels.label.class_names",
     _set(("labels",), {"label": {"num_classes": 3, "class_names": ["a", "b"]}})),
    ("class_names not strings", "labels.label.class_names",
     _set(("labels",), {"label": {"num_classes": 2, "class_names": [1, 2]}})),
]
MALFORMED_CASES = len(MALFORMED)
"""Malformed manifests tried, one field each (the README's count)."""

ESCAPES = [
    "/etc/passwd",
    "../outside-00000-of-00001.tfrecord",
    "train-00000-of-00004.tfrecord/../../../etc/passwd",
    "gs://bucket/train-00000-of-00004.tfrecord",
    "sub/train-00000-of-00004.tfrecord",
    "test-00000-of-00001.tfrecord",          # another split's shard
    "train-00000-of-00004.tfrecord.gz",      # not this dataset's compression
    "train-00000-of-00004.tfrecord\n",
    "..",
]
ESCAPE_CASES = len(ESCAPES)
"""Shard names pointing elsewhere that a manifest may not use."""


@pytest.fixture
def dataset(tiny_dataset):
    directory, _ = tiny_dataset(n=40, num_shards=4)
    path = os.path.join(directory, MANIFEST_NAME)
    return directory, path, json.load(open(path))


def _rewrite(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)


@pytest.mark.parametrize("what, field, mutate", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_manifest_is_a_data_error_naming_file_and_field(dataset, what, field, mutate):
    directory, path, obj = dataset
    obj["labels"] = {"label": {"num_classes": 10, "class_names": None}}
    _rewrite(path, obj)
    assert load_manifest(directory).labels == obj["labels"]
    mutate(obj)
    _rewrite(path, obj)
    with pytest.raises(DataError) as info:
        load_manifest(directory)
    message = str(info.value)
    assert path in message and repr(field) in message, (what, message)


@pytest.mark.parametrize("name", ESCAPES)
def test_shard_names_cannot_point_outside_the_dataset(dataset, name, tmp_path):
    directory, path, obj = dataset
    obj["splits"]["train"]["shards"][1]["file"] = name
    _rewrite(path, obj)
    for read in (lambda: load_manifest(directory), lambda: resolve(directory),
                 lambda: make_dataset(directory, 4, training=True),
                 lambda: verify.inspect(directory)):
        with pytest.raises(DataError) as info:
            read()
        assert "splits.train.shards[1].file" in str(info.value)


def test_deeply_nested_json_is_a_data_error(dataset):
    directory, path, _ = dataset
    with open(path, "w") as f:
        f.write("[" * 100000 + "]" * 100000)
    with pytest.raises(DataError, match="not valid JSON"):
        load_manifest(directory)


# --------------------------------------------------------------------------- labels

class LabelledSource:
    """An example source that knows its classes."""

    def __init__(self, n, labels):
        self.features = {"label": _spec()}
        self.n, self.labels = n, labels

    def __len__(self):
        return self.n

    def read(self, indices):
        return {"label": np.asarray(indices, dtype=np.int64) % 3}


def _spec():
    from estimator_keras.schema import FeatureSpec  # pylint: disable=import-outside-toplevel
    return FeatureSpec("label", "int64", (), "int64")


THREE = {"label": {"num_classes": 3, "class_names": ["a", "b", "c"]}}


def test_labels_come_from_the_sources_or_the_argument(tmp_path):
    out = str(tmp_path / "ds")
    manifest = write_dataset({"train": LabelledSource(9, THREE), "test": LabelledSource(3, THREE)},
                             out, progress=False)
    assert manifest.labels == THREE and load_manifest(out).labels == THREE
    assert json.load(open(os.path.join(out, MANIFEST_NAME)))["labels"] == THREE
    two = {"label": {"num_classes": 3, "class_names": None}}
    assert write_records({"label": np.arange(6) % 3}, str(tmp_path / "b"), labels=two,
                         progress=False).labels == two
    # Without labels anywhere the key stays out of the file.
    write_records({"label": np.arange(6)}, str(tmp_path / "c"), progress=False)
    assert "labels" not in json.load(open(tmp_path / "c" / MANIFEST_NAME))
    assert load_manifest(str(tmp_path / "c")).labels is None


@pytest.mark.parametrize("splits, labels, needle", [
    ({"train": LabelledSource(6, THREE), "test": LabelledSource(3, None)}, None, "disagree"),
    ({"train": LabelledSource(6, None)}, {"label": {"num_classes": 0}}, "num_classes"),
    ({"train": LabelledSource(6, None)}, {"label": {"num_classes": 2, "class_names": ["x"]}},
     "class_names"),
    ({"train": LabelledSource(6, None)}, {"image": {"num_classes": 2}}, "labels.image"),
])
def test_bad_labels_are_refused_before_writing(tmp_path, splits, labels, needle):
    out = tmp_path / "ds"
    with pytest.raises(SchemaError, match=needle):
        write_dataset(splits, str(out), labels=labels, progress=False)
    assert not out.exists()
