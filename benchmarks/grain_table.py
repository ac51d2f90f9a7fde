"""Table "grain": the Grain input pipeline against the tf.data one on the
same shards, alone and feeding Keras 3 on JAX.

``fashion_mnist_mlp`` and ``fashion_mnist_cnn`` read the same records with
the same data settings (the Fashion-MNIST dataset, ``features {"image":
"image"}``, label ``label``, ``shuffle="batch"``, buffer 64, ``cache="auto"``,
seed 42, batch 128): the table compares their settings and times the
pipelines once per distinct setting, so once. Two parts:

1. **Pipelines alone**, examples/s, the variants alternating
   (:func:`benchmarks.common.run_alternating`, medians of windows of about
   ``--window`` seconds): tf.data (:func:`estimator_keras.inputs.make_dataset`
   with those settings) cached, what ``cache="auto"`` picks for these 60k
   records and tf.data's best, and uncached, the library's default; Grain
   (:func:`estimator_keras.grain_inputs.make_dataset`, the same settings)
   with 0 to 3 decoding processes, its default (one per core beyond the
   first) marked, and its best of those as a row of its own. Every pipeline
   is warmed for one epoch and five batches first (tf.data's cache filled,
   Grain's processes started) and consumed as numpy arrays, as a JAX ``fit``
   takes them (tf.data through ``as_numpy_iterator``). The tf.data reference
   is interleaved between the others; ``ratio`` is each window over the
   nearest reference windows.
2. **Training fed by each**, steps/s: the keras3 engine on
   ``KERAS_BACKEND=jax`` (``Keras3Engine.train`` on the experiment's plan:
   its model at its precision, compiled by ``compile_for_keras3`` with the
   engine's steps per call, its callbacks: what ``python -m experiments
   train EXP --engine keras3 --hparams pipeline=...`` runs) in
   one child process per pipeline: tf.data (the reference), Grain at its
   default, and one batch of the same records repeated in memory (a Grain
   dataset that decodes nothing: the rate of the same run with no input
   cost). Each child runs one long ``train`` and hands the CPU back between
   windows (:mod:`benchmarks.turns`: only one child works at a time): one
   run, one iterator, as a user's run has (Grain's decoding processes and
   tf.data's cache live on across windows; a ``fit`` per window would
   restart them). A window is the steps of one turn after its first eighth,
   which drains what the pipeline buffered while the child waited. The
   run's evaluations, and the checkpoints that come with them, are moved
   past its end, so that windows time training steps only (the accuracy
   table, :mod:`benchmarks.grain_accuracy_table`, runs the experiment
   whole). Before its windows a child trains one pass over the train split
   (tf.data's cache filled) for the MLP; for the CNN, whose pass takes
   minutes on JAX here, two windows, so the CNN's tf.data windows fall in
   its first epoch, reading and caching.

Targets, training (the issue's "feeds the MLP at >= 1.0x tf.data's rate and
never starves the CNN"): the MLP's steps/s fed by Grain / fed by tf.data
>= 1.0; the CNN's fed by Grain within 2% of fed by the in-memory batch
(>= 0.98: Grain never starves it) and of fed by tf.data (>= 0.98). The
pipelines' ratios are rows, not targets.
"""

import argparse
import dataclasses
import os
import signal
import sys
import tempfile
import time

from benchmarks import common, output, turns

TABLE = "grain"
TITLE = ("Grain vs tf.data on the same Fashion-MNIST shards: pipelines alone (examples/s) and "
         "the keras3 engine on JAX fed by each (steps/s)")
EXPERIMENTS = ("fashion_mnist_mlp", "fashion_mnist_cnn")
GRAIN_WORKERS = (0, 1, 2, 3)
TFDATA_CACHED, TFDATA_UNCACHED = "tf.data cached", "tf.data uncached"
GRAIN_BEST = "grain at its best"
PIPELINES = ("tfdata", "grain", "memory")
# A training run long enough never to end while the table times it.
RUN_STEPS = 800_000
MLP_THRESHOLD, CNN_THRESHOLD = 1.0, 0.98


def grain_name(workers):
    return f"grain workers={workers}"


def experiment(name):
    from experiments.catalog import loading as catalog  # pylint: disable=import-outside-toplevel
    from experiments.catalog import registry  # pylint: disable=import-outside-toplevel

    catalog.load()
    return registry.get(name)


