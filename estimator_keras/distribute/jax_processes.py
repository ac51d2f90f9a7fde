"""Keras 3 on JAX across processes: the process group from the environment,
JAX's distributed runtime, and data parallelism over every process's devices.

Keras 3's ``fit`` does not run under TensorFlow's MultiWorkerMirroredStrategy
(keras-team/keras#20585), so the keras3 engine trains a cluster on the JAX
backend instead: ``jax.distributed.initialize`` joins the processes (gloo
collectives on CPU), and ``keras.distribution.DataParallel`` over all their
devices keeps one copy of the weights per device, averaging the gradients of
each global batch. Each process reads its own share of the training files.

:func:`from_environ` finds the group where the platforms put it, in this order:

- a Kubeflow JAXJob (training-operator v1): ``COORDINATOR_ADDRESS``,
  ``COORDINATOR_PORT``, ``NUM_PROCESSES`` and ``PROCESS_ID`` in every pod;
- a Kubeflow Trainer v2 TrainJob on the ``jax-distributed`` runtime:
  ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID``
  (:mod:`~estimator_keras.distribute.trainjob_pods`);
- Vertex AI: ``CLUSTER_SPEC`` (worker pool 0 is process 0, pool 1 the rest);
- ``TF_CONFIG`` (a local ``cluster`` or a TFJob): the chief, then the workers,
  with the chief's address as the coordinator.

Parsing imports neither JAX nor Keras: launchers and the CLI check a group
before anything starts. Every mistake is a
:class:`~estimator_keras.errors.ClusterConfigError` naming the variable.

Example::

    group = from_environ()            # None: one process
    if group is not None:
        distribution = DataParallelProcesses(group)   # joins the others
        with distribution.scope():
            model.fit(...)
"""

import contextlib
import dataclasses
import ipaddress
import json
import os
import random

from estimator_keras.distribute import groups, tf_config, trainjob_pods
from estimator_keras.errors import ClusterConfigError

JAXJOB_VARIABLES = ("COORDINATOR_ADDRESS", "COORDINATOR_PORT", "NUM_PROCESSES", "PROCESS_ID")
"""What Kubeflow's training operator sets in every pod of a JAXJob."""
CLUSTER_SPEC_VARIABLE = "CLUSTER_SPEC"
# Vertex AI's pools: 0 the primary replica, 1 the workers. Pools 2 and 3
# (reduction server, evaluator) have no role in a JAX process group.
_VERTEX_POOLS = ("workerpool0", "workerpool1")
# Seconds a process waits for the others to join before it gives up.
JOIN_TIMEOUT_SECS = 300


@dataclasses.dataclass(frozen=True)
class ProcessGroup:
    """The processes that train together, as this process sees them.

    Attributes:
      coordinator: "host:port" of process 0's coordination service.
      num_processes: how many processes train together.
      process_id: this process's rank, 0 to ``num_processes - 1``; 0 writes
        checkpoints, summaries and exports.
      source: the variables the group was read from, for messages.
    """

    coordinator: str
    num_processes: int
    process_id: int
    source: str

    @property
    def is_writer(self):
        return self.process_id == 0

    @property
    def bind_address(self):
        """Where process 0's coordination service listens: the coordinator
        address itself when it is a loopback address (a local cluster: no
        other machine can connect), else None, which is JAX's default of
        every interface on that port, as other machines must reach it."""
        host = self.coordinator.rpartition(":")[0].strip("[]")
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host.lower() == "localhost"
        return self.coordinator if loopback else None

    def distribution(self):
        """Joins the group: a :class:`DataParallelProcesses` over its devices."""
        return DataParallelProcesses(self)

    def cluster_info(self):
        """The :class:`~estimator_keras.distribute.tf_config.ClusterInfo` the
        runner's roles go by: process 0 is the chief, the others workers.
        Only the coordinator's address is known (a JAXJob names no other):
        the workers are listed by rank."""
        cluster = {"chief": [self.coordinator]}
        if self.num_processes > 1:
            cluster["worker"] = [f"process-{i}" for i in range(1, self.num_processes)]
        if self.process_id == 0:
            return tf_config.ClusterInfo(cluster, "chief", 0)
        return tf_config.ClusterInfo(cluster, "worker", self.process_id - 1)


