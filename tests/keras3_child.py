"""One keras3-engine scenario in a process of its own, for
tests/test_keras3_engine.py: Keras 3 reads KERAS_BACKEND when it is first
imported, so each backend trains in its own child.

    python tests/keras3_child.py SCENARIO DATA_DIR MODEL_DIR [JSON_OPTIONS]

Run with this tree on PYTHONPATH (support.child_env). Prints one line
``RESULT {...json...}`` for the test to check.
"""

import dataclasses
import json
import os
import sys

import keras

from estimator_keras import inputs
from estimator_keras.engines import base
from estimator_keras.engines.keras3 import engine as keras3
from estimator_keras.engines.keras3 import checkpoints as ckpts
from estimator_keras.engines.keras3 import resume as keras3_resume
from estimator_keras.distribute.preemption import PreemptionWatch
from estimator_keras.errors import ConfigError, ModelDirError, NumericalError, Preempted

NUM_FEATURES, NUM_CLASSES = 4, 3


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
    if fields.pop("mirrored", False):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        fields["strategy"] = tf.distribute.MirroredStrategy(["/cpu:0"])
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


def run_train(data_dir, model_dir, options):
    """A fresh run, the same run again (a no-op) and a longer one."""
    engine = keras3.Keras3Engine()
    evaluations, logs = [], []
    plan = make_plan(data_dir, model_dir, evaluations, logs, **options)
    result = engine.train(plan)
    out = dict(first=result.metrics, step=result.global_step,
               iterations=keras3_resume.iterations(result.model), checkpoint=result.checkpoint,
               kept=_steps(model_dir), evaluations=list(evaluations))
    out["evaluate"] = engine.evaluate(plan, ckpts.latest(model_dir))
    del evaluations[:]
    again = engine.train(plan)
    out.update(again=again.metrics, again_evaluations=list(evaluations),
               again_kept=_steps(model_dir))
    del evaluations[:]
    longer = engine.train(make_plan(data_dir, model_dir, evaluations, logs,
                                    **dict(options, max_steps=22)))
    out.update(longer=longer.metrics, longer_kept=_steps(model_dir),
               longer_evaluations=[m["global_step"] for _, m in evaluations], logs=logs)
    return out


def run_restore(data_dir, model_dir, options):
    """A checkpoint holds the optimizer's state: a new model gets it back."""
    evaluations, logs = [], []
    plan = make_plan(data_dir, model_dir, evaluations, logs, **dict(options, max_steps=5))
    result = keras3.Keras3Engine().train(plan)
    model = keras3.compile_for_keras3(plan)
    step = ckpts.restore(model, ckpts.latest(model_dir))
    other = keras.Model(model.inputs, keras.layers.Dense(NUM_CLASSES)(model.inputs[0]))
    try:
        keras3.Keras3Engine().check_compatible(other, ckpts.latest(model_dir))
        refused = None
    except ModelDirError as e:
        refused = str(e)
    return dict(step=step, iterations=keras3_resume.iterations(model), refused=refused,
                trained_state=_optimizer_state(result.model),
                restored_state=_optimizer_state(model),
                weights_equal=all(bool(keras.ops.all(a == b)) for a, b in
                                  zip(result.model.weights, model.weights)))


def run_nan(data_dir, model_dir, options):
    try:
        keras3.Keras3Engine().train(make_plan(data_dir, model_dir, [], [], nan=True, **options))
    except NumericalError as e:
        return {"error": str(e)}
    return {"error": None}


def run_early(data_dir, model_dir, options):
    """Accuracy that never improves (learning rate 0) stops the run."""
    evaluations = []
    options = dict(dict(optimizer="sgd", learning_rate=0.0, max_steps=100,
                        early_stopping=["accuracy", 10, True]), **options)
    result = keras3.Keras3Engine().train(make_plan(data_dir, model_dir, evaluations, [],
                                                   **options))
    return dict(step=result.global_step, evaluated=[m["global_step"] for _, m in evaluations])


