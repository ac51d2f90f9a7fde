"""The training runs of the accuracy table, one process each, taking turns.

Each run trains ``fashion_mnist_cnn``'s model from scratch in one
uninterrupted run (no restart between chunks) and hands the CPU back to the
parent every ``turn`` steps (:class:`benchmarks.turns.Turns`): only one run
works at a time, and the machine's drift hits all of them alike. Its clock
counts only its own turns: from the first "go" (TensorFlow already
imported, the Keras runs' arrays already loaded) to each evaluation, every
graph build, cache fill, checkpoint and evaluation included.

Kinds of run:

- ``keras_numpy``: plain Keras ``Model.fit`` on numpy arrays, as a Keras user
  writes it: ``tf.keras.optimizers.Adam(1e-3)``, batch 128, shuffled, and
  ``validation_data`` on the test arrays after every epoch;
- ``project``: the project's own path, what ``python -m experiments train
  fashion_mnist_cnn --hparams ...`` runs: the experiment's config with
  overrides, ``context.input_fns``, ``context.experiment_plan`` and the
  engine's ``train`` (evaluations reported by the plan's hooks).

Knobs a run spec may set (see :data:`RUNS`): ``precision`` (the
experiment's ``precision`` setting: "float32", "mixed_bfloat16" or "auto"),
``batch_scale`` (batch 128 x k, steps / k, learning rate x sqrt(k)),
``warmup`` (fraction of the steps with a linear learning-rate warm-up, then a
cosine decay to a tenth), ``eval_fraction`` (evaluate every this share of the
steps), ``hparams`` (more ``--hparams``), ``engine``, ``xla`` (auto-clustering
by ``TF_XLA_FLAGS``) and ``python`` ("estimator" or "keras" environment).
"""

import argparse
import dataclasses
import json
import math
import os
import re
import sys

from benchmarks import common, turns

EXPERIMENT = "fashion_mnist_cnn"
LEARNING_RATE = 1e-3

