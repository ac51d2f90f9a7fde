"""Optimizer state across engines, optimizer by optimizer.

Each optimizer the engines train with by name (``--optimizer``), and the
settings of SGD, RMSprop and Adam a compiled model can choose through the
API, trains a few steps on a Keras 2 engine; another engine then continues
its model dir. Where the state moves ("carried"), the next two steps are the
ones the source engine took on from the same checkpoint; where it cannot
("refused"), the run says why, once, and steps as a fresh optimizer.

Four children (tests/keras_envs.py): the estimator engine trains the
optimizers by name; the keras engine (tf-keras) continues those model dirs
and trains the API's settings; the keras3 engine on TensorFlow continues the
estimator's model dirs; Keras 3 on JAX continues the keras engine's through
:mod:`estimator_keras.engines.keras3.migration`. The batch is one example
sixteen times, with one feature 1e-4 times the others: the weights it feeds
get gradients far below RMSprop's sqrt(epsilon), where Keras 2's and Keras
3's RMSprop part.
"""

import json
import textwrap

import pytest

from keras_envs import interpreter, run

pytestmark = pytest.mark.slow

STEPS = 6  # before the move; the source and the moved run then take two more

# What a refusal says (a part of it).
RMSPROP = ("Keras 2's RMSprop without momentum divides by sqrt(v) + epsilon and Keras 3's by "
           "sqrt(v + epsilon)")
NADAM = ("Keras 2's Nadam schedules its momentum as beta_1 * (1 - 0.5 * 0.96 ** (0.004 * t)) "
         "and Keras 3's as beta_1 * (1 - 0.5 * 0.96 ** t)")
CURRENT = "holds a tf-keras v2.11+ optimizer's variables"
DECAY = "the Keras 2 optimizer decays its learning rate as lr / (1 + decay * t), decay=0.01"
ADAGRAD = ("Keras 2's Adagrad divides by sqrt(a) + epsilon and Keras 3's by sqrt(a + epsilon), "
           "which differ by")

# case -> (optimizer class, its settings, on Keras 3: None where its state is
# carried, else what the refusal says)
BY_NAME = {"adam": ("Adam", {}, None), "sgd": ("SGD", {}, None),
           "rmsprop": ("RMSprop", {}, RMSPROP), "adagrad": ("Adagrad", {}, None),
           "adamax": ("Adamax", {}, None), "nadam": ("Nadam", {}, NADAM),
           "adadelta": ("Adadelta", {}, None), "ftrl": ("Ftrl", {}, None)}
# Compiled by the user; "-current": the class of tf.keras.optimizers (tf-keras
# v2.11+), not of tf.keras.optimizers.legacy.
BY_SETTINGS = {
    "sgd-momentum": ("SGD", {"momentum": 0.9}, None),
    "sgd-nesterov": ("SGD", {"momentum": 0.9, "nesterov": True}, None),
    "rmsprop-momentum": ("RMSprop", {"momentum": 0.9}, None),
    "rmsprop-centered-momentum": ("RMSprop", {"momentum": 0.9, "centered": True}, None),
    "rmsprop-centered": ("RMSprop", {"centered": True}, RMSPROP),
    "adam-amsgrad": ("Adam", {"amsgrad": True}, None),
    "adam-current": ("Adam", {}, CURRENT),
    # Accumulators from 0: the small feature's stay far below 0.03.
    "adagrad-from-0": ("Adagrad", {"initial_accumulator_value": 0.0}, ADAGRAD),
    "adam-decay": ("Adam", {"decay": 0.01}, DECAY),
}
# Keras 3 settings other than the source's, for each API case: (settings,
# what the refusal names).
OTHER = {"sgd-momentum": ({}, "momentum=0.9 and this Keras 3 SGD momentum=0"),
         "sgd-nesterov": ({}, "momentum=0.9 and this Keras 3 SGD momentum=0"),
         "rmsprop-momentum": ({"momentum": 0.9, "rho": 0.8},
                              "rho=0.9 and this Keras 3 RMSprop rho=0.8"),
         "rmsprop-centered-momentum": ({"momentum": 0.9}, "holds optimizer slots (mg)"),
         "rmsprop-centered": ({"centered": True}, RMSPROP),
         "adam-amsgrad": ({}, "holds optimizer slots (vhat)"),
         "adam-current": ({"amsgrad": True}, CURRENT),
         "adagrad-from-0": ({}, ADAGRAD),
         "adam-decay": ({"amsgrad": True}, DECAY)}

