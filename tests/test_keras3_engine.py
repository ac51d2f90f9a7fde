"""The keras3 engine (Keras 3 Model.fit) on the tensorflow and jax backends.

Keras 3 reads KERAS_BACKEND once, when it is first imported, and this test
process may hold Keras 2 as tf.keras (conftest prefers it for the keras
engine's tests): every training therefore runs in a child interpreter
(tests/keras3_child.py) with its backend set, bounded by a timeout. One
child per backend runs the in-process scenarios together (one backend
start-up); the signal tests need children of their own. A backend that is
not installed is skipped, and everything is skipped without Keras 3.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from estimator_keras.engines.keras3 import checkpoints as ckpts
import keras_envs
from support import KERAS3_BACKENDS, ROOT, child_env, kill_group

pytestmark = pytest.mark.slow

CHILD = os.path.join(ROOT, "tests", "keras3_child.py")
CHILD_TIMEOUT = 600


def _env(backend):
    # Keras 3 on the backend asked for; tf.keras is not what the engine uses,
    # but an estimator_keras import must not ask TensorFlow for Keras 2.
    return child_env(KERAS_BACKEND=backend, TF_USE_LEGACY_KERAS="0")


def _command(scenario, data_dir, model_dir, **options):
    return [sys.executable, CHILD, scenario, str(data_dir), str(model_dir), json.dumps(options)]


def _result(output):
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    assert lines, output[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def _run(backend, scenario, data_dir, model_dir, **options):
    proc = subprocess.run(_command(scenario, data_dir, model_dir, **options), cwd=ROOT,
                          env=_env(backend), capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return _result(proc.stdout)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """Three classes of 4 features that a small MLP learns in a few dozen steps."""
    from estimator_keras import records  # pylint: disable=import-outside-toplevel
    rng = np.random.default_rng(0)

    def split(n):
        x = rng.standard_normal((n, 4)).astype(np.float32)
        label = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5).astype(np.int64)
        return {"x": x, "label": label}

    directory = tmp_path_factory.mktemp("keras3-data") / "ds"
    records.write_dataset({"train": split(384), "test": split(96)}, str(directory),
                          num_shards=2, progress=False)
    return directory


@pytest.fixture(scope="module", params=KERAS3_BACKENDS)
def scenarios(request, data_dir, tmp_path_factory):
    """The in-process scenarios' results on one backend (see keras3_child.run_all)."""
    model_dir = tmp_path_factory.mktemp(f"keras3-{request.param}")
    out = _run(request.param, "all", data_dir, model_dir)
    assert out["backend"] == request.param
    return {name: dict(result, model_dir=model_dir / name, backend=out["backend"])
            for name, result in out.items() if isinstance(result, dict)}


