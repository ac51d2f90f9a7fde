"""What the processes and devices that train together offer an engine: one
interface, :class:`TrainingGroup`, whichever runtime joins them.

- :class:`OneProcess`: this process alone, on its default device.
- :class:`StrategyGroup`: a ``tf.distribute`` strategy (mirrored over local
  devices, a TF_CONFIG cluster under MultiWorkerMirroredStrategy, parameter
  servers), for the engines built on ``tf.distribute``.
- :class:`~estimator_keras.distribute.jax_processes.DataParallelProcesses`:
  processes joined by JAX's distributed runtime.

An engine asks the group, never its type: where to build variables
(:meth:`~TrainingGroup.scope`) and train (:meth:`~TrainingGroup.fit_scope`),
which share of the input this process reads (:attr:`~TrainingGroup.input_shard`),
how to do work one process does alone (:meth:`~TrainingGroup.alone`), and
the collectives that keep processes in step (:meth:`~TrainingGroup.mean`,
:meth:`~TrainingGroup.sums`, :meth:`~TrainingGroup.from_process_0`). TensorFlow is imported only by the
methods of a strategy's group that compute.

Example::

    group = groups.of(strategy)            # None, a strategy, or a group
    with group.scope():
        model = build()
"""

import contextlib

from estimator_keras.errors import ConfigError


class TrainingGroup:
    """The interface: defaults are those of one process alone, and refuse
    (:meth:`refuse`) in a group of several processes that does not
    implement them: none hands back one process's values as if they were
    the group's."""

    description = None
    """What it runs, for the run's first line (None: the strategy's name says it)."""
    num_replicas_in_sync = 1
    """Replicas that each take a batch of a step."""
    input_shard = None
    """``(processes, rank)`` where each process reads its own share of the
    input (and evaluates its share of the eval split); None where the
    strategy distributes the input itself."""
    shared_seed = None
    """A random seed the same in every process, or None."""
    chief_work_stalls_others = False
    """True where work the chief does alone (a best-model export) holds the
    other processes in the next step's collective meanwhile."""
    process_0_decides = False
    """True where process 0 alone reads the model dir and tells the others
    where training starts (:meth:`from_process_0`)."""
    strategy = None
    """The ``tf.distribute`` strategy it runs, for engines built on
    ``tf.distribute`` (the Estimator's RunConfig, Keras 2's scope), or None."""

    @property
    def multi_process(self):
        """True where several processes train in step: stopping needs their
        agreement (:class:`~estimator_keras.distribute.preemption.StopAgreement`)."""
        return False

    def scope(self):
        """Where models and their variables are built."""
        return contextlib.nullcontext()

    def fit_scope(self):
        """Where training runs (a strategy's variables hold their strategy:
        no scope needed; a JAX distribution is read as it trains)."""
        return contextlib.nullcontext()

    def alone(self):
        """Inside :meth:`fit_scope`: computes in this process only."""
        self.refuse("alone")
        return contextlib.nullcontext()

    def distribute_dataset(self, dataset_fn):
        """The training dataset: ``dataset_fn(input_context)``, distributed
        over the replicas where the strategy does that."""
        return dataset_fn(None)

    def mean(self, values):
        """The mean of ``values`` (a list of floats) over the processes;
        every process must call it at the same point."""
        self.refuse("mean")
        return [float(v) for v in values]

    def sums(self, values):
        """The sums of ``values`` (a list of numpy arrays, the same shapes in
        every process) over the processes; every process must call it at the
        same point."""
        self.refuse("sums")
        return list(values)

    def from_process_0(self, values):
        """Process 0's ``values`` in every process (numbers or numpy arrays,
        nested); every process must call it at the same point."""
        self.refuse("from_process_0")
        return values

    def refuse(self, method, why=""):
        """Raises ConfigError where several processes train together and
        ``method`` has no implementation across them (``why``: the reason)."""
        if self.multi_process:
            raise ConfigError(
                f"{method}() is not implemented across the processes of "
                f"{self.description or type(self).__name__}"
                f"{': ' + why if why else ''}; one process's own answer would be wrong for "
                f"the group, so the engine cannot run this way here.")


class OneProcess(TrainingGroup):
    """This process alone, without a strategy."""


class StrategyGroup(TrainingGroup):
    """A ``tf.distribute`` strategy. Across the processes of a TF_CONFIG
    cluster, :meth:`mean`, :meth:`sums` and :meth:`from_process_0` are the
    strategy's own all-reduce (MultiWorkerMirroredStrategy); other
    multi-process strategies (parameter servers, whose workers run no
    Python of ours) and :meth:`alone` there are refused."""

    def __init__(self, strategy):
        self.strategy = strategy
        self.num_replicas_in_sync = int(strategy.num_replicas_in_sync)

    @property
    def multi_process(self):
        """True for a strategy of a TF_CONFIG cluster (its resolver names
        jobs), not of this process alone."""
        resolver = getattr(self.strategy, "cluster_resolver", None)
        return resolver is not None and bool(resolver.cluster_spec().jobs)

    def scope(self):
        return self.strategy.scope()

    def distribute_dataset(self, dataset_fn):
        return self.strategy.distribute_datasets_from_function(dataset_fn)

    def alone(self):
        self.refuse("alone", "under MultiWorkerMirroredStrategy a model's variables and steps "
                             "are collective, so no process computes with them by itself")
        return contextlib.nullcontext()

    def mean(self, values):
        if not self.multi_process:
            return [float(v) for v in values]
        # pylint: disable=import-outside-toplevel
        import numpy as np
        totals = self._sum_over_processes([np.asarray(values, np.float64)], "mean")[0]
        return [float(v) for v in totals / self._processes()]

    def sums(self, values):
        if not self.multi_process:
            return list(values)
        return self._sum_over_processes(list(values), "sums")

    def from_process_0(self, values):
        if not self.multi_process:
            return values
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        flat = tf.nest.flatten(values)
        # Process 0 (the chief, else worker 0) is the first of the cluster's
        # replicas; every other replica adds zeros.
        found = self._sum_over_processes(flat, "from_process_0", only_replica_0=True)
        return tf.nest.pack_sequence_as(values, found)

    def _processes(self):
        return self.num_replicas_in_sync // len(self.strategy.extended.worker_devices)

    def _sum_over_processes(self, values, method, only_replica_0=False):
        """The sums over the processes of ``values`` (numbers or numpy
        arrays): each process's first replica adds its values, its other
        replicas zeros (or only the cluster's replica 0 adds its own)."""
        # pylint: disable=import-outside-toplevel
        import numpy as np
        import tensorflow as tf
        if not isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy):
            self.refuse(method, f"{type(self.strategy).__name__} has no all-reduce between "
                                f"the processes' own values")
        local = len(self.strategy.extended.worker_devices)
        arrays = [np.asarray(v) for v in values]
        found = []
        for array in arrays:
            def value_fn(context, array=array):
                replica = context.replica_id_in_sync_group
                adds = replica == 0 if only_replica_0 else replica % local == 0
                return tf.constant(array if adds else np.zeros_like(array))
            per_replica = self.strategy.experimental_distribute_values_from_function(value_fn)
            total = self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
            found.append(np.asarray(total.numpy(), array.dtype))
        return found


def of(strategy):
    """The group of what a plan trains under: None (one process), a
    ``tf.distribute`` strategy, or a :class:`TrainingGroup` already."""
    if strategy is None:
        return OneProcess()
    if isinstance(strategy, TrainingGroup):
        return strategy
    return StrategyGroup(strategy)
