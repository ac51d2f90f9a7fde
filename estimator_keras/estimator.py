"""Keras model -> tf.estimator, and training it with train_and_evaluate.

Wraps ``tf.keras.estimator.model_to_estimator`` so that its known traps
cannot bite: checkpoints are object-based (robust to auto-generated layer
names), the optimizer is a legacy Keras optimizer chosen explicitly (no
silent conversion), feature keys are checked against the model's input
names before training, and a NaN loss stops training with a clear error.

Example::

    model = build_model()   # functional Keras model, compiled
    est = to_estimator(model, "/tmp/run", batch_size=128)
    metrics = train_and_evaluate(
        est, make_input_fn(data, 128, training=True),
        make_input_fn(data, 128, training=False), max_steps=2000,
        eval_every_steps=500)
"""

import dataclasses
import inspect as pyinspect
import logging
import time

from estimator_keras.errors import ConfigError, NumericalError, SchemaError, UsageError

logger = logging.getLogger(__name__)

OPTIMIZERS = ("adam", "sgd", "rmsprop", "adagrad", "adamax", "nadam", "adadelta", "ftrl")


def legacy_optimizer(name_or_optimizer, learning_rate=None, **kwargs):
    """A ``tf.keras.optimizers.legacy`` optimizer, which the Estimator needs.

    Accepts a name ("adam", "sgd", ...) or a Keras optimizer object; a
    v2.11+ optimizer object is rebuilt as its legacy twin with the same
    learning rate and the hyperparameters both versions share.

    Example::

        model.compile(optimizer=legacy_optimizer("adam", 1e-3), loss=...)
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    legacy = tf.keras.optimizers.legacy
    if isinstance(name_or_optimizer, legacy.Optimizer):
        return name_or_optimizer
    if isinstance(name_or_optimizer, str):
        name = name_or_optimizer.lower()
        classes = {n: getattr(legacy, c) for n, c in (
            ("adam", "Adam"), ("sgd", "SGD"), ("rmsprop", "RMSprop"), ("adagrad", "Adagrad"),
            ("adamax", "Adamax"), ("nadam", "Nadam"), ("adadelta", "Adadelta"),
            ("ftrl", "Ftrl"))}
        if name not in classes:
            raise ConfigError(f"unknown optimizer {name_or_optimizer!r}; expected one "
                              f"of {', '.join(OPTIMIZERS)}.")
        if learning_rate is not None:
            kwargs["learning_rate"] = learning_rate
        return classes[name](**kwargs)
    cls = getattr(legacy, type(name_or_optimizer).__name__, None)
    if cls is None:
        raise ConfigError(
            f"optimizer {type(name_or_optimizer).__name__} has no legacy Keras "
            f"version, which tf.estimator requires; use one of "
            f"{', '.join(OPTIMIZERS)}.")
    config = name_or_optimizer.get_config()
    accepted = set(pyinspect.signature(cls.__init__).parameters)
    shared = {k: v for k, v in config.items() if k in accepted and k != "name"}
    if learning_rate is not None:
        shared["learning_rate"] = learning_rate
    return cls(**shared)


def check_feature_keys(model, feature_keys):
    """Raises SchemaError unless the features are exactly the model's inputs."""
    expected = set(model.input_names)
    given = set(feature_keys)
    if expected != given:
        raise SchemaError(
            f"the input pipeline's features must be keyed by the model's input "
            f"names: expected {sorted(expected)}, given {sorted(given)}, missing "
            f"{sorted(expected - given)}, unexpected {sorted(given - expected)}. "
            f"Map record features to inputs with InputConfig(features={{input: "
            f"feature}}).")


