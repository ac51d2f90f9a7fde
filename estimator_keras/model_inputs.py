"""Which tensor each of a Keras model's inputs takes from the input pipeline.

The pipeline yields a dict of features keyed by feature name. A model of
several inputs takes it by name; a model of one input, functional or
Sequential, takes the one feature's tensor whatever either is called, since
Keras names an unnamed ``Input`` itself (``keras_tensor_3``, ``input_2``)
from a per-process counter. Every engine feeds its model through
:func:`as_model_inputs`; the runner checks the records against the model
with :func:`check_feature_keys` before training.
"""

import functools

from estimator_keras.errors import SchemaError


def input_tensors(model):
    """``model.inputs`` as a list, or None for a model whose inputs exist only
    once it is called (a subclassed model, a Sequential without an Input)."""
    try:
        tensors = model.inputs
    except (AttributeError, ValueError):  # Keras 3 raises where Keras 2 says None
        return None
    return list(tensors) if tensors else None


def input_names(model):
    """The names by which a functional model takes a dict of features, in
    the order of ``model.inputs``: Keras 2's ``input_names``; Keras 3 has
    none and matches dict keys to its input tensors' names."""
    names = getattr(model, "input_names", None)
    return list(names) if names is not None else [t.name for t in model.inputs]


# What a message suggests for mapping record features to a model's inputs.
FEATURES_HINT = "the features mapping ({model input name: record feature})"


def bind_inputs(names, feature_keys, hint=FEATURES_HINT):
    """Model input name -> the feature key that feeds it.

    A model of one input takes the one feature whatever either is called:
    Keras names an unnamed ``Input`` itself, from a per-process counter, so
    the model an engine builds may not carry the name the model checked
    against the records did. Several inputs are matched by name.

    Raises:
      SchemaError: several inputs whose names are not the features' keys,
        or one input and several features; ``hint`` says where the mapping
        is set.
    """
    names, keys = list(names), list(feature_keys)
    if len(names) == 1 and len(keys) == 1:
        return {names[0]: keys[0]}
    expected, given = set(names), set(keys)
    if expected == given:
        return {name: name for name in names}
    if len(names) == 1:
        raise SchemaError(
            f"the model takes one input ({names[0]!r}) but is given {len(keys)} features "
            f"{sorted(given)}: map only the feature it takes, with {hint}.")
    raise SchemaError(
        f"the model takes {len(names)} inputs, named {sorted(expected)}, and a model of several "
        f"inputs is fed by name, but the features are keyed {sorted(given)} (missing "
        f"{sorted(expected - given)}, unexpected {sorted(given - expected)}). Name the model's "
        f"inputs after the features (keras.Input(..., name=...) in the model builder), or key "
        f"the features by the inputs' names with {hint}.")


def check_feature_keys(model, feature_keys, hint=FEATURES_HINT):
    """The feature key of each of ``model``'s inputs (see :func:`bind_inputs`);
    SchemaError where the features do not fit the inputs, or where the
    model's inputs are unknown before it is called."""
    if input_tensors(model) is None:
        raise SchemaError(
            f"the model ({type(model).__name__}) has no inputs until it is called (a subclassed "
            f"model, or a Sequential that does not begin with an Input), so the records cannot "
            f"be checked against it: begin it with keras.Input(shape=...).")
    return bind_inputs(input_names(model), feature_keys, hint)


def one_input_feed(model):
    """For a model of exactly one input: ``fn(tensor)`` -> what it takes
    (the tensor; ``{key: tensor}`` for a model built on a dict of one
    Input). None for any other model."""
    tensors = input_tensors(model)
    if tensors is None or len(tensors) != 1:
        return None
    try:
        structure = model.input
    except (AttributeError, ValueError):  # Keras 3's Sequential has inputs, no input
        return lambda tensor: tensor
    if isinstance(structure, dict):
        (key,) = structure
        return lambda tensor: {key: tensor}
    return lambda tensor: tensor


def as_model_inputs(model, data):
    """``data`` (a dataset of feature dicts, or of ``(features, ...)``
    tuples) with its features as ``model`` takes them.

    A model of one input (functional or Sequential) and a dict of one
    feature: the feature's tensor, whatever the input and the feature are
    called (see :func:`bind_inputs`). Keras 3 would refuse or warn about a
    dict whose key is not the input's name, and ``model_to_estimator``
    refuses one. Anything else passes unchanged: a model of several inputs
    matches the dict by name."""
    feed = one_input_feed(model)
    spec = getattr(data, "element_spec", None)  # None: not a tf.data.Dataset
    if feed is None:
        return data
    if spec is None:
        # Another pipeline's dataset (Grain's) tells its structure only by
        # its elements: unwrap a dict of one feature as each one passes.
        return data.map(functools.partial(_one_feature, feed))
    features = spec[0] if isinstance(spec, tuple) else spec
    if not isinstance(features, dict) or len(features) != 1:
        return data
    (key,) = features

    def pick(*element):
        if len(element) == 1:
            return feed(element[0][key])
        return (feed(element[0][key]),) + element[1:]

    return data.map(pick)


def _one_feature(feed, element):
    """``element`` (features, or ``(features, ...)``) with a features dict of
    one key replaced by what ``feed`` makes of its value."""
    features, rest = (element[0], element[1:]) if isinstance(element, tuple) else (element, None)
    if isinstance(features, dict) and len(features) == 1:
        (features,) = features.values()
        features = feed(features)
    return features if rest is None else (features,) + tuple(rest)
