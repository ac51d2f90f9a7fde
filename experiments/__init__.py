"""Named experiments and the ``python -m experiments`` runner.

The extension API, for your own models and data (see the README's "Your own
experiments and data")::

    from experiments import (DataConfig, Experiment, ExperimentConfig, TrainConfig,
                             register, register_dataset)

A module that registers experiments or datasets is loaded with
``python -m experiments --module my_module ...``, ``EK_MODULES``, or an
entry point in the group ``estimator_keras.experiments``.
"""

from experiments.config import DataConfig, Experiment, ExperimentConfig, TrainConfig
from experiments.data_info import DataInfo
from experiments.registry import register, register_dataset

__all__ = ["DataConfig", "DataInfo", "Experiment", "ExperimentConfig", "TrainConfig",
           "register", "register_dataset"]
