"""`python -m experiments` end to end, in subprocesses, on real data slices."""

import json
import os
import re
import time

import numpy as np
import pytest

from support import (checkpoint_name, checkpoint_steps, cli, export_model_file, kill_group,
                     latest_step, start_cli)

pytestmark = pytest.mark.slow


def test_list_shows_every_experiment():
    rc, out, _ = cli("list")
    assert rc == 0
    for name in ("fashion_mnist_cnn", "fashion_mnist_mlp", "mnist_cnn", "shapes_unet"):
        assert name in out
    # Every engine has a line; the one auto picks is available; only TF 2.15 has the Estimator.
    from estimator_keras import engines  # pylint: disable=import-outside-toplevel
    found = dict(re.findall(r"\n  (\S+) +(available|not available)", out))
    assert all(name in found for name in engines.names()), out
    assert found[engines.auto_from_metadata()] == "available", out
    estimator = re.search(r"\n  estimator +(\S+)", out).group(1)
    assert estimator == ("available" if engines.estimator_available() else "not"), out


@pytest.mark.parametrize("command", ["list", "prepare", "inspect", "train", "evaluate",
                                     "export", "cluster", "submit"])
def test_every_command_has_help(command):
    rc, out, _ = cli(command, "--help")
    assert rc == 0
    assert "usage:" in out


def test_train_end_to_end_on_real_fashion_mnist_slice(fashion_data, tmp_path):
    model_dir = tmp_path / "run"
    rc, out, err = cli("train", "fashion_mnist_cnn", "--data-dir", fashion_data,
                       "--model-dir", model_dir, "--max-steps", 150, "--eval-every", 150,
                       "--batch-size", 64)
    assert rc == 0, err[-3000:]
    accuracy = float(re.search(r"accuracy (\d\.\d+)", out).group(1))
    assert accuracy > 0.55, out  # chance is 0.10
    # model.h5, or model.keras where --engine auto is keras3.
    assert export_model_file(model_dir / "export") in out
    assert "examples/s" in err and "batch size 64 per replica" in err
    info = json.loads((model_dir / "export" / "export.json").read_text())
    assert info["global_step"] == 150 and info["experiment"] == "fashion_mnist_cnn"

    # evaluate and export work from the latest checkpoint of the model dir.
    rc, out, err = cli("evaluate", "fashion_mnist_cnn", "--data-dir", fashion_data,
                       "--model-dir", model_dir, "--json")
    assert rc == 0, err[-2000:]
    assert abs(json.loads(out)["accuracy"] - accuracy) < 1e-4
    rc, out, err = cli("export", "fashion_mnist_cnn", "--model-dir", model_dir,
                       "--export-dir", tmp_path / "again", "--data-dir", fashion_data)
    assert rc == 0, err[-2000:]
    import tensorflow as tf
    first = tf.keras.models.load_model(export_model_file(model_dir / "export"), compile=False)
    second = tf.keras.models.load_model(export_model_file(tmp_path / "again"), compile=False)
    assert len(first.get_weights()) == 8
    for a, b in zip(first.get_weights(), second.get_weights()):
        np.testing.assert_array_equal(a, b)

    # Restarting on the same model dir continues from its checkpoint.
    rc, out, err = cli("train", "fashion_mnist_cnn", "--data-dir", fashion_data,
                       "--model-dir", model_dir, "--max-steps", 200, "--eval-every", 50,
                       "--batch-size", 64)
    assert rc == 0, err[-3000:]
    assert "resuming from" in err and re.search(checkpoint_name(150), err)
    assert checkpoint_steps(model_dir)[-1] == 200
    assert json.loads((model_dir / "export" / "export.json").read_text())["global_step"] == 200


