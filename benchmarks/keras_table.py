"""Table "keras": the keras engine against plain Keras ``fit`` on numpy arrays.

Runs on TensorFlow 2.16+ with tf-keras (``TF_USE_LEGACY_KERAS=1``), where
the keras engine is the only engine. For the seed MLP and the seed CNN
(batch 128, sparse cross-entropy), steady-state steps/s of:

- ``engine``: the keras engine exactly as ``python -m experiments train
  fashion_mnist_mlp`` (or ``_cnn``) runs it (``KerasEngine.train`` on the
  experiment's plan: its callbacks, checkpoints, TensorBoard summaries, the
  experiments' input pipeline with ``cache="auto"``), with **the
  experiment's own settings**: its evaluation cadence (2000 and 469 steps)
  and its precision ("auto" for the CNN: bfloat16 where the CPU has it
  natively). Each window is one fresh run with a progress line every n
  steps, n sized by the window's seconds and rounded up to whole calls of
  8 steps, so that the run ends on a whole call as the experiments' own
  6000 steps do (the evaluations stay at the experiment's cadence): the
  run first takes one pass over the train split (rounded up to a multiple
  of n), then ``3n`` steps, and the window times the middle n of those. Outside it are what a run pays once: model building, the first
  traces and the first pass, which fills the in-memory cache (a user's run
  of ten passes pays it once), and after it the run's end, where the
  engines' last calls stop exactly at ``max_steps``. The warm-up run that
  sizes n is such a run too, so n comes from the steady rate. A checkpoint
  and an evaluation the cadence puts inside are in, the evaluation as
  ``train`` runs it: the whole test split;
- ``engine Model.fit(make_dataset)``: the same compiled model (the
  engine's steps per call) and pipeline in a bare ``Model.fit``: what the
  engine's callbacks cost;
- ``tf_keras fit_numpy``: plain tf-keras ``Model.fit`` on the uint8 numpy
  arrays (``tf.keras.optimizers.Adam(1e-3)``) at Keras' defaults (float32,
  one step per call), and ``... best``: with the knobs the engines set for
  themselves, ``steps_per_execution=8`` and the experiment's precision (a
  careful user's best);
- ``keras3 fit_numpy`` (and its ``best``) and ``keras3 fit(make_dataset)``:
  plain Keras 3 in a fresh interpreter (``TF_USE_LEGACY_KERAS`` unset), on
  the same arrays and on this package's pipeline; it answers over a pipe,
  and while the other variants run it waits idle (:mod:`benchmarks.turns`).

Windows alternate as in every table; ``engine`` is the reference.
"""

import argparse
import dataclasses
import os
import re
import shutil
import sys
import tempfile
import time

from benchmarks import accuracy_runs, common, output, training_table, turns
from benchmarks.common import IMAGE, LABEL, jax_python

TABLE = "keras"
TITLE = ("keras and keras3 engines at the experiments' own cadence and precision vs plain "
         "Keras fit on numpy at its defaults and best (TF 2.16+, steps/s, batch 128)")
MODELS = ("seed_mlp", "seed_cnn")
EXPERIMENTS = {"seed_mlp": "fashion_mnist_mlp", "seed_cnn": "fashion_mnist_cnn"}
ENGINE = "engine"
LEARNING_RATE = 1e-3
# A careful user's steps_per_execution (the keras3 engine's own).
BEST_STEPS_PER_EXECUTION = 8
# The "best" targets: an engine keeps at least this share of the careful
# user's rate, like precision with like.
BEST_THRESHOLD = 1 / 1.10


def experiment(model_name):
    from experiments.catalog import loading as catalog  # pylint: disable=import-outside-toplevel
    from experiments.catalog import registry  # pylint: disable=import-outside-toplevel

    catalog.load()
    return registry.get(EXPERIMENTS[model_name])


def experiment_policy(model_name):
    """The compute policy the experiment's ``precision`` resolves to here."""
    from estimator_keras import precision  # pylint: disable=import-outside-toplevel

    return precision.resolve(experiment(model_name).config.train.precision)[0]


