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
# The moved run's steps per optimizer: Nadam's at a step where empty averages,
# bias-corrected for the step, would make a larger update than a fresh start.
SOURCE_STEPS = {"adam": MAX_STEPS, "nadam": 300, "sgd-adam": 300}

_TRAIN = textwrap.dedent(f"""
    import json, os, sys
    import numpy as np
    from estimator_keras import engines
    engines.prefer_legacy_keras()
    import tensorflow as tf
    from experiments.catalog import models
    from estimator_keras import checkpoints, inputs, records
    from estimator_keras.engines import base, model_dirs
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
                    lambda: model_dirs.latest_tf_checkpoint(keras3_dir, engine_name)):
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
    from experiments.catalog import models
    from estimator_keras.errors import ModelDirError
    from estimator_keras.engines.keras3.migration import check_tf_checkpoint, restore_tf_checkpoint

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

# One example sixteen times: every batch of 16 is the same batch, so the
# source engine's next step and keras3's first step see the same gradient.
_NEXT_PLAN = textwrap.dedent("""
    import os, sys
    import numpy as np
    from estimator_keras import inputs, records
    from estimator_keras.engines import base

    def data(out):
        folder = os.path.join(out, "data")
        if not os.path.exists(folder):
            split = {"x": batch(), "label": np.ones(16, np.int64)}
            records.write_dataset({"train": split, "test": split}, folder,
                                  num_shards={"train": 1, "test": 1}, progress=False)
        return folder

    def batch():
        return np.tile(np.random.default_rng(3).standard_normal((1, 4)), (16, 1)).astype(np.float32)

    # case: (the source engine's optimizer, keras3's, a learning-rate schedule?)
    CASES = {"adam": ("adam", "adam", False), "nadam": ("nadam", "nadam", False),
             "sgd-adam": ("sgd", "adam", True)}

    def learning_rate(keras, case):
        # A schedule must read the run's step after a move, not the optimizer's.
        return keras.optimizers.schedules.CosineDecay(0.01, 1000) if CASES[case][2] else 0.01

    def plan(keras, out, model_dir, max_steps, logs, case, side):
        optimizer = CASES[case][0 if side == "source" else 1]
        def build():
            x = keras.Input((4,), name="x")
            hidden = keras.layers.Dense(8, activation="relu")(x)
            return keras.Model({"x": x}, keras.layers.Dense(3, activation="softmax")(hidden))
        folder = data(out)
        return base.TrainingPlan(
            model_dir=model_dir, build_model=build, loss="sparse_categorical_crossentropy",
            metrics=lambda: ["accuracy"], optimizer=optimizer,
            learning_rate=learning_rate(keras, case),
            train_data=inputs.make_input_fn(folder, 16, training=True),
            eval_data=inputs.make_input_fn(folder, 16, training=False),
            max_steps=max_steps, eval_every_steps=3 if max_steps < 100 else 100, seed=1,
            log_every_steps=1000,
            hooks=base.TrainingHooks(logs.append, lambda *a: None))
""")

_NEXT_SOURCE = _NEXT_PLAN + textwrap.dedent("""
    import json, shutil
    from estimator_keras import engines
    engines.prefer_legacy_keras()
    import tensorflow as tf
    from estimator_keras import checkpoints

    engine_name, out, case, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    engine = engines.get_engine(engine_name)
    run_dir, moved = os.path.join(out, "next"), os.path.join(out, "moved")
    weights = {}
    for name, until in (("before", steps), ("after", steps + 1)):
        engine.train(plan(tf.keras, out, run_dir, until, [], case, "source"))
        model = plan(tf.keras, out, run_dir, until, [], case, "source").build_model()
        checkpoints.load_checkpoint_into(model, checkpoints.latest_checkpoint(run_dir))
        weights[name] = model.get_weights()
        if name == "before":
            # A rerun of a finished run: it trains nothing.
            latest = checkpoints.latest_checkpoint(run_dir)
            rerun_step = checkpoints.checkpoint_step(latest)
            shutil.copytree(run_dir, moved)
            # The Estimator's index of checkpoints holds absolute paths.
            tf.compat.v1.train.update_checkpoint_state(
                moved, os.path.join(moved, os.path.basename(latest)))
    np.savez(os.path.join(out, "source.npz"),
             *[b for b in weights["before"]], *[a for a in weights["after"]])
    print(json.dumps({"moved": moved, "rerun_step": rerun_step}))
""")

_NEXT_KERAS3 = _NEXT_PLAN + textwrap.dedent("""
    import json
    import keras
    from estimator_keras.engines.keras3 import engine as keras3, resume as keras3_resume

    import shutil, tempfile
    out, case, steps = sys.argv[1], sys.argv[3], int(sys.argv[4])
    # A copy per reader: each backend moves the source's model dir itself.
    moved = shutil.copytree(sys.argv[2], os.path.join(tempfile.mkdtemp(dir=out), "moved"))
    import tensorflow as tf
    tf.compat.v1.train.update_checkpoint_state(
        moved, os.path.join(moved, os.path.basename(tf.train.latest_checkpoint(moved))))
    logs = []
    result = keras3.Keras3Engine().train(plan(keras, out, moved, steps + 1, logs, case, "keras3"))
    source = np.load(os.path.join(out, "source.npz"))
    arrays = [source[k] for k in sorted(source.files, key=lambda k: int(k.split("_")[1]))]
    half = len(arrays) // 2
    before, after = arrays[:half], arrays[half:]
    moved_after = result.model.get_weights()

    # A fresh optimizer's first update from the same weights on the same
    # batch, at the learning rate of the run's step.
    fresh = plan(keras, out, moved, steps + 1, [], case, "keras3").build_model()
    fresh.set_weights(before)
    schedule = learning_rate(keras, case)
    rate = float(schedule(steps)) if callable(schedule) else schedule
    fresh.compile(optimizer=keras.optimizers.get(
                      {"class_name": CASES[case][1], "config": {"learning_rate": rate}}),
                  loss="sparse_categorical_crossentropy")
    fresh.train_on_batch({"x": batch()}, np.ones(16, np.int64))

    # Going on from the keras3 checkpoint just written.
    again_logs = []
    again = keras3.Keras3Engine().train(plan(keras, out, moved, steps + 2, again_logs, case,
                                             "keras3"))
    print(json.dumps({
        "step": result.global_step,
        "source_update": max(float(np.abs(a - b).max()) for a, b in zip(after, before)),
        "keras3_update": max(float(np.abs(m - b).max()) for m, b in zip(moved_after, before)),
        "difference": max(float(np.abs((m - b) - (a - b)).max())
                          for m, a, b in zip(moved_after, after, before)),
        "fresh_update": max(float(np.abs(f - b).max())
                            for f, b in zip(fresh.get_weights(), before)),
        "from_fresh": max(float(np.abs((m - b) - (f - b)).max())
                          for m, f, b in zip(moved_after, fresh.get_weights(), before)),
        "logs": logs,
        "again_step": again.global_step, "again_logs": again_logs,
        "again_iterations": keras3_resume.iterations(again.model),
        "again_rate": float(again.model.optimizer.learning_rate),
        "expected_rate": float(schedule(steps + 2)) if callable(schedule) else schedule}))
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
    assert result["difference"] < 1e-5, json.dumps(result)
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


@pytest.fixture(scope="module")
def next_step(tmp_path_factory):
    """(writer engine, case) -> (its output folder, {moved: the moved
    model dir, rerun_step: the step after a rerun of the finished run})."""
    def train(engine, case):
        out = tmp_path_factory.mktemp(f"next-{engine}-{case}")
        return out, json.loads(run(engine, _NEXT_SOURCE, engine, out, case,
                                   SOURCE_STEPS[case]).splitlines()[-1])

    getters = {case: once_per_pair(lambda engine, c=case: train(engine, c))
               for case in SOURCE_STEPS}
    return lambda engine, case: getters[case](engine)


@pytest.mark.parametrize("reader", ["keras3-tensorflow", "keras3-jax"])
@pytest.mark.parametrize("writer", ["estimator", "keras"])
def test_the_first_keras3_step_after_a_move_is_the_source_engines_next_step(
        next_step, writer, reader):
    out, written = next_step(writer, "adam")
    assert written["rerun_step"] == MAX_STEPS, written
    interpreter(reader)
    result = json.loads(run(reader, _NEXT_KERAS3, out, written["moved"], "adam",
                            MAX_STEPS).splitlines()[-1])
    assert result["step"] == MAX_STEPS + 1, result
    # Adam's moments came along: the same update, not a sign-like step of
    # several times the learning rate from zeroed moments.
    assert result["source_update"] > 1e-4, result
    assert result["difference"] < 1e-5, json.dumps(result)
    assert not any("afresh" in line for line in result["logs"]), result["logs"]
    assert result["again_step"] == MAX_STEPS + 2 and result["again_iterations"] == MAX_STEPS + 2


# Keras 3's Nadam schedules its momentum otherwise than Keras 2's; an SGD
# checkpoint has no slots for Adam. Each pair of engines meets each case once.
@pytest.mark.parametrize("writer,reader,case", [
    ("estimator", "keras3-tensorflow", "nadam"), ("keras", "keras3-jax", "nadam"),
    ("estimator", "keras3-jax", "sgd-adam"), ("keras", "keras3-tensorflow", "sgd-adam")])
def test_an_optimizer_whose_state_cannot_move_starts_afresh_while_the_step_goes_on(
        next_step, writer, reader, case):
    steps = SOURCE_STEPS[case]
    out, written = next_step(writer, case)
    interpreter(reader)
    result = json.loads(run(reader, _NEXT_KERAS3, out, written["moved"], case,
                            steps).splitlines()[-1])
    assert result["step"] == steps + 1, result
    # The first update is a fresh optimizer's at the run's learning rate (the
    # schedule at step 300), not the larger one of empty averages
    # bias-corrected as if 300 steps had filled them.
    assert result["fresh_update"] > 1e-4, result
    assert result["from_fresh"] < 1e-5, json.dumps(result)
    said = [line for line in result["logs"] if "afresh" in line]
    why = "Keras 2's Nadam schedules its momentum" if case == "nadam" else "lacks"
    assert len(said) == 1 and why in said[0] and f"at step {steps}" in said[0], result["logs"]
    # The keras3 checkpoint carries where the optimizer's count started: a
    # rerun resumes (the counter check passes), says nothing more, and the
    # schedule reads the run's step.
    assert result["again_step"] == steps + 2, result
    assert result["again_iterations"] == 2, result
    assert not any("afresh" in line for line in result["again_logs"]), result["again_logs"]
    assert abs(result["again_rate"] - result["expected_rate"]) < 1e-9, result
