"""Each evaluation of a run, as it happens, for whatever watches the run.

``train --evaluations-file FILE`` keeps one JSON line per evaluation,
``{"step": 500, "time": 1733363000.5, "metrics": {"accuracy": 0.81, ...}}``,
and a last line ``{"step": 620, ..., "metrics": {}, "stopped": true}`` when a
signal stopped the run (the step of the checkpoint it saved): ``tune`` reads
it to report a trial's intermediate values to its pruner, and the steps a
pruned trial really trained.
The file is rewritten whole at each evaluation through a temporary name, so
a reader never sees half a line (and it works on ``gs://`` too).

``train --print-evaluations`` prints ``accuracy=0.8123 loss=0.4321`` lines
on stdout: the ``name=value`` form Katib's StdOut metrics collector parses
from a trial's log (its default filter, ``([\\w|-]+)\\s*=\\s*(number)``).

Only the task that evaluates (the chief, or a cluster's evaluator) records.
TF-free.
"""

import dataclasses
import json
import sys
import time
from typing import Dict, List, Optional

from estimator_keras import io
from estimator_keras.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """One evaluation: the checkpoint step, when, and the metrics."""

    step: int
    time: float
    metrics: Dict[str, float]
    stopped: bool = False


def read(path: str) -> List[Evaluation]:
    """The evaluations recorded at ``path`` so far ([] when there is no file yet)."""
    if not io.exists(path):
        return []
    text = io.read_text(path)
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            out.append(Evaluation(int(row["step"]), float(row["time"]),
                                  {k: float(v) for k, v in row["metrics"].items()},
                                  bool(row.get("stopped", False))))
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"{path}, line {number}: not an evaluation this package "
                              f"wrote ({e}); expected {{\"step\", \"time\", \"metrics\"}}.") from e
    return out


@dataclasses.dataclass
class Recorder:
    """Where a run's evaluations go: a JSON-lines file, stdout, or both."""

    path: Optional[str] = None
    to_stdout: bool = False

    def __bool__(self):
        return bool(self.path or self.to_stdout)

    def record(self, metrics: Dict[str, float]) -> None:
        """Records one evaluation (``metrics`` holds ``global_step``)."""
        step = int(metrics.get("global_step", -1))
        values = {k: float(v) for k, v in metrics.items() if k != "global_step"}
        self._append({"step": step, "time": round(time.time(), 3), "metrics": values})
        if self.to_stdout:
            pairs = " ".join(f"{k}={v:.6g}" for k, v in sorted(values.items()))
            sys.stdout.write(f"global_step={step} {pairs}\n")
            sys.stdout.flush()

    def stopped(self, step: Optional[int]) -> None:
        """Records that a signal stopped the run with a checkpoint at ``step``."""
        if step is not None:
            self._append({"step": int(step), "time": round(time.time(), 3), "metrics": {},
                          "stopped": True})

    def _append(self, row: Dict[str, object]) -> None:
        if not self.path:
            return
        before = io.read_text(self.path) if io.exists(self.path) else ""
        if before and not before.endswith("\n"):
            before += "\n"
        parent = io.parent(self.path)
        if parent:
            io.makedirs(parent)
        io.atomic_write(self.path, before + json.dumps(row, sort_keys=True) + "\n")
