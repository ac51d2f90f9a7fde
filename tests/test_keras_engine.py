"""The keras engine (Model.fit) end to end, and weights moving between
engines and Keras versions.

Runs in both tox environments: on TensorFlow 2.15 (beside the Estimator,
where the cross-engine tests run too) and on TensorFlow 2.21 + tf-keras
(where the Keras 3 load test runs).
"""

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from estimator_keras import engines
from support import ROOT, checkpoint_steps, cli, fresh_python, kill_group, latest_step, start_cli

pytestmark = pytest.mark.slow

ESTIMATOR = engines.estimator_available()
needs_estimator = pytest.mark.skipif(not ESTIMATOR, reason="tf.estimator ends at TF 2.15")


def _train(data_dir, model_dir, *args, engine="keras", name="fashion_mnist_cnn", timeout=400):
    return cli("train", name, "--data-dir", data_dir, "--model-dir", model_dir,
               "--engine", engine, "--batch-size", 64, *args, timeout=timeout)


def _accuracy(text):
    return float(re.search(r"accuracy (\d\.\d+)", text).group(1))


def _test_images(data_dir, n=64):
    from estimator_keras import inputs  # pylint: disable=import-outside-toplevel
    dataset = inputs.make_dataset(os.path.join(str(data_dir), "fashion_mnist"), n,
                                  training=False, split="test")
    features, _ = next(iter(dataset))
    return features["image"].numpy()


@pytest.fixture(scope="module")
def keras_run(fashion_data, tmp_path_factory):
    """A model dir trained by the keras engine for 150 steps."""
    model_dir = tmp_path_factory.mktemp("keras-engine") / "run"
    rc, out, err = _train(fashion_data, model_dir, "--max-steps", 150, "--eval-every", 75)
    assert rc == 0, err[-3000:]
    return {"model_dir": model_dir, "out": out, "err": err, "data_dir": fashion_data}


def test_trains_evaluates_checkpoints_and_exports(keras_run):
    out, err, model_dir = keras_run["out"], keras_run["err"], keras_run["model_dir"]
    assert "engine keras" in err
    assert _accuracy(out) > 0.55, out  # chance is 0.10
    assert "evaluated step 75:" in err and "evaluated step 150:" in err
    assert "examples/s" in err
    assert checkpoint_steps(model_dir) == [0, 75, 150]  # 0: the initial weights
    info = json.loads((model_dir / "export" / "export.json").read_text())
    assert info["global_step"] == 150 and info["engine"] == "keras"
    for name in ("model.h5", "weights.h5", "saved_model/saved_model.pb"):
        assert (model_dir / "export" / name).exists(), name
    assert (model_dir / "best" / "export.json").exists()
    # Summaries for TensorBoard, and no crash-resume backup left behind.
    for sub in ("train", "validation"):
        assert any(n.startswith("events.out.tfevents") for n in os.listdir(model_dir / sub))
    assert not (model_dir / "backup").exists()

    rc, out2, err2 = cli("evaluate", "fashion_mnist_cnn", "--data-dir", keras_run["data_dir"],
                         "--model-dir", model_dir, "--engine", "keras", "--json")
    assert rc == 0, err2[-2000:]
    again = json.loads(out2)
    assert abs(again["accuracy"] - _accuracy(out)) < 1e-4 and again["global_step"] == 150


def test_export_loads_in_plain_keras_in_a_fresh_process(keras_run, tmp_path):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from estimator_keras import checkpoints  # pylint: disable=import-outside-toplevel
    from experiments.catalog import loading as catalog  # pylint: disable=import-outside-toplevel
    from experiments.catalog import registry  # pylint: disable=import-outside-toplevel

    catalog.load()
    exp = registry.get("fashion_mnist_cnn")
    model = exp.build_model(exp.config.model)
    checkpoints.load_checkpoint_into(model, tf.train.latest_checkpoint(str(keras_run["model_dir"])))
    images = _test_images(keras_run["data_dir"])
    np.save(tmp_path / "images.npy", images)
    expected = model.predict(images.astype(np.float32), verbose=0)

    export = keras_run["model_dir"] / "export"
    fresh_python(textwrap.dedent(f"""
        import numpy as np, tensorflow as tf
        x = np.load("images.npy").astype("float32")
        m = tf.keras.models.load_model({str(export / "model.h5")!r}, compile=False)
        np.save("from_h5.npy", m.predict(x, verbose=0))
        served = tf.saved_model.load({str(export / "saved_model")!r})
        out = served.signatures["serving_default"](image=tf.constant(x))
        np.save("from_saved_model.npy", out["probabilities"].numpy())
    """), cwd=tmp_path)
    np.testing.assert_allclose(np.load(tmp_path / "from_h5.npy"), expected, atol=1e-6)
    np.testing.assert_allclose(np.load(tmp_path / "from_saved_model.npy"), expected, atol=1e-5)


