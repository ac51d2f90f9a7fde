"""The ``keras3`` engine: Keras 3's ``Model.fit`` (``import keras``) on the
TFRecord pipeline, on the backend that ``KERAS_BACKEND`` names (tensorflow
or jax).

It keeps the other engines' contract:

- the input is the plan's ``tf.data`` pipeline, which Keras 3 reads on every
  backend;
- a checkpoint in ``MODEL_DIR`` at the start and every ``eval_every_steps``
  steps (:mod:`~estimator_keras.engines.keras3_checkpoints`: Keras 3 weights
  files with the optimizer's state, the same on every backend), the newest
  ``keep_checkpoint_max`` kept;
- an evaluation after every checkpoint, reported to the plan's hooks, and
  TensorBoard scalars in ``train/`` and ``validation/`` of the summary dir;
- ``max_steps`` is exact (the optimizer's ``iterations``, plus the step its
  count started at where another engine's state could not move);
  evaluations stay on multiples of ``eval_every_steps`` after a resume from
  any step;
- :data:`MAX_STEPS_PER_EXECUTION` steps run in one call of Keras'
  compiled training function, or one fewer where an evaluation's window
  does not divide by it, the calls planned to end exactly at each
  evaluation and at ``max_steps`` (:class:`TrainingSteps`), whatever the
  cadence;
- a rerun resumes from the latest checkpoint (after a crash, a SIGKILL or a
  preemption), optimizer state included; a finished run trains nothing and
  reports its evaluation; a model dir that holds only a TensorFlow checkpoint
  of the estimator or keras engine continues at its step, with its
  optimizer's slots (:mod:`estimator_keras.keras3_migration`), or with a
  fresh optimizer where they cannot move (:func:`restore`);
- SIGTERM/SIGINT under the plan's PreemptionWatch: a checkpoint of the step
  just taken, then Preempted; a NaN or infinite loss: NumericalError;
- several processes on the JAX backend (the plan's strategy a
  :class:`~estimator_keras.distribute.jax_processes.DataParallelProcesses`):
  fit runs in its scope, each process on its own share of the training data;
  every process starts from process 0's checkpoint (process 0 restores it,
  then broadcasts the state), so no other process reads the model dir; each
  evaluates its share of the eval split and the metrics' states are summed
  (:class:`ShardedEvaluation`); the chief alone writes the checkpoints; the
  processes agree on the step a preemption stops at.

Example::

    engine = Keras3Engine()
    result = engine.train(TrainingPlan(model_dir="/tmp/run", build_model=build, ...))
    print(result.metrics, result.global_step)
"""

import collections
import contextlib
import importlib.util
import math
import warnings

import keras
import numpy as np

from estimator_keras import io, memory, model_inputs, summaries
from estimator_keras.distribute.jax_processes import DataParallelProcesses
from estimator_keras.engines import base, optimizers, preemption
from estimator_keras.engines import keras3_checkpoints as ckpts
from estimator_keras.errors import ConfigError, DataError, ModelDirError

# The two runs of the summaries, named as Keras' TensorBoard callback names them.
SUMMARY_SUBDIRS = ("train", "validation")

# Keras returns to Python (and to the callbacks) once per call of its compiled
# training function: a small model's step is mostly that return, so several
# steps go in one call. The callbacks see every this many steps at most, so a
# preemption's checkpoint waits for at most this many steps.
MAX_STEPS_PER_EXECUTION = 8


def _iterations(model):
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


def _step(model, start):
    """The run's step: the optimizer's own count, which started at ``start``
    (0 but where another engine's optimizer state could not move)."""
    return start + _iterations(model)


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


