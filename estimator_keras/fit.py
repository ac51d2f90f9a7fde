"""The ``keras`` engine: ``Model.fit`` on the TFRecord pipeline, where
``tf.estimator`` does not exist (TensorFlow 2.16+ with tf-keras) or is not wanted.

It keeps the Estimator engine's contract, so that experiments, exports and
the cluster commands do not change:

- checkpoints in ``MODEL_DIR`` at the start and every ``eval_every_steps``
  steps, object-based with the model as root (the same weight keys the
  Estimator writes), so :func:`estimator_keras.export.export_model` and
  ``evaluate`` read either;
- evaluation on the eval split after every checkpoint, logged as
  ``evaluated step N: ...``; TensorBoard summaries in ``MODEL_DIR/train`` and
  ``MODEL_DIR/validation``;
- crash-resume with ``tf.keras.callbacks.BackupAndRestore`` in
  ``MODEL_DIR/backup`` (deleted when training completes); a finished run
  continues from its last checkpoint when ``max_steps`` grows, and a model
  dir the Estimator trained continues here at its global step;
- ``max_steps`` is exact: the step count is the optimizer's ``iterations``;
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

import dataclasses
import importlib.util
import logging
import math
import posixpath
import time

from estimator_keras.errors import NumericalError, UsageError
from estimator_keras.estimator import progress_line

logger = logging.getLogger(__name__)

BACKUP_DIR = "backup"
CHECKPOINT_NAME = "model.ckpt"
# Where TensorFlow's Keras TensorBoard callback puts the two runs.
SUMMARY_SUBDIRS = ("train", "validation")


@dataclasses.dataclass
class FitResult:
    """What :func:`fit_and_evaluate` returns.

    Attributes:
      model: the trained, compiled model.
      metrics: the last evaluation's metrics (without Keras' ``val_``
        prefix) and ``global_step``.
      global_step: optimizer steps taken in all runs on this model dir.
      checkpoint: the last checkpoint this task wrote (None on other tasks).
    """

    model: object
    metrics: dict
    global_step: int
    checkpoint: str


def checkpoint_step(checkpoint):
    """The training step stored in a checkpoint of either engine, or None."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    reader = tf.train.load_checkpoint(checkpoint)
    for key in ("estimator_global_step/.ATTRIBUTES/VARIABLE_VALUE", "global_step",
                "optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE",
                "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"):
        if reader.has_tensor(key):
            return int(reader.get_tensor(key))
    return None


def checkpoint_engine(checkpoint):
    """"estimator" or "keras": which engine wrote ``checkpoint``."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    reader = tf.train.load_checkpoint(checkpoint)
    return "estimator" if reader.has_tensor(
        "estimator_global_step/.ATTRIBUTES/VARIABLE_VALUE") else "keras"


def check_estimator_can_restore(checkpoint):
    """The Estimator restores only its own checkpoints (it needs its global
    step there); the keras engine restores both. Raises ModelDirError for a
    keras-engine checkpoint, saying what works instead."""
    from estimator_keras.errors import ModelDirError  # pylint: disable=import-outside-toplevel

    if checkpoint_engine(checkpoint) == "keras":
        model_dir = posixpath.dirname(str(checkpoint))
        raise ModelDirError(
            f"{model_dir} was trained by the keras engine, and tf.estimator cannot restore "
            f"its checkpoint {checkpoint} (it has no estimator_global_step). Use --engine "
            f"keras for this model dir, or start a new --model-dir; the weights move between "
            f"engines as {posixpath.join(model_dir, 'export', 'weights.h5')}.")


def _scratch_dir(model_dir, task_id):
    # Every worker saves when the chief does, as Keras' own callbacks do under
    # MultiWorkerMirroredStrategy, so that the tasks stay in step; the
    # non-chief copies go to a folder nobody reads, removed at the end.
    return posixpath.join(str(model_dir), f"tmp_worker_{task_id}")


def _task(strategy):
    """(is_chief, task id) of this process under ``strategy``."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not getattr(resolver, "task_type", None):
        return True, 0
    is_chief = strategy.extended.should_checkpoint
    return is_chief, int(resolver.task_id or 0)


