"""Local hyperparameter tuning: a study of ``train`` trials on this machine.

:func:`run_study` runs each trial as ``python -m experiments train NAME
--model-dir DIR/trial-N --hparams ...`` in a process group of its own, at most
``parallel`` at a time, each bounded by a timeout after which it gets SIGTERM
(the trainer saves a checkpoint) and, after a grace period (train's
``--preemption-grace`` default and a margin), SIGKILL -- always by
the PID it was started with. A trial's result is read from its
``DIR/trial-N/export/export.json`` (``metrics``, ``global_step``), never from
its log (``DIR/trial-N/train.log``).

After every change the table is written atomically to ``DIR/trials.json``
(the study's definition and every trial) and ``DIR/trials.csv``. Run the same
command again and the study resumes: finished trials (succeeded, failed,
timed out) stay as they are, interrupted and missing ones run, each in its own
model dir (an interrupted trial continues from its checkpoint). A failed trial
is recorded and the study goes on. SIGTERM, SIGINT or SIGHUP stop the study:
its running trials are ended as above and recorded as interrupted, and
:class:`~estimator_keras.errors.Preempted` is raised.

Trial values come from :meth:`~estimator_keras.cloud.space.SearchSpace.trial_values`:
for a given seed, trial N always gets the same values.

Example::

    study = space.Study(space.load_space("space.yaml"), metric="accuracy",
                        algorithm="random", max_trials=8, parallel_trials=2)
    result = run_study(StudyConfig("fashion_mnist_mlp", study, "runs/tune",
                                   train_args=["--max-steps", "500"]))
    print(result.best.trial, result.best.metric)
"""

import csv
import dataclasses
import io as text_io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional

from estimator_keras import io
from estimator_keras.cloud import space as space_lib
from estimator_keras.distribute.launcher import PREEMPTION_MARGIN, signal_group
from estimator_keras.distribute.preemption import DEFAULT_GRACE_SECS
from estimator_keras.errors import ConfigError, EstimatorKerasError, Preempted

TRIALS_JSON = "trials.json"
TRIALS_CSV = "trials.csv"
TRIAL_LOG = "train.log"
EXPORT_INFO = os.path.join("export", "export.json")

FINISHED = ("succeeded", "failed", "timeout")
DEFAULT_TRIAL_TIMEOUT_S = 3600.0
# What a trial's `train` takes to save a checkpoint on SIGTERM, as the cluster
# launcher allows it.
DEFAULT_GRACE_S = DEFAULT_GRACE_SECS + PREEMPTION_MARGIN
_POLL_S = 0.5
# Variables that would send a trial somewhere else than its own model dir.
_DROPPED_ENV = ("TF_CONFIG", "AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR", "AIP_TENSORBOARD_LOG_DIR",
                "CLOUD_ML_TRIAL_ID", "CLOUD_ML_HP_METRIC_FILE")


def say(message):
    sys.stderr.write("[tune] %s\n" % message)
    sys.stderr.flush()


@dataclasses.dataclass
class StudyConfig:
    """A local study.

    Attributes:
      experiment: the experiment NAME every trial trains.
      study: the space, metric, goal, algorithm, trial count and parallelism.
      model_dir: the study's folder: ``trials.json``, ``trials.csv`` and one
        ``trial-N`` model dir per trial.
      train_args: flags every trial's ``train`` gets (``--data-dir``,
        ``--max-steps``...); must not hold ``--model-dir`` or ``--hparams``.
      fixed_hparams: ``--hparams`` shared by every trial (``k=v,...``); the
        space's keys must not repeat them.
      seed: seeds the trial values (random search).
      trial_timeout_s: a trial still running after this long is ended.
      grace_s: between SIGTERM and SIGKILL when a trial is ended.
      retry_failed: run failed and timed-out trials again.
      prepare_command: run once before the trials when given (``python -m
        experiments prepare ...``): parallel trials must not each prepare
        the same missing dataset.
      python: the interpreter that runs the trials.
    """

    experiment: str
    study: space_lib.Study
    model_dir: str
    train_args: List[str] = dataclasses.field(default_factory=list)
    fixed_hparams: str = ""
    seed: int = 0
    trial_timeout_s: float = DEFAULT_TRIAL_TIMEOUT_S
    grace_s: float = DEFAULT_GRACE_S
    retry_failed: bool = False
    prepare_command: Optional[List[str]] = None
    python: str = sys.executable

    @property
    def algorithm(self) -> str:
        return self.study.algorithm or "random"

    def definition(self) -> Dict[str, object]:
        """What makes two runs the same study (the trial count may grow)."""
        return {"experiment": self.experiment, "space": self.study.space.to_dict(),
                "algorithm": self.algorithm, "seed": self.seed, "metric": self.study.metric,
                "goal": self.study.resolved_goal, "fixed_hparams": self.fixed_hparams,
                "train_args": list(self.train_args)}