_COMMON = textwrap.dedent("""
    import json, os, shutil, sys, tempfile
    import numpy as np
    from estimator_keras import inputs, records
    from estimator_keras.engines import base

    STEPS, LOSS = %d, "sparse_categorical_crossentropy"

    def rate(case):
        # Adadelta's steps at 0.01 are too small to tell apart.
        return 1.0 if case == "adadelta" else 0.01

    def batch():
        x = np.random.default_rng(3).standard_normal((1, 4))
        x[:, 3] *= 1e-4
        return np.tile(x, (16, 1)).astype(np.float32)

    def data(out):
        folder = os.path.join(out, "data")
        if not os.path.exists(folder):
            split = {"x": batch(), "label": np.ones(16, np.int64)}
            records.write_dataset({"train": split, "test": split}, folder,
                                  num_shards={"train": 1, "test": 1}, progress=False)
        return folder

    def build(keras):
        x = keras.Input((4,), name="x")
        hidden = keras.layers.Dense(8, activation="relu")(x)
        return keras.Model({"x": x}, keras.layers.Dense(3, activation="softmax")(hidden))

    def plan(keras, out, model_dir, max_steps, optimizer, logs=None):
        folder = data(out)
        return base.TrainingPlan(
            model_dir=model_dir, build_model=lambda: build(keras), loss=LOSS,
            metrics=lambda: [], optimizer=optimizer, learning_rate=rate(optimizer),
            train_data=inputs.make_input_fn(folder, 16, training=True),
            eval_data=inputs.make_input_fn(folder, 16, training=False),
            max_steps=max_steps, eval_every_steps=STEPS, eval_steps=1, seed=1,
            log_every_steps=1000,
            hooks=base.TrainingHooks((logs if logs is not None else []).append,
                                     lambda *a: None))

    def arrays(path):
        saved = np.load(path)
        return [saved[f"arr_{i}"] for i in range(len(saved.files))]

    def compare(case_dir, weights, fresh):
        # How far the moved run's two steps are from the source's, and
        # from a fresh optimizer's, relative to the source's.
        before = arrays(os.path.join(case_dir, "before.npz"))
        after = arrays(os.path.join(case_dir, "after.npz"))
        def gap(w):
            return max(float(np.abs((x - b) - (a - b)).max()) for x, a, b in zip(w, after, before))
        return {"source_update": max(float(np.abs(a - b).max()) for a, b in zip(after, before)),
                "difference": gap(weights),
                "fresh_difference": max(float(np.abs(f - x).max())
                                        for f, x in zip(fresh, weights)),
                "fresh_from_source": gap(fresh)}

    def copy(moved, out):
        # A copy per reader, its index pointing into it.
        import tensorflow as tf
        target = shutil.copytree(moved, os.path.join(tempfile.mkdtemp(dir=out), "moved"))
        tf.compat.v1.train.update_checkpoint_state(
            target, os.path.join(target, os.path.basename(tf.train.latest_checkpoint(target))))
        return target

    def fresh_steps(keras, weights, optimizer):
        model = build(keras)
        model.set_weights(weights)
        model.compile(optimizer=optimizer, loss=LOSS)
        for _ in range(2):
            model.train_on_batch({"x": batch()}, np.ones(16, np.int64))
        return model.get_weights()
""") % STEPS

