"""One training run: what it decides once (:mod:`~experiments.training.context`),
the run that trains, evaluates and exports (:mod:`~experiments.training.run`),
and what it records in MLflow (:mod:`~experiments.training.tracked`)."""
