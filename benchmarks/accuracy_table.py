"""Table "accuracy" (slow): how fast fashion_mnist_cnn reaches 0.91 test
accuracy, the project against plain Keras, and what makes it faster.

Two parts, one run:

1. **knobs** (steps as examples/s, windows alternating as in the training
   table): the experiment's Estimator (float32, batch 128, the cached
   pipeline) against what a performance engineer would try: mixed_bfloat16,
   XLA auto-clustering, session threads, batch 256, and the same for the
   evaluation (``est.evaluate`` over the test split, whole calls: graph
   build and checkpoint restore included, batch 128 against 1024).
2. **runs** (:mod:`benchmarks.accuracy_runs`): whole training runs, one
   process each, taking turns every few hundred steps: plain Keras ``fit`` on
   numpy arrays (the reference: Adam 1e-3, batch 128, validation every
   epoch), the experiment as registered, and variants built from the knobs.
   ``t091_s`` is a run's own working time until the first evaluation at or
   above 0.91 has finished; ``final_accuracy`` is its last evaluation's.

Only what part 1 shows faster is worth a run in part 2, and only what part 2
shows reaching 0.91 sooner, with a final accuracy of at least 0.925, belongs
in the experiment's defaults.
"""

import os
import sys
import tempfile
import time

from benchmarks import accuracy_runs, common, output, training_table, turns
from benchmarks.common import IMAGE, LABEL, Variant

TABLE = "accuracy"
TITLE = "fashion_mnist_cnn: time to 0.91 test accuracy and final accuracy, project vs plain Keras"
TARGET_ACCURACY = 0.91
FINAL_ACCURACY = 0.925
TIME_RATIO = 0.7
ISSUE3_ACCURACY = 0.91
# New batches every epoch are worth a default when they cost at most this
# much of a run's working time (issue 21: measured, not yet a default).
RESHUFFLE_COST = 1.05
# Lets a session's global_jit_level reach the CPU (the XLA knob sets it).
XLA_FLAGS = "--tf_xla_cpu_global_jit"


def _session_config(xla=False, inter=None, intra=None):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=inter or 0,
                                      intra_op_parallelism_threads=intra or 0,
                                      allow_soft_placement=True)
    if xla:
        config.graph_options.optimizer_options.global_jit_level = (
            tf.compat.v1.OptimizerOptions.ON_1)
    return config