def test_shapes_unet_trains_and_exports(tmp_path):
    data_dir = tmp_path / "data"
    rc, _, err = cli("prepare", "shapes", "--data-dir", data_dir, "--max-examples", 256)
    assert rc == 0, err
    rc, out, err = cli("train", "shapes_unet", "--data-dir", data_dir,
                       "--model-dir", tmp_path / "run", "--max-steps", 12, "--eval-every", 12,
                       "--batch-size", 8)
    assert rc == 0, err[-3000:]
    assert "mean_iou" in out and "pixel_accuracy" in out
    assert os.path.exists(export_model_file(tmp_path / "run" / "export"))
    assert (tmp_path / "run" / "export" / "saved_model" / "saved_model.pb").exists()


def test_sigkilled_train_resumes_and_finishes(fashion_data, tmp_path):
    model_dir = tmp_path / "run"
    with open(tmp_path / "first.log", "w") as log:
        proc = start_cli("train", "fashion_mnist_mlp", "--data-dir", fashion_data,
                         "--model-dir", model_dir, "--max-steps", 100000,
                         "--eval-every", 40, "--batch-size", 32, log=log)
        try:
            deadline = time.monotonic() + 240
            # The `checkpoint` file names what a restart restores; an .index
            # file alone may belong to a checkpoint still being committed.
            while time.monotonic() < deadline and not latest_step(model_dir):
                assert proc.poll() is None, open(tmp_path / "first.log").read()[-2000:]
                time.sleep(0.5)
        finally:
            kill_group(proc)
    killed_at = latest_step(model_dir)
    assert killed_at > 0
    assert (model_dir / ".train.lock").exists()  # left behind by the kill

    target = killed_at + 40
    rc, out, err = cli("train", "fashion_mnist_mlp", "--data-dir", fashion_data,
                       "--model-dir", model_dir, "--max-steps", target, "--eval-every", 40,
                       "--batch-size", 32)
    assert rc == 0, err[-3000:]
    assert re.search(checkpoint_name(killed_at), err)  # resumed, not restarted
    assert "stale lock" in err
    assert checkpoint_steps(model_dir)[-1] == target
    assert not (model_dir / ".train.lock").exists()
    assert json.loads((model_dir / "export" / "export.json").read_text())["global_step"] == target


def test_missing_tensorflow_is_explained(tmp_path):
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel

    from support import ROOT, child_env  # pylint: disable=import-outside-toplevel

    # `train` needs an engine; `inspect` runs without TensorFlow
    # (tests/test_without_tensorflow.py).
    code = ("import sys; sys.modules['tensorflow'] = None\n"
            "from experiments.cli import main\n"
            f"sys.exit(main(['train', 'fashion_mnist_mlp', '--model-dir', "
            f"{str(tmp_path / 'run')!r}, '--data-dir', {str(tmp_path)!r}]))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT,
                          env=child_env(KERAS_BACKEND="tensorflow"), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode in (1, 2), proc.stderr
    assert "tensorflow is not installed" in proc.stderr.lower(), proc.stderr
    assert "pip install -e '.[cpu]'" in proc.stderr or "pip install -e '.[jax]'" in proc.stderr
    # The package is on no index: the hint installs from the checkout.
    assert "estimator-keras[" not in proc.stderr and "checkout" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_tune_without_the_tune_extra_names_it(tmp_path):
    import importlib.util  # pylint: disable=import-outside-toplevel
    if importlib.util.find_spec("optuna") is not None:
        pytest.skip("Optuna is installed (the tune extra): this case needs an environment "
                    "without it")
    space = tmp_path / "space.yaml"
    space.write_text("learning_rate: {type: double, min: 0.0001, max: 0.1, scale: log}\n")
    rc, _, err = cli("tune", "fashion_mnist_mlp", "--space", space, "--model-dir",
                     tmp_path / "study", "--data-dir", tmp_path / "data", "--max-steps", 10)
    assert rc == 2, err
    assert "tune needs Optuna" in err and "pip install -e '.[tune]'" in err, err
    # Refused before any work: no dataset prepared, no trial started.
    assert not (tmp_path / "data").exists() and not list((tmp_path / "study").glob("trial-*"))
