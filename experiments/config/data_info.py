"""What a dataset says about itself, for the model builders: each model
input's shape and dtype, and for a classification label the number of
classes and their names.

It comes from the dataset's manifest (its schema, and the ``labels`` that
``prepare`` records) through the experiment's feature mapping, so that one
builder serves 28x28 grey images with 10 classes and 224x224 colour images
with 5. Every run keeps it in ``MODEL_DIR/config.yaml``: ``export`` and
``evaluate`` rebuild the same model from there when the data is elsewhere.

Example::

    def build(hparams, data):
        inputs = tf.keras.Input(shape=data.input_shape, name=data.input_name)
        ...
        return tf.keras.Model(inputs, layers.Dense(data.num_classes, "softmax")(x))
"""

import dataclasses
import inspect
import typing

from estimator_keras.errors import ConfigError
from estimator_keras.schema import feature_map


@dataclasses.dataclass
class DataInfo:
    """The inputs and the label a dataset provides, as a model sees them."""

    inputs: dict
    """Model input name -> {"shape": [...], "dtype": "uint8"...}: one example's
    shape without the batch axis, and the dtype stored in the records."""
    label_shape: list = dataclasses.field(default_factory=list)
    """Shape of one label ([] for a class id, [H, W] or [H, W, 1] for a mask)."""
    num_classes: typing.Optional[int] = None
    """Classes of the label, when the manifest records them."""
    class_names: typing.Optional[list] = None
    """Their names in class-id order, when known."""

    @property
    def input_name(self):
        """The name of the only input (ConfigError for several)."""
        if len(self.inputs) != 1:
            raise ConfigError(f"this model builder takes one input, but the data provides "
                              f"{len(self.inputs)}: {sorted(self.inputs)}; map one with "
                              f"data.features in a --config file.")
        return next(iter(self.inputs))

    @property
    def input_shape(self):
        return tuple(self.inputs[self.input_name]["shape"])

    @property
    def input_dtype(self):
        """The dtype the records store for the only input ("uint8",
        "float32"...), or None where the description has none."""
        return self.inputs[self.input_name].get("dtype")

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, obj):
        return cls(**{f.name: obj.get(f.name) for f in dataclasses.fields(cls)
                      if f.name in obj})


def describe(manifest, data_config):
    """The :class:`DataInfo` of a dataset's manifest under an experiment's
    data config (its feature mapping and label)."""
    schema = manifest.schema
    mapping = feature_map(schema, data_config.features, data_config.label)
    label = schema.get(data_config.label) if data_config.label else None
    labels = (manifest.labels or {}).get(data_config.label) or {}
    return DataInfo(
        inputs={name: {"shape": list(schema[feature].shape), "dtype": schema[feature].dtype}
                for name, feature in mapping.items()},
        label_shape=list(label.shape) if label is not None else [],
        num_classes=labels.get("num_classes"), class_names=labels.get("class_names"))


def call_with_data(fn, args, data):
    """Calls ``fn(*args, data)`` when ``fn`` takes one positional argument
    more than ``args``, else ``fn(*args)``: builders and metric functions may
    or may not want the :class:`DataInfo`."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return fn(*args)
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    wants_data = len(positional) > len(args) or any(
        p.kind == p.VAR_POSITIONAL for p in parameters)
    return fn(*args, data) if wants_data else fn(*args)
