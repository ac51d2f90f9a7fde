"""The shape of the house: TensorFlow stays out of the light modules, the
public API resolves, modules import each other in one direction and stay
small enough to read, and the wheel holds the packages and nothing else."""

import ast
import glob
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from support import ROOT, child_env

PACKAGES = ("estimator_keras", "experiments")
TF_FREE = ("estimator_keras", "estimator_keras.errors", "estimator_keras.io",
           "estimator_keras.schema", "estimator_keras.manifest",
           "estimator_keras.tfrecord_frames", "estimator_keras.record_index",
           "estimator_keras.example_codec", "estimator_keras.modeldir",
           "estimator_keras.tf_optional", "estimator_keras.record_files",
           "estimator_keras.records", "estimator_keras.verify",
           "estimator_keras.input_config", "estimator_keras.input_order",
           "estimator_keras.order_state", "estimator_keras.grain_inputs",
           "estimator_keras.pipeline_choice", "experiments.training.context",
           "experiments.training.run",
           "estimator_keras.sources.base", "estimator_keras.sources.idx",
           "estimator_keras.sources.download", "estimator_keras.sources.images",
           "estimator_keras.sources.folders", "estimator_keras.sources.scan",
           "estimator_keras.sources.layouts", "estimator_keras.sources.tfrecords",
           "estimator_keras.sources.shapes", "experiments.catalog.prepare",
           "experiments.commands.show",
           "estimator_keras.engines", "estimator_keras.engines.base",
           "estimator_keras.engines.keras3.checkpoints", "estimator_keras.engines.registry",
           "estimator_keras.engines.model_dirs", "estimator_keras.engines.estimator",
           "estimator_keras.engines.keras", "estimator_keras.engines.keras3",
           "estimator_keras.distribute.tf_config", "estimator_keras.distribute.launcher",
           "estimator_keras.distribute.strategy", "estimator_keras.sources",
           "estimator_keras.cloud.spec", "estimator_keras.cloud.vertex",
           "estimator_keras.cloud.tfjob", "estimator_keras.cloud.jaxjob",
           "estimator_keras.cloud.jobenv",
           "estimator_keras.tuning", "estimator_keras.tuning.space",
           "estimator_keras.tuning.optuna_search", "estimator_keras.cloud.hypertune",
           "estimator_keras.cloud.trainjob_status",
           "estimator_keras.cloud.trainjob", "estimator_keras.cloud.targets",
           "estimator_keras.distribute.trainjob_pods", "estimator_keras.tracking",
           "estimator_keras.tracking.settings", "estimator_keras.tracking.mlflow_run",
           "estimator_keras.tracking.sender",
           "experiments.training.tracked", "experiments.tuning.tracked",
           "experiments", "experiments.cli", "experiments.commands.common", "experiments.catalog.registry",
           "experiments.catalog.loading", "experiments.config.types", "experiments.config.files",
           "experiments.config.data_info", "experiments.config.hparams", "experiments.catalog.datasets",
           "experiments.commands.prepare", "experiments.tuning.runner", "experiments.commands.tune",
           "experiments.commands.submit", "experiments.commands.cluster",
           "estimator_keras.engines.optimizers", "estimator_keras.summaries",
           "estimator_keras.signatures", "estimator_keras.export", "estimator_keras.checkpoints",
           "estimator_keras.losses", "estimator_keras.precision", "estimator_keras.order_state",
           "estimator_keras.engines.keras3.export", "estimator_keras.engines.keras3.advice",
           "estimator_keras.pipeline_choice", "estimator_keras.engines.keras_setup",
           "experiments.catalog.models", "experiments.catalog.shapes",
           "estimator_keras.distribute.groups", "estimator_keras.model_inputs",
           "estimator_keras.input_config", "experiments.commands.train",
           "experiments.commands.evaluate", "experiments.commands.export")
MAX_LINES = 600