def _coordinator_host(text):
    """COORDINATOR_ADDRESS as the host part of "host:port" (an IPv6 address
    in brackets); the port comes from COORDINATOR_PORT."""
    host = text.strip()
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if ":" in bare:
        try:
            ipaddress.IPv6Address(bare)
        except ValueError:
            bare = None
        host = f"[{bare}]"
    elif host != bare:
        bare = None  # brackets belong around an IPv6 address only
    if (not host or bare is None or any(c.isspace() for c in host) or "/" in host
            or host.startswith("[") != host.endswith("]")):
        raise ClusterConfigError(
            f"COORDINATOR_ADDRESS={text!r} is not a host name or IP address (the port goes in "
            f"COORDINATOR_PORT).")
    return host


def _from_jaxjob(environ):
    if not trainjob_pods.all_or_none(
            environ, JAXJOB_VARIABLES,
            f"a JAX process group needs all four of {', '.join(JAXJOB_VARIABLES)} (a Kubeflow "
            f"JAXJob sets them in every pod)"):
        return None
    host = _coordinator_host(environ["COORDINATOR_ADDRESS"])
    port = tf_config.whole_number("COORDINATOR_PORT", environ["COORDINATOR_PORT"], 1, 65535)
    count = tf_config.whole_number("NUM_PROCESSES", environ["NUM_PROCESSES"], 1)
    rank = tf_config.whole_number("PROCESS_ID", environ["PROCESS_ID"], 0, count - 1)
    return ProcessGroup(f"{host}:{port}", count, rank, "JAXJob (" + ", ".join(
        JAXJOB_VARIABLES) + ")")


def _from_trainjob(environ):
    found = trainjob_pods.jax_group(environ)
    if found is None:
        return None
    return ProcessGroup(*found, "Kubeflow TrainJob (" + ", ".join(
        trainjob_pods.JAX_VARIABLES) + ")")


def _from_cluster_spec(text):
    where = CLUSTER_SPEC_VARIABLE
    try:
        spec = json.loads(text)
    except ValueError as e:
        raise ClusterConfigError(f"{where} is not valid JSON ({e}); Vertex AI sets it as "
                                 f'{{"cluster": {{"workerpool0": ["host:port"], ...}}, '
                                 f'"task": {{"type": "workerpool0", "index": 0}}}}.') from e
    cluster = spec.get("cluster") if isinstance(spec, dict) else None
    task = spec.get("task") if isinstance(spec, dict) else None
    if not isinstance(cluster, dict) or not isinstance(task, dict):
        raise ClusterConfigError(f"{where} needs a \"cluster\" and a \"task\" object; given "
                                 f"{tf_config.short_json(spec)}.")
    others = sorted(set(cluster) - set(_VERTEX_POOLS))
    if others:
        raise ClusterConfigError(
            f"{where} has worker pool(s) {', '.join(others)}, which a JAX process group has no "
            f"role for: only workerpool0 (process 0) and workerpool1 (the other processes) "
            f"train together. Drop the reduction-server and evaluator pools from the job.")
    primary = cluster.get("workerpool0")
    if not isinstance(primary, list) or len(primary) != 1:
        raise ClusterConfigError(f"{where} cluster.workerpool0 must list exactly one "
                                 f"\"host:port\" (process 0); given "
                                 f"{tf_config.short_json(primary)}.")
    workers = cluster.get("workerpool1", [])
    if not isinstance(workers, list):
        raise ClusterConfigError(f"{where} cluster.workerpool1 must be a list of "
                                 f"\"host:port\"; given {tf_config.short_json(workers)}.")
    addresses = {"workerpool0": primary, "workerpool1": workers}
    for pool, listed in addresses.items():
        for i, address in enumerate(listed):
            tf_config.check_address(f"{where} cluster[{pool!r}][{i}]", address)
    pool, index = task.get("type"), task.get("index", 0)
    if pool not in _VERTEX_POOLS or not addresses[pool]:
        raise ClusterConfigError(f"{where} task.type is {pool!r}; expected one of the pools "
                                 f"in its cluster ({', '.join(p for p in _VERTEX_POOLS if addresses[p])}).")
    if isinstance(index, bool) or not isinstance(index, int) or not (
            0 <= index < len(addresses[pool])):
        raise ClusterConfigError(f"{where} task.index is {index!r}; {pool} has "
                                 f"{len(addresses[pool])} replica(s), indices 0 to "
                                 f"{len(addresses[pool]) - 1}.")
    rank = index if pool == "workerpool0" else 1 + index
    return ProcessGroup(primary[0], 1 + len(workers), rank, f"Vertex AI ({where})")