@dataclasses.dataclass
class Trial:
    """One row of the table."""

    trial: int
    hparams: Dict[str, object]
    status: str = "pending"
    metric: Optional[float] = None
    steps: Optional[int] = None
    wall_time_s: Optional[float] = None
    model_dir: str = ""
    export_dir: Optional[str] = None
    message: Optional[str] = None

    @property
    def finished(self) -> bool:
        return self.status in FINISHED


@dataclasses.dataclass
class StudyResult:
    """The table after a run; ``best`` is None when no trial succeeded."""

    config: StudyConfig
    trials: List[Trial]
    best: Optional[Trial]


def trial_dir(study_dir: str, trial: int) -> str:
    return io.join(study_dir, "trial-%d" % trial)


def _check_train_args(config: StudyConfig) -> None:
    for arg in config.train_args:
        flag = arg.split("=", 1)[0]
        if flag in ("--model-dir", "--hparams"):
            raise ConfigError("tune: %s is set per trial (--model-dir DIR/trial-N, "
                              "--hparams from the space and tune's --hparams); do not pass "
                              "it in the train flags." % flag)
    fixed = {item.split("=", 1)[0].strip()
             for item in config.fixed_hparams.split(",") if "=" in item}
    both = sorted(fixed & set(config.study.space.names))
    if both:
        raise ConfigError("tune: %s is both in --hparams and in the search space %s; "
                          "give it in one of them." % (", ".join(both),
                                                       config.study.space.source))


def _load_table(config: StudyConfig) -> Dict[int, Trial]:
    path = io.join(config.model_dir, TRIALS_JSON)
    if not io.exists(path):
        return {}
    try:
        saved = json.loads(io.read_text(path))
        recorded, rows = saved["study"], saved["trials"]
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError("tune: %s is not a study table this command wrote (%s); use "
                          "another --model-dir." % (path, e)) from e
    current = json.loads(json.dumps(config.definition()))
    differ = sorted(k for k in set(current) | set(recorded) if current.get(k) != recorded.get(k))
    if differ:
        raise ConfigError(
            "tune: %s holds another study (its %s differ from this command's); resume it "
            "with the same NAME, space and flags, or use another --model-dir."
            % (config.model_dir, ", ".join(differ)))
    fields = {f.name for f in dataclasses.fields(Trial)}
    return {row["trial"]: Trial(**{k: v for k, v in row.items() if k in fields})
            for row in rows}


def best_trial(trials: List[Trial], goal: str) -> Optional[Trial]:
    done = [t for t in trials if t.status == "succeeded" and t.metric is not None]
    if not done:
        return None
    sign = 1 if goal == "max" else -1
    return max(done, key=lambda t: (sign * t.metric, -t.trial))


def write_table(config: StudyConfig, trials: List[Trial]) -> None:
    """``trials.json`` and ``trials.csv``, each written atomically."""
    ordered = sorted(trials, key=lambda t: t.trial)
    best = best_trial(ordered, config.study.resolved_goal)
    io.makedirs(config.model_dir)
    io.atomic_write(io.join(config.model_dir, TRIALS_JSON), json.dumps(
        {"study": config.definition(), "best": best.trial if best else None,
         "trials": [dataclasses.asdict(t) for t in ordered]}, indent=2) + "\n")
    names = config.study.space.names
    out = text_io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["trial", "status", config.study.metric, "steps", "wall_time_s"]
                    + names + ["export_dir"])
    for t in ordered:
        writer.writerow([t.trial, t.status, "" if t.metric is None else "%.6g" % t.metric,
                         "" if t.steps is None else t.steps,
                         "" if t.wall_time_s is None else "%.1f" % t.wall_time_s]
                        + [space_lib.format_value(t.hparams[n]) if n in t.hparams else ""
                           for n in names] + [t.export_dir or ""])
    io.atomic_write(io.join(config.model_dir, TRIALS_CSV), out.getvalue())


