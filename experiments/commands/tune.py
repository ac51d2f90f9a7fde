"""``python -m experiments tune``: an Optuna study of local ``train`` trials.

Each trial trains NAME in its own model dir DIR/trial-N with values the
sampler (--algorithm) draws from the search space (a YAML file in Vertex AI's
vocabulary), --parallel at a time; the pruner (--pruner) stops the trials that
fall behind at an evaluation. The table goes to DIR/trials.csv and
DIR/trials.json, the plots beside it, the best export to DIR/best. Run the
same command again to resume; run it on other machines with one --storage
to share the study. Example::

    # space.yaml:  learning_rate: {type: double, min: 0.0001, max: 0.1, scale: log}
    python -m experiments tune fashion_mnist_mlp --space space.yaml --trials 12 \\
        --parallel 2 --pruner hyperband --model-dir runs/tune-mlp --max-steps 1500
"""

import argparse
import os
import sys

from estimator_keras import io
from estimator_keras.distribute.launcher import PREEMPTION_MARGIN
from estimator_keras.errors import ConfigError
from estimator_keras.tracking import settings as tracking_settings
from estimator_keras.tuning import space as space_lib
from estimator_keras.tuning import optuna_search as search
from experiments.catalog import datasets
from experiments.commands import common as commands
from experiments.commands.submit import positive_int
from experiments.config import hparams
from experiments.config import flags as train_flags
from experiments.tuning import studies
from experiments.tuning import runner as tune
from experiments.tuning import study_config as tune_config
from experiments.tuning import table as tune_table

_DESCRIPTION = __doc__.split("\n\n", 1)[1]
# train's destinations that tune sets itself: the experiment, each trial's
# model dir (DIR/trial-N) and --hparams (tune's fixed ones and the space's).
PER_TRIAL = ("name", "model_dir", "hparams", "evaluations_file")
# Flags tune takes for the study as a whole: each trial gets --track from it.
STUDY_WIDE = ("track", "register")


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
                        help="trials in the study, whoever runs them (default: the whole grid, "
                             "else %d)" % space_lib.DEFAULT_RANDOM_TRIALS)
    parser.add_argument("--parallel", type=positive_int, default=1, metavar="P",
                        help="trials this command runs at once (default 1)")
    parser.add_argument("--metric", metavar="NAME",
                        help="evaluation metric to optimize (default: the experiment's "
                             "best_metric, accuracy for the built-in ones)")
    parser.add_argument("--goal", choices=("max", "min"),
                        help="default: the experiment's direction for its metric; else min "
                             "for loss-like names, max otherwise")
    parser.add_argument("--algorithm", choices=search.ALGORITHMS,
                        default=search.DEFAULT_ALGORITHM,
                        help="Optuna's sampler: tpe (default), cmaes (two or more numeric "
                             "ranges), qmc (numeric ranges only), random, or grid (integer, "
                             "discrete and categorical parameters only)")
    parser.add_argument("--pruner", choices=search.PRUNERS, default=search.DEFAULT_PRUNER,
                        help="stop trials that fall behind at an evaluation: median, "
                             "hyperband, asha (successive halving), or none (default)")
    parser.add_argument("--storage", metavar="URL",
                        help="the study's storage: sqlite:///PATH, postgresql://USER:PASS@HOST/"
                             "DB, mysql+pymysql://..., journal:PATH (default: DIR/study.db); "
                             "tune commands on one storage share the study")
    parser.add_argument("--study-name", metavar="NAME",
                        help="the study's name in its storage (default: the experiment's)")
    parser.add_argument("--heartbeat", type=positive_int, default=studies.DEFAULT_HEARTBEAT_S,
                        metavar="SECONDS",
                        help="database storages: a trial whose worker is silent for twice "
                             "this long is failed and run again once (default %(default)s)")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the sampler: repeatable values for a study one command "
                             "runs (default: none, each worker its own)")
    parser.add_argument("--trial-timeout", type=_seconds, metavar="SECONDS",
                        default=tune_config.DEFAULT_TRIAL_TIMEOUT_S,
                        help="end a trial still running after this long (default %(default)s)")
    parser.add_argument("--retry-failed", action="store_true",
                        help="when resuming, run failed and timed-out trials again")
    parser.add_argument("--no-plots", dest="plots", action="store_false",
                        help="do not draw the study's plots at the end")
    parser.add_argument("--hparams", default="", metavar="K=V,...",
                        help="fixed overrides for every trial (not keys of the space)")
    train_flags.add_train_flags(
        parser.add_argument_group("train's flags, passed to every trial"), exclude=PER_TRIAL)
    return parser


