"""Table "cluster": examples/s of one process against chief + one worker on
this machine, and the same for the keras3 engine on JAX.

``fashion_mnist_mlp`` trained for the same number of steps by ``python -m
experiments train`` (one process) and by ``python -m experiments cluster
--workers 1`` (a chief and a worker on 127.0.0.1, MultiWorkerMirrored, each
with the same per-replica batch, so two replicas train on twice the
examples per step), at batch 32, 128 (the experiment's) and 1024. The rate
is the progress lines' average ("trained to step N: ... on average": from
the first step to the last, start-up and the final evaluation excluded);
examples/s = steps/s x batch x replicas. The two ways alternate, ``repeats``
times.

The keras3 rows do the same with ``--engine keras3`` and
``KERAS_BACKEND=jax`` under an interpreter with Keras 3 and JAX
(``--python-jax``, else this one or the checkout's ``.venv-jax``): one
process (``train``) against two (``cluster --workers 1``: process 0 and
process 1 joined by ``jax.distributed``, gloo collectives on CPU,
``keras.distribution.DataParallel``; each process feeds its own batch, so
the global batch is twice the batch). Their runs alternate with the other
rows' within each repeat, so all four see the same machine. They are
information, not targets. Without such an interpreter their rows stay in
the table as "not measured", with the reason.

What to expect on one machine (2 cores on the one these tables were
published from): both ways share the same cores, a second process takes
half of them, and every synchronous step adds an all-reduce over gRPC on
loopback (over gloo on JAX), which costs more than a small model's step.
The local cluster proves that distributed training works; speed-ups need
more machines or heavier steps.
"""

import os
import shutil

from benchmarks import common, output

TABLE = "cluster"
TITLE = ("fashion_mnist_mlp: one process vs chief + 1 worker (MultiWorkerMirrored), and the "
         "keras3 engine on JAX: one process vs 2 (DataParallel), examples/s")
EXPERIMENT = "fashion_mnist_mlp"
BATCHES = (32, 128, 1024)
TIMEOUT_S = 1800
# (backend, workers, row label): the table's ways, in the order a repeat runs
# them (reversed in every other repeat). "tf" is the interpreter's own
# engine (--engine auto), "jax" the keras3 engine on KERAS_BACKEND=jax.
WAYS = (("tf", 0, "one process"), ("jax", 0, "keras3 on JAX, one process"),
        ("tf", 1, "chief + 1 worker"), ("jax", 1, "keras3 on JAX, 2 processes"))
JAX_ENV = {"KERAS_BACKEND": "jax", "TF_USE_LEGACY_KERAS": None}


def _one(settings, data, batch, steps, workers, k, jax=None):
    """One run; ``jax``: the interpreter of a keras3-on-JAX run, else None."""
    name = f"b{batch}-w{workers}-{k}" + ("-jax" if jax else "")
    model_dir = os.path.join(settings.workdir, TABLE, name)
    shutil.rmtree(model_dir, ignore_errors=True)
    # Evaluation only after training ends, outside the progress lines' average.
    flags = ["--data-dir", data, "--max-steps", steps, "--batch-size", batch,
             "--eval-every", 1000 * steps, "--strategy", "auto"]
    flags += ["--engine", "keras3"] if jax else []
    if workers:
        log_dir = model_dir + "-logs"
        args = ["cluster", EXPERIMENT, "--workers", workers, "--model-dir", model_dir,
                "--log-dir", log_dir, "--quiet", "--timeout", TIMEOUT_S, *flags]
    else:
        args = ["train", EXPERIMENT, "--model-dir", model_dir, *flags]
    rc, out, err, seconds = common.run_experiments(
        args, TIMEOUT_S + 60, jax or settings.python_estimator, env=JAX_ENV if jax else None)
    text = err
    if workers:
        try:
            with open(os.path.join(log_dir, "chief-0.log")) as f:
                text = f.read()
        except OSError:
            text = out + err
    average = common.training_average(text)
    result = {"seconds": seconds}
    if rc or average is None:
        result["error"] = f"exit {rc}: {(text or out)[-400:]}"
    else:
        step, rate, examples = average
        result.update(step=step, steps_per_s=rate,
                      examples_per_s=examples or rate * batch * (1 + workers))
    shutil.rmtree(model_dir, ignore_errors=True)
    return result


