"""Distribution strategies: which one a task runs, and the object that runs it.

:func:`choose_strategy` (pure) picks a strategy name for a task from its
:class:`~estimator_keras.distribute.tf_config.ClusterInfo`, and
:func:`make_train_distribute` turns the name into the object that goes into
``tf.estimator.RunConfig(train_distribute=...)`` or wraps ``Model.fit``.
:func:`num_replicas` and :func:`global_batch_size` size the input pipeline for
a strategy.

TensorFlow is imported only by the functions that build strategies or count
GPUs: parsing ``TF_CONFIG``, choosing a strategy and the strategies that need
no object ("none", "parameter_server") leave it unloaded, so ps tasks and
tools that only plan a run stay cheap. Without TensorFlow installed there
are no GPUs of its to count, and a strategy that needs an object is refused.

Example::

    info = parse_tf_config()
    name = choose_strategy("auto", info, num_gpus=local_gpu_count())
    config = tf.estimator.RunConfig(train_distribute=make_train_distribute(name))
"""

import importlib.util
import logging

from estimator_keras.distribute.tf_config import describe_cluster, parse_tf_config, short_json
from estimator_keras.errors import ConfigError

logger = logging.getLogger(__name__)

STRATEGIES = ("auto", "none", "mirrored", "multi_worker_mirrored", "parameter_server")
CONCRETE_STRATEGIES = STRATEGIES[1:]


def _tensorflow(strategy=None):
    # Imported here, not at the top: see the module docstring. Importing it is
    # not an eager op, so a MultiWorkerMirroredStrategy built right after is fine.
    if strategy and importlib.util.find_spec("tensorflow") is None:
        raise ConfigError(
            f"strategy {strategy!r} is TensorFlow's tf.distribute, and TensorFlow is not "
            f"installed here. Use --strategy none (or auto) in one process, several JAX "
            f"processes with the keras3 engine (KERAS_BACKEND=jax, `cluster --workers N`), or "
            f"install TensorFlow (pip install -e '.[cpu]').")
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return tf


def choose_strategy(requested, cluster_info, num_gpus):
    """Pick the distribution strategy name for this task (pure, no TensorFlow).

    Args:
      requested: one of :data:`STRATEGIES`.
      cluster_info: the :class:`ClusterInfo` of this process.
      num_gpus: GPUs visible to this process (see :func:`local_gpu_count`).

    Returns:
      One of "none", "mirrored", "multi_worker_mirrored", "parameter_server".
      "auto" resolves to: "none" on the evaluator; "parameter_server" when the
      cluster has ps; "multi_worker_mirrored" for several training tasks without
      ps; "mirrored" on one machine with more than one GPU; otherwise "none".
      An explicit choice is checked against the cluster; the evaluator always
      gets "none" (it only evaluates, and must not build a multi-worker strategy).

    Raises:
      ConfigError: unknown name, or a choice the cluster cannot run.
    """
    if requested not in STRATEGIES:
        raise ConfigError(
            f"unknown distribution strategy {requested!r}; choose one of "
            f"{', '.join(STRATEGIES)}.")
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 0:
        raise ConfigError(f"num_gpus must be a non-negative integer; got {num_gpus!r}.")
    info = cluster_info
    training = info.num_workers
    if requested == "parameter_server" and not info.has_ps:
        raise ConfigError(
            "strategy 'parameter_server' needs parameter servers, but TF_CONFIG has no 'ps' "
            f"tasks (cluster: {describe_cluster(info.cluster)}); add \"ps\" addresses to "
            "TF_CONFIG or choose another strategy.")
    if requested == "multi_worker_mirrored" and info.has_ps:
        raise ConfigError(
            "strategy 'multi_worker_mirrored' cannot run in a cluster with parameter servers "
            f"(TF_CONFIG has ps: {short_json(info.cluster['ps'])}); use 'parameter_server' (or "
            "'auto'), or remove the ps tasks.")
    if requested == "mirrored" and (info.has_ps or training > 1):
        raise ConfigError(
            "strategy 'mirrored' replicates over the GPUs of one machine, but TF_CONFIG "
            f"describes a cluster with {training} training tasks"
            f"{' and parameter servers' if info.has_ps else ''}; use "
            f"'{'parameter_server' if info.has_ps else 'multi_worker_mirrored'}' (or 'auto').")
    if requested == "none" and training > 1 and not info.has_ps and not info.is_evaluator:
        raise ConfigError(
            f"strategy 'none' in a cluster of {training} training tasks without parameter "
            "servers would train independent copies of the model and keep only the chief's; "
            "use 'multi_worker_mirrored' (or 'auto'), or add 'ps' tasks.")

    if info.is_evaluator:
        if requested not in ("auto", "none"):
            logger.info("Evaluator task: using no distribution strategy instead of %r; the "
                        "evaluator only evaluates checkpoints and must not join the training "
                        "strategy.", requested)
        return "none"
    if requested != "auto":
        return requested
    if info.has_ps:
        chosen = "parameter_server"
    elif training > 1:
        chosen = "multi_worker_mirrored"
    elif num_gpus > 1:
        chosen = "mirrored"
    else:
        chosen = "none"
    if info.is_distributed or num_gpus > 1:
        # A lone process on one device has nothing to choose between.
        logger.info("Strategy 'auto' -> %r (task %s, %d training task(s), ps: %s, %d GPU(s)).",
                    chosen, info.task_name, training, info.has_ps, num_gpus)
    return chosen


