"""The keras table's code on tiny data (TensorFlow 2.16+ with tf-keras: the
``keras`` tox environment): the keras engine, plain tf-keras and Keras 3 in a
child interpreter all train, alternating, and the targets come out."""

import json
import os

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
    jax = keras_table.jax_python(settings)
    result = keras_table.run(settings, models=("seed_mlp",))
    rows = {row["name"]: row for row in result["rows"]}
    expected = ["engine", "engine Model.fit(make_dataset)", "tf_keras fit_numpy",
                "tf_keras fit_numpy best", "keras3 engine", "keras3 fit_numpy",
                "keras3 fit_numpy best", "keras3 fit(make_dataset)"]
    expected += ["keras3[jax] engine", "keras3[jax] fit_numpy"] if jax else []
    assert set(rows) == {f"seed_mlp {n}" for n in expected}
    for row in rows.values():
        assert not row.get("error"), row["error"]
        assert row["median"] > 0 and row["ratio"] > 0
    for name in expected:
        if name.startswith("keras3"):
            row = rows[f"seed_mlp {name}"]
            # Keras 3 itself, not the tf-keras that importing the package asks for.
            assert row["keras"].startswith("3.") and row["tf_keras"].startswith("keras."), row
            assert row["backend"] == ("jax" if "[jax]" in name else "tensorflow")
    ids = {t["id"] for t in result["targets"]}
    assert ids == {"keras.seed_mlp.vs_tf_keras_numpy", "keras.seed_mlp.vs_tf_keras_numpy_best",
                   "keras.seed_mlp.vs_keras3_numpy", "keras.seed_mlp.keras3_vs_keras3_numpy",
                   "keras.seed_mlp.keras3_vs_keras3_numpy_best"}
    assert all(t["value"] > 0 for t in result["targets"])
    assert any(n.startswith("seed_mlp: keras3 engine / plain Keras 3 fit on numpy, both on "
                            "JAX") for n in result["notes"]) == bool(jax)
    json.dumps(result)


@pytest.mark.slow
def test_grain_table_on_tiny_data(tiny, tmp_path):
    """The grain table's code, quick: the pipelines alternate in this
    process, the keras3 engine on JAX trains in three children fed by
    tf.data, Grain and one batch in memory; every row and the MLP's target
    come out."""
    from benchmarks import grain_table  # pylint: disable=import-outside-toplevel

    settings = common.Settings(data_dir=tiny, quick=True, repeats=1, window_s=0.01,
                               workdir=str(tmp_path / "work"), batch_size=16)
    # Grain's decoding processes are timed in the training child; here,
    # in-process decoding only, to keep the test short.
    result = grain_table.run(settings, path=tiny, experiments=("fashion_mnist_mlp",),
                             workers=(0,))
    rows = {row["name"]: row for row in result["rows"]}
    training = [f"fashion_mnist_mlp training, {p}" for p in ("tfdata", "grain",
                                                             "in-memory batch")]
    assert set(rows) == {"tf.data cached", "tf.data uncached", "grain workers=0",
                         "grain at its best", *training}
    for row in rows.values():
        assert not row.get("error"), (row["name"], row["error"])
        assert row["median"] > 0 and row["ratio"] > 0, row
    assert rows["grain at its best"]["workers"] == 0
    assert rows["grain workers=0"]["default"] is False
    for name in training:
        assert rows[name]["backend"] == "jax" and rows[name]["keras"].startswith("3."), rows[name]
        assert rows[name]["window_steps"] % 8 == 0
    (target,) = result["targets"]
    assert target["id"] == "grain.fashion_mnist_mlp.vs_tfdata"
    assert target["value"] > 0 and target["met"] is not None
    assert any("the same records and settings" in note for note in result["notes"])
    json.dumps(result)


def test_the_grain_table_reads_with_the_settings_train_gives_the_pipelines():
    from benchmarks import grain_table  # pylint: disable=import-outside-toplevel
    from estimator_keras.input_config import InputConfig  # pylint: disable=import-outside-toplevel
    from experiments.training import context  # pylint: disable=import-outside-toplevel

    for name in grain_table.EXPERIMENTS:
        config = grain_table.experiment(name).config
        built = context.input_config(config, seed=config.train.seed)
        assert InputConfig(**grain_table.pipeline_settings(name)) == built, name


@pytest.mark.slow
def test_engine_matrix_probes_the_keras3_engine():
    """Two of the keras3 engine's probes through `python -m experiments`: a
    rerun that resumes, and a local cluster the engine refuses."""
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel

    from support import ROOT, child_env  # pylint: disable=import-outside-toplevel

    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.engine_matrix", "--keras3-engine", "tensorflow",
         "--engine-cases", "rerun_resumes,cluster", "--timeout", "600"],
        cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=1300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = {line.split()[3]: line for line in proc.stdout.splitlines()
             if line.startswith("keras3 engine, tensorflow")}
    assert set(lines) == {"rerun_resumes", "cluster"}, proc.stdout
    assert "ok (resumed at step 10, ended at 20)" in lines["rerun_resumes"], proc.stdout
    assert "refused: error: the keras3 engine" in lines["cluster"], proc.stdout
    assert "Keras 2" not in proc.stdout


