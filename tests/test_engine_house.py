"""One folder an engine: no module of the program outside an engine's own
folder decides anything by an engine's or a Keras backend's name; it asks
the registry. The scan reads every module of ``estimator_keras/`` and
``experiments/`` but the engines' folders (``engines/<engine>/``): the
shared modules of ``engines/`` (the registry, the interface, the Keras
setup...) included. It finds a name used as a choice: compared with (also
through a variable or a constant that holds it, and by ``startswith``),
listed among choices, a ``match`` case, a dict's key, a subscript, a call's
argument, or a parameter's default. A name used as a module's or a
distribution's (an import, ``sys.modules``, a logger, package metadata, a
class's ``__module__``, a tuple bound to a name ending in ``_MODULES`` or
``_DISTRIBUTIONS``) is not a choice, nor is a peer's API field that happens to
be spelt like one (a constant bound to a name ending in ``_FIELD``: Kubeflow
Trainer's ``mlPolicy.jax``). Benchmarks and tests name engines on
purpose: they measure and check each."""

import ast
import glob
import os
import re

import pytest

from estimator_keras.engines import registry
from support import ROOT

BACKEND_NAMES = frozenset(
    {name for entry in registry.entries() for name in entry.backends}
    | {name for entry in registry.entries() for name, _ in entry.refused_backends})
NAMES = frozenset(registry.names()) | {"estimator", "keras", "keras3"} | BACKEND_NAMES
# Calls whose string arguments name modules or distributions.
MODULE_CALLS = frozenset({"find_spec", "import_module", "__import__", "getLogger",
                          "installed_version", "version", "distribution", "importorskip"})
MODULE_ATTRIBUTES = frozenset({"__module__", "__name__", "__package__", "__spec__"})
MODULE_BINDINGS = re.compile(r".*_(MODULES|DISTRIBUTIONS)$")
API_FIELDS = re.compile(r".*_FIELD$")


def _is_name(value):
    return isinstance(value, str) and value in NAMES


def _starts_with_a_name(value):
    head = re.match(r"[a-z0-9]+", value) if isinstance(value, str) else None
    return head is not None and head.group(0) in NAMES


def _is_sys_modules(node):
    return (isinstance(node, ast.Attribute) and node.attr == "modules"
            and isinstance(node.value, ast.Name) and node.value.id == "sys")


def _mentions_a_module(node, derived):
    """True where ``node`` reads a module's name (``sys.modules``, a
    ``__module__``) or a variable computed from one."""
    for sub in ast.walk(node):
        if _is_sys_modules(sub) or (isinstance(sub, ast.Attribute)
                                    and sub.attr in MODULE_ATTRIBUTES):
            return True
        if isinstance(sub, ast.Name) and sub.id in derived:
            return True
    return False


def _assignments(body_owner):
    """(targets, value) of the assignments directly in a module's or a
    function's body, nested blocks included but not nested functions."""
    stack = list(ast.iter_child_nodes(body_owner))
    while stack:
        node = stack.pop(0)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, ast.Assign):
            yield node.targets, node.value
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
            yield [node.target], node.value
        elif isinstance(node, ast.NamedExpr):
            yield [node.target], node.value
        elif isinstance(node, (ast.For, ast.comprehension)):
            yield [node.target], node.iter
        stack.extend(ast.iter_child_nodes(node))


def _target_names(targets):
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def named_constants(tree):
    """The module-level names bound to an engine's or a backend's name (not
    the API fields of :data:`API_FIELDS`)."""
    return {name for targets, value in _assignments(tree)
            if isinstance(value, ast.Constant) and _is_name(value.value)
            for name in _target_names(targets) if not API_FIELDS.match(name)}


