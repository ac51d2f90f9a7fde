"""The estimator engine's randomness after a resume: a resumed run draws new
dropout masks and batches instead of replaying the first run's (its graph
seed and shuffles come from the seed and the step it resumes at), and two
fresh runs with one seed repeat each other exactly."""

import os

import numpy as np
import pytest

from estimator_keras import engines
from plugin_support import DROPOUT_EXPERIMENT, prepare_embedding_data, run_cli

pytestmark = pytest.mark.skipif(not engines.estimator_available(),
                                reason="tf.estimator needs TensorFlow 2.15")

STEP_KEY = "estimator_global_step/.ATTRIBUTES/VARIABLE_VALUE"
STEPS = 5  # the experiment's max_steps
RESUMED_AT = 700


@pytest.fixture(scope="module")
def tags(tmp_path_factory):
    return prepare_embedding_data(tmp_path_factory.mktemp("tags"))


def _train(tags, model_dir, *flags):
    module, data_dir = tags
    rc, _, err = run_cli("--module", module, "train", DROPOUT_EXPERIMENT, "--engine", "estimator",
                         "--model-dir", model_dir, "--data-dir", data_dir, *flags,
                         cwd=os.path.dirname(str(model_dir)), timeout=300)
    assert rc == 0, err[-3000:]
    return err


def _weights(model_dir, step):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    reader = tf.train.load_checkpoint(os.path.join(str(model_dir), f"model.ckpt-{step}"))
    return {k: reader.get_tensor(k) for k in sorted(reader.get_variable_to_shape_map())
            if k.startswith("layer_with_weights") and "OPTIMIZER_SLOT" not in k}


def _as_if_stopped_at(checkpoint, model_dir, step):
    """A copy of ``checkpoint`` in ``model_dir`` that says step ``step``: a
    run that resumes there starts from the same weights as the first run."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    reader = tf.train.load_checkpoint(checkpoint)
    names = sorted(reader.get_variable_to_shape_map())
    assert STEP_KEY in names, names
    tensors = [tf.constant(step, tf.int64) if n == STEP_KEY else tf.constant(reader.get_tensor(n))
               for n in names]
    os.makedirs(str(model_dir))
    prefix = os.path.join(str(model_dir), f"model.ckpt-{step}")
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=tensors)
    tf.compat.v1.train.update_checkpoint_state(str(model_dir), prefix)


def _assert_same(a, b):
    assert a.keys() == b.keys() and a
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def _differ(a, b):
    assert a.keys() == b.keys() and a
    return any(not np.array_equal(a[key], b[key]) for key in a)


@pytest.mark.slow
def test_a_resumed_estimator_run_draws_new_dropout_masks(tags, tmp_path):
    """Records in file order: the only randomness is dropout."""
    _train(tags, tmp_path / "a")
    _train(tags, tmp_path / "b")
    first = _weights(tmp_path / "a", STEPS)
    _assert_same(first, _weights(tmp_path / "b", STEPS))

    # The first run's initial weights at step 700: replayed masks (and the
    # same batches, in file order) would give the first run's weights again.
    _as_if_stopped_at(str(tmp_path / "a" / "model.ckpt-0"), tmp_path / "resumed", RESUMED_AT)
    err = _train(tags, tmp_path / "resumed", "--max-steps", RESUMED_AT + STEPS)
    assert _differ(first, _weights(tmp_path / "resumed", RESUMED_AT + STEPS))
    assert f"resuming at step {RESUMED_AT} with random seed" in err, err[-3000:]


@pytest.mark.slow
def test_a_resumed_estimator_run_draws_new_batches(tags, tmp_path):
    """No dropout, records shuffled: the only randomness is the batches."""
    flags = ("--hparams", "dropout=0,shuffle=record")
    _train(tags, tmp_path / "a", *flags)
    first = _weights(tmp_path / "a", STEPS)
    _as_if_stopped_at(str(tmp_path / "a" / "model.ckpt-0"), tmp_path / "resumed", RESUMED_AT)
    _train(tags, tmp_path / "resumed", "--max-steps", RESUMED_AT + STEPS, *flags)
    assert _differ(first, _weights(tmp_path / "resumed", RESUMED_AT + STEPS))
