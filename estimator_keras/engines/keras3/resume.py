"""Where a keras3 run starts: its own checkpoint, another engine's
TensorFlow checkpoint (weights, step and, where they can move, the
optimizer's slots), or, in a JAX process group, process 0's choice,
broadcast to every process.

Example::

    step = restore(model, checkpoint, log)      # a compiled model
    start = start_at(model, plan, step)         # where the optimizer's count started
"""

import keras
import numpy as np

from estimator_keras.engines import optimizers
from estimator_keras.engines.keras3 import checkpoints as ckpts
from estimator_keras.engines.keras3 import seeds
from estimator_keras.errors import ModelDirError


def iterations(model):
    """The optimizer's own step count."""
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


class StartingAt(keras.optimizers.schedules.LearningRateSchedule):
    """``schedule`` at the run's step for an optimizer whose own count
    started at step ``start``: a learning rate that goes on where it was
    while the optimizer's bias correction starts afresh."""

    def __init__(self, schedule, start):
        self.schedule, self.start = schedule, int(start)

    def __call__(self, step):
        return self.schedule(step + self.start)

    def get_config(self):
        return {"schedule": keras.optimizers.schedules.serialize(self.schedule),
                "start": self.start}


def tf_checkpoint(model_dir):
    """The newest TensorFlow checkpoint (estimator or keras engine), or None."""
    from estimator_keras import checkpoints  # pylint: disable=import-outside-toplevel
    return checkpoints.tf_checkpoint(model_dir)


def checkpoint_step(checkpoint):
    """The step of a keras3 checkpoint or of another engine's TF checkpoint
    (None where a TF checkpoint does not hold one)."""
    if ckpts.is_checkpoint(checkpoint):
        return ckpts.step_of(checkpoint)
    from estimator_keras import checkpoints  # pylint: disable=import-outside-toplevel
    return checkpoints.checkpoint_step(checkpoint)


def restore(model, checkpoint, log=None):
    """Loads a keras3 checkpoint, or a TensorFlow checkpoint of another
    engine (weights, the step and the optimizer's slots), into a compiled
    model; returns the run's step. A keras3 checkpoint gives back the random
    layers' seed states too (:mod:`.seeds`); ``log`` hears of those it lacks.

    Where another engine's optimizer state cannot move (Keras 3's optimizer
    would not take Keras 2's steps from it, other settings, another
    optimizer's slots: see
    :func:`~estimator_keras.engines.keras3.migration.restore_optimizer_state`),
    the optimizer starts afresh, its own count from 0, so that its bias
    correction matches its empty averages, while the run's step goes on
    (:func:`start_at`); ``log`` hears it once, with the reason."""
    if ckpts.is_checkpoint(checkpoint):
        step = ckpts.restore(model, checkpoint)
        missed = seeds.restore(model, checkpoint)
        if missed and log is not None:
            log(f"{checkpoint} holds no seed state of the random layers {', '.join(missed)} "
                f"(or of other ones): their draws start over, so this run is not bit-identical "
                f"to one never stopped")
        return step
    # Another helper's module: imported only where a TF checkpoint is met.
    from estimator_keras.engines.keras3 import migration  # pylint: disable=import-outside-toplevel
    step = int(migration.restore_tf_checkpoint(model, checkpoint))
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    lost = migration.restore_optimizer_state(model, checkpoint)
    if lost:
        if log is not None:
            log(f"the optimizer starts afresh at step {step}: {lost}; its own step count "
                f"(bias correction) starts at 0 while the run's step and learning rate go on "
                f"(to keep its state, continue with the engine that wrote the checkpoint)")
    else:
        model.optimizer.iterations.assign(step)
    return step


def start_at(model, plan, step):
    """Where the optimizer's own count started (see :func:`restore`); a
    learning-rate schedule then reads the run's step, not the optimizer's."""
    start = step - iterations(model)
    if start:
        learning_rate = optimizers.keras3_learning_rate(plan.learning_rate)
        if isinstance(learning_rate, keras.optimizers.schedules.LearningRateSchedule):
            model.optimizer.learning_rate = StartingAt(learning_rate, start)
    return start


def chosen_step(checkpoint):
    """The step a run continues from ``checkpoint``; -1 for none."""
    if not checkpoint:
        return -1
    return checkpoint_step(checkpoint) or 0


def from_process_0(model, plan, group, checkpoint, step, build):
    """Gives every process of ``group`` process 0's state: its checkpoint
    (``checkpoint``, of ``step``; -1 for none), restored by process 0 alone
    into a model of its own (``build(plan)`` makes it), then broadcast into
    ``model``'s weights, seeds and optimizer in every process, so that no
    process restores from its model dir but process 0. Returns (step, the step the
    optimizer's count started at)."""
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    state = list(model.variables) + list(model.optimizer.variables)
    values = [keras.ops.convert_to_numpy(v) for v in state]
    error = None
    if checkpoint:
        try:
            values = _restored_alone(plan, group, checkpoint, state, build)
        except Exception as e:  # pylint: disable=broad-except  (raised below, once all know)
            error = e
    # A failure on process 0 stops every process, rather than leave them
    # waiting for its values.
    if group.from_process_0(np.int32(error is not None)).item():
        if error is not None:
            raise error
        raise ModelDirError("process 0 could not restore its checkpoint (its log says why); "
                            "this process stops with it.")
    values = group.from_process_0(values)
    for variable, value in zip(state, values):
        variable.assign(value)
    if step >= 0:
        where = checkpoint or "process 0's checkpoint"
        plan.hooks.log(f"resuming from {where} (step {step}, process 0's choice)")
    return max(step, 0), start_at(model, plan, max(step, 0))


def _restored_alone(plan, group, checkpoint, state, build):
    """``checkpoint`` restored into a model of this process alone (assigning
    to the group's variables is a collective): the values of ``state``, the
    group model's variables, in its order."""
    with group.alone():
        own = build(plan)
        restore(own, checkpoint, plan.hooks.log)
        if not own.optimizer.built:
            own.optimizer.build(own.trainable_variables)
        restored = list(own.variables) + list(own.optimizer.variables)
    if [tuple(v.shape) for v in restored] != [tuple(v.shape) for v in state]:
        raise ModelDirError(
            f"checkpoint {checkpoint} restored into {len(restored)} variables, where the "
            f"model trained across processes has {len(state)}, or of other shapes: the "
            f"model builder does not build the same model twice.")
    return [keras.ops.convert_to_numpy(v) for v in restored]
