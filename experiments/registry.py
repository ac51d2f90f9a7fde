"""Experiments and datasets by name.

The registry only records: it imports no experiment module. Modules that
define experiments and datasets call :func:`register` and
:func:`register_dataset` when they are imported, and
:mod:`experiments.catalog` imports them (the built-in ones and, for a
command, the user's) before anything is looked up::

    register(Experiment(
        config=ExperimentConfig(name="my_cnn", description="...",
                                data=DataConfig(dataset="fashion_mnist"),
                                model={"dropout": 0.5}),
        build_model=my_builder))
    register_dataset("my_images", "my photos, 5 classes", lambda **_: {"train": ...})
"""

import dataclasses
import typing

from estimator_keras.errors import UsageError


@dataclasses.dataclass
class Dataset:
    """A named dataset that ``prepare`` can write.

    Attributes:
      name: the registry key and the folder name under the data dir.
      description: one line for ``list``.
      splits: ``fn(source_dir=..., download_dir=...)`` -> ``{split: source}``,
        each source a dict of numpy arrays or an example source (see
        :mod:`estimator_keras.sources`).
    """

    name: str
    description: str
    splits: typing.Callable


_EXPERIMENTS = {}
_DATASETS = {}


def register(experiment):
    """Adds an :class:`experiments.config.Experiment`; returns it."""
    if experiment.name in _EXPERIMENTS:
        raise ValueError(f"experiment {experiment.name!r} is registered twice")
    _EXPERIMENTS[experiment.name] = experiment
    return experiment


def register_dataset(name, description, splits):
    """Adds a named dataset for ``prepare``; returns its :class:`Dataset`."""
    if name in _DATASETS:
        raise ValueError(f"dataset {name!r} is registered twice")
    _DATASETS[name] = Dataset(name, description, splits)
    return _DATASETS[name]


def names():
    return sorted(_EXPERIMENTS)


def get(name):
    """The registered Experiment; UsageError listing the names otherwise."""
    if name not in _EXPERIMENTS:
        raise UsageError(f"unknown experiment {name!r}; registered experiments: "
                         f"{', '.join(sorted(_EXPERIMENTS))}. See `python -m experiments list`.")
    return _EXPERIMENTS[name]


def dataset_names():
    return sorted(_DATASETS)


def dataset(name):
    """The registered :class:`Dataset`; UsageError listing the names otherwise."""
    if name not in _DATASETS:
        raise UsageError(f"unknown dataset {name!r}; available: "
                         f"{', '.join(sorted(_DATASETS))}.")
    return _DATASETS[name]
