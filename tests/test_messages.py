"""Messages point the right way: the backends this package trains on, how to
install it (from its checkout: it is on no package index), what runs
parameter servers, the name a typo was meant to be, and the backend and
devices a run computes on. Nothing here trains."""

import glob
import os
import re

import pytest
import tensorflow as tf

from estimator_keras import engines
from estimator_keras.distribute.tf_config import parse_tf_config
from estimator_keras.engines import keras_setup, registry
from estimator_keras.engines.keras3 import advice
from estimator_keras.errors import ConfigError
from experiments import ExperimentConfig
from experiments.training import context
from support import ROOT, cli, child_env, keras3_installed

needs_keras3 = pytest.mark.skipif(not keras3_installed(),
                                  reason="Keras 3 is not installed (TensorFlow <= 2.15)")


def _one_error(rc, err, code=2):
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == code, err[-3000:]
    assert lines and lines[-1].startswith("error: "), err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    return lines[-1]


# ------------------------------------------------------------------ KERAS_BACKEND=torch

def test_torch_backend_is_refused_naming_the_supported_ones(tmp_path):
    with pytest.raises(ConfigError) as refused:
        keras_setup.check_backend({"KERAS_BACKEND": "torch"})
    message = str(refused.value)
    assert "KERAS_BACKEND=torch" in message and "does not support" in message, message
    assert "jax or tensorflow" in message and "pip install torch" not in message, message
    # From keras.json too.
    (tmp_path / "keras.json").write_text('{"backend": "torch"}')
    with pytest.raises(ConfigError, match=r"keras.json.*does not support"):
        keras_setup.check_backend({"KERAS_HOME": str(tmp_path)})


def test_no_message_suggests_an_unsupported_backend():
    assert sorted(registry.get("keras3").backends) == ["jax", "tensorflow"]
    with pytest.raises(ConfigError) as refused:
        keras_setup.check_backend({"KERAS_BACKEND": "jaxx"})
    assert "torch" not in str(refused.value)
    for path in glob.glob(os.path.join(ROOT, "estimator_keras", "**", "*.py"), recursive=True):
        text = open(path, encoding="utf-8").read()
        assert "KERAS_BACKEND=torch" not in text and "(tensorflow, jax, torch)" not in text, path


@needs_keras3
def test_cli_refuses_torch_before_any_work(tmp_path):
    rc, _, err = cli("train", "fashion_mnist_mlp", "--engine", "keras3", "--model-dir",
                     tmp_path / "run", "--data-dir", tmp_path / "data", timeout=120,
                     env=child_env(KERAS_BACKEND="torch"))
    line = _one_error(rc, err)
    assert "KERAS_BACKEND=torch" in line and "jax or tensorflow" in line, line
    assert not (tmp_path / "run").exists() and not (tmp_path / "data").exists()


# ------------------------------------------------------------------ installing

def test_install_hints_name_the_checkout_not_an_index():
    for backend, how in ((b.name, b.install) for b in registry.get("keras3").keras_backends):
        assert "pip install -e '." in how and "checkout" in how, (backend, how)
    # No message of the package or its CLI names a distribution no index has.
    sources = glob.glob(os.path.join(ROOT, "estimator_keras", "**", "*.py"), recursive=True)
    sources += glob.glob(os.path.join(ROOT, "experiments", "*.py"))
    for path in sources:
        text = open(path, encoding="utf-8").read()
        assert not re.search(r"pip install ['\"]?estimator-keras\[", text), path


def test_engines_without_parameter_servers_name_the_one_with_them():
    for engine in ("keras", "keras3"):
        with pytest.raises(ConfigError) as refused:
            engines.check_cluster(engine, strategy="parameter_server",
                                  environ={"KERAS_BACKEND": "jax"})
        message = str(refused.value)
        assert "--strategy parameter_server" in message, message
        assert "--engine estimator" in message, message


def test_cli_parameter_server_refusal_comes_before_asking_for_ps_tasks(tmp_path):
    # The engine that runs here without parameter servers.
    engine = "keras3" if keras3_installed() else "keras"
    rc, _, err = cli("train", "fashion_mnist_mlp", "--engine", engine, "--strategy",
                     "parameter_server", "--model-dir", tmp_path / "run", "--data-dir",
                     tmp_path / "data", timeout=180)
    line = _one_error(rc, err)
    assert f"the {engine} engine" in line and "--engine estimator" in line, line
    assert "'ps'" not in line and "TF_CONFIG" not in line, line
    assert not (tmp_path / "run").exists() and not (tmp_path / "data").exists()


