"""How the keras3 engine evaluates: one process over the eval split (cut to
``eval_steps`` batches), or the processes of a JAX group, each over its
share, their metrics' states summed (:class:`ShardedEvaluation`).

Example::

    metrics = evaluate(model, plan, step)      # {"accuracy": ..., "global_step": step}
"""

import contextlib
import warnings

import keras

from estimator_keras import input_order, model_inputs


def eval_data(plan, model):
    """The eval split, cut to ``eval_steps`` batches: an evaluation reads
    the same batches every time, and ends with its data rather than after
    Keras' whole calls of several steps."""
    data = as_built(model, plan.eval_data(input_context=None))
    return _first(data, plan.eval_steps) if plan.eval_steps else data


def eval_share(plan, model, group):
    """This process's share of the eval split: with ``eval_steps``, every
    N-th of the batches one process would read; else the records its
    ``tf.distribute.InputContext`` gives it (the plan's ``eval_data`` takes
    one, as :func:`estimator_keras.make_input_fn`'s does)."""
    processes, rank = group.input_shard
    if plan.eval_steps:
        return _every(eval_data(plan, model), processes, rank)
    share = input_order.PipelineShare(num_input_pipelines=processes, input_pipeline_id=rank,
                                      num_replicas_in_sync=processes)
    return as_built(model, plan.eval_data(input_context=share))


def _first(data, count):
    """The first ``count`` batches of a tf.data or Grain dataset."""
    return data.take(count) if hasattr(data, "take") else data[:count]


def _every(data, processes, rank):
    """Every ``processes``-th batch from ``rank`` on, of a tf.data or Grain dataset."""
    return data.shard(processes, rank) if hasattr(data, "shard") else data[rank::processes]


def as_built(model, data):
    """``data`` with its features as ``model`` takes them: a model of one
    input, functional or Sequential, gets the one feature's tensor whatever
    its input is named; a model of several inputs gets the dict (see
    :func:`estimator_keras.model_inputs.as_model_inputs`)."""
    return model_inputs.as_model_inputs(model, data)


@contextlib.contextmanager
def quiet_end_of_data():
    """Keras 3 warns "Your input ran out of data" at the end of every pass
    over an eval split whose length tf.data cannot tell (any filtered
    pipeline): the expected end of an evaluation. Training data that runs out is
    caught after fit instead (a DataError)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Your input ran out of data",
                                category=UserWarning)
        yield


def evaluate(model, plan, step):
    """The metrics of ``model`` over the eval split, with ``global_step``."""
    with quiet_end_of_data():
        values = model.evaluate(eval_data(plan, model), verbose=0, return_dict=True)
    metrics = {k: float(v) for k, v in values.items()}
    metrics["global_step"] = step
    return metrics


class ShardedEvaluation:
    """A JAX process group's evaluation: each process evaluates its share of
    the eval split (:func:`eval_share`) alone, on a copy of the trained
    weights, and the metrics' states (Keras' totals, counts and confusion
    matrices, which add up) are summed over the processes. The numbers are
    those of one process evaluating the whole split, for 1/N of the work
    in each.

    Args:
      plan: the TrainingPlan (its eval data, and its hooks' log).
      group: a :class:`~estimator_keras.distribute.groups.TrainingGroup` whose
        processes each read their share (``input_shard``).
      model: a compiled model of the plan's, built outside the group's
        distribution (``group.alone()``): the one that evaluates here.
    """

    def __init__(self, plan, group, model):
        self.plan, self.group, self.model = plan, group, model
        self.data = eval_share(plan, model, group)
        self.told = False

    def __call__(self, trained):
        weights = [keras.ops.convert_to_numpy(v) for v in trained.weights]
        model = self.model
        with self.group.alone(), quiet_end_of_data():
            model.set_weights(weights)
            model.reset_metrics()
            model.evaluate(self.data, verbose=0)
            states = [v for metric in model.metrics for v in metric.variables]
            local = [keras.ops.convert_to_numpy(v) for v in states]
            totals = self.group.sums(local)
            for variable, total in zip(states, totals):
                variable.assign(total)
            metrics = {k: float(v) for k, v in model.get_metrics_result().items()}
        if not self.told:
            self.told = True
            self._tell(local, totals, states)
        return metrics

    def _tell(self, local, totals, states):
        """Logs once what share of the examples this process evaluated (the
        loss's count of examples)."""
        loss = next((m for m in self.model.metrics if m.name == "loss"), None)
        count = getattr(loss, "count", None)
        if count is None:
            return
        index = next(i for i, v in enumerate(states) if v is count)
        self.plan.hooks.log(
            f"evaluation shared by {self.group.group.num_processes} processes: this one "
            f"evaluates {int(local[index])} of the {int(totals[index])} examples")
