"""One folder an engine: no module of the program outside
``estimator_keras/engines/`` decides anything by an engine's or a Keras
backend's name; it asks the registry. The scan reads every module of
``estimator_keras/`` (but ``engines/``) and ``experiments/``, and finds a
name used as a choice: compared with, listed among choices, a dict's key,
or a parameter's default. A name used as a module's (an import,
``sys.modules``, a logger, a distribution's metadata) is not a choice.
Benchmarks and tests name engines on purpose: they measure and check each."""

import ast
import glob
import os

import pytest

from estimator_keras.engines import keras_setup, registry
from support import ROOT

ENGINE_NAMES = frozenset(registry.names()) | {"estimator", "keras", "keras3"}
BACKEND_NAMES = frozenset(keras_setup.TRAINING_BACKENDS) | set(
    keras_setup.INFERENCE_BACKENDS) | set(keras_setup.UNSUPPORTED_BACKENDS)
NAMES = ENGINE_NAMES | BACKEND_NAMES


def _named(node):
    return isinstance(node, ast.Constant) and node.value in NAMES


def _is_sys_modules(node):
    return (isinstance(node, ast.Attribute) and node.attr == "modules"
            and isinstance(node.value, ast.Name) and node.value.id == "sys")


def _elements(node):
    return node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]


def name_choices(source, filename="<source>"):
    """(line, what) for each engine or backend name used as a choice in
    ``source``."""
    tree = ast.parse(source, filename)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_is_sys_modules(o) for o in operands):
                continue
            if any(_named(v) for o in operands for v in _elements(o)):
                found.append((node.lineno, "compared: " + ast.get_source_segment(source, node)))
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            if len(node.elts) > 1 and any(_named(v) for v in node.elts) and all(
                    isinstance(v, ast.Constant) for v in node.elts):
                found.append((node.lineno, "among choices: "
                              + ast.get_source_segment(source, node)))
        elif isinstance(node, ast.Dict):
            if any(key is not None and _named(key) for key in node.keys):
                found.append((node.lineno, "a dict's key: "
                              + ast.get_source_segment(source, node)[:80]))
        elif isinstance(node, ast.arguments):
            for default in node.defaults + [d for d in node.kw_defaults if d is not None]:
                if _named(default):
                    found.append((default.lineno, "a default: "
                                  + ast.get_source_segment(source, default)))
    # A tuple compared with is reported once, as the comparison.
    compared = {line for line, what in found if what.startswith("compared: ")}
    return sorted({(line, what) for line, what in found
                   if not (what.startswith("among choices: ") and line in compared)})


def program_modules():
    """Every module of the program outside engines/."""
    paths = glob.glob(os.path.join(ROOT, "estimator_keras", "**", "*.py"), recursive=True)
    paths += glob.glob(os.path.join(ROOT, "experiments", "**", "*.py"), recursive=True)
    engines_dir = os.path.join(ROOT, "estimator_keras", "engines") + os.sep
    return sorted(p for p in paths if not p.startswith(engines_dir))


@pytest.mark.parametrize("source, lines", [
    ('if engine == "keras3":\n    pass\n', [1]),
    ('ok = backend in ("jax", "torch")\n', [1]),
    ('IMAGES = {"estimator": "2-15"}\n', [1]),
    ('KINDS = ("tfjob", "keras")\n', [1]),
    ('def f(engine="keras"):\n    pass\n', [1]),
    ('def f(*, backend="jax"):\n    pass\n', [1]),
    # A module's name is not a choice; nor is any other word.
    ('import keras\nif "tensorflow" in sys.modules:\n    pass\n', []),
    ('logging.getLogger("tensorflow")\nv = installed_version("keras")\n', []),
    ('if args.command == "train":\n    pass\nX = ("auto", "none")\n', []),
])
def test_the_scan_finds_each_kind_of_choice(source, lines):
    assert [line for line, _ in name_choices(source)] == lines


def test_no_module_outside_engines_chooses_by_an_engine_or_backend_name():
    paths = program_modules()
    assert len(paths) > 60, paths
    found = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            source = f.read()
        found += [f"{os.path.relpath(path, ROOT)}:{line}: {what}"
                  for line, what in name_choices(source, path)]
    assert not found, ("these modules decide by an engine's or a backend's name: ask "
                       "estimator_keras.engines.registry instead:\n" + "\n".join(found))
