"""The ``keras`` engine: ``Model.fit`` on the TFRecord pipeline, where
``tf.estimator`` does not exist (TensorFlow 2.16+ with tf-keras) or is not wanted.

It keeps the Estimator engine's contract, so that experiments, exports and
the cluster commands do not change:

- checkpoints in ``MODEL_DIR`` at the start and every ``eval_every_steps``
  steps, object-based with the model as root (the same weight keys the
  Estimator writes), so export and ``evaluate`` read either;
- evaluation on the eval split after every checkpoint; TensorBoard summaries
  in ``train/`` and ``validation/`` of the plan's summary dir (default
  ``MODEL_DIR``), written at every evaluation;
- crash-resume with ``tf.keras.callbacks.BackupAndRestore`` in
  ``MODEL_DIR/backup`` (deleted when training completes); a finished run
  continues from its last checkpoint when ``max_steps`` grows, and a model
  dir the Estimator trained continues here at its global step;
- ``max_steps`` is exact: the step count is the optimizer's ``iterations``;
- :data:`~estimator_keras.engines.base.MAX_STEPS_PER_EXECUTION` steps run in
  one call of Keras' compiled training function (Keras shortens the last
  call of each epoch itself, :class:`StepLimit` the one that reaches
  ``max_steps``), so a small model's steps do not each wait on Python; one
  step a call in a TF_CONFIG cluster (:meth:`KerasEngine.train`);
- a NaN or infinite loss stops training with :class:`NumericalError`.

Example::

    def build():
        model = build_model()
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
        return model

    result = fit_and_evaluate(
        build, lambda ctx: make_dataset(data, 128, training=True, input_context=ctx),
        lambda ctx: make_dataset(data, 128, training=False, input_context=ctx),
        model_dir="/tmp/run", max_steps=2000, eval_every_steps=500, batch_size=128)
    print(result.metrics, result.global_step)
"""

import importlib.util
import logging
import math
import time

import tensorflow as tf

from estimator_keras import checkpoints, engines, io, losses, memory, model_inputs, summaries
from estimator_keras.distribute import groups, preemption
from estimator_keras.engines import base, model_dirs, optimizers
from estimator_keras.errors import UsageError

logger = logging.getLogger(__name__)

BACKUP_DIR = "backup"
CHECKPOINT_NAME = "model.ckpt"
# The two runs of the summaries, named as Keras' TensorBoard callback names them.
SUMMARY_SUBDIRS = ("train", "validation")

# What fit_and_evaluate returns: the engines' one result type.
FitResult = base.RunResult


def _step(model):
    return int(model.optimizer.iterations.numpy())


class StepLimit(tf.keras.callbacks.Callback):
    """Counts the steps of each call, stops at exactly ``max_steps``, feeds
    the progress lines, and raises on a NaN loss (looked at with every
    progress line and at every epoch's end, before its checkpoint).

    Keras calls the batch hooks once per call of its training function, which
    runs the model's ``steps_per_execution`` steps (``full``), or the rest of
    the epoch where fewer are left: Keras' own rule, repeated here to count.
    The call that would pass ``max_steps`` is shortened to end on it, through
    the model's public ``steps_per_execution``, and the full length is put
    back after it.

    The step is counted here rather than read from the optimizer, and the
    loss is read only when a line is due: reading either every call would
    make TensorFlow finish each call before starting the next.
    """

    def __init__(self, max_steps, meter, manager, full=1):
        super().__init__()
        self.max_steps, self.meter, self.manager = max_steps, meter, manager
        self.full = full
        self.step = self.call = 0
        self.shortened = False
        # Keras' callback protocol: batch logs may then come as tensors,
        # without a wait for each call's results.
        self._supports_tf_logs = True

    def on_train_begin(self, logs=None):
        self.step = _step(self.model)

    def on_train_batch_begin(self, batch, logs=None):
        self.call = min(self.full, self.params["steps"] - batch)
        if self.step + self.call > self.max_steps:
            self.call = self.max_steps - self.step
            self.model.steps_per_execution = self.call
            self.shortened = True

    def on_train_batch_end(self, batch, logs=None):
        before, self.step = self.step, self.step + self.call
        if self.shortened:
            self.model.steps_per_execution = self.full
            self.shortened = False
        every = self.meter.every_steps
        if (self.meter.first is None or self.step // every > before // every
                or self.step >= self.max_steps):
            self.meter.update(self.step, self._finite_loss(logs))
        if self.step >= self.max_steps:
            self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        # The epoch's mean loss: a NaN anywhere in the epoch shows here.
        self._finite_loss(logs)

    def on_train_end(self, logs=None):
        self.meter.finish(_step(self.model), now=time.monotonic())

    def _finite_loss(self, logs):
        return base.finite_loss(logs, self.step, lambda: self.manager.latest_checkpoint)


