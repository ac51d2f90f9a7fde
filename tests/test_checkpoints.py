"""The library refuses a checkpoint that does not fit the model, in every
function that restores one (not only the CLI), naming what is missing and
what is unexpected; and it reads either engine's step."""

import numpy as np
import pytest
import tensorflow as tf

from estimator_keras import checkpoints, export, fit_and_evaluate, make_dataset, write_records
from estimator_keras.engines.keras.engine import evaluate_checkpoint
from estimator_keras.errors import ModelDirError


def _model(units):
    inputs = tf.keras.Input((4,), name="x")
    hidden = tf.keras.layers.Dense(units, activation="relu")(inputs)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(3, activation="softmax")(hidden))


def _deeper():
    inputs = tf.keras.Input((4,), name="x")
    hidden = tf.keras.layers.Dense(8, activation="relu")(inputs)
    hidden = tf.keras.layers.Dense(8, activation="relu")(hidden)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(3, activation="softmax")(hidden))


def _compiled(build):
    def make():
        model = build()
        model.compile("adam", "sparse_categorical_crossentropy", ["accuracy"])
        return model
    return make


@pytest.fixture
def trained_small(tmp_path):
    """A model dir trained 6 steps with a Dense(8) model, and its data."""
    rng = np.random.default_rng(0)
    data = str(tmp_path / "data")
    write_records({"x": rng.standard_normal((64, 4)).astype(np.float32),
                   "label": rng.integers(0, 3, 64)}, data, num_shards=2, progress=False)
    write_records({"x": rng.standard_normal((32, 4)).astype(np.float32),
                   "label": rng.integers(0, 3, 32)}, data, split="test", num_shards=1,
                  progress=False)
    model_dir = str(tmp_path / "run")
    fit_and_evaluate(_compiled(lambda: _model(8)),
                     lambda ctx: make_dataset(data, 16, training=True, input_context=ctx),
                     lambda ctx: make_dataset(data, 16, training=False),
                     model_dir=model_dir, max_steps=6, eval_every_steps=3, log=lambda _: None)
    return data, model_dir


@pytest.mark.parametrize("build, missing, unexpected", [
    (lambda: _model(16), False, False),  # same layers, other shapes
    (_deeper, True, False),               # a layer more
])
def test_every_restoring_function_refuses_another_architecture(trained_small, build, missing,
                                                               unexpected):
    data, model_dir = trained_small
    latest = tf.train.latest_checkpoint(model_dir)
    attempts = {
        "fit_and_evaluate": lambda: fit_and_evaluate(
            _compiled(build), lambda ctx: make_dataset(data, 16, training=True),
            lambda ctx: make_dataset(data, 16, training=False), model_dir=model_dir,
            max_steps=9, eval_every_steps=3, log=lambda _: None),
        "evaluate_checkpoint": lambda: evaluate_checkpoint(
            _compiled(build), latest, make_dataset(data, 16, training=False)),
        "export_model": lambda: export.export_model(build, model_dir),
    }
    for name, attempt in attempts.items():
        with pytest.raises(ModelDirError, match="does not fit this model's architecture") as e:
            attempt()
        text = str(e.value)
        assert ("missing from the checkpoint" in text) == missing, (name, text)
        assert ("in the checkpoint but not in the model" in text) == unexpected, (name, text)
        if not missing:
            assert "shape mismatches" in text, (name, text)
    # Nothing was trained or overwritten.
    assert tf.train.latest_checkpoint(model_dir) == latest
    assert checkpoints.checkpoint_step(latest) == 6


def test_a_smaller_model_is_told_what_the_checkpoint_has_in_excess(tmp_path):
    model_dir = str(tmp_path / "deep")
    deep = _deeper()
    prefix = tf.train.Checkpoint(root=deep).write(f"{model_dir}/model.ckpt-1")
    with pytest.raises(ModelDirError, match="in the checkpoint but not in the model"):
        checkpoints.check_compatible(_model(8), prefix)
