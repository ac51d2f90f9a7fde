"""An experiment's configuration: the typed config
(:mod:`~experiments.config.types`, whose names this package also hands on),
what a dataset says of itself (:mod:`~experiments.config.data_info`),
config files, ``--hparams``, ``train``'s flags and the command lines' parser."""

from experiments.config.data_info import call_with_data
from experiments.config.types import (LEARNING_RATE_DECAYS, DataConfig, Experiment,
                                      ExperimentConfig, TrainConfig)

__all__ = ["LEARNING_RATE_DECAYS", "DataConfig", "Experiment", "ExperimentConfig", "TrainConfig",
           "call_with_data"]
