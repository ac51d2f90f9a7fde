"""Continuing an estimator or keras engine model dir on Keras 3.

Both Keras 2 engines write object-based TensorFlow checkpoints whose weight
keys follow the model's structure: ``layer_with_weights-N/<attribute>/...``
for the N-th layer that has weights, nested the same way for a model used
as a layer (see :mod:`estimator_keras.checkpoints`). Keras 3 cannot restore
them itself (its variables are not TensorFlow trackables on JAX, and its
checkpoints are ``.weights.h5`` files), so :func:`restore_tf_checkpoint`
reads them with ``tf.train.load_checkpoint`` and assigns each value to the
Keras 3 variable at the same place, on either backend: the N-th layer with
weights, matched within the layer by weight name and shape.

The optimizer's state moves too (:func:`restore_optimizer_state`): both
Keras 2 engines train with ``tf.keras.optimizers.legacy`` (the keras
engine too: tf-keras builds the legacy class from a config with a learning
rate), whose slots sit under each weight's key
(``.../kernel/.OPTIMIZER_SLOT/optimizer/m``), and each goes to the Keras 3
optimizer's variable for the same weight and the same quantity
(:data:`SLOTS`). With the step that gives the optimizer's own iteration
count, the next updates on Keras 3 are the ones the source engine would have
made, where Keras 3's optimizer computes the same function of its state as
Keras 2's: Adam (and AMSGrad), SGD (with momentum, Nesterov too), RMSprop
with momentum (centered or not), Adamax, Adadelta and Ftrl. Where it does
not, no state can make it so, and the state is refused with the reason
(:func:`why_not_exact`): Nadam's momentum schedule, RMSprop without
momentum's epsilon. Adagrad's epsilon differs too, by less than float32's
rounding while its accumulators stay large (they only grow), which is
checked. Where the state is refused, the keras3 engine starts the optimizer
afresh, its own count at 0, while the run's step goes on (see
:func:`estimator_keras.engines.keras3.resume.restore`). The reverse, a
Keras 2 engine on a keras3 model dir, is refused by
:func:`estimator_keras.engines.model_dirs.check_can_continue`.

Example::

    model = build_model()                      # Keras 3, compiled
    step = restore_tf_checkpoint(model, tf.train.latest_checkpoint(model_dir))
    model.optimizer.build(model.trainable_variables)
    model.optimizer.iterations.assign(step)
    restore_optimizer_state(model, tf.train.latest_checkpoint(model_dir))
"""

import numpy as np
import tensorflow as tf

from estimator_keras import checkpoints
from estimator_keras.errors import CheckpointMismatchError, ModelDirError

_VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"
_SLOT = "/.OPTIMIZER_SLOT/optimizer/"

# Keras 3 optimizer class -> {legacy Keras 2 slot name: the suffix of Keras
# 3's variable for the same quantity} (Keras 3 names a slot
# ``<weight path with _>_<suffix>``). Nadam is left out: see _NADAM.
SLOTS = {
    "Adam": {"m": "momentum", "v": "velocity", "vhat": "velocity_hat"},
    "Adamax": {"m": "momentum", "v": "norm"},
    "RMSprop": {"rms": "velocity", "momentum": "momentum", "mg": "average_gradient"},
    "Adagrad": {"accumulator": "accumulator"},
    "Adadelta": {"accum_grad": "accumulated_grad", "accum_var": "accumulated_delta_var"},
    "Ftrl": {"accumulator": "accumulator", "linear": "linear"},
    "SGD": {"momentum": "momentum"},
}

# Hyperparameters a legacy optimizer checkpoints (``optimizer/<name>``) under
# the name Keras 3's optimizer config gives them. Its epsilon, ``centered``,
# ``nesterov`` and Ftrl's l2 shrinkage are Python values it does not save.
_HYPERPARAMETERS = ("beta_1", "beta_2", "rho", "momentum", "learning_rate_power",
                    "l1_regularization_strength", "l2_regularization_strength", "beta")

# Why no state of the Keras 2 optimizer makes Keras 3's take its next steps
# (tf-keras 2.15-2.21 optimizers/legacy against Keras 3's optimizers).
_NADAM = ("Keras 2's Nadam schedules its momentum as beta_1 * (1 - 0.5 * 0.96 ** (0.004 * t)) "
          "and Keras 3's as beta_1 * (1 - 0.5 * 0.96 ** t): no state gives Keras 3's Nadam "
          "Keras 2's next steps")
_RMSPROP = ("Keras 2's RMSprop without momentum divides by sqrt(v) + epsilon and Keras 3's by "
            "sqrt(v + epsilon): no state gives Keras 3's RMSprop Keras 2's next steps (with "
            "momentum both divide by sqrt(v + epsilon), and the state moves)")
# Adagrad: Keras 2 divides by sqrt(a) + epsilon, Keras 3 by sqrt(a + epsilon).
# Carried while the two differ by at most this, relatively (a few float32
# roundings, what TensorFlow's kernels and Keras 3's ops differ by anyway).
ADAGRAD_TOLERANCE = 1e-6