def _compiled(settings, precision=None):
    from estimator_keras.engines.optimizers import legacy_optimizer  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    tf.keras.utils.set_random_seed(settings.seed)
    build = lambda: training_table.build_fn("seed_cnn")({})  # noqa: E731
    if precision == "mixed_bfloat16":
        build = accuracy_runs.bfloat16_builder(build)
    model = build()
    model.compile(optimizer=legacy_optimizer("adam", accuracy_runs.LEARNING_RATE),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


class KnobVariant(training_table.EstimatorVariant):
    """The CNN's Estimator with one knob set; rates in examples/s."""

    def __init__(self, name, settings, path, batch_scale=1, precision=None, config=None,
                 description="", group="knob"):
        batch = settings.batch_size * batch_scale

        def factory():
            from estimator_keras import inputs  # pylint: disable=import-outside-toplevel
            return inputs.make_input_fn(path, batch, training=True, features={IMAGE: IMAGE},
                                        label=LABEL, cache="auto")

        super().__init__(name, "seed_cnn", settings, factory, config, description, group)
        self.batch, self.precision = batch, precision

    def build(self):
        from estimator_keras.engines.estimator import engine as est_lib  # pylint: disable=import-outside-toplevel

        model_dir = os.path.join(self.settings.workdir, TABLE, "knobs",
                                 "".join(c if c.isalnum() else "_" for c in self.name))
        self.estimator = est_lib.to_estimator(
            _compiled(self.settings, self.precision), model_dir=model_dir,
            session_config=self.config, seed=self.settings.seed)
        self.input_fn = self.input_fn_factory()

    def measure(self):
        steps, seconds = self._run(self.steps)
        return steps * self.batch, seconds

    def extra(self):
        return dict(super().extra(), batch_size=self.batch)


class EvalVariant(Variant):
    """``est.evaluate`` over the whole test split: examples/s of whole calls."""

    consumed = "est.evaluate(test split), whole call"

    def __init__(self, name, settings, path, batch, precision=None, description=""):
        self.name, self.settings, self.path = name, settings, path
        self.batch, self.precision, self.description = batch, precision, description
        self.group = "evaluation"

    def build(self):
        from estimator_keras import inputs  # pylint: disable=import-outside-toplevel
        from estimator_keras.engines.estimator import engine as est_lib  # pylint: disable=import-outside-toplevel

        model_dir = os.path.join(self.settings.workdir, TABLE, "eval",
                                 "".join(c if c.isalnum() else "_" for c in self.name))
        self.estimator = est_lib.to_estimator(_compiled(self.settings, self.precision),
                                              model_dir=model_dir, seed=self.settings.seed)
        train_fn = inputs.make_input_fn(self.path, self.settings.batch_size, training=True,
                                        features={IMAGE: IMAGE}, label=LABEL)
        self.estimator.train(train_fn, steps=1)
        self.eval_fn = inputs.make_input_fn(self.path, self.batch, training=False,
                                            features={IMAGE: IMAGE}, label=LABEL, cache="auto")
        self.examples = common.dataset_info(self.path, "test").num_examples

    def measure(self):
        start = time.perf_counter()
        self.estimator.evaluate(self.eval_fn)
        return self.examples, time.perf_counter() - start

    def extra(self):
        return {"batch_size": self.batch}


def knob_variants(path, settings):
    b = "fp32 batch 128 (default)"
    train = [
        KnobVariant(b, settings, path, description="the experiment's Estimator: float32, "
                    "batch 128, cached pipeline", group="baseline"),
        KnobVariant("mixed_bfloat16", settings, path, precision="mixed_bfloat16",
                    description="bfloat16 compute, float32 weights and softmax"),
        KnobVariant("XLA auto-clustering", settings, path, config=_session_config(xla=True),
                    description="session global_jit_level ON_1 (TF_XLA_FLAGS="
                                "--tf_xla_cpu_global_jit)"),
        KnobVariant("threads inter=1,intra=2", settings, path,
                    config=_session_config(inter=1, intra=2),
                    description="session inter_op=1, intra_op=2 (default 0,0)"),
        KnobVariant("batch 256", settings, path, batch_scale=2,
                    description="batch 256 (examples/s, not steps/s)"),
        KnobVariant("mixed_bfloat16 + batch 256", settings, path, batch_scale=2,
                    precision="mixed_bfloat16", description="both"),
    ]
    evaluation = [
        EvalVariant("evaluate batch 128", settings, path, 128,
                    description="the experiment's evaluation (batch 128)"),
        EvalVariant("evaluate batch 1024", settings, path, 1024,
                    description="the same with batch 1024"),
        EvalVariant("evaluate bf16 batch 128", settings, path, 128, "mixed_bfloat16",
                    description="mixed_bfloat16 model, batch 128"),
        EvalVariant("evaluate bf16 batch 1024", settings, path, 1024, "mixed_bfloat16",
                    description="mixed_bfloat16 model, batch 1024"),
    ]
    return train, evaluation


def run_knobs(path, settings):
    rows = []
    train, evaluation = knob_variants(path, settings)
    for group, reference in ((train, train[0].name), (evaluation, evaluation[0].name)):
        m = common.run_alternating(group, settings.repeats_for(5), f"{TABLE}/knobs",
                                   reference=reference)
        rows += common.rows_from(group, m, reference=reference, unit="examples/s")
    return rows


# --------------------------------------------------------------------------
# Part 2: runs


def _python(spec, settings):
    if spec.get("python") == "keras":
        return settings.python_keras
    return settings.python_estimator or sys.executable


def run_runs(path, settings, names, steps, eval_fraction, learning_rate):
    """Starts every run, gives them turns until all are done; returns rows."""
    import numpy as np  # pylint: disable=import-outside-toplevel

    x, y = common.load_arrays(path, "train")
    tx, ty = common.load_arrays(path, "test")
    arrays_file = os.path.join(settings.workdir, "accuracy-arrays.npz")
    np.savez(arrays_file, x=x, y=y, tx=tx, ty=ty)
    turn = max(1, steps // 12)
    specs = [accuracy_runs.plan_for(name, steps, eval_fraction, turn, learning_rate)
             for name in names]
    # Model dirs of their own: a run must never resume an earlier one.
    runs_dir = tempfile.mkdtemp(prefix="runs-", dir=settings.workdir)
    children, state = [], {}
    for spec in specs:
        state[spec["name"]] = {"spec": spec, "evals": [], "pauses": [], "done": None,
                               "error": None, "turns_s": []}
        python = _python(spec, settings)
        if not python:
            state[spec["name"]]["error"] = "needs a TensorFlow 2.16+ interpreter: --python-keras"
            continue
        children.append(accuracy_runs.start(spec, python, path, arrays_file, runs_dir))
    live = []
    for child in children:
        try:
            child.read()
            live.append(child)
        except turns.ChildError as e:
            state[child.name]["error"] = str(e)[-500:]
            child.close()
    round_no = 0
    while live:
        k = round_no % len(live)
        for child in live[k:] + live[:k]:
            record = state[child.name]
            started = time.perf_counter()
            try:
                events = child.turn()
                record["turns_s"].append(time.perf_counter() - started)
            except turns.ChildError as e:
                record["error"] = str(e)[-500:]
                child.finished = True
                events = []
            for event in events:
                if event.get("event") == "eval":
                    record["evals"].append(event)
                    common.say(f"[{TABLE}] {child.name}: step {event['step']} accuracy "
                               f"{event['accuracy']:.4f} at {event['active_s']:.1f} s")
                elif event.get("event") == "pause":
                    record["pauses"].append((event["step"], event["active_s"]))
                elif event.get("event") == "done":
                    record["done"] = event
        for child in [c for c in live if c.finished]:
            child.close()
        live = [c for c in live if not c.finished]
        round_no += 1
    return [_run_row(state[spec["name"]]) for spec in specs]


def stalled(rows):
    """One line per stalled turn of ``rows`` (see :func:`output.stalled_turns`)."""
    lines = []
    for row in rows:
        times = row.get("turns_s") or []
        for k in row.get("stalled_turns") or []:
            lines.append(f"{row['name']}: turn {k + 1} of {len(times)} took {times[k]:.1f} s, "
                         f"over twice the median of its turns "
                         f"({common.median(times):.1f} s)")
    return lines


def _run_row(record):
    spec, evals, done = record["spec"], record["evals"], record["done"] or {}
    first = next((e for e in evals if e["accuracy"] >= TARGET_ACCURACY), None)
    row = {"name": spec["name"], "description": spec.get("description", ""),
           "steps": evals[-1]["step"] if evals else None,
           "final_accuracy": evals[-1]["accuracy"] if evals else None,
           "best_accuracy": max(e["accuracy"] for e in evals) if evals else None,
           "t091_s": first["active_s"] if first else None,
           "step_091": first["step"] if first else None,
           "wall_s": done.get("active_s"), "evaluations": len(evals),
           "batch_size": spec["batch_size"], "eval_every": spec["eval_every"],
           "learning_rate": spec["learning_rate"],
           "precision": done.get("precision") or spec.get("precision", "float32"),
           "curve": [{"step": e["step"], "active_s": e["active_s"], "accuracy": e["accuracy"],
                      "loss": e.get("loss")} for e in evals],
           "pauses": record["pauses"], "turns_s": record["turns_s"],
           "stalled_turns": output.stalled_turns(record["turns_s"]),
           "versions": {k: done.get(k) for k in ("tensorflow", "keras", "engine", "model_module")}}
    steps_done = done.get("step")
    if steps_done and done.get("active_s"):
        row["steps_per_wall_s"] = steps_done / done["active_s"]
    if record["error"]:
        row["error"] = record["error"]
    return row


def _reached(row, name):
    if row is None:
        return f"no {name} run"
    if row.get("t091_s") is None:
        return (f"{name} never reached {TARGET_ACCURACY} in {row.get('steps')} steps (best "
                f"{output.fmt(row.get('best_accuracy'))})")
    return f"{name} {output.fmt(row['t091_s'])} s to {TARGET_ACCURACY} (step {row['step_091']})"


def _time_target(row, ref):
    ratio = common.ratio(row["t091_s"], ref["t091_s"]) if ref else None
    final = row["final_accuracy"]
    why = (f"{_reached(row, row['name'])}, {_reached(ref, 'plain Keras')}; final accuracy "
           f"{output.fmt(final)}")
    target = common.target(f"accuracy.{row['name']}.time_to_091",
                           f"{row['name']}: time to {TARGET_ACCURACY} / plain Keras's, with final "
                           f"accuracy >= {FINAL_ACCURACY}", ratio, TIME_RATIO, op="<=",
                           why=row.get("error") or why)
    if target["met"] and (final is None or final < FINAL_ACCURACY):
        target["met"] = False
        target["why"] = (f"time ratio {ratio:.3f} is within {TIME_RATIO}, but the final "
                         f"accuracy {output.fmt(final)} < {FINAL_ACCURACY}; {why}")
    return target


def run_targets(rows, steps):
    by = {r["name"]: r for r in rows}
    ref = by.get(accuracy_runs.REFERENCE)
    targets = [_time_target(r, ref) for r in rows if r["name"].startswith("project_")]
    if targets:
        best = min((t for t in targets if t["value"] is not None),
                   key=lambda t: (not t["met"], t["value"]), default=targets[0])
        targets.insert(0, dict(best, id="accuracy.best_time_to_091",
                               description=f"best project run ({best['id'].split('.')[1]}): "
                                           f"time to {TARGET_ACCURACY} / plain Keras's <= "
                                           f"{TIME_RATIO} with final >= {FINAL_ACCURACY}"))
    default = by.get("project_default")
    if default:
        targets.append(common.target(
            "accuracy.issue3_default", f"project default final test accuracy after {steps} "
            f"steps (issue 3)", default["final_accuracy"], ISSUE3_ACCURACY))
        if ref and None not in (default["final_accuracy"], ref["final_accuracy"]):
            targets.append(common.target(
                "accuracy.issue3_vs_keras_accuracy", "project default final accuracy - plain "
                "Keras final accuracy (issue 3)",
                default["final_accuracy"] - ref["final_accuracy"], 0.0))
    keras3 = by.get("project_keras3")
    if keras3:
        targets.append(common.target(
            "accuracy.keras3_final", f"project_keras3 (the keras3 engine, TensorFlow backend) "
            f"final test accuracy after {steps} steps", keras3["final_accuracy"], FINAL_ACCURACY,
            why=keras3.get("error")))
    reshuffle = by.get("project_reshuffle")
    if default and reshuffle:
        targets += reshuffle_targets(default, reshuffle)
    record = by.get("project_record_shuffle")
    if default and record and None not in (default["final_accuracy"], record["final_accuracy"]):
        targets.append(common.target(
            "accuracy.default_vs_record_shuffle", "|final accuracy shuffle=batch - "
            "shuffle=record(10000)|, points (issue 3)",
            abs(default["final_accuracy"] - record["final_accuracy"]) * 100, 0.3, op="<="))
    return targets


def reshuffle_targets(default, reshuffle):
    """What new batches every epoch (cache_shuffle=records) cost and gave:
    the run's working time and final accuracy against project_default's."""
    cost = common.ratio(reshuffle.get("wall_s"), default.get("wall_s"))
    gain = (None if None in (reshuffle.get("final_accuracy"), default.get("final_accuracy"))
            else (reshuffle["final_accuracy"] - default["final_accuracy"]) * 100)
    return [common.target("accuracy.reshuffle_cost", "project_reshuffle (new batches every "
                          "epoch): working time / project_default's (info)", cost,
                          RESHUFFLE_COST, op="<=", why=reshuffle.get("error")),
            common.target("accuracy.reshuffle_gain", "project_reshuffle final accuracy - "
                          "project_default's, points (info: one seed each)", gain, 0.0,
                          why=reshuffle.get("error"))]


def run(settings, path=None, steps=None, runs=None, knobs=True):
    """Runs both parts; ``steps`` defaults to the experiment's max_steps
    (300 with --quick), ``runs`` to :data:`accuracy_runs.DEFAULT_RUNS`."""
    os.environ.setdefault("TF_XLA_FLAGS", XLA_FLAGS)
    common.quiet_tensorflow()
    from experiments.catalog import loading as catalog  # pylint: disable=import-outside-toplevel
    from experiments.catalog import registry  # pylint: disable=import-outside-toplevel

    catalog.load()
    path = path or common.dataset_path(settings)
    config = registry.get(accuracy_runs.EXPERIMENT).config
    steps = int(steps or (300 if settings.quick else config.train.max_steps))
    eval_fraction = config.train.eval_every_steps / config.train.max_steps
    load_start = output.load_average()
    knob_rows = run_knobs(path, settings) if knobs else []
    chosen = runs or settings.accuracy_runs
    auto_float32 = not chosen and _auto_is_float32(config)
    names = list(chosen or accuracy_runs.default_runs(auto_float32))
    notes = [] if knobs else ["the knob screen was not run (--no-accuracy-knobs)"]
    if auto_float32:
        notes.append(f"{accuracy_runs.SAME_AS_DEFAULT_IN_FLOAT32} left out: precision auto is "
                     f"float32 on this CPU (no native bfloat16), so project_default is it")
    rows = run_runs(path, settings, names, steps, eval_fraction, config.train.learning_rate)
    ref = next((r for r in rows if r["name"] == accuracy_runs.REFERENCE), None)
    for row in rows:
        row["ratio"] = common.ratio(row["t091_s"], ref and ref["t091_s"])
    return {"table": TABLE, "title": TITLE, "unit": "", "rows": rows, "knobs": knob_rows,
            "stalled": stalled(rows),
            "columns": ["name", "final_accuracy", "best_accuracy", "t091_s", "ratio",
                        "step_091", "wall_s", "steps", "evaluations", "eval_every",
                        "batch_size", "precision"],
            "targets": run_targets(rows, steps), "steps": steps, "dataset": path,
            "load_before": load_start, "load_after": output.load_average(),
            "notes": [f"t091_s = a run's own working time (its turns only) until its first "
                      f"evaluation at >= {TARGET_ACCURACY} has finished; ratio = t091_s / "
                      f"plain Keras's t091_s", "every run is one uninterrupted process; runs "
                      "take turns on the CPU (benchmarks.turns)", "knobs: examples/s, local "
                      "ratios to the first row of their group"] + notes}


def _auto_is_float32(config):
    from estimator_keras import precision  # pylint: disable=import-outside-toplevel

    return precision.resolve(config.train.precision)[0] == precision.FLOAT32
