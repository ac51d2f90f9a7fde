"""Keras 3 on JAX without TensorFlow: ``train`` (the built-in MLP, a run
stopped by SIGTERM and resumed exactly, ``--engine auto``), ``evaluate``,
``export`` and a ``cluster`` of JAX processes run with TensorFlow absent,
read the shards through the Grain pipeline, import nothing of TensorFlow,
and say in one line each what they leave out (the SavedModel, TensorBoard
summaries); what needs TensorFlow is refused in one paragraph.

Meant for an environment without TensorFlow (``pip install -e '.[jax]'``).
Each process checks its own modules at exit through a ``--module`` file
(tasks of a cluster import it too), so a lazy import that fires late is
caught as well as one at the top."""

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from support import ROOT, child_env, signal_at_step

if importlib.util.find_spec("tensorflow") is not None:
    pytest.skip("TensorFlow is installed: these tests check training in an environment without "
                "it (pip install -e '.[jax]' alone)", allow_module_level=True)
if importlib.util.find_spec("jax") is None or importlib.util.find_spec("grain") is None:
    pytest.skip("JAX or Grain is not installed (pip install -e '.[jax]')",
                allow_module_level=True)

# Written at exit by every CLI process that imports it (--module).
CHECK = ("import atexit, sys\n"
         "atexit.register(lambda: sys.stderr.write('tensorflow-modules: %r\\n' % sorted(\n"
         "    m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'tf_keras',\n"
         "                                                 'tensorboard'))))\n")
NONE_LOADED = "tensorflow-modules: []"
PREEMPTED = 75


@pytest.fixture(scope="module")
def check_module(tmp_path_factory):
    path = tmp_path_factory.mktemp("check") / "tensorflow_check.py"
    path.write_text(CHECK)
    return str(path)


def _env():
    return child_env(KERAS_BACKEND="jax")


def _cli(check_module, *args, timeout=600):
    proc = subprocess.run([sys.executable, "-m", "experiments", "--module", check_module,
                           *map(str, args)], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def _keras3_weights(path):
    """{name: array} of a keras3 checkpoint's model weights (its optimizer's left out)."""
    import h5py  # pylint: disable=import-outside-toplevel  (Keras 3 brings it)
    found = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: found.__setitem__(name, obj[()]) if isinstance(
            obj, h5py.Dataset) and not name.startswith("optimizer") else None)
    return found


def _newest_weights(model_dir):
    steps = sorted(int(m.group(1)) for m in (re.match(r"ckpt-(\d+)\.weights\.h5$", n)
                                             for n in os.listdir(model_dir)) if m)
    assert steps, os.listdir(model_dir)
    return _keras3_weights(os.path.join(model_dir, f"ckpt-{steps[-1]}.weights.h5"))