def pipeline_settings(name):
    """The InputConfig fields of experiment ``name``'s training pipeline, as
    ``train`` sets them (:func:`experiments.training.context.input_config`
    with the experiment's seed; that module imports TensorFlow, this one
    must not)."""
    config = experiment(name).config
    data = config.data
    return {"features": data.features, "label": data.label, "shuffle": data.shuffle,
            "shuffle_buffer": data.shuffle_buffer, "cache": data.cache,
            "cache_budget_mb": data.cache_budget_mb, "cache_shuffle": data.cache_shuffle,
            "seed": config.train.seed}


# --------------------------------------------------------------------------
# Part 1: the pipelines alone


class _Pipeline(common.Variant):
    """Examples/s of one pipeline, consumed as numpy batches."""

    group = "pipeline"

    def __init__(self, name, description, build, epoch_batches, batch_size, window_s):
        self.name, self.description = name, description
        self._build, self._epoch, self._batch = build, epoch_batches, batch_size
        self._window_s, self._window = window_s, 10
        self._iterator = None

    def build(self):
        self._iterator = self._build()

    def warmup(self):
        self._window = common.warm_window(self._iterator, self._epoch, self._window_s, 10)

    def measure(self):
        start = time.perf_counter()
        for _ in range(self._window):
            next(self._iterator)
        return self._window * self._batch, time.perf_counter() - start

    def extra(self):
        return {"window_batches": self._window}

    def close(self):
        # Ends a Grain iterator's decoding processes now, not at exit.
        close = getattr(self._iterator, "close", None)
        self._iterator = None
        if close is not None:
            close()


def _tfdata_iterator(path, batch_size, fields):
    common.quiet_tensorflow()
    from estimator_keras import inputs  # pylint: disable=import-outside-toplevel

    return inputs.make_dataset(path, batch_size, training=True, **fields).as_numpy_iterator()


def _tfdata_cache_auto(path, fields):
    """What tf.data's ``cache="auto"`` decides for these records, in words."""
    from estimator_keras import inputs, records  # pylint: disable=import-outside-toplevel

    resolved = records.resolve(path, "train")
    config = inputs.InputConfig(**dict(fields, cache="auto"))
    names = set(config.features.values()) | {config.label}
    return inputs.cache_decision(config, resolved, names)[1]


def _grain_iterator(path, batch_size, fields, workers):
    from estimator_keras import grain_inputs  # pylint: disable=import-outside-toplevel

    return iter(grain_inputs.make_dataset(path, batch_size, training=True, workers=workers,
                                          **fields))


def pipeline_variants(path, batch_size, fields, epoch_batches, window_s, workers=GRAIN_WORKERS):
    from estimator_keras import grain_inputs  # pylint: disable=import-outside-toplevel

    default = grain_inputs.default_workers()
    shared = {k: v for k, v in fields.items() if k != "cache"}
    out = [
        _Pipeline(TFDATA_CACHED, "inputs.make_dataset, cache=True (what cache=auto picks for "
                                 "these records; tf.data's best)",
                  lambda: _tfdata_iterator(path, batch_size, dict(shared, cache=True)),
                  epoch_batches, batch_size, window_s),
        _Pipeline(TFDATA_UNCACHED, "inputs.make_dataset, cache=False (the library's default)",
                  lambda: _tfdata_iterator(path, batch_size, dict(shared, cache=False)),
                  epoch_batches, batch_size, window_s),
    ]
    for count in workers:
        what = "in this process" if count == 0 else f"{count} decoding process(es)"
        out.append(_Pipeline(
            grain_name(count), f"grain_inputs.make_dataset, workers={count}: {what}"
            + (" (its default here)" if count == default else ""),
            lambda c=count: _grain_iterator(path, batch_size, shared, c),
            epoch_batches, batch_size, window_s))
    return out, default


def pipeline_rows(path, batch_size, fields, epoch_batches, window_s, repeats,
                  workers=GRAIN_WORKERS):
    variants, default = pipeline_variants(path, batch_size, fields, epoch_batches, window_s,
                                          workers)
    measured = common.run_alternating(variants, repeats, f"{TABLE} pipelines",
                                      reference=TFDATA_CACHED)
    rows = common.rows_from(variants, measured, reference=TFDATA_CACHED, unit="examples/s")
    for row, count in zip(rows[2:], workers):
        row["workers"], row["default"] = count, count == default
    grains = [row for row in rows[2:] if row.get("median")]
    if grains:
        best = max(grains, key=lambda row: row["median"])
        rows.append(dict(best, name=GRAIN_BEST, description=f"the best of Grain's rows "
                         f"(workers {', '.join(map(str, workers))}): workers={best['workers']}"))
    return rows


