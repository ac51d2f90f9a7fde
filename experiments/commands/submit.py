"""`python -m experiments submit`: run an experiment as a Vertex AI custom job, a Kubeflow TrainJob, TFJob or JAXJob.

Examples::

    # what would be sent, without building, uploading or creating anything
    python -m experiments submit fashion_mnist_cnn --project my-proj \\
        --region us-central1 --job-dir gs://my-bucket/runs/1 \\
        --workers 2 --ps 1 --evaluator --accelerator NVIDIA_TESLA_T4:1 --dry-run

    # from an image built with the repository's Dockerfile: no sdist
    python -m experiments submit fashion_mnist_cnn --project my-proj \\
        --region us-central1 --job-dir gs://my-bucket/runs/2 \\
        --container-image us-docker.pkg.dev/my-proj/ml/estimator-keras:1 --dry-run

    # a hyperparameter tuning job: 8 trials, 2 at a time
    python -m experiments submit fashion_mnist_mlp --project my-proj \\
        --region us-central1 --job-dir gs://my-bucket/tune/1 --tune space.yaml \\
        --max-trials 8 --parallel-trials 2 --algorithm random --dry-run

    # Kubeflow Trainer v2: the TensorFlow runtime (once per cluster), then a
    # TrainJob of 3 nodes (the keras3 engine's runs on Trainer's jax-distributed)
    python -m experiments submit --target trainjob --print-runtime \\
        --container-image gcr.io/p/ek:1 --output runtime.yaml
    python -m experiments submit fashion_mnist_cnn --target trainjob \\
        --job-dir gs://my-bucket/runs/1 --workers 2 --cpu 8 --memory 16Gi \\
        --container-image gcr.io/p/ek:1 --output trainjob.yaml

    # a Kubeflow TFJob manifest (training-operator v1.9) for an image that has the package installed
    python -m experiments submit fashion_mnist_cnn --target tfjob \\
        --job-dir gs://my-bucket/runs/1 --workers 2 \\
        --container-image gcr.io/p/ek:1 --output tfjob.yaml

    # the keras3 engine on JAX, 3 processes: a Kubeflow JAXJob, or Vertex AI
    # (an image built with --build-arg STACK=keras3 --build-arg PYTHON_VERSION=3.12)
    python -m experiments submit fashion_mnist_cnn --target jaxjob --engine keras3 \\
        --job-dir gs://my-bucket/runs/4 --workers 2 \\
        --container-image gcr.io/p/ek:keras3 --output jaxjob.yaml
    python -m experiments submit fashion_mnist_cnn --engine keras3 --project my-proj \\
        --region us-central1 --job-dir gs://my-bucket/runs/5 --workers 2 \\
        --container-image gcr.io/p/ek:keras3 --dry-run

    # your own experiment: your package is built and installed beside this one,
    # the job imports --module by name and reads the uploaded config file
    python -m experiments --module my_experiments submit my_cnn \\
        --package-dir ./my-package --config my_cnn.yaml --project my-proj \\
        --region us-central1 --job-dir gs://my-bucket/runs/3 --dry-run
"""

import argparse
import contextlib
import datetime
import json
import os
import re
import shlex
import sys
from typing import Callable, List, Optional, Sequence

from estimator_keras import engines, io
from estimator_keras.cloud import jaxjob, katib, packaging, submission, tfjob, trainjob
from estimator_keras.tuning import space as space_lib
from estimator_keras.cloud.spec import (DEFAULT_MACHINE_TYPE, JobSpec, check_job_engine,
                                        job_entry, keras_backends)
from estimator_keras.errors import ConfigError, UsageError
from estimator_keras.tracking import settings as tracking_settings
from experiments.catalog import loading as catalog
from experiments.catalog import registry
from experiments.commands import submit_vertex
from experiments.config import files as config_files
from experiments.config import hparams
from experiments.config import flags as train_flags

