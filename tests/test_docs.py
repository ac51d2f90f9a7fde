"""The README says what the code and the tests do: the quickstart's commands,
CI running its test command, the package version in sample outputs, and the
case counts of "What survives what"."""

import ast
import importlib
import os
import re
import shlex

import pytest

import estimator_keras
from support import ROOT

README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
CI = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()


def _section(title):
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end > 0 else None]


def _quickstart_commands():
    block = re.search(r"```bash\n(.*?)```", _section("Quickstart"), re.S).group(1)
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_the_quickstart_makes_a_venv_and_uses_it():
    main, tests = _quickstart_commands()
    steps = [shlex.split(step) for step in main.split("&&")]
    assert ["python3", "-m", "venv", ".venv"] in steps
    assert steps[-1] == [".venv/bin/python", "-m", "experiments", "train", "fashion_mnist_cnn"]
    assert [".venv/bin/pip", "install", "-e", ".[cpu]"] in steps
    assert tests.startswith(".venv/bin/")


def test_ci_runs_exactly_the_readme_test_command():
    _, tests = _quickstart_commands()
    ci_lines = [line.strip() for line in CI.splitlines()]
    assert tests in ci_lines, (tests, CI)
    assert "python3 -m venv .venv" in CI


def test_sample_outputs_name_this_version():
    found = set(re.findall(r"estimator[-_]keras-(\d+\.\d+\.\d+)", README))
    assert found, "no versioned sample output in README.md"
    assert found == {estimator_keras.__version__}, found


def test_no_placeholder_is_left():
    assert "@@TODO" not in README


def _survival_rows():
    table = _section("When things go wrong").split("### What survives what", 1)[1]
    for line in table.splitlines():
        if not line.startswith("| ") or line.startswith("| ---") or "cases tried" in line:
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        yield cells[1], cells[2]


@pytest.mark.parametrize("test, cases", list(_survival_rows()))
def test_what_survives_what_counts_come_from_the_tests(test, cases):
    files = re.findall(r"tests/(\w+)\.py", test)
    assert files, f"no test named in: {test}"
    for name, value in re.findall(r"`(\w+)` = (\([^)]*\)|[\d,]+)", cases):
        module = importlib.import_module(files[0])
        assert getattr(module, name) == ast.literal_eval(value.replace(",", "")
                                                         if value[0] != "(" else value), \
            f"{files[0]}.{name} is {getattr(module, name)!r}, the README says {value}"
