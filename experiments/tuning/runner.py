"""Local hyperparameter tuning: an Optuna study whose trials are ``train`` runs.

:func:`run_study` asks the study (:mod:`experiments.tuning.studies`) for trials and
runs each as ``python -m experiments train NAME --model-dir DIR/trial-N
--hparams ... --evaluations-file DIR/trial-N/evaluations.jsonl`` in a process
group of its own, at most ``parallel`` at a time. While a trial trains, each
evaluation it records is reported to the study; when the pruner
(:func:`estimator_keras.tuning.optuna_search.pruner`) says so, the trial gets SIGTERM, saves its
checkpoint and is told pruned at that step (its evaluation at its last step
is not judged: nothing is left to save). A trial is recorded by its exit: one
that exits 0 after that SIGTERM had trained its last step and exported before
the signal landed, and is told complete with its export's metric. A trial
still running after ``trial_timeout_s`` is ended the same way and told failed
("timeout"); SIGKILL follows the grace period (train's ``--preemption-grace``
and a margin), always by the PID the trial was started with, and a trial never
outlives its ``tune`` (it dies with it, ``PR_SET_PDEATHSIG``). A finished trial's metric
is read from its ``export/export.json``, never from its log
(``DIR/trial-N/train.log``).

Several ``tune`` commands on one storage share the study: each asks for
trials until the study holds ``--trials`` of them, so no trial runs twice. A
SIGTERM, SIGINT or SIGHUP stops this command: its running trials are ended as
above and put back in the study's queue (Optuna's WAITING state), so the same
command run again (here, or any worker of the study) continues each from its
checkpoint; :class:`~estimator_keras.errors.Preempted` (exit 75) is raised.

After every change the table of the whole study is written atomically to
``DIR/trials.json`` and ``DIR/trials.csv``; at the end the plots
(:mod:`experiments.tuning.plots`) and a copy of the best trial's export in
``DIR/best``.

Example::

    study = space.Study(space.load_space("space.yaml"), metric="accuracy",
                        max_trials=8, parallel_trials=2)
    result = run_study(StudyConfig("fashion_mnist_mlp", study, "runs/tune",
                                   algorithm="tpe", pruner="hyperband",
                                   train_args=["--max-steps", "1500"]))
    print(result.best.trial, result.best.metric)
"""

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from typing import Dict, List, Optional

from estimator_keras import io
from estimator_keras.distribute import netns, trainjob_pods
from estimator_keras.distribute.launcher import signal_group
from estimator_keras.errors import ConfigError, EstimatorKerasError, Preempted
from estimator_keras.tracking import settings as tracking_settings
from estimator_keras.tuning import space as space_lib
from estimator_keras.tuning import optuna_search as search
from experiments.tuning import evaluations, studies
from experiments.tuning import tracked as tracked_study
from experiments.tuning import study_config as tune_config
from experiments.tuning import plots as tune_plots
from experiments.tuning.study_config import StudyConfig
from experiments.tuning.table import (TRIALS_CSV, Trial, best_trial, copy_best, row, rows,
                                    trial_dir, write_table)

TRIAL_LOG = "train.log"
EVALUATIONS = "evaluations.jsonl"
EXPORT_INFO = os.path.join("export", "export.json")

# A trial the pruner stops trains on until the SIGTERM lands: poll often.
_POLL_S = 0.2
# Variables that would send a trial somewhere else than its own model dir,
# join it to a cluster, or have every trial report into one TrainJob's status.
_DROPPED_ENV = ("TF_CONFIG", "AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR", "AIP_TENSORBOARD_LOG_DIR",
                "CLOUD_ML_TRIAL_ID", "CLOUD_ML_HP_METRIC_FILE", "KUBEFLOW_TRAINER_SERVER_URL",
                tracking_settings.PARENT_VARIABLE
                ) + trainjob_pods.JAX_VARIABLES + trainjob_pods.TF_VARIABLES


def say(message):
    sys.stderr.write("[tune] %s\n" % message)
    sys.stderr.flush()


@dataclasses.dataclass
class StudyResult:
    """The table after a run; ``best`` is None when no trial succeeded."""

    config: StudyConfig
    trials: List[Trial]
    best: Optional[Trial]


def _trial_command(config: StudyConfig, number: int, params: Dict[str, object]) -> List[str]:
    values = ",".join("%s=%s" % (k, space_lib.format_value(params[k]))
                      for k in config.study.space.names)
    hparams = ",".join(p for p in (config.fixed_hparams.strip(","), values) if p)
    folder = trial_dir(config.model_dir, number)
    return ([config.python, "-m", "experiments", "train", config.experiment,
             "--model-dir", folder, "--hparams", hparams,
             "--evaluations-file", io.join(folder, EVALUATIONS)] + list(config.train_args)
            + (["--track", config.track] if config.track else []))


