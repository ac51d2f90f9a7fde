"""The ``keras3`` engine: Keras 3's ``Model.fit`` (``import keras``) on the
TFRecord pipeline, on the backend that ``KERAS_BACKEND`` names (tensorflow
or jax).

It keeps the other engines' contract:

- the input is the plan's pipeline: ``tf.data``, which Keras 3 reads on every
  backend, or Grain's on JAX (:mod:`estimator_keras.grain_inputs`), with or
  without TensorFlow installed;
- a checkpoint in ``MODEL_DIR`` at the start and every ``eval_every_steps``
  steps (:mod:`~estimator_keras.engines.keras3.checkpoints`: Keras 3 weights
  files with the optimizer's state, the same on every backend), the newest
  ``keep_checkpoint_max`` kept;
- an evaluation after every checkpoint, reported to the plan's hooks, and
  TensorBoard scalars in ``train/`` and ``validation/`` of the summary dir
  (where they can be written: :func:`estimator_keras.summaries.missing`);
- ``max_steps`` is exact (the optimizer's ``iterations``, plus the step its
  count started at where another engine's state could not move);
  evaluations stay on multiples of ``eval_every_steps`` after a resume from
  any step;
- :data:`~estimator_keras.engines.base.MAX_STEPS_PER_EXECUTION` steps run
  in one call of Keras' compiled training function, or one fewer where an
  evaluation's window does not divide by it, the calls planned to end
  exactly at each evaluation and at ``max_steps`` (:class:`TrainingSteps`),
  whatever the cadence;
- a rerun resumes from the latest checkpoint (after a crash, a SIGKILL or a
  preemption), optimizer state and random layers' seeds included; a finished
  run trains nothing and reports its evaluation; a model dir that holds
  only a TensorFlow checkpoint of the estimator or keras engine continues
  at its step, with its
  optimizer's slots (:mod:`estimator_keras.engines.keras3.migration`), or with a
  fresh optimizer where they cannot move (:func:`restore`);
- SIGTERM/SIGINT under the plan's PreemptionWatch: a checkpoint of the step
  just taken, then Preempted; a NaN or infinite loss: NumericalError;
- several processes on the JAX backend (the plan's group a
  :class:`~estimator_keras.distribute.jax_processes.DataParallelProcesses`,
  asked only through :class:`~estimator_keras.distribute.groups.TrainingGroup`):
  fit runs in its scope, each process on its own share of the training data;
  every process starts from process 0's checkpoint (process 0 restores it,
  then broadcasts the state), so no other process restores from its model
  dir; each
  evaluates its share of the eval split and the metrics' states are summed
  (:class:`~estimator_keras.engines.keras3.evaluation.ShardedEvaluation`); the chief alone writes the checkpoints; the
  processes agree on the step a preemption stops at.

Example::

    engine = Keras3Engine()
    result = engine.train(TrainingPlan(model_dir="/tmp/run", build_model=build, ...))
    print(result.metrics, result.global_step)
"""

import collections
import importlib.util
import math

import keras
import numpy as np

from estimator_keras import io, losses, memory, summaries
from estimator_keras.distribute import preemption
from estimator_keras.engines import base, optimizers
from estimator_keras.engines.keras3 import checkpoints as ckpts
from estimator_keras.engines.keras3 import evaluation, resume, seeds
from estimator_keras.errors import ConfigError, DataError, ModelDirError

# The two runs of the summaries, named as Keras' TensorBoard callback names them.
SUMMARY_SUBDIRS = ("train", "validation")


def _step(model, start):
    """The run's step: the optimizer's own count, which started at ``start``
    (0 but where another engine's optimizer state could not move)."""
    return start + resume.iterations(model)


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
    :data:`~estimator_keras.engines.base.MAX_STEPS_PER_EXECUTION` steps, or one fewer.

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
        self.agreement = (preemption.StopAgreement(plan.preemption, plan.group)
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
        self.sharded = None
        if group is not None:
            with group.alone():
                model = compile_for_keras3(plan)
            self.sharded = evaluation.ShardedEvaluation(plan, group, model)
        self.writers = {}
        if plan.chief and not summaries.missing():
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
        with plan.group.alone():
            stopping = base.record_evaluation(plan.hooks, step, metrics, self.saved,
                                              plan.chief, stop, self.history)
        if stopping:
            plan.hooks.log(f"early stopping at step {step}: {stop.metric} has not improved "
                           f"for {stop.patience_steps} steps")
            self.stopped = self.model.stop_training = True

    def close(self):
        for writer in self.writers.values():
            writer.close()


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
    with plan.group.alone():
        return ckpts.save(model, plan.model_dir, step, plan.keep_checkpoint_max,
                          optimizer_from=start)


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
                  loss=losses.keras_loss(plan.loss, model), metrics=plan.metrics(),
                  steps_per_execution=steps_per_call)
    return model