def test_the_training_modules_import_no_tensorflow():
    code = ("import importlib, sys\n"
            "for name in ('experiments.training.run', 'experiments.commands.train',\n"
            "             'estimator_keras.engines.keras3.engine',\n"
            "             'estimator_keras.engines.keras3.export',\n"
            "             'estimator_keras.grain_inputs'):\n"
            "    importlib.import_module(name)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'tensorflow'))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]", proc.stdout


def test_list_offers_keras3_alone(check_module):
    rc, out, err = _cli(check_module, "list")
    assert rc == 0, err
    assert re.search(r"^  keras3 +available \(Keras 3", out, re.M), out
    assert re.search(r"^  keras +not available: TensorFlow is not installed", out, re.M), out


def test_without_grain_keras3_says_what_to_install():
    code = ("import sys; sys.modules['grain'] = None\n"
            "from estimator_keras import engines\n"
            "print(dict((n, t) for n, _, t in engines.statuses())['keras3'])\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("not available: TensorFlow is not installed"), proc.stdout
    assert "needs grain installed too" in proc.stdout, proc.stdout
    assert "pip install -e '.[jax]'" in proc.stdout and "KERAS_BACKEND=jax" in proc.stdout


def test_what_needs_tensorflow_is_refused_in_one_paragraph(check_module, tmp_path):
    rc, _, err = _cli(check_module, "train", "fashion_mnist_mlp", "--engine", "keras",
                      "--model-dir", tmp_path / "keras")
    assert rc == 2, err
    assert "the keras engine trains Keras 2 models with TensorFlow" in err, err
    assert "--engine keras3" in err and "Traceback" not in err, err
    # A model dir that another engine left: its TF checkpoint needs TensorFlow to be read.
    model_dir = tmp_path / "estimator"
    model_dir.mkdir()
    (model_dir / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-5"\n')
    (model_dir / "model.ckpt-5.index").write_bytes(b"")
    rc, _, err = _cli(check_module, "train", "fashion_mnist_mlp", "--model-dir", model_dir)
    assert rc == 2, err
    assert "holds a TensorFlow checkpoint (model.ckpt-5)" in err, err
    assert "Traceback" not in err, err


@pytest.mark.slow
def test_train_evaluate_export_without_tensorflow(check_module, fashion_data, tmp_path):
    model_dir = tmp_path / "mlp"
    rc, out, err = _cli(check_module, "train", "fashion_mnist_mlp", "--engine", "auto",
                        "--data-dir", fashion_data, "--model-dir", model_dir,
                        "--max-steps", 60, "--eval-every", 30)
    assert rc == 0, err[-3000:]
    header = next(line for line in err.splitlines() if line.startswith("experiment "))
    assert "engine keras3 (jax, cpu); input grain" in header, header
    assert "no SavedModel in the export: TensorFlow is not installed" in err, err[-3000:]
    assert "no TensorBoard summaries: TensorFlow is not installed" in err, err[-3000:]
    assert err.count("no SavedModel") == 1, err[-3000:]  # best/ and the final export: said once
    assert NONE_LOADED in err, err[-3000:]
    assert "saved_model" not in out, out
    export_dir = model_dir / "export"
    assert sorted(os.listdir(export_dir)) == ["export.json", "model.h5", "model.keras",
                                              "weights.h5"]
    info = json.loads((export_dir / "export.json").read_text())
    assert info["global_step"] == 60 and info["backend"] == "jax", info
    assert "TensorFlow is not installed" in info["skipped"]["saved_model"], info
    # Keras 3 alone loads the export in a fresh process, on JAX, and predicts.
    code = ("import sys, numpy as np, keras\n"
            "for name in ('model.keras', 'model.h5'):\n"
            "    model = keras.saving.load_model(sys.argv[1] + '/' + name, compile=False)\n"
            "    p = model.predict(np.zeros((3, 28, 28, 1), np.float32), verbose=0)\n"
            "    print(name, p.shape, round(float(p.sum()), 3))\n")
    proc = subprocess.run([sys.executable, "-c", code, str(export_dir)], env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[:2] == ["model.keras (3, 10) 3.0", "model.h5 (3, 10) 3.0"], \
        proc.stdout
    rc, out, err = _cli(check_module, "evaluate", "fashion_mnist_mlp", "--data-dir",
                        fashion_data, "--model-dir", model_dir, "--json")
    assert rc == 0, err[-3000:]
    assert json.loads(out)["global_step"] == 60, out
    assert NONE_LOADED in err, err[-3000:]
    rc, out, err = _cli(check_module, "export", "fashion_mnist_mlp", "--data-dir", fashion_data,
                        "--model-dir", model_dir, "--force")
    assert rc == 0, err[-3000:]
    assert "no SavedModel in the export" in err and NONE_LOADED in err, err[-3000:]
    assert f"exported: {export_dir / 'model.keras'}" in out, out


@pytest.mark.slow
def test_a_run_stopped_by_sigterm_resumes_exactly(check_module, fashion_data, tmp_path):
    flags = ("train", "fashion_mnist_mlp", "--data-dir", fashion_data, "--max-steps", 90,
             "--eval-every", 30, "--batch-size", 32, "--deterministic", "--hparams",
             "log_every_steps=5")
    whole = tmp_path / "whole"
    rc, _, err = _cli(check_module, *flags, "--model-dir", whole)
    assert rc == 0, err[-3000:]
    stopped = tmp_path / "stopped"
    status, logged = signal_at_step(("--module", check_module, *flags, "--model-dir", stopped),
                                    40, signal.SIGTERM, tmp_path / "stopped.log", env=_env())
    assert status == PREEMPTED, (tmp_path / "stopped.log").read_text()[-3000:]
    rc, _, err = _cli(check_module, *flags, "--model-dir", stopped)
    assert rc == 0, err[-3000:]
    assert "the input continues at epoch" in err, err[-3000:]
    assert NONE_LOADED in err, err[-3000:]
    ours, theirs = _newest_weights(stopped), _newest_weights(whole)
    assert ours.keys() == theirs.keys() and ours, (sorted(ours), sorted(theirs))
    for key, value in theirs.items():
        np.testing.assert_array_equal(ours[key], value, err_msg=f"SIGTERM at {logged}: {key}")


@pytest.mark.slow
def test_a_cluster_of_jax_processes_trains_without_tensorflow(check_module, fashion_data,
                                                               tmp_path):
    logs = tmp_path / "logs"
    rc, out, err = _cli(check_module, "cluster", "fashion_mnist_mlp", "--workers", 1,
                        "--data-dir", fashion_data, "--model-dir", tmp_path / "model",
                        "--log-dir", logs, "--max-steps", 20, "--eval-every", 10, "--quiet",
                        "--timeout", 300)
    assert rc == 0, out[-3000:] + err[-3000:]
    assert NONE_LOADED in err, err[-3000:]
    for task in ("chief-0", "worker-0"):
        log = (logs / f"{task}.log").read_text()
        assert "(2 JAX processes" in log and "input grain" in log, log[-3000:]
        assert NONE_LOADED in log, log[-3000:]
    assert (tmp_path / "model" / "export" / "model.keras").exists()
