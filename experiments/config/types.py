"""The typed configuration of an experiment.

An experiment is an :class:`ExperimentConfig` (what data, which model
hyperparameters, how to train) plus a function that builds the Keras model
from the model hyperparameters: an :class:`Experiment`. Every field has a
docstring; ``--hparams`` and config files set fields by these names (see
:mod:`experiments.config.hparams`).
"""

import dataclasses
import typing

from experiments.config.data_info import call_with_data


@dataclasses.dataclass
class DataConfig:
    """Which dataset an experiment reads, and how."""

    dataset: typing.Optional[str]
    """A registered dataset name (prepared under the data dir when missing), or
    the path of a prepared dataset directory, local or gs://; None: the
    experiment trains on whatever --dataset names."""
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
    cache: typing.Union[bool, str] = "auto"
    """Keep one epoch of parsed batches in memory and serve later epochs from
    it: true, false, or "auto" (when the split's size in memory, computed
    from its manifest, fits cache_budget_mb; the decision is logged)."""
    cache_budget_mb: typing.Optional[float] = None
    """Budget of cache="auto" in MB per input pipeline (None: a quarter of the
    memory available when training starts)."""
    cache_shuffle: str = "auto"
    """What a cached pipeline shuffles every epoch: "batches" (the first
    epoch's batches in a new order: cheapest), "records" (new batches every
    epoch, records permuted within runs of shuffle_buffer), or "auto"
    ("records" with shuffle="record", else "batches")."""
    pipeline: str = "auto"
    """Which input pipeline reads the records: "tfdata" (TensorFlow's tf.data),
    "grain" (Grain, no TensorFlow: records read by index, one global shuffle
    per epoch; the keras3 engine on JAX only), or "auto" (grain where the
    keras3 engine runs on JAX without TensorFlow installed, else tfdata). The
    choice is logged; the shuffle's buffer, cycle and block lengths and the
    cache are tf.data's."""


# TrainConfig.learning_rate_decay's values (estimator_keras.engines.optimizers
# builds them; kept here so that parsing a config imports no TensorFlow).
LEARNING_RATE_DECAYS = ("constant", "cosine")
# DataConfig.pipeline's values (estimator_keras.pipeline_choice chooses among them).
PIPELINES = ("tfdata", "grain", "auto")


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
    """Log loss, steps/s and examples/s every this many steps (on the keras3
    engine, at the end of the call of up to 8 steps that passes each
    multiple: evaluations keep their exact steps, progress lines may not)."""
    optimizer: str = "adam"
    """Optimizer name (a legacy Keras optimizer, as tf.estimator needs)."""
    learning_rate: float = 1e-3
    """Optimizer learning rate (the peak of a decaying one)."""
    learning_rate_decay: str = "constant"
    """"constant", or "cosine": from learning_rate down to a tenth of it at
    max_steps along a cosine of the global step (a resumed run continues
    the curve; a larger max_steps stretches it, which the resumed run logs
    with the rate at its step before and after)."""
    early_stopping_steps: int = 0
    """Stop when the best metric has not improved for this many steps
    (0: off)."""
    keep_checkpoint_max: int = 5
    """Checkpoints kept in the model dir."""
    seed: int = 42
    """Graph-level random seed (initialization, dropout, shuffling). Every
    epoch's input order is a function of it and the epoch, so a resumed run
    continues the stopped epoch instead of starting a new order (None: a
    new seed every run, and a resumed run starts a new order)."""
    deterministic: bool = False
    """Run TensorFlow's ops deterministically
    (``tf.config.experimental.enable_op_determinism``; JAX on CPU always is):
    with a seed, two runs of one config, stopped or not, end with the same
    weights bit for bit on one machine (see "What survives what"); for a
    model with random layers (Dropout) on the keras3 engine only, whose
    checkpoints keep their seed states: the other engines warn at the start."""
    precision: str = "float32"
    """Compute dtype of training: "float32", "mixed_bfloat16" (bfloat16
    compute, float32 variables and outputs), or "auto" (mixed_bfloat16 on a
    CPU with native bfloat16 and no GPU, else float32; the choice is logged).
    Variables stay float32 either way, and exports are float32 models."""


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
    loss: typing.Union[str, dict] = "sparse_categorical_crossentropy"
    """Keras loss name, or a mapping of the name and the settings of Keras'
    loss class: ``{"name": "sparse_categorical_crossentropy", "from_logits":
    True}`` for a model whose last layer outputs logits (see
    :mod:`estimator_keras.losses`)."""
    best_metric: str = "accuracy"
    """Eval metric that picks the best checkpoint and drives early stopping."""
    higher_is_better: bool = True
    """Direction of best_metric."""


@dataclasses.dataclass
class Experiment:
    """A config plus the code that builds its model.

    Attributes:
      config: the ExperimentConfig.
      build_model: ``fn(hparams)`` or ``fn(hparams, data)`` -> an uncompiled
        functional Keras model whose inputs take the records' raw values
        (scaling inside the model); ``data`` is the dataset's
        :class:`~experiments.config.data_info.DataInfo` (input shapes, classes).
      metrics: ``fn()`` or ``fn(data)`` -> the Keras metrics for compile().
    """

    config: ExperimentConfig
    build_model: typing.Callable
    metrics: typing.Callable = lambda: ["accuracy"]

    @property
    def name(self):
        return self.config.name

    def make_model(self, hparams, data=None):
        """The uncompiled model (the builder gets the data when it takes it)."""
        return call_with_data(self.build_model, (hparams,), data)

    def make_metrics(self, data=None):
        return call_with_data(self.metrics, (), data)
