"""TF_CONFIG: validation and construction, without TensorFlow.

:func:`parse_tf_config` reads and checks ``TF_CONFIG`` before anything starts
and returns a :class:`ClusterInfo`; every mistake raises
:class:`~estimator_keras.errors.ClusterConfigError` with a message that quotes
the offending part, so a wrong configuration fails at once instead of hanging.
:func:`build_tf_config` writes the ``TF_CONFIG`` of one task of a cluster.
:func:`short_json` and :func:`describe_cluster` format clusters for the
messages of this package's distribution modules.

Example::

    info = parse_tf_config()              # reads os.environ["TF_CONFIG"]
    info.task_name, info.num_workers      # ("worker-1", 3)
"""

import dataclasses
import json
import os
from collections.abc import Mapping

from estimator_keras.errors import ClusterConfigError

TASK_TYPES = ("chief", "worker", "ps", "evaluator")
TRAINING_TYPES = ("chief", "worker")

_EXAMPLE_TF_CONFIG = ('{"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222"]}, '
                      '"task": {"type": "worker", "index": 0}}')


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


def short_json(obj, limit=120):
    """JSON text of ``obj`` cut to ``limit`` characters, for quoting in messages."""
    try:
        text = json.dumps(obj)
    except (TypeError, ValueError):
        text = repr(obj)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def describe_cluster(cluster):
    """'chief (index 0), worker (indices 0-1)' -- what a cluster has, for messages."""
    parts = []
    for task_type, addresses in cluster.items():
        n = len(addresses)
        parts.append(f"{task_type} (index 0)" if n == 1 else f"{task_type} (indices 0-{n - 1})")
    return ", ".join(parts) if parts else "nothing"


def whole_number(name, text, minimum, maximum=None):
    """``text`` (an environment variable's value) as an int from ``minimum``
    to ``maximum``; ClusterConfigError naming ``name`` otherwise."""
    try:
        value = int(str(text).strip())
    except ValueError:
        value = None
    if value is None or value < minimum or (maximum is not None and value > maximum):
        limit = f"from {minimum} to {maximum}" if maximum is not None else f">= {minimum}"
        raise ClusterConfigError(f"{name}={text!r} is not a whole number {limit}.")
    return value


def check_address(where, address):
    """Raises ClusterConfigError unless ``address`` is "host:port";
    ``where`` names it in the message (e.g. "TF_CONFIG cluster['chief'][0]")."""
    if not isinstance(address, str):
        raise ClusterConfigError(
            f"{where} is {short_json(address)}, not a string; each address must be a "
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
            f"[\"host1:2222\"]}}; got {short_json(cluster)}.")
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
            f"TF_CONFIG cluster lists an 'evaluator' ({short_json(cluster['evaluator'])}); "
            f"TensorFlow requires the evaluator to stay outside the cluster spec: remove "
            f"'evaluator' from 'cluster' and set only the evaluator process's own task to "
            f"{{\"type\": \"evaluator\", \"index\": 0}}, next to the same cluster.")
    checked = {}
    for task_type, addresses in cluster.items():
        if not isinstance(addresses, list):
            raise ClusterConfigError(
                f"TF_CONFIG cluster[{task_type!r}] must be a list of \"host:port\" strings; "
                f"got {short_json(addresses)}.")
        if not addresses:
            raise ClusterConfigError(
                f"TF_CONFIG cluster[{task_type!r}] is an empty list; give at least one "
                f"\"host:port\" address or leave {task_type!r} out.")
        for index, address in enumerate(addresses):
            check_address(f"TF_CONFIG cluster[{task_type!r}][{index}]", address)
        checked[task_type] = list(addresses)

    if "ps" in checked and not any(t in checked for t in TRAINING_TYPES):
        raise ClusterConfigError(
            f"TF_CONFIG cluster has parameter servers (\"ps\": {short_json(checked['ps'])}) but "
            f"no 'chief' or 'worker' to train with them; add a \"chief\": [\"host:port\"] "
            f"task (and workers if wanted).")
    if "chief" not in checked:
        present = [t for t in ("worker", "ps") if t in checked]
        raise ClusterConfigError(
            f"TF_CONFIG cluster has {' and '.join(repr(t) for t in present)} tasks but no "
            f"'chief' (cluster: {short_json(checked)}); this package requires an explicit chief, "
            f"the task that writes checkpoints and summaries: move one worker's address to "
            f"\"chief\": [\"host:port\"].")
    if len(checked["chief"]) > 1:
        raise ClusterConfigError(
            f"TF_CONFIG cluster lists {len(checked['chief'])} chiefs "
            f"({short_json(checked['chief'])}); there must be exactly one: keep one and move the "
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
            f"TF_CONFIG task index must be a non-negative integer; got {short_json(raw)}.")
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
            f"{short_json(config)}. Example: {_EXAMPLE_TF_CONFIG}.")

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
                f"TF_CONFIG names task {short_json(task)} but has no cluster ('cluster' is "
                f"{short_json(raw_cluster)}); give the cluster the task belongs to, e.g. "
                f"{_EXAMPLE_TF_CONFIG}, or unset TF_CONFIG to train locally.")
        return ClusterInfo(cluster={}, task_type="chief", task_index=0)

    cluster = _check_cluster(raw_cluster)
    has = describe_cluster(cluster)
    if task is None:
        raise ClusterConfigError(
            f"TF_CONFIG has a 'cluster' but no 'task'; each process needs \"task\": "
            f"{{\"type\": ..., \"index\": ...}} saying which task it is. The cluster has: {has}.")
    if not isinstance(task, Mapping):
        raise ClusterConfigError(
            f"TF_CONFIG 'task' must be an object like {{\"type\": \"worker\", \"index\": 0}}; "
            f"got {short_json(task)}.")
    task_type = task.get("type")
    if not isinstance(task_type, str) or not task_type:
        raise ClusterConfigError(
            f"TF_CONFIG task {short_json(task)} has no 'type'; it must be one of "
            f"{', '.join(TASK_TYPES)}. The cluster has: {has}.")
    if task_type not in TASK_TYPES:
        raise ClusterConfigError(
            f"TF_CONFIG task type {task_type!r} is unknown; the allowed task types are "
            f"{', '.join(TASK_TYPES)}. The cluster has: {has}.")
    task_index = _check_index(task.get("index", 0))
    if task_type == "evaluator":
        if task_index != 0:
            raise ClusterConfigError(
                f"TF_CONFIG task {short_json(task)}: the evaluator's index must be 0 (TensorFlow "
                f"runs a single evaluator); got {task_index}.")
        return ClusterInfo(cluster=cluster, task_type=task_type, task_index=0)
    if task_type not in cluster:
        raise ClusterConfigError(
            f"TF_CONFIG task {short_json(task)} names type {task_type!r}, which the cluster does "
            f"not have; the cluster has: {has}.")
    if task_index >= len(cluster[task_type]):
        raise ClusterConfigError(
            f"TF_CONFIG task {short_json(task)}: index {task_index} is out of range for "
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

