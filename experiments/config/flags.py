"""The flags of ``train``, defined once.

``train`` adds them to its parser; ``evaluate`` and ``export`` the ones that
say what to run on (:func:`add_run_flags`); ``tune`` adds them all but those
it sets per trial, and :func:`trial_argv` turns what it parsed back into each
trial's ``train`` arguments. A flag added here reaches ``tune``'s trials with
nothing else to change.
"""

import argparse

from estimator_keras import engines
from estimator_keras.distribute.preemption import DEFAULT_GRACE_SECS

STRATEGIES = ("auto", "none", "mirrored", "multi_worker_mirrored", "parameter_server")


class _Adder:
    """``add_argument`` on ``parser``, leaving out the destinations in
    ``exclude``; keeps the actions it added."""

    def __init__(self, parser, exclude):
        self.parser, self.exclude, self.actions = parser, set(exclude), []

    def __call__(self, *names, **kwargs):
        dest = kwargs.get("dest") or names[0].lstrip("-").replace("-", "_")
        if dest not in self.exclude:
            self.actions.append(self.parser.add_argument(*names, **kwargs))


def add_run_flags(parser, exclude=()):
    """What a run is of and where it lives: NAME, --model-dir, --data-dir,
    --hparams, --config, --dataset (train, evaluate and export). Returns the
    actions added."""
    add = _Adder(parser, exclude)
    add("name", metavar="NAME", help="experiment name (see `list`)")
    add("--model-dir", metavar="DIR",
        help="checkpoints, summaries and exports (default runs/NAME; AIP_MODEL_DIR's parent "
             "on Vertex AI)")
    add("--data-dir", default=None, metavar="DIR",
        help="root of prepared datasets (default: $ESTIMATOR_KERAS_DATA_DIR or ./data)")
    add("--hparams", default="", metavar="K=V,...",
        help="override config fields, e.g. learning_rate=0.01,dropout=0.3")
    add("--config", metavar="FILE",
        help="YAML or JSON with sections data, train and model (precedence: defaults < "
             "--config < --hparams < flags)")
    add("--dataset", metavar="NAME_OR_DIR",
        help="train on this dataset: a name prepared under --data-dir or registered, or a "
             "dataset folder (local or gs://)")
    return add.actions


def add_engine_flag(parser, exclude=()):
    add = _Adder(parser, exclude)
    add("--engine", default="auto", choices=list(engines.choices()),
        help="estimator: tf.estimator.train_and_evaluate (TensorFlow <= 2.15); keras: "
             "Model.fit of Keras 2 (TensorFlow 2.15+, tf-keras on 2.16+); keras3: Model.fit "
             "of Keras 3 on the backend KERAS_BACKEND names (tensorflow, jax); auto "
             f"(default): {engines.AUTO_RULE}")
    return add.actions


def add_train_flags(parser, exclude=()):
    """Every flag of ``train`` (but the global --verbose and --module), except
    the destinations in ``exclude``. Returns the actions added."""
    actions = add_run_flags(parser, exclude)
    add = _Adder(parser, exclude)
    add("--source-dir", metavar="DIR", help="IDX files for prepare")
    add("--max-steps", type=int, metavar="N")
    add("--batch-size", type=int, metavar="N", help="examples per replica per step")
    add("--eval-every", type=int, metavar="N", help="checkpoint and evaluate every N steps")
    add("--strategy", default="auto", choices=list(STRATEGIES))
    add("--deterministic", action="store_const", const=True, default=None,
        help="deterministic ops (train.deterministic): a run stopped and resumed ends with "
             "the weights of one never stopped, bit for bit (with random layers such as "
             "Dropout: on keras3; the other engines say so at the start)")
    add("--skip-corrupt", action="store_true",
        help="skip unreadable records (logged) instead of stopping")
    add("--restart-order", action="store_true",
        help="on a model dir whose input order settings (seed, batch size, cache decision, "
             "shuffle, dataset) changed since its checkpoint, start a fresh order at the next "
             "epoch boundary instead of refusing the run")
    add("--tuning-trial", action="store_true",
        help="run as a tuning service's trial: extra --name=value arguments become --hparams")
    add("--hypertune-metric", metavar="METRIC",
        help="report this eval metric to Vertex AI's tuning service at the end")
    add("--evaluations-file", metavar="FILE",
        help="keep each evaluation as a JSON line {step, time, metrics} in FILE as it happens "
             "(what tune's pruners read)")
    add("--print-evaluations", action="store_true",
        help="print each evaluation as name=value pairs on stdout (Katib's StdOut metrics "
             "collector reads them)")
    add("--track", nargs="?", const="", default=None, metavar="URI",
        help="record the run in MLflow (pip install -e '.[mlflow]'): a tracking server "
             "http(s)://..., a database URI or a local .db file; alone: "
             "$MLFLOW_TRACKING_URI, else ./mlflow.db. $EK_TRACKING_URI does the same")
    add("--register", metavar="NAME",
        help="with --track: register the final export as a new version of MLflow's "
             "registered model NAME (an export on gs:// by its URI)")
    add("--preemption-grace", type=float, default=DEFAULT_GRACE_SECS, metavar="S",
        help="on SIGTERM or SIGINT, save the current step and exit 75 within S seconds "
             f"(default {DEFAULT_GRACE_SECS:g})")
    return actions + add.actions + add_engine_flag(parser, exclude)


def trial_argv(args, exclude=()):
    """The ``train`` arguments that give a run the values ``args`` holds for
    train's flags (those in ``exclude`` left out); flags at their default are
    left out too, so the trial gets train's own default."""
    actions = add_train_flags(argparse.ArgumentParser(add_help=False, allow_abbrev=False), exclude)
    return to_argv(actions, args)


def to_argv(actions, args):
    """Command-line arguments that parse back to ``args``' values for
    ``actions`` (optional ones only). Raises ValueError for a kind of flag it
    cannot write."""
    argv = []
    for action in actions:
        if not action.option_strings:
            continue
        value = getattr(args, action.dest, action.default)
        if value == action.default:
            continue
        flag = next(s for s in action.option_strings if s.startswith("--"))
        if isinstance(action, argparse.BooleanOptionalAction):
            argv.append(flag if value else "--no-" + flag[2:])
        elif action.nargs in (0, "?") and value == action.const:
            argv.append(flag)
        elif action.nargs == "?":
            argv += [flag, str(value)]
        elif action.nargs is None and isinstance(value, list):
            for item in value:  # action="append"
                argv += [flag, str(item)]
        elif action.nargs is None:
            argv += [flag, str(value)]
        else:
            raise ValueError(f"cannot write {flag}={value!r} back as arguments "
                             f"(nargs={action.nargs!r})")
    return argv