def restore_tf_checkpoint(model, checkpoint_path):
    """Loads the weights of an estimator or keras engine checkpoint (a
    prefix, or a model dir: its latest) into the Keras 3 ``model``; returns
    the checkpoint's global step (0 when it records none).

    Raises:
      ModelDirError: the checkpoint is unreadable, or does not fit the model
        (see :func:`check_tf_checkpoint`); nothing is assigned then.
    """
    checkpoint_path, reader, matched = _plan(model, checkpoint_path)
    for variable, key in matched:
        variable.assign(reader.get_tensor(key + _VALUE).astype(_numpy_dtype(variable)))
    return int(checkpoints.checkpoint_step(checkpoint_path) or 0)


def restore_optimizer_state(model, checkpoint_path):
    """Assigns the optimizer slots of an estimator or keras engine
    checkpoint to the built optimizer of the compiled Keras 3 ``model``
    (weights restored first, with :func:`restore_tf_checkpoint`).

    Returns None when every slot was carried, so that the optimizer's next
    updates (at the checkpoint's step) are the source engine's; otherwise
    assigns none of them and returns a sentence saying why: an optimizer
    whose Keras 3 update differs from Keras 2's (:func:`why_not_exact`),
    other settings than the checkpoint's (a hyperparameter, or slots one
    side keeps and the other does not), or another optimizer's checkpoint.
    """
    checkpoint_path, reader, matched = _plan(model, checkpoint_path)
    optimizer = model.optimizer
    kind = type(optimizer).__name__
    have = reader.get_variable_to_shape_map()
    reason = why_not_exact(kind, optimizer.get_config(), reader)
    if reason:
        return reason
    names = SLOTS[kind]
    kept = {variable.name: variable for variable in optimizer.variables}
    trainable = {id(variable) for variable in model.trainable_variables}
    pairs, missing, unused = [], [], set()
    for variable, key in matched:
        if id(variable) not in trainable:
            continue
        prefix = str(variable.path).replace("/", "_")
        saved = {k[len(key + _SLOT):-len(_VALUE)] for k in have
                 if k.startswith(key + _SLOT) and k.endswith(_VALUE)}
        for old, new in names.items():
            slot = kept.get(f"{prefix}_{new}")
            if slot is None:
                # A slot these settings do not use (amsgrad, momentum 0,
                # not centered): the checkpoint must not hold it either.
                continue
            saved.discard(old)
            slot_key = key + _SLOT + old + _VALUE
            if slot_key in have and tuple(have[slot_key]) == tuple(slot.shape):
                pairs.append((slot, slot_key))
            else:
                missing.append(slot_key)
        unused.update(saved)
    if missing:
        return (f"checkpoint {checkpoint_path} lacks {len(missing)} of the {kind} optimizer's "
                f"slots (was it trained with another optimizer or other settings?), "
                f"e.g. {missing[0]}")
    if unused:
        return (f"checkpoint {checkpoint_path} holds optimizer slots ({', '.join(sorted(unused))}) "
                f"that this Keras 3 {kind} does not keep: it was trained with another optimizer "
                f"or other settings (momentum, centered, amsgrad)")
    values = [(slot, reader.get_tensor(slot_key)) for slot, slot_key in pairs]
    if kind == "Adagrad":
        reason = _adagrad_reason(optimizer.get_config()["epsilon"],
                                 [value for _, value in values])
        if reason:
            return reason
    for slot, value in values:
        slot.assign(value.astype(_numpy_dtype(slot)))
    return None


def why_not_exact(kind, config, reader):
    """Why the state of the legacy Keras 2 optimizer in a checkpoint
    (``reader``, from ``tf.train.load_checkpoint``) cannot give Keras 3's
    ``kind`` optimizer (of ``config``) the next steps Keras 2's would take,
    judged from the checkpoint's hyperparameters; None where it can."""
    have = reader.get_variable_to_shape_map()

    def hyper(name):
        key = "optimizer/" + name + _VALUE
        return float(reader.get_tensor(key)) if key in have else None

    if any(k.startswith("optimizer/_variables/") for k in have):
        return ("the checkpoint holds a tf-keras v2.11+ optimizer's variables, kept by "
                "position rather than by weight; only the slots of tf.keras.optimizers.legacy "
                "optimizers (which the estimator and keras engines train with) move")
    if kind == "Nadam":
        return _NADAM
    if kind not in SLOTS:
        return f"the {kind} optimizer's state has no mapping from Keras 2"
    decay = hyper("decay")
    if decay:
        return (f"the Keras 2 optimizer decays its learning rate as lr / (1 + decay * t), "
                f"decay={decay:g}, which no Keras 3 optimizer does")
    if kind == "RMSprop" and not hyper("momentum"):
        return _RMSPROP
    for name in _HYPERPARAMETERS:
        saved = hyper(name)
        if saved is None or name not in config:
            continue
        if abs(saved - float(config[name])) > 1e-6 * max(1.0, abs(saved)):
            return (f"the checkpoint's optimizer has {name}={saved:.6g} and this Keras 3 {kind} "
                    f"{name}={float(config[name]):.6g}: its state belongs to other settings")
    return None


