"""Moving a model dir from the Keras 2 engines to Keras 3: a real checkpoint
of the estimator or keras engine restores into the same builder's Keras 3
model (either backend) with equal predictions and its step; another
architecture is refused naming the layer; and the Keras 2 engines refuse a
keras3 model dir, pointing at weights.h5.

Each side runs in its own interpreter (tests/keras_envs.py).
"""

import json
import os
import re
import textwrap

import pytest

from keras_envs import interpreter, once_per_pair, run

pytestmark = pytest.mark.slow

MAX_STEPS = 6

_TRAIN = textwrap.dedent(f"""
    import json, os, sys
    import numpy as np
    from estimator_keras import engines
    engines.prefer_legacy_keras()
    import tensorflow as tf
    from experiments import models
    from estimator_keras import checkpoints, inputs, records
    from estimator_keras.engines import base
    from estimator_keras.errors import ModelDirError, UsageError

    engine_name, out = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(5)
    def split(n):
        labels = rng.integers(0, 10, n)
        images = rng.integers(0, 256, (n, 28, 28, 1)).astype(np.uint8)
        return {{"image": images, "label": labels}}
    data_dir = os.path.join(out, "data")
    records.write_dataset({{"train": split(96), "test": split(32)}}, data_dir,
                          num_shards={{"train": 1, "test": 1}}, progress=False)
    build = lambda: models.seed_cnn({{"filters": 2, "dense_units": 8}})
    def plan(model_dir):
        return base.TrainingPlan(
            model_dir=model_dir, build_model=build, loss="sparse_categorical_crossentropy",
            metrics=lambda: ["accuracy"],
            train_data=inputs.make_input_fn(data_dir, 16, training=True),
            eval_data=inputs.make_input_fn(data_dir, 16, training=False),
            max_steps={MAX_STEPS}, eval_every_steps=3, seed=1, log_every_steps=1000)
    engine = engines.get_engine(engine_name)
    model_dir = os.path.join(out, "run")
    engine.train(plan(model_dir))
    latest = checkpoints.latest_checkpoint(model_dir)
    model = build()
    checkpoints.load_checkpoint_into(model, latest)
    images = split(8)["image"]
    np.save(os.path.join(out, "images.npy"), images)
    np.save(os.path.join(out, "preds.npy"), model.predict(images.astype(np.float32), verbose=0))

    # A model dir the keras3 engine checkpointed in: refused by name, before
    # anything reads the Keras 3 file or trains.
    keras3_dir = os.path.join(out, "keras3-run")
    os.makedirs(keras3_dir)
    for step in (4, 12):
        open(os.path.join(keras3_dir, f"ckpt-{{step}}.weights.h5"), "wb").close()
    refusals = []
    for attempt in (lambda: engine.train(plan(keras3_dir)),
                    lambda: checkpoints.latest_checkpoint(keras3_dir)):
        try:
            attempt()
        except ModelDirError as e:
            # A usage error too: the CLI exits 2 on it.
            refusals.append([str(e), isinstance(e, UsageError)])
    print(json.dumps({{"checkpoint": latest, "refusals": refusals,
                      "keras3_dir": sorted(os.listdir(keras3_dir))}}))
""")

_RESTORE = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    from experiments import models
    from estimator_keras.errors import ModelDirError
    from estimator_keras.keras3_migration import check_tf_checkpoint, restore_tf_checkpoint

    out = sys.argv[1]
    model = models.seed_cnn({"filters": 2, "dense_units": 8})
    step = restore_tf_checkpoint(model, os.path.join(out, "run"))
    images = np.load(os.path.join(out, "images.npy")).astype(np.float32)
    expected = np.load(os.path.join(out, "preds.npy"))
    result = {"step": step,
              "difference": float(np.abs(model.predict(images, verbose=0) - expected).max())}
    wider = models.seed_cnn({"filters": 2, "dense_units": 12})
    before = wider.get_weights()
    for name, function in (("checked", check_tf_checkpoint), ("refused", restore_tf_checkpoint)):
        try:
            function(wider, os.path.join(out, "run"))
        except ModelDirError as e:
            result[name] = str(e)
    result["untouched"] = all(np.array_equal(a, b) for a, b in zip(before, wider.get_weights()))
    print(json.dumps(result))
""")

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """writer engine -> (its output folder, what its child printed)."""
    def train(engine):
        out = tmp_path_factory.mktemp(engine)
        return out, json.loads(run(engine, _TRAIN, engine, out).splitlines()[-1])

    return once_per_pair(train)


@pytest.mark.parametrize("reader", ["keras3-tensorflow", "keras3-jax"])
@pytest.mark.parametrize("writer", ["estimator", "keras"])
def test_a_keras2_engine_checkpoint_continues_on_keras3(trained, writer, reader):
    out, written = trained(writer)
    assert written["checkpoint"].endswith(f"-{MAX_STEPS}"), written
    interpreter(reader)
    result = json.loads(run(reader, _RESTORE, out).splitlines()[-1])
    assert result["step"] == MAX_STEPS
    assert result["difference"] < 1e-5, result
    # The first Dense of the builder has other units: named by checkpoint
    # key and layer, with both shapes; nothing assigned.
    refused = result["refused"]
    assert "does not fit this model's architecture" in refused, refused
    # (The second model built in that process: Keras names its Dense dense_1.)
    assert re.search(r"layer_with_weights-2/kernel \(layer 'dense(_\d+)?'\): "
                     r"model \(576, 12\), checkpoint \(576, 8\)", refused), refused
    assert ("layer_with_weights-3/kernel (layer 'probabilities'): model (12, 10), "
            "checkpoint (8, 10)") in refused, refused
    assert result["untouched"]
    assert result["checked"] == refused  # the check before any work says the same


@pytest.mark.parametrize("writer", ["estimator", "keras"])
def test_the_keras2_engines_refuse_a_keras3_model_dir(trained, writer):
    _, written = trained(writer)
    assert len(written["refusals"]) == 2, written
    for message, usage_error in written["refusals"]:
        assert usage_error, message
        assert "was trained by the keras3 engine" in message
        assert "ckpt-12.weights.h5" in message  # the latest by step, not by name
        assert "--engine keras3" in message
        assert os.path.join("keras3-run", "export", "weights.h5") in message
    # Nothing written beside them.
    assert written["keras3_dir"] == ["ckpt-12.weights.h5", "ckpt-4.weights.h5"]