def _from_tf_config(info):
    if not info.is_distributed:
        return None
    order = info.cluster.get("chief", []) + info.cluster.get("worker", [])
    if info.task_type not in tf_config.TRAINING_TYPES:
        # ps and evaluator tasks are refused by the engine's registry entry, which names them.
        return None
    return ProcessGroup(order[0], len(order), order.index(info.task_address),
                        "TF_CONFIG (the chief's address as coordinator)")


def from_environ(environ=None, info=None):
    """The :class:`ProcessGroup` this process belongs to, or None when it
    trains alone: from a JAXJob's variables, else a TrainJob's, else Vertex's ``CLUSTER_SPEC``,
    else ``TF_CONFIG`` (``info``: its parsed
    :class:`~estimator_keras.distribute.tf_config.ClusterInfo`, None parses it).
    A group of one process is None too: nothing to join.

    Raises:
      ClusterConfigError: partial or bad settings, naming the variable.
    """
    environ = os.environ if environ is None else environ
    group = _from_jaxjob(environ)
    trainjob = _from_trainjob(environ)
    if group is not None and trainjob is not None:
        raise ClusterConfigError(
            f"both a JAXJob's variables ({', '.join(JAXJOB_VARIABLES)}) and a TrainJob's "
            f"({', '.join(trainjob_pods.JAX_VARIABLES)}) are set: one pod belongs to one job. "
            f"Unset the ones that do not describe this job.")
    group = group or trainjob
    if group is None and environ.get(CLUSTER_SPEC_VARIABLE, "").strip():
        group = _from_cluster_spec(environ[CLUSTER_SPEC_VARIABLE])
    if group is None:
        group = _from_tf_config(info if info is not None else
                                tf_config.parse_tf_config(env=environ))
    return group if group is not None and group.num_processes > 1 else None


# Releases whose CPU collectives (gloo) hang a training process group:
# with JAX 0.12.1, every two-process `cluster --engine keras3` run waited
# for ever in its first collective compiled after the run started (the
# broadcast of process 0's weights, else the first training step), while
# 0.10.2 and 0.12.0.1 trained the same runs (tests/test_jax_cluster.py).
JAX_RELEASES_THAT_HANG = ("0.12.1",)


def hang_refusal(jax_version, platform):
    """Why a process group cannot train on this JAX (a paragraph), or ""."""
    if platform != "cpu" or jax_version not in JAX_RELEASES_THAT_HANG:
        return ""
    return (f"JAX {jax_version}'s CPU collectives (gloo) hang this package's multi-process "
            f"Keras runs: the processes wait for ever in a collective of their first steps. "
            f"Install another JAX release in every process, e.g. pip install "
            f"'jax[cpu]!={jax_version}' (the '.[jax]' extra excludes it); one-process "
            f"training is not affected.")


