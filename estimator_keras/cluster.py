"""TF_CONFIG validation, distribution-strategy choice and a local cluster launcher.

Three independent pieces:

- :func:`parse_tf_config` reads and checks ``TF_CONFIG`` before anything starts
  and returns a :class:`ClusterInfo`; every mistake raises
  :class:`~estimator_keras.errors.ClusterConfigError` with a message that quotes
  the offending part.
- :func:`choose_strategy` (pure) picks a strategy name for a task, and
  :func:`make_train_distribute` turns the name into the object that goes into
  ``tf.estimator.RunConfig(train_distribute=...)``.
- :func:`launch_local_cluster` runs one command per task of a chief / worker /
  ps / evaluator cluster on 127.0.0.1, each with its own ``TF_CONFIG``, streams
  their logs, and ends every process it started, whatever happens.

TensorFlow is imported lazily, only by the functions that build strategies, so
parsing ``TF_CONFIG`` and launching tasks stay cheap.

Example::

    info = parse_tf_config()                      # reads os.environ["TF_CONFIG"]
    name = choose_strategy("auto", info, num_gpus=local_gpu_count())
    config = tf.estimator.RunConfig(train_distribute=make_train_distribute(name))
"""

import atexit
import collections
import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping

from estimator_keras.errors import ClusterConfigError, ConfigError, EstimatorKerasError, UsageError

logger = logging.getLogger(__name__)

TASK_TYPES = ("chief", "worker", "ps", "evaluator")
TRAINING_TYPES = ("chief", "worker")
STRATEGIES = ("auto", "none", "mirrored", "multi_worker_mirrored", "parameter_server")
CONCRETE_STRATEGIES = STRATEGIES[1:]

_EXAMPLE_TF_CONFIG = ('{"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222"]}, '
                      '"task": {"type": "worker", "index": 0}}')


# --------------------------------------------------------------------------- TF_CONFIG

@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """What ``TF_CONFIG`` says about the cluster and about this process's task.

    Attributes:
      cluster: task type -> list of "host:port" addresses, exactly as in
        ``TF_CONFIG``; empty when training locally (no ``TF_CONFIG``).
      task_type: this process's task: "chief", "worker", "ps" or "evaluator".
        A local (non-distributed) process is the "chief".
      task_index: this process's index within ``cluster[task_type]``; 0 for the
        evaluator and for a local process.
    """

    cluster: dict
    task_type: str
    task_index: int

    @property
    def is_distributed(self):
        """True when ``TF_CONFIG`` describes a cluster (False for local training)."""
        return bool(self.cluster)

    @property
    def is_chief(self):
        """True for the task that writes checkpoints and summaries (also when local)."""
        return self.task_type == "chief"

    @property
    def is_evaluator(self):
        """True for the evaluator task, which sits outside the cluster spec."""
        return self.task_type == "evaluator"

    @property
    def num_workers(self):
        """Number of training tasks (chief + workers); 1 when local."""
        if not self.cluster:
            return 1
        return sum(len(self.cluster.get(t, ())) for t in TRAINING_TYPES)

    @property
    def has_ps(self):
        """True when the cluster has parameter servers."""
        return bool(self.cluster.get("ps"))

    @property
    def task_name(self):
        """``"<type>-<index>"``, e.g. "worker-1"; used in logs and messages."""
        return f"{self.task_type}-{self.task_index}"

    @property
    def task_address(self):
        """This task's "host:port", or None for the evaluator and for local training."""
        addresses = self.cluster.get(self.task_type)
        return addresses[self.task_index] if addresses else None


def _short(obj, limit=120):
    """JSON text of ``obj`` cut to ``limit`` characters, for quoting in messages."""
    try:
        text = json.dumps(obj)
    except (TypeError, ValueError):
        text = repr(obj)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _describe_cluster(cluster):
    """'chief (index 0), worker (indices 0-1)' -- what a cluster has, for messages."""
    parts = []
    for task_type, addresses in cluster.items():
        n = len(addresses)
        parts.append(f"{task_type} (index 0)" if n == 1 else f"{task_type} (indices 0-{n - 1})")
    return ", ".join(parts) if parts else "nothing"


