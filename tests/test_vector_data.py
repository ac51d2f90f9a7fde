"""``image_classifier`` on data that is not images: float vectors imported with
``prepare tfrecords --features`` train to a real result (issue 21, item 5),
and inputs no builder fits are refused with their shape."""

import json
import os

import numpy as np
import pytest

from estimator_keras.errors import ConfigError
from experiments.catalog import models
from experiments.config.data_info import DataInfo
from support import cli

CLASSES = 3


def _data(shape, dtype="float32"):
    return DataInfo(inputs={"image": {"shape": list(shape), "dtype": dtype}},
                    num_classes=CLASSES)


@pytest.mark.parametrize("shape", [(8,), ()])
def test_vectors_get_a_dense_classifier(shape):
    model = models.image_classifier({"filters": 8, "dropout": 0.3}, _data(shape))
    kinds = {type(layer).__name__ for layer in model.layers}
    assert "Dense" in kinds and not any(k.startswith("Conv") for k in kinds)
    assert tuple(model.output_shape) == (None, CLASSES)
    batch = np.random.default_rng(0).standard_normal((5, *shape)).astype(np.float32)
    probabilities = model.predict(batch, verbose=0)
    assert probabilities.shape == (5, CLASSES)
    assert np.allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)


def test_images_keep_the_conv_net_with_or_without_a_channel_axis():
    for shape in ((28, 28, 1), (28, 28)):
        model = models.image_classifier({"filters": 8}, _data(shape, "uint8"))
        assert any(type(layer).__name__ == "Conv2D" for layer in model.layers)
        assert tuple(model.output_shape) == (None, CLASSES)


def test_inputs_of_higher_rank_are_refused_with_their_shape():
    with pytest.raises(ConfigError, match=r"shape \[2, 3, 4, 5\]"):
        models.image_classifier({}, _data((2, 3, 4, 5)))


def _write_vector_records(path, n, seed):
    """Float vectors of 8 on an arbitrary scale; the class is which of the
    first three values is largest (chance: about a third)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 8)).astype(np.float32)
    y = np.argmax(x[:, :CLASSES], axis=1).astype(np.int64)
    x = 40.0 * x + 250.0  # not pixels: nothing to divide by 255
    with tf.io.TFRecordWriter(str(path)) as writer:
        for values, label in zip(x, y):
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "measurements": tf.train.Feature(float_list=tf.train.FloatList(value=values)),
                "class": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            })).SerializeToString())
    return np.bincount(y, minlength=CLASSES).max() / n


@pytest.mark.slow
def test_image_classifier_trains_on_float_vectors_past_chance(tmp_path):
    majority = _write_vector_records(tmp_path / "train.tfrecord", 600, seed=0)
    _write_vector_records(tmp_path / "test.tfrecord", 200, seed=1)
    data_dir, model_dir = tmp_path / "data", tmp_path / "run"
    rc, out, err = cli("prepare", "tfrecords", "--source", tmp_path / "train.tfrecord",
                       "--test-source", tmp_path / "test.tfrecord", "--features",
                       "image=measurements", "--label", "class", "--name", "vectors",
                       "--data-dir", data_dir)
    assert rc == 0, err[-3000:]
    rc, out, err = cli("train", "image_classifier", "--dataset", "vectors", "--data-dir",
                       data_dir, "--model-dir", model_dir, "--max-steps", 300, "--eval-every",
                       300, "--batch-size", 32, "--hparams", "learning_rate=0.003")
    assert rc == 0, err[-3000:]
    with open(os.path.join(model_dir, "export", "export.json"), encoding="utf-8") as f:
        accuracy = json.load(f)["metrics"]["accuracy"]
    assert accuracy > majority + 0.3, (accuracy, majority)
