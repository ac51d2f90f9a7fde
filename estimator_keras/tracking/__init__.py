"""Experiment tracking: a run's record in MLflow (``--track``).

Tracking is split in two: ``estimator_keras.tracking`` is how any run
reaches MLflow (where, through which process, within which bounds), and
what a ``train`` or ``tune`` run records (its config, dataset and command
line, and the versions that the engines' registry entries name) is the
runner's, in ``experiments.training.tracked`` and ``experiments.tuning.tracked``.

:mod:`~estimator_keras.tracking.settings` resolves where a run is tracked and
bounds MLflow's client; :mod:`~estimator_keras.tracking.mlflow_run` writes one
run from a background thread.
"""

from estimator_keras.tracking.settings import resolve

__all__ = ["resolve"]
