"""The ``estimator`` engine: a Keras model -> tf.estimator, trained with
``train_and_evaluate`` (TensorFlow <= 2.15 with tensorflow-estimator).

Wraps ``tf.keras.estimator.model_to_estimator`` so that its known traps
cannot bite: checkpoints are object-based (robust to auto-generated layer
names), the optimizer is a legacy Keras optimizer chosen explicitly (no
silent conversion), and a NaN loss stops training with a clear error.

Example::

    model = build_model()   # functional Keras model, compiled
    est = to_estimator(model, "/tmp/run", save_checkpoints_steps=500)
    metrics = train_and_evaluate(
        est, make_input_fn(data, 128, training=True),
        make_input_fn(data, 128, training=False), max_steps=2000,
        eval_every_steps=500)
"""

import inspect
import logging
import time

import tensorflow as tf

from estimator_keras import checkpoints, export, io, memory, model_inputs, summaries
from estimator_keras.engines import base, model_dirs, optimizers
from estimator_keras.engines.estimator import checkpoints as estimator_checkpoints
from estimator_keras.engines.estimator import sums as estimator_sums
from estimator_keras.errors import ConfigError, ModelDirError, UsageError
from estimator_keras.losses import keras_loss

logger = logging.getLogger(__name__)

# How long a non-chief task waits for the chief's first files.
CHIEF_WAIT_SECS = 600
# How long an asynchronous worker whose step failed looks for the chief's
# final checkpoint before it reports the failure.
FINAL_CHECKPOINT_WAIT_SECS = 30
# The errors a remote step ends with when a task it reads from goes away.
ENDED_REMOTELY = (tf.errors.CancelledError, tf.errors.AbortedError, tf.errors.UnavailableError)
# Steps between two releases of free heap memory when no evaluation
# interval is given (with one, after each interval, as the Keras engines do).
RELEASE_MEMORY_STEPS = 1000


def run_config(model_dir, *, save_checkpoints_steps=None, save_checkpoints_secs=None,
               keep_checkpoint_max=5, log_every_steps=100, train_distribute=None,
               eval_distribute=None, seed=None, session_config=None, summaries=True):
    """A ``tf.estimator.RunConfig`` with this package's defaults.

    Checkpoints every ``save_checkpoints_steps`` (or 600 s when neither is
    given); TensorFlow's own step logging is turned off in favour of
    :class:`ProgressHook`. ``summaries=False``: no training summaries in the
    model dir (a :class:`SummaryHook` writes them elsewhere).
    """
    if save_checkpoints_steps is None and save_checkpoints_secs is None:
        save_checkpoints_secs = 600
    return tf.estimator.RunConfig(
        model_dir=str(model_dir), tf_random_seed=seed,
        save_checkpoints_steps=save_checkpoints_steps,
        save_checkpoints_secs=save_checkpoints_secs if save_checkpoints_steps is None else None,
        save_summary_steps=summary_steps(log_every_steps) if summaries else 0,
        keep_checkpoint_max=keep_checkpoint_max, log_step_count_steps=None,
        train_distribute=train_distribute, eval_distribute=eval_distribute,
        session_config=session_config)


def summary_steps(log_every_steps):
    """Steps between training summaries."""
    return max(1, min(100, log_every_steps))


