"""What the estimator engine's tasks sum across workers under
multi_worker_mirrored, in the Estimator's graph: every gradient, made dense
first (:func:`sums_sparse_as_dense` says why), and one number more, each
task's "a signal came" flag, which :class:`PreemptionHook` feeds and reads
so that every task stops after the same step when one is preempted.

Example::

    optimizer = dense_sum_optimizer(tf.keras.optimizers.legacy.Adam())
    hooks = [PreemptionHook(watch)]   # in the TrainSpec's hooks
"""

import functools

import tensorflow as tf


def sums_sparse_as_dense(strategy):
    """Whether the replicas' sparse gradients must be summed as dense tensors.

    An Embedding's gradient is a ``tf.IndexedSlices`` with one row per lookup,
    so its length follows the batch (an epoch's last batch is smaller).
    MultiWorkerMirroredStrategy sums IndexedSlices with collective all-gathers
    padded to the longest worker's length, and in the Estimator's graph
    (TensorFlow 2.15) a collective keeps the shape of its first run: the first
    step at which every worker has a short batch fails with "Shape mismatch in
    the collective instance". Dense gradients have one shape at every step.
    The other strategies sum IndexedSlices without collectives (mirrored) or
    apply them, sparse, on the parameter servers.
    """
    return isinstance(strategy, (tf.distribute.MultiWorkerMirroredStrategy,
                                 tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy))


def dense_sum_note(model, strategy):
    """The sentence a run under ``strategy`` owes its user when it sums
    sparse gradients as dense ones (:func:`sums_sparse_as_dense`): each
    Embedding's whole table crosses the network every step, which for a
    large table costs more than the step. None otherwise."""
    if not sums_sparse_as_dense(strategy):
        return None
    tables = [(layer.name, weight) for layer in model.submodules
              if isinstance(layer, tf.keras.layers.Embedding) for weight in layer.trainable_weights]
    if not tables:
        return None
    sizes = [(name, weight.shape, weight.shape.num_elements() * weight.dtype.size)
             for name, weight in tables]
    total = sum(size for _, _, size in sizes)
    listed = ", ".join(f"{name!r} {' x '.join(f'{d:,}' for d in shape)} ({_in_bytes(size)})"
                       for name, shape, size in sizes)
    return (f"multi_worker_mirrored on the estimator engine sums Embedding gradients across "
            f"the workers as dense tensors (TensorFlow 2.15's collectives cannot sum their "
            f"sparse rows in the Estimator's graph): {_in_bytes(total)} per step for "
            f"{listed}. For a large table use --strategy parameter_server: the ps tasks "
            f"apply only the rows a step used (BENCHMARKS.md measures the cost).")


def _in_bytes(size):
    for unit, scale in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if size >= scale:
            return f"{size / scale:,.1f} {unit}"
    return f"{size} bytes"


# Graph collection of (flag, sum over the replicas) pairs: see sum_as_dense.
STOP_FLAGS = "estimator_keras_stop_flags"


def sum_as_dense(grads_and_vars):
    """A legacy Keras optimizer's ``gradient_aggregator``: the sum over the
    replicas, as Keras' default, of every gradient made dense first.

    The same all-reduce carries one more number: each task's "a signal came"
    flag (a placeholder that :class:`PreemptionHook` feeds), summed into
    :data:`STOP_FLAGS`, so that every task of the cluster learns at the same
    step that one of them is being preempted, and all stop after it."""
    grads_and_vars = list(grads_and_vars)
    grads = [tf.convert_to_tensor(g) for g, _ in grads_and_vars if g is not None]
    flag = tf.compat.v1.placeholder_with_default(tf.constant(0.0), [], name="stop_requested")
    summed = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM,
                                                            grads + [flag])
    tf.compat.v1.add_to_collection(STOP_FLAGS, (flag, summed[-1]))
    summed = iter(summed[:-1])
    return [(None if g is None else next(summed), v) for g, v in grads_and_vars]


class _DenseSum:
    """Makes a legacy Keras optimizer class sum gradients with
    :func:`sum_as_dense`. A subclass rather than the constructor argument
    alone: model_to_estimator rebuilds the optimizer from its class and
    config, which would drop the argument."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("gradient_aggregator", sum_as_dense)
        super().__init__(*args, **kwargs)


@functools.lru_cache(maxsize=None)
def _dense_sum_class(cls):
    # The same class name: saved optimizer configs stay loadable by plain Keras.
    return type(cls.__name__, (_DenseSum, cls), {"__module__": __name__})


def dense_sum_optimizer(optimizer):
    """The legacy Keras ``optimizer``, rebuilt from its config to sum
    sparse gradients as dense ones (see :func:`sums_sparse_as_dense`)."""
    if isinstance(optimizer, _DenseSum):
        return optimizer
    return _dense_sum_class(type(optimizer)).from_config(optimizer.get_config())


class PreemptionHook(tf.estimator.SessionRunHook):
    """Ends training after the step in progress once the watch has seen
    SIGTERM or SIGINT; the chief's checkpoint saver then saves that step.

    Under multi_worker_mirrored every step's gradient sum carries each
    task's flag (:func:`sum_as_dense`): this hook feeds its own and reads
    the sum, so every task stops after the same step, the first whose sum
    saw a signal, whichever task got it (the others' watches learn it from
    the sum). Elsewhere a task stops on its own signal, unless it is
    ``alone=False`` (a worker that steps on with its chief)."""

    def __init__(self, watch, alone=True):
        self._watch, self._alone = watch, alone
        self._flags, self._total, self._global_step = [], None, None
        self.stopped_at = None

    def begin(self):
        pairs = tf.compat.v1.get_collection(STOP_FLAGS)
        self._flags = [flag for flag, _ in pairs]
        self._total = pairs[0][1] if pairs else None
        self._global_step = tf.compat.v1.train.get_global_step()

    def before_run(self, run_context):
        if self._total is None:
            return None
        mine = 1.0 if self._watch.requested else 0.0
        return tf.compat.v1.train.SessionRunArgs(
            self._total, feed_dict={flag: mine for flag in self._flags})

    def after_run(self, run_context, run_values):
        if self._total is None:
            if self._alone and self._watch.requested:
                run_context.request_stop()
            return
        if run_values.results > 0:
            self._watch.stop_with_others()
            self.stopped_at = int(run_context.session.run(self._global_step))
            run_context.request_stop()
