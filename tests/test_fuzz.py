"""Fuzzing the readers: random and mutated records end only in documented
errors, never in a crash or a hang (see fuzz_records.py)."""

import ast
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.slow
def test_fuzzed_records_raise_only_documented_errors():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, os.path.join(HERE, "fuzz_records.py"),
                           "1234", "1000", "250"], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    files = ast.literal_eval(lines["files"])
    pipelines = ast.literal_eval(lines["pipelines"])
    assert sum(files[k] for k in ("ok", "broken")) == 1000
    # Both outcomes must occur, or the mutations exercised nothing.
    assert files["broken"] > 100 and files["refused"] > 100
    assert pipelines["op_error"] > 10 and pipelines["ok"] > 250