def plain_compiled(model_name, seed=0, best=False):
    """The model compiled as a plain Keras user would: current Adam 1e-3;
    ``best``: with steps_per_execution=8 and the experiment's precision."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    tf.keras.utils.set_random_seed(seed)
    build = lambda: training_table.build_fn(model_name)({})  # noqa: E731
    if best and experiment_policy(model_name) == "mixed_bfloat16":
        build = accuracy_runs.bfloat16_builder(build)
    model = build()
    model.compile(optimizer=tf.keras.optimizers.Adam(LEARNING_RATE),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                  steps_per_execution=BEST_STEPS_PER_EXECUTION if best else 1)
    return model


class StepTimer:
    """A callback recording (steps run so far, time) after every call of the
    training function, whatever its steps per call."""

    def __new__(cls, records):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        class _Timer(tf.keras.callbacks.Callback):
            begin = 0

            def on_train_batch_begin(self, batch, logs=None):
                self.begin = batch

            def on_train_batch_end(self, batch, logs=None):
                # ``batch`` is the call's last step in the epoch; Keras 3 may
                # name one past the epoch's end on its last call.
                last = min(batch, self.params["steps"] - 1) if self.params.get("steps") else batch
                done = (records[-1][0] if records else 0) + last - self.begin + 1
                records.append((done, time.perf_counter()))

        return _Timer()


def fit_numpy_window(model, x, y, batch_size, warm, steps, epoch):
    """``warm + steps`` steps of ``fit`` on the arrays; returns (steps,
    seconds from the first call that ends at or after ``warm`` to the last,
    the next epoch). The optimizer's count corrects the last call, which may
    run past the steps asked."""
    records = []
    before = int(model.optimizer.iterations.numpy())
    epoch = training_table.fit_numpy_steps(model, x, y, batch_size, warm + steps, epoch,
                                           callbacks=[StepTimer(records)])
    ran = int(model.optimizer.iterations.numpy()) - before
    records[-1] = (max(ran, records[-1][0]), records[-1][1])
    return (*timed_calls(records, warm), epoch)


def timed_calls(records, warm):
    """(steps, seconds) of StepTimer ``records`` from the end of the first
    call that ends at or after step ``warm`` to the last call's end."""
    start = next(r for r in records if r[0] >= warm)
    return records[-1][0] - start[0], records[-1][1] - start[1]


class EngineVariant(training_table._StepWindow):  # pylint: disable=protected-access
    """``KerasEngine.train`` on the experiment's plan, timed between two of
    its own progress lines."""

    consumed = "KerasEngine.train(plan), timed by its progress lines"

    def __init__(self, name, model_name, settings, path, description=""):
        super().__init__(name, model_name, settings, description)
        self.path = path
        self.windows = 0

    def _run(self, steps):
        from estimator_keras.engines.keras import engine as keras_engine  # pylint: disable=import-outside-toplevel

        self.windows += 1
        model_dir = os.path.join(self.settings.workdir, TABLE,
                                 f"{self.model_name}-{self.windows}")
        return engine_window(keras_engine.KerasEngine(), self.model_name, self.path,
                             self.settings.batch_size, steps, model_dir)


def middle_window(lines):
    """(steps, seconds) between the first two of a run's last three
    progress lines ``[(step, time), ...]`` (at n, 2n and 3n steps): the
    steady state, after the run's start and before its end."""
    if len(lines) < 3:
        raise RuntimeError(f"expected three progress lines, got {lines}")
    (s0, t0), (s1, t1) = lines[-3], lines[-2]
    return s1 - s0, t1 - t0


