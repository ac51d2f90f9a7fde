"""Experiment tracking: a run's record in MLflow (``--track``).

:mod:`~estimator_keras.tracking.settings` resolves where a run is tracked and
bounds MLflow's client; :mod:`~estimator_keras.tracking.mlflow_run` writes one
run from a background thread. What a ``train`` or ``tune`` run records is
``experiments.training.tracked``'s.
"""

from estimator_keras.tracking.settings import resolve

__all__ = ["resolve"]