# name -> spec. Every project run trains the same model from the same seed.
RUNS = {
    "keras_numpy": {"kind": "keras_numpy", "description": "plain Keras Model.fit on numpy "
                    "arrays, Adam(1e-3), batch 128, validation every epoch (the reference)"},
    "project_default": {"kind": "project", "description": "the experiment as registered: "
                        "estimator engine, cache=auto, precision=auto, Adam 2e-3 with cosine "
                        "decay, evaluation every epoch (469 steps)"},
    "project_fp32": {"kind": "project", "precision": "float32",
                     "description": "as registered, in float32 (no bfloat16)"},
    "project_constant_lr": {"kind": "project",
                            "hparams": {"learning_rate": 0.001, "learning_rate_decay": "constant"},
                            "description": "as registered with a constant Adam 1e-3 (the "
                                           "experiment's learning rate before this table)"},
    "project_eval2000": {"kind": "project", "eval_every": 2000,
                         "description": "as registered, evaluating every 2000 steps (the "
                                        "experiment's interval before this table)"},
    "project_auto_eval1000": {"kind": "project", "eval_fraction": 1 / 6,
                              "description": "precision=auto, evaluation every 1000 steps"},
    "project_bf16": {"kind": "project", "precision": "mixed_bfloat16",
                     "description": "mixed_bfloat16 (bfloat16 compute, float32 weights and "
                                    "softmax)"},
    "project_bf16_eval1000": {"kind": "project", "precision": "mixed_bfloat16",
                              "eval_fraction": 1 / 6, "description": "mixed_bfloat16, "
                              "evaluation every 1000 steps"},
    "project_eval1000": {"kind": "project", "eval_fraction": 1 / 6,
                         "description": "evaluation every 1000 steps"},
    "project_bf16_b256_warmup": {"kind": "project", "precision": "mixed_bfloat16",
                                 "batch_scale": 2, "warmup": 0.05, "eval_fraction": 1 / 6,
                                 "description": "mixed_bfloat16, batch 256, learning rate "
                                 "x sqrt(2) with 5% warm-up and cosine decay, 3000 steps"},
    "project_reshuffle": {"kind": "project", "hparams": {"cache_shuffle": "records"},
                          "description": "as registered, with new batches every epoch from "
                                         "the cache (cache_shuffle=records: records permuted "
                                         "within runs of 64 batches) instead of the first "
                                         "epoch's batches in a new order"},
    "project_record_shuffle": {"kind": "project",
                               "hparams": {"shuffle": "record", "shuffle_buffer": 10000},
                               "description": "shuffle=record, shuffle_buffer=10000 (the "
                                              "issue-3 check: within 0.3 points); cached, so "
                                              "new batches every epoch (cache_shuffle=auto)"},
    "project_record_shuffle_first_epoch": {
        "kind": "project", "hparams": {"shuffle": "record", "shuffle_buffer": 10000,
                                       "cache_shuffle": "batches"},
        "description": "shuffle=record, shuffle_buffer=10000, cache_shuffle=batches: records "
                       "shuffled in the first epoch only, as before issue 21"},
    "project_no_cache": {"kind": "project", "hparams": {"cache": False},
                         "description": "cache=False (the library's default)"},
    "project_xla": {"kind": "project", "xla": True, "description": "XLA auto-clustering "
                    "(TF_XLA_FLAGS=--tf_xla_auto_jit=2 --tf_xla_cpu_global_jit)"},
    "project_keras_engine": {"kind": "project", "engine": "keras", "python": "keras",
                             "description": "the keras engine on TensorFlow 2.16+ with "
                                            "tf-keras"},
    "project_keras3": {"kind": "project", "engine": "keras3", "python": "keras", "keras3": True,
                       "description": "the keras3 engine: Keras 3 on the TensorFlow backend "
                                      "(TensorFlow 2.16+), the experiment as registered"},
    "keras3_numpy": {"kind": "keras_numpy", "python": "keras", "keras3": True,
                     "description": "plain Keras 3 Model.fit on numpy arrays (TensorFlow "
                                    "2.16+), as keras_numpy"},
    "project_keras3_fp32": {"kind": "project", "engine": "keras3", "python": "keras",
                            "keras3": True, "precision": "float32",
                            "description": "the keras3 engine, the experiment as registered "
                                           "but in float32"},
    "keras3_recipe": {"kind": "keras_numpy", "python": "keras", "keras3": True, "recipe": True,
                      "description": "plain Keras 3 Model.fit on numpy arrays with the "
                                     "experiment's recipe (Adam 2e-3, cosine decay to a tenth, "
                                     "batch 128, validation every epoch) at Keras' defaults: "
                                     "float32, steps_per_execution=1"},
    "keras3_recipe_spe8": {"kind": "keras_numpy", "python": "keras", "keras3": True,
                           "recipe": True, "steps_per_execution": 8,
                           "description": "keras3_recipe with steps_per_execution=8, float32"},
    "keras3_recipe_bf16_spe8": {"kind": "keras_numpy", "python": "keras", "keras3": True,
                                "recipe": True, "steps_per_execution": 8,
                                "precision": "mixed_bfloat16",
                                "description": "keras3_recipe with steps_per_execution=8 and "
                                               "mixed_bfloat16: a careful user's best"},
}
DEFAULT_RUNS = ("keras_numpy", "project_default", "project_fp32", "project_constant_lr",
                "project_reshuffle", "project_record_shuffle", "project_keras3")
# Left out of the default runs where precision "auto" is float32 (no native
# bfloat16): it would repeat project_default.
SAME_AS_DEFAULT_IN_FLOAT32 = "project_fp32"


def default_runs(auto_is_float32):
    """The runs of a full table: :data:`DEFAULT_RUNS`, less the one that
    repeats project_default where precision "auto" resolves to float32."""
    return [n for n in DEFAULT_RUNS if not (auto_is_float32 and n == SAME_AS_DEFAULT_IN_FLOAT32)]
REFERENCE = "keras_numpy"


