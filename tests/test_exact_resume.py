"""A run stopped at any step and resumed sees each example once per epoch,
and with --deterministic ends with the weights of a run never stopped, bit
for bit: on every engine, through the CLI, in real processes.

Each environment runs its own engines (tests/environments.py): the
estimator in py311, keras and keras3 on JAX in the keras env, keras3 on
TensorFlow in py313. The examples' ids are counted by the model itself
(tests/resume_support.py), so what is checked is what training consumed."""

import importlib.util
import os
import random
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

import resume_support
from plugin_support import plugin_env, run_cli
from support import KERAS3_BACKENDS, ROOT, latest_checkpoint_weights, signal_at_step

# A backend named with this suffix trains on the Grain input pipeline
# (data.pipeline=grain) instead of tf.data.
GRAIN = "+grain"
_NO_GRAIN = pytest.mark.skipif(importlib.util.find_spec("grain") is None,
                               reason="Grain is not installed (pip install -e '.[jax]')")
GRAIN_CASES = [pytest.param("keras3", p.values[0] + GRAIN, marks=[*p.marks, _NO_GRAIN],
                            id=f"keras3-{p.values[0]}-grain")
               for p in KERAS3_BACKENDS if p.values[0] == "jax"]
CASES = [pytest.param("estimator", None, id="estimator"),
         pytest.param("keras", None, id="keras")] + [
    pytest.param("keras3", p.values[0], marks=p.marks, id=f"keras3-{p.values[0]}")
    for p in KERAS3_BACKENDS] + GRAIN_CASES
STOPS = 3  # stops of the exactly-once run, at random steps
MLP_STEPS, MLP_EVERY = 600, 200  # the bit-identical runs: 64 batches of 32 an epoch
SIGTERM_STEPS = (30, 560)
SIGKILL_STEPS = (MLP_EVERY + 10, MLP_STEPS - 20)  # after the first periodic checkpoint
PREEMPTED = 75


def _env(engine, backend):
    # As tests/keras_envs.py sets it: TensorFlow 2.15 has no tf-keras to honour "1".
    extra = {"TF_USE_LEGACY_KERAS": "1" if engine == "keras" else "0"}
    if backend:
        extra["KERAS_BACKEND"] = backend.split("+")[0]
    return plugin_env(**extra)


def _pipeline(backend):
    """The --hparams that choose the case's input pipeline (none: the default)."""
    return ["--hparams", "pipeline=grain"] if backend and backend.endswith(GRAIN) else []


def _draw(case, low, high, count=1):
    """Random steps, seeded per run and named in every failure."""
    rng = random.Random(f"{case}-{os.getpid()}")
    return sorted(rng.sample(range(low, high), count))


@pytest.fixture(scope="module")
def ids_data(tmp_path_factory):
    return resume_support.prepare(tmp_path_factory.mktemp("ids"))


def _train_ids(ids_data, engine, backend, model_dir, steps):
    module, data_dir = ids_data
    rc, _, err = run_cli("--module", module, "train", resume_support.EXPERIMENT,
                         "--engine", engine, "--model-dir", model_dir, "--data-dir", data_dir,
                         "--max-steps", steps, *_pipeline(backend), cwd=os.path.dirname(module),
                         env=_env(engine, backend), timeout=300)
    assert rc == 0, err[-3000:]
    return err


@pytest.mark.slow
@pytest.mark.parametrize("engine,backend", CASES)
def test_a_run_stopped_three_times_sees_each_example_once_per_epoch(ids_data, tmp_path,
                                                                     engine, backend):
    """Shuffled records, interleaved files and a cache (the experiment's
    settings): stopped at 3 random steps, each rerun resumes mid-epoch."""
    final = 60  # 4 epochs of 13 batches and 8 batches of the fifth
    stops = _draw(engine + str(backend), 1, final, STOPS)
    for steps in stops + [final]:
        err = _train_ids(ids_data, engine, backend, tmp_path / "stopped", steps)
        seen = resume_support.counts(tmp_path / "stopped")
        resume_support.check_once_per_epoch(seen, steps)
        if steps != stops[0]:
            assert "the input continues at epoch" in err, (stops, err[-2000:])
    _train_ids(ids_data, engine, backend, tmp_path / "whole", final)
    # Not only once per epoch: the very order of the run never stopped.
    np.testing.assert_array_equal(resume_support.counts(tmp_path / "stopped"),
                                  resume_support.counts(tmp_path / "whole"), err_msg=str(stops))


def _mlp_flags(fashion_data, engine, backend, model_dir):
    hparams = "log_every_steps=10" + (",pipeline=grain" if _pipeline(backend) else "")
    return ("train", "fashion_mnist_mlp", "--engine", engine, "--data-dir", fashion_data,
            "--model-dir", model_dir, "--max-steps", MLP_STEPS, "--eval-every", MLP_EVERY,
            "--batch-size", 32, "--deterministic", "--hparams", hparams)


