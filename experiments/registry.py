"""Experiments by name: typed configs and the registry.

An experiment is a config (what data, which model hyperparameters, how to
train) plus a function that builds the Keras model from the model
hyperparameters. Experiment modules register themselves at import time::

    register(Experiment(
        config=ExperimentConfig(name="my_cnn", description="...",
                                data=DataConfig(dataset="fashion_mnist"),
                                model={"dropout": 0.5}),
        build_model=my_builder))

``--hparams key=value,...`` overrides any field of TrainConfig, DataConfig
or the model dict; each value is parsed to the type of the default.
"""

import dataclasses
import typing

from estimator_keras.errors import ConfigError, UsageError


@dataclasses.dataclass
class DataConfig:
    """Which dataset an experiment reads, and how."""

    dataset: str
    """Registered dataset name (see `python -m experiments prepare --help`)."""
    train_split: str = "train"
    """Split to train on."""
    eval_split: str = "test"
    """Split to evaluate on (one full pass per evaluation)."""
    features: dict = dataclasses.field(default_factory=lambda: {"image": "image"})
    """Model input name -> record feature name."""
    label: str = "label"
    """Record feature holding the label."""
    shuffle: str = "batch"
    """"batch" (shuffle files and whole batches: fast), "record" (classic
    per-record buffer), or "none"."""
    shuffle_buffer: int = 64
    """Shuffle buffer: batches for "batch", records for "record"."""
    cache: bool = False
    """Cache parsed batches in memory after the first epoch."""


@dataclasses.dataclass
class TrainConfig:
    """How to train."""

    batch_size: int = 128
    """Examples per step per replica (the global batch is this times the
    number of replicas; both are logged)."""
    max_steps: int = 5000
    """Total training steps (global step), across restarts."""
    eval_every_steps: int = 1000
    """Save a checkpoint and evaluate every this many steps."""
    log_every_steps: int = 200
    """Log loss, steps/s and examples/s every this many steps."""
    optimizer: str = "adam"
    """Optimizer name (a legacy Keras optimizer, as tf.estimator needs)."""
    learning_rate: float = 1e-3
    """Optimizer learning rate."""
    early_stopping_steps: int = 0
    """Stop when the best metric has not improved for this many steps
    (0: off)."""
    keep_checkpoint_max: int = 5
    """Checkpoints kept in the model dir."""
    seed: int = 42
    """Graph-level random seed (initialization, dropout, shuffling)."""


@dataclasses.dataclass
class ExperimentConfig:
    """A named, reproducible training setup."""

    name: str
    """Registry key, e.g. "fashion_mnist_cnn"."""
    description: str
    """One line for `python -m experiments list`."""
    data: DataConfig
    """The dataset and input pipeline."""
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    """Training hyperparameters."""
    model: dict = dataclasses.field(default_factory=dict)
    """Model hyperparameters passed to the experiment's model builder."""
    loss: str = "sparse_categorical_crossentropy"
    """Keras loss name."""
    best_metric: str = "accuracy"
    """Eval metric that picks the best checkpoint and drives early stopping."""
    higher_is_better: bool = True
    """Direction of best_metric."""


@dataclasses.dataclass
class Experiment:
    """A config plus the code that builds its model.

    Attributes:
      config: the ExperimentConfig.
      build_model: callable(model hparams dict) -> uncompiled Keras model
        whose inputs take records' raw values (scaling inside the model).
      metrics: callable() -> list of Keras metrics for compile().
    """

    config: ExperimentConfig
    build_model: typing.Callable
    metrics: typing.Callable = lambda: ["accuracy"]

    @property
    def name(self):
        return self.config.name


_REGISTRY = {}


def register(experiment):
    if experiment.name in _REGISTRY:
        raise ValueError(f"experiment {experiment.name!r} is registered twice")
    _REGISTRY[experiment.name] = experiment
    return experiment


def _load_builtin():
    # Importing the modules registers their experiments.
    from experiments import fashion_mnist, mnist, shapes  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import


def names():
    _load_builtin()
    return sorted(_REGISTRY)


def get(name):
    """The registered Experiment; UsageError listing the names otherwise."""
    _load_builtin()
    if name not in _REGISTRY:
        raise UsageError(f"unknown experiment {name!r}; registered experiments: "
                         f"{', '.join(sorted(_REGISTRY))}. See `python -m experiments list`.")
    return _REGISTRY[name]


def _coerce(key, text, default):
    if isinstance(default, bool):
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"hparam {key}={text!r}: expected a boolean (true/false).")
    for kind in (int, float):
        if isinstance(default, kind):
            try:
                return kind(text)
            except ValueError:
                raise ConfigError(f"hparam {key}={text!r}: expected {kind.__name__} "
                                  f"(default {default!r}).") from None
    if default is None:
        for kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                pass
    if isinstance(default, (list, tuple)):
        return type(default)(_coerce(key, t, default[0] if default else "")
                             for t in text.split(":"))
    return text


def parse_hparams(text):
    """'a=1,b=x' -> {'a': '1', 'b': 'x'}; UsageError on malformed items."""
    result = {}
    for item in filter(None, (t.strip() for t in (text or "").split(","))):
        if "=" not in item:
            raise UsageError(f"--hparams item {item!r} is not key=value; expected "
                             f"e.g. --hparams learning_rate=0.01,dropout=0.3.")
        key, value = item.split("=", 1)
        result[key.strip()] = value.strip()
    return result


def with_overrides(config, hparams=None, **flags):
    """A copy of ``config`` with hparams (strings) and typed flags applied.

    Keys are looked up in TrainConfig, then DataConfig, then the model dict;
    an unknown key is a ConfigError listing every valid key.
    """
    train = dataclasses.replace(config.train)
    data = dataclasses.replace(config.data)
    model = dict(config.model)
    for key, value in flags.items():
        if value is not None:
            setattr(train, key, value)
    for key, text in (hparams or {}).items():
        for target in (train, data):
            if key in {f.name for f in dataclasses.fields(target)} and key not in (
                    "dataset", "features"):
                setattr(target, key, _coerce(key, text, getattr(target, key)))
                break
        else:
            if key in model:
                model[key] = _coerce(key, text, model[key])
            else:
                valid = sorted({f.name for f in dataclasses.fields(TrainConfig)}
                               | {f.name for f in dataclasses.fields(DataConfig)}
                               - {"dataset", "features"} | set(model))
                raise ConfigError(f"unknown hparam {key!r} for experiment "
                                  f"{config.name!r}; valid: {', '.join(valid)}.")
    _validate(config.name, train)
    return dataclasses.replace(config, train=train, data=data, model=model)


def _validate(name, train):
    for key in ("batch_size", "max_steps", "eval_every_steps", "log_every_steps"):
        if getattr(train, key) < 1:
            raise ConfigError(f"{name}: {key} must be a positive integer; given "
                              f"{getattr(train, key)!r}.")
    if not train.learning_rate > 0:
        raise ConfigError(f"{name}: learning_rate must be positive; given "
                          f"{train.learning_rate!r}.")