def run_mirrored(data_dir, model_dir, options):
    """MirroredStrategy over this machine's CPU: trains on the tensorflow
    backend; any other backend refuses it with ConfigError."""
    evaluations = []
    try:
        result = keras3.Keras3Engine().train(make_plan(
            data_dir, model_dir, evaluations, [], **dict(dict(mirrored=True, max_steps=7),
                                                         **options)))
    except ConfigError as e:
        return {"error": str(e)}
    return dict(step=result.global_step, evaluated=[m["global_step"] for _, m in evaluations],
                error=None)


def run_schedule(data_dir, model_dir, options):
    """The experiments' cosine learning rate (made with tf.keras) drives a
    Keras 3 optimizer: the peak at step 0, a tenth of it at max_steps."""
    del data_dir, model_dir, options
    from estimator_keras.engines import optimizers  # pylint: disable=import-outside-toplevel
    optimizer = optimizers.keras3_optimizer("adam", optimizers.learning_rate(0.1, "cosine", 10))
    optimizer.build([keras.Variable(0.0)])
    rates = []
    for step in (0, 10):
        optimizer.iterations.assign(step)
        rates.append(float(keras.ops.convert_to_numpy(optimizer.learning_rate)))
    return {"rates": rates, "optimizer": type(optimizer).__name__}


def run_bfloat16(data_dir, model_dir, options):
    """precision mixed_bfloat16 as the runner builds it (precision.with_policy):
    the hidden layers compute in bfloat16, the softmax in float32, and the
    weights stay float32 through training and its checkpoint."""
    from estimator_keras import precision  # pylint: disable=import-outside-toplevel
    evaluations = []
    plan = dataclasses.replace(
        make_plan(data_dir, model_dir, evaluations, [], **dict(dict(max_steps=5), **options)),
        build_model=precision.with_policy(build, precision.MIXED_BFLOAT16))
    result = keras3.Keras3Engine().train(plan)
    layers = [layer for layer in result.model.layers if layer.weights]
    return dict(step=result.global_step, metrics=result.metrics,
                compute=[layer.compute_dtype for layer in layers],
                weights=sorted({v.dtype for v in result.model.weights}),
                output=str(keras.ops.convert_to_numpy(result.model(
                    {"x": keras.ops.zeros((2, NUM_FEATURES))})).dtype))


class ExamplesSeen(keras.metrics.Sum):
    """Examples in the batches a training or an evaluation computed on."""

    def __init__(self):
        super().__init__(name="examples_seen")

    def update_state(self, y_true, y_pred, sample_weight=None):
        del y_pred, sample_weight
        return super().update_state(keras.ops.ones_like(keras.ops.cast(y_true, "float32")))


class CallEnds(keras.callbacks.Callback):
    """The optimizer's step at the end of each call of Keras' training function."""

    def __init__(self):
        super().__init__()
        self.steps = []

    def on_train_batch_end(self, batch, logs=None):
        self.steps.append(keras3_resume.iterations(self.model))


def run_steps_per_call(data_dir, model_dir, options):
    """Full calls of 8 steps at a cadence 8 does not divide: evaluations every
    12 steps, 30 steps in all, 2 eval batches; each call's end as Keras' fit
    runs it with the engine's TrainingSteps; then a resume at 30 to 36."""
    evaluations, logs = [], []
    fields = dict(options, max_steps=30, eval_every_steps=12, log_every_steps=8, eval_steps=2)
    plan = make_plan(data_dir, model_dir, evaluations, logs, **fields)
    plan = dataclasses.replace(plan, metrics=lambda: ["accuracy", ExamplesSeen()])
    result = keras3.Keras3Engine().train(plan)
    out = dict(step=result.global_step, iterations=keras3_resume.iterations(result.model),
               per_call=result.model.steps_per_execution,
               evaluated=[m["global_step"] for _, m in evaluations], kept=_steps(model_dir),
               examples_evaluated=[m["examples_seen"] for _, m in evaluations],
               final_examples=result.metrics["examples_seen"])
    del evaluations[:]
    longer = keras3.Keras3Engine().train(make_plan(data_dir, model_dir, evaluations, logs,
                                                   **dict(fields, max_steps=36)))
    # The calls themselves, on a model of its own (the engine's callback in fit).
    model = keras3.compile_for_keras3(plan, base.MAX_STEPS_PER_EXECUTION)
    meter = base.ProgressMeter(plan.log_every_steps, log=lambda line: None)
    ends = CallEnds()
    model.fit(keras3._train_data(plan, model, 0), epochs=3, steps_per_epoch=12, verbose=0,
              callbacks=[keras3.TrainingSteps(plan, meter, lambda: None, model), ends])
    return dict(out, logs=logs, longer_step=longer.global_step,
                longer_iterations=keras3_resume.iterations(longer.model),
                longer_evaluated=[m["global_step"] for _, m in evaluations],
                call_ends=ends.steps, per_call_after=model.steps_per_execution,
                lengths={s: keras3.call_lengths(s, 8) for s in (2001, 1998, 469, 56, 55, 12, 6)})