def _train_mlp(fashion_data, engine, backend, model_dir):
    proc = subprocess.run([sys.executable, "-m", "experiments",
                           *map(str, _mlp_flags(fashion_data, engine, backend, model_dir))],
                          cwd=ROOT, env=_env(engine, backend), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


def _stop_at(fashion_data, engine, backend, model_dir, step, sig, log_path):
    """Trains until a progress line at or past ``step``, then sends ``sig``;
    returns (exit status, the last step logged)."""
    return signal_at_step(_mlp_flags(fashion_data, engine, backend, model_dir), step, sig, log_path,
                          env=_env(engine, backend))


@pytest.fixture(scope="module")
def never_stopped(fashion_data, tmp_path_factory):
    """The weights of each case's run never stopped, trained once."""
    found = {}

    def weights(engine, backend):
        if (engine, backend) not in found:
            model_dir = tmp_path_factory.mktemp("never-stopped")
            _train_mlp(fashion_data, engine, backend, model_dir)
            found[engine, backend] = latest_checkpoint_weights(model_dir)[1]
        return found[engine, backend]

    return weights


def _assert_bit_identical(stopped, whole, what):
    assert stopped.keys() == whole.keys() and whole, (what, sorted(stopped), sorted(whole))
    for key in whole:
        np.testing.assert_array_equal(stopped[key], whole[key], err_msg=f"{what}: {key}")


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
# On Grain: after SIGTERM without TensorFlow, in the jax env
# (tests/test_train_without_tensorflow.py), beside the keras env's long runs.
@pytest.mark.parametrize("engine,backend", [c for c in CASES if c not in GRAIN_CASES])
def test_a_stopped_run_ends_with_the_weights_of_one_never_stopped(
        fashion_data, never_stopped, tmp_path, engine, backend, sig):
    """SIGTERM saves the step it lands on; SIGKILL loses the steps since the
    last checkpoint, which the rerun trains again on the same batches."""
    low, high = SIGTERM_STEPS if sig == "SIGTERM" else SIGKILL_STEPS
    step = _draw(f"{engine}{backend}{sig}", low, high)[0]
    model_dir = tmp_path / "stopped"
    status, logged = _stop_at(fashion_data, engine, backend, model_dir, step,
                              getattr(signal, sig), tmp_path / "stopped.log")
    expected = PREEMPTED if sig == "SIGTERM" else -signal.SIGKILL
    assert status == expected, (step, (tmp_path / "stopped.log").read_text()[-3000:])
    err = _train_mlp(fashion_data, engine, backend, model_dir)
    assert "the input continues at epoch" in err, (step, err[-2000:])
    what = f"{sig} at step {logged} (drawn {step})"
    _assert_bit_identical(latest_checkpoint_weights(model_dir)[1], never_stopped(engine, backend),
                          what)


# Clusters: a chief and a worker (multi_worker_mirrored), or 2 JAX processes.
# They split the train files (2 and 1 of 3: shares of 133 and 67 examples,
# 9 and 5 batches an epoch, so their epochs end at different steps); a step
# takes one batch from each, and the counts are summed over both.
CLUSTER_CASES = [pytest.param("estimator", None, id="estimator"),
                 pytest.param("keras", None, id="keras")] + [
    pytest.param("keras3", p.values[0], marks=p.marks, id="keras3-jax")
    for p in KERAS3_BACKENDS if p.values[0] == "jax"] + GRAIN_CASES
CLUSTER_FINAL = 24  # epochs of 9 and of 5 batches: both end mid-epoch


def _cluster(ids_data, engine, backend, tmp_path, steps):
    module, data_dir = ids_data
    rc, out, err = run_cli("--module", module, "cluster", resume_support.EXPERIMENT,
                           "--workers", "1", "--engine", engine, "--model-dir",
                           tmp_path / "model", "--log-dir", tmp_path / f"logs-{steps}",
                           "--quiet", "--timeout", "300", "--data-dir", data_dir,
                           "--max-steps", steps, *_pipeline(backend),
                           cwd=os.path.dirname(module), env=_env(engine, backend), timeout=360)
    assert rc == 0, out[-3000:] + err[-3000:]
    return "".join(p.read_text() for p in sorted((tmp_path / f"logs-{steps}").iterdir()))


@pytest.mark.slow
@pytest.mark.parametrize("engine,backend", CLUSTER_CASES)
def test_a_stopped_cluster_sees_each_example_once_per_epoch(ids_data, tmp_path, engine,
                                                            backend):
    stop = _draw(f"cluster-{engine}", 1, CLUSTER_FINAL)[0]
    shares = resume_support.shares(ids_data[1], 2)
    assert sorted(len(ids) for ids in shares) == [67, 133]
    for steps in (stop, CLUSTER_FINAL):
        logs = _cluster(ids_data, engine, backend, tmp_path, steps)
        seen = resume_support.counts(tmp_path / "model")
        try:
            resume_support.check_shares_once_per_epoch(seen, steps, shares)
        except AssertionError as e:
            raise AssertionError(f"stopped at {stop}, after step {steps}: {e}") from e
    assert re.search(r"the input continues at epoch \d+, batch \d+ of 9 \(pipeline 0\); "
                     r"epoch \d+, batch \d+ of 5 \(pipeline 1\)", logs), (stop, logs[-3000:])
