"""The ``python -m experiments`` commands: one function per command.

Exit status: 0 success, 2 bad usage (unknown experiment, flag or hparam,
invalid TF_CONFIG...), 1 anything else, 130 interrupted. Errors print one
paragraph; ``--verbose`` adds the traceback and TensorFlow's own logs.
"""

import argparse
import importlib
import json
import logging
import os
import sys
import traceback
import warnings

from estimator_keras import engines, manifest
from estimator_keras.cloud import jobenv
from estimator_keras.errors import EstimatorKerasError, UsageError
from experiments import catalog, cluster_cmd, hparams, registry, submit

logger = logging.getLogger("experiments")


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on bad usage, as we want; this keeps its message
    to one paragraph with a pointer to --help."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\nSee `{self.prog} --help`.\n")


def _add_train_flags(p, with_model_dir_required=False):
    p.add_argument("name", metavar="NAME", help="experiment name (see `list`)")
    p.add_argument("--model-dir", required=with_model_dir_required, metavar="DIR",
                   help="checkpoints, summaries and exports (default runs/NAME; "
                        "AIP_MODEL_DIR's parent on Vertex AI)")
    p.add_argument("--data-dir", default=None, metavar="DIR",
                   help="root of prepared datasets (default: $ESTIMATOR_KERAS_DATA_DIR "
                        "or ./data)")
    p.add_argument("--hparams", default="", metavar="K=V,...",
                   help="override config fields, e.g. learning_rate=0.01,dropout=0.3")


def _add_engine_flag(p):
    p.add_argument("--engine", default="auto", choices=["auto", "estimator", "keras"],
                   help="estimator: tf.estimator.train_and_evaluate (TensorFlow <= 2.15); "
                        "keras: Model.fit (TensorFlow 2.15+, tf-keras on 2.16+); auto "
                        "(default): estimator where tensorflow_estimator imports, else keras")


def build_parser():
    parser = _Parser(prog="python -m experiments",
                     description="Train Keras models from TFRecords with tf.estimator or Model.fit.")
    parser.add_argument("--verbose", action="store_true",
                        help="show tracebacks and TensorFlow's own logs")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    sub.add_parser("list", help="list experiments and datasets")

    p = sub.add_parser("prepare", help="write a named dataset as sharded TFRecords")
    p.add_argument("dataset", metavar="DATASET", help="fashion_mnist, mnist or shapes")
    p.add_argument("--data-dir", default=None, metavar="DIR",
                   help="writes DIR/DATASET (default ./data)")
    p.add_argument("--source-dir", metavar="DIR",
                   help="IDX files to read (default: Debian's dataset-fashion-mnist, "
                        "else download)")
    p.add_argument("--shards", type=int, metavar="N", help="train shards (default 8)")
    p.add_argument("--num-workers", type=int, default=1, metavar="N",
                   help="processes writing shards in parallel")
    p.add_argument("--compression", choices=["none", "gzip"], default="none")
    p.add_argument("--force", action="store_true", help="rewrite a complete dataset")
    p.add_argument("--max-examples", type=int, metavar="N",
                   help="keep only the first N examples of each split (quick runs)")

    p = sub.add_parser("inspect", help="show a dataset's schema and counts; --verify "
                                       "checks every record")
    p.add_argument("path", metavar="PATH_OR_GLOB")
    p.add_argument("--verify", action="store_true",
                   help="read every record and check its CRC; exit 1 if any is corrupt")

    p = sub.add_parser("train", help="train (and prepare data if missing), evaluate, export")
    _add_train_flags(p)
    p.add_argument("--source-dir", metavar="DIR", help="IDX files for prepare")
    p.add_argument("--max-steps", type=int, metavar="N")
    p.add_argument("--batch-size", type=int, metavar="N", help="examples per replica per step")
    p.add_argument("--eval-every", type=int, metavar="N",
                   help="checkpoint and evaluate every N steps")
    p.add_argument("--strategy", default="auto",
                   choices=["auto", "none", "mirrored", "multi_worker_mirrored",
                            "parameter_server"])
    p.add_argument("--skip-corrupt", action="store_true",
                   help="skip unreadable records (logged) instead of stopping")
    _add_engine_flag(p)

    p = sub.add_parser("evaluate", help="evaluate the latest checkpoint of a model dir")
    _add_train_flags(p)
    _add_engine_flag(p)

    p = sub.add_parser("export", help="export the latest checkpoint to model.h5, "
                                      "weights.h5 and saved_model/")
    _add_train_flags(p)
    p.add_argument("--export-dir", metavar="DIR", help="default MODEL_DIR/export")

    cluster_cmd.add_parser(sub)
    submit.add_parser(sub)
    return parser


def _data_dir(args):
    return args.data_dir or os.environ.get("ESTIMATOR_KERAS_DATA_DIR") or "data"


def _tensorflow_module(name):
    """A module that loads TensorFlow, imported only by the commands that need
    it: list, --help, cluster and submit start at once without it."""
    return importlib.import_module(name)


AIP_VARIABLES = ("AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR", "AIP_TENSORBOARD_LOG_DIR")


def _dirs(args):
    """(model dir, export dir or None for MODEL_DIR/export, tensorboard dir):
    --model-dir, else Vertex AI's AIP_* variables, else runs/NAME."""
    if not args.model_dir and any(os.environ.get(v) for v in AIP_VARIABLES):
        found = jobenv.resolve_vertex_environment(None)
        return found["model_dir"], found["export_dir"], found["tensorboard_dir"]
    return args.model_dir or os.path.join("runs", args.name), None, None


