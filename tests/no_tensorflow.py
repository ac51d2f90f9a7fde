"""Runs a module or code as on an install without TensorFlow.

Usage::

    python tests/no_tensorflow.py -m experiments prepare shapes --data-dir /tmp/d
    python tests/no_tensorflow.py -c "from estimator_keras import records"

A finder put first on ``sys.meta_path`` raises ModuleNotFoundError for
``tensorflow``, ``tf_keras`` and ``tensorflow_estimator`` and their
submodules, as an import of a package that is not installed does, and
``importlib.util.find_spec`` answers None for them. The module runs as
``python -m`` runs it (the current folder first on ``sys.path``), the code
as ``python -c`` does. At exit nothing is printed when none of those
packages was loaded; otherwise their names go to stderr and the exit status
is 3. Worker processes the run spawns start without the finder.
"""

import importlib.abc
import importlib.util
import os
import runpy
import sys

BLOCKED = ("tensorflow", "tf_keras", "tensorflow_estimator")
EXIT_LOADED = 3


def _blocked(name):
    return name.split(".")[0] in BLOCKED


class _Absent(importlib.abc.MetaPathFinder):
    """Finds the blocked packages missing."""

    def find_spec(self, name, path=None, target=None):  # pylint: disable=unused-argument
        if _blocked(name):
            raise ModuleNotFoundError(f"No module named {name!r} (tests/no_tensorflow.py)",
                                      name=name)
        return None


def _find_spec(name, package=None, _real=importlib.util.find_spec):
    if _blocked(importlib.util.resolve_name(name, package) if name.startswith(".") else name):
        return None
    return _real(name, package)


def main(argv):
    if len(argv) < 2 or argv[0] not in ("-m", "-c"):
        sys.stderr.write(__doc__)
        return 2
    sys.meta_path.insert(0, _Absent())
    importlib.util.find_spec = _find_spec
    # As `python -m` and `python -c`: the current folder, not tests/, comes first.
    sys.path[0] = os.getcwd() if argv[0] == "-m" else ""
    status = 0
    try:
        if argv[0] == "-m":
            sys.argv = argv[1:]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = ["-c"] + argv[2:]
            code = compile(argv[1], "<string>", "exec")
            exec(code, {"__name__": "__main__"})  # pylint: disable=exec-used
    except SystemExit as e:
        status = e.code
    loaded = sorted(m for m in sys.modules if _blocked(m))
    if loaded:
        sys.stderr.write(f"tests/no_tensorflow.py: loaded {', '.join(loaded[:10])}\n")
        return EXIT_LOADED
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