def to_estimator(keras_model, model_dir=None, config=None, **run_config_kwargs):
    """Wraps a compiled functional or Sequential Keras model as an Estimator.

    Args:
      keras_model: a compiled ``tf.keras`` model. A v2.11+ optimizer is
        replaced by its legacy twin here, explicitly, with an INFO log line.
      model_dir: where checkpoints and summaries go (ignored when ``config``
        carries one).
      config: a ``tf.estimator.RunConfig``; else one is made by
        :func:`run_config` from ``run_config_kwargs``. Under its
        MultiWorkerMirroredStrategy the optimizer is rebuilt to sum sparse
        gradients (an Embedding's) as dense ones: see
        :func:`~estimator_keras.engines.estimator.sums.sums_sparse_as_dense`.

    Returns:
      A ``tf.estimator.Estimator`` writing object-based checkpoints, which
      ``model.load_weights(checkpoint)`` restores exactly.
    """
    if keras_model.optimizer is None:
        raise UsageError("to_estimator needs a compiled model: call "
                         "model.compile(optimizer=..., loss=...) first.")
    if config is None:
        if model_dir is None:
            raise UsageError("to_estimator needs a model_dir or a RunConfig.")
        config = run_config(model_dir, **run_config_kwargs)
    optimizer = keras_model.optimizer
    if not isinstance(optimizer, tf.keras.optimizers.legacy.Optimizer):
        optimizer = optimizers.legacy_optimizer(optimizer)
        logger.info("tf.estimator needs a legacy Keras optimizer: compiling with "
                    "legacy %s instead of %s", type(optimizer).__name__,
                    type(keras_model.optimizer).__name__)
    if estimator_sums.sums_sparse_as_dense(config.train_distribute):
        optimizer = estimator_sums.dense_sum_optimizer(optimizer)
    if optimizer is not keras_model.optimizer:
        keras_model.compile(optimizer=optimizer, loss=keras_model.loss,
                            metrics=_compiled_metrics(keras_model))
    return tf.keras.estimator.model_to_estimator(
        keras_model=keras_model, config=config, checkpoint_format="checkpoint")


def _compiled_metrics(model):
    # Keras 2.15 keeps the metrics given to compile() only on its metrics
    # container; recompiling with the legacy optimizer must keep them.
    container = getattr(model, "compiled_metrics", None)
    return getattr(container, "_user_metrics", None)


class ProgressHook(tf.estimator.SessionRunHook):
    """Logs loss, steps/s and examples/s every ``every_steps`` steps, and the
    average at the end (see :class:`~estimator_keras.engines.base.ProgressMeter`)."""

    def __init__(self, every_steps=100, batch_size=None, replicas=1, log=None, max_steps=None,
                 on_progress=None):
        self._settings = (every_steps, batch_size, replicas, log, max_steps, on_progress)
        self._step_tensor = self._loss = self._meter = None

    def begin(self):
        self._step_tensor = tf.compat.v1.train.get_global_step()
        losses = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)
        self._loss = losses[-1] if losses else None
        self._meter = base.ProgressMeter(*self._settings)

    def before_run(self, run_context):
        fetches = {"step": self._step_tensor}
        if self._loss is not None:
            fetches["loss"] = self._loss
        return tf.estimator.SessionRunArgs(fetches)

    def after_run(self, run_context, run_values):
        # The step fetched with the run is the one before its update.
        self._meter.update(int(run_values.results["step"]) + 1, run_values.results.get("loss"))

    def end(self, session):
        if self._meter.end is not None:
            # The step fetched in before_run predates the last update.
            self._meter.finish(int(session.run(self._step_tensor)))

    def reached(self, step):
        """Step ``step`` is done (said before this hook's own after_run)."""
        if self._meter is not None:
            self._meter.update(step)

    def listener(self):
        """A checkpoint listener that brings the progress line of a step
        before the evaluation of that step's checkpoint: the Estimator's
        checkpoint saver, which triggers it, runs before this hook."""
        return _ProgressBeforeSave(self)


class _ProgressBeforeSave(tf.estimator.CheckpointSaverListener):
    def __init__(self, hook):
        self._hook = hook

    def before_save(self, session, global_step_value):
        self._hook.reached(int(global_step_value))


class ReleaseMemoryHook(tf.estimator.SessionRunHook):
    """Every ``every_steps`` steps of this task, hands the heap's free pages
    back to the system (:mod:`estimator_keras.memory`), on every task."""

    def __init__(self, every_steps):
        self._every, self._steps = max(1, int(every_steps)), 0

    def after_run(self, run_context, run_values):
        self._steps += 1
        if self._steps % self._every == 0:
            memory.release_free_memory()


class PreemptionListener(tf.estimator.CheckpointSaverListener):
    """After the checkpoint saved on a preemption stop: raises Preempted, so
    that no evaluation or export runs in the grace period."""

    def __init__(self, watch):
        self._watch = watch

    def after_save(self, session, global_step_value):
        if self._watch.requested:
            raise self._watch.stopped(int(global_step_value))


