"""What every engine shares: the interface, the run description, the result,
the hooks a runner plugs into, and the engine-neutral rules (progress lines,
early stopping, the NaN message).

An engine trains a Keras model described by a :class:`TrainingPlan`,
checkpointing and evaluating every ``eval_every_steps`` steps, and reports
through the plan's :class:`TrainingHooks`: ``log`` for progress lines and
``on_evaluation(checkpoint, metrics)`` after each evaluation (where a runner
keeps the best export). The ``estimator`` and ``keras`` engines write
checkpoints with the same object-based keys, so evaluation, export and early
stopping do not care which of them trained; what differs between engines
(their checkpoints, exports, cluster roles) is behind :class:`Engine`.

Example::

    from estimator_keras.engines import get_engine
    engine = get_engine("keras")
    result = engine.train(TrainingPlan(model_dir="/tmp/run", build_model=build, ...))
    print(result.metrics, result.global_step)
"""

import abc
import dataclasses
import inspect
import logging
import math
import time
import typing

from estimator_keras import io
from estimator_keras.distribute import groups
from estimator_keras.errors import ModelDirError, NumericalError, UsageError

# Keras returns to Python (and to the callbacks) once per call of its compiled
# training function: a small model's step is mostly that return, so the Keras
# engines run this many steps in a call. The callbacks see every this many
# steps at most, so a preemption's checkpoint waits for at most this many.
MAX_STEPS_PER_EXECUTION = 8

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class EarlyStopping:
    """Stop training when an eval metric stops improving.

    The rule, the same for both engines: training stops at the first
    evaluation that comes ``patience_steps`` or more steps after the best one.

    Attributes:
      metric: eval metric name, e.g. "accuracy" or "loss".
      patience_steps: stop when the metric has not improved for this many
        training steps.
      higher_is_better: True for accuracy-like metrics, False for losses.
    """

    metric: str
    patience_steps: int
    higher_is_better: bool = True

    def better(self, value, best):
        return best is None or (value > best if self.higher_is_better else value < best)

    def should_stop(self, history):
        """True when ``history``, a list of (step, value) in evaluation order,
        calls for stopping."""
        best = best_step = None
        for step, value in history:
            if self.better(value, best):
                best, best_step = value, step
            if step - best_step >= self.patience_steps:
                return True
        return False


class TrainingHooks:
    """What an engine reports while it trains. The defaults log through
    ``logging``; a runner passes its own ``log``, ``on_evaluation`` and
    ``on_progress``."""

    def __init__(self, log=None, on_evaluation=None, on_progress=None):
        self._log = log
        self._on_evaluation = on_evaluation
        self._on_progress = on_progress

    def log(self, message):
        (self._log or logger.info)(message)

    def on_progress(self, step, loss, seconds_left, steps_per_sec=None):
        """With each progress line and the summary at the end: the global
        step, the training loss, the estimated seconds left and the steps/s
        since the previous line (each None when unknown)."""
        if self._on_progress is not None:
            self._on_progress(step, loss, seconds_left, steps_per_sec)

    def on_evaluation(self, checkpoint, metrics):
        """After an evaluation of ``checkpoint``; ``metrics`` holds the eval
        metrics and ``global_step``."""
        if self._on_evaluation is not None:
            self._on_evaluation(checkpoint, metrics)