# argv: engine, out, {case: [class, settings]}, "plan" (the engine by the
# case's name) or "api" (the keras engine's fit_and_evaluate on a model
# compiled with the legacy class and settings).
_TRAIN = textwrap.dedent("""
    def train(engine_name, out, cases, mode):
        from estimator_keras import engines
        engines.prefer_legacy_keras()
        import tensorflow as tf
        from estimator_keras import checkpoints
        from estimator_keras.engines import optimizers
        engine = engines.get_engine(engine_name)
        done = {}
        for case, (name, settings) in cases.items():
            case_dir = os.path.join(out, engine_name, case)
            run_dir, moved = os.path.join(case_dir, "run"), os.path.join(case_dir, "moved")
            for until, saved in ((STEPS, "before"), (STEPS + 2, "after")):
                if mode == "plan":
                    engine.train(plan(tf.keras, out, run_dir, until, case))
                else:
                    from estimator_keras.engines.keras.engine import fit_and_evaluate
                    def compiled():
                        model = build(tf.keras)
                        classes = (tf.keras.optimizers if case.endswith("-current")
                                   else tf.keras.optimizers.legacy)
                        optimizer = getattr(classes, name)(
                            learning_rate=rate(case), **settings)
                        model.compile(optimizer=optimizer, loss=LOSS)
                        return model
                    folder = data(out)
                    fit_and_evaluate(compiled, inputs.make_input_fn(folder, 16, training=True),
                                     inputs.make_input_fn(folder, 16, training=False),
                                     model_dir=run_dir, max_steps=until, eval_every_steps=STEPS,
                                     eval_steps=1, log=lambda line: None)
                latest = checkpoints.latest_checkpoint(run_dir)
                model = checkpoints.load_checkpoint_into(build(tf.keras), latest)
                np.savez(os.path.join(case_dir, saved + ".npz"), *model.get_weights())
                if saved == "before":
                    shutil.copytree(run_dir, moved)
                    # The Estimator's index of checkpoints holds absolute paths.
                    tf.compat.v1.train.update_checkpoint_state(
                        moved, os.path.join(moved, os.path.basename(latest)))
            done[case] = case_dir
        return {"cases": done, "optimizers": list(optimizers.OPTIMIZERS)}
""")

_ESTIMATOR = _COMMON + _TRAIN + textwrap.dedent("""
    out, cases = sys.argv[1], json.loads(sys.argv[2])
    print(json.dumps(train("estimator", out, cases, "plan")))
""")

# The keras engine: continues the estimator's model dirs (argv[3]), then
# trains the API's settings.
_KERAS = _COMMON + _TRAIN + textwrap.dedent("""
    out, cases, estimator_dirs = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    from estimator_keras import engines
    engines.prefer_legacy_keras()
    import tensorflow as tf
    from estimator_keras import checkpoints
    from estimator_keras.engines import optimizers
    continued = {}
    for case, case_dir in estimator_dirs.items():
        model_dir, logs = copy(os.path.join(case_dir, "moved"), out), []
        engines.get_engine("keras").train(plan(tf.keras, out, model_dir, STEPS + 2, case, logs))
        latest = checkpoints.latest_checkpoint(model_dir)
        weights = checkpoints.load_checkpoint_into(build(tf.keras), latest).get_weights()
        fresh = fresh_steps(tf.keras, arrays(os.path.join(case_dir, "before.npz")),
                            optimizers.keras_optimizer(case, rate(case)))
        continued[case] = dict(compare(case_dir, weights, fresh), logs=logs,
                               step=checkpoints.checkpoint_step(latest))
    trained = train("keras", out, cases, "api")
    print(json.dumps({"continued": continued, "trained": trained["cases"]}))
""")

