"""``python -m experiments cluster``: train one experiment on a local multi-process cluster.

Starts a chief, ``--workers`` further workers, ``--ps`` parameter servers and
optionally an evaluator on 127.0.0.1, each running ``python -m experiments
train NAME --model-dir DIR ...`` with its own TF_CONFIG. Every flag this
command does not know is passed on verbatim to each task's ``train``, so
training flags work as usual::

    python -m experiments cluster fashion_mnist_mlp --workers 1 --ps 1 --evaluator \\
        --model-dir runs/fm-ps --max-steps 200 --batch-size 64 --engine estimator

Put NAME first: a flag value placed before NAME would be taken for it. The
experiment, the engine and every train flag are checked before any task
starts. On SIGTERM the launcher passes SIGTERM on to the tasks, waits up to
--preemption-grace seconds for their checkpoint and exits 75 when they saved.

TensorFlow's task servers listen on every interface and run, unauthenticated,
whatever they are sent. With --network auto (the default) the tasks share one
private network namespace that has only loopback, where the system allows it:
nothing else can connect to them, and they cannot reach the network (use
--network host for gs:// paths). Where it cannot be made they use this
machine's network, with a warning that says why. So a dataset the data dir
lacks is prepared (downloaded where it must be) by this command, before any
task starts.
"""

import argparse
import logging
import os
import shlex
import signal
import sys
import tempfile

from estimator_keras import engines, io
from estimator_keras.distribute import launcher
from estimator_keras.distribute.preemption import DEFAULT_GRACE_SECS
from estimator_keras.errors import ConfigError, UsageError
from estimator_keras.tracking import settings as tracking_settings
from experiments.catalog import registry
from experiments.commands import common as commands
from experiments.config import parsing

_DESCRIPTION = __doc__.split("\n\n", 1)[1]

logger = logging.getLogger(__name__)


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
    parser.add_argument("--preemption-grace", type=float, default=DEFAULT_GRACE_SECS,
                        metavar="S",
                        help="seconds the tasks get to save a checkpoint after the launcher "
                             f"is sent SIGTERM; passed on to every task's train (default "
                             f"{DEFAULT_GRACE_SECS:g})")
    parser.add_argument("--network", choices=launcher.NETWORKS, default="auto",
                        help="the tasks' network: 'private', one network namespace with only "
                             "loopback that nothing else can reach (and from which nothing "
                             "else is reachable); 'host', this machine's network, where "
                             "TensorFlow's servers listen on every interface; 'auto' (default), "
                             "private where the system allows it and no path is remote, else "
                             "host with a warning")
    # The train parser beside this one checks the flags passed on to the tasks.
    parser.set_defaults(cluster_subcommands=subparsers)
    return parser


def _train_argv(args, extra_argv):
    extra = list(extra_argv)
    if extra and extra[0] == "--":
        # "cluster NAME ... -- --max-steps 5" separates train flags explicitly.
        extra = extra[1:]
    has_strategy = any(a == "--strategy" or a.startswith("--strategy=") for a in extra)
    if args.ps > 0 and not has_strategy:
        extra += ["--strategy", "parameter_server"]
    if _flag_value(extra, "--preemption-grace") is None:
        extra += ["--preemption-grace", f"{args.preemption_grace:g}"]
    # The experiment may come from the user's modules: each task imports them
    # too, files and folders by their absolute path.
    for module in getattr(args, "modules", None) or ():
        path = os.path.expanduser(module)
        extra += ["--module", os.path.abspath(path) if os.path.exists(path) else module]
    return [sys.executable, "-m", "experiments", "train", args.name,
            "--model-dir", args.model_dir, *extra]


def _flag_value(argv, flag):
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _without_flag(argv, flag):
    """``argv`` without ``flag`` and its value (an optional one, as --track's)."""
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg == flag:
            skip = i + 1 < len(argv) and not argv[i + 1].startswith("-")
        elif not arg.startswith(flag + "="):
            out.append(arg)
    return out


def _check_engine(args, command):
    # Refuse here, before any task starts, what every task would refuse on
    # its own: the engine's absence, or tasks the engine does not run.
    requested = _flag_value(command, "--engine") or "auto"
    engine = engines.auto_from_metadata() if requested == "auto" else requested
    found = {name: (ok, text) for name, ok, text in engines.statuses()}
    available, status = found.get(engine, (False, "unknown engine"))
    if not available:
        raise ConfigError(f"--engine {requested} means the {engine} engine, which this "
                          f"environment cannot run: {status}.")
    engines.check_cluster(engine, ps=f"--ps {args.ps}" if args.ps else None,
                          evaluator="--evaluator" if args.evaluator else None,
                          workers=f"--workers {args.workers}" if args.workers else None)


def _check_train_flags(args, command):
    """Parses the tasks' train command with the real train parser and builds
    the experiment's config from it as `train` does, so that a bad name, flag,
    config file or hparam stops here, once, before any process starts.
    Returns (the grace the tasks were given, their parsed train arguments,
    the experiment's config); the last two None without the train parser."""
    subcommands = getattr(args, "cluster_subcommands", None)
    train_parser = subcommands.choices.get("train") if subcommands else None
    if train_parser is None:
        commands.load_catalog(argparse.Namespace(modules=getattr(args, "modules", None),
                                                 verbose=getattr(args, "verbose", False)))
        registry.get(args.name)
        return args.preemption_grace, None, None
    targs, unknown = train_parser.parse_known_args(command[4:])
    if unknown:
        hint = parsing.did_you_mean(unknown, subcommands.choices["cluster"], train_parser)
        raise UsageError(f"the tasks' train command would not accept {' '.join(unknown)}"
                         f"{hint}; see `python -m experiments train --help` for its flags.")
    targs.verbose = getattr(args, "verbose", False)
    targs.modules = list(getattr(targs, "modules_after", None) or [])
    _, config = commands.experiment_config(
        targs, max_steps=getattr(targs, "max_steps", None),
        batch_size=getattr(targs, "batch_size", None),
        eval_every_steps=getattr(targs, "eval_every", None))
    return getattr(targs, "preemption_grace", args.preemption_grace), targs, config


