"""What a local cluster run ends with: :class:`ClusterResult`, or a
:class:`ClusterError` subclass naming the task and how it ended."""

import dataclasses
import signal

from estimator_keras.errors import EstimatorKerasError, Preempted


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


class ClusterPreempted(ClusterInterrupted, Preempted):
    """The launcher received SIGTERM, forwarded it, and the training tasks
    saved a checkpoint and exited with :attr:`Preempted.exit_code` (75):
    rerunning the same command resumes. The CLI exits 75."""


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
      network: "private" when the tasks shared a private network namespace
        with only loopback, "host" when they used this machine's network.
    """

    returncodes: dict
    log_paths: dict
    pids: dict
    ended_by_launcher: tuple
    wall_time: float
    log_dir: str
    network: str = "host"
