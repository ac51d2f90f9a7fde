"""What the ``list``, ``show``, ``inspect``, ``train``, ``evaluate`` and
``export`` commands do, once :mod:`experiments.cli` has parsed their flags.

Each ``cmd_*`` takes the parsed arguments and returns the exit status; it
prints results on stdout (progress goes to stderr). Modules that load
TensorFlow are imported by the commands that need them only, so that
``list``, ``show`` and ``--help`` answer at once.
"""

import dataclasses
import importlib
import json
import os

import yaml

from estimator_keras import engines, io, manifest
from estimator_keras.cloud import jobenv
from estimator_keras.engines.base import duration, format_metrics
from estimator_keras.errors import UsageError
from experiments import catalog, config_files, datasets, evaluations, hparams, registry

AIP_VARIABLES = ("AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR", "AIP_TENSORBOARD_LOG_DIR")


def tensorflow_module(name):
    """A module that loads TensorFlow, imported only by the commands that need
    it: list, show, --help, cluster and submit start at once without it."""
    return importlib.import_module(name)


def data_dir(args):
    return args.data_dir or os.environ.get("ESTIMATOR_KERAS_DATA_DIR") or "data"


def model_dirs(args):
    """(model dir, export dir or None for MODEL_DIR/export, tensorboard dir,
    flat export): --model-dir, else Vertex AI's AIP_* variables (checkpoints
    in AIP_CHECKPOINT_DIR, summaries in AIP_TENSORBOARD_LOG_DIR, the export
    flat in AIP_MODEL_DIR), else runs/NAME."""
    if not args.model_dir and any(os.environ.get(v) for v in AIP_VARIABLES):
        found = jobenv.resolve_vertex_environment(None)
        return (found["model_dir"], found["export_dir"], found["tensorboard_dir"],
                bool(found.get("flat_export")))
    return args.model_dir or os.path.join("runs", args.name), None, None, False


def load_catalog(args):
    """Fills the registry from the built-in modules, plugins and --module;
    a broken module stops the command (``list`` shows it instead)."""
    catalog.check(catalog.load(getattr(args, "modules", None)), getattr(args, "verbose", False))


def experiment_config(args, **flags):
    """The experiment and its configuration: defaults < --config < --hparams <
    flags (--dataset and the training flags, by config field). A flag and an
    --hparams key that set one field to different values are refused."""
    load_catalog(args)
    experiment = registry.get(args.name)
    config = experiment.config
    if getattr(args, "config", None):
        config = config_files.apply(config, config_files.load(args.config),
                                    source=f"--config {args.config}")
    overrides = hparams.parse_hparams(args.hparams)
    check_flags_agree(config, overrides, flags)
    config = hparams.with_overrides(config, overrides, **flags)
    if getattr(args, "dataset", None):
        config = dataclasses.replace(config, data=dataclasses.replace(config.data,
                                                                      dataset=args.dataset))
    return experiment, config


def cmd_list(args):
    broken = catalog.load(getattr(args, "modules", None))
    print("experiments:")
    for name in registry.names():
        c = registry.get(name).config
        decay = c.train.learning_rate_decay
        lr = f"{c.train.learning_rate}" + ("" if decay == "constant" else f" ({decay} decay)")
        print(f"  {name:<20} {c.description}")
        print(f"  {'':<20} dataset {c.data.dataset or '(--dataset)'}, batch "
              f"{c.train.batch_size}, {c.train.max_steps} steps, lr {lr}; "
              f"from {registry.origin_of('experiment', name)}")
    print("datasets:")
    for name in registry.dataset_names():
        print(f"  {name:<20} {registry.dataset(name).description}; from "
              f"{registry.origin_of('dataset', name)}")
    if broken:
        print("broken plugins (their experiments are missing above):")
        for item in broken:
            print(f"  {item.message()}")
    print(f"engines (--engine auto: {engines.AUTO_RULE}):")
    for name, status in engines.describe():
        print(f"  {name:<20} {status}")
    return 0


def trial_hparams(extra):
    """The ``--name=value`` / ``--name value`` arguments a tuning service
    appends to a trial's command, as ``--hparams`` text."""
    items, rest = [], list(extra)
    while rest:
        arg = rest.pop(0)
        if not arg.startswith("--") or arg == "--":
            raise UsageError(f"a tuning trial's extra argument {arg!r} is not --name=value.")
        name, eq, value = arg[2:].partition("=")
        if not eq:
            if not rest or rest[0].startswith("--"):
                raise UsageError(f"a tuning trial's argument --{name} has no value.")
            value = rest.pop(0)
        if "," in value:
            raise UsageError(f"a tuning trial's value --{name}={value!r} contains a comma.")
        items.append(f"{name}={value}")
    return ",".join(items)


def cmd_show(args):
    if getattr(args, "engine", None):
        if args.name:
            raise UsageError(f"show takes an experiment NAME or --engine, not both (got "
                             f"{args.name} and --engine {args.engine}).")
        entry = engines.registry.get(args.engine)
        status = dict((name, text) for name, text in engines.describe())[entry.name]
        print(yaml.safe_dump(dict(entry.facts(), here=status), sort_keys=False,
                             default_flow_style=False, width=100), end="")
        return 0
    if not args.name:
        raise UsageError("show needs an experiment NAME (see `list`), or --engine ENGINE.")
    _, config = experiment_config(args)
    print(config_files.to_yaml(config), end="")
    return 0


def cmd_inspect(args):
    verify = tensorflow_module("estimator_keras.verify")
    report = verify.inspect(args.path, verify=args.verify)
    print(verify.format_report(report))
    return 1 if report.broken else 0