STRATEGIES = train_flags.STRATEGIES
# train's flags that submit defines itself: the experiment, where the job
# reads and writes (--job-dir, --data-dir as gs:// URIs) and --config, which
# is uploaded. The others come from train_flags and reach the job as given.
OWN_FLAGS = ("name", "model_dir", "data_dir", "config")
# Those the JobSpec puts into the job's arguments (--engine also picks the image).
SPEC_FLAGS = OWN_FLAGS + ("engine",)
POSITIVE_FLAGS = ("max_steps", "batch_size", "eval_every")
# --target -> what writes its Kubeflow manifest.
KUBEFLOW_TARGETS = {"trainjob": trainjob.build_trainjob_manifest,
                    "tfjob": tfjob.build_tfjob_manifest, "jaxjob": jaxjob.build_jaxjob_manifest}


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a whole number >= 0, got %r" % text)
    if value < 0:
        raise argparse.ArgumentTypeError("expected a whole number >= 0, got %r" % text)
    return value


def positive_int(text: str) -> int:
    """argparse type: a whole number > 0."""
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
        help="run an experiment as a Vertex AI custom job (or write a Kubeflow TFJob or "
             "JAXJob)",
        description=(
            "Package this project, upload it under --job-dir and start `train NAME` as "
            "a Vertex AI custom job with a chief, optional workers, parameter servers "
            "and an evaluator (or, with --container-image, run an image that has the "
            "package installed). --job-dir is the job's base output directory: Vertex "
            "puts checkpoints in JOB_DIR/checkpoints, event files in JOB_DIR/logs and "
            "the export in JOB_DIR/model; records are read from JOB_DIR/data (or "
            "--data-dir). --tune FILE makes it a hyperparameter tuning job. With "
            "--target tfjob, write a Kubeflow TFJob manifest instead; with --target "
            "jaxjob (--engine keras3), a Kubeflow JAXJob. --engine keras3 runs an image "
            "with Keras 3 and JAX (--container-image) on --keras-backend jax, its "
            "processes (1 + --workers) training together. Your own "
            "experiments: --package-dir builds and installs your package too, and "
            "the job imports the modules of --module (or EK_MODULES) by name; "
            "--config FILE is uploaded to JOB_DIR/config and passed to train. "
            "Every other flag of `train` (and --verbose) is passed on to the job's "
            "`train`; --job-dir stands for its --model-dir."),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("Examples::", 1)[1])
    parser.add_argument("name", metavar="NAME", nargs="?",
                        help="experiment to train, e.g. fashion_mnist_cnn")
    parser.add_argument("--project", help="Google Cloud project id (required for Vertex AI)")
    parser.add_argument("--region",
                        help="Vertex AI region, e.g. us-central1 (required for Vertex AI)")
    parser.add_argument("--job-dir", metavar="gs://BUCKET/PATH",
                        help="job folder (Vertex's base output directory): package, "
                             "checkpoints, logs, model and default data")
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
    parser.add_argument("--config", metavar="FILE",
                        help="train's config file: uploaded to JOB_DIR/config/ and passed "
                             "as --config gs://... (a gs:// file is passed as it is; a "
                             "TFJob passes FILE as given: the image must hold it)")
    # Refused with a pointer to --job-dir, rather than as an unknown flag.
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--package-dir", action="append", dest="package_dirs", default=[],
                        metavar="DIR",
                        help="your own package (a folder with setup.py or pyproject.toml) "
                             "that holds the --module code: its sdist is built and "
                             "uploaded beside this package's and the job installs both "
                             "(repeatable; not with --container-image or --target "
                             "tfjob/jaxjob)")
    parser.add_argument("--package-uri", metavar="gs://...tar.gz",
                        help="use this uploaded sdist instead of building and uploading one")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the request and the commands; build, upload and "
                             "create nothing")
    parser.add_argument("--target", choices=("vertex",) + tuple(KUBEFLOW_TARGETS) + ("katib",),
                        default="vertex",
                        help="vertex (default) submits; trainjob writes a Kubeflow Trainer v2 "
                             "TrainJob (every engine); tfjob a Kubeflow TFJob and jaxjob "
                             "(--engine keras3) a JAXJob, for training-operator v1.9; katib "
                             "(with --tune) a Katib Experiment")
    parser.add_argument("--keras-backend", choices=keras_backends(),
                        help="--engine keras3 only: KERAS_BACKEND of the job's containers "
                             "(default jax; tensorflow only without --workers)")
    parser.add_argument("--image", metavar="URI",
                        help="vertex: the executor image that installs the uploaded package, "
                             "replacing the prebuilt one (TensorFlow 2.15 for the estimator "
                             "engine, 2.17 for keras); tfjob, jaxjob: the container image")
    parser.add_argument("--container-image", metavar="URI",
                        help="an image with this package installed (see the Dockerfile): "
                             "vertex runs it with containerSpec and uploads no package; "
                             "tfjob and jaxjob run it (keras3 needs one with Keras 3 and "
                             "JAX)")
    kubernetes = parser.add_argument_group("Kubeflow Trainer v2 (--target trainjob)")
    kubernetes.add_argument("--print-runtime", action="store_true",
                            help="write the ClusterTrainingRuntime the estimator and keras "
                                 "engines' TrainJobs run on (install it once per cluster "
                                 "with kubectl apply), from --container-image; NAME and "
                                 "--job-dir are not needed")
    kubernetes.add_argument("--cpu", metavar="QUANTITY",
                            help="CPUs each node requests and is limited to, a Kubernetes "
                                 "quantity: 8, 500m")
    kubernetes.add_argument("--memory", metavar="QUANTITY",
                            help="memory each node requests and is limited to: 16Gi, 512Mi")
    parser.add_argument("--output", metavar="FILE",
                        help="write the manifest YAML (tfjob, jaxjob) or the request JSON "
                             "(vertex) here")
    forwarded = train_flags.add_train_flags(
        parser.add_argument_group("train's flags, passed to the job's `train`"),
        exclude=OWN_FLAGS)
    for action in forwarded:  # refused here, not by the job once it runs
        if action.dest in POSITIVE_FLAGS:
            action.type = positive_int
    submit_vertex.add_vertex_flags(parser)
    tuning = parser.add_argument_group("hyperparameter tuning (Vertex AI, Katib)")
    tuning.add_argument("--tune", metavar="FILE",
                        help="search space YAML: create a HyperparameterTuningJob over it")
    tuning.add_argument("--max-trials", type=positive_int, metavar="N",
                        help="trials in the study (required with --tune)")
    tuning.add_argument("--parallel-trials", type=positive_int, default=1, metavar="P",
                        help="trials running at once (default 1)")
    tuning.add_argument("--metric", metavar="NAME", default="accuracy",
                        help="evaluation metric the trials report (default accuracy)")
    tuning.add_argument("--goal", choices=("max", "min"),
                        help="default: min for loss-like metric names, max otherwise")
    tuning.add_argument("--algorithm", choices=tuple(katib.ALGORITHMS),
                        help="vertex: grid or random (default: Vertex AI's own, "
                             "ALGORITHM_UNSPECIFIED); katib: any of these (default tpe)")
    tuning.add_argument("--pruner", choices=("median", "hyperband", "asha", "none"),
                        default="none",
                        help="katib: stop trials that fall behind (Katib's medianstop)")
    return parser