# The keras3 engine on TensorFlow continues the estimator's model dirs.
_KERAS3_ENGINE = _COMMON + textwrap.dedent("""
    out, estimator_dirs = sys.argv[1], json.loads(sys.argv[2])
    import keras
    import tensorflow as tf
    from estimator_keras.engines import optimizers
    from estimator_keras.engines.keras3 import engine as keras3
    result = {}
    for case, case_dir in estimator_dirs.items():
        model_dir, logs = copy(os.path.join(case_dir, "moved"), out), []
        moved = keras3.Keras3Engine().train(plan(keras, out, model_dir, STEPS + 2, case, logs))
        before = arrays(os.path.join(case_dir, "before.npz"))
        fresh = fresh_steps(keras, before, optimizers.keras3_optimizer(case, rate(case)))
        result[case] = dict(compare(case_dir, moved.model.get_weights(), fresh), logs=logs,
                            step=moved.global_step)
        if case == "rmsprop":
            # The checkpoint's rms carried as it is into Keras 3's velocity
            # (what a move did before it was refused).
            model = build(keras)
            model.set_weights(before)
            model.compile(optimizer=keras.optimizers.RMSprop(rate(case)), loss=LOSS)
            model.optimizer.build(model.trainable_variables)
            model.optimizer.iterations.assign(STEPS)
            reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(
                os.path.join(case_dir, "moved")))
            slots = {v.name: v for v in model.optimizer.variables}
            layers = [layer for layer in model.layers if layer.weights]
            for index, layer in enumerate(layers):
                for weight in layer.trainable_weights:
                    slots[str(weight.path).replace("/", "_") + "_velocity"].assign(
                        reader.get_tensor(f"layer_with_weights-{index}/{weight.name}/"
                                          ".OPTIMIZER_SLOT/optimizer/rms/.ATTRIBUTES/"
                                          "VARIABLE_VALUE"))
            for _ in range(2):
                model.train_on_batch({"x": batch()}, np.ones(16, np.int64))
            result[case]["as_it_is"] = compare(case_dir, model.get_weights(), fresh)
            # The first kernel's row of the small feature: each side's step.
            after = arrays(os.path.join(case_dir, "after.npz"))
            result[case]["as_it_is"]["small_feature_steps"] = [
                float(np.abs(w[0][3] - before[0][3]).max()) for w in (after, model.get_weights())]
    print(json.dumps(result))
""")

# Keras 3 on JAX continues the keras engine's model dirs through the
# migration API, with the source's settings and with OTHER's.
_KERAS3_API = _COMMON + textwrap.dedent("""
    out, cases, other, keras_dirs = (sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]),
                                     json.loads(sys.argv[4]))
    import keras
    from estimator_keras.engines.keras3.migration import (
        restore_optimizer_state, restore_tf_checkpoint)

    def moved_model(case, case_dir, name, settings):
        model = build(keras)
        step = restore_tf_checkpoint(model, os.path.join(case_dir, "moved"))
        model.compile(optimizer=getattr(keras.optimizers, name)(learning_rate=rate(case),
                                                                **settings),
                      loss=LOSS)
        model.optimizer.build(model.trainable_variables)
        model.optimizer.iterations.assign(step)
        state = [keras.ops.convert_to_numpy(v) for v in model.optimizer.variables]
        why = restore_optimizer_state(model, os.path.join(case_dir, "moved"))
        untouched = all(np.array_equal(a, keras.ops.convert_to_numpy(v))
                        for a, v in zip(state, model.optimizer.variables))
        if why:
            # As the keras3 engine does: the optimizer starts afresh.
            model.optimizer.iterations.assign(0)
        return model, why, untouched

    result = {}
    for case, (name, settings) in cases.items():
        case_dir = keras_dirs[case]
        # Keras 3's optimizers have no inverse-time decay to set.
        settings = {k: v for k, v in settings.items() if k != "decay"}
        model, why, untouched = moved_model(case, case_dir, name, settings)
        for _ in range(2):
            model.train_on_batch({"x": batch()}, np.ones(16, np.int64))
        fresh = fresh_steps(keras, arrays(os.path.join(case_dir, "before.npz")),
                            getattr(keras.optimizers, name)(learning_rate=rate(case), **settings))
        _, other_why, other_untouched = moved_model(case, case_dir, name, other[case])
        result[case] = dict(compare(case_dir, model.get_weights(), fresh), why=why,
                            untouched=untouched, other_why=other_why,
                            other_untouched=other_untouched)
    print(json.dumps(result))
""")


def _last_json(text):
    return json.loads(text.splitlines()[-1])


