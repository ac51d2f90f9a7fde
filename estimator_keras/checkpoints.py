"""Finding and reading the checkpoints of every engine: which a model dir
holds, which step and engine wrote one, whether it fits a model, and the one
correct way to load a TensorFlow checkpoint into Keras.

The estimator and keras engines write object-based TensorFlow checkpoints
whose weight keys are the model's
(``layer_with_weights-N/kernel/.ATTRIBUTES/VARIABLE_VALUE``); the Estimator
adds its ``estimator_global_step``, the keras engine its optimizer's
``iter``. The keras3 engine writes Keras 3 weights files instead
(:mod:`estimator_keras.engines.keras3_checkpoints`). Every guarantee that
reads a model dir (the refusal of changed settings, the engine ``auto``
continues with, the Keras 2 engines' refusal of a keras3 dir) asks
:func:`any_checkpoint` or :func:`engine_of`, which know both kinds.

An Estimator checkpoint loads correctly into Keras only into an *uncompiled*
model with ``model.load_weights(prefix)``: ``tf.train.Checkpoint(model=m).restore``
silently restores wrong weights.

TensorFlow is imported by the functions that read a TensorFlow checkpoint:
whether the keras3 engine has checkpointed is known without it, before
:func:`estimator_keras.engines.prepare_keras` has chosen tf.keras.
"""

import os
import tempfile

from estimator_keras import io
# The keras3 engine's file format alone, not the engine registry (which imports this module).
import estimator_keras.engines.keras3_checkpoints as keras3_checkpoints
from estimator_keras.errors import CheckpointMismatchError, EngineMismatchError, ModelDirError

# pylint: disable=import-outside-toplevel  (TensorFlow, where a TF checkpoint is read)

_STEP_KEYS = ("estimator_global_step/.ATTRIBUTES/VARIABLE_VALUE", "global_step",
              "optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE",
              "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE")
_ESTIMATOR_STEP = _STEP_KEYS[0]


def tf_checkpoint(model_dir):
    """The newest TensorFlow checkpoint prefix (estimator or keras engine)
    in ``model_dir``, or None."""
    import tensorflow as tf
    return tf.train.latest_checkpoint(str(model_dir))


def keras3_checkpoint(model_dir):
    """The keras3 engine's newest checkpoint (a Keras 3 weights file) in
    ``model_dir``, or None; read from its file names, without Keras 3 or
    TensorFlow."""
    return keras3_checkpoints.find(model_dir)


def any_checkpoint(model_dir):
    """The newest checkpoint of any engine in ``model_dir`` (the keras3
    engine's first: it continues a TF checkpoint beside it and writes its own
    at once), or None. Imports TensorFlow unless a keras3 checkpoint is there."""
    return keras3_checkpoint(model_dir) or tf_checkpoint(model_dir)


def engine_of(model_dir):
    """"estimator", "keras" or "keras3": the engine that wrote
    ``model_dir``'s newest checkpoint, or None where there is none. A model
    dir the keras3 engine has written to is keras3's (known without
    TensorFlow); others import TensorFlow."""
    if keras3_checkpoints.present(model_dir):
        return "keras3"
    latest = tf_checkpoint(model_dir)
    return checkpoint_engine(latest) if latest else None


def latest_checkpoint(model_dir):
    """The newest TensorFlow checkpoint prefix in ``model_dir``; ModelDirError
    if none (saying so when the keras3 engine's checkpoints are there instead)."""
    ckpt = tf_checkpoint(model_dir)
    if ckpt is None:
        check_not_keras3(model_dir, "estimator or keras")
        raise ModelDirError(f"{model_dir} holds no checkpoint: train first "
                            f"(`python -m experiments train ... --model-dir {model_dir}`).")
    return ckpt


def checkpoint_step(checkpoint):
    """The training step stored in a checkpoint of either engine (or of
    Keras' BackupAndRestore, which nests the model one level deeper), or None."""
    import tensorflow as tf
    reader = tf.train.load_checkpoint(checkpoint)
    for key in _STEP_KEYS:
        if reader.has_tensor(key):
            return int(reader.get_tensor(key))
    for key in reader.get_variable_to_shape_map():
        if key.endswith(tuple("/" + k for k in _STEP_KEYS[2:])):
            return int(reader.get_tensor(key))
    return None


