"""Report a tuning trial's metric the way Vertex AI's tuning service reads it.

:func:`report` uses Google's ``cloudml-hypertune`` package (``import
hypertune``) when it is installed, as Vertex documents
(https://cloud.google.com/vertex-ai/docs/training/using-hyperparameter-tuning);
otherwise it writes the same file that package writes, in the format its
README documents (https://github.com/GoogleCloudPlatform/cloudml-hypertune) and
its release on PyPI (0.1.0.dev6, ``hypertune/hypertune.py``) writes:

* the file is ``$CLOUD_ML_HP_METRIC_FILE``, by default
  ``/tmp/hypertune/output.metrics``;
* one JSON object per line, keys sorted: ``{"accuracy": "0.987",
  "checkpoint_path": "", "global_step": "1000", "timestamp": 1525851440.123456,
  "trial": "0"}`` -- the metric (keyed by its name) and the step as strings
  (the step "0" when unknown), ``trial`` from ``$CLOUD_ML_TRIAL_ID`` (default 0);
* the file is rewritten on every report with the last 100 entries of this
  process.

Checked: for the same reports both write byte-identical files.

TF-free.
"""

import collections
import json
import os
import time
from typing import Deque, Dict, Optional

from estimator_keras import io

DEFAULT_METRIC_PATH = "/tmp/hypertune/output.metrics"
MAX_ENTRIES = 100

_entries: Deque[Dict[str, object]] = collections.deque(maxlen=MAX_ENTRIES)
_reporter = None


def metric_path() -> str:
    """Where the metric file goes: ``$CLOUD_ML_HP_METRIC_FILE`` or the default."""
    return os.environ.get("CLOUD_ML_HP_METRIC_FILE", DEFAULT_METRIC_PATH)


def _package_reporter():
    global _reporter  # pylint: disable=global-statement
    if _reporter is None:
        try:
            import hypertune  # pylint: disable=import-outside-toplevel  (optional package)
        except ImportError:
            return None
        _reporter = hypertune.HyperTune()
    return _reporter


def report(metric: str, value: float, step: Optional[int] = None,
           checkpoint_path: str = "") -> str:
    """Reports ``value`` of ``metric`` (the study's metricId) at ``step``;
    returns the metric file written. ``checkpoint_path`` is the package's
    optional hint of a checkpoint to warm-start from.

    Example::

        report("accuracy", metrics["accuracy"], step=metrics["global_step"])
    """
    value = float(value)
    reporter = _package_reporter()
    if reporter is not None:
        extra = {"checkpoint_path": checkpoint_path} if checkpoint_path else {}
        reporter.report_hyperparameter_tuning_metric(
            hyperparameter_metric_tag=metric, metric_value=value, global_step=step, **extra)
        return reporter.metric_path
    _entries.append({
        "timestamp": time.time(),
        "trial": str(os.environ.get("CLOUD_ML_TRIAL_ID", 0)),
        metric: str(value),
        "global_step": str(int(step) if step else 0),
        "checkpoint_path": checkpoint_path,
    })
    path = metric_path()
    io.makedirs(io.parent(path))
    io.atomic_write(path, "".join(json.dumps(e, sort_keys=True) + "\n" for e in _entries))
    return path
