"""What a ``train`` run records in MLflow (``--track``), written by its chief alone.

Tracking is split in two: ``estimator_keras.tracking`` is how any run
reaches MLflow (where, through which process, within which bounds), and
what a ``train`` or ``tune`` run records (its config, dataset and command
line, and the versions that the engines' registry entries name) is the
runner's, in ``experiments.training.tracked`` and ``experiments.tuning.tracked``.

A run's record (see :class:`TrainTracking`):

* parameters: every field of the resolved config (``data.``, ``train.``,
  ``model.`` as ``show`` prints them), the engine, backend, precision,
  strategy, replicas and training tasks, the dataset's name, its examples per
  split and a digest of its schema;
* metrics: ``loss`` and ``steps_per_sec`` at each progress line,
  ``eval_NAME`` at each evaluation, by global step;
* tags: the package's version, the git commit of a checkout, the TensorFlow,
  Keras, tf-keras and JAX versions, the command line, the model dir and the
  TensorBoard log dir;
* artifacts: the export (with its ``export.json``) under ``export/``, or its
  location as the ``export_uri`` tag when it is remote; the resolved config as
  ``config.yaml``;
* the end: FINISHED, KILLED with ``stopped_at_step`` after a preemption (exit
  75), FAILED after an error. FINISHED is sent before the uploads, so that an
  upload that stalls cannot leave the run RUNNING;
* ``--register NAME``: the export as a new version of the registered model
  NAME, from the run's ``export/`` artifacts, or, for an export on ``gs://``
  (a cloud job's), from its URI as the version's source.

The run's id is kept in ``MODEL_DIR/mlflow-run.json``: a resumed training
(after exit 75, a crash or a SIGKILL) continues the same run, and a model dir
already at ``--max-steps`` records nothing new, but repairs the run of a
training that ended before its record did (:func:`repair`).
"""

import dataclasses
import hashlib
import json
import os
import shlex
import subprocess
import sys
import time

import estimator_keras
from estimator_keras import io, manifest
from estimator_keras.engines import registry
from estimator_keras.errors import Preempted
from estimator_keras.tracking import mlflow_run, settings

RUN_FILE = "mlflow-run.json"
"""In the model dir: the tracking URI and the id of the run that records it."""
EXPORT_ARTIFACTS = "export"
CONFIG_ARTIFACT = "config.yaml"
EXPERIMENT_VARIABLE = "MLFLOW_EXPERIMENT_NAME"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_run_file(model_dir):
    """``{"tracking_uri", "run_id", ...}`` of a model dir, or {}."""
    path = io.join(model_dir, RUN_FILE)
    try:
        found = json.loads(io.read_text(path))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def write_run_file(model_dir, uri, run_id, **extra):
    io.atomic_write(io.join(model_dir, RUN_FILE),
                    json.dumps({"tracking_uri": uri, "run_id": run_id, **extra}, indent=1) + "\n")


def flat_params(obj, prefix=""):
    """A nested dict as ``{"a.b": value}``; lists and None written as JSON."""
    out = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat_params(value, name + "."))
        else:
            out[name] = value if isinstance(value, (str, int, float, bool)) else json.dumps(value)
    return out


def schema_digest(found_manifest):
    """The first 16 hex digits of the SHA-256 of the dataset's schema (as JSON)."""
    schema = found_manifest.to_json()["schema"]
    text = json.dumps(schema, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def versions():
    """Tags ``version.NAME``: the installed versions of what the engines
    train with (TensorFlow, Keras, tf-keras, JAX), as their registry
    entries name it."""
    return {f"version.{name}": version
            for name, version in registry.installed_versions().items()}


def git_commit(root=ROOT):
    """The checkout's commit (with "-dirty" when files changed), or None
    outside a git checkout."""
    if not os.path.exists(os.path.join(root, ".git")):
        return None
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=False)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def base_tags(argv=None):
    """What every run of this package is tagged with; ``argv`` (default
    ``sys.argv``) is the command line."""
    argv = list(sys.argv if argv is None else argv)
    program = argv[0] if argv else ""
    if os.path.basename(os.path.dirname(program)) == "experiments" or \
            os.path.basename(program) == "estimator-keras":
        program = "python -m experiments"  # the CLI, however it was started
    command = " ".join([program] + [shlex.quote(a) for a in argv[1:]]).strip()
    tags = {"estimator_keras.version": estimator_keras.__version__, "command": command,
            "mlflow.source.name": program or "python", "mlflow.source.type": "LOCAL"}
    commit = git_commit()
    if commit:
        tags["git_commit"] = commit
        tags["mlflow.source.git.commit"] = commit.replace("-dirty", "")
    return tags


