"""A model with an Embedding (sparse gradients) trains in a real cluster:
multi_worker_mirrored and parameter_server on the estimator engine,
multi_worker_mirrored on the keras engine."""

import os
import re

import pytest

from estimator_keras import engines
from plugin_support import EMBEDDING_EXPERIMENT, prepare_embedding_data, run_cli

ESTIMATOR = engines.estimator_available()

# (engine, parameter servers, the strategy the tasks must report). The keras
# engine runs the same Model.fit on TensorFlow 2.15 and 2.16+; its case runs
# in the keras environment only, to keep the suite short.
CASES = [
    pytest.param("estimator", 0, "multi_worker_mirrored", id="estimator-mwms", marks=pytest.mark.skipif(
        not ESTIMATOR, reason="tf.estimator needs TensorFlow 2.15")),
    pytest.param("estimator", 1, "parameter_server", id="estimator-ps", marks=pytest.mark.skipif(
        not ESTIMATOR, reason="tf.estimator needs TensorFlow 2.15")),
    pytest.param("keras", 0, "multi_worker_mirrored", id="keras-mwms", marks=pytest.mark.skipif(
        ESTIMATOR, reason="run in the keras environment (TensorFlow 2.16+)")),
]


@pytest.fixture(scope="module")
def tags(tmp_path_factory):
    """The user's module and a data dir holding its dataset, in 2 train files
    (one per training task)."""
    return prepare_embedding_data(tmp_path_factory.mktemp("tags"))


def _embedding(checkpoint):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    reader = tf.train.load_checkpoint(checkpoint)
    keys = [k for k in reader.get_variable_to_shape_map()
            if "/embeddings/" in k and "OPTIMIZER_SLOT" not in k and k.endswith("VARIABLE_VALUE")]
    assert len(keys) == 1, sorted(reader.get_variable_to_shape_map())
    return reader.get_tensor(keys[0])


@pytest.mark.slow
@pytest.mark.parametrize("engine,ps,strategy", CASES)
def test_an_embedding_model_trains_in_a_cluster(tags, tmp_path, engine, ps, strategy):
    import numpy as np  # pylint: disable=import-outside-toplevel

    module, data_dir = tags
    model_dir, log_dir = str(tmp_path / "model"), str(tmp_path / "logs")
    rc, out, err = run_cli("--module", module, "cluster", EMBEDDING_EXPERIMENT, "--workers", 1,
                           "--ps", ps, "--model-dir", model_dir, "--log-dir", log_dir, "--quiet",
                           "--timeout", 240, "--data-dir", data_dir, "--engine", engine,
                           cwd=tmp_path, timeout=300)
    assert rc == 0, out[-3000:] + err[-3000:]
    with open(os.path.join(log_dir, "chief-0.log"), encoding="utf-8") as f:
        chief = f.read()
    assert f"strategy {strategy}," in chief, chief[-3000:]
    # The dense sum is said, with the table's size, where it happens only.
    dense = "sums Embedding gradients across the workers as dense tensors"
    if (engine, strategy) == ("estimator", "multi_worker_mirrored"):
        table = r"128 bytes per step for 'embedding(_\d+)?' 16 x 2 \(128 bytes\)"
        assert re.search(dense + r".*: " + table, chief), chief[-3000:]
    else:
        assert dense not in chief, chief[-3000:]
    # Only the category carries the label, and a random embedding of the 16
    # categories in 2 dimensions stays far below this.
    accuracy = float(re.search(r"^final metrics: accuracy ([\d.]+)", chief, re.M).group(1))
    assert accuracy >= 0.9, chief[-3000:]
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    trained = _embedding(tf.train.latest_checkpoint(model_dir))
    initial = os.path.join(model_dir, "keras", "keras_model.ckpt")
    if engine == "estimator":
        # model_to_estimator keeps the initial weights there.
        assert not np.allclose(trained, _embedding(initial))


@pytest.mark.skipif(not ESTIMATOR, reason="tf.estimator needs TensorFlow 2.15")
def test_the_dense_sum_survives_model_to_estimators_optimizer_clone():
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from estimator_keras.engines.estimator import sums as est_lib  # pylint: disable=import-outside-toplevel

    schedule = tf.keras.optimizers.schedules.CosineDecay(0.5, 100, alpha=0.1)
    optimizer = est_lib.dense_sum_optimizer(tf.keras.optimizers.legacy.SGD(schedule, momentum=0.9))
    # model_to_estimator rebuilds the optimizer from its class and config.
    clone = type(optimizer).from_config(optimizer.get_config())
    for opt in (optimizer, clone):
        assert isinstance(opt, tf.keras.optimizers.legacy.SGD)
        assert type(opt).__name__ == "SGD"
        assert opt.get_config()["momentum"] == 0.9
        assert float(opt.learning_rate(100)) == pytest.approx(0.05)
        assert opt.gradient_aggregator is est_lib.sum_as_dense
    assert est_lib.dense_sum_optimizer(optimizer) is optimizer

    table = tf.Variable(tf.zeros([4, 2]))
    sparse = tf.IndexedSlices(tf.ones([3, 2]), tf.constant([1, 3, 1]), tf.constant([4, 2]))
    ((summed, var), (none, _)) = est_lib.sum_as_dense([(sparse, table), (None, table)])
    assert var is table and none is None
    assert not isinstance(summed, tf.IndexedSlices)
    np.testing.assert_array_equal(summed.numpy(), [[0, 0], [2, 2], [0, 0], [1, 1]])


@pytest.mark.skipif(not ESTIMATOR, reason="tf.estimator needs TensorFlow 2.15")
def test_the_estimator_engine_says_its_dense_sum_with_the_tables_size_under_mwms_only():
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from estimator_keras.engines.estimator import sums as est_lib  # pylint: disable=import-outside-toplevel

    ids = tf.keras.Input((3,), dtype="int64")
    x = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(300_000, 64, name="items")(ids))
    model = tf.keras.Model(ids, tf.keras.layers.Dense(2)(x))
    mwms = tf.distribute.MultiWorkerMirroredStrategy()
    note = est_lib.dense_sum_note(model, mwms)
    # 300,000 x 64 float32 = 73.2 MB.
    assert "73.2 MB per step for 'items' 300,000 x 64 (73.2 MB)" in note, note
    assert "--strategy parameter_server" in note
    for strategy in (None, tf.distribute.MirroredStrategy(),
                     tf.distribute.OneDeviceStrategy("/cpu:0")):
        assert est_lib.dense_sum_note(model, strategy) is None
    plain = tf.keras.Model(ids, tf.keras.layers.Dense(2)(tf.cast(ids, "float32")))
    assert est_lib.dense_sum_note(plain, mwms) is None
