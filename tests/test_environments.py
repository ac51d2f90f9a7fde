"""CI's environments together run every test module, both Keras 3 backends
and every case that one of them skips; a skip no environment lists fails."""

import configparser
import fnmatch
import glob
import os
import pathlib
import re
import subprocess
import sys
import textwrap
import types

import environments
from support import ROOT, child_env

MODULES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "tests", "test_*.py")))


def _envlist():
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(os.path.join(ROOT, "tox.ini"))
    return [e.strip() for e in tox["tox"]["envlist"].split(",")]


def test_the_environments_are_toxs_envlist():
    assert _envlist() == list(environments.ENVIRONMENTS)
    # Tests that move weights between engines start the other envs'
    # interpreters: py311's before keras, both before py313; extras collects
    # every env's cases in its interpreter, so it comes last.
    assert _envlist() == ["py311", "keras", "py313", "jax", "extras"]


def test_the_py313_env_installs_exactly_the_quickstarts_extras():
    """py313 stands for the Quickstart's users: the README's install command's
    extras and the test tools, nothing more (extras get an env of their own);
    jax for its JAX users', who install no TensorFlow."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        quickstart = f.read().split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    commands = "\n".join(re.findall(r"```bash\n(.*?)```", quickstart, re.S))
    installs = re.findall(r"pip install -e '\.\[([a-z0-9,-]+)\]'", commands)
    assert installs, "the Quickstart installs no extras"
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(os.path.join(ROOT, "tox.ini"))
    extras = tox["testenv:py313"]["extras"].split()
    assert sorted(extras) == sorted(set(installs[0].split(",")) | {"test"}), extras
    # The Quickstart's line for JAX users without TensorFlow: the jax env.
    assert len(installs) == 2, installs
    extras = tox["testenv:jax"]["extras"].split()
    assert sorted(extras) == sorted(set(installs[1].split(",")) | {"test"}), extras
    assert "KERAS_BACKEND = jax" in tox["testenv:jax"]["setenv"]


def test_every_env_runs_pytest_with_the_callers_arguments_only():
    """`tox p -- -m "not slow"` (the README's fast command) replaces posargs:
    no env may keep its choice of tests there, or the replacement loses it."""
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(os.path.join(ROOT, "tox.ini"))
    for name in _envlist():
        section = tox[f"testenv:{name}"] if tox.has_section(f"testenv:{name}") else tox["testenv"]
        commands = section.get("commands", tox["testenv"]["commands"]).strip()
        assert commands == "pytest {posargs:-q -ra}", (name, commands)


def test_every_module_runs_somewhere_and_every_listed_module_exists():
    listed = {m for env in environments.ENVIRONMENTS.values() for m in env.modules}
    assert sorted(set(MODULES) - listed) == [], "modules no environment runs"
    assert sorted(listed - set(MODULES)) == [], "listed modules that do not exist"


def test_both_keras3_backends_run_somewhere():
    backends = {b for env in environments.ENVIRONMENTS.values() for b in env.backends}
    assert backends == {"tensorflow", "jax"}


def test_every_expected_skip_runs_in_another_environment():
    for name, env in environments.ENVIRONMENTS.items():
        for pattern, reason in env.skips.items():
            assert reason, (name, pattern)
            module = os.path.basename(pattern.split("::")[0])
            assert fnmatch.filter(MODULES, module), (name, pattern, "names no module")
            assert fnmatch.filter(env.modules, module), (name, pattern, "a module it runs not")
            example = pattern.replace("*", "x").replace("[", "").replace("]", "")
            runs = [other for other, e in environments.ENVIRONMENTS.items() if other != name
                    and fnmatch.filter(e.modules, module)
                    and environments.expected_skip(e, example) is None
                    and environments.expected_skip(e, pattern) is None]
            assert runs, f"{pattern} is skipped in {name} and runs in no other environment"


def test_a_module_one_env_runs_in_part_runs_in_full_in_another():
    for name, env in environments.ENVIRONMENTS.items():
        for module, cases in env.only.items():
            assert module in env.modules and cases, (name, module)
            full = [other for other, e in environments.ENVIRONMENTS.items()
                    if other != name and module in e.modules and module not in e.only]
            assert full, f"{module}: {name} runs part of it and no environment the rest"


def test_only_deselects_the_cases_it_does_not_name():
    env = environments.ENVIRONMENTS["py313"]._replace(
        only={"test_x.py": ("test_kept*",)})

    def item(path, name, backend=None, params=""):
        mark = types.SimpleNamespace(args=(backend,)) if backend else None
        return types.SimpleNamespace(path=pathlib.Path("tests", path), originalname=name,
                                     name=name + params, get_closest_marker=lambda name: mark)

    assert not environments.runs_elsewhere(env, item("test_x.py", "test_kept_here"))
    assert environments.runs_elsewhere(env, item("test_x.py", "test_run_elsewhere"))
    # A keras3 case on a backend this env runs is still one `only` leaves out.
    assert environments.runs_elsewhere(env, item("test_x.py", "test_run_elsewhere",
                                                 "tensorflow"))
    assert not environments.runs_elsewhere(env, item("test_x.py", "test_kept_here",
                                                     "tensorflow"))
    assert environments.runs_elsewhere(env, item("test_x.py", "test_kept_here", "jax"))
    assert not environments.runs_elsewhere(env, item("test_y.py", "test_run_elsewhere"))
    py311 = environments.ENVIRONMENTS["py311"]
    assert environments.runs_elsewhere(py311, item("test_keras_engine.py",
                                                   "test_keras3_loads_the_exports"))
    assert not environments.runs_elsewhere(py311, item(
        "test_keras_engine.py", "test_estimator_model_dir_moves_to_the_keras_engine"))
    # A pattern may name a case's parameters too.
    assert not environments.runs_elsewhere(py311, item(
        "test_tune_engines.py", "test_a_trial_falling_behind_is_pruned_at_an_evaluation",
        params="[estimator]"))
    assert environments.runs_elsewhere(py311, item(
        "test_tune_engines.py", "test_a_trial_falling_behind_is_pruned_at_an_evaluation",
        params="[keras3-jax]"))


def _pytest(tmp_path, env_name, body):
    # The module must be one the environment runs (here: this one's name).
    (tmp_path / "test_environments.py").write_text(textwrap.dedent(body))
    env = child_env(EK_TEST_ENV=env_name)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "tests"), env["PYTHONPATH"]])
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "environments",
                           "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                           str(tmp_path / "test_environments.py")],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120)


def test_a_skip_the_environment_does_not_list_fails_the_run(tmp_path):
    proc = _pytest(tmp_path, "py313", """
        import pytest

        def test_passes():
            assert 1 + 1 == 2

        def test_skips():
            pytest.skip("something is missing")
    """)
    assert proc.returncode == 1, proc.stdout
    assert "skips that tests/environments.py does not list for py313" in proc.stdout
    assert "test_environments.py::test_skips: " in proc.stdout
    assert "something is missing" in proc.stdout


def test_a_run_without_skips_passes_and_other_envs_cases_are_deselected(tmp_path):
    proc = _pytest(tmp_path, "py313", """
        import pytest

        @pytest.mark.parametrize("backend", [
            pytest.param("tensorflow", marks=pytest.mark.keras3_backend("tensorflow")),
            pytest.param("jax", marks=pytest.mark.keras3_backend("jax"))])
        def test_backend(backend):
            assert backend == "tensorflow"

        @pytest.mark.parametrize("engine", ["estimator", "keras", "keras3"])
        def test_engine(engine):
            assert engine == "keras3"
    """)
    assert proc.returncode == 0, proc.stdout
    assert "2 passed, 3 deselected" in proc.stdout
