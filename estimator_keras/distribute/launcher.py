"""A local cluster launcher: one process per task on 127.0.0.1, without TensorFlow.

:func:`launch_local_cluster` runs one command per task of a chief / worker /
ps / evaluator cluster, each with its own ``TF_CONFIG``, streams their logs,
and ends every process it started, whatever happens; it returns a
:class:`ClusterResult` or raises a :class:`ClusterError` subclass that names
the failing task. :func:`free_ports` reserves the ports and
:func:`describe_returncode` words an exit status.

Example::

    result = launch_local_cluster(
        [sys.executable, "-m", "experiments", "train", "mnist", "--model-dir", d],
        workers=1, ps=1, evaluator=True)
    result.returncodes    # {"chief-0": 0, "worker-0": 0, "ps-0": -15, "evaluator-0": 0}
"""

import atexit
import collections
import contextlib
import ipaddress
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from estimator_keras import io
from estimator_keras.distribute import netns
from estimator_keras.distribute.outcomes import (  # noqa: F401 (re-exported)
    ClusterError, ClusterInterrupted, ClusterPreempted, ClusterResult, ClusterTaskError,
    ClusterTimeoutError, describe_returncode)
from estimator_keras.distribute.tf_config import TRAINING_TYPES, build_tf_config, short_json
from estimator_keras.distribute.preemption import DEFAULT_GRACE_SECS
from estimator_keras.errors import Preempted, UsageError

logger = logging.getLogger(__name__)

# Seconds past the preemption grace for a task's process to end after its
# own watchdog fired (interpreter and TensorFlow teardown).
PREEMPTION_MARGIN = 5.0

NETWORKS = ("auto", "private", "host")
"""Values of ``network``: a private namespace where possible, always, never."""

ALL_INTERFACES_WARNING = (
    "note: the tasks use this machine's network (network 'host'), and TensorFlow's task "
    "servers listen on every network interface, not only on 127.0.0.1: TensorFlow "
    "2.15-2.21 bind the port of each TF_CONFIG address as 0.0.0.0 (and [::]) and have no "
    "setting for the address. Anyone who can reach these ports while the cluster runs can "
    "run TensorFlow operations as you, reading and writing your files. Use it on machines "
    "whose ports are firewalled or whose network only you use.")
"""Logged at a launch with ``network="host"``."""

PRIVATE_NETWORK_NOTE = (
    "The tasks run in a private network namespace that has only loopback: their servers "
    "(TensorFlow's task servers, JAX's coordinator) cannot be reached from other machines or "
    "from this machine's own network, and the tasks cannot reach the network either.")
"""Logged (INFO) at a launch whose tasks got a private network namespace."""

FALLBACK_WARNING = (
    "WARNING: the tasks run in this machine's network, not in a private network namespace, "
    "because {reason}. TensorFlow's task servers listen on every network interface and run, "
    "unauthenticated, whatever they are sent: while the cluster runs, anyone who can reach "
    "this machine's ports can run TensorFlow operations as you, reading and writing your "
    "files. Run it on a machine whose ports are firewalled, or where the kernel allows "
    "(unprivileged user and) network namespaces; network 'host' (`cluster --network host`) "
    "chooses this network knowingly.")
"""Logged when ``network="auto"`` cannot give the tasks a private namespace."""


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
        signal_group(pgid, signal.SIGKILL)


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
        # A task of a cluster names itself in its own messages already.
        tag = f"[{prefix}] "
        text = line if line.startswith(tag) else tag + line
        with self.lock:
            try:
                sys.stdout.write(text + "\n")
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


def signal_group(pgid, sig):
    """Sends ``sig`` to the process group ``pgid`` (a child started with
    ``start_new_session``: its pid); a group that is gone is no error."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _terminate(tasks, grace):
    """SIGTERM the running tasks' groups and wait up to ``grace`` s for them."""
    for t in tasks:
        if t.proc.poll() is None:
            t.ended_by_launcher = True
            signal_group(t.proc.pid, signal.SIGTERM)
    end = time.monotonic() + grace
    while any(t.proc.poll() is None for t in tasks) and time.monotonic() < end:
        time.sleep(0.05)


def _stop(tasks, grace, preemption_grace=None):
    """SIGTERM the running tasks' groups, SIGKILL what is left after ``grace`` s, reap all.

    With ``preemption_grace`` the chief, workers and evaluator get SIGTERM
    first and that long to save a checkpoint and exit, while the ps tasks,
    which hold the variables the chief saves, keep running until then.

    SIGKILL always follows: MultiWorkerMirroredStrategy installs its own SIGTERM
    handler, so a task may survive SIGTERM.
    """
    started = [t for t in tasks if t.proc is not None]
    if preemption_grace is not None:
        _terminate([t for t in started if t.type != "ps"], preemption_grace)
    _terminate(started, grace)
    for t in started:
        # Also for leaders that exited: their children may still hold the group.
        signal_group(t.proc.pid, signal.SIGKILL)
    for t in started:
        try:
            t.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            logger.error("Task %s (pid %d) did not die after SIGKILL.", t.name, t.proc.pid)
            continue
        with _LIVE_LOCK:
            _LIVE_GROUPS.pop(t.proc.pid, None)