def _train_args(args) -> List[str]:
    """The job's ``train`` flags after those the JobSpec sets: every one of
    train's flags given to submit, and --verbose."""
    out = train_flags.trial_argv(args, exclude=SPEC_FLAGS + ("track",))
    track = _job_tracking_uri(args)
    if track:
        out += ["--track", track]
    if getattr(args, "verbose", False):
        out.append("--verbose")
    return out


def _job_tracking_uri(args) -> Optional[str]:
    """--track resolved here (a bare --track takes this shell's
    MLFLOW_TRACKING_URI); the job runs elsewhere, so it must be a server."""
    track = tracking_settings.resolve(getattr(args, "track", None))
    if track and not tracking_settings.is_remote(track):
        raise ConfigError(
            f"--track {track}: a {args.target} job runs on other machines, which cannot "
            f"write to a tracking store on this one. Give the http(s):// address of a tracking "
            f"server the job can reach (or databricks), or leave --track out.")
    if getattr(args, "register", None) and not track:
        raise ConfigError(f"--register {args.register} registers the job's export in MLflow: "
                          f"give --track URI too.")
    if getattr(args, "register", None) and getattr(args, "tune", None):
        raise ConfigError(f"--register {args.register} with --tune would make every trial's "
                          f"export a version of {args.register}: leave --register out, and "
                          f"register the best trial's run afterwards (`tune --register` does so "
                          f"for a local study).")
    return track


