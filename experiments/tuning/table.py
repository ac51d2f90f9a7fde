"""A study's table: one row per trial of the study (whoever ran it), written
atomically to ``DIR/trials.json`` (the study's definition and every trial)
and ``DIR/trials.csv``; and the best trial's export copied to ``DIR/best``.

A row comes from the study's storage, not from this command's memory, so
every worker of a shared study writes the whole study.
"""

import csv
import dataclasses
import io as text_io
import json
from typing import Dict, List, Optional

from estimator_keras import io
from estimator_keras.tuning import space as space_lib
from experiments.tuning import studies

TRIALS_JSON = "trials.json"
TRIALS_CSV = "trials.csv"
BEST_DIR = "best"


def trial_dir(study_dir: str, trial: int) -> str:
    return io.join(study_dir, "trial-%d" % trial)


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
    pruned_at: Optional[int] = None
    worker: Optional[str] = None

    @property
    def finished(self) -> bool:
        return self.status in ("succeeded", "pruned", "failed", "timeout")


_STATUS = {"COMPLETE": "succeeded", "PRUNED": "pruned", "RUNNING": "running"}


def row(frozen, study_dir: str) -> Trial:
    """A table row from one of the study's trials (an Optuna ``FrozenTrial``)."""
    attrs = frozen.user_attrs
    state = frozen.state.name
    status = _STATUS.get(state)
    if state == "FAIL":
        # "running" here: its worker died and another failed it (no heartbeat).
        status = attrs.get("status") if attrs.get("status") in ("failed", "timeout") \
            else "failed"
    elif state == "WAITING":
        status = "interrupted" if attrs.get("status") == "interrupted" else "pending"
    metric = frozen.value if state == "COMPLETE" else None
    if state == "PRUNED" and frozen.intermediate_values:
        metric = frozen.intermediate_values[max(frozen.intermediate_values)]
    message = attrs.get("message")
    retried = studies.retried_number(frozen)
    if state == "FAIL" and attrs.get("status") == "running":
        message = "its worker stopped answering (no heartbeat)"
    if retried is not None:
        message = "; ".join(m for m in ("retry of trial %d" % retried, message) if m)
    return Trial(trial=frozen.number, hparams=dict(frozen.params), status=status,
                 metric=metric, steps=attrs.get("steps"), wall_time_s=attrs.get("wall_time_s"),
                 model_dir=attrs.get("model_dir") or trial_dir(study_dir, frozen.number),
                 export_dir=attrs.get("export_dir"), message=message,
                 pruned_at=attrs.get("pruned_at"), worker=attrs.get("worker"))


def rows(study, study_dir: str) -> List[Trial]:
    """The study's trials as rows, surplus ones left out."""
    return [row(t, study_dir) for t in study.get_trials(deepcopy=False)
            if not studies.is_surplus(t)]


def best_trial(trials: List[Trial], goal: str) -> Optional[Trial]:
    done = [t for t in trials if t.status == "succeeded" and t.metric is not None]
    if not done:
        return None
    sign = 1 if goal == "max" else -1
    return max(done, key=lambda t: (sign * t.metric, -t.trial))


def write_table(config, trials: List[Trial]) -> None:
    """``trials.json`` and ``trials.csv``, each written atomically."""
    ordered = sorted(trials, key=lambda t: t.trial)
    best = best_trial(ordered, config.study.resolved_goal)
    io.makedirs(config.model_dir)
    io.atomic_write(io.join(config.model_dir, TRIALS_JSON), json.dumps(
        {"study": config.definition(), "study_name": config.name,
         "storage": studies.describe(config.storage_url), "best": best.trial if best else None,
         "trials": [dataclasses.asdict(t) for t in ordered]}, indent=2) + "\n")
    names = config.study.space.names
    out = text_io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["trial", "status", config.study.metric, "steps", "wall_time_s"]
                    + names + ["export_dir", "message"])
    for t in ordered:
        writer.writerow([t.trial, t.status, "" if t.metric is None else "%.6g" % t.metric,
                         "" if t.steps is None else t.steps,
                         "" if t.wall_time_s is None else "%.1f" % t.wall_time_s]
                        + [space_lib.format_value(t.hparams[n]) if n in t.hparams else ""
                           for n in names] + [t.export_dir or "", t.message or ""])
    io.atomic_write(io.join(config.model_dir, TRIALS_CSV), out.getvalue())


def copy_best(config, best: Trial) -> Optional[str]:
    """The best trial's export copied to ``DIR/best`` (swapped in whole)."""
    if not best.export_dir or not io.exists(best.export_dir):
        return None
    target = io.join(config.model_dir, BEST_DIR)
    io.recover_swap(target)
    staging = io.new_dir(config.model_dir, ".best-")
    io.copy_tree(best.export_dir, staging)
    io.atomic_write(io.join(staging, "trial.json"), json.dumps(
        {"trial": best.trial, "hparams": best.hparams, "metric": config.study.metric,
         "value": best.metric, "steps": best.steps, "export_dir": best.export_dir},
        indent=2) + "\n")
    io.swap_in(staging, target)
    return target