def _row(batch, label, workers, samples, error=None, not_measured=None):
    rates = [r["examples_per_s"] for r in samples]
    row = {"name": f"batch {batch}: {label}", "batch_size": batch, "replicas": 1 + workers,
           "median": common.median(rates) if rates else None,
           "min": min(rates) if rates else None, "max": max(rates) if rates else None,
           "steps_per_s": common.median([r["steps_per_s"] for r in samples])
           if rates else None, "samples": rates, "error": error}
    if not_measured:
        row["not_measured"] = not_measured
    return row


def _pair_ratio(one, two):
    """Sets the rows' ratio (two processes / one); returns it."""
    value = common.ratio(two["median"], one["median"])
    two["ratio"], one["ratio"] = value, 1.0 if one["median"] else None
    return value


def run(settings, batches=None, steps=None):
    common.quiet_tensorflow()
    path = common.dataset_path(settings)
    data = common.experiments_data_dir(settings, path)
    batches = batches or ((128,) if settings.quick else BATCHES)
    steps = steps or (30 if settings.quick else 300)
    repeats = settings.repeats_for(3)
    jax = common.jax_python(settings)
    not_measured = None if jax else common.no_jax_reason(settings)
    ways = [w for w in WAYS if jax or w[0] != "jax"]
    load_start = output.load_average()
    rows, targets, jax_notes, stalls = [], [], [], []
    for batch in batches:
        samples = {(b, w): [] for b, w, _ in WAYS}
        errors = {}
        for k in range(repeats):
            for backend, workers, label in (ways if k % 2 == 0 else ways[::-1]):
                result = _one(settings, data, batch, steps, workers, k,
                              jax if backend == "jax" else None)
                common.say(f"[{TABLE}] batch {batch}, {label}: "
                           f"{result.get('examples_per_s') or result.get('error')}")
                if "error" in result:
                    errors[backend, workers] = result["error"]
                else:
                    samples[backend, workers].append(result)
        by_way = {(b, w): _row(batch, label, w, samples[b, w], errors.get((b, w)),
                               not_measured if b == "jax" else None)
                  for b, w, label in WAYS}
        for row, runs in ((by_way[b, w], samples[b, w]) for b, w, _ in WAYS):
            seconds = [r["seconds"] for r in runs]
            stalls += [f"{row['name']}: run {k + 1} of {len(seconds)} took {seconds[k]:.1f} s, "
                       f"over twice the median of its runs ({common.median(seconds):.1f} s)"
                       for k in output.stalled_turns(seconds)]
        rows.extend(by_way[way] for way in (("tf", 0), ("tf", 1), ("jax", 0), ("jax", 1)))
        value = _pair_ratio(by_way["tf", 0], by_way["tf", 1])
        targets.append(common.target(
            f"cluster.b{batch}", f"batch {batch}: chief + 1 worker / one process, examples/s "
            f"(info: one machine)", value, 1.0,
            why="both processes share this machine's cores, and each synchronous step adds an "
                "all-reduce over loopback gRPC"))
        jax_ratio = _pair_ratio(by_way["jax", 0], by_way["jax", 1])
        if jax_ratio is not None:
            jax_notes.append(f"batch {batch}: keras3 on JAX, 2 processes / one process: "
                             f"{jax_ratio:.2f}x examples/s (information, not a target)")
    cores = os.cpu_count()
    jax_note = (f"keras3 on JAX rows: {jax}, KERAS_BACKEND=jax, --engine keras3; 2 processes = "
                f"cluster --workers 1 (jax.distributed, gloo on CPU, DataParallel), each "
                f"process its own batch; information, not targets: this machine has {cores} "
                f"core(s), which the two processes share" if jax else
                f"keras3 on JAX rows: not measured: {not_measured}")
    return {"table": TABLE, "title": TITLE, "unit": "examples/s", "rows": rows,
            "stalled": stalls,
            "columns": ["name", "median", "min", "max", "ratio", "steps_per_s"],
            "targets": targets, "steps": steps, "dataset": path, "load_before": load_start,
            "load_after": output.load_average(), "python_jax": jax,
            "notes": [f"{steps} steps per run, {repeats} run(s) per way, alternating; rates from "
                      "the chief's progress lines (start-up and evaluation excluded)",
                      jax_note] + jax_notes}
