"""SIGTERM (preemption) during training: a checkpoint of the current step,
exit status 75, no export, and a rerun that resumes from that step; and a
resumed run whose batches continue those of a run never stopped."""

import os
import random
import re
import signal
import time

import numpy as np
import pytest

import environments
from support import checkpoint_name, cli, latest_step, start_cli

# The engines this environment tests (tests/environments.py).
ENGINES = environments.engines_under_test()
# Each engine is signalled at one random step drawn from this range (seeded
# per run, so a failure names its step).
SIGTERM_STEPS = (40, 400)
PREEMPTED = 75
RESUMED_AT = 700  # 29 epochs of 24 batches of 128, and 4 batches of the 30th


def _progress_steps(text):
    return [int(s) for s in re.findall(r"^step (\d+)/\d+", text, re.M)]


@pytest.mark.slow
@pytest.mark.parametrize("engine", ENGINES)
def test_sigterm_saves_the_current_step_and_a_rerun_resumes(fashion_data, tmp_path, engine):
    model_dir = tmp_path / "run"
    target = random.Random(os.getpid()).randrange(*SIGTERM_STEPS)
    log_path = tmp_path / "train.log"
    common = ("train", "fashion_mnist_mlp", "--data-dir", fashion_data, "--model-dir",
              model_dir, "--eval-every", 2500, "--batch-size", 32, "--engine", engine,
              "--hparams", "log_every_steps=10")
    with open(log_path, "w") as log:
        proc = start_cli(*common, "--max-steps", 5000, log=log)
        try:
            deadline = time.monotonic() + 180
            while not [s for s in _progress_steps(log_path.read_text()) if s >= target]:
                assert proc.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, log_path.read_text()[-3000:]
                time.sleep(0.02)
            logged = max(_progress_steps(log_path.read_text()))
            os.kill(proc.pid, signal.SIGTERM)
            signalled = time.monotonic()
            returncode = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
    output = log_path.read_text()
    assert returncode == PREEMPTED, output[-3000:]
    assert time.monotonic() - signalled < 20 + 10  # the default grace, and exiting
    saved = latest_step(model_dir)
    assert saved is not None and saved >= logged, (target, logged, saved, output[-2000:])
    assert f"preempted at step {saved}; rerun the same command to resume" in output
    assert not (model_dir / "export").exists()

    rc, _, err = cli(*common, "--max-steps", saved + 40, timeout=300)
    assert rc == 0, err[-3000:]
    assert re.search(rf"resuming from {re.escape(str(model_dir))}/{checkpoint_name(saved)}",
                     err), err[-3000:]
    assert latest_step(model_dir) == saved + 40
    steps = _progress_steps(err)
    assert steps and min(steps) > saved, steps


@pytest.mark.slow
@pytest.mark.parametrize("engine", ENGINES)
def test_a_signal_while_exporting_after_the_last_step_keeps_that_step(fashion_data, tmp_path,
                                                                     engine):
    """A signal after the last step's checkpoint, while its best export is
    written: past the grace the process ends with status 75 and says the
    step is saved (not that no checkpoint could be), and the rerun writes
    the export without training."""
    model_dir = tmp_path / "run"
    log_path = tmp_path / "train.log"
    common = ("train", "fashion_mnist_mlp", "--data-dir", fashion_data, "--model-dir",
              model_dir, "--max-steps", 40, "--eval-every", 40, "--batch-size", 32,
              "--engine", engine)
    with open(log_path, "w") as log:
        proc = start_cli(*common, "--preemption-grace", 0.2, log=log)
        try:
            deadline = time.monotonic() + 240
            while "evaluated step 40:" not in log_path.read_text():
                assert proc.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, log_path.read_text()[-3000:]
                time.sleep(0.002)
            os.kill(proc.pid, signal.SIGTERM)
            returncode = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
    output = log_path.read_text()
    assert returncode == PREEMPTED, output[-3000:]
    assert "the checkpoint of step 40 is saved" in output, output[-3000:]
    assert "no checkpoint could be saved" not in output, output[-3000:]
    assert latest_step(model_dir) == 40
    rc, out, err = cli(*common, timeout=300)
    assert rc == 0, err[-3000:]
    assert "nothing to train" in out + err, out + err[-3000:]
    assert (model_dir / "export" / "export.json").exists(), sorted(os.listdir(model_dir))


