"""Table "grain_accuracy" (slow): ``fashion_mnist_cnn`` trained whole by the
keras3 engine on JAX, reading its records through Grain, in an interpreter
meant to have no TensorFlow.

One run of what a user types: ``python -m experiments train
fashion_mnist_cnn --engine keras3 --hparams pipeline=grain`` with
``KERAS_BACKEND=jax``, under ``--python-jax`` (default: this interpreter,
or the checkout's ``.venv-jax``, where JAX imports). Every other setting is
the experiment's default (6000 steps, batch 128, an evaluation every 469
steps, Adam 2e-3 with a cosine decay, ``precision="auto"``); ``pipeline=grain``
is what ``auto`` picks where TensorFlow is not installed, asked for by name
so that the run reads through Grain in any interpreter. The run keeps its
evaluations in a file (``--evaluations-file``): ``t091_s`` is the seconds
from starting the process (imports and the records' index included) to the
end of the first evaluation at or above 0.91, ``final_accuracy`` the last
evaluation's. The interpreter is probed first, and the run reports at its
exit whether TensorFlow was imported in it; the row says both.

Targets: final accuracy >= 0.925; the run imports no TensorFlow. It is one
run alone (the machine's other load counts), not in rounds: a full one
takes over an hour on this 2-core machine. ``--quick`` trains 64 steps,
evaluating every 32, which checks the table, not the targets.
"""

import json
import os
import re
import subprocess
import time

from benchmarks import common, grain_table, output

TABLE = "grain_accuracy"
TITLE = ("fashion_mnist_cnn on the keras3 engine, JAX, Grain pipeline, defaults: time to 0.91 "
         "and final test accuracy, without TensorFlow")
EXPERIMENT = "fashion_mnist_cnn"
TARGET_ACCURACY = 0.91
FINAL_ACCURACY = 0.925
RUN_TIMEOUT_S = 5 * 3600
QUICK_STEPS, QUICK_EVERY = 64, 32
MARK = "@@grain-accuracy "
# Runs `python -m experiments` and says at exit whether TensorFlow was imported.
WRAPPER = ("import atexit, json, sys\n"
           "atexit.register(lambda: sys.stderr.write('" + MARK + "' + json.dumps("
           "{'tensorflow_imported': 'tensorflow' in sys.modules}) + '\\n'))\n"
           "from experiments.cli import main\n"
           "sys.exit(main(sys.argv[1:]))\n")
PROBE = ("import importlib.util, json\n"
         "from importlib import metadata\n"
         "def version(name):\n"
         "    try:\n"
         "        return metadata.version(name)\n"
         "    except metadata.PackageNotFoundError:\n"
         "        return None\n"
         "print(json.dumps({'tensorflow_installed': importlib.util.find_spec('tensorflow') "
         "is not None, 'versions': {n: version(n) for n in ('keras', 'jax', 'grain', "
         "'tensorflow', 'tensorflow-cpu')}}))\n")


