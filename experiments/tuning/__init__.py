"""Local hyperparameter tuning: an Optuna study whose trials are ``train``
processes (:mod:`~experiments.tuning.runner`), where the study lives, its
table, plots and MLflow record. The search space and its translations are
the library's (:mod:`estimator_keras.tuning`)."""