def _scope(group):
    """Where the model is built: the group's scope, once a tf.distribute
    strategy is known to be one Keras 3 trains under."""
    if group.strategy is None:
        return group.scope()
    if keras.backend.backend() != "tensorflow":
        raise ConfigError(
            f"a tf.distribute strategy needs Keras 3 on the tensorflow backend; this is "
            f"KERAS_BACKEND={keras.backend.backend()}. Use --strategy none (one device), or "
            f"KERAS_BACKEND=tensorflow.")
    if group.multi_process:
        raise ConfigError(
            "on the TensorFlow backend the keras3 engine trains in one process (Keras 3's fit "
            "under MultiWorkerMirroredStrategy is not supported: keras-team/keras#20585), but "
            "this task is part of a TF_CONFIG cluster. Set KERAS_BACKEND=jax to train the "
            "processes together on JAX, train the cluster with --engine keras or --engine "
            "estimator, or run keras3 without TF_CONFIG.")
    return group.scope()


def _train_data(plan, model, step):
    """The training dataset from ``step`` on; under a strategy its batches
    are per replica. Each fit gets its own: fit starts its dataset over."""
    # A process that reads its own share (the plan's input_fn) gets no
    # input context; a strategy distributes the input itself.
    return plan.group.distribute_dataset(
        lambda ctx: evaluation.as_built(model, base.training_input(plan.train_data, ctx, step)))


def _eval_data(plan, model):
    """The eval dataset; a JAX process group gets none (ShardedEvaluation
    reads each process's share)."""
    return None if plan.group.input_shard else evaluation.eval_data(plan, model)


def _fit(plan):
    hooks = plan.hooks
    io.makedirs(plan.model_dir)
    group = plan.group if plan.group.process_0_decides else None
    latest = other = None
    # Process 0's checkpoint is everybody's: a model dir the others see
    # late, or not at all, cannot split the group, so they do not look.
    if group is None or plan.chief:
        latest = ckpts.latest(plan.model_dir)
        other = None if latest else resume.tf_checkpoint(plan.model_dir)
    if group is not None:
        chosen = group.from_process_0(np.int32(resume.chosen_step(latest or other))).item()
        if chosen >= plan.max_steps:
            # Finished: no process joins a collective step (the runner
            # evaluates and exports on the chief alone).
            return base.RunResult(None, None, chosen, latest if plan.chief else None)
    # Processes of a group must initialize the same weights.
    seed = plan.seed if plan.seed is not None else plan.group.shared_seed
    if seed is not None:
        # Initial weights and the random layers' seeds (a resumed run restores
        # their state from its checkpoint: engines/keras3/seeds.py).
        keras.utils.set_random_seed(int(seed))
    with _scope(plan.group):
        model = compile_for_keras3(plan, base.MAX_STEPS_PER_EXECUTION)
        step = start = 0
        if group is not None:
            step, start = resume.from_process_0(model, plan, group, latest or other, chosen,
                                                compile_for_keras3)
        elif latest or other:
            step = resume.restore(model, latest or other, hooks.log)
            start = resume.start_at(model, plan, step)
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
        metrics = evaluation.evaluate(model, plan, step)
        hooks.log(f"evaluated step {step}: {base.format_metrics(metrics)}")
        return base.RunResult(model, metrics, step, saved)

    if plan.chief and summaries.missing():
        hooks.log(f"no TensorBoard summaries: {summaries.missing()}")
    replicas = plan.group.num_replicas_in_sync
    meter = base.ProgressMeter(plan.log_every_steps, plan.batch_size, replicas, hooks.log,
                               plan.max_steps, hooks.on_progress)
    evaluations = Evaluations(plan, saved, start, group)
    steps = TrainingSteps(plan, meter, lambda: evaluations.saved, model, start)
    every = plan.eval_every_steps
    train_data = _train_data(plan, model, step)
    fit = dict(validation_data=_eval_data(plan, model),
               callbacks=[steps, evaluations], shuffle=False, verbose=0)
    try:
        with evaluation.quiet_end_of_data(), plan.group.fit_scope():
            if step % every:
                # Back onto multiples of eval_every_steps (after a preemption):
                # one short epoch first.
                model.fit(train_data, epochs=1, **fit,
                          steps_per_epoch=min(every - step % every, plan.max_steps - step))
                step = _step(model, start)
                train_data = _train_data(plan, model, step)
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
        metrics = evaluation.evaluate(model, plan, step)
    else:
        metrics = dict(metrics)
    metrics["global_step"] = step
    return base.RunResult(model, metrics, step, evaluations.saved if plan.chief else None)