def first_pass_steps(path, batch_size, steps):
    """The steps of one pass over the train split at ``path``, rounded up to
    a multiple of ``steps``."""
    from estimator_keras import manifest  # pylint: disable=import-outside-toplevel

    examples = manifest.load_manifest(path).split("train").num_examples
    return -(-examples // (batch_size * steps)) * steps


def engine_window(engine, model_name, path, batch_size, steps, model_dir):
    """One fresh ``engine.train`` run of the experiment's plan at its own
    evaluation cadence and precision with a progress line every ``steps``
    (rounded up to whole calls of the engines' steps per call): one pass
    over the train split (:func:`first_pass_steps`), then ``3 * steps``
    steps; returns (steps, seconds) of :func:`middle_window`."""
    from estimator_keras.engines import base  # pylint: disable=import-outside-toplevel
    from experiments.training import context  # pylint: disable=import-outside-toplevel

    # Whole calls only: a run that ends between two multiples of the call
    # length ends in shorter calls, whose function is traced at its first
    # call, inside the warm-up's window (a 20-step window read a tenth of
    # the steady rate). At a multiple, the one-pass run and 3n end on calls
    # of full length.
    full = base.MAX_STEPS_PER_EXECUTION
    steps = -(-int(steps) // full) * full
    exp = experiment(model_name)
    config = dataclasses.replace(exp.config, train=dataclasses.replace(
        exp.config.train, max_steps=first_pass_steps(path, batch_size, steps) + 3 * steps,
        log_every_steps=steps, batch_size=batch_size))
    train_fn, eval_fn = context.input_fns(config, path)
    lines = []

    def log(line):
        match = re.match(r"step (\d+)", line)
        if match:
            lines.append((int(match.group(1)), time.perf_counter()))

    shutil.rmtree(model_dir, ignore_errors=True)
    plan = context.experiment_plan(exp, config, policy=experiment_policy(model_name),
                                   model_dir=model_dir,
                                   train_data=train_fn, eval_data=eval_fn,
                                   hooks=base.TrainingHooks(log=log))
    try:
        engine.train(plan)
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)
    return middle_window(lines)


class EngineFitVariant(training_table._StepWindow):  # pylint: disable=protected-access
    """The engine's compiled model and input pipeline in a bare Model.fit."""

    consumed = "model.fit(make_dataset), callback timing"

    def __init__(self, name, model_name, settings, path, description=""):
        super().__init__(name, model_name, settings, description, group="knob")
        self.path = path
        # Two whole calls before the window (see NumpyVariant).
        self.warm = max(self.warm, 2 * BEST_STEPS_PER_EXECUTION)

    def build(self):
        from estimator_keras.engines import base  # pylint: disable=import-outside-toplevel
        from estimator_keras.engines.keras import engine as keras_engine  # pylint: disable=import-outside-toplevel
        from experiments.training import context  # pylint: disable=import-outside-toplevel

        exp = experiment(self.model_name)
        self.model = keras_engine.compile_for_keras(
            context.experiment_plan(exp, exp.config, policy=experiment_policy(self.model_name)),
            base.MAX_STEPS_PER_EXECUTION)
        train_fn, _ = context.input_fns(exp.config, self.path)
        self.dataset = train_fn()

    def _run(self, steps):
        records = []
        self.model.fit(self.dataset, epochs=1, steps_per_epoch=self.warm + steps, verbose=0,
                       callbacks=[StepTimer(records)])
        return timed_calls(records, self.warm)


class NumpyVariant(training_table._StepWindow):  # pylint: disable=protected-access
    """Plain tf-keras Model.fit on the numpy arrays, at Keras' defaults or
    (``best``) with a careful user's knobs."""

    consumed = "model.fit(numpy), callback timing"

    def __init__(self, name, model_name, settings, arrays, description="", best=False):
        super().__init__(name, model_name, settings, description)
        self.arrays, self.best = arrays, best
        self.epoch = 0
        if best:
            self.warm = max(self.warm, 2 * BEST_STEPS_PER_EXECUTION)

    def build(self):
        self.model = plain_compiled(self.model_name, self.settings.seed, self.best)

    def _run(self, steps):
        x, y = self.arrays
        steps, seconds, self.epoch = fit_numpy_window(
            self.model, x, y, self.settings.batch_size, self.warm, steps, self.epoch)
        return steps, seconds


class Keras3Variant(training_table._StepWindow):  # pylint: disable=protected-access
    """Keras 3 in a child interpreter on one backend: plain ``fit`` on numpy
    or on make_dataset, or the keras3 engine."""

    consumed = "Keras 3 in a child process: model.fit callback timing, or the engine's progress lines"

    def __init__(self, name, model_name, settings, arrays_file, path, op, description="",
                 backend="tensorflow", python=None):
        super().__init__(name, model_name, settings, description)
        if op == "fit_numpy_best":
            self.warm = max(self.warm, 2 * BEST_STEPS_PER_EXECUTION)
        self.arrays_file, self.path, self.op = arrays_file, path, op
        self.backend, self.python = backend, python or sys.executable
        self.child = None

    def build(self):
        argv = [self.python, "-m", "benchmarks.keras_table", "--serve", self.model_name,
                "--arrays", self.arrays_file, "--data", self.path,
                "--batch-size", str(self.settings.batch_size), "--seed", str(self.settings.seed),
                "--workdir", os.path.join(self.settings.workdir, TABLE)]
        self.child = turns.Child(self.name, argv, env=keras3_env(self.backend))
        ready = self.child.read()
        self.keras_version, self.tf_keras = ready.get("keras"), ready.get("tf_keras")
        if ready.get("backend") != self.backend:
            raise RuntimeError(f"the child runs Keras 3 on {ready.get('backend')}, not "
                               f"{self.backend}")

    def _run(self, steps):
        reply = self.child.request({"op": self.op, "warm": self.warm, "steps": steps})
        return reply["steps"], reply["seconds"]

    def close(self):
        if self.child is not None:
            self.child.close()

    def extra(self):
        return dict(super().extra(), keras=getattr(self, "keras_version", None),
                    backend=self.backend, tf_keras=getattr(self, "tf_keras", None))


def keras3_env(backend="tensorflow"):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND=backend)
    env.pop("TF_USE_LEGACY_KERAS", None)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.path.dirname(common.HERE), env.get("PYTHONPATH")) if p)
    return env