def start(ctx, uri, register=None):
    """A :class:`TrainTracking` for the chief of ``ctx`` (a RunContext), or
    None when tracking is off or the model dir is already trained."""
    if not uri or ctx.start_step >= ctx.config.train.max_steps:
        return None
    return TrainTracking(ctx, uri, register)


def repair(ctx, uri, export_dir, register=None, run_factory=mlflow_run.MlflowRun):
    """For a model dir already trained, whose run is in ``uri``: a run left
    RUNNING (its process ended before the run's end reached the store) is
    set FINISHED, a local export its artifacts lack is uploaded, and
    ``register`` gets the export as a version where the run has none. Waits
    for it (:data:`~estimator_keras.tracking.mlflow_run.FINISH_WAIT_SECS` at
    most); nothing where the run file names another store or none."""
    known = read_run_file(ctx.model_dir)
    if not uri or known.get("tracking_uri") != uri or not known.get("run_id"):
        return
    run_id = known["run_id"]
    experiment = os.environ.get(EXPERIMENT_VARIABLE) or ctx.config.name
    run = run_factory(uri, experiment=experiment, run_id=run_id, resume_status=None,
                      new_run=False, log=ctx.log)

    def repaired(was, uploaded):
        if was == "RUNNING":
            ctx.log(f"the MLflow run {run_id}, left RUNNING when its training ended, is "
                    f"FINISHED now")
        if uploaded:
            ctx.log(f"uploaded the export to the MLflow run {run_id}")

    local = export_dir if export_dir and not io.is_remote(export_dir) else None
    run.repair(local, EXPORT_ARTIFACTS, on_done=repaired)
    if register and export_dir:
        register_export(run, register, export_dir, ctx.log, once=True)
    run.finish(None)


def register_export(run, name, export_dir, log, once=False, run_id=None, what="the export"):
    """Queues ``export_dir`` as a version of ``name``: from the run's
    ``export/`` artifacts, or from its URI where it is remote (a ``gs://``
    export is not copied); ``log`` says it once registered."""
    remote = io.is_remote(export_dir)
    what = export_dir if remote else what

    def registered(version):
        log(f"registered {what} in MLflow as {name!r} version {version}")

    run.register(name, None if remote else EXPORT_ARTIFACTS, on_done=registered,
                 source=export_dir if remote else None, once=once, run_id=run_id)


class RunRecord:
    """A record kept through ``self.run`` (an MlflowRun) that ends once. As a
    context manager around the work: a Preempted ends the run KILLED (with
    the tag ``stopped_at_step``), any other error FAILED (with ``error``),
    else FINISHED."""

    run = None
    _finished = False
    # A preemption's grace period is running: wait briefly for the records.
    STOPPED_WAIT_SECS = 5.0
    FAILED_WAIT_SECS = 10.0

    def _end(self, status, timeout=mlflow_run.FINISH_WAIT_SECS):
        if not self._finished:
            self._finished = True
            self.run.finish(status, timeout=timeout)

    def __enter__(self):
        return self

    def __exit__(self, kind, error, trace):
        if isinstance(error, Preempted):
            if getattr(error, "step", None) is not None:
                self.run.tags({"stopped_at_step": error.step})
            self._end("KILLED", timeout=self.STOPPED_WAIT_SECS)
        elif error is not None:
            self.run.tags({"error": f"{type(error).__name__}: {error}"})
            self._end("FAILED", timeout=self.FAILED_WAIT_SECS)
        else:
            self._end("FINISHED")
        return False