def run_config(model_dir, *, save_checkpoints_steps=None, save_checkpoints_secs=None,
               keep_checkpoint_max=5, log_every_steps=100, train_distribute=None,
               eval_distribute=None, seed=None, session_config=None):
    """A ``tf.estimator.RunConfig`` with this package's defaults.

    Checkpoints every ``save_checkpoints_steps`` (or 600 s when neither is
    given); TensorFlow's own step logging is turned off in favour of
    :class:`ProgressHook`.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    if save_checkpoints_steps is None and save_checkpoints_secs is None:
        save_checkpoints_secs = 600
    return tf.estimator.RunConfig(
        model_dir=str(model_dir), tf_random_seed=seed,
        save_checkpoints_steps=save_checkpoints_steps,
        save_checkpoints_secs=save_checkpoints_secs if save_checkpoints_steps is None else None,
        save_summary_steps=max(1, min(100, log_every_steps)),
        keep_checkpoint_max=keep_checkpoint_max, log_step_count_steps=None,
        train_distribute=train_distribute, eval_distribute=eval_distribute,
        session_config=session_config)


def to_estimator(keras_model, model_dir=None, config=None, **run_config_kwargs):
    """Wraps a compiled functional or Sequential Keras model as an Estimator.

    Args:
      keras_model: a compiled ``tf.keras`` model. A v2.11+ optimizer is
        replaced by its legacy twin here, explicitly, with an INFO log line.
      model_dir: where checkpoints and summaries go (ignored when ``config``
        carries one).
      config: a ``tf.estimator.RunConfig``; else one is made by
        :func:`run_config` from ``run_config_kwargs``.

    Returns:
      A ``tf.estimator.Estimator`` writing object-based checkpoints, which
      ``model.load_weights(checkpoint)`` restores exactly.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    if keras_model.optimizer is None:
        raise UsageError("to_estimator needs a compiled model: call "
                         "model.compile(optimizer=..., loss=...) first.")
    if not isinstance(keras_model.optimizer, tf.keras.optimizers.legacy.Optimizer):
        replacement = legacy_optimizer(keras_model.optimizer)
        logger.info("tf.estimator needs a legacy Keras optimizer: compiling with "
                    "legacy %s instead of %s", type(replacement).__name__,
                    type(keras_model.optimizer).__name__)
        keras_model.compile(optimizer=replacement, loss=keras_model.loss,
                            metrics=_compiled_metrics(keras_model))
    if config is None:
        if model_dir is None:
            raise UsageError("to_estimator needs a model_dir or a RunConfig.")
        config = run_config(model_dir, **run_config_kwargs)
    return tf.keras.estimator.model_to_estimator(
        keras_model=keras_model, config=config, checkpoint_format="checkpoint")


def _compiled_metrics(model):
    # Keras 2.15 keeps the metrics given to compile() only on its metrics
    # container; recompiling with the legacy optimizer must keep them.
    container = getattr(model, "compiled_metrics", None)
    metrics = getattr(container, "_user_metrics", None)
    return metrics


def progress_line(head, since, until, loss=None, batch_size=None, replicas=1):
    """"HEAD, loss L, R steps/s, E examples/s" between two (step, seconds)
    points, or None when no step was taken."""
    steps, secs = until[0] - since[0], max(until[1] - since[1], 1e-9)
    if steps <= 0:
        return None
    rate = steps / secs
    parts = [head]
    if loss is not None:
        parts.append(f"loss {float(loss):.4f}")
    parts.append(f"{rate:.1f} steps/s")
    if batch_size:
        parts.append(f"{rate * batch_size * replicas:,.0f} examples/s")
    return ", ".join(parts)