class Checkpoints(tf.keras.callbacks.Callback):
    """Checkpoint, then report the evaluation, after every epoch (= every
    eval_every_steps steps, or the last, shorter one); stops early when the
    plan's EarlyStopping says so."""

    def __init__(self, manager, hooks, is_chief, first_run, early_stopping, evaluate,
                 log_dir=None):
        super().__init__()
        self.manager, self.hooks, self.is_chief = manager, hooks, is_chief
        self.first_run, self.early_stopping = first_run, early_stopping
        self.evaluate = evaluate
        self.saved = self.metrics = None
        self.history = []
        # Flushed at every evaluation: a TensorBoard reading LOG_DIR
        # (Vertex AI's) follows the run as it trains.
        self.writers = {sub: summaries.ScalarWriter(io.join(log_dir, sub))
                        for sub in SUMMARY_SUBDIRS} if log_dir else {}

    def on_train_begin(self, logs=None):
        if self.first_run:
            # Like the Estimator: a checkpoint of the initial weights, so a
            # run that fails early still leaves a good one.
            self.saved = self.manager.save(checkpoint_number=_step(self.model))

    def on_epoch_end(self, epoch, logs=None):
        step, logs = _step(self.model), logs or {}
        self.saved = self.manager.save(checkpoint_number=step)
        memory.release_free_memory()
        metrics = self.metrics = self.evaluate(self.model)
        if self.writers:
            # Keras' TensorBoard callback's names, at the global step.
            self.writers["train"].write({f"epoch_{k}": v for k, v in logs.items()}, step)
            self.writers["validation"].write({f"epoch_{k}": v for k, v in metrics.items()}, step)
        if metrics and base.record_evaluation(self.hooks, step, metrics, self.saved,
                                              self.is_chief, self.early_stopping, self.history):
            self.model.stop_training = True

    def on_train_end(self, logs=None):
        for writer in self.writers.values():
            writer.close()


class WithoutBatchHooks(tf.keras.callbacks.Callback):
    """Hands ``callback`` every hook except the per-batch ones.

    Keras calls every callback's batch hooks as soon as one callback has them
    (StepLimit does). BackupAndRestore saving per epoch then assigns a
    variable every step and TensorBoard at ``update_freq="epoch"`` makes one
    no-op summary call per metric: about 0.18 ms a step that changes nothing,
    a tenth of a small model's step.
    """

    def __init__(self, callback):
        super().__init__()
        self.callback = callback
        self._supports_tf_logs = getattr(callback, "_supports_tf_logs", False)

    def set_params(self, params):
        super().set_params(params)
        self.callback.set_params(params)

    def set_model(self, model):
        super().set_model(model)
        self.callback.set_model(model)

    def on_train_begin(self, logs=None):
        self.callback.on_train_begin(logs)

    def on_train_end(self, logs=None):
        self.callback.on_train_end(logs)

    def on_epoch_begin(self, epoch, logs=None):
        self.callback.on_epoch_begin(epoch, logs)

    def on_epoch_end(self, epoch, logs=None):
        self.callback.on_epoch_end(epoch, logs)

    def on_test_begin(self, logs=None):
        self.callback.on_test_begin(logs)

    def on_test_end(self, logs=None):
        self.callback.on_test_end(logs)

    def on_predict_begin(self, logs=None):
        self.callback.on_predict_begin(logs)

    def on_predict_end(self, logs=None):
        self.callback.on_predict_end(logs)