class EvaluationExporter(tf.estimator.Exporter):
    """Calls ``on_evaluation(checkpoint, metrics)`` after every evaluation:
    the Estimator's one per-evaluation callback, on whichever task evaluates
    (the chief locally, the evaluator in a cluster)."""

    def __init__(self, on_evaluation):
        self._on_evaluation = on_evaluation

    @property
    def name(self):
        return "evaluation"

    def export(self, estimator, export_path, checkpoint_path, eval_result,
               is_the_final_export):
        del estimator, export_path, is_the_final_export  # nothing goes to export_path
        self._on_evaluation(checkpoint_path, base.plain_metrics(eval_result))


class SummaryHook(tf.estimator.SessionRunHook):
    """Writes the training summaries (the loss, and any the model adds) into
    ``output_dir`` every ``every_steps`` steps, visible from each multiple of
    ``flush_every_steps`` (the checkpoint and evaluation steps) on: for a
    summary folder other than the model dir, the only one the Estimator's own
    summary saver writes to."""

    def __init__(self, output_dir, every_steps, flush_every_steps):
        self._dir = str(output_dir)
        self._every, self._flush_every = int(every_steps), int(flush_every_steps)
        self._summary = self._step = self._writer = self._last = self._written = None

    def begin(self):
        self._summary = tf.compat.v1.summary.merge_all()
        self._step = tf.compat.v1.train.get_global_step()
        self._writer = tf.compat.v1.summary.FileWriter(self._dir)
        self._last = self._written = None

    def before_run(self, run_context):
        fetches = {"step": self._step}
        if self._summary is not None and (
                self._written is None or self._last + 1 - self._written >= self._every):
            fetches["summary"] = self._summary
        return tf.estimator.SessionRunArgs(fetches)

    def after_run(self, run_context, run_values):
        # The step fetched with the run is the one before its update.
        step = int(run_values.results["step"]) + 1
        if "summary" in run_values.results:
            self._writer.add_summary(run_values.results["summary"], step)
            self._written = step
        if self._last is not None and step // self._flush_every > self._last // self._flush_every:
            self._writer.flush()
        self._last = step

    def end(self, session):
        self._writer.close()


class SummaryExporter(tf.estimator.Exporter):
    """Writes each evaluation's metrics as scalars into ``log_dir``, flushed at
    once (the Estimator writes its own into MODEL_DIR/eval only)."""

    def __init__(self, log_dir):
        self._writer = summaries.ScalarWriter(log_dir)

    @property
    def name(self):
        return "summaries"

    def export(self, estimator, export_path, checkpoint_path, eval_result,
               is_the_final_export):
        del estimator, export_path, checkpoint_path, is_the_final_export
        metrics = base.plain_metrics(eval_result)
        self._writer.write(metrics, metrics.get("global_step") or 0)


class BestExporter(tf.estimator.Exporter):
    """Keeps the Keras export of the best checkpoint by an eval metric.

    Pass it in ``train_and_evaluate(..., exporters=[...])``: after every
    evaluation it compares the metric with the best so far (remembered in
    ``MODEL_DIR/best/export.json``, so restarts keep it) and, when better,
    writes the same files as :func:`estimator_keras.export.export_model` into
    ``MODEL_DIR/best``.

    Example::

        best = BestExporter(build_model, "accuracy", higher_is_better=True)
        train_and_evaluate(est, train_fn, eval_fn, max_steps=5000, exporters=[best])
    """

    def __init__(self, model_builder, metric, higher_is_better=True, schema=None,
                 features=None, log=None):
        self._args = (model_builder, metric, higher_is_better)
        self._kwargs = {"schema": schema, "features": features, "log": log}

    @property
    def name(self):
        return "best_keras"

    def export(self, estimator, export_path, checkpoint_path, eval_result,
               is_the_final_export):
        del export_path, is_the_final_export  # the export goes next to the model dir
        model_builder, metric, higher_is_better = self._args
        return export.export_if_best(model_builder, estimator.model_dir, checkpoint_path,
                                     eval_result, metric, higher_is_better, **self._kwargs)


