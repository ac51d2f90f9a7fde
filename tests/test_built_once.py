"""A run's decisions are made once: the RunContext and the TrainingPlan get
every field when they are built, and nothing sets one afterwards."""

import dataclasses

import pytest

from estimator_keras.distribute import tf_config
from estimator_keras.engines import base
from experiments.catalog import loading as catalog
from experiments.catalog import registry
from experiments.training.context import RunContext


def _context(task_type):
    """A RunContext of this task, with the fields ``plan`` reads real and the
    rest empty (no data, no model)."""
    catalog.load()
    experiment = registry.get("fashion_mnist_mlp")
    cluster = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]}
    info = tf_config.parse_tf_config(tf_config.build_tf_config(cluster, task_type, 0))
    return RunContext(
        experiment=experiment, config=experiment.config, info=info, engine=None,
        strategy_name="multi_worker_mirrored", distribute=None, replicas=2,
        model_dir="/tmp/unused", export_dir=None, tensorboard_dir=None, dataset_path=None,
        train_fn=None, eval_fn=None, probe=None, skip_corrupt=False, seed=3,
        policy="float32", policy_reason="as configured")


@pytest.mark.parametrize("task_type, chief", [("chief", True), ("worker", False)])
def test_the_plan_knows_the_task_role_when_built(task_type, chief):
    plan = _context(task_type).plan(base.TrainingHooks())
    assert plan.chief is chief
    assert plan.seed == 3 and plan.replicas == 2


def test_context_and_plan_take_no_attribute_after_construction():
    ctx = _context("chief")
    plan = ctx.plan(base.TrainingHooks())
    for obj, field in ((ctx, "seed"), (ctx, "policy"), (plan, "chief"), (plan, "max_steps")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, field, getattr(obj, field))
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.not_a_field = 1
    # A changed plan is a new one; the normalization still runs.
    other = dataclasses.replace(plan, chief=False, max_steps="7")
    assert (other.chief, other.max_steps, plan.chief) == (False, 7, True)
