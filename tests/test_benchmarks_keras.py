"""The keras table's code on tiny data (TensorFlow 2.16+ with tf-keras: the
``keras`` tox environment): the keras engine, plain tf-keras and Keras 3 in a
child interpreter all train, alternating, and the targets come out."""

import json

import numpy as np
import pytest
import tensorflow as tf

from benchmarks import common
from benchmarks.common import IMAGE, LABEL

pytestmark = pytest.mark.skipif(
    tuple(int(v) for v in tf.__version__.split(".")[:2]) < (2, 16),
    reason="the keras table runs on TensorFlow 2.16+ with tf-keras")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from estimator_keras.records import write_dataset  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(0)
    arrays = {split: {IMAGE: rng.integers(0, 256, (n, 28, 28, 1), dtype=np.uint8),
                      LABEL: rng.integers(0, 10, n).astype(np.int64)}
              for split, n in (("train", 160), ("test", 32))}
    directory = str(tmp_path_factory.mktemp("bench") / "tiny")
    write_dataset(arrays, directory, num_shards={"train": 4, "test": 1}, progress=False,
                  name="tiny", labels={LABEL: {"num_classes": 10, "class_names": None}})
    return directory


def test_keras_table_on_tiny_data(tiny, tmp_path):
    from benchmarks import keras_table  # pylint: disable=import-outside-toplevel

    settings = common.Settings(data_dir=tiny, quick=True, repeats=1, window_s=0.01,
                               workdir=str(tmp_path / "work"), batch_size=16)
    result = keras_table.run(settings, models=("seed_mlp",))
    rows = {row["name"]: row for row in result["rows"]}
    assert set(rows) == {f"seed_mlp {n}" for n in (
        "engine", "engine Model.fit(make_dataset)", "tf_keras fit_numpy", "keras3 fit_numpy",
        "keras3 fit(make_dataset)")}
    for row in rows.values():
        assert not row.get("error"), row["error"]
        assert row["median"] > 0 and row["ratio"] > 0
    assert rows["seed_mlp keras3 fit_numpy"]["keras"].startswith("3.")
    ids = {t["id"] for t in result["targets"]}
    assert ids == {"keras.seed_mlp.vs_tf_keras_numpy", "keras.seed_mlp.vs_keras3_numpy"}
    assert all(t["value"] > 0 for t in result["targets"])
    json.dumps(result)
