"""``python -m experiments cluster``: train one experiment on a local multi-process cluster.

Starts a chief, ``--workers`` further workers, ``--ps`` parameter servers and
optionally an evaluator on 127.0.0.1, each running ``python -m experiments
train NAME --model-dir DIR ...`` with its own TF_CONFIG. Every flag this
command does not know is passed on verbatim to each task's ``train``, so
training flags work as usual::

    python -m experiments cluster mnist --workers 1 --ps 1 --evaluator \\
        --model-dir runs/mnist-ps --max-steps 200 --batch-size 64

Put NAME first: a flag value placed before NAME would be taken for it.
"""

import argparse
import os
import signal
import sys
import tempfile

from estimator_keras import engines
from estimator_keras.distribute import launcher
from estimator_keras.errors import UsageError

_DESCRIPTION = __doc__.split("\n\n", 1)[1]


def add_parser(subparsers):
    """Register the ``cluster`` subcommand on an argparse ``subparsers`` object."""
    parser = subparsers.add_parser(
        "cluster",
        help="train an experiment on a local cluster of processes (chief, workers, ps, "
             "evaluator)",
        description=_DESCRIPTION,
        # Abbreviations would let a train flag such as --eval be swallowed as --evaluator.
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", metavar="NAME", help="experiment to train")
    parser.add_argument("--workers", type=int, required=True, metavar="N",
                        help="number of workers besides the chief (0 for chief only)")
    parser.add_argument("--ps", type=int, default=0, metavar="M",
                        help="number of parameter servers (default 0); with ps, tasks train "
                             "with --strategy parameter_server unless you pass --strategy")
    parser.add_argument("--evaluator", action="store_true",
                        help="also run an evaluator task (outside the cluster spec)")
    parser.add_argument("--model-dir", required=True, metavar="DIR",
                        help="model directory shared by all tasks")
    parser.add_argument("--timeout", type=float, default=1800.0, metavar="S",
                        help="limit for the whole run in seconds (default 1800)")
    parser.add_argument("--log-dir", metavar="DIR",
                        help="folder for one log per task (default: a new temporary folder)")
    parser.add_argument("--evaluator-grace", type=float, default=120.0, metavar="S",
                        help="seconds the evaluator may keep running after training ends, to "
                             "evaluate the final checkpoint (default 120)")
    parser.add_argument("--quiet", action="store_true",
                        help="do not echo the tasks' output (it still goes to the logs)")
    return parser


def _train_argv(args, extra_argv):
    extra = list(extra_argv)
    if extra and extra[0] == "--":
        # "cluster NAME ... -- --max-steps 5" separates train flags explicitly.
        extra = extra[1:]
    has_strategy = any(a == "--strategy" or a.startswith("--strategy=") for a in extra)
    if args.ps > 0 and not has_strategy:
        extra += ["--strategy", "parameter_server"]
    return [sys.executable, "-m", "experiments", "train", args.name,
            "--model-dir", args.model_dir, *extra]


def _flag_value(argv, flag):
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _check_engine(args, command):
    # Refuse here, before any task starts, what the keras engine's tasks
    # would refuse one by one.
    if _flag_value(command, "--engine") == "keras":
        engines.check_keras_cluster(ps="--ps" if args.ps else None,
                                    evaluator="--evaluator" if args.evaluator else None)


def _task_env():
    # The tasks import `experiments` and `estimator_keras`; make that work from
    # any working directory, as it does for this process.
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def _outcome(result, name):
    code = result.returncodes.get(name)
    if name in result.ended_by_launcher:
        if code is not None and code < 0:
            return f"ended by the launcher ({signal.Signals(-code).name})"
        return "ended by the launcher" + ("" if code is None else f" (status {code})")
    return launcher.describe_returncode(code)


def _print_outcomes(result, stream):
    width = max(len(n) for n in result.returncodes)
    for name in result.returncodes:
        print(f"  {name:<{width}}  {_outcome(result, name):<32}  {result.log_paths[name]}",
              file=stream)


def run(args, extra_argv=()):
    """Run the ``cluster`` subcommand; returns 0 when the training tasks all succeeded.

    Errors propagate as package exceptions (the dispatcher picks the exit code);
    the failing task's last log lines are printed here first.
    """
    if args.workers < 0 or args.ps < 0:
        raise UsageError(
            f"--workers and --ps must be 0 or more; got --workers {args.workers} --ps {args.ps}.")
    command = _train_argv(args, extra_argv)
    _check_engine(args, command)
    log_dir = args.log_dir or tempfile.mkdtemp(prefix=f"cluster-{args.name}-")
    parts = ["chief"] + ([f"{args.workers} worker(s)"] if args.workers else []) + (
        [f"{args.ps} ps"] if args.ps else []) + (["evaluator"] if args.evaluator else [])
    print(f"Local cluster for {args.name!r}: {' + '.join(parts)}; logs in {log_dir}")
    print("Each task runs: " + " ".join(command[1:]))
    sys.stdout.flush()
    try:
        result = launcher.launch_local_cluster(
            command, workers=args.workers, ps=args.ps, evaluator=args.evaluator,
            log_dir=log_dir, timeout=args.timeout, env=_task_env(), echo=not args.quiet,
            evaluator_grace=args.evaluator_grace)
    except launcher.ClusterError as e:
        sys.stdout.flush()
        print("\nLocal cluster FAILED.", file=sys.stderr)
        if e.result is not None:
            _print_outcomes(e.result, sys.stderr)
        if isinstance(e, launcher.ClusterTaskError):
            print(f"\n{e.task} {launcher.describe_returncode(e.returncode)}; last lines of "
                  f"{e.log_path}:", file=sys.stderr)
            for line in e.last_lines:
                print(f"  | {line}", file=sys.stderr)
        sys.stderr.flush()
        raise
    print(f"\nLocal cluster finished in {result.wall_time:.1f} s:")
    _print_outcomes(result, sys.stdout)
    return 0