def _check_address(task_type, index, address):
    where = f"TF_CONFIG cluster[{task_type!r}][{index}]"
    if not isinstance(address, str):
        raise ClusterConfigError(
            f"{where} is {_short(address)}, not a string; each address must be a "
            f"\"host:port\" string such as \"10.0.0.2:2222\".")
    host, sep, port = address.rpartition(":")
    if not sep or not host or host in ("[", "[]") or (host.count(":") and not host.startswith("[")):
        raise ClusterConfigError(
            f"{where} = {address!r} has no port; each address must be \"host:port\" with a "
            f"port from 1 to 65535 (an IPv6 host goes in brackets: \"[::1]:2222\").")
    if not port.isdigit():
        raise ClusterConfigError(
            f"{where} = {address!r}: port {port!r} is not a number; each address must be "
            f"\"host:port\" with a port from 1 to 65535.")
    if not 1 <= int(port) <= 65535:
        raise ClusterConfigError(
            f"{where} = {address!r}: port {int(port)} is out of range; ports go from 1 to 65535.")


def _check_cluster(cluster):
    """Validate the 'cluster' object; returns a plain dict type -> list of addresses."""
    if not isinstance(cluster, Mapping):
        raise ClusterConfigError(
            f"TF_CONFIG 'cluster' must be an object mapping task types to lists of "
            f"\"host:port\" addresses, e.g. {{\"chief\": [\"host0:2222\"], \"worker\": "
            f"[\"host1:2222\"]}}; got {_short(cluster)}.")
    unknown = [t for t in cluster if t not in TASK_TYPES]
    if unknown:
        hint = " ('master' is the old name of 'chief')" if "master" in unknown else ""
        raise ClusterConfigError(
            f"TF_CONFIG cluster has unknown task type(s) "
            f"{', '.join(repr(t) for t in unknown)}{hint}; the allowed task types are "
            f"{', '.join(TASK_TYPES)}, and the evaluator is given only as a task, outside "
            f"'cluster'.")
    if "evaluator" in cluster:
        raise ClusterConfigError(
            f"TF_CONFIG cluster lists an 'evaluator' ({_short(cluster['evaluator'])}); "
            f"TensorFlow requires the evaluator to stay outside the cluster spec: remove "
            f"'evaluator' from 'cluster' and set only the evaluator process's own task to "
            f"{{\"type\": \"evaluator\", \"index\": 0}}, next to the same cluster.")
    checked = {}
    for task_type, addresses in cluster.items():
        if not isinstance(addresses, list):
            raise ClusterConfigError(
                f"TF_CONFIG cluster[{task_type!r}] must be a list of \"host:port\" strings; "
                f"got {_short(addresses)}.")
        if not addresses:
            raise ClusterConfigError(
                f"TF_CONFIG cluster[{task_type!r}] is an empty list; give at least one "
                f"\"host:port\" address or leave {task_type!r} out.")
        for index, address in enumerate(addresses):
            _check_address(task_type, index, address)
        checked[task_type] = list(addresses)

    if "ps" in checked and not any(t in checked for t in TRAINING_TYPES):
        raise ClusterConfigError(
            f"TF_CONFIG cluster has parameter servers (\"ps\": {_short(checked['ps'])}) but "
            f"no 'chief' or 'worker' to train with them; add a \"chief\": [\"host:port\"] "
            f"task (and workers if wanted).")
    if "chief" not in checked:
        present = [t for t in ("worker", "ps") if t in checked]
        raise ClusterConfigError(
            f"TF_CONFIG cluster has {' and '.join(repr(t) for t in present)} tasks but no "
            f"'chief' (cluster: {_short(checked)}); this package requires an explicit chief, "
            f"the task that writes checkpoints and summaries: move one worker's address to "
            f"\"chief\": [\"host:port\"].")
    if len(checked["chief"]) > 1:
        raise ClusterConfigError(
            f"TF_CONFIG cluster lists {len(checked['chief'])} chiefs "
            f"({_short(checked['chief'])}); there must be exactly one: keep one and move the "
            f"others to 'worker'.")

    seen = {}
    for task_type, addresses in checked.items():
        for index, address in enumerate(addresses):
            key = address.lower()
            name = f"{task_type}-{index}"
            if key in seen:
                raise ClusterConfigError(
                    f"TF_CONFIG cluster gives the same address {address!r} to {seen[key]} "
                    f"and {name}; every task needs its own host:port.")
            seen[key] = name
    return checked