@dataclasses.dataclass(frozen=True)
class TrainingPlan:
    """Everything an engine needs to train and evaluate one model; frozen:
    every field is set when it is built (``dataclasses.replace`` makes a
    changed copy)."""

    model_dir: str
    """Checkpoints, summaries and (keras engine) the crash backup."""
    build_model: typing.Callable
    """Returns the uncompiled Keras model (raw record values in, scaling
    inside); each engine compiles it with its own optimizers."""
    loss: object
    """The Keras loss (a name or an object)."""
    metrics: typing.Callable
    """Returns the list of Keras metrics for ``compile``."""
    train_data: typing.Callable
    """``fn(input_context=None)`` -> the training ``tf.data.Dataset``
    (per-pipeline batches, repeating forever); an ``input_fn`` from
    :func:`estimator_keras.make_input_fn` serves every engine. A function
    that also takes ``start_step`` is given the step training resumes at
    (see :func:`training_input`)."""
    eval_data: typing.Callable
    """The same for one pass over the eval split."""
    max_steps: int
    """Train until the global step reaches this (over all runs)."""
    eval_every_steps: int
    """Steps between checkpoints and evaluations."""
    optimizer: str = "adam"
    """Optimizer name (see :mod:`estimator_keras.engines.optimizers`)."""
    learning_rate: float = 1e-3
    """The optimizer's learning rate."""
    eval_steps: typing.Optional[int] = None
    """Batches per evaluation (None: the whole eval split)."""
    batch_size: typing.Optional[int] = None
    """Per-replica batch, for the examples/s of progress lines."""
    replicas: int = 1
    """Replicas updating in sync (progress lines only)."""
    log_every_steps: int = 100
    """Steps between progress lines."""
    keep_checkpoint_max: int = 5
    """Checkpoints kept in ``model_dir``."""
    seed: typing.Optional[int] = None
    """TensorFlow's random seed (None: random)."""
    early_stopping: typing.Optional[EarlyStopping] = None
    """An :class:`EarlyStopping`, or None."""
    strategy: typing.Any = None
    """What training runs under: a ``tf.distribute`` strategy, a
    :class:`~estimator_keras.distribute.groups.TrainingGroup` (processes
    joined outside TensorFlow), or None; engines ask :attr:`group`."""
    hooks: TrainingHooks = dataclasses.field(default_factory=TrainingHooks)
    """Where progress lines and evaluations are reported."""
    preemption: typing.Any = None
    """A :class:`~estimator_keras.distribute.preemption.PreemptionWatch` that is
    watching (the caller enters it), or None: then signals act as usual."""
    chief: bool = True
    """Whether this task saves the checkpoints (the chief, or a lone process)."""
    summary_dir: typing.Optional[str] = None
    """Where the TensorBoard summaries go as training runs (Vertex AI's
    AIP_TENSORBOARD_LOG_DIR); None: ``model_dir``."""

    def __post_init__(self):
        check_positive("max_steps", self.max_steps)
        check_positive("eval_every_steps", self.eval_every_steps)
        # Still part of construction: a frozen field takes object.__setattr__.
        object.__setattr__(self, "model_dir", str(self.model_dir))
        object.__setattr__(self, "max_steps", int(self.max_steps))
        object.__setattr__(self, "eval_every_steps", int(self.eval_every_steps))
        object.__setattr__(self, "_group", groups.of(self.strategy))

    @property
    def group(self):
        """What training runs under, as a
        :class:`~estimator_keras.distribute.groups.TrainingGroup`."""
        return self._group


@dataclasses.dataclass
class RunResult:
    """What an engine's training returns.

    Attributes:
      model: the trained model where the engine holds one (keras), else None.
      metrics: the last evaluation's metrics and ``global_step``; None on
        tasks that do not evaluate.
      global_step: the step training ended at, where known.
      checkpoint: the checkpoint to export (None: the latest in model_dir;
        always None on non-chief tasks).
    """

    model: object
    metrics: dict
    global_step: int
    checkpoint: str