class TrainingSteps(keras.callbacks.Callback):
    """Counts the steps and sizes the calls: progress lines, the NaN check,
    the exact stop at ``max_steps`` and, with a PreemptionWatch, the
    checkpoint of the step just taken before Preempted.

    Keras runs whole calls of the model's ``steps_per_execution`` steps, so
    an epoch (``eval_every_steps`` steps) that the call length does not
    divide would overrun its evaluation. At each epoch's start this callback
    plans its calls (:func:`call_lengths`) so that they end exactly at the
    next evaluation or ``max_steps`` in as many calls as Keras makes, and
    before a shorter call it hands Keras a training function of that length
    (built once per length with Keras' ``make_train_function`` and kept),
    the full one after it. Every evaluation and checkpoint stays on its
    exact step at any cadence, and the calls run
    :data:`MAX_STEPS_PER_EXECUTION` steps, or one fewer.

    The model is held here rather than read from ``Callback.model``: on JAX
    that property copies the state back from the training loop at every
    read, so the state is touched only when it is needed (a stop or a
    preemption's save).
    """

    def __init__(self, plan, meter, last_checkpoint, model, start=0):
        super().__init__()
        self.plan, self.meter, self.last_checkpoint = plan, meter, last_checkpoint
        self.trained, self.start = model, start
        self.full = model.steps_per_execution
        self.agreement = (preemption.StopAgreement(plan.preemption, plan.strategy)
                          if plan.preemption is not None else None)
        self.functions = {}
        self.calls = collections.deque()
        self.step = self.call = 0

    def on_train_begin(self, logs=None):
        self.step = _step(self.model, self.start)
        # fit has made (or kept) the full-length function by now. The others
        # are made here too, while the model still holds its variables (on
        # JAX, fit takes them out of the model once its first call starts).
        self.functions.setdefault(self.full, self.trained.train_function)
        for steps in sorted(self._lengths() - set(self.functions)):
            self._use(steps)
        self._use(self.full)

    def _lengths(self):
        """Every call length the rest of the run takes (see call_lengths)."""
        every, last = self.plan.eval_every_steps, self.plan.max_steps
        if self.step >= last:
            return set()
        # The epochs: one up to the next multiple, whole ones, a last short one.
        first = self._epoch_end() - self.step
        whole, tail = divmod(last - self.step - first, every)
        lengths = set()
        for steps in (first, every if whole else 0, tail):
            if steps:
                lengths.update(call_lengths(steps, self.full))
        return lengths

    def _epoch_end(self):
        """The step the epoch running from here ends at: the next multiple of
        ``eval_every_steps``, or ``max_steps``."""
        every = self.plan.eval_every_steps
        return min((self.step // every + 1) * every, self.plan.max_steps)

    def on_epoch_begin(self, epoch, logs=None):
        self.calls = collections.deque(call_lengths(self._epoch_end() - self.step, self.full))

    def on_train_batch_begin(self, batch, logs=None):
        self.call = self.calls.popleft() if self.calls else self.full
        if self.call != self.full:
            self._use(self.call)

    def on_train_batch_end(self, batch, logs=None):
        # Keras calls this once per call of its training function.
        self.step += self.call
        if self.call != self.full:
            # Evaluations and the next epoch's iterator read the full length.
            self._use(self.full)
        # Keras has made the logs Python numbers already: checking every call is free.
        loss = self._finite_loss(logs)
        plan = self.plan
        # The meter writes a line each time a multiple of its steps is passed.
        self.meter.update(self.step, loss)
        if self.agreement is not None and self.agreement.stop_after(self.step):
            _save(self.model, plan, self.step, self.start)
            raise plan.preemption.stopped(self.step, by_chief=not plan.chief)
        if self.step >= plan.max_steps:
            self.model.stop_training = True

    def _use(self, steps):
        """Makes Keras' next calls run ``steps`` steps each."""
        model = self.trained
        model.steps_per_execution = steps
        function = self.functions.get(steps)
        if function is None:
            # Traced at its first call, while steps_per_execution says ``steps``.
            model.make_train_function(force=True)
            function = self.functions[steps] = model.train_function
        model.train_function = function

    def on_epoch_end(self, epoch, logs=None):
        # The epoch's mean loss, before its checkpoint is written.
        self._finite_loss(logs)

    def _finite_loss(self, logs):
        return base.finite_loss(logs, self.step, self.last_checkpoint)


class Evaluations(keras.callbacks.Callback):
    """After every epoch (``eval_every_steps`` steps, or fewer up to the next
    multiple or ``max_steps``): the checkpoint, the summaries, the reported
    evaluation and the early-stopping rule."""

    def __init__(self, plan, saved, start=0, group=None):
        super().__init__()
        self.plan, self.saved, self.start = plan, saved, start
        self.metrics = None
        self.stopped = False
        self.history = []
        # A group evaluates in shares, each process its own.
        self.sharded = ShardedEvaluation(plan, group) if group is not None else None
        self.writers = {}
        if plan.chief and importlib.util.find_spec("tensorboard") is not None:
            log_dir = plan.summary_dir or plan.model_dir
            self.writers = {sub: summaries.ScalarWriter(io.join(log_dir, sub))
                            for sub in SUMMARY_SUBDIRS}

    def on_epoch_end(self, epoch, logs=None):
        plan, logs = self.plan, logs or {}
        step = _step(self.model, self.start)
        saved = _save(self.model, plan, step, self.start)
        if plan.chief:
            self.saved = saved
        memory.release_free_memory()
        if self.sharded is not None:
            metrics = self.sharded(self.model)
        else:
            metrics = base.validation_metrics(logs)
        if self.writers:
            self.writers["train"].write({f"epoch_{k}": v for k, v in logs.items()
                                         if not k.startswith("val_")}, step)
            self.writers["validation"].write({f"epoch_{k}": v for k, v in metrics.items()}, step)
        if not metrics:
            return
        self.metrics = metrics
        stop = plan.early_stopping
        # Every process gets the same metrics, so all stop together; the
        # chief's hooks compute in its own process.
        with _alone(plan.strategy):
            stopping = base.record_evaluation(plan.hooks, step, metrics, self.saved,
                                              plan.chief, stop, self.history)
        if stopping:
            plan.hooks.log(f"early stopping at step {step}: {stop.metric} has not improved "
                           f"for {stop.patience_steps} steps")
            self.stopped = self.model.stop_training = True

    def close(self):
        for writer in self.writers.values():
            writer.close()


class ShardedEvaluation:
    """A JAX process group's evaluation: each process evaluates its share of
    the eval split (:func:`_eval_share`) alone, on a copy of the trained
    weights, and the metrics' states (Keras' totals, counts and confusion
    matrices, which add up) are summed over the processes. The numbers are
    those of one process evaluating the whole split, for 1/N of the work
    in each."""

    def __init__(self, plan, group):
        self.plan, self.group = plan, group
        with group.alone():
            self.model = compile_for_keras3(plan)
        self.data = _eval_share(plan, self.model, group)
        self.told = False

    def __call__(self, trained):
        weights = [keras.ops.convert_to_numpy(v) for v in trained.weights]
        model = self.model
        with self.group.alone(), _quiet_end_of_data():
            model.set_weights(weights)
            model.reset_metrics()
            model.evaluate(self.data, verbose=0)
            states = [v for metric in model.metrics for v in metric.variables]
            local = [keras.ops.convert_to_numpy(v) for v in states]
            totals = self.group.sum_over_processes(local)
            for variable, total in zip(states, totals):
                variable.assign(total)
            metrics = {k: float(v) for k, v in model.get_metrics_result().items()}
        if not self.told:
            self.told = True
            self._tell(local, totals, states)
        return metrics

    def _tell(self, local, totals, states):
        """Logs once what share of the examples this process evaluated (the
        loss's count of examples)."""
        loss = next((m for m in self.model.metrics if m.name == "loss"), None)
        count = getattr(loss, "count", None)
        if count is None:
            return
        index = next(i for i, v in enumerate(states) if v is count)
        self.plan.hooks.log(
            f"evaluation shared by {self.group.group.num_processes} processes: this one "
            f"evaluates {int(local[index])} of the {int(totals[index])} examples")


def call_lengths(steps, full):
    """The steps of each call that trains ``steps`` steps in as many calls as
    Keras makes for them (whole calls of ``full``: ``ceil(steps / full)``).
    Calls one step shorter than ``full`` absorb the remainder where there
    are enough of them, so that a run's shorter calls share one length (one
    more traced function, not one per remainder); else one short last call.

    Example::

        call_lengths(2001, 8)   # 244 calls of 8, then 7 of 7: 251 calls
        call_lengths(12, 8)     # [8, 4]
    """
    whole, left = divmod(int(steps), int(full))
    if not left:
        return [full] * whole
    if full > 1 and whole >= full - 1 - left:
        longer = whole + left - (full - 1)
        return [full] * longer + [full - 1] * (whole + 1 - longer)
    return [full] * whole + [left]


def _save(model, plan, step, start=0):
    """The checkpoint of ``step`` (the optimizer's count started at
    ``start``), written by the chief alone (its path; None elsewhere). In a
    JAX process group the chief saves outside the group's distribution:
    Keras builds a throwaway variable while saving, and built under the
    distribution it would wait for the other processes."""
    if not plan.chief:
        return None
    with _alone(plan.strategy):
        return ckpts.save(model, plan.model_dir, step, plan.keep_checkpoint_max,
                          optimizer_from=start)


def _alone(strategy):
    """Computes in this process only, inside a JAX process group's training."""
    if isinstance(strategy, DataParallelProcesses):
        return strategy.alone()
    return contextlib.nullcontext()


def _training_scope(strategy):
    """Where fit runs: a JAX process group's scope (Keras reads its
    distribution as it trains); a tf.distribute strategy is held by the
    variables it made, no scope needed."""
    if isinstance(strategy, DataParallelProcesses):
        return strategy.scope()
    return contextlib.nullcontext()


def compile_for_keras3(plan, steps_per_call=1):
    """The plan's model, compiled with a Keras 3 optimizer (``steps_per_call``
    steps per call of its training function); raises ConfigError when the
    builder returns something else than a Keras 3 model."""
    model = plan.build_model()
    if not isinstance(model, keras.Model):
        raise ConfigError(
            f"the keras3 engine needs a Keras 3 model (keras.Model, or tf.keras.Model where "
            f"tf.keras is Keras 3), but the model builder returned "
            f"{type(model).__module__}.{type(model).__name__}. Build it with `import keras` "
            f"or with tf.keras without TF_USE_LEGACY_KERAS=1, or use --engine keras for "
            f"Keras 2 models.")
    model.compile(optimizer=optimizers.keras3_optimizer(plan.optimizer, plan.learning_rate),
                  loss=plan.loss, metrics=plan.metrics(), steps_per_execution=steps_per_call)
    return model


def _tf_checkpoint(model_dir):
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
    model; returns the run's step.

    Where another engine's optimizer state cannot move (an optimizer
    without a mapping, or slots the checkpoint lacks), the optimizer starts
    afresh, its own count from 0, so that its bias correction matches its
    empty averages, while the run's step goes on (:func:`_step`); ``log``
    hears it once."""
    if ckpts.is_checkpoint(checkpoint):
        return ckpts.restore(model, checkpoint)
    # Another helper's module: imported only where a TF checkpoint is met.
    from estimator_keras import keras3_migration  # pylint: disable=import-outside-toplevel
    step = int(keras3_migration.restore_tf_checkpoint(model, checkpoint))
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    lost = keras3_migration.restore_optimizer_state(model, checkpoint)
    if lost:
        if log is not None:
            log(f"the optimizer starts afresh at step {step}: {lost}; its own step count "
                f"(bias correction) starts at 0 while the run's step and learning rate go on")
    else:
        model.optimizer.iterations.assign(step)
    return step


def _chosen_step(checkpoint):
    """The step a run continues from ``checkpoint``; -1 for none."""
    if not checkpoint:
        return -1
    return checkpoint_step(checkpoint) or 0


def _restore_from_process_0(model, plan, group, checkpoint, step):
    """Gives every process of ``group`` process 0's state: its checkpoint
    (``checkpoint``, of ``step``; -1 for none), restored by process 0 alone
    into a model of its own, then broadcast into ``model``'s weights, seeds
    and optimizer in every process, so that no process reads the model dir
    but process 0. Returns (step, the step the optimizer's count started
    at)."""
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    state = list(model.variables) + list(model.optimizer.variables)
    values = [keras.ops.convert_to_numpy(v) for v in state]
    error = None
    if checkpoint:
        try:
            values = _restored_alone(plan, group, checkpoint, state)
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
    return max(step, 0), _start_at(model, plan, max(step, 0))


def _restored_alone(plan, group, checkpoint, state):
    """``checkpoint`` restored into a model of this process alone (assigning
    to the group's variables is a collective): the values of ``state``, the
    group model's variables, in its order."""
    with group.alone():
        own = compile_for_keras3(plan)
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


def _start_at(model, plan, step):
    """Where the optimizer's own count started (see :func:`restore`); a
    learning-rate schedule then reads the run's step, not the optimizer's."""
    start = step - _iterations(model)
    learning_rate = optimizers.keras3_learning_rate(plan.learning_rate)
    if start and isinstance(learning_rate, keras.optimizers.schedules.LearningRateSchedule):
        model.optimizer.learning_rate = StartingAt(learning_rate, start)
    return start


def _scope(strategy):
    if strategy is None:
        return contextlib.nullcontext()
    if isinstance(strategy, DataParallelProcesses):
        return strategy.scope()
    if keras.backend.backend() != "tensorflow":
        raise ConfigError(
            f"a tf.distribute strategy needs Keras 3 on the tensorflow backend; this is "
            f"KERAS_BACKEND={keras.backend.backend()}. Use --strategy none (one device), or "
            f"KERAS_BACKEND=tensorflow.")
    if base.in_tf_cluster(strategy):
        raise ConfigError(
            "on the TensorFlow backend the keras3 engine trains in one process (Keras 3's fit "
            "under MultiWorkerMirroredStrategy is not supported: keras-team/keras#20585), but "
            "this task is part of a TF_CONFIG cluster. Set KERAS_BACKEND=jax to train the "
            "processes together on JAX, train the cluster with --engine keras or --engine "
            "estimator, or run keras3 without TF_CONFIG.")
    return strategy.scope()


def _datasets(plan, model):
    """(train, eval) datasets; under a strategy the training batches are per
    replica; a JAX process group gets no eval dataset (ShardedEvaluation
    reads its own)."""
    if plan.strategy is None or isinstance(plan.strategy, DataParallelProcesses):
        # A process of a group reads its own share already (the plan's input_fn).
        train = _as_built(model, plan.train_data(input_context=None))
    else:
        train = plan.strategy.distribute_datasets_from_function(
            lambda ctx: _as_built(model, plan.train_data(input_context=ctx)))
    # A JAX process group evaluates its shares itself (ShardedEvaluation).
    group = isinstance(plan.strategy, DataParallelProcesses)
    return train, None if group else _eval_data(plan, model)


def _eval_data(plan, model):
    """The eval split, cut to ``eval_steps`` batches: an evaluation reads
    the same batches every time, and ends with its data rather than after
    Keras' whole calls of several steps."""
    data = _as_built(model, plan.eval_data(input_context=None))
    return data.take(plan.eval_steps) if plan.eval_steps else data


def _eval_share(plan, model, group):
    """This process's share of the eval split: with ``eval_steps``, every
    N-th of the batches one process would read; else the records its
    ``tf.distribute.InputContext`` gives it (the plan's ``eval_data`` takes
    one, as :func:`estimator_keras.make_input_fn`'s does)."""
    processes, rank = group.input_shard
    if plan.eval_steps:
        return _eval_data(plan, model).shard(processes, rank)
    import tensorflow as tf  # pylint: disable=import-outside-toplevel  (tf.data's)
    context = tf.distribute.InputContext(num_input_pipelines=processes,
                                         input_pipeline_id=rank,
                                         num_replicas_in_sync=processes)
    return _as_built(model, plan.eval_data(input_context=context))


def _as_built(model, data):
    """``data`` with its features as ``model`` takes them: a model of one
    input, functional or Sequential, gets the one feature's tensor whatever
    its input is named; a model of several inputs gets the dict (see
    :func:`estimator_keras.model_inputs.as_model_inputs`)."""
    return model_inputs.as_model_inputs(model, data)


@contextlib.contextmanager
def _quiet_end_of_data():
    """Keras 3 warns "Your input ran out of data" at the end of every pass
    over an eval split whose length tf.data cannot tell (any filtered
    pipeline): the expected end of an evaluation. Training data that runs out is
    caught after fit instead (a DataError)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Your input ran out of data",
                                category=UserWarning)
        yield


def _evaluate(model, plan, step):
    with _quiet_end_of_data():
        values = model.evaluate(_eval_data(plan, model), verbose=0, return_dict=True)
    metrics = {k: float(v) for k, v in values.items()}
    metrics["global_step"] = step
    return metrics


def _fit(plan):
    hooks = plan.hooks
    io.makedirs(plan.model_dir)
    group = plan.strategy if isinstance(plan.strategy, DataParallelProcesses) else None
    latest = ckpts.latest(plan.model_dir)
    other = None if latest else _tf_checkpoint(plan.model_dir)
    if group is not None:
        # Process 0's checkpoint is everybody's: a model dir the others see
        # late, or not at all, cannot split the group.
        if not plan.chief:
            latest = other = None
        chosen = group.from_process_0(np.int32(_chosen_step(latest or other))).item()
        if chosen >= plan.max_steps:
            # Finished: no process joins a collective step (the runner
            # evaluates and exports on the chief alone).
            return base.RunResult(None, None, chosen, latest if plan.chief else None)
    # Processes of a group must initialize the same weights.
    seed = plan.seed if plan.seed is not None else getattr(plan.strategy, "shared_seed", None)
    if seed is not None:
        # Initial weights and dropout; the runner passes a seed that differs
        # after a restart (base.run_seed), so a resumed run draws anew.
        keras.utils.set_random_seed(int(seed))
    with _scope(plan.strategy):
        model = compile_for_keras3(plan, MAX_STEPS_PER_EXECUTION)
        step = start = 0
        if group is not None:
            step, start = _restore_from_process_0(model, plan, group, latest or other, chosen)
        elif latest or other:
            step = restore(model, latest or other, hooks.log)
            start = _start_at(model, plan, step)
            how = "" if latest else ", a checkpoint of another engine"
            hooks.log(f"resuming from {latest or other} (step {step}{how})")
        elif not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        saved = latest
        if latest is None:
            # Like the other engines: a checkpoint at the start, so a run that
            # fails early still leaves one (and a migrated dir becomes keras3's).
            saved = _save(model, plan, step, start)
    if step >= plan.max_steps:
        # Nothing left to train: report the numbers all the same.
        metrics = _evaluate(model, plan, step)
        hooks.log(f"evaluated step {step}: {base.format_metrics(metrics)}")
        return base.RunResult(model, metrics, step, saved)

    if plan.chief and importlib.util.find_spec("tensorboard") is None:
        hooks.log("TensorBoard is not installed: no summaries (pip install tensorboard)")
    replicas = plan.strategy.num_replicas_in_sync if plan.strategy is not None else 1
    meter = base.ProgressMeter(plan.log_every_steps, plan.batch_size, replicas, hooks.log,
                               plan.max_steps)
    evaluations = Evaluations(plan, saved, start, group)
    steps = TrainingSteps(plan, meter, lambda: evaluations.saved, model, start)
    train_data, eval_data = _datasets(plan, model)
    every = plan.eval_every_steps
    fit = dict(validation_data=eval_data,
               callbacks=[steps, evaluations], shuffle=False, verbose=0)
    try:
        with _quiet_end_of_data(), _training_scope(plan.strategy):
            if step % every:
                # Back onto multiples of eval_every_steps (after a preemption):
                # one short epoch first.
                model.fit(train_data, epochs=1, **fit,
                          steps_per_epoch=min(every - step % every, plan.max_steps - step))
                step = _step(model, start)
            if step < plan.max_steps and not evaluations.stopped:
                model.fit(train_data, epochs=math.ceil(plan.max_steps / every),
                          initial_epoch=step // every, steps_per_epoch=every, **fit)
    finally:
        evaluations.close()
    step = _step(model, start)
    meter.finish(step)
    if step < plan.max_steps and not evaluations.stopped:
        raise DataError(
            f"the training data ran out at step {step} of {plan.max_steps}: the keras3 engine "
            f"needs a training dataset that repeats (make_dataset(..., training=True) "
            f"without num_epochs does). The last checkpoint is {evaluations.saved}.")
    metrics = evaluations.metrics
    if metrics is None:
        metrics = _evaluate(model, plan, step)
    else:
        metrics = dict(metrics)
    metrics["global_step"] = step
    return base.RunResult(model, metrics, step, evaluations.saved if plan.chief else None)


class Keras3Engine(base.Engine):
    """:class:`~estimator_keras.engines.base.Engine` over Keras 3's ``Model.fit``."""

    name = "keras3"

    def train(self, plan):
        return _fit(plan)

    def evaluate(self, plan, checkpoint):
        """The metrics of a keras3 checkpoint, or of another engine's TF
        checkpoint, with ``global_step``."""
        # A process of a JAX group evaluates alone (the others have finished).
        scope = (contextlib.nullcontext() if isinstance(plan.strategy, DataParallelProcesses)
                 else _scope(plan.strategy))
        with scope:
            model = compile_for_keras3(plan)
            step = restore(model, checkpoint)
        return _evaluate(model, plan, step)

    def check_can_restore(self, checkpoint):
        """Accepts keras3 checkpoints and the TensorFlow checkpoints of the
        other engines (continued through keras3_migration)."""
        if ckpts.is_checkpoint(checkpoint):
            ckpts.step_of(checkpoint)
            return
        if importlib.util.find_spec("estimator_keras.keras3_migration") is None:
            raise ModelDirError(
                f"{io.parent(checkpoint)} holds a TensorFlow checkpoint of the estimator or keras "
                f"engine ({checkpoint}), which this installation cannot load into Keras 3. "
                f"Continue it with the engine that wrote it, or start a fresh --model-dir.")

    def check_compatible(self, model, checkpoint):
        """Raises ModelDirError when ``checkpoint`` (keras3's, or another
        engine's TF checkpoint) does not fit ``model``: an uncompiled Keras 3
        model such as the runner's probe. Either is compared with the model
        by each weight's name and shape, nothing assigned."""
        if ckpts.is_checkpoint(checkpoint):
            ckpts.check_fits(model, checkpoint)
        else:
            from estimator_keras import keras3_migration  # pylint: disable=import-outside-toplevel
            keras3_migration.check_tf_checkpoint(model, checkpoint)

    def export(self, model_builder, model_dir, *, checkpoint, **options):
        """model.keras, model.h5, weights.h5, saved_model/ and export.json of a keras3
        checkpoint (:mod:`estimator_keras.keras3_export`), or of another
        engine's TF checkpoint in a model dir not yet trained on here."""
        # pylint: disable=import-outside-toplevel  (they import TensorFlow)
        from estimator_keras import export as export_lib
        from estimator_keras import keras3_export
        if checkpoint is None or ckpts.is_checkpoint(checkpoint):
            return keras3_export.export_model(model_builder, model_dir, checkpoint=checkpoint,
                                              **options)
        from estimator_keras import keras3_migration
        model = model_builder()
        step = keras3_migration.restore_tf_checkpoint(model, checkpoint)
        export_dir = options.pop("export_dir", None) or io.join(model_dir,
                                                                export_lib.EXPORT_DIR)
        return keras3_export.write_export(model, export_dir, step=step, checkpoint=checkpoint,
                                          **options)

    def export_if_best(self, model_builder, model_dir, checkpoint, metrics, metric,
                       higher_is_better=True, **options):
        """``MODEL_DIR/best`` as :func:`estimator_keras.export.export_if_best`
        keeps it, written by :meth:`export`."""
        from estimator_keras import export as export_lib  # pylint: disable=import-outside-toplevel
        return export_lib.export_if_best(model_builder, model_dir, checkpoint, metrics, metric,
                                         higher_is_better, exporter=self.export, **options)

    def latest_checkpoint(self, model_dir):
        """The checkpoint a run on ``model_dir`` continues from: the newest
        keras3 checkpoint, else another engine's TF checkpoint, else None."""
        return ckpts.latest(model_dir) or _tf_checkpoint(model_dir)

    def written_by(self, checkpoint):
        if ckpts.is_checkpoint(checkpoint):
            return self.name
        from estimator_keras import checkpoints  # pylint: disable=import-outside-toplevel
        return checkpoints.checkpoint_engine(checkpoint)

    def checkpoint_step(self, checkpoint):
        """The step of a keras3 checkpoint or of another engine's TF checkpoint."""
        return checkpoint_step(checkpoint)
