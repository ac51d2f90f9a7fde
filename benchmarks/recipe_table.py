"""Table "recipe" (slow): the built-in ``fashion_mnist_cnn`` as a user runs it
on the keras3 engine, against plain Keras 3 given the same recipe.

Every run uses the experiment's own settings: its steps (6000), batch (128),
evaluation cadence (469 steps, an epoch), Adam 2e-3 with a cosine decay to a
tenth, and its seed. The engine runs as ``python -m experiments train
fashion_mnist_cnn --engine keras3`` does (the experiment's plan and the
engine's ``train``; :mod:`benchmarks.accuracy_runs`, kind ``project``): at
its registered precision ("auto": bfloat16 where the CPU has it natively)
and in float32. Plain Keras 3 (``Model.fit`` on the numpy arrays, validation
every epoch) runs at its defaults (float32, ``steps_per_execution=1``) and
with the two knobs the engine sets for itself: ``steps_per_execution=8``,
then mixed_bfloat16 too, a careful user's best.

Runs are whole processes taking turns on the CPU (:mod:`benchmarks.turns`),
so the machine's drift hits them alike; a run's clock counts its own turns.
Each pair compares like with like (bfloat16 with bfloat16, float32 with
float32): the ratio of the engine's time to the peer's, for the whole run
and to the first evaluation at 0.91 test accuracy.
"""

from benchmarks import accuracy_runs, accuracy_table, common, output

TABLE = "recipe"
TITLE = ("fashion_mnist_cnn's own recipe: keras3 engine vs plain Keras 3 at its default and "
         "best (TF backend, whole runs)")
ENGINE_AUTO, ENGINE_FP32 = "project_keras3", "project_keras3_fp32"
PEER_DEFAULT, PEER_SPE8, PEER_BEST = ("keras3_recipe", "keras3_recipe_spe8",
                                      "keras3_recipe_bf16_spe8")
RUNS = (ENGINE_AUTO, ENGINE_FP32, PEER_DEFAULT, PEER_SPE8, PEER_BEST)
# (target id, engine run, peer run, what the pair compares); a target is the
# engine's time over the peer's.
PAIRS = (
    ("bf16_vs_best", ENGINE_AUTO, PEER_BEST, "bfloat16: engine as registered vs the peer's best "
                                             "(steps_per_execution=8, mixed_bfloat16)"),
    ("fp32_vs_spe8", ENGINE_FP32, PEER_SPE8, "float32: engine vs the peer with "
                                             "steps_per_execution=8"),
    ("fp32_vs_default", ENGINE_FP32, PEER_DEFAULT, "float32: engine vs the peer at its "
                                                   "defaults"),
    ("default_vs_default", ENGINE_AUTO, PEER_DEFAULT, "what each gives a user who sets "
                                                      "nothing: engine as registered vs the "
                                                      "peer at its defaults"),
)
# Targeted pairs: the engine is no slower than a careful user of plain Keras
# by more than this, like for like.
TARGETED = ("bf16_vs_best", "fp32_vs_spe8")
THRESHOLD = 1.10


def pair_rows(rows):
    """One row per pair: the engine's wall s and time to 0.91 over the peer's."""
    by = {row["name"]: row for row in rows}
    pairs = []
    for pid, engine, peer, description in PAIRS:
        e, p = by.get(engine) or {}, by.get(peer) or {}
        pairs.append({"name": pid, "description": description, "engine": engine, "peer": peer,
                      "precision": f"{e.get('precision')} / {p.get('precision')}",
                      "wall_ratio": common.ratio(e.get("wall_s"), p.get("wall_s")),
                      "t091_ratio": common.ratio(e.get("t091_s"), p.get("t091_s")),
                      "step_091": f"{e.get('step_091')} / {p.get('step_091')}"})
    return pairs


def pair_targets(pairs):
    targets = []
    for pair in pairs:
        if pair["name"] not in TARGETED:
            continue
        for what, key in (("whole run", "wall_ratio"), ("time to 0.91", "t091_ratio")):
            targets.append(common.target(
                f"recipe.{pair['name']}.{key.split('_')[0]}",
                f"{pair['description']}: {what}, engine / peer <= {THRESHOLD}",
                pair[key], THRESHOLD, op="<=",
                why=f"first evaluation at 0.91: step {pair['step_091']} (engine / peer)"))
    return targets


def run(settings):
    common.quiet_tensorflow()
    from experiments.catalog import loading as catalog  # pylint: disable=import-outside-toplevel
    from experiments.catalog import registry  # pylint: disable=import-outside-toplevel

    catalog.load()
    path = common.dataset_path(settings)
    train = registry.get(accuracy_runs.EXPERIMENT).config.train
    steps = 300 if settings.quick else train.max_steps
    load_start = output.load_average()
    fraction = train.eval_every_steps / train.max_steps
    every = round(steps * fraction)
    rows = accuracy_table.run_runs(path, settings, list(RUNS), steps, fraction,
                                   train.learning_rate)
    for row in rows:
        row["steps_per_execution"] = accuracy_runs.RUNS[row["name"]].get(
            "steps_per_execution", "engine's" if row["name"].startswith("project") else 1)
    pairs = pair_rows(rows)
    return {"table": TABLE, "title": TITLE, "unit": "s", "rows": rows, "pairs": pairs,
            "stalled": accuracy_table.stalled(rows),
            "columns": ["name", "precision", "steps_per_execution", "wall_s",
                        "steps_per_wall_s", "t091_s", "step_091", "final_accuracy",
                        "evaluations"],
            "targets": pair_targets(pairs), "steps": steps, "dataset": path,
            "load_before": load_start, "load_after": output.load_average(),
            "notes": [f"{steps} steps, batch {train.batch_size}, the engine evaluating every "
                      f"{every} steps (the peer: every epoch), Adam {train.learning_rate} with "
                      f"a cosine decay" + (": the experiment's own settings"
                                           if steps == train.max_steps else
                                           f" (--quick: the experiment runs {train.max_steps}"
                                           f" steps, evaluating every "
                                           f"{train.eval_every_steps})"), "wall_s and t091_s count a run's own turns only "
                      "(benchmarks.turns); ratios are engine / peer, below 1 the engine is "
                      "faster"] + [
                f"{p['name']}: wall {output.fmt_value(p['wall_ratio'])}, to 0.91 "
                f"{output.fmt_value(p['t091_ratio'])} ({p['description']})" for p in pairs]}
