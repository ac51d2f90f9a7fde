"""TensorFlow's errors are reported by where they come from: only what the
input pipeline raised is called a data error (with --skip-corrupt as a way
out); an error in the model, the optimizer or a collective op is reported as
TensorFlow's, naming the op, the task and one line of its message."""

import json
import os

import numpy as np
import pytest

from estimator_keras import tf_errors
import environments
from support import ROOT, child_env, cli

# The engines this environment tests (tests/environments.py).
ENGINES = environments.engines_under_test()

# A plugin whose model fails at run time, in a Reshape inside the model.
BAD_MODEL_MODULE = """
from experiments import DataConfig, Experiment, ExperimentConfig, TrainConfig, register

def build(hparams):
    import tensorflow as tf
    inputs = tf.keras.Input((4,), name="x")
    hidden = tf.keras.layers.Dense(6)(inputs)
    # 6 values per example do not make rows of 5: fails in the first step.
    hidden = tf.keras.layers.Lambda(lambda t: tf.reshape(t, [-1, 5]), name="regroup")(hidden)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(2, activation="softmax")(hidden))

def build_good(hparams):
    import tensorflow as tf
    inputs = tf.keras.Input((4,), name="x")
    hidden = tf.keras.layers.Dense(6, activation="relu")(inputs)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(2, activation="softmax")(hidden))

for name, builder in (("bad_reshape", build), ("vectors_mlp", build_good)):
    register(Experiment(ExperimentConfig(
        name=name, description="vectors",
        data=DataConfig(dataset="vectors", features={"x": "x"}, shuffle="none", cache=False),
        train=TrainConfig(batch_size=8)), builder))
"""


def _vectors(root, n=64, seed=0):
    from estimator_keras import records  # pylint: disable=import-outside-toplevel
    rng = np.random.default_rng(seed)
    arrays = {"x": rng.standard_normal((n, 4)).astype(np.float32),
              "label": rng.integers(0, 2, n).astype(np.int64)}
    path = str(root / "vectors")
    records.write_dataset({"train": arrays, "test": arrays}, path, num_shards=1,
                          progress=False, name="vectors",
                          labels={"label": {"num_classes": 2, "class_names": None}})
    return path


def _spoil_record(dataset, shard, index):
    """Rewrites record ``index`` of a shard without its label (and the
    shard's size in the manifest, as a writer of its own would): the file
    frames and checks out, the record does not parse to the schema."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    path = os.path.join(dataset, shard)
    found = [r.numpy() for r in tf.data.TFRecordDataset(path)]
    example = tf.train.Example.FromString(found[index])
    del example.features.feature["label"]
    found[index] = example.SerializeToString()
    with tf.io.TFRecordWriter(path + ".tmp") as writer:
        for record in found:
            writer.write(record)
    os.replace(path + ".tmp", path)
    manifest_path = os.path.join(dataset, "dataset.json")
    with open(manifest_path) as f:
        manifest = json.load(f)
    for split in manifest["splits"].values():
        for entry in split["shards"]:
            if entry["file"] == shard:
                entry["num_bytes"] = os.path.getsize(path)
    with open(manifest_path, "w") as f:
        json.dump(manifest, f)


def _train(data_dir, model_dir, module, name, engine, *more, timeout=300):
    return cli("train", name, "--module", module, "--data-dir", data_dir, "--model-dir",
               model_dir, "--max-steps", 20, "--eval-every", 20, "--engine", engine, *more,
               timeout=timeout)


@pytest.fixture
def plugin(tmp_path):
    module = tmp_path / "causes.py"
    module.write_text(BAD_MODEL_MODULE)
    return module


# --------------------------------------------------------------------------- in process

def _in_a_step(dataset, fn):
    """Runs fn on the dataset's next batch inside a tf.function, as a
    training step does; returns the error it raised."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    iterator = iter(dataset)

    @tf.function
    def step():
        return fn(next(iterator))

    with pytest.raises((tf.errors.OpError, UnicodeDecodeError)) as info:
        step()
    return info.value


def _records(tmp_path, payloads):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    path = str(tmp_path / "r.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for payload in payloads:
            writer.write(payload)
    return path


def _example(values):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return tf.train.Example(features=tf.train.Features(feature={
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=values))})).SerializeToString()


def test_a_record_that_does_not_parse_is_the_input_pipelines(tmp_path):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    path = _records(tmp_path, [_example([1.0] * 4)] * 3 + [_example([1.0] * 3)])
    spec = {"x": tf.io.FixedLenFeature([4], tf.float32)}
    dataset = tf.data.TFRecordDataset(path).batch(4).map(lambda b: tf.io.parse_example(b, spec))
    error = _in_a_step(dataset, lambda batch: tf.reduce_sum(batch["x"]))
    assert isinstance(error, tf.errors.InvalidArgumentError)
    assert tf_errors.from_input_pipeline(error)
    assert "IteratorGetNext" in tf_errors.failed_ops(error)
    line = tf_errors.first_line(error)
    assert "Values size: 3 but output shape: [4]" in line and "[[" not in line


