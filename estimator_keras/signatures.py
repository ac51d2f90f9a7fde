"""The SavedModel signatures every export carries, whatever Keras built the
model: ``serving_default`` on raw inputs keyed by the model's input names,
and, with a schema, ``serve_examples`` on serialized tf.train.Example
strings. A classifier given its class names also returns ``class_name``."""

import tensorflow as tf

from estimator_keras.inputs import parse_examples_fn
from estimator_keras.model_inputs import bind_inputs
from estimator_keras.schema import feature_map


def serving_signatures(call, specs, output_names, output_shapes, *, schema=None,
                       features=None, class_names=None, autograph=True):
    """Signature name -> tf.function.

    Args:
      call: inputs dict -> the model's output or list of outputs.
      specs: input name -> ``tf.TensorSpec`` of one batch.
      output_names, output_shapes: the model's outputs, in order.
      schema, features: the dataset's schema and the input -> feature map
        of ``serve_examples`` (default: each input reads its own name).
      class_names: the label's class names in class-id order.
      autograph: False where ``call`` must be traced as written (Keras 3).
    """
    names = _class_names(output_shapes, class_names)

    def outputs(inputs):
        result = call(inputs)
        if not isinstance(result, (list, tuple)):
            result = [result]
        result = dict(zip(output_names, result))
        if names is not None:
            result["class_name"] = tf.gather(
                names, tf.argmax(result[output_names[0]], axis=-1))
        return result

    @tf.function(input_signature=[specs], autograph=autograph)
    def serve_raw(inputs):
        return outputs(inputs)

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


def _class_names(output_shapes, class_names):
    """The names as a string tensor when the model is a classifier over
    exactly those classes (one output of shape (batch, classes)), else None."""
    if not class_names or len(output_shapes) != 1:
        return None
    shape = tuple(output_shapes[0])
    if len(shape) != 2 or shape[-1] != len(class_names):
        return None
    return tf.constant([str(n) for n in class_names])