def _child_env() -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def _last_line(path: str) -> str:
    try:
        lines = [line.strip() for line in io.read_text(path).splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError):
        return ""
    return lines[-1][:500] if lines else ""


def _read_result(folder: str, metric: str):
    """(metric, steps, export dir) from a trial's export.json, or a message."""
    path = io.join(folder, EXPORT_INFO)
    try:
        info = json.loads(io.read_text(path))
    except (OSError, ValueError) as e:
        return None, "no readable %s: %s" % (path, e)
    metrics = info.get("metrics") or {}
    if metric not in metrics:
        return None, "%s has no metric %r; its metrics: %s" % (
            path, metric, ", ".join(sorted(metrics)) or "none")
    step = info.get("global_step", metrics.get("global_step"))
    return (float(metrics[metric]), int(step) if step is not None else None,
            io.parent(path)), None


def _trained_steps(folder: str, pruned_at: int) -> int:
    """The step a pruned trial's checkpoint holds: it trains on until the
    SIGTERM lands, and says where it stopped in its evaluations file."""
    try:
        stops = [e.step for e in evaluations.read(io.join(folder, EVALUATIONS)) if e.stopped]
    except ConfigError:
        stops = []
    return stops[-1] if stops and stops[-1] >= pruned_at else pruned_at


def _describe(hparams: Dict[str, object]) -> str:
    return ", ".join("%s=%s" % (k, space_lib.format_value(v)) for k, v in hparams.items())


def _duration(seconds: float) -> str:
    if seconds < 90:
        return "%.0f s" % seconds
    if seconds < 5400:
        return "%.0f min" % (seconds / 60)
    return "%.1f h" % (seconds / 3600)


@dataclasses.dataclass
class _Running:
    """A trial this command is running."""

    trial: object  # optuna.Trial
    trial_id: int
    proc: subprocess.Popen
    started: float
    log: object
    folder: str
    reported: set
    beat: float = 0.0
    ending: Optional[str] = None  # "pruned" or "timeout" once SIGTERM is sent
    deadline: float = 0.0
    pruned_at: Optional[int] = None