def _check_index(raw):
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise ClusterConfigError(
            f"TF_CONFIG task index must be a non-negative integer; got {_short(raw)}.")
    if isinstance(raw, str):
        if not raw.strip().isdigit():
            raise ClusterConfigError(
                f"TF_CONFIG task index must be a non-negative integer; got {raw!r}.")
        raw = int(raw)
    if raw < 0:
        raise ClusterConfigError(
            f"TF_CONFIG task index must be a non-negative integer; got {raw}.")
    return raw


def parse_tf_config(value=None, env=os.environ):
    """Read and validate ``TF_CONFIG``; return a :class:`ClusterInfo`.

    Args:
      value: the ``TF_CONFIG`` JSON text (or an already parsed mapping); None
        reads ``env["TF_CONFIG"]``.
      env: the environment to read when ``value`` is None.

    Returns:
      A :class:`ClusterInfo`. Without ``TF_CONFIG`` (unset, empty, ``{}`` or an
      empty cluster) it describes local training: no cluster, task "chief" 0.

    Raises:
      ClusterConfigError: invalid JSON, a malformed cluster (addresses, unknown
        or missing task types, several chiefs, an evaluator inside the cluster,
        duplicate addresses, ps without training tasks) or a task that is not in
        the cluster. This runs before any server starts, so a wrong
        configuration fails at once instead of hanging.

    Example::

        info = parse_tf_config('{"cluster": {"chief": ["h0:2222"], "ps": ["h1:2222"]},'
                               ' "task": {"type": "ps", "index": 0}}')
        info.has_ps, info.num_workers   # (True, 1)
    """
    if value is None:
        value = env.get("TF_CONFIG")
    if value is None or (isinstance(value, str) and not value.strip()):
        return ClusterInfo(cluster={}, task_type="chief", task_index=0)
    if isinstance(value, (str, bytes)):
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        try:
            config = json.loads(text)
        except json.JSONDecodeError as e:
            start = max(0, e.pos - 20)
            raise ClusterConfigError(
                f"TF_CONFIG is not valid JSON: {e.msg} at line {e.lineno} column {e.colno} "
                f"(character {e.pos}), near {text[start:e.pos + 20]!r}. It must be a JSON "
                f"object such as {_EXAMPLE_TF_CONFIG}.") from None
    else:
        config = value
    if not isinstance(config, Mapping):
        raise ClusterConfigError(
            f"TF_CONFIG must be a JSON object with keys 'cluster' and 'task'; got "
            f"{_short(config)}. Example: {_EXAMPLE_TF_CONFIG}.")

    raw_cluster = config.get("cluster")
    task = config.get("task")
    if raw_cluster is None or (isinstance(raw_cluster, Mapping) and not raw_cluster):
        # No cluster means local training; a task naming anything but the single
        # local trainer would otherwise be silently ignored.
        if task not in (None, {}):
            if (isinstance(task, Mapping) and task.get("type") in TRAINING_TYPES
                    and str(task.get("index", 0)) == "0"):
                return ClusterInfo(cluster={}, task_type="chief", task_index=0)
            raise ClusterConfigError(
                f"TF_CONFIG names task {_short(task)} but has no cluster ('cluster' is "
                f"{_short(raw_cluster)}); give the cluster the task belongs to, e.g. "
                f"{_EXAMPLE_TF_CONFIG}, or unset TF_CONFIG to train locally.")
        return ClusterInfo(cluster={}, task_type="chief", task_index=0)

    cluster = _check_cluster(raw_cluster)
    has = _describe_cluster(cluster)
    if task is None:
        raise ClusterConfigError(
            f"TF_CONFIG has a 'cluster' but no 'task'; each process needs \"task\": "
            f"{{\"type\": ..., \"index\": ...}} saying which task it is. The cluster has: {has}.")
    if not isinstance(task, Mapping):
        raise ClusterConfigError(
            f"TF_CONFIG 'task' must be an object like {{\"type\": \"worker\", \"index\": 0}}; "
            f"got {_short(task)}.")
    task_type = task.get("type")
    if not isinstance(task_type, str) or not task_type:
        raise ClusterConfigError(
            f"TF_CONFIG task {_short(task)} has no 'type'; it must be one of "
            f"{', '.join(TASK_TYPES)}. The cluster has: {has}.")
    if task_type not in TASK_TYPES:
        raise ClusterConfigError(
            f"TF_CONFIG task type {task_type!r} is unknown; the allowed task types are "
            f"{', '.join(TASK_TYPES)}. The cluster has: {has}.")
    task_index = _check_index(task.get("index", 0))
    if task_type == "evaluator":
        if task_index != 0:
            raise ClusterConfigError(
                f"TF_CONFIG task {_short(task)}: the evaluator's index must be 0 (TensorFlow "
                f"runs a single evaluator); got {task_index}.")
        return ClusterInfo(cluster=cluster, task_type=task_type, task_index=0)
    if task_type not in cluster:
        raise ClusterConfigError(
            f"TF_CONFIG task {_short(task)} names type {task_type!r}, which the cluster does "
            f"not have; the cluster has: {has}.")
    if task_index >= len(cluster[task_type]):
        raise ClusterConfigError(
            f"TF_CONFIG task {_short(task)}: index {task_index} is out of range for "
            f"{task_type!r}; the cluster has: {has}.")
    return ClusterInfo(cluster=cluster, task_type=task_type, task_index=task_index)