def plan_for(name, steps, eval_fraction, turn, learning_rate=LEARNING_RATE):
    """The concrete settings of run ``name``: steps, evaluation interval,
    batch, learning rate and the turn length, from the table's ``steps``.
    Project runs start from ``learning_rate`` (the experiment's own), plain
    Keras from :data:`LEARNING_RATE`."""
    spec = dict(RUNS[name])
    if spec["kind"] == "keras_numpy" and not spec.get("recipe"):
        learning_rate = LEARNING_RATE
    scale = int(spec.get("batch_scale", 1))
    run_steps = max(1, steps // scale)
    spec.update(name=name, steps=run_steps, turn=max(1, turn // scale),
                eval_every=max(1, spec["eval_every"] // scale if "eval_every" in spec else
                               round(run_steps * spec.get("eval_fraction", eval_fraction))),
                batch_size=128 * scale, learning_rate=learning_rate * math.sqrt(scale))
    return spec


def child_env(spec):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.path.dirname(common.HERE), env.get("PYTHONPATH")) if p)
    env.pop("TF_CONFIG", None)
    if spec.get("keras3"):
        env.pop("TF_USE_LEGACY_KERAS", None)
    elif spec.get("python") == "keras":
        env["TF_USE_LEGACY_KERAS"] = "1"
    if spec.get("xla"):
        env["TF_XLA_FLAGS"] = "--tf_xla_auto_jit=2 --tf_xla_cpu_global_jit"
    return env


def start(spec, python, data, arrays_file, workdir):
    """Starts run ``spec`` under ``python``; returns its :class:`turns.Child`.
    Read its "ready" (imports done, waiting for its first turn) before
    giving any run a turn."""
    argv = [python, "-m", "benchmarks.accuracy_runs", json.dumps(spec), "--data", data,
            "--arrays", arrays_file, "--workdir", workdir]
    return turns.Child(spec["name"], argv, env=child_env(spec))


# --------------------------------------------------------------------------
# Child side


def bfloat16_builder(build):
    """``build`` computing in mixed_bfloat16, as the experiments' precision
    setting builds it."""
    from estimator_keras import precision  # pylint: disable=import-outside-toplevel

    return precision.with_policy(build, precision.MIXED_BFLOAT16)