def _adagrad_reason(epsilon, accumulators):
    """Why Keras 3's Adagrad (dividing by sqrt(a + epsilon)) would not take
    Keras 2's steps (dividing by sqrt(a) + epsilon) from these accumulators;
    None where the two agree within ADAGRAD_TOLERANCE for every accumulator
    from the smallest on (accumulators only grow)."""
    smallest = min((float(np.min(a)) for a in accumulators if np.size(a)), default=1.0)

    def gap(a):
        return abs((np.sqrt(a) + epsilon) / np.sqrt(a + epsilon) - 1.0)

    # |gap| falls from the smallest accumulator to ~0.25, then rises to a
    # small peak at 1 and falls again.
    worst = max(gap(max(smallest, 0.0)), gap(max(smallest, 1.0)))
    if worst <= ADAGRAD_TOLERANCE:
        return None
    return (f"Keras 2's Adagrad divides by sqrt(a) + epsilon and Keras 3's by sqrt(a + epsilon), "
            f"which differ by {worst:.2g} relative at this checkpoint's smallest accumulator "
            f"({smallest:.3g}), more than {ADAGRAD_TOLERANCE:g}")


def check_tf_checkpoint(model, checkpoint_path):
    """Raises ModelDirError unless the estimator or keras engine checkpoint
    fits the Keras 3 ``model``, naming every weight missing, extra, or of
    another shape with its checkpoint key and the model's layer; assigns
    nothing (the check before any work; restoring checks again)."""
    _plan(model, checkpoint_path)


def _plan(model, checkpoint_path):
    """(checkpoint prefix, its reader, [(variable, checkpoint key)]) for
    every weight of ``model``; ModelDirError when they do not all fit."""
    checkpoint_path = str(checkpoint_path)
    if tf.io.gfile.isdir(checkpoint_path):
        checkpoint_path = checkpoints.latest_checkpoint(checkpoint_path)
    try:
        reader = tf.train.load_checkpoint(checkpoint_path)
    except (tf.errors.OpError, ValueError) as e:
        raise ModelDirError(f"cannot read checkpoint {checkpoint_path}: {e}") from e
    have = {k[:-len(_VALUE)]: tuple(shape)
            for k, shape in reader.get_variable_to_shape_map().items()
            if k.endswith(_VALUE) and "OPTIMIZER_SLOT" not in k}
    matched, missing, mismatched, used = [], [], [], set()
    for prefix, layer in _layers_with_weights(model):
        _match_layer(prefix, layer, have, matched, missing, mismatched, used)
    # Layer weights the checkpoint holds and the model does not.
    unexpected = sorted(k for k in have if k.startswith("layer_with_weights-") and k not in used)
    if missing or mismatched or unexpected:
        raise CheckpointMismatchError(checkpoint_path, mismatched, missing, unexpected)
    return checkpoint_path, reader, matched


def _layers_with_weights(model, prefix=""):
    """(checkpoint key prefix, layer) of each layer with weights, as Keras 2
    numbers them: ``layer_with_weights-N`` over the model's layers in order;
    a nested model's layers one level down."""
    index = 0
    for layer in model.layers:
        if not layer.weights:
            continue
        yield f"{prefix}layer_with_weights-{index}", layer
        index += 1


def _match_layer(prefix, layer, have, matched, missing, mismatched, used):
    """Pairs each weight of ``layer`` with its checkpoint key under
    ``prefix``; records what does not fit, and in ``used`` each key a
    weight of the model claimed (fitting or not)."""
    if hasattr(layer, "layers") and layer.layers:
        for sub_prefix, sub in _layers_with_weights(layer, prefix + "/"):
            _match_layer(sub_prefix, sub, have, matched, missing, mismatched, used)
        return
    keys = [k for k in have if k.startswith(prefix + "/")]
    for variable in layer.weights:
        where = f"{prefix}/{variable.name} (layer {layer.name!r})"
        key = _key_for(variable, keys)
        if key is None:
            missing.append(where)
            continue
        keys.remove(key)
        used.add(key)
        shape = tuple(variable.shape)
        if have[key] != shape:
            mismatched.append(f"{key} (layer {layer.name!r}): model {shape}, "
                              f"checkpoint {have[key]}")
            continue
        matched.append((variable, key))


def _key_for(variable, keys):
    """The checkpoint key of a Keras 3 weight among its layer's keys: the one
    ending in the weight's name (``kernel``, ``moving_mean``); when several
    sublayers have a weight of that name (attention's kernels), the one
    whose path names the same sublayer."""
    named = [k for k in keys if k.rsplit("/", 1)[-1] == variable.name]
    if len(named) <= 1:
        return named[0] if named else None
    parts = str(variable.path).split("/")
    owner = parts[-2] if len(parts) > 1 else ""
    owned = [k for k in named if owner and owner in k.rsplit("/", 2)[-2]]
    return owned[0] if len(owned) == 1 else None


def _numpy_dtype(variable):
    dtype = variable.dtype
    return getattr(dtype, "as_numpy_dtype", None) or str(dtype)
