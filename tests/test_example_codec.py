"""Tests of estimator_keras.example_codec: tf.train.Example without TensorFlow,
checked against TensorFlow's own messages."""

import numpy as np
import pytest
import tensorflow as tf

from support import generated_examples
from estimator_keras import example_codec, records
from estimator_keras.errors import SchemaError
from estimator_keras.schema import FeatureSpec


def test_examples_encode_to_the_bytes_of_tensorflows_path():
    schema, examples = generated_examples(100, seed=1)
    for example in examples:
        assert example_codec.encode_example(schema, example) == records.encode_example(
            schema, example)


def test_image_and_text_encodings_encode_as_tensorflows_path():
    schema = {"photo": FeatureSpec("photo", "uint8", (2, 2, 3), "png"),
              "scan": FeatureSpec("scan", "uint8", (2, 2, 1), "jpeg"),
              "name": FeatureSpec("name", "string", (), "bytes")}
    values = {"photo": b"\x89PNG...", "scan": np.array(b"\xff\xd8jpeg", dtype=object),
              "name": "caf\u00e9"}
    assert example_codec.encode_example(schema, values) == records.encode_example(
        schema, values)


def test_tensorflow_parses_our_bytes_into_its_example():
    schema, examples = generated_examples(20, seed=2)
    for example in examples:
        ours = tf.train.Example.FromString(example_codec.encode_example(schema, example))
        features = ours.features.feature
        assert sorted(features) == sorted(schema)
        assert features["label"].int64_list.value == [example["label"]]
        assert list(features["b_ids"].int64_list.value) == example["b_ids"].tolist()
        np.testing.assert_array_equal(np.array(features["weights"].float_list.value,
                                               np.float32), example["weights"])
        assert features["image"].bytes_list.value == [example["image"].tobytes()]
        assert features["caption"].bytes_list.value == [example["caption"]]


def test_tensorflows_bytes_decode_to_the_values_written():
    schema, examples = generated_examples(20, seed=5)
    parsed = tf.io.parse_example(
        [records.encode_example(schema, e) for e in examples],
        {"weights": tf.io.FixedLenFeature([5], tf.float32),
         "b_ids": tf.io.FixedLenFeature([3], tf.int64)})
    for i, example in enumerate(examples):
        data = records.encode_example(schema, example)
        decoded = example_codec.decode_example(schema, data)
        for name in ("label", "image", "weights", "b_ids", "a_depth"):
            assert decoded[name].dtype == np.dtype(schema[name].dtype), name
            np.testing.assert_array_equal(decoded[name], example[name], err_msg=name)
        assert decoded["caption"] == example["caption"]
        np.testing.assert_array_equal(decoded["weights"], parsed["weights"][i].numpy())
        np.testing.assert_array_equal(decoded["b_ids"], parsed["b_ids"][i].numpy())
        loose = example_codec.decode_features(data)
        assert loose["caption"] == [example["caption"]]
        assert loose["label"].tolist() == [example["label"]]
        assert loose["image"] == [example["image"].tobytes()]


def test_a_feature_that_sets_no_kind_decodes_as_none():
    data = tf.train.Example(features=tf.train.Features(
        feature={"empty": tf.train.Feature()})).SerializeToString()
    assert example_codec.decode_features(data) == {"empty": None}


def test_encoding_refuses_a_missing_feature_and_a_wrong_shape():
    schema, (example,) = generated_examples(1)
    with pytest.raises(SchemaError, match="missing feature 'label'"):
        example_codec.encode_example(schema, {k: v for k, v in example.items()
                                              if k != "label"})
    with pytest.raises(SchemaError, match=r"'weights': expected shape \(5,\), found \(4,\)"):
        example_codec.encode_example(schema, dict(example, weights=np.zeros(4)))


def test_decoding_names_the_feature_that_does_not_fit():
    schema, (example,) = generated_examples(1)
    data = records.encode_example(schema, example)
    with pytest.raises(SchemaError, match="lacks feature 'extra'"):
        example_codec.decode_example(
            dict(schema, extra=FeatureSpec("extra", "int64", (), "int64")), data)
    with pytest.raises(SchemaError, match="'label'.*int64_list, the record has float_list"):
        example_codec.decode_example(
            dict(schema, label=FeatureSpec("label", "int64", (), "int64")),
            records.encode_example(dict(schema, label=FeatureSpec("label", "float32", (),
                                                                   "float")), example))
    with pytest.raises(SchemaError, match=r"'b_ids': expected 4 value\(s\)"):
        example_codec.decode_example(
            dict(schema, b_ids=FeatureSpec("b_ids", "int64", (4,), "int64")), data)


def test_bytes_that_are_no_example_are_a_schema_error():
    with pytest.raises(SchemaError, match="not a tf.train.Example"):
        example_codec.decode_features(b"\xff\xff\xff")


def test_the_classes_keep_tensorflows_names_and_numbers():
    example = example_codec.message_class("Example").DESCRIPTOR
    assert example.full_name == tf.train.Example.DESCRIPTOR.full_name == "tensorflow.Example"
    for name in ("Feature", "Features", "BytesList", "FloatList", "Int64List"):
        ours = example_codec.message_class(name).DESCRIPTOR
        theirs = getattr(tf.train, name).DESCRIPTOR
        assert [_field(f) for f in ours.fields] == [_field(f) for f in theirs.fields], name


def _field(field):
    # protobuf 7 drops FieldDescriptor.label for is_repeated.
    repeated = (field.is_repeated if hasattr(field, "is_repeated")
                else field.label == field.LABEL_REPEATED)
    return (field.name, field.number, field.type, repeated,
            field.message_type and field.message_type.full_name,
            field.containing_oneof and field.containing_oneof.name)
