"""The ``python -m experiments`` commands: one function per command.

Exit status: 0 success, 2 bad usage (unknown experiment, flag or hparam,
invalid TF_CONFIG...), 75 preempted (SIGTERM or SIGINT while training: a
checkpoint of the current step was saved; rerun to resume), 1 anything else,
130 interrupted outside training. Errors print one
paragraph; ``--verbose`` adds the traceback and TensorFlow's own logs.
"""

import argparse
import logging
import os
import sys
import traceback
import warnings

from estimator_keras import engines, memory
from estimator_keras.distribute import preemption
from estimator_keras.engines import keras_setup
from estimator_keras.errors import EstimatorKerasError, Preempted, UsageError
from experiments.catalog import loading as catalog
from experiments.commands import cluster as cluster_cmd
from experiments.commands import common as commands
from experiments.commands import evaluate as evaluate_cmd
from experiments.commands import export as export_cmd
from experiments.commands import prepare as prepare_cmd
from experiments.commands import show as show_cmd
from experiments.commands import submit
from experiments.commands import train as train_cmd
from experiments.commands import tune as tune_cmd
from experiments.config import flags as train_flags
from experiments.config import parsing

logger = logging.getLogger("experiments")


def build_parser():
    parser = parsing.Parser(
        prog="python -m experiments",
        description="Train Keras models from TFRecords with tf.estimator or Model.fit.")
    _add_global_flags(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    sub.add_parser("list", help="list experiments and datasets")

    prepare_cmd.add_parser(sub)

    p = sub.add_parser("inspect", help="show a dataset's schema and counts; --verify "
                                       "checks every record")
    p.add_argument("path", metavar="PATH_OR_GLOB")
    p.add_argument("--verify", action="store_true",
                   help="read every record and check its CRC; exit 1 if any is corrupt")

    p = sub.add_parser("train", help="train (and prepare data if missing), evaluate, export")
    train_flags.add_train_flags(p)

    p = sub.add_parser("evaluate", help="evaluate the latest checkpoint of a model dir")
    train_flags.add_run_flags(p)
    train_flags.add_engine_flag(p)
    p.add_argument("--json", action="store_true",
                   help="print the metrics as one JSON object (for scripts)")

    p = sub.add_parser("export", help="export the latest checkpoint to model.h5 (and "
                                      "model.keras on keras3), weights.h5 and saved_model/")
    train_flags.add_run_flags(p)
    p.add_argument("--export-dir", metavar="DIR", help="default MODEL_DIR/export")
    p.add_argument("--force", action="store_true",
                   help="write the export even when the export dir already holds the "
                        "latest checkpoint's")

    p = sub.add_parser("show", help="print an experiment's resolved configuration as YAML, "
                                    "or with --engine what the registry says of an engine")
    p.add_argument("name", metavar="NAME", nargs="?", help="experiment name (see `list`)")
    p.add_argument("--engine", metavar="ENGINE",
                   help="instead of an experiment: an engine's registry entry (its Keras, "
                        "backends, cluster tasks, strategies, cloud jobs, image, and the "
                        "model dirs it continues) and whether it runs here")
    p.add_argument("--config", metavar="FILE", help="a config file, as for train")
    p.add_argument("--hparams", default="", metavar="K=V,...", help="as for train")
    p.add_argument("--dataset", metavar="NAME_OR_DIR", help="as for train")

    cluster_cmd.add_parser(sub)
    submit.add_parser(sub)
    tune_cmd.add_parser(sub)
    for command in sub.choices.values():
        _add_global_flags(command, after_command=True)
    return parser


def _add_global_flags(parser, after_command=False):
    """Flags that work before or after the command. On a command's parser
    they default to SUPPRESS and --module collects into its own list, so that
    nothing given before the command is undone (see _merge_global_flags)."""
    default = argparse.SUPPRESS if after_command else None
    parser.add_argument("--verbose", action="store_true",
                        default=default if after_command else False,
                        help="show tracebacks and TensorFlow's own logs")
    parser.add_argument("--module", action="append", metavar="MOD",
                        dest="modules_after" if after_command else "modules",
                        default=default if after_command else [],
                        help="import MOD first: a module name, a .py file or a package "
                             "folder that registers experiments or datasets (repeatable; "
                             "also $EK_MODULES, comma-separated)")


def _merge_global_flags(args):
    args.modules = list(args.modules or []) + list(getattr(args, "modules_after", None) or [])


COMMANDS = {"list": show_cmd.cmd_list, "prepare": prepare_cmd.run, "inspect": show_cmd.cmd_inspect,
            "train": train_cmd.run, "evaluate": evaluate_cmd.run,
            "export": export_cmd.run, "show": show_cmd.cmd_show}


def _setup_logging(verbose):
    if not verbose:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        # Keras 2 warns about its own legacy paths (HDF5, set_learning_phase)
        # that the exports and the Estimator path use on purpose.
        warnings.filterwarnings("ignore", category=UserWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(message)s" if not verbose
                        else "%(levelname)s %(name)s: %(message)s")
    # TensorFlow's Python logger is chatty at INFO; keep its warnings.
    logging.getLogger("tensorflow").setLevel(logging.INFO if verbose else logging.ERROR)
    logging.getLogger("absl").setLevel(logging.INFO if verbose else logging.ERROR)
    # JAX (keras3 engine) reports each accelerator platform it did not find at INFO.
    logging.getLogger("jax").setLevel(logging.INFO if verbose else logging.WARNING)


# Commands that import TensorFlow (the others stay fast without it).
_TENSORFLOW_COMMANDS = ("prepare", "inspect", "train", "evaluate", "export")
# Those that build a model here: their engine decides which Keras tf.keras is.
_MODEL_COMMANDS = ("train", "evaluate", "export")


def _prepare_keras(args):
    """Sets up the Keras the engine needs before TensorFlow is imported, and
    refuses a keras3 setup that cannot train (no Keras 3, a bad KERAS_BACKEND).
    list, prepare and inspect need no Keras, submit trains elsewhere, cluster
    tasks prepare their own; tune's trials do too, but a bad setup is refused
    before the first trial starts (on a copy of the environment)."""
    engine = getattr(args, "engine", None) or "auto"
    if args.command in _MODEL_COMMANDS:
        engines.prepare_keras(engine, model_dir=commands.model_dirs(args)[0])
    elif args.command == "tune":
        engines.prepare_keras(engine, environ=dict(os.environ))


def _import_tensorflow_quietly():
    """Imports TensorFlow with the stderr file descriptor pointed at /dev/null.

    TensorFlow 2.16+ prints absl and oneDNN lines from C++ while its libraries
    load, before TF_CPP_MIN_LOG_LEVEL or any Python logging setting applies;
    they would bury the one-paragraph errors and progress lines. A failing
    import is left for the command to raise again, with its message.
    """
    if "tensorflow" in sys.modules:
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w", encoding="utf-8") as null:
            os.dup2(null.fileno(), 2)
            try:
                import tensorflow  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
            except Exception:  # pylint: disable=broad-except
                pass
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def main(argv=None):
    # Before TensorFlow starts its threads (estimator_keras.memory).
    memory.limit_arenas()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    parsing.check_command_flags_come_after(parser, argv)
    args, extra = parser.parse_known_args(argv)
    if extra and args.command == "train" and args.tuning_trial:
        try:
            found = train_cmd.trial_hparams(extra)
        except UsageError as e:
            parser.error(str(e))
        args.hparams = ",".join(filter(None, (args.hparams, found)))
    elif extra and args.command == "prepare":
        args.beam_options = prepare_cmd.beam_options(parser.commands["prepare"], extra)
    elif extra and args.command != "cluster":
        parser.commands[args.command].unrecognized(extra)
    _merge_global_flags(args)
    _setup_logging(args.verbose)
    try:
        _prepare_keras(args)
        quiet = not args.verbose and args.command in _TENSORFLOW_COMMANDS
        if args.command in _MODEL_COMMANDS:
            if quiet and catalog.plugins_requested(args.modules):
                # The user's modules may import TensorFlow, which prints
                # its C++ lines as it loads.
                _import_tensorflow_quietly()
            commands.check_usage(args)
        if quiet:
            _import_tensorflow_quietly()
        if args.command == "cluster":
            return cluster_cmd.run(args, extra)
        if args.command == "submit":
            return submit.run(args)
        if args.command == "tune":
            return tune_cmd.run(args)
        if args.command == "train":
            preemption.exit_on_preemption()  # see the Preempted branch below
        return COMMANDS[args.command](args)
    except UsageError as e:
        _fail(e, args.verbose)
        return 2
    except Preempted as e:
        sys.stderr.write(_one_paragraph(e) + "\n")
        if args.command == "train":
            # The checkpoint is saved; TensorFlow's teardown (a multi-worker
            # runtime waiting for peers that are gone) must not outlast the
            # grace period, nor meet the launcher's next SIGTERM.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(e.exit_code)
        return e.exit_code
    except EstimatorKerasError as e:
        _fail(e, args.verbose)
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in keras_setup.TENSORFLOW_STACK_MODULES:
            _fail(e, args.verbose, internal=True)
            return 1
        _fail(EstimatorKerasError(
            f"{e.name} is not installed, and `{args.command}` needs it. Install TensorFlow with "
            f"this package's extras, in the folder of your estimator-keras checkout: pip "
            f"install -e '.[cpu]' (TensorFlow 2.15 + tf.estimator on Python <= 3.11, "
            f"TensorFlow 2.21 + Keras 3 on 3.12+; '.[gpu]' with CUDA), or pip install -e "
            f"'.[keras-cpu]' plus pip install --no-deps 'tf-keras~=2.21.0' (TensorFlow 2.21, "
            f"keras engine). Without TensorFlow, the keras3 engine trains on JAX: pip install "
            f"-e '.[jax]' (Python 3.11+) and KERAS_BACKEND=jax."), args.verbose)
        return 1
    except Exception as e:  # pylint: disable=broad-except
        _fail(e, args.verbose, internal=True)
        return 1


def _fail(error, verbose, internal=False):
    if verbose:
        traceback.print_exc()
    kind = f"internal error ({type(error).__name__})" if internal else "error"
    hint = "" if verbose else " (rerun with --verbose for the traceback)" if internal else ""
    sys.stderr.write(f"{kind}: {_one_paragraph(error)}{hint}\n")


def _one_paragraph(error):
    text = getattr(error, "message", None) or str(error)
    if getattr(error, "keep_lines", False):
        # A message written as a few short lines (what, why, what to do).
        return "\n  ".join(" ".join(line.split()) for line in text.splitlines() if line.strip())
    return " ".join(text.split())
