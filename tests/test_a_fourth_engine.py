"""A new engine is one folder and one registry entry: the tests' own fourth
engine (``tests/fourth_engine/``, registered by these tests only) is picked
up by ``list``, ``show``, ``train --engine``, ``submit --dry-run`` and the
docs' engine table with no other change to the program."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

import fourth_engine
from estimator_keras.engines import registry
from support import ROOT, child_env

TESTS = os.path.dirname(os.path.abspath(__file__))
IMAGE = "us-docker.pkg.dev/my-project/ml/estimator-keras:fourth"
# The CLI in a child that registers the fourth engine first, as a plugin would.
_MAIN = ("import sys\nimport fourth_engine\nfourth_engine.register()\n"
         "from experiments.cli import main\nsys.exit(main(sys.argv[1:]))\n")


def _cli(*args, timeout=300):
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join((TESTS, env["PYTHONPATH"]))
    proc = subprocess.run([sys.executable, "-c", _MAIN, *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture
def registered():
    registry.register(fourth_engine.ENTRY)
    try:
        yield fourth_engine.ENTRY
    finally:
        registry.unregister(fourth_engine.NAME)


def test_registering_adds_it_and_unregistering_takes_it_away(registered):
    assert registry.names()[-1] == "fourth" and "fourth" in registry.choices()
    registry.unregister("fourth")
    assert "fourth" not in registry.names()
    with pytest.raises(ValueError, match="built-in"):
        registry.unregister("keras3")
    registry.register(registered)


def test_list_and_show_answer_from_its_entry():
    rc, out, err = _cli("list")
    assert rc == 0, err
    line = next(line for line in out.splitlines() if line.strip().startswith("fourth "))
    assert "available (the tests' fourth engine" in line, out
    rc, out, err = _cli("show", "--engine", "fourth")
    assert rc == 0, err
    assert "engine: fourth\n" in out and "cloud jobs: vertex\n" in out, out
    assert "Vertex AI image: your own (--container-image)" in out, out
    assert f"tf.keras: Keras {fourth_engine.KERAS}\n" in out, out


@pytest.mark.slow
def test_train_runs_it(fashion_data, tmp_path):
    model_dir = tmp_path / "run"
    rc, out, err = _cli("train", "fashion_mnist_mlp", "--engine", "fourth", "--data-dir",
                        fashion_data, "--model-dir", model_dir, "--max-steps", 40,
                        "--eval-every", 20, "--batch-size", 32)
    assert rc == 0, err[-3000:]
    assert "engine fourth" in err, err[-3000:]
    export = json.loads((model_dir / "export" / "export.json").read_text())
    assert export["global_step"] == 40
    # What the fourth engine trains, it refuses beyond its entry's cluster.
    rc, _, err = _cli("train", "fashion_mnist_mlp", "--engine", "fourth", "--data-dir",
                      fashion_data, "--model-dir", model_dir, "--strategy", "mirrored")
    assert rc == 2 and "the fourth engine trains in one process" in err, err[-3000:]


def test_submit_builds_its_job_from_its_entry(tmp_path):
    common = ["submit", "fashion_mnist_mlp", "--job-dir", "gs://my-bucket/run4", "--engine",
              "fourth", "--project", "my-project-123", "--region", "us-central1", "--dry-run"]
    rc, out, err = _cli(*common, "--container-image", IMAGE, "--output", tmp_path / "job.json")
    assert rc == 0, err
    request = json.loads((tmp_path / "job.json").read_text())
    (pool,) = request["jobSpec"]["workerPoolSpecs"]
    assert pool["containerSpec"]["imageUri"] == IMAGE
    args = pool["containerSpec"]["args"]
    assert args[args.index("--engine") + 1] == "fourth", args
    # No prebuilt image serves it: its entry's words say what to pass.
    rc, out, err = _cli(*common)
    assert rc == 2 and "--engine fourth on Vertex AI needs --container-image" in err, err
    assert "the tests' fourth engine installed" in err, err
    # Nor does a Kubeflow job kind it does not list.
    rc, out, err = _cli(*common[:4], "--engine", "fourth", "--target", "tfjob",
                        "--container-image", IMAGE)
    assert rc == 2 and "got --engine fourth" in err, err


def test_the_docs_engine_table_has_its_column(registered):
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed: pip install -e '.[docs]' (the py311 tox env "
                    "installs it)")
    spec = importlib.util.spec_from_file_location(
        "docs_generate", os.path.join(ROOT, "docs", "_hooks", "generate.py"))
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    table = generate.GENERATORS["engines"]()
    header = next(line for line in table.splitlines() if line.startswith("| |"))
    assert header.split("|")[2:-1] == [" `estimator` ", " `keras` ", " `keras3` ", " `fourth` "]
    assert ("| cloud jobs | vertex, trainjob, tfjob, katib | vertex, trainjob, tfjob, katib | "
            "vertex, trainjob, jaxjob, katib | vertex |") in table
    assert ("| TrainJob runtime | estimator-keras-tensorflow | estimator-keras-tensorflow | "
            "jax-distributed | none |") in table