class PreemptionCheckpoint(tf.keras.callbacks.Callback):
    """On SIGTERM or SIGINT (seen by the plan's PreemptionWatch): a checkpoint
    at the step just taken, then Preempted, before any evaluation runs.

    Under MultiWorkerMirroredStrategy every worker stops after the same step,
    whichever of them was signalled (see
    :class:`~estimator_keras.distribute.preemption.StopAgreement`).
    """

    def __init__(self, watch, manager, is_chief, strategy, steps):
        super().__init__()
        self.watch, self.manager, self.is_chief = watch, manager, is_chief
        self.agreement = preemption.StopAgreement(watch, strategy)
        # The StepLimit before this callback, which counts each call's steps.
        self.steps = steps
        self._supports_tf_logs = True  # it reads no logs (see StepLimit)

    def on_train_batch_end(self, batch, logs=None):
        step = self.steps.step
        if self.agreement.stop_after(step):
            self.manager.save(checkpoint_number=step)
            if not self.is_chief:
                io.rmtree(self.manager.directory)  # the scratch copy nobody reads
            raise self.watch.stopped(step, by_chief=not self.is_chief)


def _task(strategy):
    """(is_chief, task id) of this process under ``strategy``."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not getattr(resolver, "task_type", None):
        return True, 0
    return strategy.extended.should_checkpoint, int(resolver.task_id or 0)


def _backup_checkpoint(backup):
    """The checkpoint BackupAndRestore left in ``backup`` (in a subfolder of
    its choosing), or None."""
    if not io.isdir(backup):
        return None
    for root, _, files in io.walk(backup):
        if "checkpoint" in files and tf.train.latest_checkpoint(root):
            return tf.train.latest_checkpoint(root)
    return None


def _steps_per_call(model):
    """The steps each call of ``model``'s training function runs."""
    if model.autotune_steps_per_execution:
        raise UsageError("the keras engine plans its calls of Keras' training function itself: "
                         "compile the model with a number of steps_per_execution, not 'auto'.")
    variable = model.steps_per_execution
    return 1 if variable is None else int(variable.numpy())


def _evaluate(model, data, steps=None):
    """Metrics of ``model`` on ``steps`` batches of ``data`` (None: all).

    Keras 2 runs several steps a call only over data of known length, which
    a TFRecord split's is not: such an evaluation runs one step a call.
    """
    full = _steps_per_call(model)
    if steps is None and full > 1:
        model.steps_per_execution = 1
    try:
        values = model.evaluate(data, steps=steps, verbose=0, return_dict=True)
    finally:
        if steps is None and full > 1:
            model.steps_per_execution = full
    return {k: float(v) for k, v in values.items()}


