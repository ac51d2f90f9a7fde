"""The catalog: the registry of experiments and datasets by name
(:mod:`~experiments.catalog.registry`), the loading that fills it
(:mod:`~experiments.catalog.loading`), and the built-in experiments, model
builders and datasets, with the ``prepare`` step that writes a dataset."""

from experiments.catalog.loading import check, load, plugins_requested

__all__ = ["check", "load", "plugins_requested"]
