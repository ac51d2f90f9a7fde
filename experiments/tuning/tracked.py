"""What a ``tune`` study records in MLflow (``tune ... --track``).

Tracking is split in two: ``estimator_keras.tracking`` is how any run
reaches MLflow (where, through which process, within which bounds), and
what a ``train`` or ``tune`` run records (its config, dataset and command
line, and the versions that the engines' registry entries name) is the
runner's, in ``experiments.training.tracked`` and ``experiments.tuning.tracked``.

One parent run per study, the trials' ``train`` runs nested under it
(``mlflow.parentRunId``, set from :data:`~estimator_keras.tracking.settings.PARENT_VARIABLE`
in each trial's environment), each recording what :mod:`experiments.training.tracked`
says. This module records, from the ``tune`` process:

* on the study's run: the study's definition as parameters (experiment,
  space, algorithm, pruner, metric, goal, trials), ``trial_METRIC`` by trial
  number as each trial succeeds and ``best_METRIC`` by finished-trial count;
  at the end the tags ``best_trial`` and ``best_run_id``;
* on each trial's run: ``trial_number``, ``trial_state`` (succeeded, pruned,
  failed, timeout, interrupted), ``pruned_at`` and ``best_trial`` on the best one;
* ``--register NAME``: the best trial's export as a new version of NAME
  (after the study's run ended: as :mod:`experiments.training.tracked` registers).

The study's run id is kept in ``DIR/mlflow-run.json`` and in the Optuna study
(``mlflow_run_id``): a resumed study, or another worker of a shared one,
records into the same run.
"""

import os

from estimator_keras.tracking import mlflow_run, settings
from experiments.training import tracked

STUDY_ATTR = "mlflow_run_id"
URI_ATTR = "mlflow_tracking_uri"
START_WAIT_SECS = 60.0
"""How long ``tune`` waits at most for the study's run before its first trial
(the trials nest under it; its sender imports MLflow first): past that, or
once the store failed to answer, they run unnested, and training goes on."""


class StudyTracking(tracked.RunRecord):
    """The study's run (see :class:`experiments.training.tracked.RunRecord`)."""

    def __init__(self, config, study, log, run_factory=mlflow_run.MlflowRun):
        self.config, self.study, self.log = config, study, log
        self.uri = config.track
        self._best_so_far = None
        known = tracked.read_run_file(config.model_dir)
        attrs = study.user_attrs
        resume = None
        if attrs.get(URI_ATTR) == self.uri and attrs.get(STUDY_ATTR):
            resume = attrs[STUDY_ATTR]
        elif known.get("tracking_uri") == self.uri:
            resume = known.get("run_id")
        experiment = os.environ.get(tracked.EXPERIMENT_VARIABLE) or config.experiment
        self.run = run_factory(self.uri, experiment=experiment, run_name=f"tune-{config.name}",
                               run_id=resume, log=log)
        self.run.tags({**tracked.base_tags(), **tracked.versions(), "study": config.name,
                       "study_dir": config.model_dir, "kind": "study"})
        definition = config.definition()
        self.run.params(tracked.flat_params({
            **{k: v for k, v in definition.items() if k != "space"},
            "space": definition["space"], "trials": config.study.max_trials,
            "parallel_trials": config.study.parallel_trials,
            "seed": config.seed}))
        self.run_id = self.run.wait_started(START_WAIT_SECS)
        if self.run_id is None:
            log("the study's MLflow run does not exist yet: trials start without a parent run")
            return
        tracked.write_run_file(config.model_dir, self.uri, self.run_id)
        if attrs.get(STUDY_ATTR) != self.run_id:
            study.set_user_attr(URI_ATTR, self.uri)
            study.set_user_attr(STUDY_ATTR, self.run_id)
        log(f"the study {'continues in' if resume else 'is recorded in'} MLflow at "
            f"{settings.shown(self.uri)}, run {self.run_id}; its trials nest under it")

    def trial_env(self):
        """What a trial's environment adds: its parent run."""
        return {settings.PARENT_VARIABLE: self.run_id} if self.run_id else {}

    def trial_ended(self, row, finished_count):
        """After a trial's end (``row``: its :class:`~experiments.tuning.table.Trial`)."""
        metric = self.config.study.metric
        tags = {"trial_number": row.trial, "trial_state": row.status}
        if row.pruned_at is not None:
            tags["pruned_at"] = row.pruned_at
        if row.message:
            tags["trial_message"] = row.message
        child = self._child(row)
        if child:
            self.run.tag_run(child, tags)
        if row.status == "succeeded" and row.metric is not None:
            self.run.metrics({f"trial_{metric}": row.metric}, row.trial)
            better = (self._best_so_far is None or
                      (row.metric > self._best_so_far
                       if self.config.study.resolved_goal == "max"
                       else row.metric < self._best_so_far))
            if better:
                self._best_so_far = row.metric
        if self._best_so_far is not None:
            self.run.metrics({f"best_{metric}": self._best_so_far}, finished_count)

    def finish(self, best):
        """Tags the best trial (a Trial row, or None), ends the study's run
        FINISHED, then registers the best trial's export when asked."""
        child = None
        if best is not None:
            child = self._child(best)
            self.run.tags({"best_trial": best.trial, "best_run_id": child or ""})
            if child:
                self.run.tag_run(child, {"best_trial": "true"})
        self.run.end("FINISHED")
        if child and self.config.register:
            tracked.register_export(self.run, self.config.register, best.export_dir or "",
                                    self.log, run_id=child, what="the best trial's export")
        self._end("FINISHED")

    def _child(self, row):
        known = tracked.read_run_file(row.model_dir) if row.model_dir else {}
        return known.get("run_id") if known.get("tracking_uri") == self.uri else None