class _Scan:
    def __init__(self, source, constants):
        self.source, self.constants, self.found = source, constants, []
        self.modules = set()  # tuples of module names (see MODULE_BINDINGS)

    def named(self, node, local):
        """True where ``node`` is an engine's or a backend's name: a string,
        or a variable or constant bound to one."""
        if isinstance(node, ast.Constant):
            return _is_name(node.value)
        if isinstance(node, ast.Name):
            return node.id in local or node.id in self.constants
        if isinstance(node, ast.Attribute):
            return node.attr in self.constants
        return False

    def report(self, node, what):
        segment = ast.get_source_segment(self.source, node)[:80]
        self.found.append((node.lineno, f"{what}: {segment}"))

    def scope(self, owner, inherited_local, inherited_derived):
        local, derived = set(inherited_local), set(inherited_derived)
        for targets, value in _assignments(owner):
            names = _target_names(targets)
            if isinstance(value, ast.Constant) and _is_name(value.value):
                local.update(n for n in names if not API_FIELDS.match(n))
            elif _mentions_a_module(value, derived):
                derived.update(names)
            elif isinstance(value, (ast.Tuple, ast.List, ast.Set)) and any(
                    MODULE_BINDINGS.match(n) for n in names):
                derived.update(names)
                self.modules.add(id(value))
        for node in self.own_nodes(owner):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                self.scope(node, local, derived)
            else:
                self.check(node, local, derived)

    @staticmethod
    def own_nodes(owner):
        """The nodes of ``owner`` outside its nested functions (which are
        returned themselves, for a scope of their own)."""
        stack = list(ast.iter_child_nodes(owner))
        if isinstance(owner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            stack = [owner.args] + [n for n in stack if n is not owner.args]
        while stack:
            node = stack.pop(0)
            yield node
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                stack.extend(ast.iter_child_nodes(node))

    def check(self, node, local, derived):
        named = lambda n: self.named(n, local)  # noqa: E731
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_mentions_a_module(o, derived) for o in operands):
                self.modules.update(id(o) for o in operands)
                return
            if any(named(v) for o in operands
                   for v in (o.elts if isinstance(o, (ast.Tuple, ast.List, ast.Set)) else [o])):
                self.report(node, "compared")
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            # Constants, one of them a name; or names only (a tuple that
            # also holds other variables is a record, not a choice).
            if id(node) not in self.modules and len(node.elts) > 1 and (
                    all(named(v) for v in node.elts) or (
                        any(named(v) for v in node.elts)
                        and all(isinstance(v, ast.Constant) for v in node.elts))):
                self.report(node, "among choices")
        elif isinstance(node, ast.Dict):
            if any(key is not None and named(key) for key in node.keys):
                self.report(node, "a dict's key")
        elif isinstance(node, ast.match_case):
            if any(isinstance(pattern, ast.MatchValue) and named(pattern.value)
                   for pattern in ast.walk(node.pattern)):
                self.report(node.pattern, "a match case")
        elif isinstance(node, ast.Subscript):
            if not _is_sys_modules(node.value) and named(node.slice):
                self.report(node, "a subscript")
        elif isinstance(node, ast.Call):
            func = node.func
            callee = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if callee in ("startswith", "endswith"):
                if not _mentions_a_module(func.value, derived) and any(
                        named(a) or (isinstance(a, ast.Constant) and _starts_with_a_name(a.value))
                        for arg in node.args
                        for a in (arg.elts if isinstance(arg, ast.Tuple) else [arg])):
                    self.report(node, "compared")
                return
            if callee in MODULE_CALLS or (isinstance(func, ast.Attribute)
                                          and _is_sys_modules(func.value)):
                return
            if any(named(a) for a in [*node.args, *(k.value for k in node.keywords)]):
                self.report(node, "a call's argument")
        elif isinstance(node, ast.arguments):
            for default in node.defaults + [d for d in node.kw_defaults if d is not None]:
                if named(default):
                    self.report(default, "a default")


def name_choices(source, filename="<source>", constants=frozenset()):
    """(line, what) for each engine or backend name used as a choice in
    ``source``; ``constants``: names other modules bind to one."""
    tree = ast.parse(source, filename)
    scan = _Scan(source, set(constants) | named_constants(tree))
    scan.scope(tree, set(), set())
    found = scan.found
    # A tuple compared with, or a call's argument, is reported once, as the comparison.
    lines = {line for line, what in found if not what.startswith("among choices: ")}
    return sorted({(line, what) for line, what in found
                   if not (what.startswith("among choices: ") and line in lines)})


def _python_files(*parts):
    return glob.glob(os.path.join(ROOT, *parts, "**", "*.py"), recursive=True)


def program_modules():
    """Every module of the program outside the engines' own folders."""
    paths = _python_files("estimator_keras") + _python_files("experiments")
    engines_dir = os.path.join(ROOT, "estimator_keras", "engines")
    return sorted(p for p in paths if os.path.dirname(p) != engines_dir
                  and not p.startswith(engines_dir + os.sep))


def shared_engine_modules():
    """The modules of ``engines/`` that are no engine's own."""
    return sorted(glob.glob(os.path.join(ROOT, "estimator_keras", "engines", "*.py")))


def every_constant():
    """The module-level names any module of the program binds to an
    engine's or a backend's name (another module may compare with them)."""
    found = set()
    for path in _python_files("estimator_keras") + _python_files("experiments"):
        with open(path, encoding="utf-8") as f:
            found |= named_constants(ast.parse(f.read(), path))
    return found