def _fit(plan, build_compiled_model):
    """Model.fit under the plan; ``build_compiled_model`` returns the compiled
    model and is called inside the strategy's scope."""
    engines.check_keras2("keras")
    hooks = plan.hooks
    strategy = plan.strategy or tf.distribute.get_strategy()
    is_chief, task_id = _task(strategy)
    replicas = int(strategy.num_replicas_in_sync)
    io.makedirs(plan.model_dir)

    # Read before building the model: under MultiWorkerMirroredStrategy
    # building syncs the workers, so no task can have written a checkpoint
    # yet and every task sees the same answer.
    latest = tf.train.latest_checkpoint(plan.model_dir)
    model_dirs.check_can_continue(plan.model_dir, "keras")
    backup = io.join(plan.model_dir, BACKUP_DIR)
    backed_up = _backup_checkpoint(backup)
    # A preempted run saved a later step than its last backup.
    stale_backup = bool(backed_up and latest and (checkpoints.checkpoint_step(latest) or 0) > (
        checkpoints.checkpoint_step(backed_up) or 0))
    with strategy.scope():
        model = build_compiled_model()
        if model.optimizer is None:
            raise UsageError("the keras engine needs a compiled model: call "
                             "model.compile(optimizer=..., loss=...) in build_compiled_model.")
        checkpoint = tf.train.Checkpoint(root=model)
        write_dir = plan.model_dir if is_chief else base.scratch_dir(plan.model_dir, task_id)
        manager = tf.train.CheckpointManager(checkpoint, write_dir,
                                             max_to_keep=plan.keep_checkpoint_max,
                                             checkpoint_name=CHECKPOINT_NAME)
        if latest:
            checkpoints.check_compatible(model, latest)
        if stale_backup:
            if is_chief:
                io.rmtree(backup)
            backed_up = None
        if latest and not backed_up:
            # A finished, preempted (or Estimator-trained) run: continue from
            # its last checkpoint. A crashed one is BackupAndRestore's to restore.
            checkpoint.restore(latest).expect_partial()
            step = checkpoints.checkpoint_step(latest) or 0
            if _step(model) != step:
                # The Estimator's checkpoint holds the optimizer's slots,
                # restored with the model, but not its count: the step is.
                model.optimizer.iterations.assign(step)
            hooks.log(f"resuming from {latest} (step {step})")
        elif backed_up:
            hooks.log(f"restoring the interrupted run from {backed_up} "
                      f"(BackupAndRestore; the last checkpoint is {latest})")
    step = _step(model)
    if stale_backup and plan.strategy is not None:
        # No task's BackupAndRestore may look at the backup while the chief
        # removes it: every task waits here for the others.
        float(strategy.reduce(tf.distribute.ReduceOp.SUM,
                              strategy.run(lambda: tf.constant(0.0)), axis=None))

    # BackupAndRestore restores its step inside fit: the input resumes there.
    resumed_at = (checkpoints.checkpoint_step(backed_up) or 0) if backed_up else step

    # A model of one input takes its tensor, whatever the input is named.
    def train_dataset(ctx):
        return model_inputs.as_model_inputs(
            model, base.training_input(plan.train_data, ctx, resumed_at))

    train_data = (train_dataset(None) if plan.strategy is None else
                  strategy.distribute_datasets_from_function(train_dataset))
    # Keras needs a step count for distributed datasets, and a worker's share
    # of a finite eval set is not known up front; handing Keras the plain
    # dataset lets it split each batch between replicas and end all of them
    # together. DATA sharding: every worker keeps its own batches of the
    # whole eval split, so nothing is counted twice or missed.
    eval_data = model_inputs.as_model_inputs(model, plan.eval_data(input_context=None))
    if plan.strategy is not None:
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.DATA)
        eval_data = eval_data.with_options(options)

    full = _steps_per_call(model)
    meter = base.ProgressMeter(plan.log_every_steps, plan.batch_size, replicas, hooks.log,
                               plan.max_steps, hooks.on_progress)
    log_dir = None
    if importlib.util.find_spec("tensorboard") is not None:
        log_dir = (plan.summary_dir or plan.model_dir) if is_chief else None
    elif is_chief:
        # TensorFlow 2.16+ no longer installs TensorBoard itself.
        hooks.log("TensorBoard is not installed: no summaries (pip install tensorboard)")
    saver = Checkpoints(manager, hooks, is_chief, latest is None, plan.early_stopping,
                        lambda trained: _evaluate(trained, eval_data, plan.eval_steps),
                        log_dir)
    limit = StepLimit(plan.max_steps, meter, manager, full)
    # The backup first: then a periodic checkpoint in MODEL_DIR never outruns
    # the backup (only a preemption's does, and a restart sees that).
    # Saving per epoch, BackupAndRestore needs none of its batch hooks.
    callbacks = [WithoutBatchHooks(tf.keras.callbacks.BackupAndRestore(backup)), limit, saver]
    if plan.preemption is not None:
        callbacks.insert(2, PreemptionCheckpoint(plan.preemption, manager, is_chief,
                                                 plan.strategy, limit))

    if step < plan.max_steps:
        # Evaluated by the saver rather than fit's validation, which Keras
        # refuses for data of unknown length under several steps a call.
        model.fit(
            train_data, epochs=math.ceil(plan.max_steps / plan.eval_every_steps),
            initial_epoch=step // plan.eval_every_steps, steps_per_epoch=plan.eval_every_steps,
            callbacks=callbacks, verbose=0)
    metrics = saver.metrics
    step = _step(model)
    if metrics is None:
        # Nothing left to train (or BackupAndRestore ended it): evaluate the
        # model as it is, so every run reports its numbers.
        metrics = _evaluate(model, eval_data, plan.eval_steps)
        hooks.log(f"evaluated step {step}: {base.format_metrics(metrics)}")
    metrics = dict(metrics, global_step=step)
    saved = saver.saved or manager.latest_checkpoint
    if is_chief and not groups.of(strategy).multi_process and not _backup_checkpoint(backup):
        # Empty once training completed. Under MultiWorkerMirroredStrategy the
        # workers may still be writing their scratch backups inside it:
        # BackupAndRestore removes the chief's, the folder stays.
        io.rmtree(backup)
    if not is_chief:
        io.rmtree(write_dir)
        saved = None
    return base.RunResult(model, metrics, step, saved)


