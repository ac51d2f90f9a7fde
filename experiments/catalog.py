"""Fills the registry: imports the modules that define experiments and datasets.

The registry itself imports nothing; every command that looks a name up
calls :func:`load` first.

Example::

    from experiments import catalog, registry
    catalog.load()
    experiment = registry.get("fashion_mnist_cnn")
"""

import importlib

BUILTIN_MODULES = ("experiments.fashion_mnist", "experiments.mnist", "experiments.shapes")


def load():
    """Imports the built-in experiment modules (each registers itself once)."""
    for name in BUILTIN_MODULES:
        importlib.import_module(name)