def _make_callbacks(tf, *, model_dir, max_steps, log_every_steps, batch_size, replicas,
                    manager, is_chief, log, on_evaluation, first_run):
    """The callbacks that give ``fit`` the Estimator engine's behaviour."""

    class Steps(tf.keras.callbacks.Callback):
        """Stops at exactly max_steps, raises on a NaN loss, logs progress."""

        def __init__(self):
            super().__init__()
            self.first = self.last = None
            self.loss = None

        def _step(self):
            return int(self.model.optimizer.iterations.numpy())

        def on_train_batch_end(self, batch, logs=None):
            step = self._step()
            now = time.monotonic()
            loss = (logs or {}).get("loss")
            if loss is not None:
                self.loss = float(loss)
                if not math.isfinite(self.loss):
                    raise NumericalError(
                        f"training stopped at step {step}: the loss became NaN or "
                        f"infinite ({self.loss}). The last good checkpoint is "
                        f"{manager.latest_checkpoint or '(none written yet)'}. Lower the "
                        f"learning rate (--hparams learning_rate=...) or check the inputs "
                        f"for NaNs.")
            if self.last is None:
                # The first step includes tracing and start-up.
                self.first = self.last = (step, now)
            elif step % log_every_steps == 0:
                self._report(f"step {step}", self.last, (step, now))
                self.last = (step, now)
            if step >= max_steps:
                self.model.stop_training = True

        def on_train_end(self, logs=None):
            if self.first is not None:
                self._report(f"trained to step {self._step()} (average)", self.first,
                             (self._step(), time.monotonic()))

        def _report(self, head, since, until):
            line = progress_line(head, since, until, self.loss, batch_size, replicas)
            if line:
                log(line)

    class Checkpoints(tf.keras.callbacks.Callback):
        """Checkpoint, then report the evaluation, after every epoch
        (= every eval_every_steps steps, or the last, shorter one)."""

        def __init__(self):
            super().__init__()
            self.saved = None

        def on_train_begin(self, logs=None):
            if first_run:
                # Like the Estimator: a checkpoint of the initial weights, so
                # a run that fails early still leaves a good one.
                self.saved = manager.save(
                    checkpoint_number=int(self.model.optimizer.iterations.numpy()))

        def on_epoch_end(self, epoch, logs=None):
            step = int(self.model.optimizer.iterations.numpy())
            self.saved = manager.save(checkpoint_number=step)
            metrics = {k[len("val_"):]: float(v) for k, v in (logs or {}).items()
                       if k.startswith("val_")}
            if metrics:
                shown = ", ".join(f"{k} {v:.4f}" for k, v in sorted(metrics.items()))
                log(f"evaluated step {step}: {shown}")
                if is_chief and on_evaluation is not None:
                    on_evaluation(self.saved, dict(metrics, global_step=step))

    steps, checkpoints = Steps(), Checkpoints()
    # The backup first: then a checkpoint in MODEL_DIR never outruns the
    # backup, and a restart never restores an older state than it has.
    callbacks = [tf.keras.callbacks.BackupAndRestore(posixpath.join(str(model_dir), BACKUP_DIR)),
                 steps, checkpoints]
    if importlib.util.find_spec("tensorboard") is not None:
        callbacks.append(tf.keras.callbacks.TensorBoard(
            str(model_dir), update_freq=log_every_steps, profile_batch=0))
    elif is_chief:
        # TensorFlow 2.16+ no longer installs TensorBoard itself.
        log("TensorBoard is not installed: no summaries (pip install tensorboard)")
    return callbacks, checkpoints


def _distribute(strategy, dataset_fn):
    if strategy is None:
        return dataset_fn(None)
    return strategy.distribute_datasets_from_function(dataset_fn)


