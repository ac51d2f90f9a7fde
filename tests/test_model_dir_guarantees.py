"""What a model dir guarantees, on the engine ``--engine auto`` picks here
(keras3 on the Quickstart's Python 3.13, the Estimator on 3.11) (issue 35,
items 1, 7 and 8): a rerun with another model setting, or of another
experiment, is refused in the documented words with the model dir left as
it was; a finished run is a no-op; more steps resume at the step; the lock
holds; evaluate and export read it; a model dir of the Keras 2 engines
continues on keras3. The checks that read a model dir know every engine's
checkpoints, and a flag and --hparams that disagree are refused."""

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess

import pytest
import yaml

from estimator_keras import engines
from estimator_keras.engines import model_dirs
from estimator_keras.engines.keras3 import checkpoints as keras3_checkpoints
from estimator_keras.errors import ModelDirError, UsageError
from estimator_keras.modeldir import ModelDirLock
from experiments import cli
from experiments.catalog import registry
from experiments.commands import common as commands
from experiments.config import files as config_files
from experiments.config import hparams
from keras_envs import interpreter
from support import ROOT, checkpoint_name, cli as run_cli, keras3_installed, latest_step

TRAIN = ("--max-steps", 10, "--eval-every", 10, "--batch-size", 16)


def snapshot(folder):
    """relative path -> SHA-256 of every file under ``folder``."""
    found = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, folder)] = hashlib.sha256(f.read()).hexdigest()
    return found


def _engine():
    """The engine --engine auto trains with here."""
    import tensorflow  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    return engines.resolve_engine("auto")


# -- what reads a model dir knows every engine's checkpoints (no training)


def _write_tf_checkpoint(model_dir, estimator):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    names = {"estimator_global_step": tf.Variable(7, dtype=tf.int64)} if estimator else {}
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(kernel=tf.Variable([1.0, 2.0]), **names), str(model_dir), 3,
        checkpoint_name="model.ckpt")
    return manager.save(checkpoint_number=7)


def test_every_check_of_a_model_dir_finds_each_engines_checkpoints(tmp_path):
    empty, estimator, keras, keras3 = (tmp_path / n for n in ("empty", "est", "keras", "k3"))
    empty.mkdir()
    estimator_ckpt = _write_tf_checkpoint(estimator, estimator=True)
    keras_ckpt = _write_tf_checkpoint(keras, estimator=False)
    keras3.mkdir()
    for step in (4, 12):
        (keras3 / keras3_checkpoints.name_of(step)).write_bytes(b"")
    assert model_dirs.any_checkpoint(empty) is None
    assert model_dirs.engine_of(empty) is None
    assert model_dirs.any_checkpoint(estimator) == estimator_ckpt
    assert model_dirs.engine_of(estimator) == "estimator"
    assert model_dirs.any_checkpoint(keras) == keras_ckpt
    assert model_dirs.engine_of(keras) == "keras"
    # The newest by step; no index needed, nor a damaged one trusted.
    assert model_dirs.any_checkpoint(keras3) == str(keras3 / "ckpt-12.weights.h5")
    (keras3 / keras3_checkpoints.INDEX).write_text("{damaged")
    assert model_dirs.any_checkpoint(keras3) == str(keras3 / "ckpt-12.weights.h5")
    assert model_dirs.engine_of(keras3) == "keras3"
    # A keras3 run continues a TF checkpoint and writes its own: that one counts.
    (keras / keras3_checkpoints.name_of(9)).write_bytes(b"")
    assert model_dirs.any_checkpoint(keras) == str(keras / "ckpt-9.weights.h5")
    assert model_dirs.engine_of(keras) == "keras3"


@pytest.mark.parametrize("kind", ["keras3", "tf"])
def test_changed_settings_are_found_beside_any_engines_checkpoint(kind, tmp_path):
    commands.load_catalog(argparse.Namespace(modules=[], verbose=False))
    config = registry.get("fashion_mnist_mlp").config
    config_files.write(tmp_path, config, "data/fashion_mnist", None)
    other = hparams.with_overrides(config, {"units": "64"})
    # No checkpoint: nothing to protect.
    assert config_files.changed_settings(tmp_path, other, "data/fashion_mnist", None) == []
    if kind == "keras3":
        (tmp_path / keras3_checkpoints.name_of(10)).write_bytes(b"")
    else:
        _write_tf_checkpoint(tmp_path, estimator=False)
    assert config_files.changed_settings(tmp_path, other, "data/fashion_mnist", None) == [
        "model.units: 128 -> 64"]
    assert config_files.changed_settings(tmp_path, config, "data/fashion_mnist", None) == []