@pytest.mark.slow
def test_a_resumed_run_continues_the_batches_of_a_run_never_stopped(fashion_data, tmp_path):
    """Two fresh runs with one seed see the same batches; a run resumed at
    step 700 starts with the batch a run never stopped trains step 700 on,
    with the same seed."""
    from experiments.catalog import loading as catalog  # pylint: disable=import-outside-toplevel
    from experiments.catalog import registry  # pylint: disable=import-outside-toplevel
    from experiments.training.context import RunContext  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    catalog.load()
    experiment = registry.get("fashion_mnist_mlp")

    def batches(model_dir, count):
        ctx = RunContext.build(experiment, experiment.config, model_dir=str(model_dir),
                               data_dir=str(fashion_data), engine=ENGINES[-1])
        served = [(f["image"].numpy(), l.numpy()) for f, l in ctx.train_fn().take(count)]
        return ctx.seed, served

    fresh_seed, fresh = batches(tmp_path / "a", RESUMED_AT + 1)
    again_seed, again = batches(tmp_path / "b", 3)
    assert fresh_seed == again_seed == experiment.config.train.seed
    for (images, labels), (images_again, labels_again) in zip(fresh, again):
        np.testing.assert_array_equal(images, images_again)
        np.testing.assert_array_equal(labels, labels_again)

    resumed_dir = tmp_path / "resumed"
    model = experiment.build_model(experiment.config.model)
    model.compile("adam", "sparse_categorical_crossentropy")
    model.optimizer.iterations.assign(RESUMED_AT)
    tf.train.CheckpointManager(tf.train.Checkpoint(root=model), str(resumed_dir), 1,
                               checkpoint_name="model.ckpt").save(checkpoint_number=RESUMED_AT)
    resumed_seed, resumed = batches(resumed_dir, 1)
    assert resumed_seed == fresh_seed
    np.testing.assert_array_equal(resumed[0][0], fresh[RESUMED_AT][0])
    np.testing.assert_array_equal(resumed[0][1], fresh[RESUMED_AT][1])
    assert not np.array_equal(resumed[0][1], fresh[0][1])


@pytest.mark.slow
def test_two_fresh_runs_give_identical_weights(fashion_data, tmp_path):
    import h5py  # pylint: disable=import-outside-toplevel

    weights = []
    for name in ("a", "b"):
        rc, _, err = cli("train", "fashion_mnist_cnn", "--data-dir", fashion_data,
                         "--model-dir", tmp_path / name, "--max-steps", 30, "--eval-every", 30,
                         "--batch-size", 32, timeout=300)
        assert rc == 0, err[-3000:]
        found = []
        with h5py.File(tmp_path / name / "export" / "weights.h5", "r") as f:
            f.visititems(lambda _, obj: found.append(np.array(obj))
                         if isinstance(obj, h5py.Dataset) else None)
        weights.append(found)
    assert len(weights[0]) == 8
    for a, b in zip(*weights):
        np.testing.assert_array_equal(a, b)


# A library caller that catches Preempted and goes on: its handlers are back,
# and nothing ends the process once the grace has passed.
LIBRARY_CALLER = r'''
import os, signal, sys, time
from estimator_keras.distribute import preemption
from estimator_keras.errors import Preempted

seen = []
def mine(signum, frame):
    seen.append(signum)

def preempted_once():
    with preemption.PreemptionWatch(grace=0.5) as watch:
        os.kill(os.getpid(), signal.SIGTERM)
        while not watch.requested:
            time.sleep(0.01)
        raise watch.stopped(7)

signal.signal(signal.SIGTERM, mine)
signal.signal(signal.SIGINT, mine)
try:
    preempted_once()
except Preempted as e:
    print("preempted at", e.step)
print("sigterm restored", signal.getsignal(signal.SIGTERM) is mine)
print("sigint restored", signal.getsignal(signal.SIGINT) is mine)
time.sleep(1.5)  # three times the grace
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.1)
print("handled", seen)

# A program that exits on Preempted (the command line) keeps SIGTERM ignored.
preemption.exit_on_preemption()
try:
    preempted_once()
except Preempted:
    print("exiting ignores sigterm", signal.getsignal(signal.SIGTERM) is signal.SIG_IGN)
    sys.stdout.flush()
    os._exit(75)
'''


def test_after_preempted_the_callers_signal_handlers_are_back(tmp_path):
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel
    from support import ROOT, child_env  # pylint: disable=import-outside-toplevel

    proc = subprocess.run([sys.executable, "-c", LIBRARY_CALLER], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == PREEMPTED, (proc.stdout, proc.stderr)
    assert proc.stdout.splitlines() == [
        "preempted at 7", "sigterm restored True", "sigint restored True",
        f"handled [{int(signal.SIGTERM)}]", "exiting ignores sigterm True"], proc.stderr


def test_a_child_started_with_the_stop_signals_held_outlives_a_sigterm_sent_to_it():
    """The keras3 export's SavedModel child starts in a session of its own,
    but until its setsid it is in the trial's process group with default
    handlers: tune's SIGTERM to that group (a pruned trial that has just
    begun a best-model export) killed it. Started with the stop signals
    held, it keeps them held, so a SIGTERM leaves it running; without,
    the same SIGTERM ends it at once."""
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel
    from estimator_keras.distribute import netns  # pylint: disable=import-outside-toplevel
    script = "import sys, time; print('up', flush=True); time.sleep(60)"

    def started(hold):
        if hold:
            with netns.stop_signals_held():
                proc = subprocess.Popen([sys.executable, "-c", script],
                                        stdout=subprocess.PIPE, text=True,
                                        start_new_session=True)
        else:
            proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                                    text=True, start_new_session=True)
        assert proc.stdout.readline().strip() == "up"
        os.kill(proc.pid, signal.SIGTERM)
        try:
            return proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            return None
        finally:
            proc.kill()
            proc.wait(timeout=30)
            proc.stdout.close()

    assert started(hold=False) == -signal.SIGTERM
    assert started(hold=True) is None
    # The caller's own mask is back: nothing is left held here.
    assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
