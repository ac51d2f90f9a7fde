"""Table "embedding": steps/s of a 1M-row Embedding on the estimator engine
under multi_worker_mirrored, its gradient summed dense (the engine's way)
and as sparse rows.

A chief and one worker of a local cluster (``launch_local_cluster``, the
private network namespace where the system allows it) train a model of one
``Embedding(1,000,000, 128)`` table (float32, 512 MB), 8 lookups per
example, batch 64 per worker, Flatten and a softmax Dense, with legacy SGD:

- ``dense``: the engine's :func:`~estimator_keras.engines.estimator.engine.to_estimator`,
  whose optimizer sums every gradient across the workers as a dense tensor
  (the whole table, every step; see ``sums_sparse_as_dense`` for why);
- ``sparse``: ``model_to_estimator`` with the optimizer's own aggregation,
  which all-gathers the rows a step used (IndexedSlices: 512 rows of 128
  floats per worker). It trains here because every batch of this pipeline is
  full; a short batch would fail it (the reason the engine sums dense).

The rate is the chief's steps/s from step ``WARMUP`` to the last (start-up,
the first steps' tracing and the initial checkpoint excluded). The two ways
alternate, ``repeats`` times. Information, not a target: it sizes what the
engine's note about the dense sum says, on one 2-core machine where both
tasks share the cores and talk over loopback.
"""

import json
import os
import shutil
import sys
import tempfile
import time

from benchmarks import common, output

TABLE = "embedding"
TITLE = ("estimator engine, multi_worker_mirrored (chief + 1 worker): a 1,000,000 x 128 "
         "Embedding's gradient summed dense vs as sparse rows, steps/s")
ROWS, DIM, LOOKUPS, BATCH = 1_000_000, 128, 8, 64
STEPS, WARMUP = 40, 5
# --quick: a smaller table and run, to try the table out.
QUICK = (100_000, 15, 3)
MODES = ("dense", "sparse")
TIMEOUT_S = 1800


def task():
    """One task of the cluster (argv: mode, rows, steps, warmup, model dir,
    the chief's result file)."""
    mode, rows, steps, warmup, model_dir, out = sys.argv[1:7]
    rows, steps, warmup = int(rows), int(steps), int(warmup)
    task_config = json.loads(os.environ["TF_CONFIG"])["task"]
    chief = task_config["type"] == "chief"
    if not chief:
        # A folder of its own: two tasks writing model_to_estimator's
        # initial-weights file at once can corrupt it (the engine has the
        # workers wait for the chief's instead).
        model_dir = f"{model_dir}-{task_config['type']}-{task_config['index']}"
    tf = common.quiet_tensorflow()
    # Before any eager op: collectives are configured at the strategy's creation.
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    import numpy as np  # pylint: disable=import-outside-toplevel
    from estimator_keras.engines.estimator import engine as est  # pylint: disable=import-outside-toplevel

    tf.keras.utils.set_random_seed(0)  # the same initial weights in every task
    ids = tf.keras.Input((LOOKUPS,), dtype="int64", name="ids")
    x = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(rows, DIM, name="table")(ids))
    model = tf.keras.Model(ids, tf.keras.layers.Dense(2, activation="softmax")(x))
    model.compile(optimizer=tf.keras.optimizers.legacy.SGD(0.01),
                  loss="sparse_categorical_crossentropy")
    config = est.run_config(model_dir, save_checkpoints_steps=10 * steps,
                            train_distribute=strategy, summaries=False)
    if mode == "dense":
        estimator = est.to_estimator(model, config=config)
    else:
        estimator = tf.keras.estimator.model_to_estimator(
            keras_model=model, config=config, checkpoint_format="checkpoint")
    rng = np.random.default_rng(0)
    features = rng.integers(0, rows, (4096, LOOKUPS))
    labels = rng.integers(0, 2, 4096)

    def input_fn(input_context=None):  # pylint: disable=unused-argument
        data = tf.data.Dataset.from_tensor_slices(({"ids": features}, labels))
        return data.repeat().batch(BATCH, drop_remainder=True)

    class Times(tf.estimator.SessionRunHook):
        def __init__(self):
            self.times = []

        def after_run(self, run_context, run_values):
            self.times.append(time.perf_counter())

    times = Times()
    # Under multi_worker_mirrored the Estimator trains only through
    # train_and_evaluate; one evaluation step at the end, after the timed steps.
    tf.estimator.train_and_evaluate(
        estimator, tf.estimator.TrainSpec(input_fn, max_steps=steps, hooks=[times]),
        tf.estimator.EvalSpec(input_fn, steps=1, start_delay_secs=0, throttle_secs=10**6))
    if chief:
        measured = times.times[warmup - 1:]
        rate = (len(measured) - 1) / (measured[-1] - measured[0])
        with open(out, "w", encoding="utf-8") as f:
            json.dump({"steps_per_s": rate, "steps": len(times.times)}, f)


