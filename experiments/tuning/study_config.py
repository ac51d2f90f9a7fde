"""What a local study is: :class:`StudyConfig`, the one object ``tune``
builds from its flags, and :func:`check`, which refuses a study that cannot
run before anything starts."""

import dataclasses
import sys
from typing import Dict, List, Optional

from estimator_keras import io
from estimator_keras.distribute.launcher import PREEMPTION_MARGIN
from estimator_keras.distribute.preemption import DEFAULT_GRACE_SECS
from estimator_keras.errors import ConfigError
from estimator_keras.tuning import space as space_lib
from estimator_keras.tuning import optuna_search as search
from experiments.tuning import studies

DEFAULT_TRIAL_TIMEOUT_S = 3600.0
# What a trial's `train` takes to save a checkpoint on SIGTERM, as the cluster
# launcher allows it.
DEFAULT_GRACE_S = DEFAULT_GRACE_SECS + PREEMPTION_MARGIN


@dataclasses.dataclass
class StudyConfig:
    """A local study.

    Attributes:
      experiment: the experiment NAME every trial trains.
      study: the space, metric, goal, trial count (the study's total, whoever
        runs it) and parallelism (trials this command runs at once).
      model_dir: the study's folder: ``trials.json``, ``trials.csv``, the
        plots, ``best/``, ``study.db`` (the default storage) and one
        ``trial-N`` model dir per trial this command ran.
      train_args: flags every trial's ``train`` gets (``--data-dir``,
        ``--max-steps``...); must not hold ``--model-dir`` or ``--hparams``.
      fixed_hparams: ``--hparams`` shared by every trial (``k=v,...``); the
        space's keys must not repeat them.
      algorithm: the sampler (:data:`estimator_keras.tuning.optuna_search.ALGORITHMS`).
      pruner: :data:`estimator_keras.tuning.optuna_search.PRUNERS`.
      seed: seeds the sampler (None: Optuna's own, different in each worker;
        for qmc, one the study's name and definition give every worker).
      storage: the study's storage URL (None: ``model_dir/study.db``).
      study_name: the study's name in its storage (None: the experiment's).
      heartbeat_s: a database storage's heartbeat interval; a trial whose
        worker is silent for twice as long is failed and retried once.
      max_steps, first_eval_step: the steps a trial trains and its first
        evaluation (the pruners' resource range).
      trial_timeout_s: a trial still running after this long is ended.
      grace_s: between SIGTERM and SIGKILL when a trial is ended.
      retry_failed: run failed and timed-out trials again (as new trials of
        the same values, each taking its failed one's place).
      plots: write the study's plots at the end.
      prepare_command: run once before the trials when given (``python -m
        experiments prepare ...``): parallel trials must not each prepare
        the same missing dataset.
      python: the interpreter that runs the trials.
      track: the MLflow tracking URI the study and its trials are recorded
        at (None: not recorded; see :mod:`experiments.tuning.tracked`).
      register: the MLflow registered model the best trial's export becomes
        a version of.
    """

    experiment: str
    study: space_lib.Study
    model_dir: str
    train_args: List[str] = dataclasses.field(default_factory=list)
    fixed_hparams: str = ""
    algorithm: str = search.DEFAULT_ALGORITHM
    pruner: str = search.DEFAULT_PRUNER
    seed: Optional[int] = None
    storage: Optional[str] = None
    study_name: Optional[str] = None
    heartbeat_s: int = studies.DEFAULT_HEARTBEAT_S
    max_steps: int = 1000
    first_eval_step: int = 1000
    trial_timeout_s: float = DEFAULT_TRIAL_TIMEOUT_S
    grace_s: float = DEFAULT_GRACE_S
    retry_failed: bool = False
    plots: bool = True
    prepare_command: Optional[List[str]] = None
    python: str = sys.executable
    track: Optional[str] = None
    register: Optional[str] = None

    @property
    def storage_url(self) -> str:
        return studies.in_study_dir(self.model_dir, self.storage)

    @property
    def name(self) -> str:
        return self.study_name or self.experiment

    def definition(self) -> Dict[str, object]:
        """What makes two commands the same study (the trial count, the
        parallelism, the seed and the data folder may differ)."""
        args, skip = [], False
        for arg in self.train_args:
            if skip:
                skip = False
            elif arg == "--data-dir":
                skip = True
            elif not arg.startswith("--data-dir="):
                args.append(arg)
        return {"experiment": self.experiment, "space": self.study.space.to_dict(),
                "algorithm": self.algorithm, "pruner": self.pruner,
                "metric": self.study.metric, "goal": self.study.resolved_goal,
                "fixed_hparams": self.fixed_hparams, "train_args": args}


def check(config: StudyConfig) -> None:
    """Refuses a study that cannot run, before anything starts."""
    config.study.validate()
    search.check_algorithm(config.study.space, config.algorithm)
    if config.pruner not in search.PRUNERS:
        raise ConfigError("--pruner must be one of %s; got %r."
                          % (", ".join(search.PRUNERS), config.pruner))
    if config.algorithm == "grid" and config.study.max_trials > config.study.space.grid_size():
        raise ConfigError("tune: --trials %d exceeds the grid's %d combinations."
                          % (config.study.max_trials, config.study.space.grid_size()))
    for arg in config.train_args:
        flag = arg.split("=", 1)[0]
        if flag in ("--model-dir", "--hparams", "--evaluations-file"):
            raise ConfigError("tune: %s is set per trial (--model-dir DIR/trial-N, "
                              "--hparams from the space and tune's --hparams, "
                              "--evaluations-file in the trial's folder); do not pass "
                              "it in the train flags." % flag)
    fixed = {item.split("=", 1)[0].strip()
             for item in config.fixed_hparams.split(",") if "=" in item}
    both = sorted(fixed & set(config.study.space.names))
    if both:
        raise ConfigError("tune: %s is both in --hparams and in the search space %s; "
                          "give it in one of them." % (", ".join(both),
                                                       config.study.space.source))
    if io.is_remote(config.model_dir):
        raise ConfigError("tune: --model-dir must be a local folder (the trials run on this "
                          "machine and log there); got %s." % config.model_dir)
    if not isinstance(config.trial_timeout_s, (int, float)) or config.trial_timeout_s <= 0:
        raise ConfigError("--trial-timeout must be a number of seconds > 0; got %r."
                          % (config.trial_timeout_s,))


# ---------------------------------------------------------------- the trials