class TrainTracking(RunRecord):
    """A ``train`` run's record in MLflow (see :class:`RunRecord`)."""

    def __init__(self, ctx, uri, register=None, run_factory=mlflow_run.MlflowRun):
        self.ctx, self.uri, self.register = ctx, uri, register
        # The final metrics repeat the last evaluation's where it was of the
        # final checkpoint: recorded once.
        self._evaluated_at = None
        known = read_run_file(ctx.model_dir)
        resume = known.get("run_id") if known.get("tracking_uri") == uri else None
        parent = os.environ.get(settings.PARENT_VARIABLE) or None
        experiment = os.environ.get(EXPERIMENT_VARIABLE) or ctx.config.name
        self._resume, self._experiment = resume, experiment
        self.run = run_factory(
            uri, experiment=experiment, run_name=io.basename(ctx.model_dir.rstrip("/")),
            run_id=resume, parent_run_id=parent, on_started=self._started, log=ctx.log)
        # pylint: disable-next=import-outside-toplevel  (loads Keras' backend facts)
        from estimator_keras import engines
        self._backend = engines.backend_devices(ctx.engine.name)
        self.run.tags({**base_tags(), **versions(), **self._tags()})
        self.run.params(self._params())

    def _started(self, run_id):
        write_run_file(self.ctx.model_dir, self.uri, run_id)
        # Said once MLflow has the run (a store that cannot be reached never has it).
        verb = "continues in" if run_id == self._resume else "is recorded in"
        self.ctx.log(f"this run {verb} MLflow at {settings.shown(self.uri)} "
                     f"(experiment {self._experiment!r})")

    def _tags(self):
        ctx = self.ctx
        tags = {"model_dir": ctx.model_dir, "tensorboard_dir": ctx.tensorboard_dir or ctx.model_dir,
                "dataset_path": str(ctx.dataset_path)}
        if ctx.start_step:
            tags[f"resumed_at_step.{ctx.start_step}"] = time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                      time.gmtime())
        return tags

    def _params(self):
        ctx = self.ctx
        backend, platform, devices = self._backend
        found = manifest.load_manifest(ctx.dataset_path)
        params = flat_params(dataclasses.asdict(ctx.config))
        params.update({
            "engine": ctx.engine.name, "backend": backend, "devices": f"{devices} {platform}",
            "precision": ctx.policy or "float32", "strategy": ctx.strategy_name,
            "replicas": ctx.replicas, "training_tasks": ctx.info.num_workers,
            "dataset.name": found.name or ctx.config.data.dataset,
            "dataset.schema_digest": schema_digest(found),
            **{f"dataset.examples.{split}": info.num_examples
               for split, info in sorted(found.splits.items())},
        })
        return params

    # -- while training

    def progress(self, step, loss, steps_per_sec=None):
        """A progress line's training loss and steps/s (since the line before)."""
        values = {"loss": loss, "steps_per_sec": steps_per_sec}
        self.run.metrics({k: v for k, v in values.items() if v is not None}, step)

    def evaluation(self, metrics):
        step = metrics.get("global_step")
        if step is not None and int(step) != self._evaluated_at:
            self._evaluated_at = int(step)
            self.run.metrics({f"eval_{k}": v for k, v in metrics.items()
                              if k != "global_step"}, int(step))

    # -- the end

    def finish(self, metrics, export_dir):
        """Records the final evaluation, ends the run FINISHED, then uploads
        the export and registers it when asked (the run's status never waits
        on an upload)."""
        if metrics:
            self.evaluation(metrics)
        remote = bool(export_dir) and io.is_remote(export_dir)
        self.run.tags({"export_dir": export_dir or "", **({"export_uri": export_dir}
                                                          if remote else {})})
        self.run.end("FINISHED")
        config_path = io.join(self.ctx.model_dir, CONFIG_ARTIFACT)
        if io.exists(config_path) and not io.is_remote(config_path):
            self.run.artifacts(config_path, None, folder=False)
        if export_dir and not remote:
            self.run.artifacts(export_dir, EXPORT_ARTIFACTS)
        if export_dir and self.register:
            register_export(self.run, self.register, export_dir, self.ctx.log)
        self._end("FINISHED")
