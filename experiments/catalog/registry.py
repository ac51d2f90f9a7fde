"""Experiments and datasets by name.

The registry only records: it imports no experiment module. Modules that
define experiments and datasets call :func:`register` and
:func:`register_dataset` when they are imported, and
:mod:`experiments.catalog.loading` imports them (the built-in ones and, for a
command, the user's) before anything is looked up::

    register(Experiment(
        config=ExperimentConfig(name="my_cnn", description="...",
                                data=DataConfig(dataset="fashion_mnist"),
                                model={"dropout": 0.5}),
        build_model=my_builder))
    register_dataset("my_images", "my photos, 5 classes", lambda **_: {"train": ...})
"""

import contextlib
import dataclasses
import typing

from estimator_keras.errors import UsageError
from experiments.config import parsing


@dataclasses.dataclass
class Dataset:
    """A named dataset that ``prepare`` can write.

    Attributes:
      name: the registry key and the folder name under the data dir.
      description: one line for ``list``.
      splits: ``fn(source_dir=..., download_dir=...)`` -> ``{split: source}``,
        each source a dict of numpy arrays or an example source (see
        :mod:`estimator_keras.sources`).
      labels: ``{label_feature: {"num_classes": N, "class_names": [...]}}``
        for the manifest, or None (sources may carry their own ``labels``).
    """

    name: str
    description: str
    splits: typing.Callable
    labels: dict = None


_EXPERIMENTS = {}
_DATASETS = {}
# `prepare images|segmentation|tfrecords` import the user's own files.
RESERVED_DATASET_NAMES = ("images", "segmentation", "tfrecords")
# Name -> where it was registered from (for `list` and for duplicates).
_ORIGINS = {"experiment": {}, "dataset": {}}
_current_origin = ["(registered in Python)"]


class DuplicateName(ValueError):
    """A second experiment or dataset under a name already taken."""


@contextlib.contextmanager
def origin(text):
    """Names registered inside come from ``text`` (e.g. "--module my.py")."""
    _current_origin.append(text)
    try:
        yield
    finally:
        _current_origin.pop()


def _claim(kind, name):
    taken = _ORIGINS[kind].get(name)
    if taken is not None:
        raise DuplicateName(f"{kind} {name!r} is registered twice: by {taken} and by "
                            f"{_current_origin[-1]}. Rename one of them.")
    _ORIGINS[kind][name] = _current_origin[-1]


def register(experiment):
    """Adds an :class:`experiments.config.types.Experiment`; returns it.

    Raises:
      DuplicateName: the name is taken, naming both origins.
    """
    _claim("experiment", experiment.name)
    _EXPERIMENTS[experiment.name] = experiment
    return experiment


def register_dataset(name, description, splits, labels=None):
    """Adds a named dataset for ``prepare``: ``splits(source_dir=...,
    download_dir=...)`` returns ``{split: source}``; ``labels`` names the
    classes (see :class:`Dataset`). Returns its :class:`Dataset`.

    Raises:
      DuplicateName: the name is taken, naming both origins.
    """
    if name in RESERVED_DATASET_NAMES:
        raise DuplicateName(f"dataset name {name!r} is reserved: `prepare {name}` imports "
                            f"your own files. Choose another name.")
    _claim("dataset", name)
    _DATASETS[name] = Dataset(name, description, splits, labels)
    return _DATASETS[name]


def origin_of(kind, name):
    """Where an experiment or dataset ("experiment"/"dataset") came from."""
    return _ORIGINS[kind].get(name)


def names():
    return sorted(_EXPERIMENTS)


def get(name):
    """The registered Experiment; UsageError listing the names otherwise."""
    return _lookup(_EXPERIMENTS, "experiment", name)


def dataset_names():
    return sorted(_DATASETS)


def dataset(name):
    """The registered :class:`Dataset`; UsageError listing the names otherwise."""
    return _lookup(_DATASETS, "dataset", name)


def did_you_mean(name, names):
    """`` (did you mean NAME?)`` when ``name`` is close to one of ``names``, else ""."""
    close = parsing.closest(str(name), names)
    return f" (did you mean {close}?)" if close else ""


def _lookup(table, kind, name):
    if name not in table:
        raise UsageError(f"unknown {kind} {name!r}{did_you_mean(name, table)}; registered "
                         f"{kind}s: {', '.join(sorted(table))}. See `python -m experiments list`.")
    return table[name]
