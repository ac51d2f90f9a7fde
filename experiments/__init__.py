"""Named experiments and the ``python -m experiments`` runner.

The extension API, for your own models and data (see the README's "Your own
experiments and data")::

    from experiments import (DataConfig, Experiment, ExperimentConfig, TrainConfig,
                             register, register_dataset)

A module that registers experiments or datasets is loaded with
``python -m experiments --module my_module ...``, ``EK_MODULES``, or an
entry point in the group ``estimator_keras.experiments``.
"""

import sys

from experiments.catalog import registry
from experiments.catalog.registry import register, register_dataset
from experiments.config import DataConfig, Experiment, ExperimentConfig, TrainConfig
from experiments.config.data_info import DataInfo

# Plugins import ``experiments.registry``, the registry's name before the
# catalog had a folder of its own.
sys.modules.setdefault("experiments.registry", registry)

__all__ = ["DataConfig", "DataInfo", "Experiment", "ExperimentConfig", "TrainConfig",
           "register", "register_dataset"]