def _train_args(args, data_dir):
    """Every trial's ``train`` flags: all those given to tune (the global
    ones too), with the data dir made absolute."""
    given = argparse.Namespace(**{**vars(args), "data_dir": data_dir})
    out = train_flags.trial_argv(given, exclude=PER_TRIAL + STUDY_WIDE)
    for module in getattr(args, "modules", None) or ():  # the same experiments in the trials
        out += ["--module", module]
    if getattr(args, "verbose", False):
        out.append("--verbose")
    return out


def build_config(args):
    """The :class:`~experiments.tuning.study_config.StudyConfig` the arguments ask for (checks
    train's flags as ``train`` would, and the space against the hyperparameters
    the experiment accepts)."""
    _, config = commands.train_config(args)
    fixed = hparams.parse_hparams(args.hparams)
    space = space_lib.load_space(args.space)
    space.check_hparams(lambda values: hparams.with_overrides(config, {**fixed, **values}))
    flagged = {field: "--" + flag.replace("_", "-")
               for flag, field in commands.TRAIN_CONFIG_FLAGS.items()
               if getattr(args, flag) is not None}
    both = [name for name in space.names if name in flagged]
    if both:
        raise ConfigError("tune: %s set both by %s and by the search space %s; a flag beats "
                          "the space's values, so give it in one of them."
                          % (", ".join(both), ", ".join(flagged[n] for n in both), args.space))
    metric = args.metric or config.best_metric
    goal = args.goal
    if goal is None and metric == config.best_metric:
        goal = "max" if config.higher_is_better else "min"
    search.check_algorithm(space, args.algorithm)
    trials = args.trials
    if trials is None:
        trials = (space.grid_size() if args.algorithm == "grid"
                  else space_lib.DEFAULT_RANDOM_TRIALS)
    study = space_lib.Study(space, metric=metric, goal=goal, max_trials=trials,
                            parallel_trials=args.parallel)
    data_dir = os.path.abspath(commands.data_dir(args))
    track = tracking_settings.resolve(args.track)
    if args.register and not track:
        raise ConfigError("tune: --register %s registers the best trial's export in MLflow: "
                          "give --track URI (or set %s) too."
                          % (args.register, tracking_settings.URI_VARIABLE))
    prepare = None
    if datasets.find(config.data.dataset, data_dir)[1]:  # registered, not prepared yet
        prepare = [sys.executable, "-m", "experiments", "prepare", config.data.dataset,
                   "--data-dir", data_dir]
        if args.source_dir:
            prepare += ["--source-dir", args.source_dir]
    return tune_config.StudyConfig(
        experiment=args.name, study=study, model_dir=os.path.abspath(args.model_dir),
        train_args=_train_args(args, data_dir), fixed_hparams=args.hparams.strip(),
        algorithm=args.algorithm, pruner=args.pruner, seed=args.seed, storage=args.storage,
        study_name=args.study_name, heartbeat_s=args.heartbeat,
        max_steps=config.train.max_steps,
        first_eval_step=min(config.train.eval_every_steps, config.train.max_steps),
        plots=args.plots, trial_timeout_s=args.trial_timeout,
        grace_s=args.preemption_grace + PREEMPTION_MARGIN, retry_failed=args.retry_failed,
        prepare_command=prepare, track=track, register=args.register)


def format_table(result):
    """The study's table as aligned text, best trial marked with *."""
    config = result.config
    names = config.study.space.names
    header = ["trial", "status", config.study.metric, "steps", "wall s"] + names + ["note"]
    rows = [header]
    for t in result.trials:
        rows.append(["%d%s" % (t.trial, "*" if result.best is t else ""), t.status,
                     "" if t.metric is None else "%.4f" % t.metric,
                     "" if t.steps is None else str(t.steps),
                     "" if t.wall_time_s is None else "%.0f" % t.wall_time_s]
                    + [space_lib.format_value(t.hparams.get(n, "")) for n in names]
                    + [(t.message or "") if t.status != "succeeded" else ""])
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
    print("exported: %s (copied to %s)" % (io.join(best.export_dir, "model.h5"),
                                          io.join(config.model_dir, tune_table.BEST_DIR)))
    print("table: %s" % io.join(config.model_dir, tune_table.TRIALS_CSV))
    return 0