class Engine(abc.ABC):
    """A way to train (``estimator``, ``keras``, ``keras3``...): everything
    in which the engines differ, so that a runner never asks for an engine
    by name. What must be known before an engine is imported (which tasks
    of a cluster it runs, what to set before TensorFlow loads) is in
    :mod:`estimator_keras.engines` instead."""

    name = None

    @abc.abstractmethod
    def train(self, plan):
        """Trains and evaluates ``plan``; returns a :class:`RunResult`. The
        engine logs through ``plan.hooks``: where it resumes from, and each
        evaluation's metrics before ``plan.hooks.on_evaluation``.

        Raises:
          NumericalError: the loss became NaN or infinite.
        """

    @abc.abstractmethod
    def evaluate(self, plan, checkpoint):
        """The metrics of ``checkpoint`` (one :meth:`latest_checkpoint`
        returns) on ``plan.eval_data``, with ``global_step``."""

    @abc.abstractmethod
    def latest_checkpoint(self, model_dir):
        """The checkpoint this engine would resume from in ``model_dir`` (a
        path or prefix; one another engine wrote where this engine continues
        from it), or None when there is none."""

    @abc.abstractmethod
    def checkpoint_step(self, checkpoint):
        """The global step stored in ``checkpoint`` (None when unknown)."""

    @abc.abstractmethod
    def check_compatible(self, model, checkpoint):
        """Raises ModelDirError naming each weight of ``model`` (an
        uncompiled model of the experiment) that ``checkpoint`` lacks or
        holds in another shape, and each it holds that the model lacks."""

    @abc.abstractmethod
    def export(self, model_builder, model_dir, *, checkpoint, **options):
        """Writes the export of ``checkpoint`` and returns its folder.
        ``options`` are those of :func:`estimator_keras.export.export_model`
        (schema, features, export_dir, metadata, class_names, flat,
        output_activation: the activation the serving signature applies to a
        logits output, None when the model already outputs probabilities)."""

    @abc.abstractmethod
    def export_if_best(self, model_builder, model_dir, checkpoint, metrics, metric,
                       higher_is_better=True, **options):
        """Exports ``checkpoint`` to ``MODEL_DIR/best`` when its ``metric``
        beats the one recorded there; returns that folder, or None. As
        :func:`estimator_keras.export.export_if_best` (options: schema,
        features, log, class_names)."""

    def written_by(self, checkpoint):
        """The engine that wrote ``checkpoint`` (one :meth:`latest_checkpoint`
        returned), for export.json; the default: this engine."""
        return self.name

    def require_checkpoint(self, model_dir):
        """:meth:`latest_checkpoint`; ModelDirError when there is none."""
        found = self.latest_checkpoint(model_dir)
        if not found:
            raise ModelDirError(f"{model_dir} holds no checkpoint: train first "
                                f"(`python -m experiments train ... --model-dir {model_dir}`).")
        return found

    def check_can_restore(self, checkpoint):
        """Raises ModelDirError when this engine cannot continue from
        ``checkpoint``; the default accepts every checkpoint."""

    def prepare(self, plan, is_chief):
        """Called on every task before training; a place to wait for what the
        chief writes first."""

    def finish_worker(self, model_dir, task_index, strategy_name):
        """Called on a non-chief training worker after it trained: removes
        what only that task wrote. The default removes nothing."""

    # Whether a checkpoint continues under another learning_rate_decay: not
    # where it holds the optimizer's variables, whose set the decay changes.
    resumes_across_decays = True

    def check_model(self, model, source):
        """Raises ConfigError when this engine cannot train ``model`` as its
        author wrote it (``source`` names what built it). The default
        accepts every model of the engine's Keras."""

    def random_layers_restarted(self, model):
        """The names of ``model``'s random layers whose state this engine's
        checkpoints do not keep: after a resume their draws (dropout masks,
        noise, augmentations) start over, so a resumed run is not
        bit-identical to one never stopped. The default: every one
        (:func:`random_layers`)."""
        return random_layers(model)


def random_layers(model):
    """The names of ``model``'s layers (of ``layers``, recursively) that
    draw random numbers as they train: those with a ``seed`` in their
    config, as Keras' Dropout, GaussianNoise and RandomFlip have, in Keras 2
    and 3."""
    found, pending = [], list(getattr(model, "layers", ()))
    while pending:
        layer = pending.pop(0)
        if hasattr(layer, "layers"):
            pending[:0] = layer.layers  # a nested model's, in their order
            continue
        try:
            config = layer.get_config()
        except (NotImplementedError, TypeError, ValueError, AttributeError):
            config = None  # a custom layer without a config
        if isinstance(config, dict) and "seed" in config:
            found.append(layer.name)
    return found