@contextlib.contextmanager
def _importable_from(package_dirs: Sequence[str]):
    """The user's package folders (and their src/) on sys.path, so that
    --module names resolve here as they will once the job installed them."""
    added = []
    for directory in package_dirs:
        for path in (io.join(directory, "src"), directory):
            path = os.path.abspath(path)
            if io.isdir(path) and path not in sys.path:
                sys.path.insert(0, path)
                added.append(path)
    try:
        yield
    finally:
        for path in added:
            if path in sys.path:
                sys.path.remove(path)


def _check_experiment(name: str, known_experiments: Optional[Callable[[str], object]],
                      modules=(), package_dirs=(), verbose=False):
    if not isinstance(name, str) or not name.strip():
        raise UsageError("NAME must name an experiment, e.g. fashion_mnist_cnn; got %r." % name)
    if known_experiments is None:
        with _importable_from(package_dirs):
            catalog.check(catalog.load(modules), verbose)
        known_experiments = registry.get
    try:
        found = known_experiments(name)
    except KeyError:
        found = None
    if found is None:
        raise UsageError("Unknown experiment %r (NAME of `submit`)." % name)
    return found


def _config(args, experiment):
    """The experiment's config with a local --config file applied (checked
    here, before anything is uploaded); None for a stand-in experiment."""
    config = getattr(experiment, "config", None)
    path = getattr(args, "config", None)
    if config is None or not path or path.startswith("gs://") or (
            args.target in KUBEFLOW_TARGETS and not io.isfile(path)):
        return config
    return config_files.apply(config, config_files.load(path), source="--config %s" % path)


def _check_package_dirs(args, package_dirs: Sequence[str]) -> None:
    """Refuse --package-dir where nothing is installed, and folders pip could
    not build, before any module is imported."""
    if not package_dirs:
        return
    if args.target in KUBEFLOW_TARGETS:
        raise UsageError("--package-dir does not apply to --target %s: a Kubeflow job "
                         "installs nothing, so build your package into the image and "
                         "pass --module with its module name there." % args.target)
    if args.container_image:
        raise UsageError("--package-dir cannot go with --container-image: a job run from "
                         "an image installs nothing, so the image must already contain "
                         "your code (build it into the image and pass --module), or drop "
                         "--container-image to have the packages installed on the "
                         "prebuilt image.")
    for directory in package_dirs:
        packaging.package_sdist_command(directory, "dist")