class DataParallelProcesses(groups.TrainingGroup):
    """Keras 3 data parallelism over every device of a JAX process group.

    Building it joins the group (``jax.distributed.initialize``; it must come
    before any JAX computation in the process). Training runs inside
    :meth:`scope`; outside it the process computes alone, as exports and
    evaluations of one process must. Each process feeds its own batches
    (``input_shard``), which together form the global batch.

    Attributes:
      group: the :class:`ProcessGroup`.
      num_replicas_in_sync: the processes (each feeds one batch per step).
      shared_seed: a random seed, the same in every process.
      input_shard: (processes, this process's rank), for the input pipeline.
      description: what it runs, for the run's first line.
      chief_work_stalls_others: True: the runner writes ``MODEL_DIR/best``
        once, when training ends (see
        :class:`~estimator_keras.export.BestCandidate`).
      process_0_decides: True: process 0 alone reads the model dir.
    """

    process_0_decides = True

    def __init__(self, group, timeout=JOIN_TIMEOUT_SECS):
        # pylint: disable=import-outside-toplevel  (JAX and Keras only where a group trains)
        import jax
        import keras
        self.group = group
        # Whatever the chief does alone (a best-model export) holds every
        # other process in the next step's collective meanwhile.
        self.chief_work_stalls_others = True
        # Collectives between CPU processes need gloo; GPUs keep NCCL.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        # The engine's PreemptionWatch answers SIGTERM (a checkpoint all
        # processes agree on); JAX's own notifier would swallow the signal.
        jax.config.update("jax_enable_preemption_service", False)
        try:
            jax.distributed.initialize(
                coordinator_address=group.coordinator, num_processes=group.num_processes,
                process_id=group.process_id, coordinator_bind_address=group.bind_address,
                initialization_timeout=int(timeout))
        except Exception as e:  # pylint: disable=broad-except  (JAX raises plain errors)
            raise ClusterConfigError(
                f"process {group.process_id} of {group.num_processes} could not join the JAX "
                f"process group at {group.coordinator} (from {group.source}) within "
                f"{timeout:g} s: {str(e).strip().splitlines()[0] if str(e).strip() else e!r}. "
                f"Check that process 0 runs and that its address and port are reachable.") from e
        self._devices = jax.devices()
        refusal = hang_refusal(jax.__version__, self._devices[0].platform)
        if refusal:
            raise ClusterConfigError(refusal)
        # One batch per process; DataParallel splits it over the process's devices.
        self.num_replicas_in_sync = group.num_processes
        self.input_shard = (group.num_processes, group.process_id)
        self.description = (f"{group.num_processes} JAX processes, "
                            f"keras.distribution.DataParallel over {len(self._devices)} devices")
        # The input pipeline already gives each process its own share.
        self.distribution = keras.distribution.DataParallel(devices=self._devices,
                                                            auto_shard_dataset=False)
        # Weights are initialized in every process and must come out equal:
        # a run without a seed of its own uses process 0's.
        self.shared_seed = int(self._broadcast(random.randrange(2**31 - 1)))

    @staticmethod
    def _broadcast(value):
        # pylint: disable=import-outside-toplevel
        import numpy as np
        return DataParallelProcesses.from_process_0(np.int32(value)).item()

    @staticmethod
    def from_process_0(values):
        """Process 0's ``values`` (numbers or numpy arrays, nested in lists,
        tuples or dicts) in every process; the others pass values of the
        same shapes and dtypes, which are dropped. Every process must call
        it at the same point."""
        # pylint: disable=import-outside-toplevel
        import jax
        import numpy as np
        from jax.experimental import multihost_utils
        # Python's integers as JAX's (32 bits unless x64 is on).
        values = jax.tree.map(lambda v: np.asarray(v, np.int32) if isinstance(v, int)
                              else np.asarray(v), values)
        return jax.tree.map(np.asarray, multihost_utils.broadcast_one_to_all(values))

    @staticmethod
    def sums(values):
        """The sums of ``values`` (a list of numpy arrays, the same shapes in
        every process) over all processes; every process must call it at
        the same point."""
        # pylint: disable=import-outside-toplevel
        import numpy as np
        from jax.experimental import multihost_utils
        gathered = multihost_utils.process_allgather([np.asarray(v) for v in values])
        return [np.asarray(g).sum(axis=0).astype(np.asarray(v).dtype)
                for g, v in zip(gathered, values)]

    @property
    def multi_process(self):
        return True

    def scope(self):
        """Where models are built and trained over all processes."""
        return self.distribution.scope()

    def fit_scope(self):
        """Keras reads the distribution as it trains."""
        return self.distribution.scope()

    @staticmethod
    @contextlib.contextmanager
    def alone():
        """Inside :meth:`scope`: computes in this process only (a best-model
        export while the others train)."""
        import keras  # pylint: disable=import-outside-toplevel
        previous = keras.distribution.distribution()
        keras.distribution.set_distribution(None)
        try:
            yield
        finally:
            keras.distribution.set_distribution(previous)

    @staticmethod
    def mean(values):
        """The mean of ``values`` (a list of floats) over all processes;
        every process must call it at the same point."""
        # pylint: disable=import-outside-toplevel
        import numpy as np
        from jax.experimental import multihost_utils
        gathered = multihost_utils.process_allgather(np.asarray(values, np.float32))
        return [float(v) for v in np.asarray(gathered).reshape(-1, len(values)).mean(axis=0)]