class TFCheckpointEngine(Engine):
    """An engine whose checkpoints are TensorFlow object-based checkpoints in
    ``MODEL_DIR`` with the model's weight keys (``estimator`` and ``keras``:
    each continues from the other's), exported by :mod:`estimator_keras.export`."""

    # TensorFlow is imported in the methods: this module stays light.
    # pylint: disable=import-outside-toplevel

    def latest_checkpoint(self, model_dir):
        """The newest TF checkpoint; ModelDirError where the keras3 engine has
        checkpointed (Keras 2 cannot read its files, and an older TF
        checkpoint beside them would lose its steps)."""
        import tensorflow as tf
        from estimator_keras.engines import model_dirs
        model_dirs.check_can_continue(model_dir, self.name)
        return tf.train.latest_checkpoint(str(model_dir))

    def written_by(self, checkpoint):
        from estimator_keras.engines import model_dirs
        return model_dirs.checkpoint_engine(checkpoint)

    def checkpoint_step(self, checkpoint):
        from estimator_keras import checkpoints
        return checkpoints.checkpoint_step(checkpoint)

    def check_compatible(self, model, checkpoint):
        from estimator_keras import checkpoints
        checkpoints.check_compatible(model, checkpoint)

    def export(self, model_builder, model_dir, *, checkpoint, **options):
        from estimator_keras import export
        return export.export_model(model_builder, model_dir, checkpoint=checkpoint, **options)

    def export_if_best(self, model_builder, model_dir, checkpoint, metrics, metric,
                       higher_is_better=True, **options):
        from estimator_keras import export
        return export.export_if_best(model_builder, model_dir, checkpoint, metrics, metric,
                                     higher_is_better, **options)


def check_positive(name, value):
    if value is None or isinstance(value, bool) or int(value) < 1:
        raise UsageError(f"{name} must be a positive integer; given {value!r}.")


def nan_error(step, checkpoint):
    """The NumericalError both engines raise when the loss is NaN or infinite."""
    at = f" at step {step}" if step is not None else ""
    return NumericalError(
        f"training stopped{at}: the loss became NaN or infinite. The last good checkpoint "
        f"is {checkpoint or '(none written yet)'}. Lower the learning rate (--hparams "
        f"learning_rate=...) or check the inputs for NaNs.")


def plain_metrics(metrics):
    """Metrics as Python numbers (TensorFlow hands back numpy scalars; the
    step stays an integer)."""
    return {k: (v.item() if hasattr(v, "item") else v) for k, v in metrics.items()}


def validation_metrics(logs):
    """The evaluation's metrics out of a Keras epoch's logs (``val_*``)."""
    return {k[len("val_"):]: float(v) for k, v in (logs or {}).items() if k.startswith("val_")}


def record_evaluation(hooks, step, metrics, saved, chief, early_stopping, history):
    """Logs an evaluation, hands it to the hooks on the chief, and appends
    it to ``history``; True when ``early_stopping`` calls for a stop."""
    hooks.log(f"evaluated step {step}: {format_metrics(metrics)}")
    if chief:
        hooks.on_evaluation(saved, dict(metrics, global_step=step))
    if early_stopping is None or early_stopping.metric not in metrics:
        return False
    history.append((step, metrics[early_stopping.metric]))
    return early_stopping.should_stop(history)


def finite_loss(logs, step, checkpoint):
    """The loss in a Keras callback's ``logs`` as a float (None when absent);
    a NaN or infinite loss raises :func:`nan_error` (``checkpoint``: a
    callable giving the last good checkpoint)."""
    loss = (logs or {}).get("loss")
    if loss is None:
        return None
    loss = float(loss)
    if not math.isfinite(loss):
        raise nan_error(step, checkpoint())
    return loss


def format_metrics(metrics):
    """"accuracy 0.9012, loss 0.2764": every metric but the step, 4 digits."""
    return ", ".join(f"{k} {float(v):.4f}" for k, v in sorted(metrics.items())
                     if k != "global_step")