def serve(args):
    """The Keras 3 child: answers "fit_numpy", "fit_dataset" and "engine"
    requests on the backend KERAS_BACKEND names."""
    import numpy as np  # pylint: disable=import-outside-toplevel

    from estimator_keras import engines  # pylint: disable=import-outside-toplevel

    # Importing estimator_keras asks for tf-keras where it is installed; the
    # plain Keras 3 rows must not get it.
    engines.prepare_keras("keras3")
    tf = common.quiet_tensorflow()
    import keras  # pylint: disable=import-outside-toplevel
    from estimator_keras.engines.keras3 import engine as keras3_engine  # pylint: disable=import-outside-toplevel

    arrays = np.load(args.arrays)
    x, y = arrays["x"], arrays["y"]
    models = {}

    def compiled(kind):
        if kind not in models:
            models[kind] = plain_compiled(args.model, args.seed, best=kind == "numpy_best")
        return models[kind]

    state = {"epoch": 0, "dataset": None}

    def fit_numpy(message, kind="numpy"):
        key = f"epoch_{kind}"
        steps, seconds, state[key] = fit_numpy_window(
            compiled(kind), x, y, args.batch_size, message["warm"], message["steps"],
            state.get(key, 0))
        return {"steps": steps, "seconds": seconds}

    def fit_dataset(message):
        from estimator_keras import inputs  # pylint: disable=import-outside-toplevel

        if state["dataset"] is None:
            state["dataset"] = inputs.make_dataset(args.data, args.batch_size, training=True,
                                                   features={IMAGE: IMAGE}, label=LABEL,
                                                   cache="auto")
        times = []
        compiled("dataset").fit(state["dataset"], epochs=1, verbose=0,
                          steps_per_epoch=message["warm"] + message["steps"],
                          callbacks=[training_table.KerasTimer(times)])
        steps, seconds = training_table.timed_part(times, message["warm"])
        return {"steps": steps, "seconds": seconds}

    def engine(message):
        state["windows"] = state.get("windows", 0) + 1
        steps, seconds = engine_window(
            keras3_engine.Keras3Engine(), args.model, args.data, args.batch_size,
            message["steps"], os.path.join(args.workdir, f"keras3-{args.model}-{os.getpid()}-"
                                                         f"{state['windows']}"))
        return {"steps": steps, "seconds": seconds}

    turns.serve({"fit_numpy": fit_numpy, "fit_numpy_best": lambda m: fit_numpy(m, "numpy_best"),
                 "fit_dataset": fit_dataset, "engine": engine},
                keras=keras.__version__, tensorflow=tf.__version__,
                backend=keras.backend.backend(), tf_keras=tf.keras.Model.__module__)
    return 0


KERAS3_ENGINE = "keras3 engine"
KERAS3_NUMPY = "keras3 fit_numpy"
KERAS3_NUMPY_BEST = "keras3 fit_numpy best"
TF_KERAS_NUMPY, TF_KERAS_NUMPY_BEST = "tf_keras fit_numpy", "tf_keras fit_numpy best"
JAX_ENGINE = "keras3[jax] engine"
JAX_NUMPY = "keras3[jax] fit_numpy"


