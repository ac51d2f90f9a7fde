"""A new engine is one folder and one registry entry: the tests' own fourth
engine (``tests/fourth_engine/``, registered by these tests only; a loop and
checkpoints of its own, no built-in engine's code) is picked up by ``list``,
``show``, ``train --engine``, ``submit --dry-run``, the docs' engine table,
``--engine auto``'s order, the Keras backend check and the attribution of
model dirs, with no other change to the program."""

import ast
import dataclasses
import glob
import importlib.util
import json
import os
import subprocess
import sys

import pytest

import fourth_engine
from estimator_keras import engines
from estimator_keras.engines import keras_setup, registry
from estimator_keras.errors import ConfigError
from support import ROOT, child_env

TESTS = os.path.dirname(os.path.abspath(__file__))
IMAGE = "us-docker.pkg.dev/my-project/ml/estimator-keras:fourth"
# The CLI in a child that registers the fourth engine first, as a plugin would.
_MAIN = ("import sys\nimport fourth_engine\nfourth_engine.register()\n"
         "from experiments.cli import main\nsys.exit(main(sys.argv[1:]))\n")


def _python(code, *args, timeout=300):
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join((TESTS, env["PYTHONPATH"]))
    proc = subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def _cli(*args, timeout=300):
    return _python(_MAIN, *args, timeout=timeout)


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


def test_it_is_an_engine_of_its_own_not_a_built_in_one_renamed():
    built_in = tuple(module + "." for module in registry.BUILT_IN) + registry.BUILT_IN
    for path in glob.glob(os.path.join(TESTS, "fourth_engine", "*.py")):
        tree = ast.parse(open(path, encoding="utf-8").read(), path)
        for node in ast.walk(tree):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom) else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            assert not [n for n in names if n.startswith(built_in)], (path, names)
            if isinstance(node, ast.ClassDef) and node.name == "FourthEngine":
                assert [ast.unparse(b) for b in node.bases] == ["base.Engine"], path


def test_auto_order_and_backends_are_its_entry_fields(registered):
    rule = "estimator where available, else keras where tf-keras is, else keras3"
    assert registry.auto_rule() == rule  # auto=0: auto leaves it to the model dirs it wrote
    first = dataclasses.replace(registered, auto=0.5, auto_when="where registered")
    registry.register(first)
    assert registry.auto_rule() == "fourth where registered, else " + rule
    # Where tf.keras will be the Keras it trains (Keras 3 unless TF_USE_LEGACY_KERAS asks).
    assert engines.auto_from_metadata({"TF_USE_LEGACY_KERAS": "0"}) == "fourth"
    assert engines.AUTO_RULE.startswith("fourth where registered, else estimator")
    registry.register(registered)
    assert engines.auto_from_metadata({"TF_USE_LEGACY_KERAS": "0"}) != "fourth"
    if fourth_engine.KERAS == 2:
        assert registered.backends == ()
        return
    # On Keras 3 its loop computes on TensorFlow only: its entry refuses JAX, with its reason.
    assert registered.backends == ("tensorflow",)
    with pytest.raises(ConfigError, match=r"KERAS_BACKEND=jax names Keras 3's jax backend, "
                                          r"which the fourth engine cannot train on: its "
                                          r"training loop is tf.GradientTape"):
        keras_setup.check_backend({"KERAS_BACKEND": "jax"}, "fourth")
    with pytest.raises(ConfigError, match="expected one of tensorflow "):
        keras_setup.check_backend({"KERAS_BACKEND": "torch"}, "fourth")


_ENGINE_OF = ("import sys\nimport fourth_engine\nfourth_engine.register()\n"
              "from estimator_keras.engines import model_dirs\n"
              "print(model_dirs.engine_of(sys.argv[1]))\n")


@pytest.mark.slow
def test_train_runs_it_and_its_model_dir_is_its_own(fashion_data, tmp_path):
    model_dir = tmp_path / "run"
    common = ["fashion_mnist_mlp", "--data-dir", fashion_data, "--model-dir", model_dir,
              "--batch-size", 32]
    rc, out, err = _cli("train", *common, "--engine", "fourth", "--max-steps", 40,
                        "--eval-every", 20)
    assert rc == 0, err[-3000:]
    assert "engine fourth" in err, err[-3000:]
    export = json.loads((model_dir / "export" / "export.json").read_text())
    assert export["global_step"] == 40 and export["engine"] == "fourth", export
    assert (model_dir / "export" / export["model"]).is_file()
    assert sorted(p.name for p in model_dir.glob("fourth.ckpt-*.index")) == [
        "fourth.ckpt-20.index", "fourth.ckpt-40.index"]
    # Its checkpoints are its own: the registry's detector attributes them to it.
    rc, out, err = _python(_ENGINE_OF, model_dir, timeout=120)
    assert rc == 0 and out.split() == ["fourth"], err[-3000:]
    # The engine auto picks here refuses the model dir, naming the fourth.
    before = sorted(p.name for p in model_dir.iterdir())
    other = engines.auto_from_metadata(child_env())
    rc, _, err = _cli("train", *common, "--engine", other, "--max-steps", 60)
    assert rc == 2 and "was trained by the fourth engine" in err, err[-3000:]
    assert f"which the {other} engine does not continue" in err, err[-3000:]
    assert sorted(p.name for p in model_dir.iterdir()) == before
    # --engine auto continues it with the fourth engine.
    rc, _, err = _cli("train", *common, "--max-steps", 50, "--eval-every", 10)
    assert rc == 0 and "engine fourth" in err, err[-3000:]
    assert "resuming from" in err and "fourth.ckpt-40 at step 40" in err, err[-3000:]
    assert json.loads((model_dir / "export" / "export.json").read_text())["global_step"] == 50
    # What the fourth engine trains, it refuses beyond its entry's cluster.
    rc, _, err = _cli("train", *common, "--engine", "fourth", "--strategy", "mirrored")
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