def fit_and_evaluate(build_compiled_model, train_dataset_fn, eval_dataset_fn, *, model_dir,
                     max_steps, eval_every_steps, eval_steps=None, batch_size=None,
                     strategy=None, keep_checkpoint_max=5, log_every_steps=100,
                     early_stopping=None, on_evaluation=None, log=None):
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
      early_stopping: an :class:`estimator_keras.estimator.EarlyStopping`.
      on_evaluation: ``fn(checkpoint, metrics)`` called on the chief after
        each evaluation (e.g. a best-model export).
      log: ``fn(str)`` for progress lines (default: logging.info).

    Raises:
      NumericalError: the loss became NaN or infinite.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from estimator_keras.engines import check_keras2  # pylint: disable=import-outside-toplevel
    check_keras2("keras")
    if max_steps is None or int(max_steps) < 1:
        raise UsageError(f"max_steps must be a positive integer; given {max_steps!r}.")
    if eval_every_steps is None or int(eval_every_steps) < 1:
        raise UsageError(f"eval_every_steps must be a positive integer; given "
                         f"{eval_every_steps!r}.")
    max_steps, eval_every_steps = int(max_steps), int(eval_every_steps)
    log = log or logger.info
    model_dir = str(model_dir)
    scope_strategy = strategy or tf.distribute.get_strategy()
    is_chief, task_id = _task(scope_strategy)
    replicas = int(scope_strategy.num_replicas_in_sync)
    tf.io.gfile.makedirs(model_dir)

    # Read before building the model: under MultiWorkerMirroredStrategy
    # building syncs the workers, so no task can have written a checkpoint
    # yet and every task sees the same answer.
    latest = tf.train.latest_checkpoint(model_dir)
    with scope_strategy.scope():
        model = build_compiled_model()
        if model.optimizer is None:
            raise UsageError("the keras engine needs a compiled model: call "
                             "model.compile(optimizer=..., loss=...) in build_compiled_model.")
        checkpoint = tf.train.Checkpoint(root=model)
        write_dir = model_dir if is_chief else _scratch_dir(model_dir, task_id)
        manager = tf.train.CheckpointManager(checkpoint, write_dir, max_to_keep=keep_checkpoint_max,
                                             checkpoint_name=CHECKPOINT_NAME)
        backup = posixpath.join(model_dir, BACKUP_DIR)
        backed_up = _backup_checkpoint(tf, backup)
        if latest and not backed_up:
            # A finished (or Estimator-trained) run: continue from its last
            # checkpoint. An interrupted one is BackupAndRestore's to restore.
            checkpoint.restore(latest).expect_partial()
            step = checkpoint_step(latest) or 0
            if int(model.optimizer.iterations.numpy()) != step:
                # Another engine's optimizer: its state is not restored, the step is.
                model.optimizer.iterations.assign(step)
            log(f"resuming from {latest} (step {step})")
        elif backed_up:
            log(f"restoring the interrupted run from {backed_up} "
                f"(BackupAndRestore; the last checkpoint is {latest})")
    step = int(model.optimizer.iterations.numpy())

    train_data = _distribute(strategy, train_dataset_fn)
    # Keras needs a step count for distributed datasets, and a worker's share
    # of a finite eval set is not known up front; handing Keras the plain
    # dataset lets it split each batch between replicas and end all of them
    # together. DATA sharding: every worker keeps its own batches of the
    # whole eval split, so nothing is counted twice or missed.
    eval_data = eval_dataset_fn(None)
    if strategy is not None:
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.DATA)
        eval_data = eval_data.with_options(options)
    callbacks, checkpoints = _make_callbacks(
        tf, model_dir=model_dir, max_steps=max_steps, log_every_steps=log_every_steps,
        batch_size=batch_size, replicas=replicas, manager=manager, is_chief=is_chief,
        log=log, on_evaluation=on_evaluation, first_run=latest is None)
    if early_stopping is not None:
        callbacks.append(tf.keras.callbacks.EarlyStopping(
            monitor="val_" + early_stopping.metric,
            patience=max(1, math.ceil(early_stopping.patience_steps / eval_every_steps)),
            mode="max" if early_stopping.higher_is_better else "min"))

    metrics = None
    if step < max_steps:
        history = model.fit(
            train_data, epochs=math.ceil(max_steps / eval_every_steps),
            initial_epoch=step // eval_every_steps, steps_per_epoch=eval_every_steps,
            validation_data=eval_data, validation_steps=eval_steps, callbacks=callbacks,
            verbose=0)
        last = {k[len("val_"):]: float(v[-1]) for k, v in history.history.items()
                if k.startswith("val_") and v}
        metrics = last or None
    step = int(model.optimizer.iterations.numpy())
    if metrics is None:
        # Nothing left to train (or BackupAndRestore ended it): evaluate the
        # model as it is, so every run reports its numbers.
        values = model.evaluate(eval_data, steps=eval_steps, verbose=0, return_dict=True)
        metrics = {k: float(v) for k, v in values.items()}
        log(f"evaluated step {step}: " + ", ".join(
            f"{k} {v:.4f}" for k, v in sorted(metrics.items())))
    metrics["global_step"] = step
    saved = checkpoints.saved or manager.latest_checkpoint
    if is_chief and not _backup_checkpoint(tf, backup):
        _remove(tf, backup)  # empty once training completed
    if not is_chief:
        _remove(tf, write_dir)
        saved = None
    return FitResult(model, metrics, step, saved)


def keras_optimizer(name, learning_rate=None):
    """A Keras optimizer by name ("adam", "sgd", ...), with ``learning_rate``.

    The keras engine uses the current optimizers, not the legacy ones the
    Estimator needs; weights and exports are the same either way.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from estimator_keras.estimator import OPTIMIZERS  # pylint: disable=import-outside-toplevel
    from estimator_keras.errors import ConfigError  # pylint: disable=import-outside-toplevel

    if name.lower() not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {name!r}; expected one of {', '.join(OPTIMIZERS)}.")
    config = {} if learning_rate is None else {"learning_rate": learning_rate}
    return tf.keras.optimizers.get({"class_name": name.lower(), "config": config})


def evaluate_checkpoint(build_compiled_model, checkpoint, dataset, steps=None):
    """Metrics of ``checkpoint`` (from either engine) on ``dataset``."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    model = build_compiled_model()
    tf.train.Checkpoint(root=model).restore(checkpoint).expect_partial()
    values = model.evaluate(dataset, steps=steps, verbose=0, return_dict=True)
    metrics = {k: float(v) for k, v in values.items()}
    metrics["global_step"] = checkpoint_step(checkpoint)
    return metrics


def _backup_checkpoint(tf, backup):
    """The checkpoint BackupAndRestore left in ``backup`` (in a subfolder of
    its choosing), or None."""
    if not tf.io.gfile.isdir(backup):
        return None
    for root, _, files in tf.io.gfile.walk(backup):
        if "checkpoint" in files and tf.train.latest_checkpoint(root):
            return tf.train.latest_checkpoint(root)
    return None


def _remove(tf, path):
    if tf.io.gfile.exists(path):
        tf.io.gfile.rmtree(path)
