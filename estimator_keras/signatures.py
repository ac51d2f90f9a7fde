"""The SavedModel signatures every export carries, whatever Keras built the
model and whatever its layers are called: ``serving_default`` on raw inputs
keyed by the experiment's feature names (the keys of ``data.features``,
``image`` by default) and, with a schema, ``serve_examples`` on serialized
tf.train.Example strings. Both return fixed keys: ``probabilities`` (the
model's one output; a logits model's with its softmax or sigmoid applied),
``class_id`` (the most probable class, where the output's last axis holds
classes) and, given the class names, ``class_name``; a model of several
outputs returns ``output_0``, ``output_1``, ... in its outputs' order.

Keras names an unnamed ``Input`` or layer from a per-process counter
(``keras_tensor_22``, ``dense_2``), so the model's own names differ from one
export of a checkpoint to the next; the signature never shows them.

TensorFlow is imported by the signatures alone: the names they take and
return are known without it (an export without TensorFlow has no
SavedModel, but lists them in export.json all the same)."""

from estimator_keras.errors import SchemaError
from estimator_keras.model_inputs import bind_inputs
from estimator_keras.schema import feature_map

PROBABILITIES = "probabilities"
CLASS_ID = "class_id"
CLASS_NAME = "class_name"


def serving_input_names(specs, schema=None, features=None):
    """Model input name -> the name its signature input takes: the key of
    the features mapping that feeds it (one input takes the one feature
    whatever it is called); the input's own name where no mapping fits."""
    if features is not None:
        mapping = feature_map({f: None for f in _values(features)}, features, label=None)
    elif schema is not None:
        mapping = feature_map(schema, None, label=None)
    else:
        mapping = None
    try:
        return bind_inputs(specs, mapping) if mapping else {n: n for n in specs}
    except SchemaError:
        return {n: n for n in specs}


def _values(features):
    if isinstance(features, dict):
        return list(features.values())
    return [features] if isinstance(features, str) else list(features)


def serving_output_names(output_shapes, class_names=None):
    """The keys the signatures return, in order."""
    if len(output_shapes) != 1:
        return [f"output_{i}" for i in range(len(output_shapes))]
    names = [PROBABILITIES]
    if _has_classes(output_shapes[0]):
        names.append(CLASS_ID)
    if _names_classes(output_shapes, class_names):
        names.append(CLASS_NAME)
    return names


def serving_signatures(call, specs, output_shapes, *, schema=None, features=None,
                       class_names=None, activation=None, autograph=True):
    """Signature name -> tf.function.

    Args:
      call: inputs dict keyed by the model's input names -> the model's
        output or list of outputs.
      specs: model input name -> ``tf.TensorSpec`` of one batch.
      output_shapes: the shapes of the model's outputs, in order.
      schema, features: the dataset's schema and the input -> feature map
        (``data.features``): its keys name the signature's inputs, its
        values the features ``serve_examples`` parses (default: each input
        reads its own name).
      class_names: the label's class names in class-id order.
      activation: "softmax" or "sigmoid" for a model that outputs logits
        (trained with ``from_logits``): applied to its output.
      autograph: False where ``call`` must be traced as written (Keras 3).
    """
    # pylint: disable=import-outside-toplevel  (see the module docstring)
    import tensorflow as tf

    from estimator_keras.inputs import parse_examples_fn

    names = (tf.constant([str(n) for n in class_names])
             if _names_classes(output_shapes, class_names) else None)
    served = serving_input_names(specs, schema, features)

    def outputs(inputs):
        result = call(inputs)
        if not isinstance(result, (list, tuple)):
            result = [result]
        if len(result) != 1:
            return {f"output_{i}": r for i, r in enumerate(result)}
        scores = result[0]
        if activation == "softmax":
            scores = tf.nn.softmax(scores, axis=-1)
        elif activation == "sigmoid":
            scores = tf.sigmoid(scores)
        out = {PROBABILITIES: scores}
        if _has_classes(output_shapes[0]):
            out[CLASS_ID] = tf.argmax(scores, axis=-1)
        if names is not None:
            out[CLASS_NAME] = tf.gather(names, tf.argmax(scores, axis=-1))
        return out

    raw_specs = {served[n]: tf.TensorSpec(shape=s.shape, dtype=s.dtype, name=served[n])
                 for n, s in specs.items()}

    @tf.function(input_signature=[raw_specs], autograph=autograph)
    def serve_raw(inputs):
        return outputs({n: inputs[served[n]] for n in specs})

    signatures = {"serving_default": serve_raw}
    if schema is not None:
        mapping = feature_map(schema, features, label=None) if features is not None else {
            n: n for n in specs}
        # Keyed by the model's inputs: one input takes the one feature by arity.
        mapping = {name: mapping[key] for name, key in bind_inputs(specs, mapping).items()}
        parse = parse_examples_fn(schema, mapping)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")],
                     autograph=autograph)
        def serve_examples(examples):
            inputs = parse(examples)
            return outputs({k: tf.cast(v, specs[k].dtype) for k, v in inputs.items()})

        signatures["serve_examples"] = serve_examples
    return signatures


def _has_classes(shape):
    shape = tuple(shape)
    return len(shape) >= 2 and shape[-1] is not None and shape[-1] > 1


def _names_classes(output_shapes, class_names):
    """Whether the model is a classifier over exactly ``class_names`` (one
    output of shape (batch, classes)): its signatures then return them."""
    if not class_names or len(output_shapes) != 1:
        return False
    shape = tuple(output_shapes[0])
    return len(shape) == 2 and shape[-1] == len(class_names)
