"""The source distribution a Vertex AI job installs before it runs.

:func:`build_sdist` runs ``setup.py sdist`` in a checkout and returns the
archive; :func:`expected_sdist_name` predicts the archive's name without
building it (for dry runs); :func:`default_project_root` is the checkout this
package sits in. :func:`output_tail` trims a tool's output for error messages.
"""

import ast
import logging
import os
import re
import subprocess
import sys
from typing import Dict, List

from estimator_keras import io
from estimator_keras.errors import CloudError

logger = logging.getLogger(__name__)

_SDIST_TIMEOUT_S = 600


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


def _archives(dist_dir: str) -> Dict[str, int]:
    return {p: io.mtime_ns(p) for p in io.glob(io.join(dist_dir, "*.tar.gz"))}


def build_sdist(project_root: str, dist_dir: str) -> str:
    """Build a source distribution of the project; return the .tar.gz path.

    Runs ``python setup.py sdist --dist-dir DIST_DIR`` in ``project_root`` (an
    argument list, no shell). Raises CloudError with the end of the output when
    the build fails or produces no archive.
    """
    setup_py = io.join(project_root, "setup.py")
    if not io.isfile(setup_py):
        raise CloudError(
            "Cannot build the package to upload: %s does not exist. Submit from a "
            "source checkout of estimator-keras, or pass an uploaded package as "
            "package_uri." % setup_py)
    io.makedirs(dist_dir)
    dist_dir = os.path.abspath(dist_dir)
    before = _archives(dist_dir)
    argv = sdist_command(dist_dir)
    logger.info("building sdist: %s (in %s)", argv, project_root)
    try:
        proc = subprocess.run(argv, cwd=project_root, capture_output=True, text=True,
                              timeout=_SDIST_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise CloudError("Building the sdist in %s took over %d s and was stopped."
                         % (project_root, _SDIST_TIMEOUT_S)) from exc
    output = (proc.stdout or "") + (proc.stderr or "")
    if proc.returncode != 0:
        raise CloudError("Building the sdist failed (%s exited %d). Last output:\n%s"
                         % (" ".join(argv[1:]), proc.returncode, output_tail(output)))
    built = {p: t for p, t in _archives(dist_dir).items() if before.get(p) != t}
    if not built:
        raise CloudError("`setup.py sdist` succeeded but wrote no .tar.gz into %s. "
                         "Last output:\n%s" % (dist_dir, output_tail(output)))
    return max(built, key=built.get)


def expected_sdist_name(project_root: str) -> str:
    """Best guess of the sdist file name, read from setup.py without running it.

    Used only to show the upload path in a dry run; falls back to
    ``PACKAGE.tar.gz`` when name or version are not literals.
    """
    try:
        tree = ast.parse(io.read_text(io.join(project_root, "setup.py")))
    except (OSError, SyntaxError, ValueError):
        return "PACKAGE.tar.gz"
    found: Dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id",
                                                  getattr(node.func, "attr", "")) == "setup":
            for kw in node.keywords:
                if kw.arg in ("name", "version") and isinstance(kw.value, ast.Constant) \
                        and isinstance(kw.value.value, str):
                    found[kw.arg] = kw.value.value
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
        return "PACKAGE.tar.gz"
    # `setup.py sdist` runs with this interpreter's setuptools; from 69.3 on it
    # writes PEP 625 names (runs of -_. become _), before that runs of other
    # characters became -.
    try:
        from importlib.metadata import version  # pylint: disable=import-outside-toplevel
        setuptools_version = tuple(int(p) for p in re.findall(r"\d+", version("setuptools"))[:2])
    except Exception:  # pylint: disable=broad-except
        setuptools_version = (99,)
    if setuptools_version >= (69, 3):
        name = re.sub(r"[-_.]+", "_", found["name"]).lower()
    else:
        name = re.sub(r"[^A-Za-z0-9.]+", "-", found["name"])
    return "%s-%s.tar.gz" % (name, found["version"])