def _preempted(tasks):
    """True when the chief exited 75 and every other training task 75 or 0."""
    codes = {t.name: t.poll() for t in tasks if t.type in TRAINING_TYPES}
    return (codes.get("chief-0") == Preempted.exit_code
            and all(c in (0, Preempted.exit_code) for c in codes.values()))


def _preemption_error(cause, tasks):
    """ClusterPreempted when the tasks' exit statuses say so, else the
    ClusterTaskError of the first training task that did not save and exit."""
    if _preempted(tasks):
        return ClusterPreempted(
            f"{cause}; the training tasks saved a checkpoint and exited with status "
            f"{Preempted.exit_code}. Rerun the same command to resume.")
    training = [t for t in tasks if t.type in TRAINING_TYPES]
    failed = [t for t in training if t.poll() not in (0, Preempted.exit_code)]
    culprit = (failed or [t for t in training if t.poll() != 0] or training)[0]
    return ClusterTaskError(culprit.name, culprit.poll(), list(culprit.tail),
                            culprit.log_path)


class _TaskPreempted:
    """What _supervise returns when training tasks exited 75 by themselves."""

    def __init__(self, names):
        self.names = names


class _SignalGuard:
    """Turns SIGTERM/SIGHUP into ClusterInterrupted in the main thread while active."""

    def __init__(self):
        self.previous = {}
        self.received = None
        self.cleaning = False

    def error(self, tasks=None):
        name = signal.Signals(self.received).name
        if tasks is not None and _preempted(tasks):
            return _preemption_error(f"the launcher received {name} and passed it on", tasks)
        return ClusterInterrupted(f"the launcher received {name}; all tasks were stopped.")

    def _handler(self, signum, frame):
        first = self.received is None
        if first:
            self.received = signum
        # Never interrupt the cleanup itself: it is what ends the tasks.
        if first and not self.cleaning:
            raise self.error()

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            # A signal the caller ignores (nohup) stays ignored.
            self.previous = {sig: signal.signal(sig, self._handler)
                             for sig in (signal.SIGTERM, signal.SIGHUP)
                             if signal.getsignal(sig) is not signal.SIG_IGN}
        return self

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
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
                         evaluator_grace=120.0, kill_grace=5.0, tail_lines=20,
                         preemption_grace=DEFAULT_GRACE_SECS, network="auto"):
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

    When the launcher itself gets SIGTERM or SIGHUP (a preemption), it
    passes SIGTERM on to the chief, workers and evaluator and gives them
    ``preemption_grace`` + :data:`PREEMPTION_MARGIN` seconds to save a
    checkpoint and exit before the ps tasks are ended and SIGKILL follows.

    TensorFlow's servers listen on all interfaces whatever ``host`` is and run
    any graph they are sent. With ``network="auto"`` (the default) all tasks
    therefore share one private network namespace that has only loopback,
    where this system allows one (Linux: as root, or where unprivileged user
    namespaces are allowed); nothing outside it can connect to their ports,
    and the tasks reach nothing outside it either (no ``gs://`` paths).
    Where it cannot be made, the tasks use this machine's network and
    :data:`FALLBACK_WARNING` says why.

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
      preemption_grace: seconds the tasks get to checkpoint after the
        launcher is sent SIGTERM or SIGHUP (pass the tasks' own
        ``--preemption-grace``).
      network: "auto" (a private namespace where possible, else this
        machine's network with a warning), "private" (a private namespace or
        a ClusterError) or "host" (this machine's network, as a cluster across
        machines needs; logs :data:`ALL_INTERFACES_WARNING`). A private
        namespace needs a loopback ``host``.

    Returns:
      :class:`ClusterResult`.

    Raises:
      ClusterTaskError: a task (ps and evaluator included) exited non-zero or
        was killed; names the task, its status, log and last lines.
      ClusterTimeoutError: ``timeout`` expired; names the tasks still running.
      ClusterPreempted: the launcher got SIGTERM/SIGHUP and the training
        tasks exited 75 after saving a checkpoint.
      ClusterInterrupted: the launcher got SIGTERM/SIGHUP otherwise.
        KeyboardInterrupt propagates after all tasks are stopped.
      ClusterError: ``network="private"`` and no private namespace can be made.
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
    _check_seconds("preemption_grace", preemption_grace)
    if network not in NETWORKS:
        raise UsageError(f"network must be one of {', '.join(NETWORKS)}; got {network!r}.")
    if network == "private" and not _is_loopback(host):
        raise UsageError(f"network 'private' has only loopback, so host must be a loopback "
                         f"address such as 127.0.0.1; got {host!r}.")

    if log_dir is None:
        # Owner-only, as logs in a shared temporary folder should be.
        log_dir = tempfile.mkdtemp(prefix="cluster-logs-")
    log_dir = os.path.abspath(os.fspath(log_dir))
    try:
        io.makedirs(log_dir)
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
    tasks = [_Task(t, i, io.join(log_dir, f"{t}-{i}.log"), tail_lines) for t, i in specs]
    echo_out = _Echo(echo)
    logger.info("Local cluster %s%s; logs in %s", short_json(cluster, 400),
                " + evaluator" if evaluator else "", log_dir)
    namespace = _private_network(network, host)

    start = time.monotonic()
    error = None
    with _SignalGuard() as guard:
        try:
            try:
                # Every task has entered the namespace once started; it lives
                # as long as one of them does.
                with namespace or contextlib.nullcontext():
                    for task in tasks:
                        _start(task, task_command, cluster, base_env, echo_out, namespace)
                error = _supervise(tasks, start + timeout, timeout, evaluator_grace, log_dir)
            except ClusterInterrupted:
                pass  # guard.received says which signal; the tasks' outcome decides below
        finally:
            # Runs on success, failure, timeout, KeyboardInterrupt and ClusterInterrupted.
            guard.cleaning = True
            preempting = isinstance(error, _TaskPreempted) or (
                guard.received is not None and error is None)
            _stop(tasks, kill_grace,
                  preemption_grace + PREEMPTION_MARGIN if preempting else None)
            for task in tasks:
                if task.reader is not None:
                    task.reader.join(timeout=5)
        if isinstance(error, _TaskPreempted):
            error = _preemption_error(
                f"task {', '.join(error.names)} exited with status {Preempted.exit_code} "
                f"(preempted); the launcher passed SIGTERM on to the others", tasks)
        elif guard.received is not None and error is None:
            error = guard.error(tasks)
    wall = time.monotonic() - start
    result = ClusterResult(
        returncodes={t.name: t.poll() for t in tasks},
        log_paths={t.name: t.log_path for t in tasks},
        pids={t.name: t.proc.pid for t in tasks if t.proc is not None},
        ended_by_launcher=tuple(t.name for t in tasks if t.ended_by_launcher),
        wall_time=wall,
        log_dir=log_dir,
        network="host" if namespace is None else "private")
    if error is not None:
        error.result = result
        raise error
    return result


def _is_loopback(host):
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _private_network(network, host):
    """The tasks' :class:`netns.Namespace`, or None for this machine's
    network; logs which one they get."""
    if network == "host":
        logger.warning(ALL_INTERFACES_WARNING)
        return None
    if not _is_loopback(host):
        logger.warning(FALLBACK_WARNING.format(
            reason=f"host {host} is not a loopback address and a private namespace has only "
                   f"loopback"))
        return None
    try:
        namespace = netns.create()
    except netns.NamespaceUnavailable as e:
        if network == "private":
            raise ClusterError(f"network 'private': cannot give the tasks a private network "
                               f"namespace: {e}.") from e
        logger.warning(FALLBACK_WARNING.format(reason=f"it cannot be made here: {e}"))
        return None
    logger.info(PRIVATE_NETWORK_NOTE)
    return namespace


def _start(task, command, cluster, base_env, echo, namespace=None):
    env = dict(base_env)
    env["TF_CONFIG"] = build_tf_config(cluster, task.type, task.index)
    pass_fds = ()
    if namespace is not None:
        # The helper that enters the namespace execs the program by its path.
        program = shutil.which(command[0], path=env.get("PATH", os.defpath))
        if program is None:
            raise ClusterError(f"could not start task {task.name} ({command[0]!r}): no "
                               f"executable file of that name.")
        command = namespace.wrap([os.path.abspath(program), *command[1:]])
        pass_fds = namespace.fds
    log_file = io.open_file(task.log_path, "w")
    try:
        task.proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=env, start_new_session=True, pass_fds=pass_fds)
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
    """Wait for the run's outcome; return the error to raise (None on success,
    a _TaskPreempted when training tasks exited 75 by themselves).

    Returns rather than raises so the caller can stop everything and attach the
    final result before raising.
    """
    training = [t for t in tasks if t.type in TRAINING_TYPES]
    evaluator = next((t for t in tasks if t.type == "evaluator"), None)
    eval_deadline = None
    while True:
        failed = [t for t in tasks if t.poll() not in (None, 0)]
        if failed and all(t.type in TRAINING_TYPES and t.poll() == Preempted.exit_code
                          for t in failed):
            # A preempted training task saved a checkpoint; the others get
            # the same chance before anything is killed.
            return _TaskPreempted([t.name for t in failed])
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