def _save_in_engine_format(engine, model, model_dir):
    """A checkpoint of ``model`` as ``engine`` writes them."""
    if engine == "keras3":
        return keras3_checkpoints.save(model, str(model_dir), step=5, keep=1)
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return tf.train.Checkpoint(root=model).write(str(model_dir / "model.ckpt-5"))


def _dense_model(units, layers=1, keras=None):
    """Dense layers on 4 inputs, in ``keras`` (default tf.keras: the Keras
    this environment's engine needs)."""
    if keras is None:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        keras = tf.keras
    inputs = keras.Input((4,), name="x")
    x = inputs
    for _ in range(layers):
        x = keras.layers.Dense(units, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(x))


def test_a_checkpoint_of_another_architecture_is_refused_weight_by_weight(tmp_path):
    """The library's message (what `evaluate` and `export` print for a model
    dir of another model): each weight by name and shape, no Keras internals."""
    engine = engines.get_engine(_engine())
    checkpoint = _save_in_engine_format(engine.name, _dense_model(8), tmp_path)
    for other, shown in ((_dense_model(16), r"model \(4, 16\), checkpoint \(4, 8\)"),
                         (_dense_model(8, layers=2), "missing from the checkpoint: ")):
        with pytest.raises(ModelDirError) as refused:
            engine.check_compatible(other, checkpoint)
        message = str(refused.value)
        assert message.startswith(f"checkpoint {checkpoint} does not fit this model's "
                                  f"architecture"), message
        assert re.search(shown, message), message
        assert message.endswith("Use a fresh --model-dir for a different model."), message
        assert "Keras says" not in message and "<" not in message, message
    engine.check_compatible(_dense_model(8), checkpoint)  # the same model fits


@pytest.mark.skipif(not keras3_installed(), reason="Keras 3 is not installed (TensorFlow "
                                                   "<= 2.15): keras3_migration needs it")
def test_a_tf_checkpoint_of_another_architecture_names_each_weight_once(tmp_path):
    """keras3_migration's refusal: a weight of another shape is a mismatch,
    not also "in the checkpoint but not in the model"."""
    # pylint: disable=import-outside-toplevel
    import keras  # Keras 3, whichever Keras tf.keras is here
    import tensorflow as tf
    from estimator_keras.engines.keras3 import migration as keras3_migration
    layers = {}
    for index, (rows, cols) in enumerate(((4, 8), (8, 3))):
        layer = tf.Module()
        layer.kernel, layer.bias = tf.Variable(tf.zeros((rows, cols))), tf.Variable(tf.zeros(cols))
        layers[f"layer_with_weights-{index}"] = layer
    prefix = tf.train.Checkpoint(**layers).write(str(tmp_path / "model.ckpt-3"))
    keras3_migration.check_tf_checkpoint(_dense_model(8, keras=keras), prefix)  # fits
    with pytest.raises(ModelDirError) as refused:
        keras3_migration.check_tf_checkpoint(_dense_model(16, keras=keras), prefix)
    message = str(refused.value)
    assert "layer_with_weights-0/kernel (layer" in message, message
    assert "in the checkpoint but not in the model" not in message, message


# -- a flag and --hparams that disagree (item 8)


def _train_args(*argv):
    return cli.build_parser().parse_args(["train", "fashion_mnist_mlp", *map(str, argv)])


def test_a_flag_and_hparams_that_disagree_are_refused(tmp_path):
    for argv, flag, key in (
            (("--max-steps", 20, "--hparams", "max_steps=40"), "--max-steps 20",
             "--hparams max_steps=40"),
            (("--eval-every", 5, "--hparams", "eval_every_steps=10,units=8"), "--eval-every 5",
             "--hparams eval_every_steps=10"),
            (("--batch-size", 8, "--hparams", "batch_size=16.0"), "--batch-size 8",
             "--hparams batch_size=16.0")):
        with pytest.raises(UsageError) as refused:
            commands.train_config(_train_args(*argv))
        message = str(refused.value)
        assert flag in message and key in message, message
    # The same value twice is no conflict.
    _, config = commands.train_config(_train_args("--max-steps", 40, "--hparams",
                                                  "max_steps=40.0"))
    assert config.train.max_steps == 40
    # A config file is a layer below the command line: overridden without a word.
    config_file = tmp_path / "c.yaml"
    config_file.write_text(yaml.safe_dump({"train": {"max_steps": 7, "batch_size": 4}}))
    _, config = commands.train_config(_train_args("--config", config_file, "--max-steps", 20,
                                                  "--hparams", "batch_size=12"))
    assert (config.train.max_steps, config.train.batch_size) == (20, 12)


