"""Failures handled for real: corrupt data, mismatched schemas, NaN losses,
wrong or shared model dirs, bad usage, killed exports, fuzzed records."""

import os
import time

import numpy as np
import pytest

from support import (checkpoint_files, checkpoint_steps, child_env, cli, kill_group,
                     latest_checkpoint_weights, start_cli)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained_dir(fashion_data, tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("trained") / "run"
    rc, _, err = cli("train", "fashion_mnist_mlp", "--data-dir", fashion_data, "--model-dir",
                     model_dir, "--max-steps", 30, "--eval-every", 30, "--batch-size", 32)
    assert rc == 0, err[-2000:]
    return model_dir


def _copy_dataset(src, dst):
    import shutil
    shutil.copytree(src, dst)
    return dst


def _train(data_root, model_dir, *extra, name="fashion_mnist_mlp", steps=30):
    return cli("train", name, "--data-dir", data_root, "--model-dir", model_dir,
               "--max-steps", steps, "--eval-every", steps, "--batch-size", 32, *extra)


def _no_traceback(err):
    assert "Traceback" not in err, err[-3000:]


# -- 3. corrupt data -------------------------------------------------------

def _flip_byte(path, where=0.5):
    data = bytearray(open(path, "rb").read())
    data[int(len(data) * where)] ^= 0xFF
    open(path, "wb").write(bytes(data))


def test_flipped_byte_stops_training_naming_the_file(fashion_data, tmp_path):
    root = tmp_path / "data"
    _copy_dataset(fashion_data / "fashion_mnist", root / "fashion_mnist")
    shard = root / "fashion_mnist" / "train-00001-of-00004.tfrecord"
    _flip_byte(shard)
    rc, _, err = _train(root, tmp_path / "run", steps=200)
    assert rc == 1
    _no_traceback(err)
    assert "train-00001-of-00004.tfrecord" in err and "corrupt" in err
    assert "at byte" in err and "--skip-corrupt" in err


def test_skip_corrupt_trains_on_the_readable_records(fashion_data, tmp_path):
    root = tmp_path / "data"
    _copy_dataset(fashion_data / "fashion_mnist", root / "fashion_mnist")
    _flip_byte(root / "fashion_mnist" / "train-00001-of-00004.tfrecord")
    rc, out, err = _train(root, tmp_path / "run", "--skip-corrupt", steps=60)
    assert rc == 0, err[-3000:]
    assert "train-00001-of-00004.tfrecord is corrupt" in err
    assert "good records" in err
    assert checkpoint_steps(tmp_path / "run")[-1] == 60
    assert "accuracy" in out


def test_truncated_shard_is_refused_before_training(fashion_data, tmp_path):
    root = tmp_path / "data"
    _copy_dataset(fashion_data / "fashion_mnist", root / "fashion_mnist")
    shard = root / "fashion_mnist" / "train-00002-of-00004.tfrecord"
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(size - 500)
    rc, _, err = _train(root, tmp_path / "run")
    assert rc == 1
    _no_traceback(err)
    assert "train-00002-of-00004.tfrecord" in err and "truncated" in err
    assert not checkpoint_steps(tmp_path / "run")  # nothing trained
    # --skip-corrupt gets past it.
    rc, _, err = _train(root, tmp_path / "run2", "--skip-corrupt")
    assert rc == 0, err[-3000:]
    assert "train-00002-of-00004.tfrecord is corrupt" in err


# -- 4. schema and shape mismatch ------------------------------------------

def _write(root, arrays):
    from estimator_keras import records
    records.write_dataset({"train": arrays, "test": arrays}, str(root / "fashion_mnist"),
                          num_shards=1, progress=False, name="fashion_mnist",
                          labels={"label": {"num_classes": 10, "class_names": None}})


# The built-in builders size their models from the data; a builder with a
# fixed input, as many users write, meets records of another shape.
FIXED_SHAPE_MODULE = """
from experiments import DataConfig, Experiment, ExperimentConfig, TrainConfig, register

def build(hparams):
    import tensorflow as tf
    inputs = tf.keras.Input((28, 28, 1), name="image")
    x = tf.keras.layers.Flatten()(inputs)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(10, activation="softmax")(x))

register(Experiment(ExperimentConfig(name="fixed_28", description="28x28 only",
                                     data=DataConfig(dataset="fashion_mnist")), build))
"""


def test_image_shape_mismatch_fails_before_first_step(tmp_path):
    rng = np.random.default_rng(0)
    _write(tmp_path / "data", {"image": rng.integers(0, 255, (64, 32, 32, 1), dtype=np.uint8),
                               "label": rng.integers(0, 10, 64)})
    module = tmp_path / "fixed.py"
    module.write_text(FIXED_SHAPE_MODULE)
    rc, _, err = _train(tmp_path / "data", tmp_path / "run", "--module", module, name="fixed_28")
    assert rc == 1
    _no_traceback(err)
    assert "expects shape [28, 28, 1]" in err and "shape [32, 32, 1]" in err
    assert not checkpoint_steps(tmp_path / "run")


def test_feature_name_mismatch_lists_expected_and_found(tmp_path):
    rng = np.random.default_rng(0)
    _write(tmp_path / "data", {"pixels": rng.integers(0, 255, (64, 28, 28, 1), dtype=np.uint8),
                               "label": rng.integers(0, 10, 64)})
    rc, _, err = _train(tmp_path / "data", tmp_path / "run")
    assert rc == 1
    _no_traceback(err)
    assert "'image'" in err and "'pixels'" in err


def test_string_feature_for_image_input_is_refused(tmp_path):
    _write(tmp_path / "data", {"image": np.array([b"x"] * 16, dtype=object),
                               "label": np.zeros(16, np.int64)})
    rc, _, err = _train(tmp_path / "data", tmp_path / "run")
    assert rc == 1
    assert "does not fit model input 'image'" in err


# -- 5. numerical failure --------------------------------------------------

def test_nan_loss_stops_with_message_and_keeps_last_good_checkpoint(fashion_data, tmp_path):
    rc, _, err = _train(fashion_data, tmp_path / "run", "--hparams", "learning_rate=1e12",
                        steps=300)
    assert rc == 1
    _no_traceback(err)
    assert "NaN or infinite" in err and "learning_rate" in err
    latest, weights = latest_checkpoint_weights(tmp_path / "run")
    assert latest in err and weights
    for name, value in weights.items():
        assert np.isfinite(value).all(), name


# -- 6. wrong model dir, shared model dir ----------------------------------

def test_model_dir_of_other_architecture_is_refused(fashion_data, trained_dir, tmp_path):
    import shutil
    model_dir = tmp_path / "run"
    shutil.copytree(trained_dir, model_dir)
    before = checkpoint_files(model_dir)
    assert before
    rc, _, err = _train(fashion_data, model_dir, name="fashion_mnist_cnn", steps=60)
    assert rc == 1
    _no_traceback(err)
    # What, why, what to do: three short lines.
    what, why, todo = err[err.index("error: "):].splitlines()
    assert f"{model_dir} holds the checkpoints of another run (fashion_mnist_mlp), which do " \
           "not fit this model." in what
    assert "model.dropout" in why and str(model_dir / "config.yaml") in why
    assert "Use another --model-dir" in todo
    assert max(len(line.replace(str(model_dir), "DIR")) for line in (what, why, todo)) < 130
    assert checkpoint_files(model_dir) == before  # nothing restored, nothing overwritten


def test_second_train_on_same_model_dir_refuses(fashion_data, tmp_path):
    model_dir = tmp_path / "run"
    with open(tmp_path / "first.log", "w") as log:
        first = start_cli("train", "fashion_mnist_mlp", "--data-dir", fashion_data,
                          "--model-dir", model_dir, "--max-steps", 100000, "--eval-every",
                          1000, "--batch-size", 32, log=log)
        try:
            deadline = time.monotonic() + 120
            while not (model_dir / ".train.lock").exists():
                assert time.monotonic() < deadline and first.poll() is None
                time.sleep(0.2)
            rc, _, err = _train(fashion_data, model_dir)
        finally:
            kill_group(first)
    assert rc == 1
    _no_traceback(err)
    assert "in use by process" in err and str(first.pid) in err


# -- 7. bad usage ----------------------------------------------------------

@pytest.mark.parametrize("args,code,needle", [
    (["train", "no_such_experiment"], 2, "unknown experiment 'no_such_experiment'"),
    (["train", "fashion_mnist_mlp", "--no-such-flag"], 2, "unrecognized arguments"),
    (["train", "fashion_mnist_mlp", "--hparams", "warp_speed=9"], 2,
     "unknown hparam 'warp_speed'"),
    (["train", "fashion_mnist_mlp", "--hparams", "batch_size=big"], 2,
     "batch_size='big': expected int"),
    (["train", "fashion_mnist_mlp", "--hparams", "learning_rate"], 2, "is not key=value"),
    (["train", "fashion_mnist_mlp", "--max-steps", "0"], 2, "max_steps must be a positive"),
    (["prepare", "imagenet"], 2, "unknown dataset 'imagenet'"),
    (["inspect", "/nonexistent/*.tfrecord"], 1, "no TFRecord files match"),
    (["inspect", "/tmp"], 1, "is not a dataset"),
])
def test_bad_usage_exit_codes_and_messages(args, code, needle):
    rc, out, err = cli(*args)
    assert rc == code, (out, err)
    assert needle in err, err
    _no_traceback(err)
    assert len(err.strip().splitlines()) <= 3


def test_invalid_tf_config_is_usage_error(fashion_data, tmp_path):
    env = child_env(TF_CONFIG='{"cluster": {"worker": ["127.0.0.1:1"]}, "task": ')
    rc, _, err = cli("train", "fashion_mnist_mlp", "--data-dir", fashion_data, "--model-dir",
                     tmp_path / "run", env=env)
    assert rc == 2
    assert "TF_CONFIG" in err
    _no_traceback(err)


def test_unwritable_model_dir(fashion_data, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    rc, _, err = _train(fashion_data, blocker / "run")
    assert rc == 1
    assert "model dir" in err and str(blocker) in err
    _no_traceback(err)


def test_verbose_shows_traceback():
    rc, _, err = cli("--verbose", "inspect", "/nonexistent/*.tfrecord")
    assert rc == 1 and "Traceback" in err


# -- 1. a kill during export ------------------------------------------------

def test_kill_during_export_leaves_previous_export_intact(trained_dir, tmp_path):
    import shutil
    model_dir = tmp_path / "run"
    shutil.copytree(trained_dir, model_dir)
    export = model_dir / "export"
    before = (export / "weights.h5").read_bytes()
    env_log = open(tmp_path / "export.log", "w")
    proc = start_cli("export", "fashion_mnist_mlp", "--model-dir", model_dir, "--force",
                     log=env_log)
    try:
        deadline = time.monotonic() + 120
        while not any(n.startswith(".export.tmp-") for n in os.listdir(model_dir)):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.01)
    finally:
        kill_group(proc)
    assert (export / "weights.h5").read_bytes() == before
    # The next export cleans the staging dir and replaces the export whole.
    rc, _, err = cli("export", "fashion_mnist_mlp", "--model-dir", model_dir)
    assert rc == 0, err[-2000:]
    assert not [n for n in os.listdir(model_dir) if n.startswith(".export")]
    import tensorflow as tf
    tf.keras.models.load_model(export / "model.h5", compile=False)


def test_crash_between_export_renames_is_recovered(trained_dir, tmp_path):
    from estimator_keras import export as export_lib
    import shutil
    model_dir = tmp_path / "run"
    shutil.copytree(trained_dir, model_dir)
    # The state a crash between the two renames leaves behind.
    os.rename(model_dir / "export", model_dir / "export.old-12345")
    assert export_lib.recover_export(str(model_dir / "export"))
    assert (model_dir / "export" / "model.h5").exists()
    assert not export_lib.recover_export(str(model_dir / "export"))
