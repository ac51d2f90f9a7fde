"""Feature schema: what each feature of a record is and how it is stored.

A schema is an ordered mapping of feature name -> :class:`FeatureSpec`. It is
written into a dataset's manifest, used to encode examples into
``tf.train.Example`` protos (:func:`estimator_keras.records.encode_example`),
and used by the input pipeline to build one vectorized ``tf.io.parse_example``
spec per batch; :func:`feature_map` says which features feed which model
inputs. This module does not import TensorFlow.

Encodings (how a value sits inside a ``tf.train.Example``):

- ``int64``: an ``int64_list`` of ``prod(shape)`` values (integer and bool
  features, best for labels and small vectors);
- ``float``: a ``float_list`` of ``prod(shape)`` values;
- ``raw``: one ``bytes_list`` entry holding the array's bytes in C order
  (images, masks, any large fixed-shape array; decoded by ``decode_raw``);
- ``png`` / ``jpeg``: one ``bytes_list`` entry holding an encoded image of
  ``shape`` (height, width, channels), ``dtype`` uint8;
- ``bytes``: one opaque ``bytes_list`` entry (strings, file names).
"""

import dataclasses

import numpy as np

from estimator_keras.errors import SchemaError

ENCODINGS = ("int64", "float", "raw", "png", "jpeg", "bytes")
IMAGE_ENCODINGS = ("png", "jpeg")
_DTYPES = ("uint8", "int8", "uint16", "int16", "int32", "int64", "float16",
           "float32", "float64", "bool", "string")


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """One feature of a record.

    Attributes:
      name: key of the feature inside each ``tf.train.Example``.
      dtype: numpy dtype name of the decoded value ("uint8", "int64",
        "float32", ... or "string" for the ``bytes`` encoding).
      shape: shape of one example's value, without the batch axis; () for a
        scalar.
      encoding: one of :data:`ENCODINGS`, see the module docstring.
    """

    name: str
    dtype: str
    shape: tuple
    encoding: str

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if self.encoding not in ENCODINGS:
            raise SchemaError(
                f"feature {self.name!r}: unknown encoding {self.encoding!r}; "
                f"expected one of {', '.join(ENCODINGS)}.")
        if self.dtype not in _DTYPES:
            raise SchemaError(
                f"feature {self.name!r}: unsupported dtype {self.dtype!r}; "
                f"expected one of {', '.join(_DTYPES)}.")
        if self.encoding in IMAGE_ENCODINGS and (
                self.dtype != "uint8" or len(self.shape) != 3):
            raise SchemaError(
                f"feature {self.name!r}: {self.encoding} images must be uint8 "
                f"with shape (height, width, channels); got {self.dtype} "
                f"{self.shape}.")
        if any(d < 0 for d in self.shape):
            raise SchemaError(f"feature {self.name!r}: negative dimension in "
                              f"shape {self.shape}.")

    @property
    def size(self):
        """Number of scalar values in one example's value."""
        return int(np.prod(self.shape, dtype=np.int64))

    def to_json(self):
        return {"dtype": self.dtype, "shape": list(self.shape),
                "encoding": self.encoding}

    @classmethod
    def from_json(cls, name, obj):
        expected = {"dtype", "shape", "encoding"}
        if not isinstance(obj, dict) or not expected <= set(obj):
            given = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
            raise SchemaError(
                f"feature {name!r} in the schema must be an object with keys "
                f"{sorted(expected)}; given {given}.")
        return cls(name, obj["dtype"], tuple(obj["shape"]), obj["encoding"])


def spec_for_array(name, array, encoding=None):
    """Infers a FeatureSpec from an array whose first axis is examples.

    Scalars of integer or bool type go to ``int64``, float scalars and small
    float vectors to ``float``, anything larger to ``raw``; object or bytes
    arrays to ``bytes``.
    """
    array = np.asarray(array)
    if array.ndim == 0:
        raise SchemaError(f"feature {name!r}: expected an array whose first "
                          f"axis is examples, got a scalar.")
    shape = array.shape[1:]
    kind = array.dtype.kind
    if encoding is None:
        if kind in "OSU":
            encoding = "bytes"
        elif not shape and kind in "iub":
            encoding = "int64"
        elif not shape and kind == "f":
            encoding = "float"
        else:
            encoding = "raw"
    dtype = "string" if encoding == "bytes" else array.dtype.name
    return FeatureSpec(name, dtype, shape, encoding)


def schema_to_json(schema):
    return {name: spec.to_json() for name, spec in schema.items()}


def describe(schema):
    """One line per feature, for logs and ``inspect``."""
    width = max(len(n) for n in schema)
    return "\n".join(
        f"  {name:<{width}}  {spec.dtype:<8} shape={list(spec.shape)!s:<14} "
        f"encoding={spec.encoding}" for name, spec in schema.items())


def feature_map(schema, features=None, label="label"):
    """Model input name -> record feature name, checked against the schema."""
    if label is not None and label not in schema:
        raise SchemaError(f"label feature {label!r} is not in the records; they "
                          f"hold {sorted(schema)}.")
    if features is None:
        mapping = {name: name for name in schema if name != label}
    elif isinstance(features, dict):
        mapping = dict(features)
    elif isinstance(features, str):
        mapping = {features: features}
    else:
        mapping = {name: name for name in features}
    missing = sorted(f for f in mapping.values() if f not in schema)
    if missing:
        raise SchemaError(f"the records have no feature(s) {missing}; expected one "
                          f"of {sorted(schema)} (mapping given: {mapping}).")
    if not mapping:
        raise SchemaError(f"no input features: the records hold only {sorted(schema)} "
                          f"and {label!r} is the label.")
    return mapping