class Keras3Engine(base.Engine):
    """:class:`~estimator_keras.engines.base.Engine` over Keras 3's ``Model.fit``."""

    name = "keras3"
    # Keras 3 keeps a constant rate as an optimizer variable and a decay as
    # none: a checkpoint's optimizer state fits one of them only.
    resumes_across_decays = False

    def train(self, plan):
        return _fit(plan)

    def evaluate(self, plan, checkpoint):
        """The metrics of a keras3 checkpoint, or of another engine's TF
        checkpoint, with ``global_step``."""
        # A process of a group that decides alone evaluates alone (the
        # others have finished).
        scope = plan.group.alone() if plan.group.process_0_decides else _scope(plan.group)
        with scope:
            model = compile_for_keras3(plan)
            step = resume.restore(model, checkpoint)
        return evaluation.evaluate(model, plan, step)

    def random_layers_restarted(self, model):
        """Those of :func:`~estimator_keras.engines.base.random_layers` that
        draw from no Keras seed generator of theirs: the checkpoints keep
        the generators' states (:mod:`.seeds`)."""
        kept = {layer for layer, _ in seeds.states(model)}
        return [layer for layer in base.random_layers(model) if layer not in kept]

    def check_can_restore(self, checkpoint):
        """Accepts keras3 checkpoints and the TensorFlow checkpoints of the
        other engines (continued through :mod:`.migration`)."""
        if ckpts.is_checkpoint(checkpoint):
            ckpts.step_of(checkpoint)
            return
        if importlib.util.find_spec("estimator_keras.engines.keras3.migration") is None:
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
            from estimator_keras.engines.keras3 import migration  # pylint: disable=import-outside-toplevel
            migration.check_tf_checkpoint(model, checkpoint)

    def export(self, model_builder, model_dir, *, checkpoint, **options):
        """model.keras, model.h5, weights.h5, saved_model/ and export.json of a keras3
        checkpoint (:mod:`.export`), or of another
        engine's TF checkpoint in a model dir not yet trained on here."""
        # pylint: disable=import-outside-toplevel  (they import TensorFlow)
        from estimator_keras import export as export_lib
        from estimator_keras.engines.keras3 import export as keras3_export
        if checkpoint is None or ckpts.is_checkpoint(checkpoint):
            return keras3_export.export_model(model_builder, model_dir, checkpoint=checkpoint,
                                              **options)
        from estimator_keras.engines.keras3 import migration
        model = model_builder()
        step = migration.restore_tf_checkpoint(model, checkpoint)
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
        keras3 checkpoint, else another engine's TF checkpoint (where that
        engine's entry lets it continue), else None."""
        own = ckpts.latest(model_dir)
        if own:
            return own
        from estimator_keras.engines import model_dirs  # pylint: disable=import-outside-toplevel
        model_dirs.check_can_continue(model_dir, self.name)
        return resume.tf_checkpoint(model_dir)

    def written_by(self, checkpoint):
        if ckpts.is_checkpoint(checkpoint):
            return self.name
        from estimator_keras.engines import model_dirs  # pylint: disable=import-outside-toplevel
        return model_dirs.checkpoint_engine(checkpoint)

    def checkpoint_step(self, checkpoint):
        """The step of a keras3 checkpoint or of another engine's TF checkpoint."""
        return resume.checkpoint_step(checkpoint)