def test_a_finished_run_continues_when_max_steps_grows(keras_run, tmp_path):
    import shutil  # pylint: disable=import-outside-toplevel
    model_dir = tmp_path / "run"
    shutil.copytree(keras_run["model_dir"], model_dir)
    rc, out, err = _train(keras_run["data_dir"], model_dir, "--max-steps", 200,
                          "--eval-every", 50)
    assert rc == 0, err[-3000:]
    assert "resuming from" in err and "model.ckpt-150" in err
    assert checkpoint_steps(model_dir)[-1] == 200
    assert json.loads((model_dir / "export" / "export.json").read_text())["global_step"] == 200


def _progress_steps(text):
    return [int(s) for s in re.findall(r"^step (\d+)/\d+", text, re.M)]


def test_calls_run_several_steps_and_still_end_on_every_evaluation_and_max_steps(
        fashion_data, tmp_path):
    """A progress line at every step shows where each call of Keras' training
    function ends: 8 steps a call, the epoch's last call shortened by Keras
    (20 = 8 + 8 + 4), the last one by the engine to stop on max_steps."""
    model_dir = tmp_path / "run"
    common = ("--eval-every", 20, "--batch-size", 32, "--hparams", "log_every_steps=1")
    rc, _, err = _train(fashion_data, model_dir, "--max-steps", 45, *common,
                        name="fashion_mnist_mlp")
    assert rc == 0, err[-3000:]
    # The first call (step 8, with the tracing) starts the rates: no line.
    assert _progress_steps(err) == [16, 20, 28, 36, 40, 45], err[-3000:]
    assert [int(s) for s in re.findall(r"evaluated step (\d+)", err)] == [20, 40, 45]
    assert checkpoint_steps(model_dir) == [0, 20, 40, 45]
    assert json.loads((model_dir / "export" / "export.json").read_text())["global_step"] == 45

    # Resumed off a multiple: Keras' epochs of 20 steps count from the resume.
    rc, _, err = _train(fashion_data, model_dir, "--max-steps", 70, *common,
                        name="fashion_mnist_mlp")
    assert rc == 0, err[-3000:]
    assert _progress_steps(err) == [61, 65, 70], err[-3000:]
    assert checkpoint_steps(model_dir)[-2:] == [65, 70]
    # A whole-split evaluation (data of unknown length) through the CLI too.
    rc, out, err = cli("evaluate", "fashion_mnist_mlp", "--data-dir", fashion_data,
                       "--model-dir", model_dir, "--engine", "keras", "--json")
    assert rc == 0, err[-2000:]
    assert json.loads(out)["global_step"] == 70


def test_sigkilled_run_is_restored_by_backup_and_restore(fashion_data, tmp_path):
    model_dir = tmp_path / "run"
    with open(tmp_path / "first.log", "w") as log:
        proc = start_cli("train", "fashion_mnist_mlp", "--data-dir", fashion_data,
                         "--model-dir", model_dir, "--max-steps", 100000, "--engine", "keras",
                         "--eval-every", 40, "--batch-size", 32, log=log)
        try:
            deadline = time.monotonic() + 240
            backup = model_dir / "backup"
            # Both the model dir's checkpoint and the backup's must be committed.
            while time.monotonic() < deadline and not (
                    latest_step(model_dir) and any(
                        n == "checkpoint" for _, _, files in os.walk(backup) for n in files)):
                assert proc.poll() is None, open(tmp_path / "first.log").read()[-2000:]
                time.sleep(0.2)
        finally:
            kill_group(proc)
    killed_at = latest_step(model_dir)
    assert killed_at and killed_at % 40 == 0
    assert (model_dir / ".train.lock").exists()  # left behind by the kill

    target = killed_at + 40
    rc, _, err = cli("train", "fashion_mnist_mlp", "--data-dir", fashion_data,
                     "--model-dir", model_dir, "--max-steps", target, "--eval-every", 40,
                     "--batch-size", 32, "--engine", "keras")
    assert rc == 0, err[-3000:]
    assert "restoring the interrupted run" in err and "stale lock" in err
    evaluated = [int(s) for s in re.findall(r"evaluated step (\d+)", err)]
    assert evaluated and min(evaluated) > killed_at - 40, err[-2000:]  # not from step 0
    assert checkpoint_steps(model_dir)[-1] == target
    assert json.loads((model_dir / "export" / "export.json").read_text())["global_step"] == target
    assert not (model_dir / "backup").exists()