def warmup_schedule(peak, steps, warmup):
    """Linear warm-up to ``peak`` over ``warmup`` x steps, then a cosine decay
    to a tenth of it (a built-in schedule, so checkpoints and clones of the
    optimizer need no custom objects)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    warm = max(1, int(steps * warmup))
    return tf.keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=peak / 10, decay_steps=max(1, steps - warm), alpha=0.1,
        warmup_target=peak, warmup_steps=warm)


def _project(spec, args, clock):
    from estimator_keras import engines  # pylint: disable=import-outside-toplevel

    engine_name = engines.prepare_keras(spec.get("engine") or "auto")
    common.quiet_tensorflow()
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from estimator_keras import precision  # pylint: disable=import-outside-toplevel
    from estimator_keras.engines import base  # pylint: disable=import-outside-toplevel
    from experiments.catalog import loading as catalog  # pylint: disable=import-outside-toplevel
    from experiments.catalog import registry  # pylint: disable=import-outside-toplevel
    from experiments.config import hparams  # pylint: disable=import-outside-toplevel
    from experiments.training import context  # pylint: disable=import-outside-toplevel

    catalog.load()
    engine = engines.get_engine(engine_name)
    clock.start()
    exp = registry.get(EXPERIMENT)
    overrides = {"max_steps": spec["steps"], "eval_every_steps": spec["eval_every"],
                 "log_every_steps": spec["turn"], "batch_size": spec["batch_size"],
                 "learning_rate": spec["learning_rate"], **spec.get("hparams", {})}
    if spec.get("precision"):
        overrides["precision"] = spec["precision"]
    config = hparams.with_overrides(exp.config, {k: str(v) for k, v in overrides.items()})
    tf.keras.utils.set_random_seed(config.train.seed)
    # As the runner does: shuffles seeded by the run's seed.
    train_fn, eval_fn = context.input_fns(config, args.data, seed=config.train.seed)

    def log(line):
        match = re.match(r"step (\d+)", line)
        if match:
            clock.pause(int(match.group(1)))

    def on_evaluation(checkpoint, metrics):
        del checkpoint
        clock.event(event="eval", step=int(metrics.get("global_step") or 0),
                    accuracy=float(metrics["accuracy"]), loss=float(metrics.get("loss", 0.0)))

    policy, _ = precision.resolve(config.train.precision)
    plan = context.experiment_plan(
        exp, config, policy=policy, model_dir=os.path.join(args.workdir, spec["name"]),
        train_data=train_fn,
        eval_data=eval_fn, hooks=base.TrainingHooks(log=log, on_evaluation=on_evaluation))
    changes = {}
    if spec.get("warmup"):
        changes["learning_rate"] = warmup_schedule(spec["learning_rate"], spec["steps"],
                                                   spec["warmup"])
    if changes:
        plan = dataclasses.replace(plan, **changes)
    result = engine.train(plan)
    metrics = base.plain_metrics(result.metrics or {})
    clock.done(step=result.global_step, metrics={k: v for k, v in metrics.items()
                                                 if isinstance(v, (int, float))},
               engine=engine.name, tensorflow=tf.__version__, keras=_keras_version(),
               precision=policy)


def _keras_numpy(spec, args, clock):
    import numpy as np  # pylint: disable=import-outside-toplevel

    from estimator_keras import engines  # pylint: disable=import-outside-toplevel

    # Plain Keras 3 where the spec asks: importing this package would
    # otherwise hand tf.keras to tf-keras wherever it is installed.
    engines.prepare_keras("keras3" if spec.get("keras3") else "auto")
    common.quiet_tensorflow()
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from experiments.catalog import loading as catalog  # pylint: disable=import-outside-toplevel
    from experiments.catalog import registry  # pylint: disable=import-outside-toplevel

    catalog.load()
    arrays = np.load(args.arrays)
    x, y, tx, ty = arrays["x"], arrays["y"], arrays["tx"], arrays["ty"]
    exp = registry.get(EXPERIMENT)
    clock.start()
    tf.keras.utils.set_random_seed(exp.config.train.seed)
    build = lambda: exp.build_model(exp.config.model)  # noqa: E731
    if spec.get("precision") == "mixed_bfloat16":
        build = bfloat16_builder(build)
    model = build()
    learning_rate = spec["learning_rate"]
    if spec.get("recipe"):
        # The experiment's schedule, as a Keras user writes it.
        learning_rate = tf.keras.optimizers.schedules.CosineDecay(
            learning_rate, decay_steps=spec["steps"], alpha=0.1)
    model.compile(optimizer=tf.keras.optimizers.Adam(learning_rate),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                  steps_per_execution=spec.get("steps_per_execution", 1))
    per_epoch = math.ceil(len(y) / spec["batch_size"])
    state = {"step": 0, "epoch": 0}

    class Turns(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            state["epoch"] = epoch

        def on_train_batch_end(self, batch, logs=None):
            # Once per call of the training function: ``batch`` is the call's
            # last step in the epoch (steps_per_execution steps, fewer at its end).
            before = state["step"]
            state["step"] = state["epoch"] * per_epoch + min(batch + 1, per_epoch)
            if state["step"] // spec["turn"] > before // spec["turn"]:
                clock.pause(state["step"])
            if state["step"] >= spec["steps"]:
                self.model.stop_training = True

        def on_epoch_end(self, epoch, logs=None):
            logs = logs or {}
            clock.event(event="eval", step=state["step"],
                        accuracy=float(logs["val_accuracy"]), loss=float(logs["val_loss"]))

    model.fit(x, y, batch_size=spec["batch_size"], epochs=math.ceil(spec["steps"] / per_epoch),
              validation_data=(tx, ty), shuffle=True, verbose=0, callbacks=[Turns()])
    clock.done(step=state["step"], tensorflow=tf.__version__, keras=_keras_version(),
               model_module=type(model).__module__,
               precision=spec.get("precision") or "float32")


def _keras_version():
    try:
        import keras  # pylint: disable=import-outside-toplevel
        return keras.__version__
    except ImportError:
        return None


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.accuracy_runs", allow_abbrev=False,
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", help="the run's spec, JSON")
    parser.add_argument("--data", required=True, help="dataset directory")
    parser.add_argument("--arrays", required=True, help=".npz with x, y, tx, ty")
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args(argv)
    spec = json.loads(args.spec)
    clock = turns.Turns()
    run = {"keras_numpy": _keras_numpy, "project": _project}[spec["kind"]]
    try:
        run(spec, args, clock)
    except Exception as e:  # pylint: disable=broad-except
        turns.emit({"event": "error", "error": f"{type(e).__name__}: {e}"[:1000]})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
