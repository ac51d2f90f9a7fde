"""Vertex AI TensorBoard follows a running job (issue 21, item 7): with
AIP_TENSORBOARD_LOG_DIR set, both engines write their summaries there as they
train. A run with the AIP_* folders Vertex sets (local ones here) is watched
while it runs: the estimator engine's training loss shows before the first
evaluation, and when either engine reports an evaluation its numbers are
already in the log dir. The run is then stopped with SIGTERM, so it never
reaches its end (where nothing is copied any more either)."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from estimator_keras import engines
from support import ROOT, child_env, kill_group

pytestmark = pytest.mark.slow

# Evaluation interval: the estimator engine's gives its training summaries
# time to show before the first evaluation; the keras engine writes its
# summaries at evaluations only.
EVERY = {"estimator": 1000, "keras": 10}
# Where each engine puts its training and evaluation summaries.
LAYOUT = {"estimator": ("", "eval"), "keras": ("train", "validation")}


def scalars(folder):
    """{step: {tag, ...}} of the scalar summaries in the event files directly
    in ``folder`` (a record still being written is left for the next look)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    found = {}
    if not os.path.isdir(folder):
        return found
    for name in sorted(os.listdir(folder)):
        if not name.startswith("events.out.tfevents"):
            continue
        try:
            for event in tf.compat.v1.train.summary_iterator(os.path.join(folder, name)):
                for value in event.summary.value:
                    if value.HasField("simple_value") or (
                            value.HasField("tensor") and not value.tensor.tensor_shape.dim
                            and value.tensor.dtype in (tf.float32.as_datatype_enum,
                                                       tf.float64.as_datatype_enum)):
                        found.setdefault(int(event.step), set()).add(value.tag)
        except tf.errors.DataLossError:
            pass
    return found


def _evaluated_steps(log_path):
    with open(log_path, encoding="utf-8", errors="replace") as f:
        return [int(s) for s in re.findall(r"evaluated step (\d+):", f.read())]


def _has_loss(found, up_to):
    return any(step <= up_to and any("loss" in tag for tag in tags)
               for step, tags in found.items())


@pytest.mark.parametrize("engine", ["estimator", "keras"])
def test_summaries_reach_the_tensorboard_dir_while_training(engine, fashion_data, tmp_path):
    if engine == "estimator" and not engines.estimator_available():
        pytest.skip("tf.estimator ends at TF 2.15")
    every = EVERY[engine]
    base = tmp_path / "job"
    logs = base / "logs"
    train_dir, eval_dir = (logs / sub if sub else logs for sub in LAYOUT[engine])
    env = child_env(AIP_MODEL_DIR=f"{base}/model/", AIP_CHECKPOINT_DIR=f"{base}/checkpoints/",
                    AIP_TENSORBOARD_LOG_DIR=f"{logs}/")
    log_path = tmp_path / "train.log"
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "experiments", "train", "fashion_mnist_mlp", "--data-dir",
             str(fashion_data), "--engine", engine, "--max-steps", "100000", "--eval-every",
             str(every), "--batch-size", "32", "--hparams", "log_every_steps=5"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    early = None
    try:
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline:
            evaluated = _evaluated_steps(log_path)
            if engine == "estimator" and early is None and not evaluated:
                if _has_loss(scalars(train_dir), every):
                    early = scalars(train_dir)
            if evaluated:
                break
            time.sleep(0.1)
        assert proc.poll() is None, log_path.read_text()[-3000:]
        assert _evaluated_steps(log_path)[:1] == [every], log_path.read_text()[-3000:]
        # Read as soon as the run said it evaluated.
        train, evaluation = scalars(train_dir), scalars(eval_dir)
        still_running = proc.poll() is None
        os.kill(proc.pid, signal.SIGTERM)  # by its PID: it saves a checkpoint and exits 75
        assert proc.wait(timeout=120) == 75, log_path.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            kill_group(proc)
    assert still_running
    if engine == "estimator":
        assert early, "no training summaries in %s before the first evaluation" % train_dir
    assert _has_loss(train, every), train
    assert {"accuracy", "loss"} <= {tag.replace("epoch_", "")
                                     for tag in evaluation.get(every, ())}, evaluation
