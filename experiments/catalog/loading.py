"""Fills the registry: imports the modules that define experiments and
datasets, and remembers where each name came from.

Three kinds of modules register names, each with an origin that ``list``
shows:

- the built-in ones (this package);
- installed distributions declaring an entry point in the group
  ``estimator_keras.experiments`` (``importlib.metadata``);
- the user's own: ``--module MOD`` (repeatable) or ``EK_MODULES`` (comma
  separated), each a dotted module name importable from the current
  directory or ``sys.path``, or a path to a ``.py`` file or a package folder.

The registry itself imports nothing; every command that looks a name up
calls :func:`load` first. A module that fails to import does not stop the
others: :func:`load` returns what broke, ``list`` shows it, and the other
commands refuse to go on (:func:`check`).

Example::

    from experiments import catalog, registry
    catalog.check(catalog.load(["my_models.py"]))
    experiment = registry.get("my_cnn")
"""

import dataclasses
import importlib
import importlib.metadata
import importlib.util
import os
import sys
import traceback

from estimator_keras.errors import EstimatorKerasError
from experiments.catalog import registry

BUILTIN_MODULES = ("experiments.catalog.fashion_mnist", "experiments.catalog.mnist",
                   "experiments.catalog.shapes", "experiments.catalog.images")
ENTRY_POINT_GROUP = "estimator_keras.experiments"
MODULES_VARIABLE = "EK_MODULES"


class PluginError(EstimatorKerasError):
    """A user's module did not import, or registered a name twice."""


@dataclasses.dataclass
class Broken:
    """A module that failed to load."""

    origin: str
    error: BaseException
    details: str

    def message(self):
        text = " ".join(str(self.error).split()) or type(self.error).__name__
        return (f"{self.origin} failed to load: {type(self.error).__name__}: {text}. Fix it, "
                f"or leave it out (--module, {MODULES_VARIABLE}, or uninstall its "
                f"distribution); --verbose shows the traceback.")


_LOADED = {}


def requested_modules(modules=()):
    """(module, origin) for the ``--module`` values, then the ``EK_MODULES``
    ones, without repeats."""
    found = {m: f"--module {m}" for m in modules or ()}
    for name in os.environ.get(MODULES_VARIABLE, "").split(","):
        if name.strip():
            found.setdefault(name.strip(), f"{MODULES_VARIABLE} {name.strip()}")
    return list(found.items())


def plugins_requested(modules=()):
    """Whether :func:`load` would import modules other than the built-in
    ones (``modules``, ``EK_MODULES``, installed plugins)."""
    return bool(requested_modules(modules)) or any(True for _ in _plugin_entry_points())


def _plugin_entry_points():
    """The installed plugins' entry points. Python 3.9's importlib.metadata
    selects no group (it returns a dict) and gives no EntryPoint.dist."""
    points = importlib.metadata.entry_points()
    if hasattr(points, "select"):
        return points.select(group=ENTRY_POINT_GROUP)
    return points.get(ENTRY_POINT_GROUP, ())


def load(modules=(), entry_points=True):
    """Imports the built-in modules, the installed plugins and ``modules``;
    returns the :class:`Broken` ones. A module is known by the file it
    resolves to, so one file given twice (``my.py``, ``./my.py``, its
    absolute path, a link to it, or the module an entry point names) is
    imported once."""
    broken = []
    for name in BUILTIN_MODULES:
        _load(name, "built-in", lambda n=name: _module_file(n),
              lambda n=name: importlib.import_module(n), broken)
    if entry_points:
        for point in _plugin_entry_points():
            dist = getattr(point, "dist", None)
            dist = dist.name if dist is not None else "?"
            _load(f"entry point {point.name}", f"entry point {point.name!r} of distribution "
                  f"{dist}", lambda p=point: _module_file(_entry_point_module(p)),
                  point.load, broken)
    for spec, origin in requested_modules(modules):
        _load(spec, origin, lambda s=spec: _user_module_file(s),
              lambda s=spec: _import_user_module(s), broken)
    return broken


def check(broken, verbose=False):
    """Raises PluginError for the first broken module (the traceback goes to
    stderr with ``verbose``)."""
    if broken:
        if verbose:
            sys.stderr.write(broken[0].details)
        raise PluginError(broken[0].message())


def _load(name, origin, locate, do_import, broken):
    """Imports one module unless the file ``locate()`` finds for it (None:
    no file, then ``name`` stands for it) is loaded already."""
    key = name
    try:
        with registry.origin(origin):
            key = locate() or name
            if key in _LOADED or _imported(key):
                if isinstance(_LOADED.get(key), Broken):
                    broken.append(_LOADED[key])
                return
            do_import()
        _LOADED[key] = origin
    except registry.DuplicateName as e:
        raise PluginError(str(e)) from e
    except Exception as e:  # pylint: disable=broad-except  (any failure of user code)
        _LOADED[key] = Broken(origin, e, traceback.format_exc())
        broken.append(_LOADED[key])


def _imported(path):
    """Whether a module of this file is imported already (say by another
    plugin): running the file again would register its names twice."""
    if not os.path.isabs(path):
        return False
    base = os.path.basename(path)
    return any(os.path.basename(f) == base and os.path.realpath(f) == path
               for f in (getattr(m, "__file__", None) for m in list(sys.modules.values()))
               if isinstance(f, str))


def _entry_point_module(point):
    """The module part of an entry point's ``module[:attr] [extras]``."""
    return point.value.split(":")[0].split("[")[0].strip()


def _module_file(name):
    """The real path of the file that module ``name`` would be imported
    from, or None (a namespace package, a built-in module)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.has_location or not spec.origin:
        return None
    return os.path.realpath(spec.origin)


def _user_module_file(spec):
    """The real path of the file a ``--module`` / ``EK_MODULES`` value
    names (see :func:`_import_user_module`), or None."""
    path = os.path.abspath(os.path.expanduser(spec))
    if spec.endswith(".py") or os.path.isfile(path):
        return os.path.realpath(path) if os.path.isfile(path) else None
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, "__init__.py")):
        return os.path.realpath(os.path.join(path, "__init__.py"))
    _importable_from_cwd()
    return _module_file(spec)


def _import_user_module(spec):
    """A dotted name, a ``.py`` file or a package folder."""
    path = os.path.abspath(os.path.expanduser(spec))
    if spec.endswith(".py") or os.path.isfile(path):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no such file: {path}")
        name = "ek_user_" + os.path.splitext(os.path.basename(path))[0]
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        # The module's own folder, so that it can import its neighbours.
        sys.path.insert(0, os.path.dirname(path))
        module_spec.loader.exec_module(module)
        return module
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, "__init__.py")):
        sys.path.insert(0, os.path.dirname(path))
        return importlib.import_module(os.path.basename(path))
    _importable_from_cwd()
    return importlib.import_module(spec)


def _importable_from_cwd():
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