def _model_dir(args):
    return _dirs(args)[0]


def _experiment(args, **flags):
    catalog.load()
    experiment = registry.get(args.name)
    config = hparams.with_overrides(experiment.config, hparams.parse_hparams(args.hparams),
                                    **flags)
    return experiment, config


def cmd_list(args):  # pylint: disable=unused-argument
    catalog.load()
    print("experiments:")
    for name in registry.names():
        c = registry.get(name).config
        print(f"  {name:<20} {c.description}")
        print(f"  {'':<20} dataset {c.data.dataset}, batch {c.train.batch_size}, "
              f"{c.train.max_steps} steps, lr {c.train.learning_rate}")
    print("datasets:")
    for name in registry.dataset_names():
        print(f"  {name:<20} {registry.dataset(name).description}")
    print("engines (--engine auto: estimator where available, else keras):")
    for name, status in engines.describe():
        print(f"  {name:<20} {status}")
    return 0


def cmd_prepare(args):
    catalog.load()
    prepare = _tensorflow_module("experiments.prepare")
    out = prepare.prepare(args.dataset, _data_dir(args), source_dir=args.source_dir,
                          shards=args.shards, num_workers=args.num_workers,
                          compression=None if args.compression == "none" else "GZIP",
                          force=args.force, max_examples=args.max_examples)
    counts = ", ".join(f"{s} {v.num_examples}"
                       for s, v in manifest.load_manifest(out).splits.items())
    print(f"dataset {args.dataset} ready in {out} ({counts})")
    return 0


def cmd_inspect(args):
    verify = _tensorflow_module("estimator_keras.verify")
    report = verify.inspect(args.path, verify=args.verify)
    print(verify.format_report(report))
    return 1 if report.broken else 0


def cmd_train(args):
    train = _tensorflow_module("experiments.train")
    experiment, config = _experiment(args, max_steps=args.max_steps,
                                     batch_size=args.batch_size,
                                     eval_every_steps=args.eval_every)
    model_dir, export_dir, tensorboard_dir = _dirs(args)
    result = train.train(experiment, config, model_dir=model_dir, data_dir=_data_dir(args),
                         source_dir=args.source_dir, strategy=args.strategy,
                         engine=args.engine, skip_corrupt=args.skip_corrupt, export_dir=export_dir,
                         tensorboard_dir=tensorboard_dir)
    _print_result(result.task, result.metrics, result.export_dir, result.seconds)
    return 0


def _print_result(task, metrics, export_dir, seconds=None):
    if metrics:
        shown = ", ".join(f"{k} {v:.4f}" if isinstance(v, float) and k != "global_step"
                          else f"{k} {int(v)}" for k, v in sorted(metrics.items()))
        print(f"final metrics: {shown}")
    if export_dir:
        print(f"exported: {os.path.join(export_dir, 'model.h5')}  (Keras model, "
              f"load_model(path, compile=False))")
        print(f"          {os.path.join(export_dir, 'weights.h5')}  (weights only)")
        print(f"          {os.path.join(export_dir, 'saved_model')}  (SavedModel)")
    if seconds is not None:
        print(f"[{task}] done in {seconds:.0f} s")


def cmd_evaluate(args):
    train = _tensorflow_module("experiments.train")
    experiment, config = _experiment(args)
    metrics = train.evaluate(experiment, config, model_dir=_model_dir(args),
                             data_dir=_data_dir(args), engine=args.engine)
    print(json.dumps(metrics, indent=2, sort_keys=True))
    return 0


def cmd_export(args):
    train = _tensorflow_module("experiments.train")
    experiment, config = _experiment(args)
    out = train.export(experiment, config, model_dir=_model_dir(args),
                       data_dir=_data_dir(args), export_dir=args.export_dir)
    _print_result("chief-0", None, out)
    return 0


COMMANDS = {"list": cmd_list, "prepare": cmd_prepare, "inspect": cmd_inspect,
            "train": cmd_train, "evaluate": cmd_evaluate, "export": cmd_export}


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


# Commands that import TensorFlow (the others stay fast without it).
_TENSORFLOW_COMMANDS = ("prepare", "inspect", "train", "evaluate", "export")


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
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "cluster":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    _setup_logging(args.verbose)
    if not args.verbose and args.command in _TENSORFLOW_COMMANDS:
        _import_tensorflow_quietly()
    try:
        if args.command == "cluster":
            return cluster_cmd.run(args, extra)
        if args.command == "submit":
            return submit.run(args)
        return COMMANDS[args.command](args)
    except UsageError as e:
        _fail(e, args.verbose)
        return 2
    except EstimatorKerasError as e:
        _fail(e, args.verbose)
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in ("tensorflow", "tensorflow_estimator", "tf_keras"):
            _fail(e, args.verbose, internal=True)
            return 1
        _fail(EstimatorKerasError(
            f"{e.name} is not installed, and `{args.command}` needs it. Install TensorFlow with "
            f"this package's extras: pip install 'estimator-keras[cpu]' (TensorFlow 2.15 + "
            f"tf.estimator; [gpu] with CUDA), or 'estimator-keras[keras-cpu]' plus pip install "
            f"--no-deps 'tf-keras~=2.21.0' (TensorFlow 2.21, keras engine)."), args.verbose)
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
    return " ".join(text.split())
