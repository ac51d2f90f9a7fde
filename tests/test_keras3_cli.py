"""`python -m experiments train/evaluate/export --engine keras3` end to end, on
the tensorflow and the jax backend (issue 23, items 2, 4 and 5 through the
CLI): a few steps on a real Fashion-MNIST slice, the export's three files,
a rerun that trains nothing, evaluate/export of the model dir, and a run as
a Vertex AI tuning trial."""

import json
import os
import re

import pytest

from estimator_keras.distribute.launcher import free_ports
from support import KERAS3_BACKENDS, checkpoint_steps, child_env, cli

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("backend", KERAS3_BACKENDS)
def test_keras3_train_rerun_evaluate_export(backend, fashion_data, tmp_path):
    env = child_env(KERAS_BACKEND=backend)
    model_dir = tmp_path / "run"
    train = ("train", "fashion_mnist_mlp", "--engine", "keras3", "--data-dir", fashion_data,
             "--model-dir", model_dir, "--max-steps", 40, "--eval-every", 20,
             "--batch-size", 32)
    rc, out, err = cli(*train, env=env, timeout=900)
    assert rc == 0, err[-3000:]
    assert "engine keras3" in err and "evaluated step 20:" in err, err[-3000:]
    accuracy = float(re.search(r"final metrics: accuracy (\d\.\d+)", out).group(1))
    assert accuracy > 0.3, out  # chance is 0.10
    export = model_dir / "export"
    assert str(export / "model.keras") in out
    for name in ("model.keras", "weights.h5", "saved_model/saved_model.pb"):
        assert (export / name).is_file(), name
    info = json.loads((export / "export.json").read_text())
    assert (info["global_step"], info["engine"], info["backend"]) == (40, "keras3", backend)
    assert info["checkpoint"].endswith("ckpt-40.weights.h5")
    best = json.loads((model_dir / "best" / "export.json").read_text())
    assert (best["backend"], best["best_metric"]) == (backend, "accuracy")

    # A finished run trains nothing and leaves its export as it is.
    written = (export / "export.json").stat().st_mtime_ns
    rc, out, err = cli(*train, env=env, timeout=900)
    assert rc == 0, err[-3000:]
    assert "already at step 40" in err and "left as it is" in err, err[-3000:]
    assert (export / "export.json").stat().st_mtime_ns == written
    assert f"accuracy {accuracy:.4f}" in out

    # evaluate (engine auto: a keras3 model dir stays on keras3) and export.
    rc, out, err = cli("evaluate", "fashion_mnist_mlp", "--data-dir", fashion_data,
                       "--model-dir", model_dir, "--json", env=env, timeout=900)
    assert rc == 0, err[-3000:]
    assert abs(json.loads(out)["accuracy"] - accuracy) < 1e-4
    again = tmp_path / "again"
    rc, out, err = cli("export", "fashion_mnist_mlp", "--data-dir", fashion_data,
                       "--model-dir", model_dir, "--export-dir", again, env=env, timeout=900)
    assert rc == 0, err[-3000:]
    assert (again / "model.keras").is_file() and (again / "saved_model").is_dir()
    assert json.loads((again / "export.json").read_text())["checkpoint"] == info["checkpoint"]


@pytest.mark.parametrize("backend", KERAS3_BACKENDS)
def test_keras3_as_a_vertex_tuning_trial(backend, fashion_data, tmp_path):
    """A tuning trial as Vertex AI runs one (issue 23, item 4): the AIP_*
    folders, the chief-only TF_CONFIG of a one-replica job, the trial's value
    appended to the arguments. Checkpoints, export, summaries (HParams
    included) and the hypertune report land where Vertex looks for them."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from tensorboard.plugins.hparams import metadata  # pylint: disable=import-outside-toplevel

    base = tmp_path / "tune" / "3"
    env = child_env(
        KERAS_BACKEND=backend, AIP_MODEL_DIR=f"{base}/model/",
        AIP_CHECKPOINT_DIR=f"{base}/checkpoints/", AIP_TENSORBOARD_LOG_DIR=f"{base}/logs/",
        CLOUD_ML_TRIAL_ID="3", CLOUD_ML_HP_METRIC_FILE=str(base / "hypertune" / "output.metrics"),
        TF_CONFIG=json.dumps({"cluster": {"chief": [f"127.0.0.1:{free_ports(1)[0]}"]},
                              "task": {"type": "chief", "index": 0}, "job": {}}))
    rc, out, err = cli("train", "fashion_mnist_mlp", "--engine", "keras3", "--data-dir",
                       fashion_data, "--max-steps", 20, "--eval-every", 20, "--batch-size", 32,
                       "--tuning-trial", "--hypertune-metric", "accuracy",
                       "--learning_rate=0.003", env=env, timeout=900)
    assert rc == 0, err[-3000:]
    assert checkpoint_steps(base / "checkpoints")[-1] == 20
    model = base / "model"
    # Model Registry imports AIP_MODEL_DIR: the SavedModel at its root.
    assert (model / "saved_model.pb").is_file() and (model / "variables").is_dir()
    for name in ("model.keras", "weights.h5", "export.json"):
        assert (model / name).is_file(), name
    assert not (model / "saved_model").exists()
    info = json.loads((model / "export.json").read_text())
    assert (info["engine"], info["backend"], info["global_step"]) == ("keras3", backend, 20)

    (line,) = (base / "hypertune" / "output.metrics").read_text().splitlines()
    report = json.loads(line)
    assert report["trial"] == "3" and report["global_step"] == "20"
    assert float(report["accuracy"]) == pytest.approx(info["metrics"]["accuracy"])

    events = [os.path.join(d, f) for d, _, files in os.walk(base / "logs") for f in files
              if f.startswith("events.out.tfevents")]
    found = {}
    for path in events:
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == metadata.SESSION_START_INFO_TAG:
                    found = metadata.parse_session_start_info_plugin_data(
                        value.metadata.plugin_data.content).hparams
    assert found["learning_rate"].number_value == pytest.approx(0.003), events