def variants(model_name, path, settings, arrays, arrays_file, keras3=True, jax=None):
    """The table's variants; ``jax``: an interpreter for the JAX rows, or None."""
    out = [
        EngineVariant(ENGINE, model_name, settings, path,
                      "KerasEngine.train on the experiment's plan (python -m experiments "
                      "train --engine keras), cache=auto pipeline"),
        EngineFitVariant("engine Model.fit(make_dataset)", model_name, settings, path,
                         "the engine's compiled model and pipeline, bare Model.fit "
                         "(no engine callbacks)"),
        NumpyVariant(TF_KERAS_NUMPY, model_name, settings, arrays,
                     "plain tf-keras Model.fit on numpy arrays, Adam(1e-3), Keras' defaults "
                     "(float32, one step per call)"),
        NumpyVariant(TF_KERAS_NUMPY_BEST, model_name, settings, arrays,
                     f"as tf_keras fit_numpy with steps_per_execution="
                     f"{BEST_STEPS_PER_EXECUTION} and {experiment_policy(model_name)}",
                     best=True),
    ]
    if keras3:
        out += [
            Keras3Variant(KERAS3_ENGINE, model_name, settings, arrays_file, path, "engine",
                          "Keras3Engine.train on the experiment's plan (python -m experiments "
                          "train --engine keras3), TensorFlow backend, in a fresh interpreter"),
            Keras3Variant(KERAS3_NUMPY, model_name, settings, arrays_file, path,
                          "fit_numpy", "plain Keras 3 Model.fit on numpy arrays, Adam(1e-3), "
                          "TensorFlow backend, Keras' defaults (float32, one step per call), "
                          "in a fresh interpreter"),
            Keras3Variant(KERAS3_NUMPY_BEST, model_name, settings, arrays_file, path,
                          "fit_numpy_best", f"as keras3 fit_numpy with steps_per_execution="
                          f"{BEST_STEPS_PER_EXECUTION} and {experiment_policy(model_name)}"),
            Keras3Variant("keras3 fit(make_dataset)", model_name, settings, arrays_file, path,
                          "fit_dataset", "Keras 3 Model.fit on this package's pipeline "
                          "(cache=auto), TensorFlow backend"),
        ]
    if keras3 and jax:
        out += [
            Keras3Variant(JAX_ENGINE, model_name, settings, arrays_file, path, "engine",
                          "the keras3 engine on KERAS_BACKEND=jax", backend="jax", python=jax),
            Keras3Variant(JAX_NUMPY, model_name, settings, arrays_file, path, "fit_numpy",
                          "plain Keras 3 Model.fit on numpy arrays on KERAS_BACKEND=jax",
                          backend="jax", python=jax),
        ]
    return out


def _targets(model_name, m, keras3):
    bare = common.local_ratio(m.log, "engine Model.fit(make_dataset)", ENGINE)
    why = (None if bare is None else
           f"a bare Model.fit on the same pipeline runs at {bare:.2f}x the engine")
    pairs = [(ENGINE, TF_KERAS_NUMPY, "keras.{}.vs_tf_keras_numpy",
              "keras engine / plain tf-keras fit on numpy at its defaults", 1.0),
             (ENGINE, TF_KERAS_NUMPY_BEST, "keras.{}.vs_tf_keras_numpy_best",
              "keras engine / plain tf-keras fit on numpy at its best (like precision)",
              BEST_THRESHOLD)]
    if keras3:
        pairs += [(ENGINE, KERAS3_NUMPY, "keras.{}.vs_keras3_numpy",
                   "keras engine / plain Keras 3 fit on numpy at its defaults", 1.0),
                  (KERAS3_ENGINE, KERAS3_NUMPY, "keras.{}.keras3_vs_keras3_numpy",
                   "keras3 engine / plain Keras 3 fit on numpy at its defaults, TensorFlow "
                   "backend", 1.0),
                  (KERAS3_ENGINE, KERAS3_NUMPY_BEST, "keras.{}.keras3_vs_keras3_numpy_best",
                   "keras3 engine / plain Keras 3 fit on numpy at its best (like precision), "
                   "TensorFlow backend", BEST_THRESHOLD)]
    return [common.target(ident.format(model_name), f"{model_name}: {label}",
                          common.local_ratio(m.log, a, b), goal,
                          why=m.errors.get(b) or m.errors.get(a) or (why if a == ENGINE else None))
            for a, b, ident, label, goal in pairs]