def test_chief_and_worker_cluster_on_localhost(fashion_data, tmp_path):
    model_dir = tmp_path / "cluster"
    rc, out, err = cli("cluster", "fashion_mnist_cnn", "--workers", "1", "--model-dir", model_dir,
                       "--log-dir", tmp_path / "logs", "--timeout", 300, "--quiet",
                       "--data-dir", fashion_data, "--engine", "keras", "--max-steps", 60,
                       "--eval-every", 30, "--batch-size", 64, timeout=360)
    assert rc == 0, (out + err)[-3000:]
    chief = (tmp_path / "logs" / "chief-0.log").read_text()
    worker = (tmp_path / "logs" / "worker-0.log").read_text()
    assert "strategy multi_worker_mirrored" in chief and "2 replica(s)" in chief
    assert "exported:" in chief and "exported:" not in worker
    assert checkpoint_steps(model_dir) == [0, 30, 60]
    assert not [n for n in os.listdir(model_dir) if n.startswith("tmp_worker")]
    # Each worker evaluated its share of the eval split: together, all of it
    # once, as a single process evaluating the same checkpoint finds.
    reported = _accuracy(re.findall(r"final metrics: .*", chief)[-1])
    rc, single, err = cli("evaluate", "fashion_mnist_cnn", "--data-dir", fashion_data,
                          "--model-dir", model_dir, "--engine", "keras", "--json")
    assert rc == 0, err[-2000:]
    assert abs(json.loads(single)["accuracy"] - reported) < 1e-4


@pytest.mark.parametrize("flags", [["--ps", "1"], ["--evaluator"]])
def test_cluster_refuses_what_the_keras_engine_cannot_run(flags, tmp_path):
    rc, _, err = cli("cluster", "fashion_mnist_cnn", "--workers", "1", *flags,
                     "--model-dir", tmp_path / "m", "--engine", "keras", timeout=60)
    assert rc == 2
    assert flags[0] in err and "--engine estimator" in err


@needs_estimator
def test_estimator_model_dir_moves_to_the_keras_engine(fashion_data, tmp_path):
    model_dir = tmp_path / "run"
    rc, out, err = _train(fashion_data, model_dir, "--max-steps", 60, "--eval-every", 60,
                          engine="estimator")
    assert rc == 0, err[-3000:]
    estimator_accuracy = _accuracy(out)
    # The keras engine reads the Estimator's checkpoint exactly...
    rc, out, err = cli("evaluate", "fashion_mnist_cnn", "--data-dir", fashion_data,
                       "--model-dir", model_dir, "--engine", "keras", "--json")
    assert rc == 0, err[-2000:]
    assert abs(json.loads(out)["accuracy"] - estimator_accuracy) < 1e-4
    assert json.loads(out)["global_step"] == 60
    # ...and continues training from its step.
    rc, out, err = _train(fashion_data, model_dir, "--max-steps", 90, "--eval-every", 30)
    assert rc == 0, err[-3000:]
    assert "resuming from" in err and "(step 60)" in err
    assert checkpoint_steps(model_dir)[-1] == 90
    # The Estimator cannot restore the keras engine's checkpoints: a clear
    # refusal, while "auto" keeps the model dir on the keras engine.
    rc, _, err = cli("evaluate", "fashion_mnist_cnn", "--data-dir", fashion_data,
                     "--model-dir", model_dir, "--engine", "estimator")
    assert rc == 1 and "trained by the keras engine" in err and "weights.h5" in err
    rc, out, err = cli("evaluate", "fashion_mnist_cnn", "--data-dir", fashion_data,
                       "--model-dir", model_dir, "--json")
    assert rc == 0 and json.loads(out)["global_step"] == 90, err[-2000:]