# train's flags that set a config field (they beat --hparams).
TRAIN_CONFIG_FLAGS = {"max_steps": "max_steps", "batch_size": "batch_size",
                      "eval_every": "eval_every_steps", "deterministic": "deterministic"}


def check_flags_agree(config, overrides, flags):
    """Raises UsageError when a flag (``flags``: config field -> value or
    None) and an --hparams key (``overrides``: key -> text) set the same
    field to different values: two parts of one command line that disagree,
    where neither is more deliberate than the other. A config file below
    them is another layer, overridden without a word."""
    names = {field: "--" + flag.replace("_", "-") for flag, field in TRAIN_CONFIG_FLAGS.items()}
    for field, value in flags.items():
        if value is None or field not in overrides:
            continue
        text = overrides[field]
        if hparams.parse_value(field, text, getattr(config.train, field)) != value:
            flag = names.get(field, "--" + field.replace("_", "-"))
            raise UsageError(
                f"{flag} {value} and --hparams {field}={text} set {field} to different values; "
                f"give it once, as {flag} or in --hparams (a tuning trial's extra "
                f"--name=value arguments are --hparams).")


def train_config(args):
    """The experiment and configuration ``train`` runs with these arguments
    (UsageError or ConfigError for values it refuses)."""
    if args.preemption_grace <= 0:
        raise UsageError(f"--preemption-grace must be a positive number of seconds; given "
                         f"{args.preemption_grace:g}.")
    return experiment_config(args, **{field: getattr(args, flag)
                                      for flag, field in TRAIN_CONFIG_FLAGS.items()})


def check_usage(args):
    """Refuses what train, evaluate and export would refuse before they
    start (an unknown experiment or hparam, a value of the wrong type, a
    --dataset that is not there): all TensorFlow-free, so that bad usage is
    answered before TensorFlow is imported."""
    if io.is_remote(getattr(args, "config", None) or ""):
        # Read through TensorFlow's file system: the command itself reads it.
        return
    if args.command != "train":
        experiment_config(args)
        return
    _, config = train_config(args)
    where = data_dir(args)
    if not any(io.is_remote(p) for p in (config.data.dataset or "", where)):
        datasets.find(config.data.dataset, where)


def cmd_train(args):
    train = tensorflow_module("experiments.train")
    experiment, config = train_config(args)
    model_dir, export_dir, tensorboard_dir, flat = model_dirs(args)
    result = train.train(experiment, config, model_dir=model_dir, data_dir=data_dir(args),
                         source_dir=args.source_dir, strategy=args.strategy,
                         engine=args.engine, skip_corrupt=args.skip_corrupt, export_dir=export_dir,
                         tensorboard_dir=tensorboard_dir, preemption_grace=args.preemption_grace,
                         flat_export=flat, hypertune_metric=args.hypertune_metric,
                         evaluations=evaluations.Recorder(args.evaluations_file,
                                                          args.print_evaluations),
                         track=args.track, register=args.register,
                         restart_order=args.restart_order)
    if result.metrics:
        print(f"final metrics: {format_metrics(result.metrics)} "
              f"({describe_evaluation(result.evaluated)})")
    print_export(result.export_dir)
    local = result.task == "chief-0" and not os.environ.get("TF_CONFIG")
    print(f"{'' if local else f'[{result.task}] '}done in {duration(result.seconds)}")
    return 0


def describe_evaluation(evaluated):
    """"test split, 10,000 examples, checkpoint step 6000"."""
    parts = [f"{evaluated['split']} split"]
    if evaluated.get("examples"):
        parts.append(f"{evaluated['examples']:,} examples")
    if evaluated.get("step") is not None:
        parts.append(f"checkpoint step {evaluated['step']}")
    return ", ".join(parts)


EXPORT_FILES = (("model.keras", "Keras 3 model, keras.saving.load_model(path)"),
                ("model.h5", "Keras model, load_model(path, compile=False)"),
                ("weights.h5", "weights only"),
                ("saved_model", "SavedModel"))


def print_export(export_dir):
    if export_dir:
        # The model files that are there: model.keras is the keras3 engine's
        # alone, and a keras3 export of another version may lack model.h5.
        found = [(name, what) for name, what in EXPORT_FILES
                 if name in ("weights.h5", "saved_model") or io.exists(io.join(export_dir, name))]
        for k, (name, what) in enumerate(found):
            label = "exported:" if k == 0 else ""
            print(f"{label:9} {io.join(export_dir, name)}  ({what})")


def cmd_evaluate(args):
    train = tensorflow_module("experiments.train")
    experiment, config = experiment_config(args)
    model_dir = model_dirs(args)[0]
    metrics = train.evaluate(experiment, config, model_dir=model_dir,
                             data_dir=data_dir(args), engine=args.engine)
    if args.json:
        print(json.dumps(metrics, indent=2, sort_keys=True))
        return 0
    path, _ = datasets.find(config.data.dataset, data_dir(args))
    evaluated = {"split": config.data.eval_split, "step": metrics.get("global_step"),
                 "examples": manifest.load_manifest(path).splits[
                     config.data.eval_split].num_examples}
    print(f"evaluated {model_dir} ({describe_evaluation(evaluated)}):")
    for key, value in sorted(metrics.items()):
        if key != "global_step":
            print(f"  {key:<16} {value:.4f}")
    return 0


def cmd_export(args):
    train = tensorflow_module("experiments.train")
    experiment, config = experiment_config(args)
    out, written = train.export(experiment, config, model_dir=model_dirs(args)[0],
                                data_dir=data_dir(args), export_dir=args.export_dir,
                                force=args.force)
    if not written:
        print(f"{out} already holds the export of the latest checkpoint: left as it is "
              f"(--force writes it again)")
    print_export(out)
    return 0
