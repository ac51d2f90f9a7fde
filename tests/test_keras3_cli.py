"""`python -m experiments train/evaluate/export --engine keras3` end to end, on
the tensorflow and the jax backend (issue 23, items 2, 4 and 5 through the
CLI): a few steps on a real Fashion-MNIST slice, the export's three files,
a rerun that trains nothing, and evaluate/export of the model dir."""

import json
import re

import pytest

from support import KERAS3_BACKENDS, child_env, cli

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