class _Runner:
    """The scheduling loop; one per :func:`run_study` call."""

    def __init__(self, config: StudyConfig, study, storage, tracking=None):
        self.config = config
        self.tracking = tracking
        self.study = study
        self.storage = storage
        self.heartbeat = studies.heartbeat_enabled(storage)
        self.running: Dict[int, _Running] = {}
        self.stop_signal: Optional[int] = None
        self.finished_here: List[float] = []
        self.worker = "%s:%d" % (socket.gethostname(), os.getpid())
        self.last_stale_check = 0.0
        self.preexec = netns.die_with_parent()

    def on_signal(self, signum, frame):  # pylint: disable=unused-argument
        self.stop_signal = signum

    def save(self) -> None:
        write_table(self.config, rows(self.study, self.config.model_dir))

    # -- asking

    def _next(self):
        """A trial to run now, or None when the study needs none from here."""
        trials = self.study.get_trials(deepcopy=False)
        waiting = any(t.state.name == "WAITING" for t in trials)
        originals = sum(1 for t in trials if studies.retried_number(t) is None)
        if not waiting and originals >= self.config.study.max_trials:
            return None
        if self.config.seed is not None and self.config.algorithm not in ("qmc", "grid"):
            # Seeded by the study's length, not once: a resumed study draws
            # new values, and one command's study stays repeatable. (QMC and
            # the grid keep their place in the study itself.)
            self.study.sampler = search.sampler(
                self.config.study.space, self.config.algorithm,
                search.derived_seed(self.config.seed, len(trials)),
                self.config.study.parallel_trials)
        with warnings.catch_warnings():
            # Optuna says the heartbeat is meant for Study.optimize; this loop
            # records it itself (see _beat).
            warnings.simplefilter("ignore")
            trial = self.study.ask(search.distributions(self.config.study.space))
        frozen = self.study.trials[trial.number]
        if (studies.retried_number(frozen) is None and studies.originals_before(
                self.study.get_trials(deepcopy=False), trial.number)
                >= self.config.study.max_trials):
            trial.set_user_attr(studies.SURPLUS_ATTR, True)
            self.study.tell(trial, state=_state("FAIL"))
            return None
        return trial

    def can_ask(self) -> bool:
        trials = self.study.get_trials(deepcopy=False)
        if any(t.state.name == "WAITING" for t in trials):
            return True
        return (sum(1 for t in trials if studies.retried_number(t) is None)
                < self.config.study.max_trials)

    def others_running(self) -> int:
        """Trials other workers run (this one waits for them, with a heartbeat:
        one whose worker dies is retried, maybe here)."""
        return sum(1 for t in self.study.get_trials(deepcopy=False)
                   if t.state.name == "RUNNING" and t.number not in self.running)

    def start(self, trial) -> None:
        folder = trial_dir(self.config.model_dir, trial.number)
        io.makedirs(folder)
        frozen = self.study.trials[trial.number]
        resumed = " (resumed)" if frozen.user_attrs.get("status") == "interrupted" else ""
        for key, value in (("model_dir", folder), ("worker", self.worker),
                           ("status", "running")):
            trial.set_user_attr(key, value)
        command = _trial_command(self.config, trial.number, trial.params)
        log = io.open_file(io.join(folder, TRIAL_LOG), "ab")
        log.write(("$ %s\n" % " ".join(command)).encode())
        log.flush()
        tid = studies.trial_id(self.storage, self.study, trial.number)
        if self.heartbeat:
            # Before the trainer starts: a trial without a heartbeat is never
            # found stale, so one whose worker dies before its first poll
            # would keep the other workers waiting for it for ever.
            self.storage.record_heartbeat(tid)
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL,
                                env={**_child_env(), **(self.tracking.trial_env()
                                                        if self.tracking else {})},
                                start_new_session=True, preexec_fn=self.preexec)
        reported = set(frozen.intermediate_values)
        now = time.monotonic()
        self.running[trial.number] = _Running(trial, tid, proc, now, log, folder, reported,
                                              beat=now if self.heartbeat else 0.0)
        say("trial %d started%s (pid %d): %s -> %s" % (
            trial.number, resumed, proc.pid, _describe(trial.params), folder))
        self.save()

    # -- watching

    def _beat(self, run: _Running, now: float) -> None:
        if self.heartbeat and now - run.beat >= self.config.heartbeat_s / 2.0:
            self.storage.record_heartbeat(run.trial_id)
            run.beat = now

    def _report(self, run: _Running) -> None:
        """Hands the trial's new evaluations to the study; SIGTERM when the
        pruner says stop."""
        metric = self.config.study.metric
        new = False
        try:
            recorded = evaluations.read(io.join(run.folder, EVALUATIONS))
        except ConfigError as e:
            say("trial %d: %s" % (run.trial.number, e))
            return
        for evaluation in recorded:
            if evaluation.step in run.reported or metric not in evaluation.metrics:
                continue
            run.trial.report(evaluation.metrics[metric], evaluation.step)
            run.reported.add(evaluation.step)
            new = True
        # The evaluation at the trial's last step leaves nothing to save:
        # the pruner is not asked, and the trial ends by itself.
        last = int(run.trial.params.get("max_steps", self.config.max_steps))
        if new and run.ending is None and self.config.pruner != "none" \
                and max(run.reported) < last and run.trial.should_prune():
            run.pruned_at = max(run.reported)
            self._end(run, "pruned")

    def _end(self, run: _Running, why: str) -> None:
        signal_group(run.proc.pid, signal.SIGTERM)
        run.ending, run.deadline = why, time.monotonic() + self.config.grace_s

    def poll(self) -> None:
        now = time.monotonic()
        for number, run in list(self.running.items()):
            self._beat(run, now)
            if run.proc.poll() is None:
                if run.ending is None:
                    self._report(run)
                    if run.ending is None and now - run.started > self.config.trial_timeout_s:
                        self._end(run, "timeout")
                elif now > run.deadline:
                    signal_group(run.proc.pid, signal.SIGKILL)
                    run.proc.wait()
                if run.proc.poll() is None:
                    continue
            self.finish(number)

    # -- finishing

    def _progress(self, trial: Trial) -> str:
        table = rows(self.study, self.config.model_dir)
        best = best_trial(table, self.config.study.resolved_goal)
        finished = sum(1 for t in table if t.finished)
        left = max(0, self.config.study.max_trials - finished)
        parts = ["trial %d %s" % (trial.trial, trial.status)]
        if trial.status == "pruned":
            parts[0] += " at step %d" % trial.pruned_at
        if trial.metric is not None:
            parts.append("%s %.4f" % (self.config.study.metric, trial.metric))
        elif trial.message:
            parts.append(trial.message)
        parts.append(_describe(trial.hparams))
        parts.append("best %s" % ("%.4f (trial %d)" % (best.metric, best.trial) if best
                                  else "none yet"))
        parts.append("%d of %d finished" % (finished, self.config.study.max_trials))
        if left and self.finished_here:
            mean = sum(self.finished_here) / len(self.finished_here)
            parts.append("about %s left" % _duration(
                mean * left / max(1, self.config.study.parallel_trials)))
        return " · ".join(parts)

    def finish(self, number: int, interrupted: bool = False) -> None:
        run = self.running.pop(number)
        run.log.close()
        try:
            self._finish(number, run, interrupted)
        except search.optuna().exceptions.UpdateFinishedTrialError:
            # Its heartbeat lapsed (this command stalled) and another worker
            # failed it and queued its retry.
            say("trial %d was already marked failed by another worker of the study (no "
                "heartbeat in time); its retry stands in for it" % number)
        self.save()
        ended = row(self.study.trials[number], self.config.model_dir)
        if self.tracking is not None and ended.finished:
            self.tracking.trial_ended(ended, sum(1 for t in rows(self.study, self.config.model_dir)
                                                 if t.finished))

    def _finish(self, number: int, run: "_Running", interrupted: bool) -> None:
        trial, code = run.trial, run.proc.returncode
        wall = round(time.monotonic() - run.started, 1)
        trial.set_user_attr("wall_time_s", wall)
        if interrupted or (code == Preempted.exit_code and run.ending is None):
            # Stopped after saving a checkpoint: back in the queue, resumed by
            # whichever worker asks next.
            trial.set_user_attr("status", "interrupted")
            trial.set_user_attr("message", "stopped by a signal; resumes from its checkpoint")
            try:
                self.storage.set_trial_state_values(run.trial_id, _state("WAITING"))
            except Exception as e:  # pylint: disable=broad-except
                say("trial %d could not be put back in the queue: %s" % (number, e))
            say("trial %d interrupted after %.0f s; it resumes from its checkpoint"
                % (number, wall))
            return
        self.finished_here.append(wall)
        # Recorded by its exit: a trial that exits 0 trained to its end and
        # exported, even when the SIGTERM tune sent it (pruned, timed out)
        # landed after its last step; any other exit of a trial tune ended is
        # the stop tune asked for.
        result, message = (_read_result(run.folder, self.config.study.metric)
                           if code == 0 else (None, None))
        if result is not None:
            self._succeeded(trial, run, result)
        elif run.ending == "pruned":
            self._pruned(trial, run, code)
        elif run.ending == "timeout":
            trial.set_user_attr("status", "timeout")
            trial.set_user_attr("message", "ended after the %.0f s --trial-timeout"
                                % self.config.trial_timeout_s)
            self.study.tell(trial, state=_state("FAIL"))
        elif code == 0:
            self._fail(trial, message)
        else:
            self._fail(trial, "exit %d: %s" % (code, _last_line(io.join(run.folder,
                                                                         TRIAL_LOG))))
        say(self._progress(row(self.study.trials[number], self.config.model_dir)))

    def _succeeded(self, trial, run: "_Running", result) -> None:
        value, steps, export_dir = result
        if steps is not None and steps not in run.reported:
            trial.report(value, steps)
        trial.set_user_attr("steps", steps)
        trial.set_user_attr("export_dir", export_dir)
        trial.set_user_attr("status", "succeeded")
        if run.ending is not None:
            trial.set_user_attr("message", "finished and exported before the SIGTERM (%s) "
                                "took effect" % ("pruned at step %d" % run.pruned_at
                                                 if run.ending == "pruned" else run.ending))
        self.study.tell(trial, value)

    def _pruned(self, trial, run: "_Running", code: int) -> None:
        trained = _trained_steps(run.folder, run.pruned_at)
        trial.set_user_attr("status", "pruned")
        trial.set_user_attr("pruned_at", run.pruned_at)
        trial.set_user_attr("steps", trained)
        notes = [] if trained == run.pruned_at else ["its checkpoint: step %d" % trained]
        if code < 0:
            notes.append("ended by signal %d" % -code)
        elif code not in (0, Preempted.exit_code):
            notes.append("exit %d: %s" % (code, _last_line(io.join(run.folder, TRIAL_LOG))))
        trial.set_user_attr("message", "pruned at step %d%s" % (
            run.pruned_at, " (%s)" % "; ".join(notes) if notes else ""))
        self.study.tell(trial, state=_state("PRUNED"))

    def _fail(self, trial, message: str) -> None:
        trial.set_user_attr("status", "failed")
        trial.set_user_attr("message", message)
        self.study.tell(trial, state=_state("FAIL"))

    # -- the loop

    def loop(self) -> None:
        parallel = self.config.study.parallel_trials
        waiting_said = False
        while self.stop_signal is None:
            if self.heartbeat and time.monotonic() - self.last_stale_check >= min(
                    self.config.heartbeat_s, 30):
                studies.fail_stale(self.study)
                self.last_stale_check = time.monotonic()
            while (len(self.running) < parallel and self.stop_signal is None
                   and self.can_ask()):
                trial = self._next()
                if trial is None:
                    break
                self.start(trial)
            self.poll()
            if not self.running and not self.can_ask():
                others = self.others_running() if self.heartbeat else 0
                if not others:
                    break
                if not waiting_said:
                    say("waiting for the %d trial%s other workers run (one whose worker dies "
                        "is retried)" % (others, "" if others == 1 else "s"))
                    waiting_said = True
            time.sleep(_POLL_S)

    def stop(self) -> None:
        """Ends every running trial (SIGTERM, then SIGKILL after the grace)
        and puts it back in the queue."""
        for run in self.running.values():
            if run.ending is None:
                signal_group(run.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.config.grace_s
        while self.running:
            now = time.monotonic()
            for number, run in list(self.running.items()):
                self._beat(run, now)
                if run.proc.poll() is None and now > deadline:
                    signal_group(run.proc.pid, signal.SIGKILL)
                    run.proc.wait()
                if run.proc.poll() is not None:
                    self.finish(number, interrupted=run.ending is None)
            time.sleep(0.1)


def _state(name: str):
    return getattr(search.optuna().trial.TrialState, name)


def _retry_failed(study) -> None:
    """Queues each failed or timed-out original trial again, with the same
    values; the retry takes its place among the study's trials."""
    trials = study.get_trials(deepcopy=False)
    done = studies.replaced(trials)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        retry = studies.retry_callback(max_retry=None)
        for t in trials:
            if (t.state.name == "FAIL" and not studies.is_surplus(t) and t.number not in done
                    and t.user_attrs.get("status") in ("failed", "timeout")):
                retry(study, t)
                say("trial %d (%s) queued again" % (t.number, t.user_attrs.get("status")))


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


def open_study(config: StudyConfig):
    """(study, storage) of ``config``, created or loaded."""
    url = config.storage_url
    storage = studies.open_storage(url, config.heartbeat_s)
    seed = config.seed
    if seed is None and config.algorithm == "qmc":
        # The workers of a study draw from one QMC sequence only with one
        # seed: without --seed, the study's name and definition give it.
        seed = int(studies.digest({"name": config.name, **config.definition()}), 16) % 2 ** 32
    sampler = search.sampler(config.study.space, config.algorithm, seed,
                             config.study.parallel_trials)
    pruner = search.pruner(config.pruner, config.first_eval_step, config.max_steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna's experimental-feature notices
        study = studies.load_study(storage, config.name, config.study.resolved_goal, sampler,
                                   pruner, config.definition(), studies.describe(url))
    return study, storage


def run_study(config: StudyConfig) -> StudyResult:
    """Runs (or resumes, or joins) the study; returns the table and the best trial.

    Raises :class:`Preempted` when a signal stopped it (rerun to resume),
    :class:`ConfigError` for a bad study or a storage holding another one.
    """
    tune_config.check(config)
    io.makedirs(config.model_dir)
    study, storage = open_study(config)
    if config.retry_failed:
        _retry_failed(study)
    table = rows(study, config.model_dir)
    finished = sum(1 for t in table if t.finished)
    if table:
        say("study %r (%s): %d of %d trials finished" % (
            config.name, studies.describe(config.storage_url), finished,
            config.study.max_trials))
    tracking = (tracked_study.StudyTracking(config, study, say) if config.track else None)
    with tracking or contextlib.nullcontext():
        result = _run(config, study, storage, tracking)
        if tracking is not None:
            tracking.finish(result.best)
    return result


def _run(config: StudyConfig, study, storage, tracking) -> StudyResult:
    runner = _Runner(config, study, storage, tracking)
    runner.save()
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {s: signal.signal(s, runner.on_signal)
                    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        if config.prepare_command and runner.can_ask():
            _prepare(config)
        runner.loop()
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
    ordered = rows(study, config.model_dir)
    write_table(config, ordered)
    best = best_trial(ordered, config.study.resolved_goal)
    if config.plots:
        for path in tune_plots.write(study, config.model_dir, config.study.metric, say):
            say("plot: %s" % path)
    if best is None:
        raise EstimatorKerasError(
            "tune: no trial succeeded; see the table %s and each trial's %s."
            % (io.join(config.model_dir, TRIALS_CSV), TRIAL_LOG))
    copy_best(config, best)
    return StudyResult(config, ordered, best)
