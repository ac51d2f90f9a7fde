"""Distributed training: TF_CONFIG, strategies and a local cluster launcher.

Modules (import the one you need; this package imports none of them):

- ``tf_config``: TF-free. :class:`ClusterInfo`, :func:`parse_tf_config`,
  :func:`build_tf_config`, ``TASK_TYPES`` and ``TRAINING_TYPES``.
- ``strategy``: :func:`choose_strategy` (pure), :func:`make_train_distribute`,
  :func:`local_gpu_count`, :func:`num_replicas`, :func:`global_batch_size`,
  ``STRATEGIES`` and ``CONCRETE_STRATEGIES``; TensorFlow is loaded only when a
  strategy object is built or GPUs are counted.
- ``launcher``: TF-free. :func:`launch_local_cluster`, :func:`free_ports`.
- ``outcomes``: TF-free. :class:`ClusterResult`, :class:`ClusterError` and its
  subclasses, :func:`describe_returncode` (the launcher re-exports them).
- ``netns``: standard library only. :func:`create` makes the private network
  namespace (loopback only) that the launcher's tasks share.

Example::

    from estimator_keras.distribute import strategy, tf_config

    info = tf_config.parse_tf_config()
    name = strategy.choose_strategy("auto", info, num_gpus=0)
"""
