"""``python -m benchmarks``: run the tables, print them, write JSON and plots.

Example::

    python -m benchmarks --tables all --data-dir data --json benchmarks/results/all.json
    python -m benchmarks --tables all --quick --data-dir data
    python -m benchmarks --tables input,training --data-dir data

With more than one table, each table runs in its own child process (so one
table's TensorFlow state, thread pools and memory cannot colour the next),
and the parent merges their results. The tables whose targets are ratios
run ``--rounds`` times (3 by default, 1 with ``--quick``), each round a fresh
process; a target is met only when every round meets it, and each target
shows its spread over the rounds (:mod:`benchmarks.rounds`). A table runs
under the interpreter of the environment it needs: the keras table under
TensorFlow 2.16+ with tf-keras (``--python-keras``, by default
``.venv-keras/bin/python`` of the checkout), the Estimator tables under
TensorFlow 2.15 (``--python-estimator``, by default this interpreter when it
has tf.estimator, else ``.venv/bin/python``).
"""

import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata

from benchmarks import accuracy_runs, common, output, plots, rounds
from estimator_keras import engines
from experiments.config import parsing

# name -> (module, the environment it runs in: "estimator", "keras" or "any").
TABLES = {
    "input": ("benchmarks.input_table", "estimator"),
    "training": ("benchmarks.training_table", "estimator"),
    "inputbound": ("benchmarks.inputbound_table", "estimator"),
    "writing": ("benchmarks.writing_table", "any"),
    # Needs the beam extra (Apache Beam) in that interpreter.
    "beam": ("benchmarks.beam_table", "any"),
    "keras": ("benchmarks.keras_table", "keras"),
    "accuracy": ("benchmarks.accuracy_table", "estimator"),
    "shapes": ("benchmarks.shapes_table", "any"),
    "cluster": ("benchmarks.cluster_table", "any"),
    "cadence": ("benchmarks.cadence_table", "keras"),
    "embedding": ("benchmarks.embedding_table", "estimator"),
    "recipe": ("benchmarks.recipe_table", "keras"),
    # Exact resume's cost; the steady state and the skip on any TensorFlow.
    "resume": ("benchmarks.resume_table", "any"),
    # Needs the tune and bench extras (Optuna, keras-tuner) in that interpreter.
    "tuning": ("benchmarks.tuning_table", "keras"),
    # Grain vs tf.data, alone and feeding the keras3 engine on JAX (Grain and JAX
    # beside TensorFlow: the keras environment).
    "grain": ("benchmarks.grain_table", "keras"),
    # fashion_mnist_cnn whole on JAX and Grain, under --python-jax (slow).
    "grain_accuracy": ("benchmarks.grain_accuracy_table", "any"),
}
DEFAULT_TABLES = ("input", "training", "inputbound", "writing")
# Tables run --rounds times: their targets are ratios of rates measured side by
# side, or (recipe) of whole runs taking turns; the cluster table's ratios are
# information about one shared machine, which one round cannot show. Not the
# accuracy table (whole training runs of every way, hours a round).
ROUND_TABLES = ("input", "training", "inputbound", "keras", "cadence", "embedding", "recipe",
                "cluster", "grain")
DEFAULT_ROUNDS = 3
# Per-table bound on a child process, seconds (accuracy and shapes train for long).
CHILD_TIMEOUT = {"accuracy": 6 * 3600, "shapes": 5 * 3600, "recipe": 2 * 3600,
                 "tuning": 4 * 3600, "grain": 2 * 3600, "grain_accuracy": 6 * 3600}
DEFAULT_CHILD_TIMEOUT = 3600
REPO_ROOT = os.path.dirname(common.HERE)