def train_and_evaluate(estimator, train_input_fn, eval_input_fn, *, max_steps,
                       eval_every_steps=None, eval_steps=None, batch_size=None,
                       replicas=1, log_every_steps=100, early_stopping=None,
                       exporters=(), hooks=(), log=None, preemption=None, chief=True,
                       stop_with_chief=False, on_progress=None):
    """Trains and evaluates an Estimator; returns the final eval metrics.

    Evaluation runs every time a checkpoint is saved, so the evaluation
    interval is the RunConfig's ``save_checkpoints_steps`` (see
    :func:`run_config`), and once at the end; ``eval_every_steps`` tells the
    early-stopping hook how often to look. ``exporters`` (e.g.
    :class:`BestExporter`) run after each evaluation. In a cluster only the
    evaluator evaluates, so every other task returns None. With a
    ``preemption`` watch (entered by the caller), SIGTERM or SIGINT ends
    training after the current step with a checkpoint of it (saved by the
    ``chief``, which this task is unless told otherwise). Under
    MultiWorkerMirroredStrategy every task stops after the same step, the
    first whose gradient sum carried a task's signal
    (:class:`~estimator_keras.engines.estimator.sums.PreemptionHook`),
    and a worker (``stop_with_chief``) raises Preempted naming the step the
    chief saved. ``log`` takes the progress lines, and ``on_progress(step,
    loss, seconds_left)`` is called with each.

    Raises:
      NumericalError: the loss became NaN or infinite.
      Preempted: training stopped on a signal.
    """
    base.check_positive("max_steps", max_steps)
    progress = ProgressHook(log_every_steps, batch_size, replicas, log, int(max_steps),
                            on_progress)
    train_hooks = [progress, ReleaseMemoryHook(eval_every_steps or RELEASE_MEMORY_STEPS), *hooks]
    listeners = [progress.listener()]
    stop_hook = None
    if preemption is not None:
        stop_hook = estimator_sums.PreemptionHook(preemption, alone=not stop_with_chief)
        train_hooks.append(stop_hook)
        listeners.append(PreemptionListener(preemption))
    if early_stopping is not None:
        # TensorFlow's hook applies EarlyStopping.should_stop's rule to the
        # evaluations it reads from the eval dir, which in a cluster the
        # evaluator writes.
        make_hook = (tf.estimator.experimental.stop_if_no_increase_hook
                     if early_stopping.higher_is_better
                     else tf.estimator.experimental.stop_if_no_decrease_hook)
        train_hooks.append(make_hook(
            estimator, early_stopping.metric, early_stopping.patience_steps,
            run_every_secs=None, run_every_steps=eval_every_steps or log_every_steps))
    train_spec = tf.estimator.TrainSpec(train_input_fn, max_steps=int(max_steps),
                                        hooks=train_hooks, saving_listeners=listeners)
    eval_spec = tf.estimator.EvalSpec(eval_input_fn, steps=eval_steps,
                                      exporters=list(exporters),
                                      start_delay_secs=0, throttle_secs=0)
    try:
        result = tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
    except tf.compat.v1.train.NanLossDuringTrainingError as e:
        raise base.nan_error(None, tf.train.latest_checkpoint(estimator.model_dir)) from e
    except tf.errors.OpError as e:
        if stop_with_chief and preemption is not None and preemption.requested:
            # The chief saved and left: this worker's next all-reduce fails.
            raise preemption.stopped(None) from e
        if estimator.config.task_type == "worker" and not stop_with_chief:
            done = finished_by_chief(e, estimator.model_dir, max_steps)
            if done is not None:
                if log is not None:
                    log(f"the chief finished the training at step {done}; this worker's last "
                        f"step ended with it ({type(e).__name__})")
                return None
        raise
    if preemption is not None and preemption.requested:
        if not chief and stop_hook.stopped_at is not None:
            # Stopped after the step the cluster agreed on, which the chief saves.
            raise preemption.stopped(stop_hook.stopped_at, by_chief=True)
        # Where no listener saw the final save (a worker, or a strategy that
        # leaves saving listeners out), the checkpoint on disk says the step.
        latest = tf.train.latest_checkpoint(estimator.model_dir) if chief else None
        raise preemption.stopped(checkpoints.checkpoint_step(latest) if latest else None)
    if result is None:
        return None
    return base.plain_metrics(result[0])


