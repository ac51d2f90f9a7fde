"""The source distributions a Vertex AI job installs before it runs.

:func:`build_sdist` runs ``setup.py sdist`` in a checkout and returns the
archive; with ``requires`` it builds from a staged copy of the checkout that
carries ``job-requirements.txt``, which setup.py adds to ``install_requires``
(how a keras-engine job gets tf-keras on the prebuilt TensorFlow 2.17 image).
:func:`build_package_sdist` builds the user's own package (``--package-dir``)
the same offline way: ``setup.py sdist``, or for a ``pyproject.toml``-only
project its build backend called in this interpreter (what ``python -m build
--sdist --no-isolation`` does), so nothing is downloaded.
:func:`expected_sdist_name` predicts an archive's name without building it
(for dry runs); :func:`default_project_root` is the checkout this package sits
in. :func:`output_tail` trims a tool's output for error messages.
"""

import ast
import importlib.metadata
import logging
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from typing import Dict, List, Optional, Sequence

from estimator_keras import io
from estimator_keras.errors import CloudError

logger = logging.getLogger(__name__)

_SDIST_TIMEOUT_S = 600

JOB_REQUIREMENTS = "job-requirements.txt"
"""Extra requirements of a job's sdist, one per line; setup.py reads it."""

# What an sdist is built from (the rest of a checkout: tests, venvs, runs...).
_SOURCE_ENTRIES = ("setup.py", "setup.cfg", "pyproject.toml", "MANIFEST.in", "README.md",
                   "BENCHMARKS.md", "tox.ini", "estimator_keras", "experiments")


def output_tail(text: str, lines: int = 20) -> str:
    """The last ``lines`` lines of a command's output, for an error message."""
    return "\n".join((text or "").strip().splitlines()[-lines:])


def default_project_root() -> str:
    """The source checkout this package sits in (the folder holding setup.py)."""
    here = os.path.abspath(__file__)  # <root>/estimator_keras/cloud/packaging.py
    return io.parent(io.parent(io.parent(here)))


def sdist_command(dist_dir: str) -> List[str]:
    """Argument list that builds the sdist into ``dist_dir`` (run in the project root)."""
    return [sys.executable, "setup.py", "sdist", "--dist-dir", dist_dir]


# PEP 517's build_sdist hook of the project's backend, run in the project
# folder with the installed backend (no isolated environment to download).
_BACKEND_SDIST = (
    "import importlib, sys; "
    "toml = importlib.import_module('tomllib' if sys.version_info >= (3, 11) else 'tomli'); "
    "system = toml.load(open('pyproject.toml', 'rb')).get('build-system', {}); "
    "sys.path[:0] = system.get('backend-path', []); "
    "module, _, obj = system.get('build-backend', "
    "'setuptools.build_meta:__legacy__').partition(':'); "
    "backend = importlib.import_module(module); "
    "[backend := getattr(backend, part) for part in obj.split('.') if part]; "
    "print(backend.build_sdist(sys.argv[1]))")


def package_sdist_command(package_dir: str, dist_dir: str) -> List[str]:
    """Argument list that builds the sdist of the user's package ``package_dir``
    into ``dist_dir`` (run in ``package_dir``): ``setup.py sdist`` when it has
    one, else its ``pyproject.toml`` backend's ``build_sdist``. CloudError when
    the folder has neither."""
    if io.isfile(io.join(package_dir, "setup.py")):
        return sdist_command(dist_dir)
    if io.isfile(io.join(package_dir, "pyproject.toml")):
        return [sys.executable, "-c", _BACKEND_SDIST, dist_dir]
    if not io.isdir(package_dir):
        raise CloudError("--package-dir %s: no such folder." % package_dir)
    raise CloudError(
        "--package-dir %s holds neither setup.py nor pyproject.toml: give the folder "
        "of a Python package that pip can install (the job installs its sdist)."
        % package_dir)


def build_package_sdist(package_dir: str, dist_dir: str) -> str:
    """Build the sdist of the user's package ``package_dir`` (see
    :func:`package_sdist_command`) into ``dist_dir``; return the .tar.gz path.

    Raises CloudError with the end of the output when the build fails, for
    example because the project's build backend is not installed here.
    """
    argv = package_sdist_command(package_dir, os.path.abspath(dist_dir))
    io.makedirs(dist_dir)
    return _run_sdist(package_dir, os.path.abspath(dist_dir), argv,
                      what="--package-dir %s" % package_dir)


def _archives(dist_dir: str) -> Dict[str, int]:
    return {p: io.mtime_ns(p) for p in io.glob(io.join(dist_dir, "*.tar.gz"))}