def build_parser():
    p = parsing.Parser(
        prog="python -m benchmarks",
        description="Benchmarks of estimator-keras on Fashion-MNIST TFRecords: input "
                    "pipelines, training steps/s, input-boundness, writing, the keras "
                    "engine, time to accuracy, shapes_unet's quality, one process against "
                    "chief + worker.")
    p.add_argument("--tables", default=",".join(DEFAULT_TABLES),
                   help=f"comma-separated tables among {', '.join(TABLES)}, or all "
                        f"(default: {','.join(DEFAULT_TABLES)}; keras, accuracy, shapes and "
                        f"cluster run when named or with all)")
    p.add_argument("--data-dir", default="data",
                   help="a dataset directory (with dataset.json), or a folder where "
                        "fashion_mnist/ is or will be prepared (default: data)")
    p.add_argument("--quick", action="store_true",
                   help="fewer repeats, shorter windows, less data: for development")
    p.add_argument("--json", default=common.DEFAULT_JSON,
                   help="where to write the results (default: benchmarks/results/latest.json)")
    p.add_argument("--examples", type=int, default=None,
                   help="use only the first N training examples")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed windows per variant (default: 3-7 by table; --quick 2)")
    p.add_argument("--window", type=float, default=None,
                   help="target seconds per timed window (default 1.5; --quick 0.4)")
    p.add_argument("--workdir", default=None,
                   help="scratch folder (default: a new temporary folder, removed at the end)")
    p.add_argument("--accuracy-steps", type=int, default=None,
                   help="training steps of the accuracy table (default: the experiment's, 6000)")
    p.add_argument("--accuracy-runs", default=None, metavar="A,B",
                   help=f"the accuracy table's runs (default: "
                        f"{','.join(accuracy_runs.DEFAULT_RUNS)}; see "
                        f"benchmarks/accuracy_runs.py)")
    p.add_argument("--no-accuracy-knobs", dest="accuracy_knobs", action="store_false",
                   help="the accuracy table's whole runs only, without its knob screen "
                        "(examples/s of bfloat16, XLA, threads, batch sizes)")
    p.add_argument("--rounds", type=int, default=None,
                   help=f"runs of each of {', '.join(ROUND_TABLES)}, each in a fresh process; "
                        f"a target is met only when every round meets it (default "
                        f"{DEFAULT_ROUNDS}; --quick 1)")
    p.add_argument("--python-estimator", default=None, metavar="PYTHON",
                   help="interpreter with TensorFlow 2.15 and tf.estimator")
    p.add_argument("--python-keras", default=None, metavar="PYTHON",
                   help="interpreter with TensorFlow 2.16+ and tf-keras")
    p.add_argument("--python-jax", default=None, metavar="PYTHON",
                   help="interpreter with Keras 3 and JAX for the JAX rows of the keras "
                        "and cluster tables and the grain_accuracy table's run (one without "
                        "TensorFlow there) (default: the table's own interpreter, or "
                        ".venv-jax/bin/python of the checkout, where JAX imports)")
    p.add_argument("--no-plots", action="store_true", help="write no PNG plots")
    p.add_argument("--in-process", action="store_true",
                   help="run every table in this process instead of one child per table")
    return p


def _version(*names):
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def environment_of(python=None):
    """"estimator", "keras" or None: what this interpreter (or ``python``) runs."""
    if python is None:
        tensorflow = _version("tensorflow", "tensorflow-cpu")
        if not tensorflow:
            return None
        if _version("tensorflow-estimator", "tensorflow_estimator"):
            return "estimator"
        return "keras" if _version("tf-keras", "tf_keras") else None
    probe = ("from benchmarks import cli; print(cli.environment_of())")
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    try:
        out = subprocess.run([python, "-c", probe], env=env, capture_output=True, text=True,
                             timeout=120, check=False).stdout.strip()
    except OSError:
        return None
    return out if out in ("estimator", "keras") else None


def interpreters(args):
    """{"estimator": PYTHON or None, "keras": PYTHON or None}."""
    here = environment_of()
    found = {}
    for kind, given, venv in (("estimator", args.python_estimator, ".venv"),
                              ("keras", args.python_keras, ".venv-keras")):
        if given:
            found[kind] = given
        elif here == kind:
            found[kind] = sys.executable
        else:
            candidate = os.path.join(REPO_ROOT, venv, "bin", "python")
            found[kind] = candidate if os.path.exists(candidate) else None
    return found


def parse_tables(text):
    if text.strip() == "all":
        return list(TABLES)
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in names if t not in TABLES]
    if unknown or not names:
        raise SystemExit(f"error: unknown table(s) {unknown or text!r}; choose among "
                         f"{', '.join(TABLES)}.")
    return names


def run_table(name, settings, extra=None):
    """Runs one table in this process; returns its result dict."""
    module = importlib.import_module(TABLES[name][0])
    start = time.monotonic()
    result = module.run(settings, **(extra or {}))
    result["seconds"] = round(time.monotonic() - start, 1)
    return result