@needs_estimator
def test_weights_h5_move_between_the_engines_models(fashion_data, keras_run, tmp_path):
    """weights.h5 of either engine, loaded into the model the other engine
    compiles, predicts exactly what its own model.h5 predicts."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from estimator_keras.engines.estimator.engine import compile_for_estimator  # pylint: disable=import-outside-toplevel
    from estimator_keras.engines.keras.engine import compile_for_keras  # pylint: disable=import-outside-toplevel
    from experiments.catalog import loading as catalog  # pylint: disable=import-outside-toplevel
    from experiments.catalog import registry  # pylint: disable=import-outside-toplevel
    from experiments.training.context import experiment_plan  # pylint: disable=import-outside-toplevel

    estimator_dir = tmp_path / "estimator"
    rc, _, err = _train(fashion_data, estimator_dir, "--max-steps", 30, "--eval-every", 30,
                        engine="estimator")
    assert rc == 0, err[-3000:]
    catalog.load()
    exp = registry.get("fashion_mnist_cnn")
    images = _test_images(fashion_data).astype(np.float32)
    pairs = ((estimator_dir / "export", compile_for_keras),
             (keras_run["model_dir"] / "export", compile_for_estimator))
    for export, other_engines_model in pairs:
        reference = tf.keras.models.load_model(str(export / "model.h5"), compile=False)
        # In float32, as exports are: precision="auto" may train in bfloat16.
        model = other_engines_model(experiment_plan(exp, exp.config, policy="float32"))
        model.load_weights(str(export / "weights.h5"))
        np.testing.assert_array_equal(model.predict(images, verbose=0),
                                      reference.predict(images, verbose=0))


def _keras3_available():
    probe = subprocess.run(
        [sys.executable, "-c", "import keras, sys; sys.exit(int(keras.__version__[0]) < 3)"],
        capture_output=True, timeout=120, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    return probe.returncode == 0


def test_keras3_loads_the_exports(keras_run, tmp_path):
    if importlib.util.find_spec("keras") is None or not _keras3_available():
        pytest.skip("Keras 3 is not installed (it comes with TensorFlow 2.16+)")
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    images = _test_images(keras_run["data_dir"]).astype(np.float32)
    np.save(tmp_path / "images.npy", images)
    export = keras_run["model_dir"] / "export"
    expected = tf.keras.models.load_model(str(export / "model.h5"), compile=False).predict(
        images, verbose=0)
    # Keras 3 as tf.keras: this package must not be imported before keras,
    # or it would ask for Keras 2.
    code = textwrap.dedent(f"""
        import os, sys
        os.environ["TF_USE_LEGACY_KERAS"] = "0"
        import keras, numpy as np
        assert int(keras.__version__[0]) >= 3, keras.__version__
        sys.path.insert(0, {ROOT!r})
        from experiments import catalog, registry
        catalog.load()
        exp = registry.get("fashion_mnist_cnn")
        model = exp.build_model(exp.config.model)
        assert type(model).__module__.startswith("keras.src"), type(model)
        model.load_weights({str(export / "weights.h5")!r})
        x = np.load("images.npy")
        np.save("weights.npy", model.predict(x, verbose=0))
        whole = keras.models.load_model({str(export / "model.h5")!r}, compile=False)
        np.save("model.npy", whole.predict(x, verbose=0))
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=180,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    np.testing.assert_allclose(np.load(tmp_path / "weights.npy"), expected, atol=1e-6)
    np.testing.assert_allclose(np.load(tmp_path / "model.npy"), expected, atol=1e-6)


def test_engine_choice_errors_name_the_fix(tmp_path):
    from estimator_keras.errors import ConfigError  # pylint: disable=import-outside-toplevel

    with pytest.raises(ConfigError, match="unknown engine 'nope'"):
        engines.resolve_engine("nope")
    if ESTIMATOR:
        assert engines.resolve_engine("auto") == "estimator"
    else:
        assert engines.resolve_engine("auto") == "keras"
        with pytest.raises(ConfigError, match="--engine keras"):
            engines.resolve_engine("estimator")
    if not _keras3_available():
        return
    # Keras 3 as tf.keras: the CLI refuses with what to install, exit 2.
    env = dict(os.environ, TF_USE_LEGACY_KERAS="0", PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    rc, _, err = cli("train", "fashion_mnist_cnn", "--model-dir", tmp_path / "m", "--data-dir",
                     tmp_path / "d", "--engine", "keras", env=env, timeout=120)
    assert rc == 2, err[-2000:]
    assert "needs Keras 2" in err and "tf-keras" in err and "TF_USE_LEGACY_KERAS=1" in err


def test_wrapped_callbacks_get_every_hook_but_the_batch_ones():
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from estimator_keras.engines.keras import engine as keras_engine  # pylint: disable=import-outside-toplevel

    class Recorder(tf.keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.calls = []

        def on_train_begin(self, logs=None):
            self.calls.append("train_begin")

        def on_epoch_begin(self, epoch, logs=None):
            self.calls.append(f"epoch_begin {epoch}")

        def on_train_batch_begin(self, batch, logs=None):
            self.calls.append("batch_begin")

        def on_train_batch_end(self, batch, logs=None):
            self.calls.append("batch_end")

        def on_test_begin(self, logs=None):
            self.calls.append("test_begin")

        def on_test_end(self, logs=None):
            self.calls.append("test_end")

        def on_epoch_end(self, epoch, logs=None):
            self.calls.append(f"epoch_end {epoch} {'val_loss' in logs}")

        def on_train_end(self, logs=None):
            self.calls.append("train_end")

    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    x, y = np.zeros((12, 4), "float32"), np.zeros((12, 2), "float32")
    inner, direct = Recorder(), Recorder()
    model.fit(x, y, batch_size=4, epochs=2, validation_data=(x, y), verbose=0,
              callbacks=[keras_engine.WithoutBatchHooks(inner), direct])

    assert inner.model is model
    assert direct.calls.count("batch_end") == 6  # the batch hooks did run
    assert inner.calls == ["train_begin",
                           "epoch_begin 0", "test_begin", "test_end", "epoch_end 0 True",
                           "epoch_begin 1", "test_begin", "test_end", "epoch_end 1 True",
                           "train_end"]
