"""The catalog: the registry of experiments and datasets by name
(:mod:`~experiments.catalog.registry`), the loading that fills it
(:mod:`~experiments.catalog.loading`), and the built-in experiments, model
builders and datasets, with the ``prepare`` step that writes a dataset."""

# The loader's names, where the catalog's module of that name had them.
from experiments.catalog.loading import (BUILTIN_MODULES, ENTRY_POINT_GROUP, MODULES_VARIABLE,
                                         Broken, PluginError, check, load, plugins_requested,
                                         requested_modules)

__all__ = ["BUILTIN_MODULES", "ENTRY_POINT_GROUP", "MODULES_VARIABLE", "Broken", "PluginError",
           "check", "load", "plugins_requested", "requested_modules"]