def fit_and_evaluate(build_compiled_model, train_dataset_fn, eval_dataset_fn, *, model_dir,
                     max_steps, eval_every_steps, eval_steps=None, batch_size=None,
                     strategy=None, keep_checkpoint_max=5, log_every_steps=100,
                     early_stopping=None, on_evaluation=None, log=None, preemption=None):
    """Trains with ``Model.fit``, evaluating and checkpointing every
    ``eval_every_steps`` steps; returns a :class:`FitResult`.

    Args:
      build_compiled_model: returns the compiled Keras model; called inside
        ``strategy.scope()``.
      train_dataset_fn: ``fn(input_context)`` returning a ``tf.data.Dataset``
        of per-replica batches that repeats forever (``input_context`` is None
        without a strategy; with one it says which share to read).
      eval_dataset_fn: ``fn(None)`` returning one pass over the eval split;
        under a strategy its batches are split between the replicas.
      model_dir: checkpoints, summaries and the crash-resume backup.
      max_steps: train until the optimizer has taken this many steps (over
        all runs on ``model_dir``).
      eval_every_steps: steps between checkpoints and evaluations.
      eval_steps: batches per evaluation (None: the whole eval split).
      batch_size: per-replica batch, for the examples/s log.
      strategy: a ``tf.distribute`` strategy or None.
      early_stopping: an :class:`estimator_keras.EarlyStopping`.
      on_evaluation: ``fn(checkpoint, metrics)`` called on the chief after
        each evaluation (e.g. a best-model export).
      log: ``fn(str)`` for progress lines (default: logging.info).
      preemption: an entered
        :class:`~estimator_keras.distribute.preemption.PreemptionWatch`: SIGTERM
        or SIGINT then saves the current step and raises Preempted.

    Raises:
      NumericalError: the loss became NaN or infinite.
      ModelDirError: ``model_dir`` holds a checkpoint of another architecture.
      Preempted: training stopped on a signal (with ``preemption``).
    """
    plan = base.TrainingPlan(
        model_dir=model_dir, build_model=build_compiled_model, loss=None, metrics=list,
        train_data=lambda input_context: train_dataset_fn(input_context),
        eval_data=lambda input_context: eval_dataset_fn(input_context),
        max_steps=max_steps, eval_every_steps=eval_every_steps, eval_steps=eval_steps,
        batch_size=batch_size, log_every_steps=log_every_steps,
        keep_checkpoint_max=keep_checkpoint_max, early_stopping=early_stopping,
        strategy=strategy, hooks=base.TrainingHooks(log, on_evaluation), preemption=preemption)
    return _fit(plan, build_compiled_model)


def compile_for_keras(plan, steps_per_call=1):
    """The plan's model compiled with the current Keras optimizers,
    ``steps_per_call`` steps per call of its training function."""
    model = plan.build_model()
    model.compile(optimizer=optimizers.keras_optimizer(plan.optimizer, plan.learning_rate),
                  loss=losses.keras_loss(plan.loss, model), metrics=plan.metrics(),
                  steps_per_execution=steps_per_call)
    return model


def evaluate_checkpoint(build_compiled_model, checkpoint, dataset, steps=None):
    """Metrics of ``checkpoint`` (from either engine) on ``dataset``.

    Raises:
      ModelDirError: the checkpoint's weights do not fit the model.
    """
    model = build_compiled_model()
    checkpoints.check_compatible(model, checkpoint)
    tf.train.Checkpoint(root=model).restore(checkpoint).expect_partial()
    metrics = _evaluate(model, model_inputs.as_model_inputs(model, dataset), steps)
    metrics["global_step"] = checkpoints.checkpoint_step(checkpoint)
    return metrics


class KerasEngine(base.TFCheckpointEngine):
    """:class:`~estimator_keras.engines.base.Engine` over ``Model.fit``."""

    name = "keras"

    def train(self, plan):
        # Across workers one step a call: inside the multi-step loop,
        # TensorFlow's collective gather of sparse gradients (an embedding's)
        # fails on a shape mismatch between the workers.
        steps = 1 if plan.group.multi_process else base.MAX_STEPS_PER_EXECUTION
        return _fit(plan, lambda: compile_for_keras(plan, steps))

    def evaluate(self, plan, checkpoint):
        return evaluate_checkpoint(lambda: compile_for_keras(plan), checkpoint,
                                   plan.eval_data(input_context=None), plan.eval_steps)
