"""A model that counts the examples training shows it, for the exact-resume
tests (tests/test_exact_resume.py): a dataset whose records carry an ``id``,
and a layer that adds one to weight ``counts[id]`` for each example that
goes through the model. The counts are a weight like any other: checkpoints
keep them, a resumed run restores them, and under a distribution strategy
they are summed over the replicas; so after training they say how often
each example was seen, whoever trained it and however often it stopped."""

import os

import numpy as np

from plugin_support import run_cli, write_module

MODULE = "ek_ids_plugin"
EXPERIMENT = "ek_ids_seen"
DATASET = "ek_ids"
TRAIN, TEST = 200, 40  # test ids follow the train ids: evaluations count elsewhere
BATCH = 16  # 13 batches an epoch, the last one of 8
TRAIN_SHARDS = 3  # of 67, 67 and 66 examples

SOURCE = f'''"""Records with an id; a model that counts the ids it sees."""

import functools
import sys

import numpy as np

from experiments import (DataConfig, Experiment, ExperimentConfig, TrainConfig, register,
                         register_dataset)

TRAIN, TEST = {TRAIN}, {TEST}


def ids(source_dir=None, download_dir=None):
    rng = np.random.default_rng(0)

    def split(first, n):
        labels = rng.integers(0, 2, n)
        vector = rng.standard_normal((n, 4)).astype(np.float32) + labels[:, None]
        return {{"vector": vector, "id": np.arange(first, first + n, dtype=np.int64),
                "label": labels}}

    return {{"train": split(0, TRAIN), "test": split(TRAIN, TEST)}}


register_dataset("{DATASET}", "a vector, its class and the example's id", ids,
                 labels={{"label": {{"num_classes": 2, "class_names": ["no", "yes"]}}}})


@functools.lru_cache(maxsize=None)
def seen_layer():
    # Defined once the engine has chosen which Keras tf.keras is.
    import tensorflow as tf

    keras = tf.keras
    keras3 = hasattr(keras, "ops")

    @keras.utils.register_keras_serializable(package="ek_ids")
    class Seen(keras.layers.Layer):
        """counts[id] += 1 for each example; passes its second input on."""

        def __init__(self, size, **kwargs):
            super().__init__(**kwargs)
            self.size = size

        def build(self, input_shape):
            self.counts = self.add_weight(
                name="counts", shape=(self.size,), initializer="zeros", trainable=False,
                aggregation="sum" if keras3 else tf.VariableAggregation.SUM)

        def call(self, inputs):
            ids, passed = inputs
            if keras3:
                ops = keras.ops
                seen = ops.sum(ops.one_hot(ops.cast(ids, "int32"), self.size), axis=0)
                self.counts.assign(self.counts + seen)
            else:
                seen = tf.reduce_sum(tf.one_hot(tf.cast(ids, tf.int32), self.size), axis=0)
                self.add_update(self.counts.assign_add(seen))
            return passed

        def get_config(self):
            return dict(super().get_config(), size=self.size)

    return Seen


# Loaded where Keras is already chosen (the keras3 engine's export child on
# TensorFlow loads the model file after importing this module): register now.
if "keras" in sys.modules:
    seen_layer()


def counter(hparams, data):
    import tensorflow as tf

    vector = tf.keras.Input(shape=(4,), name="vector")
    ident = tf.keras.Input(shape=(), name="id")
    x = seen_layer()(TRAIN + TEST, name="seen")([ident, vector])
    outputs = tf.keras.layers.Dense(2, activation="softmax")(x)
    return tf.keras.Model([vector, ident], outputs)


register(Experiment(
    config=ExperimentConfig(
        name="{EXPERIMENT}", description="counts the examples it is trained on",
        data=DataConfig(dataset="{DATASET}", features={{"vector": "vector", "id": "id"}},
                        shuffle="record", shuffle_buffer=32, cache=True),
        train=TrainConfig(batch_size={BATCH}, max_steps=60, eval_every_steps=20,
                          log_every_steps=5, optimizer="sgd", learning_rate=0.05),
        model={{}}),
    build_model=counter))
'''


def prepare(root):
    """The module written under ``root`` and a data dir holding its dataset in
    TRAIN_SHARDS train files; returns (module, data_dir)."""
    module = write_module(root, SOURCE, MODULE)
    data_dir = str(root / "data")
    rc, _, err = run_cli("--module", module, "prepare", DATASET, "--data-dir", data_dir,
                         "--shards", TRAIN_SHARDS, cwd=root, timeout=180)
    assert rc == 0, err[-3000:]
    return module, data_dir


def counts(model_dir):
    """How often each train id was seen, from the newest checkpoint of any
    engine in ``model_dir``."""
    from support import latest_checkpoint_weights  # pylint: disable=import-outside-toplevel

    path, weights = latest_checkpoint_weights(model_dir)
    found = [v for k, v in weights.items() if "seen" in k]
    if not found:
        found = _counts_variable(path)
    assert len(found) == 1, (path, sorted(weights))
    return np.rint(np.asarray(found[0], np.float64)[:TRAIN]).astype(int)


def _counts_variable(checkpoint):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    reader = tf.train.load_checkpoint(checkpoint)
    return [reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
            if "counts" in k and "OPTIMIZER" not in k]


def expected_counts(steps, batches_per_step=1, examples=TRAIN, batch=BATCH):
    """(full epochs, ids seen in the epoch under way) after ``steps`` steps
    of one pipeline: every id is seen ``full`` or ``full + 1`` times."""
    per_epoch = -(-examples // batch)
    served = steps * batches_per_step
    full, batches = divmod(served, per_epoch)
    return full, min(examples, batches * batch)


def check_once_per_epoch(seen, steps, batches_per_step=1, batch=BATCH):
    """Every id seen once per completed epoch, and the epoch under way's
    batches each once: counts are ``full`` or ``full + 1``, and exactly the
    served examples of the unfinished epoch have ``full + 1``."""
    full, partial = expected_counts(steps, batches_per_step, batch=batch)
    assert set(np.unique(seen)) <= {full, full + 1}, np.bincount(seen)
    assert int(np.sum(seen == full + 1)) == partial, (np.bincount(seen), full, partial)


def shares(data_dir, num_shards):
    """The train ids each of ``num_shards`` input pipelines reads, as the
    pipelines split the files (estimator_keras.input_order)."""
    from estimator_keras import input_order, records  # pylint: disable=import-outside-toplevel
    from estimator_keras.inputs import make_dataset  # pylint: disable=import-outside-toplevel

    resolved = records.resolve(os.path.join(str(data_dir), DATASET), "train")
    found = []
    for index in range(num_shards):
        files, by_record = input_order.pipeline_files(resolved.files, num_shards, index)
        assert not by_record
        share = records.RecordFiles(files, resolved.schema, resolved.compression)
        found.append(np.array([int(i) for batch in make_dataset(
            share, 64, training=False, features=["id"], label=None) for i in batch["id"]]))
    return found


def check_shares_once_per_epoch(seen, steps, share_ids):
    """check_once_per_epoch for each pipeline of a cluster, over its share."""
    for ids in share_ids:
        full, partial = expected_counts(steps, examples=len(ids))
        mine = seen[ids]
        assert set(np.unique(mine)) <= {full, full + 1}, (len(ids), np.bincount(mine))
        assert int(np.sum(mine == full + 1)) == partial, (len(ids), np.bincount(mine), partial)
    assert sum(len(ids) for ids in share_ids) == TRAIN == len(set(np.concatenate(share_ids)))