def _check_user_code(spec: JobSpec, origin: Optional[str]) -> None:
    """A Vertex job that installs packages has the user's code only from
    --package-dir: refuse what it could not import there. ``origin``: where
    the experiment was registered from, when known."""
    if spec.container_image:
        return
    spec.check_package_modules()
    if spec.package_dirs:
        return
    if spec.modules:
        raise UsageError(
            "--module %s (or EK_MODULES) is your code, but the job would install only "
            "this package: add --package-dir DIR, the folder of your package (setup.py "
            "or pyproject.toml) that provides it, or run an image that holds it with "
            "--container-image." % ", ".join(spec.modules))
    if origin is not None and origin != "built-in":
        raise UsageError(
            "experiment %r comes from %s, which the job would not have: add "
            "--package-dir DIR, the folder of the package that provides it, or run "
            "an image that holds it with --container-image." % (spec.experiment, origin))


def _study(args, config) -> Optional[space_lib.Study]:
    """The tuning study --tune asks for; its space checked against the
    hyperparameters the experiment accepts (when the experiment has a config)."""
    tuning_flags = [f for f, v in (("--max-trials", args.max_trials),
                                   ("--goal", args.goal), ("--algorithm", args.algorithm),
                                   ("--pruner", args.pruner != "none")) if v]
    if not args.tune:
        if tuning_flags:
            raise UsageError("%s only apply with --tune FILE." % ", ".join(tuning_flags))
        return None
    if args.max_trials is None:
        raise UsageError("--tune needs --max-trials N: how many trials the study runs.")
    trial_flags = [f for f, v in (("--tuning-trial", args.tuning_trial),
                                  ("--hypertune-metric", args.hypertune_metric)) if v]
    if trial_flags:
        raise UsageError("--tune sets --tuning-trial and --hypertune-metric itself: every "
                         "trial reports --metric (default accuracy). Drop %s and give the "
                         "metric as --metric NAME." % " and ".join(trial_flags))
    space = space_lib.load_space(args.tune)
    if config is not None:
        fixed = hparams.parse_hparams(args.hparams)
        both = sorted(set(fixed) & set(space.names))
        if both:
            raise ConfigError("%s both in --hparams and in the search space %s; give it "
                              "in one of them." % (", ".join(both), args.tune))
        space.check_hparams(lambda values: hparams.with_overrides(config, {**fixed, **values}))
    if args.target == "vertex" and args.algorithm not in (None, "grid", "random"):
        raise UsageError("--algorithm %s is Katib's (--target katib); Vertex AI takes grid or "
                         "random, or its own default without --algorithm." % args.algorithm)
    if args.target == "vertex" and args.pruner != "none":
        raise UsageError("--pruner applies to --target katib (its medianstop); Vertex AI "
                         "decides early stopping itself.")
    study = space_lib.Study(space, metric=args.metric, goal=args.goal,
                            algorithm=args.algorithm if args.target == "vertex" else None,
                            max_trials=args.max_trials, parallel_trials=args.parallel_trials)
    study.validate()
    return study


def _check_target(args) -> None:
    """What the target and the engine refuse of each other and of the cluster,
    before the engine's own cluster check (whose advice does not know targets)."""
    engine = getattr(args, "engine", None) or "auto"
    tfjob.check_engine(args.target, engine)
    check_job_engine(engine, args.keras_backend, args.workers, args.ps, args.evaluator)


def _check_strategy(args) -> None:
    if args.ps and args.strategy in ("mirrored", "multi_worker_mirrored"):
        raise ConfigError(
            "--strategy %s does not use parameter servers, but --ps %d asks for some: "
            "use --strategy parameter_server (or auto), or drop --ps."
            % (args.strategy, args.ps))
    engine = getattr(args, "engine", None) or "auto"
    # Checked as the job's containers will run, on the job's Keras backend.
    backends = job_entry(engine).backends
    job_environ = dict(os.environ)
    if backends:
        job_environ["KERAS_BACKEND"] = args.keras_backend or backends[0]
    engines.check_cluster(engine, ps="--ps" if args.ps else None,
                          evaluator="--evaluator" if args.evaluator else None,
                          workers=f"--workers {args.workers}" if args.workers else None,
                          strategy=args.strategy, environ=job_environ)
    if args.strategy == "parameter_server" and not args.ps:
        raise ConfigError("--strategy parameter_server needs at least one parameter "
                          "server: add --ps 1 (or more).")