def test_light_modules_do_not_import_tensorflow():
    # Nor MLflow: a tracked run imports it on its sender's thread only.
    code = ("import importlib, sys\n"
            f"for name in {TF_FREE!r}:\n"
            "    importlib.import_module(name)\n"
            "from experiments.catalog import loading as catalog\n"
            "catalog.load()\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tensorflow', 'keras', 'tf_keras', 'mlflow')))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout[:500]


def test_public_api_resolves_lazily():
    import estimator_keras  # pylint: disable=import-outside-toplevel

    for name in estimator_keras.__all__:
        if name in ("to_estimator", "train_and_evaluate", "BestExporter"):
            continue  # tf.estimator: TensorFlow 2.15 only
        assert getattr(estimator_keras, name) is not None, name
    with pytest.raises(AttributeError, match="no_such_name"):
        estimator_keras.no_such_name  # pylint: disable=pointless-statement


def _modules(packages=PACKAGES):
    for package in packages:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                    yield dotted.removesuffix(".__init__"), path


def _imports(module, path, known):
    """The package-internal modules ``module`` imports, as dotted names."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found.update(n for n in names if n in known and n != module)
    return found


def test_no_import_circles():
    modules = dict(_modules())
    graph = {m: _imports(m, p, modules) for m, p in modules.items()}
    # A package's __init__ that names its submodules is not a circle.
    graph = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}
    state = {}

    def visit(node, trail):
        state[node] = "open"
        for dep in sorted(graph[node]):
            if state.get(dep) == "open":
                raise AssertionError("import circle: " + " -> ".join(
                    trail[trail.index(dep):] + [dep]))
            if dep not in state:
                visit(dep, trail + [dep])
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_paths_are_joined_by_io_only():
    """A path may be a gs:// URI: estimator_keras.io is the one module that
    joins paths of both kinds."""
    found = [m for m, p in _modules() if m != "estimator_keras.io"
             and "posixpath" in open(p, encoding="utf-8").read()]
    assert not found, f"modules joining paths with posixpath instead of io.join: {found}"


def test_each_helper_has_one_copy():
    from estimator_keras import schema  # pylint: disable=import-outside-toplevel
    from estimator_keras.distribute import launcher  # pylint: disable=import-outside-toplevel
    from experiments.commands import common as commands  # pylint: disable=import-outside-toplevel
    from experiments.commands import prepare as prepare_cmd  # pylint: disable=import-outside-toplevel
    from experiments.tuning import runner as tune  # pylint: disable=import-outside-toplevel

    assert tune.signal_group is launcher.signal_group
    assert prepare_cmd.data_dir is commands.data_dir
    copies = [f"{module.__name__}.{name}" for module, name in (
        (tune, "_signal_group"), (launcher, "_signal_group"), (prepare_cmd, "_data_dir"),
        (prepare_cmd, "IMPORTERS"), (schema, "schema_from_json")) if hasattr(module, name)]
    assert not copies, copies


def test_no_module_is_too_long():
    # The benchmarks too: they are read as often as the library.
    long = {m: n for m, p in _modules(PACKAGES + ("benchmarks",))
            if (n := sum(1 for _ in open(p, encoding="utf-8"))) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


# experiments/: the face at the top, its rooms below, each importing only the
# rooms under it (the first imports none of the others).
FACE = {"__init__.py", "__main__.py", "cli.py"}
ROOMS = ("config", "catalog", "training", "tuning", "commands")


def test_the_top_of_experiments_holds_only_the_face():
    top = {name for name in os.listdir(os.path.join(ROOT, "experiments"))
           if name != "__pycache__"}
    assert top == FACE | set(ROOMS), sorted(top - FACE - set(ROOMS))


def _experiments_imports(tree):
    """The modules of experiments/ that a module's syntax tree imports."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "experiments")
        elif (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
              and node.module.split(".")[0] == "experiments"):
            found.update(f"{node.module}.{a.name}" if node.module == "experiments"
                         else node.module for a in node.names)
    return found


def _runs_up(room, names):
    """Those of ``names`` that a module of ``room`` may not import: the face
    (``experiments`` itself among them) or a room above its own."""
    def above(name):
        target = (name.split(".") + [""])[1]
        return target not in ROOMS or ROOMS.index(target) > ROOMS.index(room)
    return sorted(name for name in names if above(name))


def test_no_import_runs_from_a_room_back_up():
    up, rooms = [], set()
    for module, path in _modules(("experiments",)):
        room = (module.split(".") + [""])[1]
        if room in ROOMS:
            rooms.add(room)
            names = _experiments_imports(ast.parse(open(path, encoding="utf-8").read()))
            up += [f"{module} imports {name}" for name in _runs_up(room, names)]
    assert rooms == set(ROOMS), rooms
    assert not up, "imports that run up, to the face or a higher room:\n" + "\n".join(up)


def test_the_room_guard_finds_an_import_that_runs_up():
    source = ("import experiments.cli\nfrom experiments import DataConfig\n"
              "from experiments.commands import train\nfrom experiments.config import types\n"
              "from experiments.catalog.registry import register\n")
    names = _experiments_imports(ast.parse(source))
    assert _runs_up("catalog", names) == ["experiments.DataConfig", "experiments.cli",
                                          "experiments.commands"]


@pytest.mark.slow
def test_the_wheel_ships_no_benchmarks(tmp_path):
    # benchmarks/ runs from a checkout; setup.py leaves it out of the wheel.
    # The build runs on a copy, so that no build/ or egg-info lands here.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("setup.py", "MANIFEST.in", "README.md", "BENCHMARKS.md", "tox.ini"):
        if os.path.exists(os.path.join(ROOT, name)):
            shutil.copy(os.path.join(ROOT, name), source / name)
    for package in PACKAGES + ("benchmarks",):
        shutil.copytree(os.path.join(ROOT, package), source / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "results"))
    env = dict(child_env(), PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                           "--no-build-isolation", "--no-index", "-w", str(tmp_path / "dist"),
                           str(source)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (wheel,) = glob.glob(str(tmp_path / "dist" / "*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.startswith("benchmarks/")]
    for module in ("estimator_keras/__init__.py", "estimator_keras/sources/__init__.py",
                   "experiments/__main__.py", "experiments/cli.py"):
        assert module in names, module
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == set(PACKAGES), tops


def test_the_runners_old_module_names_still_import_with_a_warning():
    """Code written against the flat runner keeps working, told where each
    name went: ``from experiments import models``, ``commands.cmd_train``."""
    import importlib  # pylint: disable=import-outside-toplevel
    import warnings  # pylint: disable=import-outside-toplevel

    import experiments  # pylint: disable=import-outside-toplevel
    from experiments import commands  # pylint: disable=import-outside-toplevel

    moved = dict(experiments._MOVED)  # pylint: disable=protected-access
    assert {"models", "tune", "config_files", "submit"} <= set(moved)
    for name, target in moved.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            found = getattr(experiments, name)
        assert found is importlib.import_module(target), name
        assert any(issubclass(w.category, DeprecationWarning) and target in str(w.message)
                   for w in caught), (name, [str(w.message) for w in caught])
    for name, (module, new) in commands._MOVED.items():  # pylint: disable=protected-access
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            found = getattr(commands, name)
        assert found is getattr(importlib.import_module(f"experiments.commands.{module}"), new)
        assert caught and issubclass(caught[0].category, DeprecationWarning), name
    with pytest.raises(AttributeError):
        getattr(experiments, "no_such_module")
