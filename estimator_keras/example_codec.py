"""``tf.train.Example`` without TensorFlow: encoded and decoded with protobuf.

The message classes are built here from a descriptor with the names and
field numbers of TensorFlow's Example (package ``tensorflow``): Example
{features = 1}, Features {map<string, Feature> feature = 1}, Feature {oneof
kind: bytes_list = 1, float_list = 2, int64_list = 3}, and BytesList,
FloatList, Int64List {repeated value = 1, numbers packed}. They live in a pool
of their own, so TensorFlow's classes can be loaded beside them.

:func:`encode_example` serializes one example as
:func:`estimator_keras.records.encode_example` does, to the same bytes (map
keys sorted); :func:`decode_example` reads it back to numpy values by the
schema, :func:`decode_features` without one.

Example::

    from estimator_keras import example_codec

    data = example_codec.encode_example(schema, {"image": image, "label": 3})
    example_codec.decode_example(schema, data)["label"]  # array(3)
"""

import functools

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from estimator_keras.errors import SchemaError

# TensorFlow's protobuf package: a peer's field, not a choice of backend.
_PACKAGE_FIELD = "tensorflow"
_LISTS = (("BytesList", "bytes_list", "TYPE_BYTES"),
          ("FloatList", "float_list", "TYPE_FLOAT"),
          ("Int64List", "int64_list", "TYPE_INT64"))


def _field(message, name, number, kind, label="LABEL_OPTIONAL", type_name=None):
    field = message.field.add(name=name, number=number,
                              type=descriptor_pb2.FieldDescriptorProto.Type.Value(kind),
                              label=descriptor_pb2.FieldDescriptorProto.Label.Value(label))
    if type_name:
        field.type_name = f".{_PACKAGE_FIELD}.{type_name}"
    return field


def _file_descriptor():
    proto = descriptor_pb2.FileDescriptorProto(
        name="example_codec.proto", package=_PACKAGE_FIELD, syntax="proto3")
    for message_name, _, kind in _LISTS:
        field = _field(proto.message_type.add(name=message_name), "value", 1, kind,
                       "LABEL_REPEATED")
        if kind != "TYPE_BYTES":
            field.options.packed = True
    feature = proto.message_type.add(name="Feature")
    feature.oneof_decl.add(name="kind")
    for number, (message_name, field_name, _) in enumerate(_LISTS, start=1):
        _field(feature, field_name, number, "TYPE_MESSAGE", type_name=message_name).oneof_index = 0
    features = proto.message_type.add(name="Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    _field(entry, "key", 1, "TYPE_STRING")
    _field(entry, "value", 2, "TYPE_MESSAGE", type_name="Feature")
    _field(features, "feature", 1, "TYPE_MESSAGE", "LABEL_REPEATED",
           type_name="Features.FeatureEntry")
    _field(proto.message_type.add(name="Example"), "features", 1, "TYPE_MESSAGE",
           type_name="Features")
    return proto


@functools.lru_cache(maxsize=None)
def message_class(name):
    """The class of message ``name`` ("Example", "Feature", "BytesList", ...)."""
    pool = _pool()
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE_FIELD}.{name}"))


@functools.lru_cache(maxsize=None)
def _pool():
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file_descriptor())
    return pool


def _fill(feature, spec, value):
    """Sets one Feature message from a value, as records.encode_example does."""
    name = spec.name
    if spec.encoding in ("bytes", "png", "jpeg"):
        if isinstance(value, np.ndarray):
            value = value.item()
        if isinstance(value, str):
            value = value.encode("utf-8")
        feature.bytes_list.value.append(bytes(value))
        return
    array = np.asarray(value)
    if array.shape != spec.shape:
        raise SchemaError(f"feature {name!r}: expected shape {spec.shape}, found "
                          f"{array.shape}.")
    if spec.encoding == "raw":
        feature.bytes_list.value.append(
            np.ascontiguousarray(array, dtype=spec.dtype).tobytes())
    elif spec.encoding == "int64":
        feature.int64_list.value.extend(array.astype(np.int64).ravel().tolist())
    else:
        feature.float_list.value.extend(array.astype(np.float32).ravel().tolist())


def encode_example(schema, values):
    """Serializes one example (a dict name -> value) to an Example's bytes.

    Raises SchemaError naming the feature when a value is missing or does not
    fit its spec.
    """
    example = message_class("Example")()
    features = example.features.feature
    for name, spec in schema.items():
        if name not in values:
            raise SchemaError(f"example is missing feature {name!r}; schema "
                              f"expects {sorted(schema)}, got {sorted(values)}.")
        _fill(features[name], spec, values[name])
    # Sorted map keys: the bytes TensorFlow's path writes, and the same bytes
    # for the same example on every run.
    return example.SerializeToString(deterministic=True)


def _parse(data):
    example = message_class("Example")()
    try:
        example.ParseFromString(bytes(data))
    except Exception as e:  # pylint: disable=broad-except  (protobuf's DecodeError)
        raise SchemaError(f"a record is not a tf.train.Example ({type(e).__name__}: "
                          f"{e}).") from e
    return example.features.feature


def decode_features(data):
    """An Example's bytes as a dict name -> values: a list of bytes, an int64
    array or a float32 array by the feature's kind (None for a feature that
    sets none)."""
    decoded = {}
    for name, feature in _parse(data).items():
        kind = feature.WhichOneof("kind")
        if kind == "bytes_list":
            decoded[name] = list(feature.bytes_list.value)
        elif kind == "int64_list":
            decoded[name] = np.array(feature.int64_list.value, dtype=np.int64)
        elif kind == "float_list":
            decoded[name] = np.array(feature.float_list.value, dtype=np.float32)
        else:
            decoded[name] = None
    return decoded


# Where each schema encoding's values sit in a tf.train.Feature.
KINDS = {"bytes": "bytes_list", "png": "bytes_list", "jpeg": "bytes_list",
         "raw": "bytes_list", "int64": "int64_list", "float": "float_list"}


def decode_example(schema, data):
    """An Example's bytes as a dict name -> numpy value of the schema's
    dtype and shape (bytes for the bytes, png and jpeg encodings: images are
    left encoded).

    Raises SchemaError naming the feature that is missing, of another kind,
    or of another size than its spec.
    """
    features = _parse(data)
    decoded = {}
    for name, spec in schema.items():
        if name not in features:
            raise SchemaError(f"a record lacks feature {name!r}; it has "
                              f"{sorted(features)}.")
        kind = features[name].WhichOneof("kind")
        if kind != KINDS[spec.encoding]:
            raise SchemaError(f"feature {name!r}: its {spec.encoding} encoding is stored "
                              f"as {KINDS[spec.encoding]}, the record has {kind}.")
        values = getattr(features[name], kind).value
        if spec.encoding in ("bytes", "png", "jpeg"):
            decoded[name] = bytes(values[0]) if len(values) == 1 else None
            if decoded[name] is None:
                raise SchemaError(f"feature {name!r}: expected one byte string, the "
                                  f"record has {len(values)}.")
            continue
        if spec.encoding == "raw":
            array = np.frombuffer(values[0] if len(values) == 1 else b"", dtype=spec.dtype)
        else:
            array = np.array(values, dtype=np.int64 if kind == "int64_list" else np.float32)
        if array.size != spec.size:
            raise SchemaError(f"feature {name!r}: expected {spec.size} value(s) for shape "
                              f"{spec.shape}, the record has {array.size}.")
        decoded[name] = array.astype(spec.dtype, copy=False).reshape(spec.shape)
    return decoded