@pytest.fixture(scope="module")
def moves(tmp_path_factory):
    """What each child printed: {estimator, keras, keras3, keras3_api}."""
    for pair in ("estimator", "keras", "keras3-tensorflow", "keras3-jax"):
        interpreter(pair)  # skips, with the reason, where one is missing
    out = tmp_path_factory.mktemp("optimizer-moves")
    by_name = {case: spec[:2] for case, spec in BY_NAME.items()}
    by_settings = {case: spec[:2] for case, spec in BY_SETTINGS.items()}
    estimator = _last_json(run("estimator", _ESTIMATOR, out, json.dumps(by_name)))
    keras = _last_json(run("keras", _KERAS, out, json.dumps(by_settings),
                           json.dumps(estimator["cases"])))
    keras3 = _last_json(run("keras3-tensorflow", _KERAS3_ENGINE, out,
                            json.dumps(estimator["cases"])))
    keras3_api = _last_json(run("keras3-jax", _KERAS3_API, out, json.dumps(by_settings),
                                json.dumps({case: spec[0] for case, spec in OTHER.items()}),
                                json.dumps(keras["trained"])))
    return {"estimator": estimator, "keras": keras, "keras3": keras3, "keras3_api": keras3_api}


def _assert_carried(result):
    # The state mattered (a fresh optimizer steps elsewhere, where the
    # optimizer keeps any), and the moved run took the source's steps.
    assert result["source_update"] > 1e-4, result
    assert result["difference"] < 1e-7 + 1e-4 * result["source_update"], result


def test_every_optimizer_the_engines_name_has_a_case(moves):
    assert sorted(moves["estimator"]["optimizers"]) == sorted(BY_NAME)


@pytest.mark.parametrize("case", sorted(BY_NAME))
def test_the_keras_engine_carries_the_estimators_optimizer_state(moves, case):
    """The same Keras 2 optimizers on both: every one's state moves."""
    result = moves["keras"]["continued"][case]
    assert result["step"] == STEPS + 2, result
    assert any(f"(step {STEPS})" in line for line in result["logs"]), result["logs"]
    _assert_carried(result)
    if case != "sgd":  # plain SGD keeps no state
        assert result["fresh_from_source"] > 10 * result["difference"] + 1e-6, result


@pytest.mark.parametrize("case", sorted(BY_NAME))
def test_the_keras3_engine_carries_each_optimizers_state_exactly_or_says_why(moves, case):
    why = BY_NAME[case][2]
    result = moves["keras3"][case]
    assert result["step"] == STEPS + 2, result
    said = [line for line in result["logs"] if "afresh" in line]
    if why is None:
        assert not said, result["logs"]
        _assert_carried(result)
        if case != "sgd":
            assert result["fresh_from_source"] > 10 * result["difference"] + 1e-6, result
    else:
        assert len(said) == 1 and why in said[0], result["logs"]
        assert f"at step {STEPS}" in said[0] and "continue with the engine that wrote" in said[0]
        # Nothing of the refused state is left: a fresh optimizer's steps.
        assert result["fresh_difference"] < 1e-6, result


def test_rmsprops_state_carried_as_it_is_would_not_take_keras2s_steps(moves):
    """Why RMSprop is refused: Keras 3's RMSprop, given the checkpoint's
    mean squares as they are, steps far from Keras 2's on the weights of the
    small feature (what a move did before)."""
    as_it_is = moves["keras3"]["rmsprop"]["as_it_is"]
    assert as_it_is["difference"] > 0.25 * as_it_is["source_update"], as_it_is
    keras2, keras3 = as_it_is["small_feature_steps"]
    assert keras2 > 10 * keras3 > 0, as_it_is


@pytest.mark.parametrize("case", sorted(BY_SETTINGS))
def test_keras3_carries_the_apis_optimizer_settings_exactly_or_says_why(moves, case):
    why = BY_SETTINGS[case][2]
    result = moves["keras3_api"][case]
    if why is None:
        assert result["why"] is None, result
        _assert_carried(result)
        assert result["fresh_from_source"] > 10 * result["difference"] + 1e-6, result
    else:
        assert why in (result["why"] or ""), result
        assert result["untouched"] and result["fresh_difference"] < 1e-6, result
    # Keras 3 settings other than the source's: refused, naming the
    # difference, nothing assigned.
    assert OTHER[case][1] in (result["other_why"] or ""), result
    assert result["other_untouched"], result