def run_one_input(data_dir, model_dir, options):
    """A model of one Input built as the experiments' builders build theirs,
    ``Model(inputs, outputs)``, on the pipeline's dict of features: trained,
    evaluated and evaluated again from its checkpoint, every warning kept."""
    import warnings  # pylint: disable=import-outside-toplevel

    def one_input():
        features = keras.Input((NUM_FEATURES,), name="x")
        return keras.Model(features, keras.layers.Dense(NUM_CLASSES, activation="softmax")(
            features))

    evaluations = []
    plan = dataclasses.replace(
        make_plan(data_dir, model_dir, evaluations, [],
                  **dict(dict(max_steps=20, eval_every_steps=10), **options)),
        build_model=one_input)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine = keras3.Keras3Engine()
        result = engine.train(plan)
        evaluated = engine.evaluate(plan, ckpts.latest(model_dir))
    return dict(step=result.global_step, metrics=result.metrics, evaluated=evaluated,
                evaluations=[m["global_step"] for _, m in evaluations],
                structure_warnings=[str(w.message) for w in caught
                                    if "structure of `inputs`" in str(w.message)])


def run_all(data_dir, model_dir, options):
    """Every in-process scenario, each in a model dir of its own: one
    interpreter (and one backend start-up) for all of them."""
    return {name: fn(data_dir, os.path.join(model_dir, name), options) for name, fn in (
        ("train", run_train), ("restore", run_restore), ("nan", run_nan), ("early", run_early),
        ("mirrored", run_mirrored), ("schedule", run_schedule), ("bfloat16", run_bfloat16),
        ("steps_per_call", run_steps_per_call), ("one_input", run_one_input))}


def run_forever(data_dir, model_dir, options):
    """Trains until a signal: SIGKILL, or SIGTERM seen by a PreemptionWatch
    entered as the runner enters it (then exit 75, as the runner's)."""
    plan = make_plan(data_dir, model_dir, [], _Printer(), **options)
    with PreemptionWatch(grace=60) as watch:
        try:
            keras3.Keras3Engine().train(dataclasses.replace(plan, preemption=watch))
        except Preempted as e:
            _report(dict(preempted=e.step, latest=ckpts.latest(model_dir), message=str(e)))
            sys.exit(Preempted.exit_code)
    return {"preempted": None}


def run_resume(data_dir, model_dir, options):
    """Continues ``model_dir``; option ``evaluate_first``: a checkpoint to
    evaluate before (e.g. another engine's)."""
    evaluations, logs = [], []
    first = options.pop("evaluate_first", None)
    engine = keras3.Keras3Engine()
    plan = make_plan(data_dir, model_dir, evaluations, logs, **options)
    out = {"evaluated_first": engine.evaluate(plan, first)} if first else {}
    result = engine.train(plan)
    return dict(out, step=result.global_step, iterations=keras3_resume.iterations(result.model),
                evaluated=[m["global_step"] for _, m in evaluations], logs=logs,
                kept=_steps(model_dir))


class _Printer(list):
    """Progress lines as they come, for a test that watches the output."""

    def append(self, line):
        print(line, flush=True)


def _report(out):
    print("RESULT " + json.dumps(dict(out, backend=keras.backend.backend())), flush=True)


SCENARIOS = {"all": run_all, "train": run_train, "restore": run_restore, "nan": run_nan,
             "early": run_early, "mirrored": run_mirrored, "schedule": run_schedule,
             "bfloat16": run_bfloat16,
             "forever": run_forever, "resume": run_resume}


if __name__ == "__main__":
    _report(SCENARIOS[sys.argv[1]](sys.argv[2], sys.argv[3],
                                   json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}))
