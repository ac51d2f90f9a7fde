"""``python -m benchmarks``: run the tables, print them, write JSON.

Example::

    python -m benchmarks --tables input,training --data-dir data --json out.json
    python -m benchmarks --quick --tables input --data-dir /tmp/tiny_dataset

With more than one table, each table runs in its own child process (so one
table's TensorFlow state, thread pools and memory cannot colour the next),
and the parent merges their results.
"""

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks import common

TABLES = {
    "input": "benchmarks.input_table",
    "training": "benchmarks.training_table",
    "inputbound": "benchmarks.inputbound_table",
    "writing": "benchmarks.writing_table",
    "accuracy": "benchmarks.accuracy_table",
}
DEFAULT_TABLES = ("input", "training", "inputbound", "writing")
# Per-table bound on a child process, seconds (accuracy trains for a long time).
CHILD_TIMEOUT = {"accuracy": 4 * 3600}
DEFAULT_CHILD_TIMEOUT = 3600
REPO_ROOT = os.path.dirname(common.HERE)


def build_parser():
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Benchmarks of estimator-keras on Fashion-MNIST TFRecords: input "
                    "pipelines, training steps/s, input-boundness, writing, accuracy.")
    p.add_argument("--tables", default=",".join(DEFAULT_TABLES),
                   help=f"comma-separated tables among {', '.join(TABLES)} "
                        f"(default: {','.join(DEFAULT_TABLES)}; accuracy is slow and "
                        f"runs only when named)")
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
    p.add_argument("--in-process", action="store_true",
                   help="run every table in this process instead of one child per table")
    return p


def parse_tables(text):
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in names if t not in TABLES]
    if unknown or not names:
        raise SystemExit(f"error: unknown table(s) {unknown or text!r}; choose among "
                         f"{', '.join(TABLES)}.")
    return names


def run_table(name, settings, extra=None):
    """Runs one table in this process; returns its result dict."""
    module = importlib.import_module(TABLES[name])
    start = time.monotonic()
    result = module.run(settings, **(extra or {}))
    result["seconds"] = round(time.monotonic() - start, 1)
    return result


def _child_args(args, table, json_path, workdir):
    argv = [sys.executable, "-m", "benchmarks", "--tables", table, "--json", json_path,
            "--in-process", "--data-dir", args.data_dir, "--workdir", workdir]
    for flag, value in (("--examples", args.examples), ("--repeats", args.repeats),
                        ("--window", args.window), ("--accuracy-steps", args.accuracy_steps)):
        if value is not None:
            argv += [flag, str(value)]
    if args.quick:
        argv.append("--quick")
    return argv


def _run_child(args, table, workdir):
    json_path = os.path.join(workdir, f"table-{table}.json")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    timeout = CHILD_TIMEOUT.get(table, DEFAULT_CHILD_TIMEOUT)
    try:
        # subprocess.run kills the child (by its PID) when the timeout expires.
        proc = subprocess.run(_child_args(args, table, json_path, workdir), env=env,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"table": table, "error": f"timed out after {timeout} s"}
    if proc.returncode != 0 or not os.path.exists(json_path):
        return {"table": table, "error": f"child exited with status {proc.returncode}"}
    with open(json_path) as f:
        return json.load(f)["tables"][table]


def main(argv=None):
    args = build_parser().parse_args(argv)
    tables = parse_tables(args.tables)
    own_workdir = args.workdir is None
    workdir = args.workdir or tempfile.mkdtemp(prefix="ek-bench-")
    settings = common.Settings(data_dir=args.data_dir, quick=args.quick, examples=args.examples,
                               repeats=args.repeats, window_s=args.window, workdir=workdir)
    extra = {"accuracy": {"steps": args.accuracy_steps}} if args.accuracy_steps else {}
    out = {"meta": {"command": "python -m benchmarks " + " ".join(
                        argv if argv is not None else sys.argv[1:]),
                    "started": common.now_iso(), "settings": settings.to_json(),
                    "machine": common.machine_info()},
           "tables": {}}
    failed = False
    try:
        for table in tables:
            if args.in_process or len(tables) == 1:
                result = run_table(table, settings, extra.get(table))
            else:
                result = _run_child(args, table, workdir)
            out["tables"][table] = result
            failed = failed or "error" in result
            # A child prints its own table on the shared stdout.
            if args.in_process or len(tables) == 1 or "error" in result:
                print(common.format_table(result) if "rows" in result
                      else f"== {table}: {result.get('error')}", flush=True)
                print(flush=True)
        out["meta"]["finished"] = common.now_iso()
        common.write_json(out, args.json)
        common.say(f"results written to {args.json}")
    finally:
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0