@pytest.mark.parametrize("source, lines", [
    ('if engine == "keras3":\n    pass\n', [1]),
    ('ok = backend in ("jax", "torch")\n', [1]),
    ('IMAGES = {"estimator": "2-15"}\n', [1]),
    ('KINDS = ("tfjob", "keras")\n', [1]),
    ('def f(engine="keras"):\n    pass\n', [1]),
    ('def f(*, backend="jax"):\n    pass\n', [1]),
    # Through a variable or a constant, here or in another module.
    ('MULTI = "jax"\ndef f(b):\n    return b == MULTI\n', [3]),
    ('def f(b):\n    wanted = "keras3"\n    return b != wanted\n', [3]),
    ('ok = backend == keras3.MULTI_PROCESS_BACKEND\n', [1]),
    ('ok = engine in (FIRST, "keras")\n', [1]),
    ('ORDER = [FIRST, MULTI_PROCESS_BACKEND]\n', [1]),
    ('match engine:\n    case "estimator":\n        pass\n    case _:\n        pass\n', [2]),
    ('match backend:\n    case "numpy" | "openvino":\n        pass\n', [2]),
    ('image = IMAGES["keras3"]\n', [1]),
    ('ok = name.startswith("keras")\n', [1]),
    ('ok = name.startswith(("jax:", "x"))\n', [1]),
    ('entry = registry.get("keras3")\n', [1]),
    ('check(environ, engine="estimator")\n', [1]),
    # A module's name is not a choice; nor is any other word.
    ('import keras\nif "tensorflow" in sys.modules:\n    pass\n', []),
    ('logging.getLogger("tensorflow")\nv = installed_version("keras")\n', []),
    ('if args.command == "train":\n    pass\nX = ("auto", "none")\n', []),
    ('k = sys.modules.get("keras")\nspec = importlib.util.find_spec("jax")\n', []),
    ('def f(cls):\n    top = cls.__module__.split(".")[0]\n    return top == "keras"\n', []),
    ('ok = type(x).__module__.startswith("keras.")\n', []),
    ('def f():\n    backend = "jax"\n    return backend, "cpu", 1\n', []),
    ('STACK_MODULES = ("tensorflow", "tf_keras")\nok = name in STACK_MODULES\n', []),
    ('POLICY_FIELD = "jax"\nspec = {POLICY_FIELD: {}}\n', []),
    ('POLICY = "jax"\nspec = {POLICY: {}}\n', [2]),
])
def test_the_scan_finds_each_kind_of_choice(source, lines):
    assert [line for line, _ in name_choices(source, constants={"MULTI_PROCESS_BACKEND",
                                                                "FIRST"})] == lines


@pytest.mark.parametrize("modules", ["program", "shared engines"])
def test_no_module_outside_an_engines_folder_chooses_by_an_engine_or_backend_name(modules):
    paths = program_modules() if modules == "program" else shared_engine_modules()
    assert len(paths) > (60 if modules == "program" else 5), paths
    names = {os.path.basename(p) for p in paths}
    if modules == "shared engines":
        assert {"__init__.py", "base.py", "keras_setup.py", "model_dirs.py", "optimizers.py",
                "registry.py"} <= names, names
    constants = every_constant()
    found = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            source = f.read()
        found += [f"{os.path.relpath(path, ROOT)}:{line}: {what}"
                  for line, what in name_choices(source, path, constants)]
    assert not found, ("these modules decide by an engine's or a backend's name: ask "
                       "estimator_keras.engines.registry instead:\n" + "\n".join(found))


def engines_imports(source):
    """The lines of ``source`` that import anything of ``estimator_keras.engines``
    (its shared module, the registry or an engine), at any depth."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        if any(name == "estimator_keras.engines" or name.startswith("estimator_keras.engines.")
               for name in names):
            found.append(node.lineno)
    return found


@pytest.mark.parametrize("source, lines", [
    ("from estimator_keras import engines\n", [1]),
    ("def f():\n    from estimator_keras.engines import registry\n", [2]),
    ("import estimator_keras.engines.keras_setup as ks\n", [1]),
    ("from estimator_keras.distribute import tf_config\nimport estimator_keras\n", []),
])
def test_the_engines_import_scan_finds_each_form(source, lines):
    assert engines_imports(source) == lines


def test_distribute_imports_nothing_of_the_engines():
    # The engine's registry entry asks distribute/ which strategy a task
    # trains with; distribute/ never asks the engines back.
    paths = sorted(glob.glob(os.path.join(ROOT, "estimator_keras", "distribute", "*.py")))
    assert len(paths) > 5, paths
    found = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            found += [f"{os.path.relpath(path, ROOT)}:{line}"
                      for line in engines_imports(f.read())]
    assert not found, "distribute/ imports the engines:\n" + "\n".join(found)


def test_tracked_runs_take_versions_from_the_registry_entries():
    for path in ("experiments/training/tracked.py", "experiments/tuning/tracked.py"):
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        taken = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                 and node.module == "estimator_keras.engines" for alias in node.names}
        assert taken <= {"registry"}, (path, taken)
    from experiments.training import tracked
    probe = registry.Entry(
        name="probe", engine="x:Y", summary="", status=lambda tf: (False, ""), keras=2,
        cluster=registry.Cluster(("chief",), ("none",)), packages=(("probe_pkg", ("pytest",)),))
    assert "version.probe_pkg" not in tracked.versions()
    registry.register(probe)
    try:
        found = tracked.versions()
    finally:
        registry.unregister("probe")
    assert found["version.probe_pkg"] == pytest.__version__
    assert found == {f"version.{name}": version
                     for name, version in registry.installed_versions().items()} | {
        "version.probe_pkg": pytest.__version__}