def test_the_conflict_exits_2_before_anything_is_written(tmp_path):
    model_dir = tmp_path / "run"
    rc, out, err = run_cli("train", "fashion_mnist_mlp", "--model-dir", model_dir,
                           "--data-dir", tmp_path / "data", "--max-steps", 20,
                           "--hparams", "max_steps=40")
    assert rc == 2, err
    assert "--max-steps 20 and --hparams max_steps=40" in err, err
    assert not model_dir.exists() and not (tmp_path / "data").exists()


# -- the guarantees end to end, on the engine auto picks here


@pytest.fixture(scope="module")
def trained(fashion_data, tmp_path_factory):
    """A fashion_mnist_mlp model dir trained to step 10 by --engine auto;
    (its path, the engine, train's stdout). Tests change copies of it."""
    model_dir = tmp_path_factory.mktemp("guarantees") / "run"
    rc, out, err = run_cli("train", "fashion_mnist_mlp", "--model-dir", model_dir,
                           "--data-dir", fashion_data, *TRAIN, timeout=600)
    assert rc == 0, err[-3000:]
    assert latest_step(model_dir) == 10
    engine = json.loads((model_dir / "export" / "export.json").read_text())["engine"]
    assert engine == _engine()
    return model_dir, engine, out


def _copy(trained, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(trained[0], copy)
    return copy


@pytest.mark.slow
def test_a_changed_setting_is_refused_and_the_model_dir_left_as_it_was(trained, fashion_data,
                                                                       tmp_path):
    model_dir = _copy(trained, tmp_path)
    before = snapshot(model_dir)
    # num_classes=10 is what the data says already: the same weights, another setting.
    for setting, fits, change in (("num_classes=10", True, "model.num_classes: 0 -> 10"),
                                  ("units=64", False, "model.units: 128 -> 64")):
        rc, _, err = run_cli("train", "fashion_mnist_mlp", "--model-dir", model_dir,
                             "--data-dir", fashion_data, *TRAIN, "--hparams", setting,
                             timeout=600)
        assert rc == 1, err[-3000:]
        lines = err[err.index("error: "):].splitlines()
        assert lines == [
            f"error: {model_dir} holds the checkpoints of another run (fashion_mnist_mlp)"
            + ("." if fits else ", which do not fit this model."),
            f"  Its model or data settings differ: {change} (see {model_dir}/config.yaml).",
            "  Use another --model-dir for this run, or the settings recorded there to "
            "continue that one."], err[-3000:]
        assert snapshot(model_dir) == before, setting


@pytest.mark.slow
def test_a_model_dir_of_another_experiment_gets_the_documented_message(trained, fashion_data,
                                                                       tmp_path):
    model_dir = _copy(trained, tmp_path)
    before = snapshot(model_dir)
    rc, _, err = run_cli("train", "fashion_mnist_cnn", "--model-dir", model_dir,
                         "--data-dir", fashion_data, *TRAIN, timeout=600)
    assert rc == 1, err[-3000:]
    lines = err[err.index("error: "):].splitlines()
    assert lines[0] == (f"error: {model_dir} holds the checkpoints of another run "
                        f"(fashion_mnist_mlp), which do not fit this model."), err[-3000:]
    assert len(lines) == 3 and "model.conv_dropout" in lines[1], err[-3000:]
    # evaluate and export: the library's message, each weight by name and shape.
    for command in (("evaluate",), ("export", "--export-dir", tmp_path / "export")):
        rc, _, err = run_cli(command[0], "fashion_mnist_cnn", "--model-dir", model_dir,
                             "--data-dir", fashion_data, *command[1:], timeout=600)
        assert rc == 1, err[-3000:]
        (error,) = [line for line in err.splitlines() if line.startswith("error: ")]
        assert "does not fit this model's architecture" in error, error
        assert "shape mismatches: " in error and "Use a fresh --model-dir" in error, error
        assert "Keras says" not in error and "<" not in error, error
    assert not (tmp_path / "export").exists()
    assert snapshot(model_dir) == before


@pytest.mark.slow
def test_a_finished_run_is_a_no_op_and_more_steps_resume_at_its_step(trained, fashion_data,
                                                                    tmp_path):
    model_dir = _copy(trained, tmp_path)
    before = snapshot(model_dir)
    accuracy = re.search(r"final metrics: accuracy (\d\.\d+)", trained[2]).group(1)
    args = ("--model-dir", model_dir, "--data-dir", fashion_data)
    rc, out, err = run_cli("train", "fashion_mnist_mlp", *args, *TRAIN, timeout=600)
    assert rc == 0, err[-3000:]
    assert "is already at step 10" in err and f"accuracy {accuracy}" in out, err[-3000:]
    assert snapshot(model_dir) == before

    rc, out, err = run_cli("evaluate", "fashion_mnist_mlp", *args, "--json", timeout=600)
    assert rc == 0, err[-3000:]
    evaluated = json.loads(out)
    assert evaluated["global_step"] == 10 and f"{evaluated['accuracy']:.4f}" == accuracy

    more = [str(a) for a in TRAIN]
    more[1] = "20"
    rc, out, err = run_cli("train", "fashion_mnist_mlp", *args, *more, timeout=600)
    assert rc == 0, err[-3000:]
    assert re.search(rf"resuming from \S*{checkpoint_name(10)}", err), err[-3000:]
    assert "checkpoint step 20" in out and latest_step(model_dir) == 20, out

    rc, out, err = run_cli("export", "fashion_mnist_mlp", *args, "--export-dir",
                           tmp_path / "again", timeout=600)
    assert rc == 0, err[-3000:]
    info = json.loads((tmp_path / "again" / "export.json").read_text())
    assert (info["global_step"], info["engine"]) == (20, trained[1])


@pytest.mark.slow
def test_a_second_run_on_a_locked_model_dir_is_refused(trained, fashion_data, tmp_path):
    model_dir = _copy(trained, tmp_path)
    before = snapshot(model_dir)
    with ModelDirLock(model_dir):
        rc, _, err = run_cli("train", "fashion_mnist_mlp", "--model-dir", model_dir,
                             "--data-dir", fashion_data, *TRAIN[:1], 20, *TRAIN[2:],
                             timeout=600)
        held = snapshot(model_dir)
    assert rc == 1, err[-3000:]
    assert f"is in use by process {os.getpid()}" in err, err[-3000:]
    assert held == {**before, ".train.lock": held[".train.lock"]}


@pytest.mark.slow
@pytest.mark.parametrize("writer", ["estimator", "keras"])
def test_a_keras2_engine_model_dir_continues_on_keras3(writer, tmp_path):
    """Trained by a Keras 2 engine in its interpreter, continued by keras3 in
    another (tests/keras_envs.py): a changed setting is refused there too,
    then the run resumes at its step."""
    reader = "keras3-tensorflow"
    pythons = {pair: interpreter(pair) for pair in (writer, reader)}
    model_dir, data_dir = tmp_path / "run", tmp_path / "data"

    def run(pair, *args):
        python, env = pythons[pair]
        proc = subprocess.run([python, "-m", "experiments", *map(str, args)], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=600)
        return proc.returncode, proc.stdout, proc.stderr

    rc, _, err = run(writer, "prepare", "fashion_mnist", "--data-dir", data_dir,
                     "--max-examples", 500, "--shards", 1)
    assert rc == 0, err[-3000:]
    args = ("--model-dir", model_dir, "--data-dir", data_dir)
    rc, _, err = run(writer, "train", "fashion_mnist_mlp", *args, "--engine", writer, *TRAIN)
    assert rc == 0, err[-3000:]
    before = snapshot(model_dir)
    rc, _, err = run(reader, "train", "fashion_mnist_mlp", *args, *TRAIN, "--hparams",
                     "units=64")
    assert rc == 1 and "engine keras3" in err, err[-3000:]
    assert "which do not fit this model" in err and "model.units: 128 -> 64" in err, err[-3000:]
    assert snapshot(model_dir) == before
    rc, out, err = run(reader, "train", "fashion_mnist_mlp", *args, "--max-steps", 20,
                       *TRAIN[2:])
    assert rc == 0, err[-3000:]
    assert re.search(rf"resuming from \S*{checkpoint_name(10)} \(step 10, a checkpoint of "
                     rf"another engine", err), err[-3000:]
    assert "checkpoint step 20" in out and latest_step(model_dir) == 20, out


def test_the_keras3_index_keeps_where_the_optimizers_count_started(tmp_path):
    index = tmp_path / keras3_checkpoints.INDEX
    index.write_text(json.dumps({"latest": "ckpt-12.weights.h5", "all": ["ckpt-12.weights.h5"]}))
    assert keras3_checkpoints.optimizer_start_of(str(tmp_path)) == 0
    index.write_text(json.dumps({"latest": "ckpt-12.weights.h5", "all": ["ckpt-12.weights.h5"],
                                 "optimizer_from": 10}))
    assert keras3_checkpoints.optimizer_start_of(str(tmp_path)) == 10
    assert keras3_checkpoints.optimizer_start_of(str(tmp_path / "none")) == 0
    for bad in (-1, "10", 2.5, True):
        index.write_text(json.dumps({"latest": "ckpt-12.weights.h5",
                                     "all": ["ckpt-12.weights.h5"], "optimizer_from": bad}))
        with pytest.raises(ModelDirError, match=r"is damaged \(optimizer_from is .*, not a step\)"):
            keras3_checkpoints.optimizer_start_of(str(tmp_path))
