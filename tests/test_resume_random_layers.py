"""Random layers across a resume. The keras3 engine's checkpoints keep the
random layers' seed states, so the default CNN (two Dropout layers) stopped
by a real SIGTERM at a random step and rerun under --deterministic ends with
the weights of a run never stopped, bit for bit. The Keras 2 engines'
checkpoints cannot keep them (tf.keras keeps a Dropout's generator out of
its checkpoints, the estimator's random ops keep their state in the
process): a --deterministic run says so at its start, naming the layers.

keras3 on TensorFlow runs in py313 (tests/environments.py), the estimator
engine in py311."""

import os
import random
import re
import signal

import numpy as np
import pytest

import docs_pages
from support import (KERAS3_BACKENDS, child_env, cli, keras3_installed,
                     latest_checkpoint_weights, signal_at_step)

# Small filters: the default CNN's layers, Dropout included, at a fraction of its cost.
CNN_HPARAMS = "filters=4,dense_units=16,log_every_steps=10"
CNN_STEPS, CNN_EVERY = 160, 80  # batches of 32: 94 an epoch of the 3000 examples
SIGTERM_STEPS = (10, 110)
PREEMPTED = 75
WARNING = re.compile(r"--deterministic: the (\w+) engine's checkpoints do not keep the random "
                     r"layers' state; (.+): their draws \(dropout masks\) start over after a "
                     r"resume, so a resumed run is not bit-identical to one never stopped")


def _cnn_args(fashion_data, engine, model_dir):
    return ["train", "fashion_mnist_cnn", "--engine", engine, "--data-dir", fashion_data,
            "--model-dir", model_dir, "--max-steps", CNN_STEPS, "--eval-every", CNN_EVERY,
            "--batch-size", 32, "--deterministic", "--hparams", CNN_HPARAMS]


def _env(backend):
    return child_env(TF_USE_LEGACY_KERAS="0", KERAS_BACKEND=backend)


def _stop_at(args, env, step, log_path):
    """Trains until a progress line at or past ``step``, then sends SIGTERM;
    returns (exit status, the last step logged)."""
    return signal_at_step(args, step, signal.SIGTERM, log_path, env=env)


@pytest.mark.slow
@pytest.mark.parametrize("backend", [p for p in KERAS3_BACKENDS if p.values[0] == "tensorflow"])
def test_a_stopped_cnn_with_dropout_ends_with_the_weights_of_one_never_stopped(
        fashion_data, tmp_path, backend):
    env = _env(backend)
    step = random.Random(f"dropout-{os.getpid()}").randrange(*SIGTERM_STEPS)
    stopped = tmp_path / "stopped"
    status, logged = _stop_at(_cnn_args(fashion_data, "keras3", stopped), env, step,
                              tmp_path / "stopped.log")
    what = f"SIGTERM at step {logged} (drawn {step})"
    assert status == PREEMPTED, (what, (tmp_path / "stopped.log").read_text()[-3000:])
    rc, _, err = cli(*_cnn_args(fashion_data, "keras3", stopped), env=env)
    assert rc == 0, err[-3000:]
    assert "resuming from" in err and not WARNING.search(err), (what, err[-3000:])
    rc, _, err = cli(*_cnn_args(fashion_data, "keras3", tmp_path / "whole"), env=env)
    assert rc == 0, err[-3000:]
    resumed = latest_checkpoint_weights(stopped)[1]
    whole = latest_checkpoint_weights(tmp_path / "whole")[1]
    assert resumed.keys() == whole.keys() and whole, (what, sorted(resumed), sorted(whole))
    for key in whole:
        np.testing.assert_array_equal(resumed[key], whole[key], err_msg=f"{what}: {key}")


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["estimator"])
def test_a_keras2_engine_names_the_random_layers_whose_masks_start_over(fashion_data, tmp_path,
                                                                        engine, request):
    args = _cnn_args(fashion_data, engine, tmp_path / "run")
    args[args.index("--max-steps") + 1] = 2
    rc, _, err = cli(*args, env=child_env(TF_USE_LEGACY_KERAS="0"))
    assert rc == 0, err[-3000:]
    warnings = WARNING.findall(err)
    assert warnings == [(engine, "dropout, dropout_1")], err[-3000:]
    docs_pages.assert_shows(request, err)  # what-survives-what.md shows the line
    # Without --deterministic nothing is promised, and nothing is said.
    args.remove("--deterministic")
    rc, _, err = cli(*args, env=child_env(TF_USE_LEGACY_KERAS="0"))
    assert rc == 0 and not WARNING.search(err), err[-3000:]


@pytest.mark.keras3_backend("tensorflow")
@pytest.mark.skipif(not keras3_installed(), reason="Keras 3 needs TensorFlow 2.16+")
@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_keras3_checkpoint_holds_the_seed_states_it_restores(tmp_path, where):
    """In the checkpoint's own file, local or remote (ram:// stands in for
    gs://); a file without them restores the weights and says which layers
    start over."""
    # pylint: disable=import-outside-toplevel  (Keras 3, which py311 lacks)
    import keras
    from estimator_keras.engines.keras3 import checkpoints, resume, seeds

    def build():
        inputs = keras.Input((4,))
        x = keras.layers.Dropout(0.5, name="drop")(keras.layers.Dense(8)(inputs))
        x = keras.layers.GaussianNoise(0.1, name="noise")(x)
        model = keras.Model(inputs, keras.layers.Dense(2)(x))
        model.compile("sgd", "sparse_categorical_crossentropy")
        return model

    def values(model):
        return [keras.ops.convert_to_numpy(v).tolist() for _, v in seeds.states(model)]

    trained = build()
    trained.fit(np.ones((24, 4)), np.zeros(24), batch_size=8, verbose=0)
    assert [layer for layer, _ in seeds.states(trained)] == ["drop", "noise"]
    assert [counter for _, counter in values(trained)] == [3, 3]  # a draw a step each
    model_dir = str(tmp_path) if where == "local" else f"ram://seeds-{os.getpid()}"
    path = checkpoints.save(trained, model_dir, step=3, keep=1)
    fresh, logged = build(), []
    assert values(fresh) != values(trained)
    assert resume.restore(fresh, path, logged.append) == 3 and not logged
    assert values(fresh) == values(trained)
    checkpoints.check_fits(build(), path)  # the seed states are not weights
    # A weights file of Keras' own, without them.
    plain = os.path.join(str(tmp_path / "plain"), checkpoints.name_of(3))
    os.makedirs(os.path.dirname(plain))
    trained.save_weights(plain)
    fresh, logged = build(), []
    resume.restore(fresh, plain, logged.append)
    assert [counter for _, counter in values(fresh)] == [0, 0]
    assert len(logged) == 1 and "random layers drop, noise" in logged[0], logged