def jax_notes(model_name, m):
    """The JAX rows' ratios, measured side by side: information, not targets
    (nothing was promised for JAX on a CPU)."""
    out = []
    for a, b, label in ((JAX_ENGINE, JAX_NUMPY, "keras3 engine / plain Keras 3 fit on numpy, "
                                                "both on JAX"),
                        (JAX_NUMPY, KERAS3_NUMPY, "plain Keras 3 fit on numpy, JAX / "
                                                  "TensorFlow backend")):
        ratio = common.local_ratio(m.log, a, b)
        if ratio is not None:
            out.append(f"{model_name}: {label}: {ratio:.2f}x")
    return out


def check_environment():
    """Raises unless tf.keras is Keras 2 from tf-keras on TensorFlow 2.16+."""
    from estimator_keras import engines  # pylint: disable=import-outside-toplevel

    engines.prefer_legacy_keras()
    tf = common.quiet_tensorflow()
    major, minor = (int(v) for v in tf.__version__.split(".")[:2])
    if (major, minor) < (2, 16) or engines.keras_major_version() != 2:
        raise RuntimeError(f"the keras table needs TensorFlow 2.16+ with tf-keras and "
                           f"TF_USE_LEGACY_KERAS=1 (found TensorFlow {tf.__version__}, Keras "
                           f"{engines.keras_major_version()}); run it with .venv-keras/bin/python "
                           f"or pass --python-keras")
    return tf


def run(settings, path=None, models=MODELS, keras3=True):
    import numpy as np  # pylint: disable=import-outside-toplevel

    tf = check_environment()
    path = path or common.dataset_path(settings)
    arrays = common.load_arrays(path, "train")
    arrays_file = os.path.join(settings.workdir, "keras-arrays.npz")
    np.savez(arrays_file, x=arrays[0], y=arrays[1])
    rows, targets, notes = [], [], []
    jax = jax_python(settings) if keras3 else None
    load_start = output.load_average()
    for model_name in models:
        vs = variants(model_name, path, settings, arrays, arrays_file, keras3, jax)
        repeats = settings.repeats_for(5 if model_name == "seed_cnn" else 7)
        m = common.run_alternating(vs, repeats, f"{TABLE}/{model_name}", reference=ENGINE)
        model_rows = common.rows_from(vs, m, reference=ENGINE, unit="steps/s")
        for row in model_rows:
            row["name"] = f"{model_name} {row['name']}"
        rows.extend(model_rows)
        targets += _targets(model_name, m, keras3)
        notes += jax_notes(model_name, m) if jax else []
    return {"table": TABLE, "title": TITLE, "unit": "steps/s", "rows": rows,
            "columns": ["name", "median", "min", "max", "ratio", "ratio_best", "window_steps"],
            "targets": targets, "dataset": path, "tensorflow": tf.__version__,
            "load_before": load_start, "load_after": output.load_average(),
            "notes": ["engines: the experiments' own evaluation cadence (fashion_mnist_mlp "
                      "2000 steps, fashion_mnist_cnn 469) and precision (seed_mlp float32, "
                      f"seed_cnn {experiment_policy('seed_cnn')} here); `best` peers: "
                      f"steps_per_execution={BEST_STEPS_PER_EXECUTION} and the experiment's "
                      "precision, their defaults: float32, one step per call",
                      "ratio = median over windows of (rate / mean rate of the nearest "
                      "`engine` windows of the same model before and after it)",
                      "engine windows: one fresh KerasEngine.train (or Keras3Engine.train) "
                      "run each, timed between its progress lines; Keras 3 rows run in a "
                      "child interpreter each",
                      f"JAX rows: {jax}" if jax else
                      f"JAX rows: none ({common.no_jax_reason(settings)})"] + notes}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.keras_table", allow_abbrev=False,
                                     description="the Keras 3 child of the keras table")
    parser.add_argument("--serve", metavar="MODEL", dest="model", required=True)
    parser.add_argument("--arrays", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default=None, help="model dirs of the engine's windows")
    args = parser.parse_args(argv)
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="keras-table-")
    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