def checkpoint_engine(checkpoint):
    """"estimator" or "keras": which engine wrote ``checkpoint``."""
    import tensorflow as tf
    reader = tf.train.load_checkpoint(checkpoint)
    return "estimator" if reader.has_tensor(_ESTIMATOR_STEP) else "keras"


def check_estimator_can_restore(checkpoint):
    """The Estimator restores only its own checkpoints (it needs its global
    step there); the keras engine restores both. Raises ModelDirError for a
    keras-engine checkpoint, saying what works instead."""
    if checkpoint_engine(checkpoint) == "keras":
        model_dir = io.parent(checkpoint)
        raise ModelDirError(
            f"{model_dir} was trained by the keras engine, and tf.estimator cannot restore "
            f"its checkpoint {checkpoint} (it has no estimator_global_step). Use --engine "
            f"keras for this model dir, or start a new --model-dir; the weights move between "
            f"engines as {io.join(model_dir, 'export', 'weights.h5')}.")


def check_not_keras3(model_dir, engine):
    """Raises ModelDirError when the keras3 engine has checkpointed in
    ``model_dir``: the Keras 2 engines cannot read Keras 3 weights files, and
    resuming from an older TensorFlow checkpoint beside them would lose its
    steps. The message says what to use instead."""
    found = keras3_checkpoint(model_dir)
    if found is None:
        return
    raise EngineMismatchError(
        f"{model_dir} was trained by the keras3 engine (Keras 3): its checkpoint {found} is a "
        f"Keras 3 weights file, which the {engine} engine (Keras 2) cannot restore. Continue "
        f"this model dir with --engine keras3, or move the weights to a new --model-dir by "
        f"hand: {io.join(model_dir, 'export', 'weights.h5')} (every keras3 export writes it) "
        f"loads into the same builder's Keras 2 model with model.load_weights(path).")


def _model_checkpoint_keys(model):
    """Checkpoint key -> shape for each weight, as object-based checkpoints
    name them (``layer_with_weights-N/kernel/...``)."""
    import tensorflow as tf
    keys = {}
    with tempfile.TemporaryDirectory() as tmp:
        prefix = tf.train.Checkpoint(model=model).write(os.path.join(tmp, "probe"))
        reader = tf.train.load_checkpoint(prefix)
        for key, shape in reader.get_variable_to_shape_map().items():
            # The weights only: a compiled model also carries its optimizer.
            if (key.startswith("model/") and "OPTIMIZER_SLOT" not in key
                    and not key.startswith("model/optimizer/")):
                keys[key[len("model/"):]] = tuple(shape)
    return keys


def check_compatible(model, checkpoint):
    """Raises ModelDirError naming every weight missing from ``checkpoint`` or
    of another shape there."""
    import tensorflow as tf
    wanted = _model_checkpoint_keys(model)
    try:
        have = tf.train.load_checkpoint(checkpoint).get_variable_to_shape_map()
    except (tf.errors.OpError, ValueError) as e:
        raise ModelDirError(f"cannot read checkpoint {checkpoint}: {e}") from e
    have = {k: tuple(v) for k, v in have.items()}
    missing = sorted(k for k in wanted if k not in have)
    mismatched = sorted(f"{k.split('/.ATTRIBUTES')[0]}: model {wanted[k]}, checkpoint {have[k]}"
                        for k in wanted if k in have and have[k] != wanted[k])
    # Layer weights the checkpoint holds and the model does not.
    unexpected = sorted(k for k in have if k.startswith("layer") and k not in wanted
                        and "OPTIMIZER_SLOT" not in k and k.endswith("VARIABLE_VALUE"))
    if missing or mismatched or unexpected:
        raise CheckpointMismatchError(checkpoint, mismatched, [k.split("/.ATTRIBUTES")[0] for k in missing],
                           [k.split("/.ATTRIBUTES")[0] for k in unexpected])


def load_checkpoint_into(model, checkpoint):
    """Restores a checkpoint of either engine into an uncompiled Keras model,
    after :func:`check_compatible`."""
    check_compatible(model, checkpoint)
    status = model.load_weights(checkpoint)
    status.assert_existing_objects_matched().expect_partial()
    return model
