"""Table "cluster": examples/s of one process against chief + one worker on
this machine.

``fashion_mnist_mlp`` trained for the same number of steps by ``python -m
experiments train`` (one process) and by ``python -m experiments cluster
--workers 1`` (a chief and a worker on 127.0.0.1, MultiWorkerMirrored, each
with the same per-replica batch, so two replicas train on twice the
examples per step), at batch 32, 128 (the experiment's) and 1024. The rate
is the progress lines' average ("trained to step N: ... on average": from
the first step to the last, start-up and the final evaluation excluded);
examples/s = steps/s x batch x replicas. The two ways alternate, ``repeats``
times.

What to expect on one machine: both ways share the same cores, a second
process takes half of them, and every synchronous step adds an all-reduce
over gRPC on loopback, which costs more than a small model's step. The
local cluster proves that distributed training works; speed-ups need more
machines or heavier steps.
"""

import os
import shutil

from benchmarks import common

TABLE = "cluster"
TITLE = "fashion_mnist_mlp: one process vs chief + 1 worker (MultiWorkerMirrored), examples/s"
EXPERIMENT = "fashion_mnist_mlp"
BATCHES = (32, 128, 1024)
TIMEOUT_S = 1800


def _one(settings, data, batch, steps, workers, k):
    model_dir = os.path.join(settings.workdir, TABLE, f"b{batch}-w{workers}-{k}")
    shutil.rmtree(model_dir, ignore_errors=True)
    # Evaluation only after training ends, outside the progress lines' average.
    flags = ["--data-dir", data, "--max-steps", steps, "--batch-size", batch,
             "--eval-every", 1000 * steps, "--strategy", "auto"]
    if workers:
        log_dir = model_dir + "-logs"
        args = ["cluster", EXPERIMENT, "--workers", workers, "--model-dir", model_dir,
                "--log-dir", log_dir, "--quiet", "--timeout", TIMEOUT_S, *flags]
    else:
        args = ["train", EXPERIMENT, "--model-dir", model_dir, *flags]
    rc, out, err, seconds = common.run_experiments(args, TIMEOUT_S + 60,
                                                   settings.python_estimator)
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


def run(settings, batches=None, steps=None):
    common.quiet_tensorflow()
    path = common.dataset_path(settings)
    data = common.experiments_data_dir(settings, path)
    batches = batches or ((128,) if settings.quick else BATCHES)
    steps = steps or (30 if settings.quick else 300)
    repeats = settings.repeats_for(3)
    load_start = common.load_average()
    rows, targets = [], []
    for batch in batches:
        samples = {0: [], 1: []}
        errors = {}
        for k in range(repeats):
            for workers in ((0, 1) if k % 2 == 0 else (1, 0)):
                result = _one(settings, data, batch, steps, workers, k)
                common.say(f"[{TABLE}] batch {batch}, {1 + workers} process(es): "
                           f"{result.get('examples_per_s') or result.get('error')}")
                if "error" in result:
                    errors[workers] = result["error"]
                else:
                    samples[workers].append(result)
        for workers, label in ((0, "one process"), (1, "chief + 1 worker")):
            rates = [r["examples_per_s"] for r in samples[workers]]
            rows.append({"name": f"batch {batch}: {label}", "batch_size": batch,
                         "replicas": 1 + workers, "median": common.median(rates) if rates else None,
                         "min": min(rates) if rates else None, "max": max(rates) if rates else None,
                         "steps_per_s": common.median([r["steps_per_s"] for r in samples[workers]])
                         if rates else None, "samples": rates, "error": errors.get(workers)})
        one, two = rows[-2]["median"], rows[-1]["median"]
        rows[-1]["ratio"], rows[-2]["ratio"] = common.ratio(two, one), 1.0 if one else None
        targets.append(common.target(
            f"cluster.b{batch}", f"batch {batch}: chief + 1 worker / one process, examples/s "
            f"(info: one machine)", common.ratio(two, one), 1.0,
            why="both processes share this machine's cores, and each synchronous step adds an "
                "all-reduce over loopback gRPC"))
    return {"table": TABLE, "title": TITLE, "unit": "examples/s", "rows": rows,
            "columns": ["name", "median", "min", "max", "ratio", "steps_per_s"],
            "targets": targets, "steps": steps, "dataset": path, "load_before": load_start,
            "load_after": common.load_average(),
            "notes": [f"{steps} steps per run, {repeats} run(s) per way, alternating; rates from "
                      "the chief's progress lines (start-up and evaluation excluded)"]}
