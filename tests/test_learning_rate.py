"""Learning-rate decay: the schedule both engines get, and its config field."""

import pytest

from estimator_keras.engines import optimizers
from estimator_keras.errors import ConfigError
from experiments.catalog import loading as catalog
from experiments.catalog import registry
from experiments.config import types as config
from experiments.config import hparams


def test_constant_is_the_number_and_cosine_falls_to_a_tenth_at_max_steps():
    assert optimizers.learning_rate(0.002) == 0.002
    schedule = optimizers.learning_rate(0.002, "cosine", 1000)
    assert float(schedule(0)) == pytest.approx(0.002)
    assert float(schedule(500)) == pytest.approx(0.002 * (0.1 + 0.9 * 0.5))
    assert float(schedule(1000)) == pytest.approx(0.0002)
    assert float(schedule(5000)) == pytest.approx(0.0002)  # beyond max_steps: the floor
    values = [float(schedule(step)) for step in range(0, 1001, 100)]
    assert values == sorted(values, reverse=True)


def test_an_unknown_decay_is_refused_with_the_choices():
    assert optimizers.LEARNING_RATE_DECAYS == config.LEARNING_RATE_DECAYS
    with pytest.raises(ConfigError, match="expected one of constant, cosine"):
        optimizers.learning_rate(0.001, "linear", 100)
    catalog.load()
    exp = registry.get("fashion_mnist_mlp")
    with pytest.raises(ConfigError, match="learning_rate_decay must be one of constant, "
                                          "cosine; given 'linear'"):
        hparams.with_overrides(exp.config, {"learning_rate_decay": "linear"})
    changed = hparams.with_overrides(exp.config, {"learning_rate_decay": "cosine"})
    assert changed.train.learning_rate_decay == "cosine"


def test_the_experiment_plan_carries_the_decay_over_max_steps():
    from experiments.training import context  # pylint: disable=import-outside-toplevel

    catalog.load()
    exp = registry.get("fashion_mnist_mlp")
    cosine = hparams.with_overrides(exp.config, {"learning_rate_decay": "cosine",
                                                 "learning_rate": "0.004", "max_steps": "300"})
    plan = context.experiment_plan(exp, cosine, policy="float32")
    assert float(plan.learning_rate(0)) == pytest.approx(0.004)
    assert float(plan.learning_rate(300)) == pytest.approx(0.0004)
    constant = context.experiment_plan(exp, exp.config, policy="float32")
    assert constant.learning_rate == exp.config.train.learning_rate


def test_both_engines_optimizers_follow_the_schedule():
    from estimator_keras import engines  # pylint: disable=import-outside-toplevel

    engines.prefer_legacy_keras()
    schedule = optimizers.learning_rate(0.004, "cosine", 300)
    current = optimizers.keras_optimizer("adam", schedule)
    current.iterations.assign(300)
    assert float(current.learning_rate(current.iterations)) == pytest.approx(0.0004)
    if engines.estimator_available():
        legacy = optimizers.legacy_optimizer("adam", schedule)
        assert legacy.get_config()["learning_rate"]["config"]["decay_steps"] == 300


def test_a_changed_schedule_is_said_with_the_rate_under_each():
    """A cosine decay whose end moved, or another decay or peak: the rate
    at the resume step under each; the same schedule says nothing (a
    constant rate has no horizon, so its max_steps is not part of it)."""
    trained = optimizers.Schedule.of(0.002, "cosine", 200)
    assert trained == optimizers.Schedule("cosine", 0.002, 200)
    assert optimizers.Schedule.of(0.002, "constant", 200).max_steps is None
    assert trained.rate(200) == pytest.approx(0.0002)
    line = optimizers.schedule_changed(trained, optimizers.Schedule.of(0.002, "cosine", 400),
                                       200)
    assert line.startswith("learning rate: cosine decay now ends at step 400 (was 200): the "
                           "rate at step 200 goes from 0.0002 to 0.0011"), line
    assert optimizers.schedule_changed(trained, trained, 200) is None
    line = optimizers.schedule_changed(trained, optimizers.Schedule.of(0.002, "constant", 400),
                                       100)
    assert line == ("learning rate: constant 0.002 (was cosine from 0.002 to step 200): the "
                    "rate at step 100 goes from 0.0011 to 0.002"), line
    constant = optimizers.Schedule.of(0.002, "constant", 200)
    assert optimizers.schedule_changed(constant, optimizers.Schedule.of(0.002, "constant", 400),
                                       200) is None
    line = optimizers.schedule_changed(constant, optimizers.Schedule.of(0.001, "constant"), 50)
    assert line == ("learning rate: constant 0.001 (was constant 0.002): the rate at step 50 "
                    "goes from 0.002 to 0.001"), line
    assert optimizers.schedule_changed(None, trained, 100) is None  # not stored: nothing said