def _child_args(args, python, table, json_path, workdir, pythons):
    argv = [python, "-m", "benchmarks", "--tables", table, "--json", json_path,
            "--in-process", "--no-plots", "--data-dir", args.data_dir, "--workdir", workdir]
    for flag, value in (("--examples", args.examples), ("--repeats", args.repeats),
                        ("--window", args.window), ("--accuracy-steps", args.accuracy_steps),
                        ("--accuracy-runs", args.accuracy_runs),
                        ("--python-estimator", pythons["estimator"]),
                        ("--python-keras", pythons["keras"]),
                        ("--python-jax", args.python_jax)):
        if value is not None:
            argv += [flag, str(value)]
    if args.quick:
        argv.append("--quick")
    if not args.accuracy_knobs:
        argv.append("--no-accuracy-knobs")
    return argv


def _python_for(table, pythons):
    kind = TABLES[table][1]
    return sys.executable if kind == "any" else pythons[kind]


def rounds_for(table, args):
    """How many times ``table`` runs: --rounds (default 3, 1 with --quick)
    for the ratio tables, once for the others and inside a child."""
    if table not in ROUND_TABLES or args.in_process:
        return 1
    if args.rounds is not None:
        return max(1, args.rounds)
    return 1 if args.quick else DEFAULT_ROUNDS


def _run_child(args, table, workdir, pythons, round_no=None):
    python = _python_for(table, pythons)
    if python is None:
        return {"table": table, "error": f"no interpreter for the {TABLES[table][1]} "
                                         f"environment: pass --python-{TABLES[table][1]}"}
    suffix = f"-round{round_no}" if round_no else ""
    json_path = os.path.join(workdir, f"table-{table}{suffix}.json")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if TABLES[table][1] == "keras":
        env["TF_USE_LEGACY_KERAS"] = "1"
    timeout = CHILD_TIMEOUT.get(table, DEFAULT_CHILD_TIMEOUT)
    try:
        # subprocess.run kills the child (by its PID) when the timeout expires.
        proc = subprocess.run(_child_args(args, python, table, json_path, workdir, pythons),
                              env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"table": table, "error": f"timed out after {timeout} s"}
    if proc.returncode != 0 or not os.path.exists(json_path):
        return {"table": table, "error": f"child exited with status {proc.returncode}"}
    with open(json_path) as f:
        return json.load(f)["tables"][table]


def main(argv=None):
    # Before anything imports TensorFlow: Keras 2 as tf.keras on TF 2.16+.
    engines.prefer_legacy_keras()
    args = build_parser().parse_args(argv)
    tables = parse_tables(args.tables)
    own_workdir = args.workdir is None
    workdir = args.workdir or tempfile.mkdtemp(prefix="ek-bench-")
    pythons = interpreters(args)
    settings = common.Settings(data_dir=args.data_dir, quick=args.quick, examples=args.examples,
                               repeats=args.repeats, window_s=args.window, workdir=workdir,
                               python_estimator=pythons["estimator"],
                               python_keras=pythons["keras"], python_jax=args.python_jax,
                               accuracy_runs=args.accuracy_runs.split(",")
                               if args.accuracy_runs else None)
    here = environment_of()
    extra = {"accuracy": {"steps": args.accuracy_steps, "knobs": args.accuracy_knobs}}
    out = {"meta": {"command": "python -m benchmarks " + " ".join(
                        argv if argv is not None else sys.argv[1:]),
                    "started": output.now_iso(), "settings": settings.to_json(),
                    "rounds": {t: rounds_for(t, args) for t in tables},
                    "machine": output.machine_info()},
           "tables": {}}
    failed = False
    try:
        for table in tables:
            fits = TABLES[table][1] in ("any", here)
            count = rounds_for(table, args)
            in_process = args.in_process or (len(tables) == 1 and fits and count == 1)
            if in_process:
                result = run_table(table, settings, extra.get(table))
            elif count == 1:
                result = _run_child(args, table, workdir, pythons)
            else:
                results = []
                for k in range(1, count + 1):
                    common.say(f"[{table}] round {k} of {count}")
                    results.append(_run_child(args, table, workdir, pythons, round_no=k))
                result = rounds.merge(results)
            out["tables"][table] = result
            failed = failed or "error" in result
            # A child prints its own table on the shared stdout; merged rounds
            # are printed again, with each target's spread.
            if in_process or "error" in result or count > 1:
                print(output.format_table(result) if "rows" in result
                      else f"== {table}: {result.get('error')}", flush=True)
                print(flush=True)
        out["meta"]["finished"] = output.now_iso()
        output.write_json(out, args.json)
        common.say(f"results written to {args.json}")
        if not args.no_plots:
            stem = os.path.splitext(os.path.basename(args.json))[0]
            for path in plots.write_plots(out, os.path.dirname(os.path.abspath(args.json)),
                                          prefix=f"{stem}-"):
                common.say(f"plot written to {path}")
    finally:
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0