def _write_katib(args, spec, study, config) -> int:
    """``--target katib``: the Experiment, checked with Katib's API models."""
    if study is None:
        raise UsageError("--target katib writes a Katib Experiment: it needs --tune FILE "
                         "(the search space) and --max-trials N.")
    image = args.container_image or args.image
    if not image:
        raise UsageError("--target katib needs --container-image URI (or --image): an image "
                         "with this package installed, such as one built from the "
                         "repository's Dockerfile.")
    max_steps = args.max_steps or (config.train.max_steps if config is not None else None)
    every = args.eval_every or (config.train.eval_every_steps if config is not None else 1)
    experiment = katib.build_experiment(
        spec, study, image, algorithm=args.algorithm or katib.DEFAULT_ALGORITHM,
        pruner=args.pruner, eval_every=every, max_steps=max_steps)
    katib.check(experiment)
    return _write_manifest(args, experiment)


_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|M|G|T)?$")


def _check_resources(args) -> None:
    """--cpu and --memory: Kubernetes quantities, for --target trainjob only."""
    for flag, value, example in (("--cpu", args.cpu, "8 or 500m"),
                                 ("--memory", args.memory, "16Gi or 512Mi")):
        if value is None:
            continue
        if args.target != "trainjob":
            raise UsageError("%s sets a TrainJob node's resources (--target trainjob); on "
                             "%s the machine type decides them (--machine-type)."
                             % (flag, args.target))
        if not _QUANTITY.match(value):
            raise UsageError("%s %r is not a Kubernetes quantity: a number with an optional "
                             "unit, for example %s." % (flag, value, example))


def _write_runtime(args) -> int:
    """``--print-runtime``: the TensorFlow ClusterTrainingRuntime, checked with
    Trainer's API models."""
    runtime = trainjob.build_tensorflow_runtime(args.container_image or args.image)
    trainjob.check(runtime)
    return _write_manifest(args, runtime, "kubectl apply -f")


