"""Reading TensorFlow checkpoints: the newest in a model dir, the step one
holds, whether it fits a model, and the one correct way to load one into
Keras.

The estimator and keras engines write object-based TensorFlow checkpoints
whose weight keys are the model's
(``layer_with_weights-N/kernel/.ATTRIBUTES/VARIABLE_VALUE``), with the
step as the Estimator's global step or the optimizer's ``iter``. Which
engine wrote a model dir is the registry's question
(:mod:`estimator_keras.engines.model_dirs`), since an engine may keep
checkpoints of its own format.

An Estimator checkpoint loads correctly into Keras only into an *uncompiled*
model with ``model.load_weights(prefix)``: ``tf.train.Checkpoint(model=m).restore``
silently restores wrong weights.

TensorFlow is imported by the functions that read a checkpoint. Without it
installed, a model dir with a TensorFlow checkpoint is refused, by its file
names, rather than taken for an empty one.
"""

import importlib.util
import os
import tempfile

from estimator_keras import io
from estimator_keras.errors import CheckpointMismatchError, ConfigError, ModelDirError

# pylint: disable=import-outside-toplevel  (TensorFlow, where a TF checkpoint is read)

_STEP_KEYS = ("estimator_global_step/.ATTRIBUTES/VARIABLE_VALUE", "global_step",
              "optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE",
              "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE")


def tf_checkpoint(model_dir):
    """The newest TensorFlow checkpoint prefix (estimator or keras engine)
    in ``model_dir``, or None.

    Raises:
      ConfigError: TensorFlow is not installed and ``model_dir`` holds a
        TensorFlow checkpoint (its state file or an ``.index`` file).
    """
    if importlib.util.find_spec("tensorflow") is None:
        _refuse_without_tensorflow(model_dir)
        return None
    import tensorflow as tf
    return tf.train.latest_checkpoint(str(model_dir))


def _refuse_without_tensorflow(model_dir):
    model_dir = str(model_dir)
    found = sorted(io.glob(io.join(model_dir, "*.index")))
    state = io.join(model_dir, "checkpoint")
    if not found and not io.exists(state):
        return
    what = io.basename(found[-1])[:-len(".index")] if found else "its checkpoint state file"
    raise ConfigError(
        f"{model_dir} holds a TensorFlow checkpoint ({what}) of the estimator or keras engine, "
        f"and reading one needs TensorFlow, which is not installed here: pip install "
        f"tensorflow-cpu to continue it (the keras3 engine continues it on any backend), or "
        f"train into a fresh --model-dir.")


def latest_checkpoint(model_dir):
    """The newest TensorFlow checkpoint prefix in ``model_dir``; ModelDirError
    if none."""
    ckpt = tf_checkpoint(model_dir)
    if ckpt is None:
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