def _scalars(folder):
    """tag -> [step, ...] of the scalars in a summary folder's event files."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from tensorboard.compat.proto import event_pb2  # pylint: disable=import-outside-toplevel
    found = {}
    for name in sorted(os.listdir(folder)):
        for record in tf.data.TFRecordDataset(os.path.join(folder, name)):
            event = event_pb2.Event.FromString(record.numpy())
            for value in event.summary.value:
                found.setdefault(value.tag, []).append(event.step)
    return found


def test_evaluates_every_eval_every_steps_and_stops_at_max_steps(scenarios):
    run = scenarios["train"]
    assert run["step"] == run["iterations"] == 12
    evaluated = [(os.path.basename(ckpt), m["global_step"]) for ckpt, m in run["evaluations"]]
    assert evaluated == [("ckpt-5.weights.h5", 5), ("ckpt-10.weights.h5", 10),
                         ("ckpt-12.weights.h5", 12)]
    # The majority class is half of the examples.
    assert run["first"]["accuracy"] > 0.6 and run["first"]["global_step"] == 12
    assert run["evaluations"][-1][1] == run["first"]
    assert os.path.basename(run["checkpoint"]) == "ckpt-12.weights.h5"


def test_full_calls_of_steps_at_a_cadence_they_do_not_divide(scenarios):
    run = scenarios["steps_per_call"]
    # 8 steps a call, and a shorter call ends each window of 12 and the run.
    assert run["call_ends"] == [8, 12, 20, 24, 30], run["call_ends"]
    assert run["per_call"] == run["per_call_after"] == 8
    assert run["step"] == run["iterations"] == 30
    assert run["evaluated"] == [12, 24, 30]
    assert run["kept"] == [12, 24, 30]
    # eval_steps=2 of 32 examples each: an evaluation ends with its batches,
    # not after a whole call of 8.
    assert run["examples_evaluated"] == [64.0, 64.0, 64.0]
    assert run["final_examples"] == 64.0
    progress = [line.split(",")[0] for line in run["logs"] if line.startswith("step ")]
    # A line at the call that passes a multiple of 8; the first call (to 8)
    # holds the tracing: lines start after it.
    assert progress[:2] == ["step 20/30", "step 24/30"], run["logs"]
    # The calls' lengths for other windows: as many calls as Keras makes
    # (whole calls of 8), summing to the window, one shorter length at most.
    for steps, lengths in run["lengths"].items():
        steps = int(steps)
        assert sum(lengths) == steps and len(lengths) == -(-steps // 8), (steps, lengths)
        assert len(set(lengths) - {8}) <= 1, (steps, lengths)
    assert run["lengths"]["2001"] == [8] * 244 + [7] * 7
    assert run["lengths"]["469"] == [8] * 56 + [7] * 3
    assert run["lengths"]["55"] == [8] * 6 + [7]
    assert run["lengths"]["12"] == [8, 4]
    # Resumed at 30, which is not on the cadence: 6 steps to 36.
    assert run["longer_step"] == run["longer_iterations"] == 36
    assert run["longer_evaluated"] == [36]


def test_a_model_of_one_input_takes_the_pipelines_features_without_a_warning(scenarios):
    run = scenarios["one_input"]
    # Keras 3 warns at every trace when such a model is given the features'
    # dict; the engine hands it its one tensor.
    assert run["structure_warnings"] == []
    assert run["step"] == 20 and run["evaluations"] == [10, 20]
    assert run["evaluated"] == run["metrics"]
    assert run["metrics"]["accuracy"] > 0.6, run["metrics"]


def test_keeps_the_newest_checkpoints(scenarios):
    run = scenarios["train"]
    # Saved at 0 (the start), 5, 10 and 12; keep_checkpoint_max=3.
    assert run["kept"] == [5, 10, 12]
    names = sorted(os.listdir(run["model_dir"]))
    assert [n for n in names if n.endswith(".h5")] == [
        "ckpt-15.weights.h5", "ckpt-20.weights.h5", "ckpt-22.weights.h5"]
    assert ckpts.latest(run["model_dir"]).endswith("ckpt-22.weights.h5")


def test_a_finished_run_is_a_no_op_that_reports_its_metrics(scenarios):
    run = scenarios["train"]
    assert run["again"] == run["first"] == run["evaluate"]
    assert run["again_evaluations"] == [] and run["again_kept"] == run["kept"]


def test_more_steps_continue_on_multiples_of_eval_every(scenarios):
    run = scenarios["train"]
    assert run["longer_evaluations"] == [15, 20, 22]
    assert run["longer"]["global_step"] == 22 and run["longer_kept"] == [15, 20, 22]
    assert any("resuming from" in line and "ckpt-12.weights.h5 (step 12)" in line
               for line in run["logs"])


def test_writes_tensorboard_scalars(scenarios):
    model_dir = scenarios["train"]["model_dir"]
    validation = _scalars(model_dir / "validation")
    train = _scalars(model_dir / "train")
    assert validation["epoch_accuracy"] == [5, 10, 12, 15, 20, 22]
    assert validation["epoch_loss"] == [5, 10, 12, 15, 20, 22]
    assert train["epoch_loss"] == [5, 10, 12, 15, 20, 22]


def test_a_checkpoint_holds_the_optimizer_state(scenarios):
    run = scenarios["restore"]
    assert run["step"] == run["iterations"] == 5
    assert run["trained_state"] > 0  # Adam's moments after 5 steps
    assert run["restored_state"] == run["trained_state"]
    assert run["weights_equal"]


def test_a_checkpoint_of_another_model_is_refused(scenarios):
    refused = scenarios["restore"]["refused"]
    assert refused and "ckpt-5.weights.h5 does not fit this model's architecture" in refused


def test_mirrored_strategy_on_tensorflow_only(scenarios):
    run = scenarios["mirrored"]
    if run["backend"] == "tensorflow":
        assert run["error"] is None and run["step"] == 7 and run["evaluated"] == [5, 7]
    else:
        assert "needs Keras 3 on the tensorflow backend" in run["error"]


def test_the_cosine_learning_rate_drives_a_keras3_optimizer(scenarios):
    run = scenarios["schedule"]
    assert run["optimizer"] == "Adam"
    assert run["rates"] == pytest.approx([0.1, 0.01], rel=1e-5)


def test_mixed_bfloat16_computes_in_bfloat16_with_a_float32_softmax(scenarios):
    run = scenarios["bfloat16"]
    assert run["step"] == 5 and 0.0 <= run["metrics"]["accuracy"] <= 1.0
    assert run["compute"] == ["bfloat16", "float32"]
    assert run["weights"] == ["float32"] and run["output"] == "float32"


def test_nan_loss_stops_with_the_last_good_checkpoint(scenarios):
    error = scenarios["nan"]["error"]
    # Seen at the end of the first call of Keras' training function: 5 steps
    # (the first evaluation's window), every one of them NaN.
    assert error and "step 5:" in error and "NaN or infinite" in error
    assert "ckpt-0.weights.h5" in error


def test_early_stopping_on_accuracy(scenarios):
    # Learning rate 0: accuracy never improves on step 5's; patience 10 steps.
    run = scenarios["early"]
    assert run["evaluated"] == [5, 10, 15] and run["step"] == 15


def _start(backend, scenario, data_dir, model_dir, log, **options):
    return subprocess.Popen(_command(scenario, data_dir, model_dir, **options), cwd=ROOT,
                            env=_env(backend), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def _wait_for(proc, log_path, condition, timeout=300):
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, open(log_path).read()[-3000:]
        assert time.monotonic() < deadline, open(log_path).read()[-3000:]
        time.sleep(0.1)


def _latest_step(model_dir):
    try:
        latest = ckpts.latest(str(model_dir))
    except Exception:  # pylint: disable=broad-except  (read while being written)
        return None
    return ckpts.step_of(latest) if latest else None


@pytest.mark.parametrize("backend", KERAS3_BACKENDS)
def test_sigkill_and_sigterm_resume_from_the_last_checkpoint(backend, data_dir, tmp_path):
    model_dir = tmp_path / "run"
    # 100001 shares no divisor with 5: one step per call, so the preemption
    # stops between multiples of 5 and the resume takes the short epoch.
    forever = dict(max_steps=100000, eval_every_steps=5, log_every_steps=100001)

    # SIGKILL: nothing saved but the periodic checkpoints.
    log1 = tmp_path / "killed.log"
    with open(log1, "w") as log:
        proc = _start(backend, "forever", data_dir, model_dir, log, **forever)
        try:
            _wait_for(proc, log1, lambda: (_latest_step(model_dir) or 0) >= 10)
        finally:
            kill_group(proc)
    killed_at = _latest_step(model_dir)
    assert killed_at % 5 == 0

    # The rerun resumes there; SIGTERM then saves the step just taken.
    log2 = tmp_path / "preempted.log"
    with open(log2, "w") as log:
        proc = _start(backend, "forever", data_dir, model_dir, log, **forever)
        try:
            _wait_for(proc, log2, lambda: (_latest_step(model_dir) or 0) > killed_at)
            os.kill(proc.pid, signal.SIGTERM)
            assert proc.wait(timeout=120) == 75, open(log2).read()[-3000:]
        finally:
            kill_group(proc)
    output = open(log2).read()
    assert f"resuming from {model_dir}/ckpt-{killed_at}.weights.h5 (step {killed_at})" in output
    preempted = _result(output)
    step = preempted["preempted"]
    assert step > killed_at
    assert preempted["latest"] == str(model_dir / f"ckpt-{step}.weights.h5")

    # A run to two evaluations later: from the preempted step, back on multiples of 5.
    target = (step // 5 + 2) * 5
    run = _run(backend, "resume", data_dir, model_dir, max_steps=target, eval_every_steps=5)
    assert any(f"resuming from {model_dir}/ckpt-{step}.weights.h5 (step {step})" in line
               for line in run["logs"]), run["logs"]
    assert run["step"] == run["iterations"] == target
    assert run["evaluated"] == list(range(step // 5 * 5 + 5, target + 1, 5))
    assert not [n for n in os.listdir(model_dir) if re.match(r"\.ckpt\.tmp-", n)]


# The child's model, built with Keras 2 (TF_USE_LEGACY_KERAS=1) and trained by
# the keras engine.
KERAS2_RUN = """
import json, sys
import tensorflow as tf
from estimator_keras import inputs
from estimator_keras.engines import base
from estimator_keras.engines.keras import engine as keras_engine
data_dir, model_dir = sys.argv[1:3]
def build():
    x = tf.keras.Input((4,), name="x")
    h = tf.keras.layers.Dropout(0.1)(tf.keras.layers.Dense(16, activation="relu")(x))
    return tf.keras.Model({"x": x}, tf.keras.layers.Dense(3, activation="softmax")(h))
