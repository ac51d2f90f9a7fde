"""`python -m experiments train/evaluate/export --engine keras3` end to end, on
the tensorflow and the jax backend (issue 23, items 2, 4 and 5 through the
CLI): a few steps on a real Fashion-MNIST slice, the export's three files,
a rerun that trains nothing, evaluate/export of the model dir, and a run as
a Vertex AI tuning trial."""

import json
import re

import pytest

from support import (KERAS3_BACKENDS, assert_vertex_layout, child_env, cli, session_hparams,
                     vertex_env)

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
    base = tmp_path / "tune" / "3"
    rc, out, err = cli("train", "fashion_mnist_mlp", "--engine", "keras3", "--data-dir",
                       fashion_data, "--max-steps", 20, "--eval-every", 20, "--batch-size", 32,
                       "--tuning-trial", "--hypertune-metric", "accuracy",
                       "--learning_rate=0.003", env=vertex_env(base, 3, KERAS_BACKEND=backend),
                       timeout=900)
    assert rc == 0, err[-3000:]
    info, events = assert_vertex_layout(base, "model.keras")
    assert (info["engine"], info["backend"], info["global_step"]) == ("keras3", backend, 20)

    (line,) = (base / "hypertune" / "output.metrics").read_text().splitlines()
    report = json.loads(line)
    assert report["trial"] == "3" and report["global_step"] == "20"
    assert float(report["accuracy"]) == pytest.approx(info["metrics"]["accuracy"])
    assert session_hparams(events)["learning_rate"].number_value == pytest.approx(0.003)
