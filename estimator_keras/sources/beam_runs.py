"""Running ``prepare``'s work as Apache Beam pipelines.

:func:`pipeline_options` turns ``prepare``'s ``--num-workers`` and the Beam
options given after ``--`` into :class:`PipelineOptions`: without
``--runner``, Beam's Python FnApiRunner on this machine (Beam's default
local runner tries Prism first, which downloads a binary on first use).
:class:`BeamMapper` is the importers' first pass (decoding every file once)
as a pipeline whose results come back in order. The writer is
:mod:`estimator_keras.beam_write`.

Apache Beam is imported here, so only ``prepare --beam`` loads it.
"""

import contextlib
import functools
import logging
import os
import pickle
import sys
import tempfile
import uuid
import warnings

from estimator_keras import io
from estimator_keras.errors import DataError, UsageError

LOCAL_RUNNER = "apache_beam.runners.portability.fn_api_runner.FnApiRunner"
"""The runner used when the Beam options name none."""
NAMESPACE = "estimator_keras"
"""The namespace of the pipelines' counters."""


def import_beam():
    """The ``apache_beam`` module; UsageError naming the extra when missing."""
    # Beam's import warns on the root logger about optional Google Cloud
    # clients that a local run does not use, and those clients' import about
    # the Python version they will stop supporting.
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning, module=r"google\.")
            import apache_beam  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        raise UsageError(
            f"prepare --beam needs Apache Beam, which is not installed ({e}). Install it "
            f"with this package's extra, in the folder of your estimator-keras checkout: "
            f"pip install -e '.[beam]' (and apache-beam[gcp] to run on Dataflow).") from e
    finally:
        root.setLevel(level)
    logging.getLogger("apache_beam").setLevel(logging.WARNING)
    # The local runner passes its workers' log lines to the root logger.
    root.addFilter(_quiet_workers)
    return apache_beam


def _quiet_workers(record):
    return record.levelno >= logging.WARNING or "apache_beam" not in record.pathname


def pipeline_options(beam_args=(), num_workers=1):
    """PipelineOptions of ``beam_args`` (Beam's own flags, e.g. ``--runner
    DataflowRunner --project P``); without ``--runner``, the local runner with
    ``num_workers`` worker processes."""
    import_beam()
    from apache_beam.options.pipeline_options import (  # pylint: disable=import-outside-toplevel
        DirectOptions, PipelineOptions, StandardOptions, WorkerOptions)
    options = PipelineOptions(list(beam_args or ()))
    if not options.view_as(StandardOptions).runner:
        workers = max(1, int(num_workers or 1))
        options.view_as(StandardOptions).runner = LOCAL_RUNNER
        direct = options.view_as(DirectOptions)
        direct.direct_num_workers = workers
        direct.direct_running_mode = "multi_processing" if workers > 1 else "in_memory"
        # The workers' INFO lines would bury prepare's own output.
        options.view_as(WorkerOptions).default_sdk_harness_log_level = "WARNING"
    return options


def runner_name(options):
    """The runner's short name, for the manifest and messages."""
    from apache_beam.options.pipeline_options import StandardOptions  # pylint: disable=import-outside-toplevel
    runner = options.view_as(StandardOptions).runner
    return str(getattr(runner, "__name__", runner)).rsplit(".", 1)[-1]