plan = base.TrainingPlan(
    model_dir=model_dir, build_model=build, loss="sparse_categorical_crossentropy",
    metrics=lambda: ["accuracy"], max_steps=5, eval_every_steps=5, learning_rate=0.05, seed=7,
    train_data=lambda input_context=None: inputs.make_dataset(data_dir, 16, training=True,
                                                              seed=7),
    eval_data=lambda input_context=None: inputs.make_dataset(data_dir, 32, training=False,
                                                             split="test"))
print("RESULT " + json.dumps(keras_engine.KerasEngine().train(plan).metrics))
"""


@pytest.mark.parametrize("backend", KERAS3_BACKENDS)
def test_continues_a_model_dir_of_the_keras_engine(backend, data_dir, tmp_path):
    model_dir = tmp_path / "run"
    keras2 = _result(keras_envs.run("keras", KERAS2_RUN, data_dir, model_dir))
    tf_checkpoint = str(model_dir / "model.ckpt-5")
    run = _run(backend, "resume", data_dir, model_dir, max_steps=10, eval_every_steps=5,
               evaluate_first=tf_checkpoint)
    # The same weights: the same numbers, at the same step.
    assert run["evaluated_first"]["global_step"] == 5
    assert abs(run["evaluated_first"]["accuracy"] - keras2["accuracy"]) < 1e-6
    assert any(line.startswith(f"resuming from {tf_checkpoint} (step 5, a checkpoint of "
                               f"another engine") for line in run["logs"]), run["logs"]
    assert run["step"] == run["iterations"] == 10 and run["evaluated"] == [10]
    # Saved at once as keras3's, so a rerun resumes from its own checkpoints.
    assert run["kept"] == [5, 10]
