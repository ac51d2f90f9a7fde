"""``python -m experiments tune``: a hyperparameter study of local ``train`` trials.

Each trial trains NAME in its own model dir DIR/trial-N with values drawn from
the search space (a YAML file in Vertex AI's vocabulary), --parallel at a time;
the table goes to DIR/trials.csv and DIR/trials.json. Run the same command
again to resume an interrupted study. Example::

    # space.yaml:  learning_rate: {type: double, min: 0.0001, max: 0.1, scale: log}
    python -m experiments tune fashion_mnist_mlp --space space.yaml --trials 8 \\
        --parallel 2 --model-dir runs/tune-mlp --max-steps 500
"""

import argparse
import os
import sys

from estimator_keras import io
from estimator_keras.cloud import space as space_lib
from experiments import catalog, commands, datasets, hparams, registry, tune
from experiments.submit import positive_int

_DESCRIPTION = __doc__.split("\n\n", 1)[1]


def _seconds(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected seconds > 0, got %r" % text) from None
    if not value > 0:
        raise argparse.ArgumentTypeError("expected seconds > 0, got %r" % text)
    return value


def add_parser(subparsers):
    """Register the ``tune`` subcommand on an argparse ``subparsers`` object."""
    parser = subparsers.add_parser(
        "tune", help="tune hyperparameters: trials of `train` on this machine",
        description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", metavar="NAME", help="experiment to tune (see `list`)")
    parser.add_argument("--space", required=True, metavar="FILE",
                        help="search space YAML: NAME: {type: double|integer|discrete|"
                             "categorical, min, max | values, scale: linear|log}")
    parser.add_argument("--model-dir", required=True, metavar="DIR",
                        help="the study's folder: trials.csv, trials.json, DIR/trial-N")
    parser.add_argument("--trials", type=positive_int, metavar="N",
                        help="trials in the study (default: the whole grid, or %d for random)"
                             % space_lib.DEFAULT_RANDOM_TRIALS)
    parser.add_argument("--parallel", type=positive_int, default=1, metavar="P",
                        help="trials running at once (default 1)")
    parser.add_argument("--metric", metavar="NAME",
                        help="evaluation metric to optimize (default: the experiment's "
                             "best_metric, accuracy for the built-in ones)")
    parser.add_argument("--goal", choices=("max", "min"),
                        help="default: the experiment's direction for its metric; else min "
                             "for loss-like names, max otherwise")
    parser.add_argument("--algorithm", choices=("grid", "random"), default="random",
                        help="random (default) or grid (integer, discrete and categorical "
                             "parameters only)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the random trial values (default 0)")
    parser.add_argument("--trial-timeout", type=_seconds, metavar="SECONDS",
                        default=tune.DEFAULT_TRIAL_TIMEOUT_S,
                        help="end a trial still running after this long (default %(default)s)")
    parser.add_argument("--retry-failed", action="store_true",
                        help="when resuming, run failed and timed-out trials again")
    # Passed on to every trial's `train`.
    parser.add_argument("--data-dir", metavar="DIR",
                        help="root of prepared datasets (default: $ESTIMATOR_KERAS_DATA_DIR "
                             "or ./data)")
    parser.add_argument("--source-dir", metavar="DIR", help="IDX files for prepare")
    parser.add_argument("--hparams", default="", metavar="K=V,...",
                        help="fixed overrides for every trial (not keys of the space)")
    parser.add_argument("--max-steps", type=positive_int, metavar="N")
    parser.add_argument("--batch-size", type=positive_int, metavar="N")
    parser.add_argument("--eval-every", type=positive_int, metavar="N")
    parser.add_argument("--engine", choices=("auto", "estimator", "keras"), default="auto")
    parser.add_argument("--skip-corrupt", action="store_true")
    return parser


def _train_args(args, data_dir, modules=()):
    out = ["--data-dir", data_dir]
    for module in modules:  # the trials register the same experiments
        out += ["--module", module]
    for flag, value in (("--source-dir", args.source_dir), ("--max-steps", args.max_steps),
                        ("--batch-size", args.batch_size), ("--eval-every", args.eval_every)):
        if value is not None:
            out += [flag, str(value)]
    if args.engine != "auto":
        out += ["--engine", args.engine]
    if args.skip_corrupt:
        out.append("--skip-corrupt")
    return out


def build_config(args):
    """The :class:`~experiments.tune.StudyConfig` the arguments ask for (checks
    the space against the hyperparameters the experiment accepts)."""
    modules = list(getattr(args, "modules", None) or [])
    catalog.check(catalog.load(modules), getattr(args, "verbose", False))
    experiment = registry.get(args.name)
    config = experiment.config
    fixed = hparams.parse_hparams(args.hparams)
    hparams.with_overrides(config, fixed)
    space = space_lib.load_space(args.space)
    space.check_hparams(lambda values: hparams.with_overrides(config, {**fixed, **values}))
    metric = args.metric or config.best_metric
    goal = args.goal
    if goal is None and metric == config.best_metric:
        goal = "max" if config.higher_is_better else "min"
    trials = args.trials
    if trials is None:
        trials = (space.grid_size() if args.algorithm == "grid"
                  else space_lib.DEFAULT_RANDOM_TRIALS)
    study = space_lib.Study(space, metric=metric, goal=goal, algorithm=args.algorithm,
                            max_trials=trials, parallel_trials=args.parallel)
    data_dir = os.path.abspath(commands.data_dir(args))
    prepare = None
    if not datasets.is_prepared(data_dir, config.data.dataset):
        prepare = [sys.executable, "-m", "experiments", "prepare", config.data.dataset,
                   "--data-dir", data_dir]
        if args.source_dir:
            prepare += ["--source-dir", args.source_dir]
    return tune.StudyConfig(
        experiment=args.name, study=study, model_dir=os.path.abspath(args.model_dir),
        train_args=_train_args(args, data_dir, modules), fixed_hparams=args.hparams.strip(),
        seed=args.seed, trial_timeout_s=args.trial_timeout, retry_failed=args.retry_failed,
        prepare_command=prepare)


def format_table(result):
    """The study's table as aligned text, best trial marked with *."""
    config = result.config
    names = config.study.space.names
    header = ["trial", "status", config.study.metric, "steps", "wall s"] + names
    rows = [header]
    for t in result.trials:
        rows.append(["%d%s" % (t.trial, "*" if result.best is t else ""), t.status,
                     "" if t.metric is None else "%.4f" % t.metric,
                     "" if t.steps is None else str(t.steps),
                     "" if t.wall_time_s is None else "%.0f" % t.wall_time_s]
                    + [space_lib.format_value(t.hparams.get(n, "")) for n in names])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def run(args):
    """Carry out ``tune``; return the exit status (0). Errors propagate as
    package exceptions for the dispatcher to map."""
    config = build_config(args)
    result = tune.run_study(config)
    best = result.best
    print(format_table(result))
    print("best trial %d: %s %.4f (%s)" % (
        best.trial, config.study.metric, best.metric,
        ", ".join("%s=%s" % (k, space_lib.format_value(v)) for k, v in best.hparams.items())))
    print("exported: %s" % io.join(best.export_dir, "model.h5"))
    print("table: %s" % io.join(config.model_dir, tune.TRIALS_CSV))
    return 0
