"""Fuzzing the readers and the text parsers: random and mutated records,
manifests, --hparams and --config files end only in documented errors, never
in a crash or a hang (see fuzz_records.py)."""

import ast
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

# Cases per kind (the README's counts); about 90 s of CPU in all, nearly all
# of it in the TensorFlow pipelines.
FILE_CASES = 1000
PIPELINE_CASES = 250
MANIFEST_CASES = 2500
HPARAMS_CASES = 1500
CONFIG_CASES = 1000
TOTAL_CASES = FILE_CASES + PIPELINE_CASES + MANIFEST_CASES + HPARAMS_CASES + CONFIG_CASES


@pytest.mark.slow
def test_fuzzed_inputs_raise_only_documented_errors():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, os.path.join(HERE, "fuzz_records.py"), "1234",
                           str(FILE_CASES), str(PIPELINE_CASES), str(MANIFEST_CASES),
                           str(HPARAMS_CASES), str(CONFIG_CASES)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    files = ast.literal_eval(lines["files"])
    pipelines = ast.literal_eval(lines["pipelines"])
    manifests = ast.literal_eval(lines["manifests"])
    parsed = ast.literal_eval(lines["hparams"])
    configs = ast.literal_eval(lines["config_files"])
    assert sum(files[k] for k in ("ok", "broken")) == FILE_CASES
    # Both outcomes must occur, or the mutations exercised nothing.
    assert files["broken"] > 100 and files["refused"] > 100
    assert pipelines["op_error"] > 10 and pipelines["ok"] > 250
    assert sum(manifests.values()) == MANIFEST_CASES
    assert manifests["loaded"] > 50 and manifests["refused"] > 500
    assert sum(parsed.values()) == HPARAMS_CASES
    assert parsed["applied"] > 100 and parsed["refused"] > 100
    assert sum(configs.values()) == CONFIG_CASES
    assert configs["parsed"] > 100 and configs["refused"] > 100
    assert TOTAL_CASES >= 5000