def _trial_command(config: StudyConfig, trial: Trial) -> List[str]:
    values = ",".join("%s=%s" % (k, space_lib.format_value(v)) for k, v in trial.hparams.items())
    hparams = ",".join(p for p in (config.fixed_hparams.strip(","), values) if p)
    return ([config.python, "-m", "experiments", "train", config.experiment,
             "--model-dir", trial.model_dir, "--hparams", hparams] + list(config.train_args))


def _child_env() -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def _end(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to the trial's process group, SIGKILL after ``grace_s``."""
    signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    signal_group(proc.pid, signal.SIGKILL)
    proc.wait()


def _last_line(path: str) -> str:
    try:
        lines = [line.strip() for line in io.read_text(path).splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError):
        return ""
    return lines[-1][:500] if lines else ""


def _read_result(trial: Trial, metric: str) -> None:
    """Fills metric, steps and export_dir from the trial's export.json."""
    path = io.join(trial.model_dir, EXPORT_INFO)
    try:
        info = json.loads(io.read_text(path))
    except (OSError, ValueError) as e:
        trial.status, trial.message = "failed", "no readable %s: %s" % (path, e)
        return
    metrics = info.get("metrics") or {}
    if metric not in metrics:
        trial.status = "failed"
        trial.message = "%s has no metric %r; its metrics: %s" % (
            path, metric, ", ".join(sorted(metrics)) or "none")
        return
    trial.status, trial.metric = "succeeded", float(metrics[metric])
    step = info.get("global_step", metrics.get("global_step"))
    trial.steps = int(step) if step is not None else None
    trial.export_dir = io.parent(path)


class _Runner:
    """The scheduling loop; one per :func:`run_study` call."""

    def __init__(self, config: StudyConfig, trials: Dict[int, Trial]):
        self.config = config
        self.trials = trials
        self.running: Dict[int, tuple] = {}
        self.stop_signal: Optional[int] = None

    def on_signal(self, signum, frame):  # pylint: disable=unused-argument
        self.stop_signal = signum

    def save(self) -> None:
        write_table(self.config, list(self.trials.values()))

    def start(self, trial: Trial) -> None:
        io.makedirs(trial.model_dir)
        log = io.open_file(io.join(trial.model_dir, TRIAL_LOG), "ab")
        log.write(("$ %s\n" % " ".join(_trial_command(self.config, trial))).encode())
        log.flush()
        proc = subprocess.Popen(_trial_command(self.config, trial), stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=_child_env(), start_new_session=True)
        self.running[trial.trial] = (proc, time.monotonic(), log)
        trial.status, trial.message, trial.metric, trial.export_dir = "running", None, None, None
        say("trial %d started (pid %d): %s -> %s" % (
            trial.trial, proc.pid, _describe(trial.hparams), trial.model_dir))
        self.save()

    def finish(self, number: int, status: Optional[str] = None) -> None:
        proc, started, log = self.running.pop(number)
        log.close()
        trial = self.trials[number]
        trial.wall_time_s = round(time.monotonic() - started, 1)
        if status is not None:
            trial.status = status
            trial.message = ("ended after the %.0f s --trial-timeout" % self.config.trial_timeout_s
                             if status == "timeout" else "the study was stopped")
        elif proc.returncode == 0:
            _read_result(trial, self.config.study.metric)
        elif proc.returncode == Preempted.exit_code:
            # Stopped from outside after saving a checkpoint: not finished, a
            # resumed study runs it again from there.
            trial.status, trial.message = "interrupted", "the trial was preempted (exit 75)"
        else:
            trial.status = "failed"
            trial.message = "exit %d: %s" % (proc.returncode, _last_line(
                io.join(trial.model_dir, TRIAL_LOG)))
        if trial.status == "succeeded":
            say("trial %d succeeded in %.0f s: %s %.4f at step %s" % (
                number, trial.wall_time_s, self.config.study.metric, trial.metric, trial.steps))
        else:
            say("trial %d %s after %.0f s: %s" % (number, trial.status, trial.wall_time_s,
                                                  trial.message))
        self.save()

    def loop(self, todo: List[Trial]) -> None:
        parallel = self.config.study.parallel_trials
        while (todo or self.running) and self.stop_signal is None:
            while todo and len(self.running) < parallel and self.stop_signal is None:
                self.start(todo.pop(0))
            for number, (proc, started, _) in list(self.running.items()):
                if proc.poll() is not None:
                    self.finish(number)
                elif time.monotonic() - started > self.config.trial_timeout_s:
                    _end(proc, self.config.grace_s)
                    self.finish(number, "timeout")
            time.sleep(_POLL_S)

    def stop(self) -> None:
        """Ends every running trial (SIGTERM, then SIGKILL after the grace)."""
        for proc, _, _ in self.running.values():
            signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.config.grace_s
        for number in list(self.running):
            proc = self.running[number][0]
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
            self.finish(number, "interrupted")


def _describe(hparams: Dict[str, object]) -> str:
    return ", ".join("%s=%s" % (k, space_lib.format_value(v)) for k, v in hparams.items())


def _prepare(config: StudyConfig) -> None:
    say("preparing the dataset first: %s" % " ".join(config.prepare_command))
    try:
        proc = subprocess.run(config.prepare_command, env=_child_env(), capture_output=True,
                              text=True, timeout=config.trial_timeout_s, check=False)
    except subprocess.TimeoutExpired as e:
        raise EstimatorKerasError("tune: preparing the dataset took over %.0f s."
                                  % config.trial_timeout_s) from e
    if proc.returncode != 0:
        raise EstimatorKerasError("tune: preparing the dataset failed (exit %d): %s"
                                  % (proc.returncode, (proc.stderr or proc.stdout).strip()[-2000:]))


def plan(config: StudyConfig) -> List[Trial]:
    """Every trial of the study with its values (before anything runs)."""
    study = config.study
    return [Trial(n, study.space.trial_values(n, config.seed, config.algorithm),
                  model_dir=trial_dir(config.model_dir, n))
            for n in range(1, study.max_trials + 1)]


def run_study(config: StudyConfig) -> StudyResult:
    """Runs (or resumes) the study; returns the table and the best trial.

    Raises :class:`Preempted` when a signal stopped it (rerun to resume),
    :class:`ConfigError` for a bad study or a folder holding another one.
    """
    config.study.validate()
    if config.algorithm == "grid" and config.study.max_trials > config.study.space.grid_size():
        raise ConfigError("tune: --trials %d exceeds the grid's %d combinations."
                          % (config.study.max_trials, config.study.space.grid_size()))
    _check_train_args(config)
    if io.is_remote(config.model_dir):
        raise ConfigError("tune: --model-dir must be a local folder (the trials run on this "
                          "machine and log there); got %s." % config.model_dir)
    if not isinstance(config.trial_timeout_s, (int, float)) or config.trial_timeout_s <= 0:
        raise ConfigError("--trial-timeout must be a number of seconds > 0; got %r."
                          % (config.trial_timeout_s,))
    recorded = _load_table(config)
    trials: Dict[int, Trial] = {}
    for planned in plan(config):
        old = recorded.get(planned.trial)
        keep = old is not None and old.finished and not (
            config.retry_failed and old.status != "succeeded")
        trials[planned.trial] = old if keep else planned
    # Trials beyond this run's --trials stay in the table.
    for number, old in recorded.items():
        trials.setdefault(number, old)
    todo = [trials[n] for n in range(1, config.study.max_trials + 1)
            if trials[n] is not recorded.get(n)]
    done = config.study.max_trials - len(todo)
    if done:
        say("resuming %s: %d of %d trials already finished" % (
            config.model_dir, done, config.study.max_trials))
    runner = _Runner(config, trials)
    runner.save()
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {s: signal.signal(s, runner.on_signal)
                    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        if todo and config.prepare_command:
            _prepare(config)
        runner.loop(todo)
    finally:
        try:
            if runner.running:
                runner.stop()
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
    if runner.stop_signal is not None:
        raise Preempted("tune: stopped by signal %d; the finished trials are in %s. Run the "
                        "same command again to resume the study."
                        % (runner.stop_signal, io.join(config.model_dir, TRIALS_CSV)))
    ordered = [trials[n] for n in sorted(trials)]
    best = best_trial(ordered, config.study.resolved_goal)
    if best is None:
        raise EstimatorKerasError(
            "tune: no trial succeeded; see the table %s and each trial's %s."
            % (io.join(config.model_dir, TRIALS_CSV), TRIAL_LOG))
    return StudyResult(config, ordered, best)