@pytest.mark.parametrize("steps", [5, 13, 30, 37])
def test_fit_numpy_steps_runs_exactly_the_steps_asked_on_keras3(steps):
    # Keras 3 goes on through the arrays from one epoch to the next and stops
    # a fit whose epoch runs past their end: 30 steps as 3 epochs of 10 over
    # a pass of 13 batches stopped after 13.
    import keras  # pylint: disable=import-outside-toplevel
    from benchmarks import training_table  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((200, 4)).astype("float32"), rng.integers(0, 3, 200)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    times = []
    timer = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: times.append(1))
    epoch = training_table.fit_numpy_steps(model, x, y, 16, steps, callbacks=[timer])
    assert len(times) == steps and epoch >= 1
    more = training_table.fit_numpy_steps(model, x, y, 16, steps, epoch, callbacks=[timer])
    assert len(times) == 2 * steps and more > epoch


@pytest.mark.parametrize("steps_per_execution", [1, 8])
def test_the_keras_tables_numpy_window_counts_steps_not_calls(steps_per_execution):
    # 13 batches a pass: calls of 8 end early at each pass's end, and the
    # last call of a shorter epoch runs past the steps asked.
    import keras  # pylint: disable=import-outside-toplevel
    from benchmarks import keras_table  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((200, 4)).astype("float32"), rng.integers(0, 3, 200)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                  steps_per_execution=steps_per_execution)
    steps, seconds, epoch = keras_table.fit_numpy_window(model, x, y, 16, 16, 30, 0)
    ran = int(model.optimizer.iterations.numpy())
    assert ran >= 46 and epoch >= 3
    # From the first call that ends at or after step 16 to the last step run.
    assert ran - 16 - steps_per_execution < steps <= ran - 16
    assert seconds > 0


def test_the_engines_window_is_the_middle_of_its_run():
    """An engine window times the steps between the lines at n and 2n of a
    3n-step run: not the start (the first trace) nor the end (where the
    keras3 engine's last calls, one step shorter, trace their function)."""
    from benchmarks import keras_table  # pylint: disable=import-outside-toplevel

    # The run's end is slow: a window over it would read 40 steps in 9 s.
    lines = [(40, 10.0), (80, 12.0), (120, 21.0)]
    assert keras_table.middle_window(lines) == (40, 2.0)
    # A line written before them (a run's first step) changes nothing.
    assert keras_table.middle_window([(8, 1.0)] + lines) == (40, 2.0)
    with pytest.raises(RuntimeError, match="three progress lines"):
        keras_table.middle_window(lines[:2])


def test_the_engines_run_first_takes_one_whole_pass_over_the_train_split(fashion_data):
    """The window starts after the first pass, which fills the cache: at
    least the split's batches, in whole progress intervals."""
    from benchmarks import keras_table  # pylint: disable=import-outside-toplevel
    from estimator_keras import manifest  # pylint: disable=import-outside-toplevel

    path = os.path.join(str(fashion_data), "fashion_mnist")
    examples = manifest.load_manifest(path).split("train").num_examples
    batches = -(-examples // 128)
    steps = keras_table.first_pass_steps(path, 128, 7)
    assert steps % 7 == 0 and batches <= steps < batches + 7
    assert keras_table.first_pass_steps(path, 128, batches) == batches


def test_an_engine_run_ends_on_a_whole_call_so_its_window_holds_no_trace(tiny, tmp_path):
    """A progress interval of 20 steps is rounded up to 24, whole calls of
    8: a run ending at a step between multiples ends in shorter calls, whose
    function is traced inside the window that sizes the table's windows."""
    from benchmarks import keras_table  # pylint: disable=import-outside-toplevel
    from estimator_keras.engines import base  # pylint: disable=import-outside-toplevel

    class Recorder:
        plans = []

        def train(self, plan):
            self.plans.append(plan)
            for step in range(plan.log_every_steps, plan.max_steps + 1, plan.log_every_steps):
                plan.hooks.log(f"step {step}: loss 1.0")

    full = base.MAX_STEPS_PER_EXECUTION
    for asked in (20, 24, 25):
        steps, _ = keras_table.engine_window(Recorder(), "seed_mlp", tiny, 16, asked,
                                             str(tmp_path / f"run-{asked}"))
        plan = Recorder.plans[-1]
        assert steps == plan.log_every_steps == -(-asked // full) * full
        assert plan.max_steps % full == 0
        assert plan.max_steps == keras_table.first_pass_steps(tiny, 16, steps) + 3 * steps
