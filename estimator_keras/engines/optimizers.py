"""Optimizers by name for both engines.

``tf.estimator`` needs the legacy Keras optimizers (``model_to_estimator``
otherwise swaps them silently); the keras engine asks Keras 2 for one by
name and learning rate, which gives the legacy class too
(:func:`keras_optimizer`); the keras3 engine takes Keras 3's. Weights and
exports are the same either way. TensorFlow is imported by the Keras 2
optimizers alone: the keras3 engine trains without it.
"""

import dataclasses
import inspect

from estimator_keras.engines import keras_setup
from estimator_keras.errors import ConfigError

OPTIMIZERS = ("adam", "sgd", "rmsprop", "adagrad", "adamax", "nadam", "adadelta", "ftrl")
_CLASS_NAMES = {"adam": "Adam", "sgd": "SGD", "rmsprop": "RMSprop", "adagrad": "Adagrad",
                "adamax": "Adamax", "nadam": "Nadam", "adadelta": "Adadelta", "ftrl": "Ftrl"}


LEARNING_RATE_DECAYS = ("constant", "cosine")


def learning_rate(peak, decay="constant", total_steps=None):
    """The optimizer's learning rate: ``peak`` itself ("constant"), or a
    Keras schedule of the optimizer's step ("cosine": from ``peak`` down to
    a tenth of it at ``total_steps``). Both engines' optimizers take either;
    the Estimator's step is the global step."""
    if decay == "constant":
        return peak
    if decay == "cosine":
        return keras_setup.keras_api().optimizers.schedules.CosineDecay(
            initial_learning_rate=peak, decay_steps=max(1, int(total_steps)), alpha=0.1)
    raise ConfigError(f"unknown learning_rate_decay {decay!r}; expected one of "
                      f"{', '.join(LEARNING_RATE_DECAYS)}.")


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The learning rate steps train under, as a resumed run compares it with
    its checkpoint's: the decay, its peak and its horizon (``max_steps``,
    None for a constant rate, which has none)."""

    decay: str
    learning_rate: float
    max_steps: int = None

    @classmethod
    def of(cls, peak, decay="constant", total_steps=None):
        """The schedule :func:`learning_rate` makes of the same arguments."""
        return cls(decay, None if peak is None else float(peak),
                   int(total_steps) if decay == "cosine" and total_steps is not None else None)

    def rate(self, step):
        """The learning rate at ``step``."""
        value = learning_rate(self.learning_rate, self.decay, self.max_steps)
        return float(value(step)) if callable(value) else float(value)


def describe(schedule):
    """``schedule`` in words: "constant 0.001", "cosine from 0.002 to step 400"."""
    if schedule.decay == "cosine":
        return f"cosine from {schedule.learning_rate:.4g} to step {schedule.max_steps}"
    return f"{schedule.decay} {schedule.learning_rate:.4g}"


def schedule_changed(trained, now, step):
    """The line a run resumed at ``step`` logs where its learning rate
    schedule (:class:`Schedule`) is not the one its checkpoint was trained
    under (``trained``); None otherwise. Where the cosine decay ends follows
    --max-steps: raising it stretches the cosine, so the rate jumps at the
    resume; a deliberate choice, said rather than refused."""
    if trained is None or now is None or trained == now:
        return None
    if trained.decay == now.decay == "cosine" and trained.learning_rate == now.learning_rate:
        what = (f"cosine decay now ends at step {now.max_steps} (was {trained.max_steps})")
        why = " (the decay follows --max-steps)"
    else:
        what, why = f"{describe(now)} (was {describe(trained)})", ""
    return (f"learning rate: {what}: the rate at step {step} goes from {trained.rate(step):.4g} "
            f"to {now.rate(step):.4g}{why}")


def _check_name(name):
    if name.lower() not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {name!r}; expected one of {', '.join(OPTIMIZERS)}.")
    return name.lower()


def legacy_optimizer(name_or_optimizer, learning_rate=None, **kwargs):
    """A ``tf.keras.optimizers.legacy`` optimizer, which the Estimator needs.

    Accepts a name ("adam", "sgd", ...) or a Keras optimizer object; a
    v2.11+ optimizer object is rebuilt as its legacy twin with the same
    learning rate and the hyperparameters both versions share.

    Example::

        model.compile(optimizer=legacy_optimizer("adam", 1e-3), loss=...)
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel  (Keras 2 only)

    legacy = tf.keras.optimizers.legacy
    if isinstance(name_or_optimizer, legacy.Optimizer):
        return name_or_optimizer
    if isinstance(name_or_optimizer, str):
        cls = getattr(legacy, _CLASS_NAMES[_check_name(name_or_optimizer)])
        if learning_rate is not None:
            kwargs["learning_rate"] = learning_rate
        return cls(**kwargs)
    cls = getattr(legacy, type(name_or_optimizer).__name__, None)
    if cls is None:
        raise ConfigError(
            f"optimizer {type(name_or_optimizer).__name__} has no legacy Keras "
            f"version, which tf.estimator requires; use one of "
            f"{', '.join(OPTIMIZERS)}.")
    config = name_or_optimizer.get_config()
    accepted = set(inspect.signature(cls.__init__).parameters)
    shared = {k: v for k, v in config.items() if k in accepted and k != "name"}
    if learning_rate is not None:
        shared["learning_rate"] = learning_rate
    return cls(**shared)


def keras_optimizer(name, learning_rate=None):
    """A Keras 2 optimizer by name ("adam", "sgd", ...), with
    ``learning_rate``; the keras engine's choice. Keras 2 builds the legacy
    class from a config that sets a learning rate (and the v2.11+ one from
    an empty config), so the keras engine's checkpoints hold the same
    optimizer slots as the Estimator's, which is what lets an optimizer's
    state move between the engines (see
    :mod:`estimator_keras.engines.keras3.migration`)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel  (Keras 2 only)

    config = {} if learning_rate is None else {"learning_rate": learning_rate}
    return tf.keras.optimizers.get({"class_name": _check_name(name), "config": config})


def keras3_optimizer(name, learning_rate=None):
    """A Keras 3 optimizer (``import keras``, any backend) by name, with
    ``learning_rate``: a number or a schedule; the keras3 engine's choice.
    A schedule from another Keras (tf.keras as Keras 2) is rebuilt as Keras
    3's own from its config, so that it runs on every backend."""
    import keras  # pylint: disable=import-outside-toplevel

    learning_rate = keras3_learning_rate(learning_rate)
    config = {} if learning_rate is None else {"learning_rate": learning_rate}
    return keras.optimizers.get({"class_name": _check_name(name), "config": config})


def keras3_learning_rate(learning_rate):
    """``learning_rate`` as a Keras 3 optimizer takes it: a number or None
    as it is, a Keras 3 schedule as it is, another Keras' schedule rebuilt
    from its config."""
    import keras  # pylint: disable=import-outside-toplevel

    schedules = keras.optimizers.schedules
    if (learning_rate is not None and not isinstance(learning_rate, (int, float))
            and not isinstance(learning_rate, schedules.LearningRateSchedule)
            and hasattr(learning_rate, "get_config")):
        # Keras 2 writes name=None, which Keras 3 refuses.
        config = {k: v for k, v in learning_rate.get_config().items() if v is not None}
        learning_rate = schedules.deserialize(
            {"class_name": type(learning_rate).__name__, "config": config})
    return learning_rate