def _prepare_missing_data(targs, config):
    """Prepares the experiment's registered dataset here, before any task
    starts, when the data dir lacks it: the tasks may run where only
    loopback exists (--network private), and a download from there fails.
    Only then is TensorFlow loaded."""
    if config is None:
        return
    # pylint: disable-next=import-outside-toplevel  (loads the sources' registry, not TF)
    from experiments.catalog import datasets
    name, data_dir = config.data.dataset, commands.data_dir(targs)
    _, missing = datasets.needs_preparing(name, data_dir)
    if not missing:
        return
    print(f"Dataset {name} is not in {data_dir}: preparing it before the tasks start, on this "
          f"machine's network")
    sys.stdout.flush()
    commands.tensorflow_module("experiments.catalog.prepare").prepare(
        name, data_dir, source_dir=getattr(targs, "source_dir", None))


def _network(args, command, env):
    """The launcher's network: 'auto' keeps the tasks on this machine's network
    when they need to reach remote paths."""
    remote = []
    # A tracking server, even on this machine's 127.0.0.1, is outside the
    # tasks' namespace (a cluster's --track is resolved: see run()).
    track = command[-1] if len(command) > 1 and command[-2] == "--track" else None
    if track and tracking_settings.is_remote(track):
        remote.append(f"the tracking server {tracking_settings.shown(track)}")
    remote += [a.split("=", 1)[-1] for a in command[:-1 if track else None]
               if io.is_remote(a.split("=", 1)[-1])]
    remote += [f"{k}={v}" for k, v in sorted(env.items())
               if k.startswith("AIP_") and io.is_remote(v)]
    if not remote:
        return args.network
    if args.network == "private":
        raise UsageError(f"--network private leaves the tasks only loopback, but they need "
                         f"the network for {remote[0]}; use --network host (on a machine whose "
                         f"ports are firewalled) or local paths.")
    if args.network == "auto":
        logger.warning("The tasks need the network for %s, so they use this machine's "
                       "network (--network host), not a private namespace.", remote[0])
        return "host"
    return args.network


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

    Errors propagate as package exceptions (the dispatcher picks the exit code:
    2 for a bad name or flag, 75 for a preemption the tasks saved, else 1);
    the failing task's last log lines are printed here first.
    """
    if args.workers < 0 or args.ps < 0:
        raise UsageError(
            f"--workers and --ps must be 0 or more; got --workers {args.workers} --ps {args.ps}.")
    if not args.preemption_grace > 0:
        raise UsageError(f"--preemption-grace must be a positive number of seconds; given "
                         f"{args.preemption_grace:g}.")
    command = _train_argv(args, extra_argv)
    grace, targs, config = _check_train_flags(args, command)
    if targs is not None:
        # Resolved here, so that the chief tracks where this command was told
        # (its working directory, its MLFLOW_TRACKING_URI).
        track = tracking_settings.resolve(targs.track)
        if track:
            command = _without_flag(command, "--track") + ["--track", track]
    _check_engine(args, command)
    env = _task_env()
    network = _network(args, command, env)
    _prepare_missing_data(targs, config)
    # Only now, with everything checked, is anything created.
    log_dir = args.log_dir or tempfile.mkdtemp(prefix=f"cluster-{args.name}-")
    parts = ["chief"] + ([f"{args.workers} worker(s)"] if args.workers else []) + (
        [f"{args.ps} ps"] if args.ps else []) + (["evaluator"] if args.evaluator else [])
    print(f"Local cluster for {args.name!r}: {' + '.join(parts)}; logs in {log_dir}")
    print("Each task runs: " + shlex.join(command))
    sys.stdout.flush()
    try:
        result = launcher.launch_local_cluster(
            command, workers=args.workers, ps=args.ps, evaluator=args.evaluator,
            log_dir=log_dir, timeout=args.timeout, env=env, echo=not args.quiet,
            evaluator_grace=args.evaluator_grace, preemption_grace=grace, network=network)
    except launcher.ClusterError as e:
        sys.stdout.flush()
        print("\nLocal cluster PREEMPTED: the tasks saved a checkpoint; rerun the same command "
              "to resume." if isinstance(e, launcher.ClusterPreempted)
              else "\nLocal cluster FAILED.", file=sys.stderr)
        if e.result is not None:
            _print_outcomes(e.result, sys.stderr)
        if isinstance(e, launcher.ClusterTaskError):
            print(f"\n{e.task} {launcher.describe_returncode(e.returncode)}; last lines of "
                  f"{e.log_path}:", file=sys.stderr)
            for line in e.last_lines:
                print(f"  | {line}", file=sys.stderr)
        sys.stderr.flush()
        raise
    where = ("a private network namespace (loopback only)" if result.network == "private"
             else "this machine's network")
    print(f"\nLocal cluster finished in {result.wall_time:.1f} s, in {where}:")
    _print_outcomes(result, sys.stdout)
    return 0