def finished_by_chief(error, model_dir, max_steps, wait_secs=FINAL_CHECKPOINT_WAIT_SECS):
    """The step of the chief's final checkpoint when an asynchronous
    (parameter server) worker's step failed with ``error`` because the
    training was over, else None.

    A worker's step reads and updates variables on the ps tasks while the
    chief ends the training on its own clock; a step in flight then can end
    cancelled, aborted or unavailable. That is the end of the worker's work,
    not a failure, once the global step reached ``max_steps``: the chief's
    final checkpoint in ``model_dir`` says so. It may land a moment after the
    error, so this looks for it for up to ``wait_secs``."""
    if not isinstance(error, ENDED_REMOTELY):
        return None
    deadline = time.monotonic() + wait_secs
    while True:
        latest = tf.train.latest_checkpoint(model_dir)
        step = checkpoints.checkpoint_step(latest) if latest else None
        if step is not None and step >= max_steps:
            return step
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.5)


# The arguments an Estimator passes an input_fn, each only where it names it.
INPUT_FN_ARGS = ("params", "mode", "config", "input_context")


def model_input_fn(model, input_fn):
    """``input_fn`` with its features as ``model`` takes them: for a model
    of one input, the one feature's tensor whatever the input is named
    (``model_to_estimator`` matches a dict to the model's input names, and
    Keras names an unnamed Input itself); otherwise ``input_fn`` itself.
    The wrapper names the arguments ``input_fn`` names, as the Estimator
    passes only those."""
    if input_fn is None or model_inputs.one_input_feed(model) is None:
        return input_fn
    wanted = [a for a in INPUT_FN_ARGS if a in inspect.signature(input_fn).parameters]

    def fed(params=None, mode=None, config=None, input_context=None):
        given = {"params": params, "mode": mode, "config": config,
                 "input_context": input_context}
        return model_inputs.as_model_inputs(model, input_fn(**{a: given[a] for a in wanted}))

    return fed


def compile_for_estimator(plan):
    """The plan's model compiled with the legacy Keras optimizers."""
    model = plan.build_model()
    model.compile(optimizer=optimizers.legacy_optimizer(plan.optimizer, plan.learning_rate),
                  loss=keras_loss(plan.loss, model), metrics=plan.metrics())
    return model


# The steps of Model.fit and evaluate a model's class may override.
FIT_STEPS = ("train_step", "test_step", "compute_loss", "compute_metrics")