def _one(settings, mode, rows, steps, warmup, k):
    from estimator_keras.distribute import launcher  # pylint: disable=import-outside-toplevel

    folder = tempfile.mkdtemp(prefix=f"{mode}-{k}-", dir=settings.workdir)
    out = os.path.join(folder, "chief.json")
    command = [sys.executable, "-c", "from benchmarks import embedding_table as t; t.task()",
               mode, rows, steps, warmup, os.path.join(folder, "model"), out]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(common.HERE),
                                                     env.get("PYTHONPATH")) if p)
    try:
        result = launcher.launch_local_cluster([str(a) for a in command], workers=1,
                                               log_dir=os.path.join(folder, "logs"),
                                               timeout=TIMEOUT_S, env=env, echo=False)
        with open(out, encoding="utf-8") as f:
            measured = json.load(f)
        measured["network"] = result.network
        return measured
    except (launcher.ClusterError, OSError, ValueError) as e:
        return {"error": f"{type(e).__name__}: {str(e)[-400:]}"}
    finally:
        for name in ("model", "model-worker-0"):
            shutil.rmtree(os.path.join(folder, name), ignore_errors=True)


def run(settings):
    common.quiet_tensorflow()
    rows, steps, warmup = QUICK if settings.quick else (ROWS, STEPS, WARMUP)
    repeats = settings.repeats_for(3)
    load_start = output.load_average()
    samples = {mode: [] for mode in MODES}
    for k in range(repeats):
        for mode in (MODES if k % 2 == 0 else MODES[::-1]):
            result = _one(settings, mode, rows, steps, warmup, k)
            common.say(f"[{TABLE}] {mode}: {result.get('steps_per_s') or result.get('error')}")
            samples[mode].append(result)
    rows_out = []
    for mode in MODES:
        rates = [r["steps_per_s"] for r in samples[mode] if "steps_per_s" in r]
        errors = [r["error"] for r in samples[mode] if "error" in r]
        rows_out.append({"name": f"{mode} sum", "median": common.median(rates) if rates else None,
                         "min": min(rates) if rates else None,
                         "max": max(rates) if rates else None, "samples": rates,
                         "error": errors[0] if errors else None})
    per_repeat = [common.ratio(s.get("steps_per_s"), d.get("steps_per_s"))
                  for d, s in zip(samples["dense"], samples["sparse"])]
    networks = sorted({r["network"] for rs in samples.values() for r in rs if "network" in r})
    size_mb = rows * DIM * 4 / 2**20
    return {"table": TABLE, "title": TITLE, "unit": "steps/s", "rows": rows_out,
            "columns": ["name", "median", "min", "max"], "targets": [],
            "load_before": load_start, "load_after": output.load_average(),
            "notes": [
                f"{rows:,} x {DIM} float32 table ({size_mb:,.0f} MB), {LOOKUPS} lookups per "
                f"example, batch {BATCH} per worker, legacy SGD; {steps} steps a run, the rate "
                f"from step {warmup}; {repeats} run(s) per way, alternating; network "
                f"{', '.join(networks) or '-'}",
                "sparse / dense steps/s per repeat: " + ", ".join(
                    output.fmt_value(v) if v is not None else "-" for v in per_repeat),
                "sparse / dense of the medians: " + output.fmt_value(common.ratio(
                    rows_out[1]["median"], rows_out[0]["median"]))]}
