"""The estimator engine's checkpoints: TensorFlow checkpoints of the Keras
model's weights plus the Estimator's ``estimator_global_step``, which is
how they are told from the keras engine's."""

from estimator_keras import io
from estimator_keras.errors import ModelDirError

STEP_KEY = "estimator_global_step/.ATTRIBUTES/VARIABLE_VALUE"


def claims(reader):
    """True for a checkpoint the Estimator wrote (``reader``: a
    ``tf.train.CheckpointReader``)."""
    return reader.has_tensor(STEP_KEY)


def check_can_restore(checkpoint):
    """The Estimator restores only its own checkpoints (it needs its global
    step there). Raises ModelDirError for another engine's, saying what
    works instead."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    if claims(tf.train.load_checkpoint(checkpoint)):
        return
    model_dir = io.parent(checkpoint)
    raise ModelDirError(
        f"{model_dir} was trained by the keras engine, and tf.estimator cannot restore "
        f"its checkpoint {checkpoint} (it has no estimator_global_step). Use --engine "
        f"keras for this model dir, or start a new --model-dir; the weights move between "
        f"engines as {io.join(model_dir, 'export', 'weights.h5')}.")