def local_gpu_count():
    """Number of GPUs TensorFlow sees in this process (imports TensorFlow);
    0 where it is not installed."""
    if importlib.util.find_spec("tensorflow") is None:
        return 0
    return len(_tensorflow().config.list_physical_devices("GPU"))


def make_train_distribute(strategy_name, num_gpus=None, cluster_info=None):
    """Build the ``train_distribute`` value of ``tf.estimator.RunConfig``.

    Args:
      strategy_name: a resolved name (see :func:`choose_strategy`), not "auto".
      num_gpus: GPUs to mirror over for "mirrored"; None counts the visible ones.
      cluster_info: for "multi_worker_mirrored", the task's :class:`ClusterInfo`
        (None parses ``TF_CONFIG``), checked so that the evaluator or a ps
        cluster never builds the strategy.

    Returns:
      - "none": None.
      - "parameter_server": None; the Estimator itself replicates between graphs
        from ``TF_CONFIG`` and places variables on the ps tasks.
      - "mirrored": ``tf.distribute.MirroredStrategy`` with NCCL all-reduce over
        GPUs 0..num_gpus-1, or, without GPUs, over this process's logical CPU
        devices with ``ReductionToOneDevice`` (the default all-reduce hangs on
        CPU devices).
      - "multi_worker_mirrored": ``tf.distribute.MultiWorkerMirroredStrategy()``,
        which reads ``TF_CONFIG``. It MUST be created at program start, before
        any eager TensorFlow op (creating a tensor, listing devices, building a
        Keras model): collective ops can only be configured then, otherwise
        TensorFlow fails with "Collective ops must be configured at program
        startup". The evaluator must not create it (TensorFlow raises
        ``KeyError: 'evaluator'``).

    Example::

        name = choose_strategy(flags.strategy, parse_tf_config(), local_gpu_count())
        config = tf.estimator.RunConfig(model_dir, train_distribute=make_train_distribute(name))
    """
    if strategy_name not in CONCRETE_STRATEGIES:
        hint = " (resolve 'auto' with choose_strategy first)" if strategy_name == "auto" else ""
        raise ConfigError(
            f"cannot build strategy {strategy_name!r}{hint}; expected one of "
            f"{', '.join(CONCRETE_STRATEGIES)}.")
    if strategy_name in ("none", "parameter_server"):
        return None
    if strategy_name == "multi_worker_mirrored":
        info = cluster_info if cluster_info is not None else parse_tf_config()
        if info.is_evaluator:
            raise ConfigError(
                "the evaluator task must not create a MultiWorkerMirroredStrategy "
                "(TensorFlow fails with KeyError: 'evaluator'); give it strategy 'none'.")
        if info.has_ps:
            raise ConfigError(
                "MultiWorkerMirroredStrategy cannot run in a cluster with 'ps' tasks; use "
                "strategy 'parameter_server'.")
        return _tensorflow(strategy_name).distribute.MultiWorkerMirroredStrategy()

    tf = _tensorflow(strategy_name)
    if num_gpus is None:
        num_gpus = len(tf.config.list_physical_devices("GPU"))
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 0:
        raise ConfigError(f"num_gpus must be a non-negative integer; got {num_gpus!r}.")
    if num_gpus > 0:
        devices = [f"/gpu:{i}" for i in range(num_gpus)]
        return tf.distribute.MirroredStrategy(
            devices=devices, cross_device_ops=tf.distribute.NcclAllReduce())
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    return tf.distribute.MirroredStrategy(
        devices=devices, cross_device_ops=tf.distribute.ReductionToOneDevice())


def num_replicas(strategy):
    """Replicas that train in sync under ``strategy`` (1 for None)."""
    return 1 if strategy is None else int(strategy.num_replicas_in_sync)


def global_batch_size(per_replica, strategy):
    """Batch size the input pipeline must produce so each replica gets ``per_replica``.

    A strategy splits each global batch across its in-sync replicas; with no
    strategy (local or parameter-server training) the two are equal.
    """
    if isinstance(per_replica, bool) or not isinstance(per_replica, int) or per_replica < 1:
        raise ConfigError(f"per-replica batch size must be a positive integer; got "
                          f"{per_replica!r}.")
    return per_replica * num_replicas(strategy)