def temp_dir(options, fallback):
    """A new folder for a pipeline's intermediate files: under Beam's
    ``--temp_location`` when given (remote workers must reach it), else
    under ``fallback``."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions  # pylint: disable=import-outside-toplevel
    base = options.view_as(GoogleCloudOptions).temp_location or fallback
    path = io.join(str(base), f"estimator-keras-{uuid.uuid4().hex[:12]}")
    io.makedirs(path)
    return path


def run(pipeline, options, what):
    """Runs ``pipeline`` to its end; returns its result. Any failure (of the
    runner, or of a worker) is a DataError naming the runner and ``what``.

    On the local runner the worker processes' log lines (their start-up
    INFO and WARNING lines, which Beam prints before it reads the options
    that set their level) go to a log file instead of the terminal: removed
    after a run that succeeds, named in the error of one that fails."""
    local = runner_name(options) == LOCAL_RUNNER.rsplit(".", 1)[-1]
    log = _WorkerLog() if local else contextlib.nullcontext()
    try:
        with log:
            result = pipeline.run()
            result.wait_until_finish()
    except Exception as e:  # pylint: disable=broad-except  (any runner's, any worker's)
        where = f" The workers' log: {log.path}." if local else ""
        raise DataError(f"the Beam pipeline {what} failed on {runner_name(options)}: "
                        f"{str(e).strip()[-1500:]}{where}") from e
    if local:
        os.remove(log.path)
    return result


class _WorkerLog:
    """Standard error, and so the local runner's worker processes (which
    inherit it when they start), sent to a private temporary file while the
    block runs."""

    def __init__(self):
        fd, self.path = tempfile.mkstemp(prefix="estimator-keras-beam-", suffix=".log")
        os.close(fd)
        self._saved = None

    def __enter__(self):
        sys.stderr.flush()
        self._saved = os.dup(2)
        with open(self.path, "ab") as f:
            os.dup2(f.fileno(), 2)
        return self

    def __exit__(self, *exc):
        sys.stderr.flush()
        os.dup2(self._saved, 2)
        os.close(self._saved)
        return False


def stage(obj, path):
    """Pickles ``obj`` to ``path`` (local or remote) for :func:`staged`:
    what the workers need beyond a few bytes travels as a file, not inside
    the pipeline's graph (Dataflow refuses a job graph over 10 MB)."""
    with io.atomic_file(path, "wb") as f:
        f.write(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    return path


@functools.lru_cache(maxsize=8)
def staged(path):
    """What :func:`stage` wrote to ``path``, read once per worker process."""
    return pickle.loads(io.read_bytes(path))


def _run_job(record, fn):
    index, job = pickle.loads(record)
    return pickle.dumps((index, fn(job)), protocol=pickle.HIGHEST_PROTOCOL)


class BeamMapper:
    """``parallel_map`` as a Beam pipeline: ``fn`` runs on the workers over
    ``jobs`` and the results come back to this process, in order.

    The jobs go out, and the results come back, pickled in TFRecord files of
    a temporary folder (see :func:`temp_dir`), removed afterwards; Beam's
    TFRecord source splits the jobs among the workers. ``fn`` and the jobs
    must be picklable, as for worker processes.
    """

    def __init__(self, options, scratch):
        self.options, self.scratch = options, scratch

    def __call__(self, fn, jobs, num_workers=1, on_result=None):
        beam = import_beam()
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        del num_workers  # the options say how many workers run
        jobs = list(jobs)
        if not jobs:
            return []
        folder = temp_dir(self.options, self.scratch)
        try:
            with tf.io.TFRecordWriter(io.join(folder, "jobs.tfrecord")) as writer:
                for item in enumerate(jobs):
                    writer.write(pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL))
            p = beam.Pipeline(options=self.options)
            _ = (p
                 | "jobs" >> beam.io.ReadFromTFRecord(io.join(folder, "jobs.tfrecord"))
                 # Spreads the jobs over the workers.
                 | "spread" >> beam.Reshuffle()
                 | "check" >> beam.Map(_run_job, fn)
                 | "results" >> beam.io.WriteToTFRecord(io.join(folder, "results")))
            run(p, self.options, "checking the inputs")
            found = {}
            for path in io.glob(io.join(folder, "results*")):
                for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
                    index, result = pickle.loads(record)
                    found[index] = result
        finally:
            io.rmtree(folder)
        if len(found) != len(jobs):
            raise DataError(f"the Beam pipeline checking the inputs returned "
                            f"{len(found)} results for {len(jobs)} jobs.")
        results = [found[i] for i in range(len(jobs))]
        if on_result:
            for result in results:
                on_result(result)
        return results