def probe(python):
    proc = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=300,
                          check=False, env=grain_table.keras3_jax_env())
    if proc.returncode:
        raise RuntimeError(f"{python} could not be probed: {proc.stderr.strip()[-300:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def train_args(data_dir, model_dir, evaluations_file, quick=False, steps=None):
    args = ["train", EXPERIMENT, "--engine", "keras3", "--data-dir", data_dir,
            "--model-dir", model_dir, "--evaluations-file", evaluations_file,
            "--hparams", "pipeline=grain"]
    if quick:
        args += ["--max-steps", str(steps or QUICK_STEPS), "--eval-every", str(QUICK_EVERY)]
    elif steps:
        args += ["--max-steps", str(steps)]
    return args


def run_row(python, data_dir, workdir, quick=False, steps=None):
    """Trains once; returns the row (``error`` where the run failed)."""
    from experiments.tuning import evaluations  # pylint: disable=import-outside-toplevel

    model_dir = os.path.join(workdir, TABLE, "model")
    evaluations_file = os.path.join(workdir, TABLE, "evaluations.jsonl")
    os.makedirs(os.path.dirname(model_dir), exist_ok=True)
    row = {"name": f"{EXPERIMENT} keras3[jax] grain", "group": "run", "python": python,
           "description": "python -m experiments train fashion_mnist_cnn --engine keras3 "
                          "--hparams pipeline=grain, KERAS_BACKEND=jax, the experiment's "
                          "defaults" + (" (--quick: fewer steps)" if quick else "")}
    try:
        row.update(probe(python))
    except (RuntimeError, OSError, subprocess.TimeoutExpired, ValueError) as e:
        row["error"] = str(e)[:500]
        return row
    argv = [python, "-c", WRAPPER] + train_args(data_dir, model_dir, evaluations_file, quick,
                                                steps)
    started = time.time()
    try:
        proc = subprocess.run(argv, cwd=os.path.dirname(common.HERE), env=grain_table.keras3_jax_env(),
                              capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                              check=False)
    except subprocess.TimeoutExpired:
        row["error"] = f"the run did not end in {RUN_TIMEOUT_S} s"
        return row
    row["wall_s"] = time.time() - started
    text = proc.stdout + "\n" + proc.stderr
    found = re.findall(re.escape(MARK) + r"(\{.*\})", proc.stderr)
    row["tensorflow_imported"] = json.loads(found[-1])["tensorflow_imported"] if found else None
    pipeline = re.findall(r"; input (\w+)", text)
    row["pipeline"] = pipeline[0] if pipeline else None
    average = common.training_average(text)
    if average:
        row["steps"], row["steps_per_s"] = average[0], average[1]
    evals = [e for e in evaluations.read(evaluations_file) if "accuracy" in e.metrics]
    row.update(fill_evaluations(evals, started))
    if proc.returncode:
        row["error"] = (f"exit status {proc.returncode}: "
                        f"{proc.stderr.replace(MARK, '').strip()[-400:]}")
    return row


def fill_evaluations(evals, started):
    """The row's accuracy fields from the run's evaluations (``started``:
    the process's start, in ``time.time()`` seconds)."""
    first = next((e for e in evals if e.metrics["accuracy"] >= TARGET_ACCURACY), None)
    return {"evaluations": len(evals),
            "final_accuracy": evals[-1].metrics["accuracy"] if evals else None,
            "best_accuracy": max(e.metrics["accuracy"] for e in evals) if evals else None,
            "t091_s": first.time - started if first else None,
            "step_091": first.step if first else None,
            "curve": [{"step": e.step, "s": round(e.time - started, 1),
                       "accuracy": e.metrics["accuracy"]} for e in evals]}


def targets_of(row):
    why = row.get("error")
    reached = (f"first at 0.91 after {output.fmt(row['t091_s'])} s (step {row['step_091']})"
               if row.get("t091_s") is not None else "never at 0.91")
    imported = row.get("tensorflow_imported")
    installed = row.get("tensorflow_installed")
    return [
        common.target(f"{TABLE}.final", "fashion_mnist_cnn, keras3 on JAX fed by Grain, "
                      "defaults: final test accuracy", row.get("final_accuracy"),
                      FINAL_ACCURACY, why=why or reached),
        common.target(f"{TABLE}.no_tensorflow", "the run imported no TensorFlow (1 = none)",
                      None if imported is None else float(not imported), 1.0,
                      why=why or (f"TensorFlow is {'' if installed else 'not '}installed in "
                                  f"{row.get('python')}")),
    ]


def run(settings, steps=None):
    python = common.jax_python(settings)
    load_start = output.load_average()
    if python is None:
        row = {"name": f"{EXPERIMENT} keras3[jax] grain", "error": common.no_jax_reason(settings)}
    else:
        path = common.dataset_path(settings)
        data_dir = common.experiments_data_dir(settings, path)
        row = run_row(python, data_dir, settings.workdir, settings.quick, steps)
    return {"table": TABLE, "title": TITLE, "unit": "s", "rows": [row],
            "targets": targets_of(row),
            "columns": ["name", "tensorflow_installed", "tensorflow_imported", "pipeline",
                        "steps", "wall_s", "t091_s", "step_091", "final_accuracy",
                        "steps_per_s"],
            "load_before": load_start, "load_after": output.load_average(),
            "notes": ["t091_s and wall_s: seconds from starting the process, its imports "
                      "included; steps_per_s: the run's own average (its last progress line)",
                      f"interpreter: {python or 'none'}"]}
