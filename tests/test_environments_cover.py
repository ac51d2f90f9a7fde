"""The tox envs together run every case that any of them collects.

A case can be left out in three ways: an env skips it (its ``skips``), an
env deselects it (``only``, its engines, its Keras backends: see
:func:`environments.runs_elsewhere`), or no env lists its module. The
static checks of tests/test_environments.py read the lists; this one asks
the envs themselves: it collects the cases of each env in that env's own
interpreter, as its run would (its modules, its installed packages, its
parametrizations), records what each keeps and deselects, and fails on a
case that some env collects and none runs.

It runs in the extras env, the last of tox's envlist: by then tox has built
the others (it starts them in the envlist's order); it waits a bounded time
for one still installing.
"""

import configparser
from concurrent import futures
import json
import os
import subprocess
import textwrap
import time

import environments
from support import ROOT, child_env

COLLECT_TIMEOUT = 300
READY_WAIT = 600

# Written into a temporary folder and loaded with `-p`: records the cases
# that environments.py deselects and those it keeps.
_PLUGIN = textwrap.dedent("""
    import json
    import os

    _DESELECTED = []


    def pytest_deselected(items):
        _DESELECTED.extend(item.nodeid for item in items)


    def pytest_collection_finish(session):
        with open(os.environ["EK_COLLECTED_FILE"], "w", encoding="utf-8") as f:
            json.dump({"kept": [item.nodeid for item in session.items],
                       "deselected": _DESELECTED}, f)
""")


def _setenv(name):
    """The variables tox.ini sets for env ``name`` (its own and [testenv]'s)."""
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(os.path.join(ROOT, "tox.ini"))
    found = {}
    for section in ("testenv", f"testenv:{name}"):
        for line in tox[section].get("setenv", "").splitlines() if tox.has_section(section) \
                else ():
            key, sep, value = line.partition("=")
            if sep and not key.strip().startswith("{"):
                found[key.strip()] = value.strip()
    return found


def _interpreter(name):
    """The env's Python, once it can import pytest and this package's
    dependencies; an AssertionError after :data:`READY_WAIT` seconds."""
    roots = [ROOT] + ([os.environ["TOX_WORK_DIR"]] if os.environ.get("TOX_WORK_DIR") else [])
    paths = [os.path.join(root if root.endswith(".tox") else os.path.join(root, ".tox"),
                          name, "bin", "python") for root in roots]
    deadline = time.monotonic() + READY_WAIT
    while True:
        for python in paths:
            # The last module an env installs: TensorFlow, or Grain where none is.
            last = "grain" if name in environments.WITHOUT_TENSORFLOW else "tensorflow"
            if os.path.exists(python) and subprocess.run(
                    [python, "-c", f"import pytest, yaml, numpy, {last}"],
                    env=child_env(), capture_output=True, timeout=120).returncode == 0:
                return python
        assert time.monotonic() < deadline, (
            f"tox env {name} is not built (looked for {' and '.join(paths)}): this check "
            f"needs every env of tox's envlist, as CI's `tox p` builds them")
        time.sleep(10)


def _collect(name, tmp_path):
    """{"kept": [...], "deselected": [...]} of env ``name``, collected by its
    interpreter with its variables and its module list."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "ek_collected.py").write_text(_PLUGIN, encoding="utf-8")
    out = folder / "collected.json"
    env = child_env(EK_TEST_ENV=name, EK_COLLECTED_FILE=str(out))
    env.update(_setenv(name))
    env.pop("TOX_ENV_NAME", None)
    env["PYTHONPATH"] = os.pathsep.join([str(folder), os.path.join(ROOT, "tests"),
                                         env["PYTHONPATH"]])
    proc = subprocess.run([_interpreter(name), "-m", "pytest", "--collect-only", "-q",
                           "-p", "ek_collected", "-p", "no:cacheprovider", "tests"],
                          cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=COLLECT_TIMEOUT)
    assert proc.returncode == 0 and out.exists(), \
        f"collecting env {name}'s cases failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}"
    return json.loads(out.read_text(encoding="utf-8"))


def uncovered(collected):
    """The cases of ``collected`` ({env: {"kept", "deselected"}}) that no env
    runs: collected somewhere, and in every env either absent, deselected or
    a skip that env lists."""
    seen, runs = set(), set()
    for name, cases in collected.items():
        # pytest's stand-in for an empty parametrization, which it skips:
        # the env that collects it runs no case of that test by design.
        seen.update(c for c in cases["kept"] + cases["deselected"] if not c.endswith("[NOTSET]"))
        env = environments.ENVIRONMENTS[name]
        runs.update(c for c in cases["kept"] if environments.expected_skip(env, c) is None)
    return sorted(seen - runs)


def test_a_case_skipped_in_one_env_and_deselected_in_the_other_is_found():
    py311 = environments.ENVIRONMENTS["py311"]
    skipped = next(pattern for pattern in py311.skips if "*" not in pattern)
    collected = {"py311": {"kept": [skipped, "tests/test_a.py::test_runs"], "deselected": []},
                 "keras": {"kept": ["tests/test_a.py::test_runs"], "deselected": [skipped]}}
    assert uncovered(collected) == [skipped]
    collected["keras"] = {"kept": [skipped], "deselected": []}
    assert uncovered(collected) == []
    collected["py313"] = {"kept": ["tests/test_a.py::test_none[NOTSET]"], "deselected": []}
    assert uncovered(collected) == []


def test_every_case_an_env_collects_runs_in_some_env(tmp_path):
    # The envs' interpreters collect side by side: each mostly waits on imports.
    with futures.ThreadPoolExecutor(len(environments.ENVIRONMENTS)) as pool:
        found = {name: pool.submit(_collect, name, tmp_path)
                 for name in environments.ENVIRONMENTS}
    collected = {name: job.result() for name, job in found.items()}
    assert all(c["kept"] for c in collected.values()), \
        {name: len(c["kept"]) for name, c in collected.items()}
    missing = uncovered(collected)
    assert not missing, (
        f"{len(missing)} case(s) run in no tox env (skipped where collected, or deselected by "
        f"`only`, engines or backends): " + ", ".join(missing))