class EstimatorEngine(base.TFCheckpointEngine):
    """:class:`~estimator_keras.engines.base.Engine` over ``model_to_estimator``."""

    name = "estimator"

    def _estimator(self, plan, **run_config_kwargs):
        """(the Estimator, the plan's train input_fn, its eval input_fn), the
        input_fns serving features as the model takes them."""
        model = compile_for_estimator(plan)
        config = run_config(plan.model_dir, **run_config_kwargs)
        note = estimator_sums.dense_sum_note(model, config.train_distribute)
        if note and plan.chief:
            plan.hooks.log(note)
        estimator = to_estimator(model, config=config)
        return (estimator, model_input_fn(model, plan.train_data),
                model_input_fn(model, plan.eval_data))

    def prepare(self, plan, is_chief):
        if not is_chief:
            _wait_for_warm_start(plan.model_dir, plan.hooks.log)

    def check_model(self, model, source):
        # model_to_estimator builds its own model_fn from the model's call,
        # loss and optimizer: Model.fit's steps never run under it.
        cls = type(model)
        overridden = [name for name in FIT_STEPS
                      if getattr(cls, name, None) is not getattr(tf.keras.Model, name, None)]
        if overridden:
            raise ConfigError(
                f"{source} returned a {cls.__name__} model that overrides "
                f"{', '.join(f'keras.Model.{name}' for name in overridden)}: the estimator "
                f"engine trains with tf.estimator (model_to_estimator), which never calls "
                f"{'it' if len(overridden) == 1 else 'them'}, so the model would run "
                f"without {'it' if len(overridden) == 1 else 'them'}; train it with an engine "
                f"whose Model.fit calls {'it' if len(overridden) == 1 else 'them'}: --engine "
                f"keras (Keras 2) or keras3 (Keras 3), whichever trains the model's Keras "
                f"here (`python -m experiments list` says which this environment runs).")

    def train(self, plan):
        model_dirs.check_can_continue(plan.model_dir, self.name)
        finished = self._finished(plan)
        if finished is not None:
            return finished
        # A summary dir of its own (Vertex AI's) gets the summaries as they are
        # written; the Estimator's eval summaries stay in the model dir too,
        # where early stopping reads them.
        elsewhere = bool(plan.summary_dir) and (
            plan.summary_dir.rstrip("/") != plan.model_dir.rstrip("/"))
        estimator, train_fn, eval_fn = self._estimator(
            plan, save_checkpoints_steps=plan.eval_every_steps,
            keep_checkpoint_max=plan.keep_checkpoint_max,
            log_every_steps=plan.log_every_steps, train_distribute=plan.strategy,
            seed=plan.seed, summaries=not elsewhere)
        if plan.chief:
            latest = tf.train.latest_checkpoint(plan.model_dir)
            if latest:
                plan.hooks.log(f"resuming from {latest}")

        def on_evaluation(checkpoint, metrics):
            plan.hooks.log(f"evaluated step {int(metrics.get('global_step', -1))}: "
                           f"{base.format_metrics(metrics)}")
            plan.hooks.on_evaluation(checkpoint, metrics)

        hooks, exporters = [], [EvaluationExporter(on_evaluation)]
        if elsewhere:
            if plan.chief:
                hooks.append(SummaryHook(plan.summary_dir, summary_steps(plan.log_every_steps),
                                         plan.eval_every_steps))
            exporters.insert(0, SummaryExporter(io.join(plan.summary_dir, "eval")))
        metrics = train_and_evaluate(
            estimator, train_fn, eval_fn, max_steps=plan.max_steps,
            eval_every_steps=plan.eval_every_steps, eval_steps=plan.eval_steps,
            batch_size=plan.batch_size, replicas=plan.replicas,
            log_every_steps=plan.log_every_steps, early_stopping=plan.early_stopping,
            exporters=exporters, hooks=hooks, log=plan.hooks.log,
            on_progress=plan.hooks.on_progress, preemption=plan.preemption, chief=plan.chief,
            stop_with_chief=plan.strategy is not None and not plan.chief)
        step = int(metrics["global_step"]) if metrics and "global_step" in metrics else None
        return base.RunResult(None, metrics, step, None)

    def _finished(self, plan):
        """The evaluation of a one-process run already at ``max_steps``
        (a RunResult), else None. tf.estimator skips a finished run by the
        checkpoint's ``global_step``, which the Estimator of a Keras model
        saves as ``estimator_global_step``: it would train one step more."""
        if not plan.chief or plan.group.multi_process:
            return None
        latest = tf.train.latest_checkpoint(plan.model_dir)
        step = checkpoints.checkpoint_step(latest) if latest else None
        if step is None or step < plan.max_steps:
            return None
        metrics = self.evaluate(plan, latest)
        plan.hooks.log(f"evaluated step {step}: {base.format_metrics(metrics)}")
        return base.RunResult(None, metrics, step, None)

    def evaluate(self, plan, checkpoint):
        self.check_can_restore(checkpoint)
        estimator, _, eval_fn = self._estimator(plan)
        return base.plain_metrics(estimator.evaluate(eval_fn, steps=plan.eval_steps,
                                                     checkpoint_path=checkpoint))

    def check_can_restore(self, checkpoint):
        estimator_checkpoints.check_can_restore(checkpoint)

    def finish_worker(self, model_dir, task_index, strategy_name):
        if strategy_name == "multi_worker_mirrored":
            # The Estimator's non-chief workers checkpoint into a scratch dir
            # the chief never reads.
            io.rmtree(base.scratch_dir(model_dir, task_index))


def _wait_for_warm_start(model_dir, log):
    """model_to_estimator writes the initial weights to MODEL_DIR/keras/ unless
    a checkpoint is there; tasks writing it at the same time break each
    other's save ("MergeV2Checkpoints ... No such file"). The chief writes it;
    the other tasks wait for it."""
    keras_dir = io.join(model_dir, "keras")
    deadline = time.monotonic() + CHIEF_WAIT_SECS
    waited = False
    while not tf.train.latest_checkpoint(keras_dir):
        if time.monotonic() > deadline:
            raise ModelDirError(f"the chief did not write the initial weights to {keras_dir} "
                            f"within {CHIEF_WAIT_SECS} s; is the chief task running with the "
                            f"same --model-dir?")
        if not waited:
            log(f"waiting for the chief to write the initial weights to {keras_dir}")
            waited = True
        time.sleep(0.5)
