"""`python -m experiments submit`: run an experiment as a Vertex AI custom job or a TFJob.

Examples::

    # what would be sent, without building, uploading or creating anything
    python -m experiments submit fashion_mnist_cnn --project my-proj \\
        --region us-central1 --job-dir gs://my-bucket/runs/1 \\
        --workers 2 --ps 1 --evaluator --accelerator NVIDIA_TESLA_T4:1 --dry-run

    # a Kubeflow TFJob manifest for an image that has the package installed
    python -m experiments submit fashion_mnist_cnn --target tfjob \\
        --job-dir gs://my-bucket/runs/1 --workers 2 --image gcr.io/p/ek:1 \\
        --output tfjob.yaml
"""

import argparse
import datetime
import json
import shlex
import sys
from typing import Callable, List, Optional

from estimator_keras import engines, io
from estimator_keras.cloud import submission, tfjob
from estimator_keras.cloud.spec import DEFAULT_MACHINE_TYPE, JobSpec
from estimator_keras.errors import ConfigError, UsageError
from experiments import catalog, registry

STRATEGIES = ("auto", "none", "mirrored", "multi_worker_mirrored", "parameter_server")


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a whole number >= 0, got %r" % text)
    if value < 0:
        raise argparse.ArgumentTypeError("expected a whole number >= 0, got %r" % text)
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a whole number > 0, got %r" % text)
    if value <= 0:
        raise argparse.ArgumentTypeError("expected a whole number > 0, got %r" % text)
    return value


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``submit`` subcommand to ``subparsers``; return its parser."""
    parser = subparsers.add_parser(
        "submit",
        help="run an experiment as a Vertex AI custom job (or write a Kubeflow TFJob)",
        description=(
            "Package this project, upload it under --job-dir and start `train NAME` as "
            "a Vertex AI custom job with a chief, optional workers, parameter servers "
            "and an evaluator. The model goes to JOB_DIR/model, records are read from "
            "JOB_DIR/data (or --data-dir). With --target tfjob, write a Kubeflow TFJob "
            "manifest instead."),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("Examples::", 1)[1])
    parser.add_argument("name", metavar="NAME",
                        help="experiment to train, e.g. fashion_mnist_cnn")
    parser.add_argument("--project", help="Google Cloud project id (required for Vertex AI)")
    parser.add_argument("--region",
                        help="Vertex AI region, e.g. us-central1 (required for Vertex AI)")
    parser.add_argument("--job-dir", required=True, metavar="gs://BUCKET/PATH",
                        help="job folder: package, model (JOB_DIR/model) and default data")
    parser.add_argument("--data-dir", metavar="gs://BUCKET/PATH",
                        help="records to train on (default: JOB_DIR/data)")
    parser.add_argument("--workers", type=_count, default=0, metavar="N",
                        help="worker replicas besides the chief (default 0)")
    parser.add_argument("--ps", type=_count, default=0, metavar="M",
                        help="parameter-server replicas (default 0)")
    parser.add_argument("--evaluator", action="store_true", help="add one evaluator replica")
    parser.add_argument("--machine-type", default=DEFAULT_MACHINE_TYPE,
                        help="machine type of every replica (default %(default)s)")
    parser.add_argument("--accelerator", metavar="TYPE:COUNT",
                        help="GPUs per chief/worker/evaluator, e.g. NVIDIA_TESLA_T4:1")
    parser.add_argument("--display-name", help="job name (default: NAME-UTC timestamp)")
    parser.add_argument("--hparams", metavar="k=v,...", help="forwarded to train")
    parser.add_argument("--max-steps", type=_positive, metavar="N", help="forwarded to train")
    parser.add_argument("--batch-size", type=_positive, metavar="N", help="forwarded to train")
    parser.add_argument("--eval-every", type=_positive, metavar="N", help="forwarded to train")
    parser.add_argument("--strategy", choices=STRATEGIES, help="forwarded to train")
    parser.add_argument("--engine", choices=("auto", "estimator", "keras"),
                        help="forwarded to train (default there: auto)")
    parser.add_argument("--package-uri", metavar="gs://...tar.gz",
                        help="use this uploaded sdist instead of building and uploading one")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the request and the commands; build, upload and "
                             "create nothing")
    parser.add_argument("--target", choices=("vertex", "tfjob"), default="vertex",
                        help="vertex (default) submits; tfjob writes a Kubeflow TFJob manifest")
    parser.add_argument("--image", metavar="URI",
                        help="container image: required for tfjob; for vertex it replaces "
                             "the prebuilt TensorFlow 2.15 image")
    parser.add_argument("--output", metavar="FILE",
                        help="write the TFJob YAML (tfjob) or the request JSON (vertex) here")
    return parser


def _train_args(args) -> List[str]:
    out: List[str] = []
    if args.hparams:
        out += ["--hparams", args.hparams]
    for flag, value in (("--max-steps", args.max_steps), ("--batch-size", args.batch_size),
                        ("--eval-every", args.eval_every), ("--strategy", args.strategy),
                        ("--engine", getattr(args, "engine", None))):
        if value is not None:
            out += [flag, str(value)]
    return out


def _check_experiment(name: str, known_experiments: Optional[Callable[[str], object]]) -> None:
    if not isinstance(name, str) or not name.strip():
        raise UsageError("NAME must name an experiment, e.g. fashion_mnist_cnn; got %r." % name)
    if known_experiments is None:
        catalog.load()
        known_experiments = registry.get
    try:
        found = known_experiments(name)
    except KeyError:
        found = None
    if found is None:
        raise UsageError("Unknown experiment %r (NAME of `submit`)." % name)


def _check_strategy(args) -> None:
    if args.ps and args.strategy in ("mirrored", "multi_worker_mirrored"):
        raise ConfigError(
            "--strategy %s does not use parameter servers, but --ps %d asks for some: "
            "use --strategy parameter_server (or auto), or drop --ps."
            % (args.strategy, args.ps))
    if getattr(args, "engine", None) == "keras":
        engines.check_keras_cluster(ps="--ps" if args.ps else None,
                                    evaluator="--evaluator" if args.evaluator else None)
    if args.strategy == "parameter_server" and not args.ps:
        raise ConfigError("--strategy parameter_server needs at least one parameter "
                          "server: add --ps 1 (or more).")


def run(args, known_experiments: Optional[Callable[[str], object]] = None) -> int:
    """Carry out ``submit``; return the exit status (0).

    ``known_experiments(name)`` validates NAME (raising, or returning None, for an
    unknown one); by default ``experiments.registry.get`` when that module exists.
    Errors propagate as package exceptions for the dispatcher to map.
    """
    _check_experiment(args.name, known_experiments)
    _check_strategy(args)
    display_name = args.display_name or "%s-%s" % (
        args.name, datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S"))
    spec = JobSpec(
        experiment=args.name, job_dir=args.job_dir, project=args.project,
        region=args.region, workers=args.workers, ps=args.ps, evaluator=args.evaluator,
        machine_type=args.machine_type, accelerator=args.accelerator,
        display_name=display_name, train_args=_train_args(args),
        package_uri=args.package_uri, image=args.image, data_dir=args.data_dir)

    if args.target == "tfjob":
        if not args.image:
            raise UsageError("--target tfjob needs --image URI: a container image with "
                             "this package installed (a TFJob cannot install the sdist).")
        text = tfjob.to_yaml(tfjob.build_tfjob_manifest(spec, args.image))
        if args.output:
            io.atomic_write(args.output, text)
            print("wrote %s; start it with: kubectl create -f %s"
                  % (args.output, shlex.quote(args.output)), file=sys.stderr)
        else:
            sys.stdout.write(text)
        return 0

    if not args.project or not args.region:
        raise UsageError("Vertex AI needs --project and --region (for example "
                         "--project my-project --region us-central1).")
    result = submission.submit(spec, dry_run=args.dry_run)
    request_json = json.dumps(result["request"], indent=2)
    if args.output:
        io.atomic_write(args.output, request_json + "\n")
    if args.dry_run:
        print(request_json)
        print()
        print("# Commands a real submission amounts to (job_spec.json holds the "
              "request's jobSpec, or all of it but the worker pools):")
        for command in result["commands"]:
            print(shlex.join(command))
        return 0
    print(json.dumps({"job": result["job"], "package_uri": result["package_uri"]}, indent=2))
    return 0
