"""One process of a JAX process group, for tests/test_jax_cluster.py: trains
a small model with the keras3 engine on generated data, each process on its
own share, and writes what it saw to OUT/process-<rank>.npz: its final
weights, the step, its log, the group's final evaluation (and on process 0
its own evaluation of the last checkpoint, alone over the whole eval split),
the ids of the examples its pipeline handed out,
(process 0) how many examples the training steps computed on, from a
metric that counts the global batch, and every file or folder Python code
created for writing while it trained (an audit hook).

    KERAS_BACKEND=jax TF_CONFIG=... python tests/jax_child.py MODEL_DIR OUT STEPS

The group comes from the environment (TF_CONFIG here), as ``train`` reads it.
"""

import json
import os
import sys

import numpy as np

from estimator_keras import engines
from estimator_keras.engines import base

BATCH = 8
EXAMPLES = 512
EVAL_EXAMPLES = 72  # 9 batches: the processes' shares differ
FEATURES = 6


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND


class Writes:
    """The paths that ``open``, ``os.open`` and ``tempfile.mkdtemp`` were
    asked to create or write while ``recording`` (Python's audit events;
    a hook cannot be removed, so it stays and is switched off)."""

    def __init__(self):
        self.paths, self.recording = [], False
        sys.addaudithook(self._hear)

    def _hear(self, event, args):
        if not self.recording:
            return
        if event == "tempfile.mkdtemp":
            self.paths.append(str(args[0]))
        elif event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            mode, flags = args[1], args[2]
            if (isinstance(mode, str) and set(mode) & set("wax+")) or (
                    mode is None and isinstance(flags, int) and flags & _WRITE_FLAGS):
                self.paths.append(os.fsdecode(args[0]))


def main(model_dir, out, steps):
    lines = []

    def log(message):
        print(message, flush=True)
        lines.append(message)

    engines.prepare_keras("keras3")
    _, group = engines.cluster_info("keras3")
    distribution = group.distribution()
    rank, processes = group.process_id, group.num_processes
    # pylint: disable=import-outside-toplevel  (after prepare_keras and the join)
    import keras
    import tensorflow as tf
    # The global batch, counted by a metric.
    from keras3_child import ExamplesSeen

    rng = np.random.default_rng(7)
    x = rng.normal(size=(EXAMPLES, FEATURES)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int64")
    ids = np.arange(EXAMPLES, dtype="int64")
    seen = set()

    def note(batch_ids):
        seen.update(batch_ids.numpy().tolist())
        return batch_ids

    def train_data(input_context=None):
        del input_context
        data = tf.data.Dataset.from_tensor_slices((x, y, ids)).shard(processes, rank)
        data = data.repeat().batch(BATCH, drop_remainder=True)
        # The ids this process's pipeline handed out (Keras reads ahead a little).
        return data.map(lambda f, label, i: (
            f, label, tf.py_function(note, [i], tf.int64))).map(lambda f, label, i: (f, label))

    def eval_data(input_context=None):
        data = tf.data.Dataset.from_tensor_slices((x[:EVAL_EXAMPLES], y[:EVAL_EXAMPLES]))
        if input_context is not None:
            data = data.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        return data.batch(BATCH)

    def build():
        inputs = keras.Input((FEATURES,))
        hidden = keras.layers.Dense(8, activation="relu")(inputs)
        return keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(hidden))

    plan = base.TrainingPlan(
        model_dir=model_dir, build_model=build, loss="sparse_categorical_crossentropy",
        metrics=lambda: ["accuracy", ExamplesSeen()], train_data=train_data, eval_data=eval_data,
        max_steps=steps, eval_every_steps=steps, batch_size=BATCH, seed=3,
        strategy=distribution, chief=group.is_writer, hooks=base.TrainingHooks(log))
    writes = Writes()
    writes.recording = True
    engine = engines.get_engine("keras3")
    result = engine.train(plan)
    writes.recording = False
    # The group's evaluation (each process its share) and process 0's own
    # evaluation of the same checkpoint, alone over the whole split.
    metrics = {k: v for k, v in (result.metrics or {}).items() if k != "global_step"}
    alone = {}
    if group.is_writer:
        alone = engine.evaluate(plan, engine.latest_checkpoint(model_dir))
        alone.pop("global_step")
    weights = result.model.get_weights()
    # The chief's training scalars: examples per epoch, as the model saw them.
    counted = -1.0
    if group.is_writer:
        for path in tf.io.gfile.glob(os.path.join(model_dir, "train", "events.*")):
            for event in tf.compat.v1.train.summary_iterator(path):
                for value in event.summary.value:
                    if value.tag == "epoch_examples_seen":
                        counted = float(tf.make_ndarray(value.tensor))
    np.savez(os.path.join(out, f"process-{rank}.npz"), step=result.global_step,
             seen=np.asarray(sorted(seen), "int64"), processes=processes, counted=counted,
             files_written=np.asarray(writes.paths, dtype=str),
             log=np.asarray(lines, dtype=str), metrics=json.dumps(metrics),
             alone=json.dumps(alone),
             **{f"w{i}": w for i, w in enumerate(weights)})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
