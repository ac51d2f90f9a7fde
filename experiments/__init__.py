"""Named experiments and the ``python -m experiments`` runner.

The extension API, for your own models and data (see the README's "Your own
experiments and data")::

    from experiments import (DataConfig, Experiment, ExperimentConfig, TrainConfig,
                             register, register_dataset)

A module that registers experiments or datasets is loaded with
``python -m experiments --module my_module ...``, ``EK_MODULES``, or an
entry point in the group ``estimator_keras.experiments``.
"""

import importlib
import sys
import warnings

from experiments.catalog import registry
from experiments.catalog.registry import register, register_dataset
from experiments.config import DataConfig, Experiment, ExperimentConfig, TrainConfig
from experiments.config.data_info import DataInfo

# Plugins import ``experiments.registry``, the registry's name before the
# catalog had a folder of its own.
sys.modules.setdefault("experiments.registry", registry)

# Modules that moved into the runner's folders, by their old names: ``from
# experiments import models`` keeps working, with a DeprecationWarning.
_MOVED = {
    "models": "experiments.catalog.models", "datasets": "experiments.catalog.datasets",
    "shapes": "experiments.catalog.shapes", "mnist": "experiments.catalog.mnist",
    "fashion_mnist": "experiments.catalog.fashion_mnist",
    "images": "experiments.catalog.images", "prepare": "experiments.catalog.prepare",
    "data_info": "experiments.config.data_info", "config_files": "experiments.config.files",
    "hparams": "experiments.config.hparams", "train_flags": "experiments.config.flags",
    "parsing": "experiments.config.parsing", "context": "experiments.training.context",
    "train": "experiments.training.run", "tracked": "experiments.training.tracked",
    "tune": "experiments.tuning.runner", "tune_config": "experiments.tuning.study_config",
    "tune_table": "experiments.tuning.table", "tune_plots": "experiments.tuning.plots",
    "studies": "experiments.tuning.studies", "tracked_study": "experiments.tuning.tracked",
    "evaluations": "experiments.tuning.evaluations",
    "search": "estimator_keras.tuning.optuna_search",
    "prepare_cmd": "experiments.commands.prepare", "cluster_cmd": "experiments.commands.cluster",
    "tune_cmd": "experiments.commands.tune", "submit": "experiments.commands.submit",
    "submit_vertex": "experiments.commands.submit_vertex",
}


def __getattr__(name):
    if name not in _MOVED:
        raise AttributeError(f"module 'experiments' has no attribute {name!r}")
    warnings.warn(f"experiments.{name} moved to {_MOVED[name]}; import it from there",
                  DeprecationWarning, stacklevel=2)
    return importlib.import_module(_MOVED[name])


__all__ = ["DataConfig", "DataInfo", "Experiment", "ExperimentConfig", "TrainConfig",
           "register", "register_dataset"]
