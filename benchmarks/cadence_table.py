"""Table "cadence": the keras3 engine's wall time at an evaluation cadence
that its steps per call divide and at one that they do not.

``python -m experiments train fashion_mnist_mlp --engine keras3`` with the
experiment's own settings (6000 steps, batch 128, a progress line every 200
steps, float32), once at its own ``--eval-every 2000`` and once at 2001
(three evaluations each), on ``KERAS_BACKEND=tensorflow`` and ``jax``. The
time is the whole command's wall time, as a user waits for it (start-up,
the data cache, evaluations, checkpoints and the export included); the
progress lines' average steps/s is beside it. The two cadences alternate,
``repeats`` times, a fresh model dir each run.

Keras runs whole calls of ``steps_per_execution`` steps; the engine plans
calls of 8 and 7 that end at each evaluation, so 2001 should cost what 2000
does. The target, per backend: the median wall time at 2000 / the median at
2001 >= 0.87 (2001 within 15% of 2000). A whole command's time swings by
10% from run to run on a shared machine, so the medians of 5 runs each are
compared; each repeat's own ratio is listed beside them.
"""

import os
import shutil
import sys

from benchmarks import common, output

TABLE = "cadence"
TITLE = ("keras3 engine, fashion_mnist_mlp as the experiment sets it (6000 steps): wall s at "
         "--eval-every 2000 vs 2001")
EXPERIMENT = "fashion_mnist_mlp"
CADENCES = (2000, 2001)
# --quick: a tenth of the run, to try the table out.
QUICK = (600, (200, 201))
BACKENDS = ("tensorflow", "jax")
TIMEOUT_S = 1800
THRESHOLD = 1 / 1.15


def _one(settings, python, data, backend, every, k):
    """One whole command at ``--eval-every every``: its wall s and average rate."""
    model_dir = os.path.join(settings.workdir, TABLE, f"{backend}-{every}-{k}")
    shutil.rmtree(model_dir, ignore_errors=True)
    args = ["train", EXPERIMENT, "--engine", "keras3", "--data-dir", data,
            "--model-dir", model_dir, "--eval-every", every]
    if settings.quick:
        args += ["--max-steps", QUICK[0]]
    rc, out, err, seconds = common.run_experiments(
        args, TIMEOUT_S, python, env={"KERAS_BACKEND": backend, "TF_USE_LEGACY_KERAS": None})
    shutil.rmtree(model_dir, ignore_errors=True)
    average = common.training_average(err)
    if rc or average is None:
        return {"error": f"exit {rc}: {(err or out)[-400:]}"}
    return {"seconds": seconds, "steps_per_s": average[1], "step": average[0]}


def run(settings):
    common.quiet_tensorflow()
    path = common.dataset_path(settings)
    data = common.experiments_data_dir(settings, path)
    jax = common.jax_python(settings)
    cadences = QUICK[1] if settings.quick else CADENCES
    repeats = settings.repeats_for(5)
    load_start = output.load_average()
    rows, targets = [], []
    for backend in BACKENDS:
        # This table runs under an interpreter with Keras 3 and TensorFlow 2.16+.
        runner = jax if backend == "jax" else sys.executable
        if runner is None:
            reason = common.no_jax_reason(settings)
            for every in cadences:
                rows.append({"name": f"{backend}, --eval-every {every}", "median": None,
                             "not_measured": reason})
            target = common.target(f"cadence.{backend}", f"{backend}: median wall s at "
                                   f"--eval-every {cadences[0]} / at {cadences[1]}", None,
                                   THRESHOLD, why=reason)
            target["per_repeat"] = []
            targets.append(target)
            continue
        samples = {every: [] for every in cadences}
        errors = {}
        for k in range(repeats):
            for every in (cadences if k % 2 == 0 else cadences[::-1]):
                result = _one(settings, runner, data, backend, every, k)
                common.say(f"[{TABLE}] {backend}, --eval-every {every}: "
                           f"{result.get('seconds') or result.get('error')}")
                if "error" in result:
                    errors[every] = result["error"]
                samples[every].append(result)
        for every in cadences:
            seconds = [r["seconds"] for r in samples[every] if "seconds" in r]
            rows.append({"name": f"{backend}, --eval-every {every}",
                         "median": common.median(seconds) if seconds else None,
                         "min": min(seconds) if seconds else None,
                         "max": max(seconds) if seconds else None,
                         "steps_per_s": common.median([r["steps_per_s"] for r in samples[every]
                                                       if "steps_per_s" in r]) if seconds else None,
                         "samples": seconds, "error": errors.get(every)})
        per_repeat = [common.ratio(a.get("seconds"), b.get("seconds"))
                      for a, b in zip(samples[cadences[0]], samples[cadences[1]])]
        medians = [row["median"] for row in rows[-2:]]
        target = common.target(
            f"cadence.{backend}", f"{backend}: median wall s at --eval-every {cadences[0]} / "
            f"at {cadences[1]} ({cadences[1]} within 15% of {cadences[0]})",
            common.ratio(*medians), THRESHOLD)
        target["per_repeat"] = per_repeat
        targets.append(target)
    return {"table": TABLE, "title": TITLE, "unit": "wall s", "rows": rows,
            "columns": ["name", "median", "min", "max", "steps_per_s"],
            "targets": targets, "dataset": path, "load_before": load_start,
            "load_after": output.load_average(),
            "notes": [f"{repeats} run(s) per cadence and backend, alternating; wall s of the "
                      f"whole `python -m experiments train` command; steps_per_s from its "
                      f"progress lines' average"] + [
                f"{t['id']}: each repeat's ratio " + ", ".join(
                    output.fmt_value(v) if v is not None else "-" for v in t["per_repeat"])
                for t in targets]}
