"""What several commands share: the model dirs a run writes, the catalog
loaded once, an experiment's configuration from its flags (and ``train``'s
refusals, checked before TensorFlow is imported).

Modules that load TensorFlow are imported by the commands that need them
only (:func:`tensorflow_module`), so that ``list``, ``show`` and ``--help``
answer at once.
"""

import dataclasses
import importlib
import os

from estimator_keras import io
from estimator_keras.cloud import jobenv
from estimator_keras.errors import UsageError
from experiments.catalog import datasets
from experiments.catalog import loading as catalog
from experiments.catalog import registry
from experiments.config import files as config_files
from experiments.config import hparams

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