def _write_manifest(args, manifest, apply="kubectl create -f") -> int:
    """A Kubernetes object as YAML: to --output (atomically), or stdout."""
    text = tfjob.to_yaml(manifest)
    if args.output:
        io.atomic_write(args.output, text)
        print("wrote %s; %s it with: %s %s"
              % (args.output, "start" if apply.startswith("kubectl create") else "install",
                 apply, shlex.quote(args.output)), file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def run(args, known_experiments: Optional[Callable[[str], object]] = None) -> int:
    """Carry out ``submit``; return the exit status (0).

    ``known_experiments(name)`` validates NAME (raising, or returning None, for an
    unknown one); by default ``experiments.catalog.registry.get`` when that module exists.
    Errors propagate as package exceptions for the dispatcher to map.
    """
    if args.print_runtime:
        return _write_runtime(args)
    missing = [what for what, given in (("NAME (the experiment)", args.name),
                                        ("--job-dir gs://BUCKET/PATH", args.job_dir))
               if not given]
    if missing:
        raise UsageError("submit needs %s: the experiment to run and the Cloud Storage "
                         "folder its job writes to (python -m experiments submit NAME "
                         "--job-dir gs://BUCKET/PATH ...)." % " and ".join(missing))
    _check_resources(args)
    if getattr(args, "model_dir", None):
        raise UsageError(
            "--model-dir does not apply to submit: the job's model dir follows --job-dir "
            "(on Vertex AI checkpoints go to JOB_DIR/checkpoints, event files to "
            "JOB_DIR/logs and the export to JOB_DIR/model; a TFJob trains with "
            "--model-dir JOB_DIR/model). Pass the folder as --job-dir gs://BUCKET/PATH.")
    if args.preemption_grace <= 0:
        raise UsageError("--preemption-grace must be a positive number of seconds; given "
                         "%g." % args.preemption_grace)
    modules = [m for m, _ in catalog.requested_modules(getattr(args, "modules", None))]
    package_dirs = list(getattr(args, "package_dirs", None) or [])
    _check_package_dirs(args, package_dirs)
    origin = None
    if known_experiments is None:
        experiment = _check_experiment(args.name, None, modules, package_dirs,
                                       getattr(args, "verbose", False))
        origin = registry.origin_of("experiment", args.name)
    else:
        experiment = _check_experiment(args.name, known_experiments)
    _check_target(args)
    _check_strategy(args)
    study = _study(args, _config(args, experiment))
    display_name = args.display_name or "%s-%s" % (
        args.name, datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S"))
    spec = JobSpec(
        experiment=args.name, job_dir=args.job_dir, project=args.project,
        region=args.region, workers=args.workers, ps=args.ps, evaluator=args.evaluator,
        machine_type=args.machine_type, accelerator=args.accelerator,
        display_name=display_name, train_args=_train_args(args),
        package_uri=args.package_uri, data_dir=args.data_dir,
        engine=getattr(args, "engine", None) or "auto",
        image=args.image if args.target == "vertex" else None,
        container_image=args.container_image, modules=modules, package_dirs=package_dirs,
        config=getattr(args, "config", None), keras_backend=args.keras_backend,
        vertex=submit_vertex.vertex_options(args))

    if args.target == "katib":
        return _write_katib(args, spec, study, _config(args, experiment))
    if args.target in KUBEFLOW_TARGETS:
        image = args.container_image or args.image
        if not image:
            raise UsageError("--target %s needs --container-image URI (or --image): an "
                             "image with this package installed, such as one built from "
                             "the repository's Dockerfile (a Kubeflow job cannot install "
                             "the sdist)." % args.target)
        if study is not None:
            raise UsageError("--tune runs on Vertex AI or Katib (--target katib); for a "
                             "local study use `python -m experiments tune`.")
        if args.target == "trainjob":
            manifest = trainjob.build_trainjob_manifest(spec, image, cpu=args.cpu,
                                                        memory=args.memory)
            trainjob.check(manifest)
            return _write_manifest(args, manifest)
        return _write_manifest(args, KUBEFLOW_TARGETS[args.target](spec, image))

    if not args.project or not args.region:
        raise UsageError("Vertex AI needs --project and --region (for example "
                         "--project my-project --region us-central1).")
    _check_user_code(spec, origin)
    dataset = getattr(args, "dataset", None)
    if dataset and not dataset.startswith("gs://") and ("/" in dataset or io.isdir(dataset)):
        raise UsageError("--dataset %s is a local folder, which the job cannot read: copy "
                         "it to Cloud Storage and pass its gs:// path, or pass a dataset "
                         "name under --data-dir." % dataset)
    result = submission.submit(spec, dry_run=args.dry_run, study=study)
    request_json = json.dumps(result["request"], indent=2)
    if args.output:
        io.atomic_write(args.output, request_json + "\n")
    if args.dry_run:
        print(request_json)
        print()
        if study is not None:
            print("# Commands a real submission amounts to (hptuning_job.json holds the "
                  "request):")
        else:
            print("# Commands a real submission amounts to (job_spec.json holds the "
                  "request's jobSpec, or all of it but the worker pools):")
        if result["package_requires"]:
            print("# the sdist also requires %s (job-requirements.txt), which the "
                  "prebuilt image lacks" % ", ".join(result["package_requires"]))
        for command, workdir in zip(result["commands"], result["workdirs"]):
            # A --package-dir sdist builds in its own folder.
            print("(cd %s && %s)" % (shlex.quote(workdir), shlex.join(command)) if workdir
                  else shlex.join(command))
        return 0
    print(json.dumps({"job": result["job"], "package_uri": result["package_uri"]}, indent=2))
    return 0