@pytest.mark.parametrize("engine", ["keras", "keras3"])
def test_submit_parameter_server_refusal_names_the_engine_not_the_ps_flag(engine, tmp_path):
    # Nothing is packaged or sent: the refusal comes first.
    rc, _, err = cli("submit", "fashion_mnist_mlp", "--job-dir", "gs://bucket/job",
                     "--project", "p", "--region", "us-central1", "--engine", engine,
                     "--strategy", "parameter_server", timeout=180)
    line = _one_error(rc, err)
    assert f"the {engine} engine" in line and "--strategy parameter_server" in line, line
    assert "--engine estimator" in line and "add --ps" not in line, line


# ------------------------------------------------------------------ did you mean

def test_cli_unknown_experiment_names_the_close_one(tmp_path):
    rc, _, err = cli("train", "fashion_mnist_cn", "--model-dir", tmp_path / "run",
                     "--data-dir", tmp_path / "data", timeout=180)
    line = _one_error(rc, err)
    assert "unknown experiment 'fashion_mnist_cn' (did you mean fashion_mnist_cnn?)" in line, line
    rc, _, err = cli("show", "mnist_cnnn", timeout=120)
    assert "(did you mean mnist_cnn?)" in _one_error(rc, err)
    # Nothing close: no guess.
    rc, _, err = cli("show", "resnet", timeout=120)
    assert "did you mean" not in _one_error(rc, err)


def test_cli_unknown_dataset_names_the_close_one(tmp_path):
    rc, _, err = cli("prepare", "fashion_mnis", "--data-dir", tmp_path / "data", timeout=120)
    line = _one_error(rc, err)
    assert "unknown dataset 'fashion_mnis' (did you mean fashion_mnist?)" in line, line
    rc, _, err = cli("train", "image_classifier", "--dataset", "fashion_mnis", "--model-dir",
                     tmp_path / "run", "--data-dir", tmp_path / "data", timeout=180)
    line = _one_error(rc, err)
    assert "--dataset 'fashion_mnis' (did you mean fashion_mnist?)" in line, line
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ the run's header

def test_header_names_the_backend_and_devices():
    line = context.header_line(ExperimentConfig(name="x", description="", data=None), "none", 1,
                               parse_tf_config(env={}), "keras3", runs_on="jax, cpu")
    assert line.endswith("; engine keras3 (jax, cpu)"), line
    assert context.describe_devices("gpu", 1) == "gpu"
    assert context.describe_devices("gpu", 4) == "4 gpus"
    backend, platform, count = engines.backend_devices("estimator")
    gpus = len(tf.config.list_physical_devices("GPU"))
    assert backend == "tensorflow" and (platform, count) == (("gpu", gpus) if gpus else ("cpu", 1))


def test_cli_header_says_where_the_run_computes(tmp_path):
    # The run stops after its first line: the dataset's dataset.json is not one.
    (tmp_path / "nowhere").mkdir()
    (tmp_path / "nowhere" / "dataset.json").write_text("{}")
    rc, _, err = cli("train", "image_classifier", "--dataset", str(tmp_path / "nowhere"),
                     "--model-dir", tmp_path / "run", "--data-dir", tmp_path / "data",
                     timeout=180)
    _one_error(rc, err, code=1)
    header = err.splitlines()[0]
    assert re.search(r"; engine (estimator|keras|keras3) \(tensorflow, (cpu|gpu|\d+ gpus)\); "
                     r"input tfdata$", header), header


@needs_keras3
def test_jax_on_the_cpu_warns_for_convolutions_only():
    import keras  # pylint: disable=import-outside-toplevel

    cnn = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3),
                            keras.layers.Flatten(), keras.layers.Dense(2)])
    mlp = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    nested = keras.Sequential([keras.Input((8, 8, 1)), cnn])
    warning = advice.slow_backend_warning("jax", "cpu", cnn)
    assert warning and "KERAS_BACKEND=tensorflow" in warning and "2.9" in warning, warning
    assert advice.slow_backend_warning("jax", "cpu", nested) == warning
    # Several processes train together on JAX only: the other way is another engine.
    assert "--engine keras" in advice.slow_backend_warning("jax", "cpu", cnn, processes=2)
    assert advice.slow_backend_warning("jax", "cpu", mlp) is None
    assert advice.slow_backend_warning("jax", "gpu", cnn) is None
    assert advice.slow_backend_warning("tensorflow", "cpu", cnn) is None
