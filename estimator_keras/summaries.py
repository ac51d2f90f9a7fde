"""TensorBoard HParams summaries: a run's hyperparameters beside its final metrics.

:func:`write_hparams` writes, into one event file under ``log_dir``, the
HParams plugin's session summary (``tensorboard.plugins.hparams.api.hparams``)
and each final metric as a scalar. Point TensorBoard at the folder holding the
runs (the trials of a study) and the HParams dashboard lists them side by side,
one row per run, its metric columns inferred from those scalars.

Works with TensorFlow 2.15 and 2.16+ with the ``tensorboard`` package (which
TensorFlow 2.16+ no longer installs: the ``keras`` extras bring it). Without
either nothing is written (:func:`missing` says why): ``tf.summary`` writes
the event files, so a run without TensorFlow (the keras3 engine on JAX) has
no summaries.

:class:`ScalarWriter` appends scalars to one event file and flushes them at
once: the engines write each evaluation's numbers with it, so that a
TensorBoard reading the summary folder (Vertex AI TensorBoard reading
``AIP_TENSORBOARD_LOG_DIR``) follows a run while it trains.

Example::

    write_hparams("runs/study/trial-3/hparams", {"learning_rate": 0.003, "units": 128},
                  {"accuracy": 0.84, "loss": 0.45}, step=2000)

    writer = ScalarWriter("gs://bucket/job/logs/eval")
    writer.write({"accuracy": 0.81, "loss": 0.52}, step=500)
"""

import concurrent.futures
import importlib
import importlib.util
import numbers

from estimator_keras import io

# Not a metric: the step the metrics belong to.
_SKIPPED_METRICS = ("global_step",)


def _hparam_value(value):
    """A value the HParams plugin stores (bool, int, float, str)."""
    if isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return str(value)


def _numbers(metrics):
    """name -> float for the metrics that are numbers (the step left out)."""
    found = {}
    for name, value in (metrics or {}).items():
        if name in _SKIPPED_METRICS or isinstance(value, bool):
            continue
        try:
            found[str(name)] = float(value)
        except (TypeError, ValueError):
            continue
    return found


def _eagerly(fn, *args):
    """Runs ``fn(*args)`` eagerly: here, or inside a graph (an Estimator's:
    the default graph is per thread) in a new thread."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel  (see missing())

    if tf.executing_eagerly():
        return fn(*args)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(fn, *args).result()


def missing():
    """Why no summaries are written here, in a few words; "" where they are.
    tf.summary's scalar and the HParams plugin come with the tensorboard
    package, which TensorFlow 2.16+ no longer installs (the keras extras do),
    and write with TensorFlow."""
    if importlib.util.find_spec("tensorflow") is None:
        return ("TensorFlow is not installed (tf.summary writes them: pip install "
                "tensorflow-cpu tensorboard)")
    if importlib.util.find_spec("tensorboard") is None:
        return "TensorBoard is not installed (pip install tensorboard)"
    return ""


def _have_tensorboard():
    return not missing()


def write_hparams(log_dir, hparams, metrics, step=0):
    """Writes the hyperparameters and final metrics of one run into ``log_dir``.

    Args:
      log_dir: the run's folder (local or ``gs://``); created when missing.
        Give each run its own (e.g. ``MODEL_DIR/hparams``): the dashboard
        treats each folder with a session summary as one run.
      hparams: name -> value (bool, int, float or str; other values are
        written as text).
      metrics: name -> number, e.g. the final evaluation; ``global_step`` is
        left out, non-numbers are skipped.
      step: the step the metrics were measured at.

    Returns:
      The event file written, or None without the ``tensorboard`` package
      (TensorFlow 2.16+ does not install it; the ``keras`` extras do) or
      without TensorFlow.
    """
    if not _have_tensorboard():
        return None
    log_dir = str(log_dir)
    io.makedirs(log_dir)
    before = set(io.glob(io.join(log_dir, "events.out.tfevents.*")))
    values = {str(k): _hparam_value(v) for k, v in (hparams or {}).items()}
    _eagerly(_write, log_dir, values, _numbers(metrics), step)
    written = sorted(set(io.glob(io.join(log_dir, "events.out.tfevents.*"))) - before)
    return written[-1] if written else None


def _write(log_dir, values, numbers, step):
    # An optional package: imported only where it is installed.
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    hp = importlib.import_module("tensorboard.plugins.hparams.api")
    writer = tf.summary.create_file_writer(log_dir)
    try:
        with writer.as_default():
            hp.hparams(values)
            for name, number in sorted(numbers.items()):
                tf.summary.scalar(name, number, step=int(step or 0))
        writer.flush()
    finally:
        writer.close()


class ScalarWriter:
    """Scalars into one event file in ``log_dir`` (local or ``gs://``, created
    on the first write), flushed after every write so that a TensorBoard
    reading the folder shows them while the run goes on. Call it eagerly or
    inside a graph. Without the ``tensorboard`` package or TensorFlow it
    writes nothing."""

    def __init__(self, log_dir):
        self.log_dir = str(log_dir)
        self._writer = None

    def write(self, metrics, step):
        """Writes every number in ``metrics`` (``global_step`` and
        non-numbers left out) at ``step``."""
        numbers = _numbers(metrics)
        if numbers and _have_tensorboard():
            _eagerly(self._write, numbers, int(step))

    def _write(self, numbers, step):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        if self._writer is None:
            io.makedirs(self.log_dir)
            self._writer = tf.summary.create_file_writer(self.log_dir)
        with self._writer.as_default():
            for name, number in sorted(numbers.items()):
                tf.summary.scalar(name, number, step=step)
        self._writer.flush()

    def close(self):
        if self._writer is not None:
            _eagerly(self._writer.close)
            self._writer = None