class ProgressHook:
    """Logs loss, steps/s and examples/s every ``every_steps`` steps.

    Built lazily as a ``tf.estimator.SessionRunHook`` subclass so that
    importing this module does not import TensorFlow.
    """

    def __new__(cls, every_steps=100, batch_size=None, replicas=1, log=None):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        class _Hook(tf.estimator.SessionRunHook):
            def begin(self):
                self._step_tensor = tf.compat.v1.train.get_global_step()
                losses = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)
                self._loss = losses[-1] if losses else None
                self._last = self._first = self._end = None
                self._loss_value = None

            def before_run(self, run_context):
                fetches = {"step": self._step_tensor}
                if self._loss is not None:
                    fetches["loss"] = self._loss
                return tf.estimator.SessionRunArgs(fetches)

            def after_run(self, run_context, run_values):
                step = int(run_values.results["step"])
                now = time.monotonic()
                self._loss_value = run_values.results.get("loss")
                if self._last is None:
                    # The first step includes graph start-up: rates start after it.
                    self._last = self._first = (step, now)
                    return
                self._end = (step, now)
                if step - self._last[0] >= every_steps:
                    self._report(f"step {step}", self._last, self._end)
                    self._last = self._end

            def end(self, session):
                if self._last is not None and self._end is not None:
                    # The step fetched in before_run predates the last update.
                    final = (int(session.run(self._step_tensor)), self._end[1])
                    self._report(f"trained to step {final[0]} (average)", self._first, final)

            def _report(self, head, since, until):
                line = progress_line(head, since, until, self._loss_value, batch_size, replicas)
                if line:
                    (log or logger.info)(line)

        return _Hook()


@dataclasses.dataclass
class EarlyStopping:
    """Stop training when an eval metric stops improving.

    Attributes:
      metric: eval metric name, e.g. "accuracy" or "loss".
      patience_steps: stop when the metric has not improved for this many
        training steps.
      higher_is_better: True for accuracy-like metrics, False for losses.
    """

    metric: str
    patience_steps: int
    higher_is_better: bool = True


def train_and_evaluate(estimator, train_input_fn, eval_input_fn, *, max_steps,
                       eval_every_steps=None, eval_steps=None, batch_size=None,
                       replicas=1, log_every_steps=100, early_stopping=None,
                       exporters=(), hooks=(), log=None):
    """Trains and evaluates an Estimator; returns the final eval metrics.

    Evaluation runs every time a checkpoint is saved, so the evaluation
    interval is the RunConfig's ``save_checkpoints_steps`` (see
    :func:`run_config`), and once at the end; ``eval_every_steps`` tells the
    early-stopping hook how often to look. ``exporters`` (e.g.
    :class:`estimator_keras.export.BestExporter`) run after each evaluation.
    In a cluster only the evaluator evaluates, so every other task returns
    None.

    Raises:
      NumericalError: the loss became NaN or infinite.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    if max_steps is None or int(max_steps) < 1:
        raise UsageError(f"max_steps must be a positive integer; given {max_steps!r}.")
    train_hooks = [ProgressHook(log_every_steps, batch_size, replicas, log), *hooks]
    if early_stopping is not None:
        make_hook = (tf.estimator.experimental.stop_if_no_increase_hook
                     if early_stopping.higher_is_better
                     else tf.estimator.experimental.stop_if_no_decrease_hook)
        train_hooks.append(make_hook(
            estimator, early_stopping.metric, early_stopping.patience_steps,
            run_every_secs=None, run_every_steps=eval_every_steps or log_every_steps))
    train_spec = tf.estimator.TrainSpec(train_input_fn, max_steps=int(max_steps),
                                        hooks=train_hooks)
    eval_spec = tf.estimator.EvalSpec(eval_input_fn, steps=eval_steps,
                                      exporters=list(exporters),
                                      start_delay_secs=0, throttle_secs=0)
    try:
        result = tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
    except tf.compat.v1.train.NanLossDuringTrainingError as e:
        latest = tf.train.latest_checkpoint(estimator.model_dir)
        raise NumericalError(
            f"training stopped: the loss became NaN or infinite. The last good "
            f"checkpoint is {latest or '(none written yet)'}. Lower the learning "
            f"rate (--hparams learning_rate=...) or check the inputs for NaNs.") from e
    if result is None:
        return None
    metrics, _ = result
    return {k: (float(v) if hasattr(v, "__float__") else v) for k, v in metrics.items()}
