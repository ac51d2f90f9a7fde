"""The hyperparameter search space, below everything that reads it: the space
file and a study over it in Vertex AI's vocabulary
(:mod:`~estimator_keras.tuning.space`), and its translation to Optuna's
distributions, samplers and pruners (:mod:`~estimator_keras.tuning.optuna_search`).
Local ``tune``, Vertex AI's HyperparameterTuningJob and Katib's Experiment
read it from here."""