def training_input(train_data, input_context, start_step):
    """``train_data(input_context=...)``, told the step training resumes
    at where it takes ``start_step`` (the functions of
    :func:`~estimator_keras.make_input_fn` do), so that it skips the batches
    consumed before."""
    if "start_step" in inspect.signature(train_data).parameters:
        return train_data(input_context=input_context, start_step=int(start_step))
    return train_data(input_context=input_context)


def scratch_dir(model_dir, task_id):
    """Where a non-chief MultiWorkerMirrored worker writes the checkpoints it
    must write to stay in step with the chief, and nobody reads. TensorFlow's
    Estimator names it so; the keras engine follows."""
    return io.join(model_dir, f"tmp_worker_{task_id}")


def progress_line(head, since, until, loss=None, batch_size=None, replicas=1):
    """"HEAD, loss L, R steps/s, E examples/s" between two (step, seconds)
    points, or None when no step was taken."""
    rate = steps_per_sec(since, until)
    if rate is None:
        return None
    parts = [head]
    if loss is not None:
        parts.append(f"loss {float(loss):.4f}")
    parts.append(f"{rate:.1f} steps/s")
    if batch_size:
        parts.append(f"{rate * batch_size * replicas:,.0f} examples/s")
    return ", ".join(parts)


def steps_per_sec(since, until):
    """The rate between two (step, seconds) points; None when no step was taken."""
    steps, secs = until[0] - since[0], max(until[1] - since[1], 1e-9)
    return steps / secs if steps > 0 else None


def duration(seconds):
    """"42 s", "7 min 5 s", "1 h 12 min": a time a person reads at a glance."""
    seconds = int(round(max(seconds, 0)))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


class ProgressMeter:
    """Turns (step, loss) reports into progress lines every ``every_steps``
    steps (``step N/M``, loss, rates and the estimated time left, from the
    average rate so far), and a summary at the end; every engine feeds it.
    With each line, and at the end, it calls ``on_progress(step, loss,
    seconds_left, steps_per_sec)``."""

    def __init__(self, every_steps, batch_size=None, replicas=1, log=None, max_steps=None,
                 on_progress=None):
        self.every_steps = max(1, int(every_steps))
        self.batch_size, self.replicas = batch_size, replicas
        self.max_steps = max_steps
        self.log = log or logger.info
        self.on_progress = on_progress
        self.first = self.last = self.end = None
        self.loss = None

    def update(self, step, loss=None, now=None):
        now = time.monotonic() if now is None else now
        if loss is not None:
            self.loss = loss
        if self.last is None:
            # The first step includes tracing and start-up: rates start after it.
            self.first = self.last = (step, now)
            return
        self.end = (step, now)
        # On every multiple of every_steps (steps can jump under parameter servers).
        if step // self.every_steps > self.last[0] // self.every_steps:
            head = f"step {step}/{self.max_steps}" if self.max_steps else f"step {step}"
            line = progress_line(head, self.last, self.end, self.loss, self.batch_size,
                                 self.replicas)
            done, secs = step - self.first[0], now - self.first[1]
            left = None
            if line and self.max_steps and done > 0 and secs > 0:
                left = (self.max_steps - step) * secs / done
                line += f", {duration(left)} left"
            if line:
                self.log(line)
                if self.on_progress is not None:
                    self.on_progress(step, self.loss, left, steps_per_sec(self.last, self.end))
            self.last = self.end

    def finish(self, final_step, now=None):
        if self.first is None:
            return
        if now is None:
            now = self.end[1] if self.end else time.monotonic()
        line = progress_line(f"trained to step {final_step}:", self.first, (final_step, now),
                             self.loss, self.batch_size, self.replicas)
        if line:
            self.log(line.replace(":, ", ": ", 1) + " on average")
        rate = steps_per_sec(self.last, (final_step, now))
        if rate is not None and self.on_progress is not None:
            self.on_progress(final_step, self.loss, 0.0, rate)