def build_sdist(project_root: str, dist_dir: str, requires: Sequence[str] = ()) -> str:
    """Build a source distribution of the project; return the .tar.gz path.

    Runs ``python setup.py sdist --dist-dir DIST_DIR`` in ``project_root`` (an
    argument list, no shell). With ``requires`` (for example
    ``["tf-keras~=2.17.0"]``) it runs in a staged copy holding
    :data:`JOB_REQUIREMENTS`, and checks that the archive's metadata requires
    them. Raises CloudError with the end of the output when the build fails or
    produces no archive.
    """
    setup_py = io.join(project_root, "setup.py")
    if not io.isfile(setup_py):
        raise CloudError(
            "Cannot build the package to upload: %s does not exist. Submit from a "
            "source checkout of estimator-keras, or pass an uploaded package as "
            "package_uri." % setup_py)
    io.makedirs(dist_dir)
    dist_dir = os.path.abspath(dist_dir)
    if not requires:
        return _run_sdist(project_root, dist_dir)
    staging = io.new_dir(tempfile.gettempdir(), "estimator-keras-src-")
    try:
        for name in _SOURCE_ENTRIES:
            src = io.join(project_root, name)
            if io.isdir(src):
                io.copy_tree(src, io.join(staging, name))
            elif io.exists(src):
                io.copy_file(src, io.join(staging, name))
        io.atomic_write(io.join(staging, JOB_REQUIREMENTS), "".join(r + "\n" for r in requires))
        manifest = io.join(staging, "MANIFEST.in")
        text = io.read_text(manifest) if io.exists(manifest) else ""
        io.atomic_write(manifest, text.rstrip("\n") + "\ninclude %s\n" % JOB_REQUIREMENTS)
        archive = _run_sdist(staging, dist_dir)
    finally:
        io.rmtree(staging)
    missing = sorted(set(requires) - set(sdist_requires(archive)))
    if missing:
        raise CloudError(
            "The sdist %s does not require %s: setup.py must add the lines of %s to "
            "install_requires (the job's prebuilt image needs them)."
            % (archive, ", ".join(missing), JOB_REQUIREMENTS))
    return archive


def _run_sdist(source_dir: str, dist_dir: str, argv: Optional[List[str]] = None,
               what: str = "") -> str:
    before = _archives(dist_dir)
    argv = argv or sdist_command(dist_dir)
    shown = "setup.py sdist" if argv[1:2] == ["setup.py"] else "the build backend's sdist"
    where = " of %s" % what if what else ""
    logger.info("building sdist: %s (in %s)", argv, source_dir)
    try:
        proc = subprocess.run(argv, cwd=source_dir, capture_output=True, text=True,
                              timeout=_SDIST_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise CloudError("Building the sdist in %s took over %d s and was stopped."
                         % (source_dir, _SDIST_TIMEOUT_S)) from exc
    output = (proc.stdout or "") + (proc.stderr or "")
    if proc.returncode != 0:
        raise CloudError("Building the sdist%s failed (%s exited %d). Last output:\n%s"
                         % (where, shown, proc.returncode, output_tail(output)))
    built = {p: t for p, t in _archives(dist_dir).items() if before.get(p) != t}
    if not built:
        raise CloudError("`%s`%s succeeded but wrote no .tar.gz into %s. Last output:\n%s"
                         % (shown, where, dist_dir, output_tail(output)))
    return max(built, key=built.get)


def sdist_requires(archive: str) -> List[str]:
    """The unconditional requirements recorded in an sdist's ``*.egg-info/requires.txt``."""
    with tarfile.open(archive) as tar:
        member = next((m for m in tar.getmembers()
                       if m.name.endswith(".egg-info/requires.txt")), None)
        if member is None:
            return []
        text = tar.extractfile(member).read().decode("utf-8")
    # Lines before the first [extra] section apply to every install.
    lines = text.split("\n[", 1)[0].splitlines()
    return [line.strip() for line in lines if line.strip()]


def expected_sdist_name(project_root: str, fallback: str = "PACKAGE.tar.gz") -> str:
    """Best guess of the sdist file name, read from setup.py (or the
    ``[project]`` table of pyproject.toml) without running anything.

    Used only to show the upload path in a dry run; returns ``fallback`` when
    name or version are not literals.
    """
    found = _setup_py_literals(project_root)
    for key, value in _pyproject_project(project_root).items():
        found.setdefault(key, value)
    if "version" not in found:
        # setup.py may read the version from the package, as ours does.
        try:
            text = io.read_text(io.join(project_root, "estimator_keras", "__init__.py"))
            match = re.search(r'^__version__ = "([^"]+)"', text, re.M)
            if match:
                found["version"] = match.group(1)
        except OSError:
            pass
    if "name" not in found or "version" not in found:
        return fallback
    # `setup.py sdist` runs with this interpreter's setuptools; from 69.3 on it
    # writes PEP 625 names (runs of -_. become _), before that runs of other
    # characters became -.
    try:
        setuptools_version = tuple(int(p) for p in re.findall(
            r"\d+", importlib.metadata.version("setuptools"))[:2])
    except importlib.metadata.PackageNotFoundError:
        setuptools_version = (99,)
    if setuptools_version >= (69, 3):
        name = re.sub(r"[-_.]+", "_", found["name"]).lower()
    else:
        name = re.sub(r"[^A-Za-z0-9.]+", "-", found["name"])
    return "%s-%s.tar.gz" % (name, found["version"])


def _setup_py_literals(project_root: str) -> Dict[str, str]:
    """``name`` and ``version`` given as string literals to setup() in setup.py."""
    try:
        tree = ast.parse(io.read_text(io.join(project_root, "setup.py")))
    except (OSError, SyntaxError, ValueError):
        return {}
    found: Dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id",
                                                  getattr(node.func, "attr", "")) == "setup":
            for kw in node.keywords:
                if kw.arg in ("name", "version") and isinstance(kw.value, ast.Constant) \
                        and isinstance(kw.value.value, str):
                    found[kw.arg] = kw.value.value
    return found


def _pyproject_project(project_root: str) -> Dict[str, str]:
    """``name`` and ``version`` of pyproject.toml's ``[project]`` table, when literal."""
    path = io.join(project_root, "pyproject.toml")
    try:
        import tomllib  # pylint: disable=import-outside-toplevel  (Python 3.11+)
        project = tomllib.loads(io.read_text(path)).get("project", {})
    except (ImportError, OSError, ValueError):
        return {}
    return {k: project[k] for k in ("name", "version") if isinstance(project.get(k), str)}