# --------------------------------------------------------------------------
# Part 2: training fed by each pipeline (keras3 engine on JAX, child processes)


def keras3_jax_env():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="jax")
    # The keras tox environment asks for tf-keras; the keras3 engine needs Keras 3.
    env.pop("TF_USE_LEGACY_KERAS", None)
    env.pop("TF_CONFIG", None)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.path.dirname(common.HERE), env.get("PYTHONPATH")) if p)
    return env


def whole_calls(steps):
    """``steps`` rounded up to whole calls of the engine's training function."""
    from estimator_keras.engines import base  # pylint: disable=import-outside-toplevel

    full = base.MAX_STEPS_PER_EXECUTION
    return max(full, -(-int(steps) // full) * full)


class _Trainer(common.Variant):
    """One child running ``Keras3Engine.train`` fed by one pipeline; a window
    is the steps it trains in one turn."""

    group = "training"

    def __init__(self, name, description, exp, pipeline, path, settings, warm_steps, lo_steps,
                 python=None):
        self.name, self.description = name, description
        self.exp, self.pipeline, self.path, self.settings = exp, pipeline, path, settings
        self.warm_steps, self.lo_steps = whole_calls(warm_steps), whole_calls(lo_steps)
        self.steps = self.lo_steps
        self.python = python or sys.executable
        self.child, self.ready = None, {}

    def start(self):
        """Starts the child, which imports while the others start (it waits
        for its first turn before it builds anything)."""
        if self.child is not None:
            return
        argv = [self.python, "-m", "benchmarks.grain_table", "--serve", self.exp,
                "--pipeline", self.pipeline, "--data", self.path,
                "--batch-size", str(self.settings.batch_size),
                "--workdir", os.path.join(self.settings.workdir, TABLE)]
        self.child = turns.Child(f"{self.exp} {self.pipeline}", argv, env=keras3_jax_env(),
                                 cwd=os.path.dirname(common.HERE))

    def build(self):
        self.start()
        self.ready = self.child.read()

    def _turn(self, steps, untimed=0):
        """Lets the child train ``untimed + steps`` steps; (steps, seconds)
        of the last ``steps`` (or a few more, to the end of a call)."""
        self.child.send({"op": "go", "steps": int(untimed + steps), "untimed": int(untimed)})
        while True:
            message = self.child.read()
            if message.get("event") == "pause":
                return message["steps"], message["seconds"]

    def warmup(self):
        self._turn(self.warm_steps)
        steps, seconds = self._turn(self.lo_steps)
        self.steps = whole_calls(common.window_size(
            steps / max(seconds, 1e-9), 2 * self.settings.window_s, self.lo_steps, 20_000))

    def measure(self):
        # A paused child's pipeline fills its buffers (tf.data's prefetch,
        # Grain's per-process batches): the steps that drain them go untimed.
        return self._turn(self.steps, whole_calls(self.steps // 8))

    def close(self):
        if self.child is None:
            return
        self.child.close()
        try:
            # The child's own children (Grain's decoding processes) are in its group.
            os.killpg(self.child.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.child = None

    def extra(self):
        return {"window_steps": self.steps, "warm_steps": self.warm_steps,
                "pipeline": self.pipeline, **{k: self.ready.get(k) for k in
                                              ("backend", "keras", "jax", "precision")}}


def _first_pass(path, batch_size):
    """Batches of one pass over the train split (from its manifest)."""
    from estimator_keras import manifest  # pylint: disable=import-outside-toplevel

    examples = manifest.load_manifest(path).split("train").num_examples
    return -(-examples // batch_size)


def training_rows(exp, path, settings, repeats, python=None):
    """Rows and targets of one experiment trained fed by each pipeline."""
    first = _first_pass(path, settings.batch_size)
    lo = 16 if settings.quick else 24
    # The MLP's pass takes seconds; the CNN's minutes (see the module docstring).
    warm = first if exp == "fashion_mnist_mlp" else 2 * lo
    described = {
        "tfdata": "the keras3 engine fed by tf.data (data.pipeline=tfdata, cache=auto)",
        "grain": "the keras3 engine fed by Grain (data.pipeline=grain, its default workers)",
        "memory": "the keras3 engine fed one batch of the records repeated in memory (no "
                  "input cost)",
    }
    names = {p: f"{exp} training, {p if p != 'memory' else 'in-memory batch'}"
             for p in PIPELINES}
    variants = [_Trainer(names[p], described[p], exp, p, path, settings, warm, lo, python)
                for p in PIPELINES]
    for variant in variants:
        try:
            variant.start()
        except OSError:
            pass  # build() starts it again and records the error
    measured = common.run_alternating(variants, repeats, f"{TABLE} {exp}",
                                      reference=names["tfdata"])
    rows = common.rows_from(variants, measured, reference=names["tfdata"], unit="steps/s")
    why = (measured.errors.get(names["grain"]) or measured.errors.get(names["tfdata"])
           or measured.errors.get(names["memory"]))
    if exp == "fashion_mnist_mlp":
        pairs = [("vs_tfdata", "tfdata", MLP_THRESHOLD,
                  "steps/s fed by Grain / fed by tf.data")]
    else:
        pairs = [("vs_memory", "memory", CNN_THRESHOLD,
                  "steps/s fed by Grain / fed by one batch in memory (never starved)"),
                 ("vs_tfdata", "tfdata", CNN_THRESHOLD,
                  "steps/s fed by Grain / fed by tf.data")]
    targets = [common.target(f"grain.{exp}.{tid}", f"{exp}, keras3 on JAX: {label}",
                             common.local_ratio(measured.log, names["grain"], names[peer]),
                             threshold, why=why)
               for tid, peer, threshold, label in pairs]
    return rows, targets


def serve(args):
    """The child: the keras3 engine on JAX trains the experiment fed by
    ``args.pipeline``, pausing at the step each "go" asks for."""
    from estimator_keras import engines  # pylint: disable=import-outside-toplevel

    engines.prepare_keras("keras3")
    # pylint: disable=import-outside-toplevel
    import jax
    import keras

    from estimator_keras import precision
    from estimator_keras.engines import base
    from estimator_keras.engines.keras3 import engine as keras3_engine
    from experiments.training import context

    exp = experiment(args.exp)
    config = exp.config
    policy = precision.resolve(config.train.precision)[0]
    turns.emit({"event": "ready", "backend": keras.backend.backend(), "keras": keras.__version__,
                "jax": jax.__version__, "precision": policy})
    message = turns.receive()
    if message is None:
        return 0
    # A turn trains message["steps"] steps and times those after its first
    # message["untimed"] (the batches its pipeline buffered during the pause).
    state = {}

    def start_turn(step, message):
        state.update(until=step + int(message["steps"]),
                     timed_from=step + int(message.get("untimed", 0)), mark=None)
        if state["timed_from"] == step:
            state["mark"] = (step, time.perf_counter())

    start_turn(0, message)

    def on_progress(step, loss, seconds_left, rate):
        now = time.perf_counter()
        if state["mark"] is None and step >= state["timed_from"]:
            state["mark"] = (step, now)
            return
        if step < state["until"]:
            return
        first, since = state["mark"]
        turns.emit({"event": "pause", "step": step, "steps": step - first,
                    "seconds": now - since})
        reply = turns.receive()
        if reply is None:
            # The parent is done: no teardown of the run (nor of Grain's processes,
            # which the parent ends with the process group).
            os._exit(0)  # pylint: disable=protected-access
        start_turn(step, reply)

    def log(line):
        if not line.startswith("step "):
            sys.stderr.write(f"[{args.exp} {args.pipeline}] {line}\n")

    train = dataclasses.replace(config.train, max_steps=RUN_STEPS, eval_every_steps=RUN_STEPS,
                                log_every_steps=base.MAX_STEPS_PER_EXECUTION,
                                batch_size=args.batch_size)
    pipeline = "grain" if args.pipeline == "memory" else args.pipeline
    config = dataclasses.replace(config, train=train,
                                 data=dataclasses.replace(config.data, pipeline=pipeline))
    train_fn, eval_fn = context.input_fns(config, args.data, seed=train.seed, pipeline=pipeline)
    if args.pipeline == "memory":
        train_fn = _one_batch_input(args.data, args.batch_size, config)
    model_dir = tempfile.mkdtemp(prefix=f"{args.exp}-{args.pipeline}-", dir=args.workdir)
    plan = context.experiment_plan(exp, config, policy=policy, model_dir=model_dir,
                                   train_data=train_fn, eval_data=eval_fn,
                                   hooks=base.TrainingHooks(log=log, on_progress=on_progress))
    keras3_engine.Keras3Engine().train(plan)
    raise RuntimeError(f"the run ended at step {RUN_STEPS} before the table was done")


def _one_batch_input(path, batch_size, config):
    """A training input that serves the pipeline's first batch forever (a
    Grain dataset, taken by Keras as the Grain pipeline is)."""
    import grain  # pylint: disable=import-outside-toplevel

    from estimator_keras import grain_inputs  # pylint: disable=import-outside-toplevel
    from experiments.training import context  # pylint: disable=import-outside-toplevel

    batch = next(iter(grain_inputs.make_dataset(path, batch_size, training=True, workers=0,
                                                config=context.input_config(
                                                    config, seed=config.train.seed))))

    def train_data(input_context=None):  # pylint: disable=unused-argument
        return grain.MapDataset.range(0, 1 << 40).map(lambda _: batch).to_iter_dataset()

    return train_data


# --------------------------------------------------------------------------


def run(settings, path=None, experiments=EXPERIMENTS, workers=GRAIN_WORKERS):
    path = path or common.dataset_path(settings)
    load_start = output.load_average()
    batch_size = settings.batch_size
    settings_of = {name: pipeline_settings(name) for name in experiments}
    groups = {}
    for name, found in settings_of.items():
        groups.setdefault(repr(sorted(found.items())), []).append(name)
    epoch_batches = _first_pass(path, batch_size)
    rows, targets, notes = [], [], []
    for names in groups.values():
        found = settings_of[names[0]]
        label = " and ".join(names)
        notes.append(f"pipelines of {label}: the same records and settings (features "
                     f"{found['features']}, label {found['label']!r}, shuffle "
                     f"{found['shuffle']!r}, buffer {found['shuffle_buffer']}, cache "
                     f"{found['cache']!r}, seed {found['seed']}), batch {batch_size}")
        found_rows = pipeline_rows(path, batch_size, found, epoch_batches, settings.window_s,
                                   settings.repeats_for(7), workers)
        if len(groups) > 1:
            for row in found_rows:
                row["name"] = f"{label}: {row['name']}"
        rows += found_rows
    for name in experiments:
        found_rows, found_targets = training_rows(name, path, settings,
                                                  settings.repeats_for(5))
        rows += found_rows
        targets += found_targets
    from estimator_keras import grain_inputs  # pylint: disable=import-outside-toplevel

    decided = _tfdata_cache_auto(path, settings_of[experiments[0]])
    return {"table": TABLE, "title": TITLE, "unit": "", "rows": rows, "targets": targets,
            "columns": ["name", "unit", "median", "min", "max", "ratio", "ratio_best",
                        "window_batches", "window_steps"],
            "dataset": path, "load_before": load_start, "load_after": output.load_average(),
            "grain_default_workers": grain_inputs.default_workers(),
            "notes": notes + [
                f"what cache=auto decides here: {decided}",
                "pipeline rows: examples/s of the pipeline alone, numpy batches, after one "
                "epoch and five batches; ratio: each window over the nearest `tf.data cached` "
                "windows (benchmarks/common.py local_ratio)",
                f"training rows: steps/s of Keras3Engine.train on KERAS_BACKEND=jax, one child "
                f"process per pipeline taking turns; evaluations moved past the run's end; "
                f"ratio: over the nearest `tf.data` windows of the same experiment; Grain "
                f"there at its default ({grain_inputs.default_workers()} decoding "
                f"process(es) here)",
                "targets: the MLP fed by Grain >= 1.0x fed by tf.data; the CNN fed by Grain "
                ">= 0.98x fed by one in-memory batch (never starved) and >= 0.98x fed by "
                "tf.data"]}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.grain_table", allow_abbrev=False,
                                     description="the training child of the grain table")
    parser.add_argument("--serve", metavar="EXPERIMENT", dest="exp", required=True)
    parser.add_argument("--pipeline", choices=PIPELINES, required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workdir", required=True, help="the run's model dir goes here")
    args = parser.parse_args(argv)
    os.makedirs(args.workdir, exist_ok=True)
    try:
        return serve(args)
    except Exception as e:  # pylint: disable=broad-except
        turns.emit({"event": "error", "error": f"{type(e).__name__}: {e}"[:1000]})
        return 1


if __name__ == "__main__":
    sys.exit(main())
