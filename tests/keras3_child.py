"""One keras3-engine scenario in a process of its own, for
tests/test_keras3_engine.py: Keras 3 reads KERAS_BACKEND when it is first
imported, so each backend trains in its own child.

    python tests/keras3_child.py SCENARIO DATA_DIR MODEL_DIR [JSON_OPTIONS]

Prints one line ``RESULT {...json...}`` for the test to check.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402  pylint: disable=wrong-import-position

from estimator_keras import inputs, records  # noqa: E402  pylint: disable=wrong-import-position
from estimator_keras.engines import base, keras3  # noqa: E402  pylint: disable=wrong-import-position
from estimator_keras.engines import keras3_checkpoints as ckpts  # noqa: E402  pylint: disable=wrong-import-position
from estimator_keras.engines.preemption import PreemptionWatch  # noqa: E402  pylint: disable=wrong-import-position
from estimator_keras.errors import NumericalError, Preempted  # noqa: E402  pylint: disable=wrong-import-position

NUM_FEATURES, NUM_CLASSES = 4, 3


def write_data(data_dir, n_train=384, n_test=96):
    """Three classes that a small MLP learns in a few dozen steps."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    rng = np.random.default_rng(0)

    def split(n):
        x = rng.standard_normal((n, NUM_FEATURES)).astype(np.float32)
        label = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5).astype(np.int64)
        return {"x": x, "label": label}

    records.write_dataset({"train": split(n_train), "test": split(n_test)}, data_dir,
                          num_shards=2, progress=False)


def build():
    features = keras.Input((NUM_FEATURES,), name="x")
    hidden = keras.layers.Dense(16, activation="relu")(features)
    hidden = keras.layers.Dropout(0.1)(hidden)
    # Inputs keyed as the pipeline's features are.
    return keras.Model({"x": features},
                       keras.layers.Dense(NUM_CLASSES, activation="softmax")(hidden))


def nan_loss(y_true, y_pred):
    del y_true
    return keras.ops.mean(y_pred) * float("nan")


def make_plan(data_dir, model_dir, evaluations, logs, **options):
    seed = options.pop("seed", 7)
    fields = dict(max_steps=12, eval_every_steps=5, keep_checkpoint_max=3, log_every_steps=4,
                  optimizer="adam", learning_rate=0.05, batch_size=16)
    fields.update(options)
    if fields.pop("nan", False):
        fields["loss"] = nan_loss
    early = fields.pop("early_stopping", None)
    return base.TrainingPlan(
        model_dir=model_dir, build_model=build,
        loss=fields.pop("loss", "sparse_categorical_crossentropy"),
        metrics=lambda: ["accuracy"],
        train_data=lambda input_context=None: inputs.make_dataset(
            data_dir, 16, training=True, split="train", seed=seed),
        eval_data=lambda input_context=None: inputs.make_dataset(
            data_dir, 32, training=False, split="test"),
        seed=seed, early_stopping=base.EarlyStopping(*early) if early else None,
        hooks=base.TrainingHooks(logs.append,
                                 lambda ckpt, m: evaluations.append([ckpt, dict(m)])),
        **fields)


def _steps(model_dir):
    return [ckpts.step_of(p) for p in ckpts.all_checkpoints(model_dir)]


def _optimizer_state(model):
    return float(sum(float(keras.ops.sum(keras.ops.abs(v))) for v in model.optimizer.variables
                     if "iteration" not in v.path))


def main(scenario, data_dir, model_dir, options):
    engine = keras3.Keras3Engine()
    evaluations, logs = [], []
    out = {"backend": keras.backend.backend()}
    if scenario == "data":
        write_data(data_dir)
    elif scenario == "train":
        # Fresh run, then the same run again (a no-op), then a longer one.
        plan = make_plan(data_dir, model_dir, evaluations, logs, **options)
        result = engine.train(plan)
        out.update(first=result.metrics, step=result.global_step,
                   iterations=keras3._step(result.model), checkpoint=result.checkpoint,
                   kept=_steps(model_dir), evaluations=list(evaluations))
        latest = ckpts.latest(model_dir)
        out["evaluate"] = engine.evaluate(plan, latest)
        del evaluations[:]
        again = engine.train(plan)
        out.update(again=again.metrics, again_evaluations=list(evaluations),
                   again_kept=_steps(model_dir))
        longer = engine.train(make_plan(data_dir, model_dir, evaluations, logs,
                                        **dict(options, max_steps=22)))
        out.update(longer=longer.metrics, longer_evaluations=[m["global_step"] for _, m in
                                                              evaluations[len(out["again_evaluations"]):]],
                   longer_kept=_steps(model_dir))
    elif scenario == "restore":
        # A checkpoint holds the optimizer's state: a new model gets it back.
        plan = make_plan(data_dir, model_dir, evaluations, logs, max_steps=5, **options)
        result = engine.train(plan)
        model = keras3.compile_for_keras3(plan)
        step = ckpts.restore(model, ckpts.latest(model_dir))
        out.update(step=step, iterations=keras3._step(model),
                   trained_state=_optimizer_state(result.model),
                   restored_state=_optimizer_state(model),
                   weights_equal=all(bool(keras.ops.all(a == b)) for a, b in
                                     zip(result.model.weights, model.weights)))
    elif scenario == "nan":
        try:
            engine.train(make_plan(data_dir, model_dir, evaluations, logs, nan=True, **options))
        except NumericalError as e:
            out["error"] = str(e)
    elif scenario == "early":
        result = engine.train(make_plan(data_dir, model_dir, evaluations, logs, **options))
        out.update(step=result.global_step, evaluated=[m["global_step"] for _, m in evaluations])
    elif scenario == "forever":
        # Trains until a signal: SIGKILL, or SIGTERM through a PreemptionWatch
        # as the runner enters it; the test reads the model dir and the log.
        print("STARTED", flush=True)
        plan = make_plan(data_dir, model_dir, evaluations, lambda m: print(m, flush=True),
                         **options)
        with PreemptionWatch(grace=60) as watch:
            try:
                engine.train(base_replace(plan, preemption=watch))
            except Preempted as e:
                out.update(preempted=e.step, latest=ckpts.latest(model_dir), message=str(e))
                print("RESULT " + json.dumps(out), flush=True)
                sys.exit(Preempted.exit_code)
    elif scenario == "resume":
        plan = make_plan(data_dir, model_dir, evaluations, logs, **options)
        result = engine.train(plan)
        out.update(step=result.global_step, iterations=keras3._step(result.model),
                   evaluated=[m["global_step"] for _, m in evaluations], logs=logs,
                   kept=_steps(model_dir))
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    out.setdefault("logs", logs)
    print("RESULT " + json.dumps(out), flush=True)


def base_replace(plan, **fields):
    import dataclasses  # pylint: disable=import-outside-toplevel
    return dataclasses.replace(plan, **fields)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]) if len(sys.argv) > 4 else {})
