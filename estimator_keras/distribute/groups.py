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


class TrainingGroup:
    """The interface: defaults are those of one process alone."""

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
        return contextlib.nullcontext()

    def distribute_dataset(self, dataset_fn):
        """The training dataset: ``dataset_fn(input_context)``, distributed
        over the replicas where the strategy does that."""
        return dataset_fn(None)

    def mean(self, values):
        """The mean of ``values`` (a list of floats) over the processes;
        every process must call it at the same point."""
        return [float(v) for v in values]

    def sums(self, values):
        """The sums of ``values`` (a list of numpy arrays, the same shapes in
        every process) over the processes; every process must call it at the
        same point."""
        return list(values)

    def from_process_0(self, values):
        """Process 0's ``values`` in every process (numbers or numpy arrays,
        nested); every process must call it at the same point."""
        return values


class OneProcess(TrainingGroup):
    """This process alone, without a strategy."""


class StrategyGroup(TrainingGroup):
    """A ``tf.distribute`` strategy."""

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

    def mean(self, values):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        mine = tf.constant(values, tf.float32)
        reduced = self.strategy.reduce(tf.distribute.ReduceOp.MEAN,
                                       self.strategy.run(lambda: mine), axis=None)
        return [float(v) for v in reduced.numpy()]


def of(strategy):
    """The group of what a plan trains under: None (one process), a
    ``tf.distribute`` strategy, or a :class:`TrainingGroup` already."""
    if strategy is None:
        return OneProcess()
    if isinstance(strategy, TrainingGroup):
        return strategy
    return StrategyGroup(strategy)