def build_tf_config(cluster, task_type, index):
    """Return the ``TF_CONFIG`` JSON text for one task of ``cluster``.

    The result is validated with :func:`parse_tf_config`, so a launcher never
    hands a task a configuration that the task would reject.

    Example::

        cluster = {"chief": ["127.0.0.1:4000"], "worker": ["127.0.0.1:4001"]}
        os.environ["TF_CONFIG"] = build_tf_config(cluster, "worker", 0)
    """
    text = json.dumps({"cluster": {t: list(a) for t, a in cluster.items()},
                       "task": {"type": task_type, "index": index}})
    parse_tf_config(text)
    return text


# --------------------------------------------------------------------------- strategies

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
            f"tasks (cluster: {_describe_cluster(info.cluster)}); add \"ps\" addresses to "
            "TF_CONFIG or choose another strategy.")
    if requested == "multi_worker_mirrored" and info.has_ps:
        raise ConfigError(
            "strategy 'multi_worker_mirrored' cannot run in a cluster with parameter servers "
            f"(TF_CONFIG has ps: {_short(info.cluster['ps'])}); use 'parameter_server' (or "
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
    logger.info("Strategy 'auto' -> %r (task %s, %d training task(s), ps: %s, %d GPU(s)).",
                chosen, info.task_name, training, info.has_ps, num_gpus)
    return chosen


def local_gpu_count():
    """Number of GPUs TensorFlow sees in this process (imports TensorFlow)."""
    import tensorflow as tf
    return len(tf.config.list_physical_devices("GPU"))


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
        import tensorflow as tf
        return tf.distribute.MultiWorkerMirroredStrategy()

    import tensorflow as tf
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


# --------------------------------------------------------------------------- launcher

class ClusterError(EstimatorKerasError):
    """A local cluster run failed (a task died, the run timed out, it was interrupted).

    Attributes:
      result: the :class:`ClusterResult` of the run so far (every task has been
        stopped by then), or None when nothing started.
    """

    def __init__(self, message, result=None):
        super().__init__(message)
        self.result = result


class ClusterTaskError(ClusterError):
    """One task of a local cluster exited non-zero or was killed.

    Attributes:
      task: the task's name, e.g. "worker-0".
      returncode: its exit status; negative -N when killed by signal N.
      last_lines: the last lines of its output.
      log_path: its full log.
    """

    def __init__(self, task, returncode, last_lines, log_path=None, result=None,
                 also_failed=()):
        self.task = task
        self.returncode = returncode
        self.last_lines = list(last_lines)
        self.log_path = log_path
        message = (f"task {task} {describe_returncode(returncode)}; all other tasks have been "
                   f"stopped.")
        if also_failed:
            message += f" Also failed: {', '.join(also_failed)}."
        if log_path:
            message += f" Log: {log_path}."
        if self.last_lines:
            message += f" Last {len(self.last_lines)} lines of its log:\n" + "\n".join(
                f"  | {line}" for line in self.last_lines)
        else:
            message += " It printed nothing."
        super().__init__(message, result)


class ClusterTimeoutError(ClusterError):
    """A local cluster did not finish within its time limit.

    Attributes:
      timeout: the limit in seconds.
      running: names of the tasks still running at the limit (now stopped).
    """

    def __init__(self, message, timeout, running, result=None):
        super().__init__(message, result)
        self.timeout = timeout
        self.running = list(running)


class ClusterInterrupted(ClusterError):
    """The launcher itself received SIGTERM or SIGHUP; every task was stopped."""


def describe_returncode(returncode):
    """'exited with status 3' / 'was killed by signal SIGKILL (9)'."""
    if returncode is None:
        return "is still running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown signal"
        return f"was killed by signal {name} ({-returncode})"
    return f"exited with status {returncode}"


@dataclasses.dataclass(frozen=True)
class ClusterResult:
    """Outcome of :func:`launch_local_cluster`.

    Attributes:
      returncodes: task name ("chief-0", "ps-0", ...) -> exit status (negative
        -N when ended by signal N, None if it could not be reaped).
      log_paths: task name -> path of its log file.
      pids: task name -> process id (each task leads its own process group).
      ended_by_launcher: tasks the launcher stopped itself: always the ps tasks,
        the evaluator when it outlived its grace period, everything on failure.
      wall_time: seconds from the first start to the last process ended.
      log_dir: the folder holding the logs.
    """

    returncodes: dict
    log_paths: dict
    pids: dict
    ended_by_launcher: tuple
    wall_time: float
    log_dir: str


def _address(host, port):
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def free_ports(n, host="127.0.0.1"):
    """Return ``n`` distinct TCP ports that are free on ``host`` right now.

    All ``n`` sockets are bound (port 0) at the same time and then released,
    so the ports differ from each other; another program may still take one
    before the task binds it, which the launch then reports as a task failure.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise UsageError(f"free_ports: n must be a non-negative integer; got {n!r}.")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(s)
            s.bind((host, 0))
        ports = [s.getsockname()[1] for s in sockets]
    except OSError as e:
        raise ClusterError(f"could not reserve {n} free ports on {host}: {e}.") from e
    finally:
        for s in sockets:
            s.close()
    if len(set(ports)) != len(ports):
        raise ClusterError(f"the system handed out duplicate ports on {host}: {ports}.")
    return ports


# Process groups started by launchers in this process and not yet reaped; an
# interpreter exit that skips the launcher's finally still kills them.
_LIVE_GROUPS = {}
_LIVE_LOCK = threading.Lock()


def _kill_live_groups():
    with _LIVE_LOCK:
        groups = list(_LIVE_GROUPS)
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


atexit.register(_kill_live_groups)


class _Task:
    def __init__(self, task_type, index, log_path, tail_lines):
        self.type = task_type
        self.index = index
        self.name = f"{task_type}-{index}"
        self.log_path = log_path
        self.proc = None
        self.reader = None
        self.tail = collections.deque(maxlen=max(tail_lines, 1))
        self.ended_by_launcher = False

    def poll(self):
        return None if self.proc is None else self.proc.poll()

    @property
    def running(self):
        return self.proc is not None and self.proc.poll() is None


class _Echo:
    """Serializes prefixed output lines of all tasks onto the launcher's stdout."""

    def __init__(self, enabled):
        self.enabled = enabled
        self.lock = threading.Lock()

    def write(self, prefix, line):
        if not self.enabled:
            return
        with self.lock:
            try:
                sys.stdout.write(f"[{prefix}] {line}\n")
                sys.stdout.flush()
            except (OSError, ValueError):
                # A closed or broken stdout must not stop the log file copy.
                self.enabled = False


def _pump(task, log_file, echo):
    """Copy one task's output into its log (and the echo) until the pipe closes."""
    try:
        with log_file:
            for raw in iter(task.proc.stdout.readline, b""):
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                log_file.write(line + "\n")
                log_file.flush()
                task.tail.append(line)
                echo.write(task.name, line)
    except (OSError, ValueError) as e:
        logger.warning("Lost the output of task %s: %s", task.name, e)
    finally:
        try:
            task.proc.stdout.close()
        except OSError:
            pass


def _signal_group(task, sig):
    try:
        os.killpg(task.proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stop(tasks, grace):
    """SIGTERM the running tasks' groups, SIGKILL what is left after ``grace`` s, reap all.

    SIGKILL always follows: MultiWorkerMirroredStrategy installs its own SIGTERM
    handler, so a task may survive SIGTERM.
    """
    started = [t for t in tasks if t.proc is not None]
    for t in started:
        if t.proc.poll() is None:
            t.ended_by_launcher = True
            _signal_group(t, signal.SIGTERM)
    end = time.monotonic() + grace
    while any(t.proc.poll() is None for t in started) and time.monotonic() < end:
        time.sleep(0.05)
    for t in started:
        # Also for leaders that exited: their children may still hold the group.
        _signal_group(t, signal.SIGKILL)
    for t in started:
        try:
            t.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            logger.error("Task %s (pid %d) did not die after SIGKILL.", t.name, t.proc.pid)
            continue
        with _LIVE_LOCK:
            _LIVE_GROUPS.pop(t.proc.pid, None)


class _SignalGuard:
    """Turns SIGTERM/SIGHUP into ClusterInterrupted in the main thread while active."""

    def __init__(self):
        self.previous = {}
        self.received = None
        self.cleaning = False

    def error(self):
        return ClusterInterrupted(
            f"the launcher received {signal.Signals(self.received).name}; all tasks were "
            f"stopped.")

    def _handler(self, signum, frame):
        first = self.received is None
        if first:
            self.received = signum
        # Never interrupt the cleanup itself: it is what ends the tasks.
        if first and not self.cleaning:
            raise self.error()

    def __enter__(self):
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in (signal.SIGTERM, signal.SIGHUP):
            current = signal.getsignal(sig)
            if current is signal.SIG_IGN:
                continue  # e.g. nohup: the caller wants this signal ignored
            self.previous[sig] = current
            signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        return False


def _check_count(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UsageError(f"{name} must be an integer >= {minimum}; got {value!r}.")


def _check_seconds(name, value, allow_zero=False):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            value >= 0 if allow_zero else value > 0):
        raise UsageError(f"{name} must be a number of seconds {'>= 0' if allow_zero else '> 0'}; "
                         f"got {value!r}.")


def launch_local_cluster(task_command, workers=1, ps=0, evaluator=False, log_dir=None,
                         timeout=1800.0, host="127.0.0.1", env=None, echo=True,
                         evaluator_grace=120.0, kill_grace=5.0, tail_lines=20):
    """Run ``task_command`` once per task of a local cluster and wait for the training.

    The cluster is one chief, ``workers`` further workers and ``ps`` parameter
    servers, each on a free port of ``host``, plus (``evaluator=True``) an
    evaluator outside the cluster spec. Every task runs ``task_command`` as its
    own process group with its own ``TF_CONFIG``; its output goes to
    ``log_dir/<type>-<index>.log`` and, with ``echo``, to stdout prefixed
    ``[chief-0]``, ``[worker-0]``, ...

    The run succeeds when the chief and all workers exit 0. The evaluator then
    has ``evaluator_grace`` seconds to finish by itself (the Estimator's
    evaluator exits after evaluating the final checkpoint) before it is ended;
    the ps tasks never exit by themselves and are always ended. Ending means
    SIGTERM to the task's process group, then SIGKILL after ``kill_grace`` s.
    No process outlives this call, whatever happens (error, timeout, Ctrl-C,
    SIGTERM to the launcher; an interpreter exit still SIGKILLs via atexit).

    Args:
      task_command: argument list run for every task, e.g.
        ``[sys.executable, "-m", "experiments", "train", "mnist", "--model-dir", d]``.
      workers: number of workers besides the chief (0 or more).
      ps: number of parameter servers.
      evaluator: also run an evaluator task.
      log_dir: folder for the logs; None makes a temporary folder.
      timeout: limit in seconds for the whole run, evaluator grace included.
      host: address to bind; keep the default loopback.
      env: environment of the tasks (default: this process's); TF_CONFIG is set
        per task and PYTHONUNBUFFERED=1 so that lines arrive as printed.
      echo: copy every task's lines to stdout.
      evaluator_grace: seconds the evaluator may run after training succeeded.
      kill_grace: seconds between SIGTERM and SIGKILL.
      tail_lines: how many last log lines an error quotes.

    Returns:
      :class:`ClusterResult`.

    Raises:
      ClusterTaskError: a task (ps and evaluator included) exited non-zero or
        was killed; names the task, its status, log and last lines.
      ClusterTimeoutError: ``timeout`` expired; names the tasks still running.
      ClusterInterrupted: the launcher got SIGTERM/SIGHUP. KeyboardInterrupt
        propagates after all tasks are stopped.
      UsageError: bad arguments.
    """
    if isinstance(task_command, (str, bytes)) or not task_command or not all(
            isinstance(a, (str, os.PathLike)) for a in task_command):
        raise UsageError(
            f"task_command must be a non-empty list of arguments such as [sys.executable, "
            f"'-m', 'experiments', 'train', NAME, ...]; got {task_command!r}.")
    task_command = [os.fspath(a) for a in task_command]
    _check_count("workers", workers, 0)
    _check_count("ps", ps, 0)
    _check_count("tail_lines", tail_lines, 1)
    _check_seconds("timeout", timeout)
    _check_seconds("evaluator_grace", evaluator_grace, allow_zero=True)
    _check_seconds("kill_grace", kill_grace, allow_zero=True)

    if log_dir is None:
        log_dir = tempfile.mkdtemp(prefix="cluster-logs-")
    log_dir = os.path.abspath(os.fspath(log_dir))
    try:
        os.makedirs(log_dir, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create the log folder {log_dir}: {e}.") from e

    ports = free_ports(1 + workers + ps, host)
    cluster = {"chief": [_address(host, ports[0])]}
    if workers:
        cluster["worker"] = [_address(host, p) for p in ports[1:1 + workers]]
    if ps:
        cluster["ps"] = [_address(host, p) for p in ports[1 + workers:]]
    specs = [("chief", 0)] + [("worker", i) for i in range(workers)] + [
        ("ps", i) for i in range(ps)] + ([("evaluator", 0)] if evaluator else [])
    base_env = dict(os.environ if env is None else env)
    base_env["PYTHONUNBUFFERED"] = "1"
    tasks = [_Task(t, i, os.path.join(log_dir, f"{t}-{i}.log"), tail_lines) for t, i in specs]
    echo_out = _Echo(echo)
    logger.info("Local cluster %s%s; logs in %s", _short(cluster, 400),
                " + evaluator" if evaluator else "", log_dir)

    start = time.monotonic()
    error = None
    with _SignalGuard() as guard:
        try:
            for task in tasks:
                _start(task, task_command, cluster, base_env, echo_out)
            error = _supervise(tasks, start + timeout, timeout, evaluator_grace, log_dir)
        finally:
            # Runs on success, failure, timeout, KeyboardInterrupt and ClusterInterrupted.
            guard.cleaning = True
            _stop(tasks, kill_grace)
            for task in tasks:
                if task.reader is not None:
                    task.reader.join(timeout=5)
        if guard.received is not None and error is None:
            error = guard.error()
    wall = time.monotonic() - start
    result = ClusterResult(
        returncodes={t.name: t.poll() for t in tasks},
        log_paths={t.name: t.log_path for t in tasks},
        pids={t.name: t.proc.pid for t in tasks if t.proc is not None},
        ended_by_launcher=tuple(t.name for t in tasks if t.ended_by_launcher),
        wall_time=wall,
        log_dir=log_dir)
    if error is not None:
        error.result = result
        raise error
    logger.info("Local cluster finished in %.1f s.", wall)
    return result


def _start(task, command, cluster, base_env, echo):
    env = dict(base_env)
    env["TF_CONFIG"] = build_tf_config(cluster, task.type, task.index)
    log_file = open(task.log_path, "w", encoding="utf-8")
    try:
        task.proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=env, start_new_session=True)
    except OSError as e:
        log_file.close()
        raise ClusterError(f"could not start task {task.name} ({command[0]!r}): {e}.") from e
    with _LIVE_LOCK:
        _LIVE_GROUPS[task.proc.pid] = task.name
    task.reader = threading.Thread(target=_pump, args=(task, log_file, echo),
                                   name=f"cluster-log-{task.name}", daemon=True)
    task.reader.start()
    logger.info("Started %s (pid %d).", task.name, task.proc.pid)


def _supervise(tasks, deadline, timeout, evaluator_grace, log_dir):
    """Wait for the run's outcome; return the error to raise (None on success).

    Returns rather than raises so the caller can stop everything and attach the
    final result before raising.
    """
    training = [t for t in tasks if t.type in TRAINING_TYPES]
    evaluator = next((t for t in tasks if t.type == "evaluator"), None)
    eval_deadline = None
    while True:
        failed = [t for t in tasks if t.poll() not in (None, 0)]
        if failed:
            first = failed[0]
            # The reader may still hold the last lines of the dead task.
            if first.reader is not None:
                first.reader.join(timeout=2)
            return ClusterTaskError(first.name, first.poll(), list(first.tail), first.log_path,
                                    also_failed=[t.name for t in failed[1:]])
        now = time.monotonic()
        if eval_deadline is None and all(t.poll() == 0 for t in training):
            eval_deadline = now + evaluator_grace
            logger.info("Training tasks finished.")
        if eval_deadline is not None:
            if evaluator is None or evaluator.poll() == 0:
                return None
            if now >= eval_deadline:
                logger.warning("The evaluator did not finish within %.0f s after training; "
                               "ending it.", evaluator_grace)
                return None
        if now >= deadline:
            running = [t for t in tasks if t.running]
            details = "".join(
                f"\nLast lines of {t.name} ({t.log_path}):\n" + "\n".join(
                    f"  | {line}" for line in list(t.tail)[-5:])
                for t in running if t.tail and t.type != "ps")
            return ClusterTimeoutError(
                f"the local cluster did not finish within {timeout:g} s; still running: "
                f"{', '.join(t.name for t in running)}. All tasks have been stopped; logs "
                f"are in {log_dir}.{details}",
                timeout, [t.name for t in running])
        time.sleep(min(0.1, max(deadline - now, 0.01)))