def test_a_record_that_is_no_example_is_the_input_pipelines(tmp_path):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    rng = np.random.default_rng(0)
    path = _records(tmp_path, [bytes(rng.integers(0, 256, 50, dtype=np.uint8))
                               for _ in range(4)])
    spec = {"x": tf.io.FixedLenFeature([4], tf.float32)}
    dataset = tf.data.TFRecordDataset(path).batch(4).map(lambda b: tf.io.parse_example(b, spec))
    error = _in_a_step(dataset, lambda batch: tf.reduce_sum(batch["x"]))
    # TensorFlow quotes the record in its message and cannot decode it.
    assert isinstance(error, UnicodeDecodeError)
    assert tf_errors.from_input_pipeline(error)


def test_a_shape_error_in_the_step_is_not_the_input_pipelines(tmp_path):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    dataset = tf.data.Dataset.from_tensor_slices(np.ones((8, 6), np.float32)).batch(4)
    error = _in_a_step(dataset, lambda batch: tf.reshape(batch, [-1, 5], name="regroup"))
    assert isinstance(error, tf.errors.InvalidArgumentError)
    assert not tf_errors.from_input_pipeline(error)
    assert tf_errors.failed_ops(error)[0].endswith("regroup")
    described = tf_errors.describe(error, task="worker-0")
    assert described.startswith("TensorFlow failed on task worker-0 in op ")
    assert "(InvalidArgumentError): Input to reshape is a tensor with 24 values" in described
    assert "\n" not in described and "File " not in described


def test_an_op_failing_outside_the_pipeline_keeps_its_type(tmp_path):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    dataset = tf.data.Dataset.from_tensor_slices(np.full((8,), np.nan, np.float32)).batch(4)
    error = _in_a_step(dataset, lambda batch: tf.debugging.check_numerics(batch, "the loss"))
    assert not tf_errors.from_input_pipeline(error)
    assert f"({type(error).__name__}): the loss : Tensor had NaN values" in \
        tf_errors.describe(error)


# --------------------------------------------------------------------------- the CLI

@pytest.mark.slow
@pytest.mark.parametrize("engine", ENGINES)
def test_records_that_do_not_parse_are_a_data_error(tmp_path, plugin, engine):
    path = _vectors(tmp_path / "data")
    _spoil_record(path, "train-00000-of-00001.tfrecord", 5)
    rc, _, err = _train(tmp_path / "data", tmp_path / "run", plugin, "vectors_mlp", engine)
    assert rc == 1, err[-3000:]
    assert "do not match the dataset's schema" in err, err[-3000:]
    assert "Feature: label (data type: int64) is required but could not be found" in err
    assert "--skip-corrupt" in err
    assert "Traceback" not in err and "TensorFlow failed" not in err


@pytest.mark.slow
@pytest.mark.parametrize("engine", ENGINES)
def test_a_shape_error_in_the_model_is_not_called_data(tmp_path, plugin, engine):
    _vectors(tmp_path / "data")
    rc, _, err = _train(tmp_path / "data", tmp_path / "run", plugin, "bad_reshape", engine)
    assert rc == 1, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: TensorFlow failed in op "), err[-3000:]
    assert "regroup" in last and "(InvalidArgumentError): Input to reshape is a tensor" in last
    for wrong in ("schema", "--skip-corrupt", "records in", "internal error", "Traceback"):
        assert wrong not in err, (wrong, err[-3000:])


@pytest.mark.slow
# The keras3 engine on TensorFlow trains in one process (a cluster needs JAX).
@pytest.mark.parametrize("engine", [e for e in ENGINES if e != "keras3"])
def test_an_error_in_a_cluster_task_names_the_task(tmp_path, plugin, engine):
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel
    _vectors(tmp_path / "data")
    logs = tmp_path / "logs"
    proc = subprocess.run(
        [sys.executable, "-m", "experiments", "cluster", "bad_reshape", "--module", str(plugin),
         "--workers", "1", "--strategy", "multi_worker_mirrored", "--engine", engine,
         "--model-dir", str(tmp_path / "run"), "--log-dir", str(logs), "--timeout", "120",
         "--quiet", "--data-dir", str(tmp_path / "data"), "--max-steps", "20",
         "--eval-every", "20"],
        cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=200)
    assert proc.returncode == 1, proc.stderr[-3000:]
    # Each task's log says what failed there: the reshape, or the other
    # task's failure reaching it through the all-reduce.
    reshape = []
    for task in ("chief-0", "worker-0"):
        text = (logs / f"{task}.log").read_text(errors="replace")
        errors = [line for line in text.splitlines() if line.startswith("error: ")]
        assert errors, text[-3000:]
        assert errors[-1].startswith(f"error: TensorFlow failed on task {task} in op "), errors
        reshape += [line for line in errors if "Input to reshape is a tensor" in line]
        assert "do not match the dataset's schema" not in text and "internal error" not in text
    assert reshape, proc.stderr[-3000:]
