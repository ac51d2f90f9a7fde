"""Child processes that take turns on the CPU, for comparisons that need a
fresh interpreter (Keras 3, another TensorFlow) or a run that must never
restart (time to accuracy).

The parent talks to each child over its stdin and stdout in JSON lines; a
child's own lines carry :data:`MARK` so that whatever TensorFlow or Keras
print on stdout is passed through, not parsed. Only one child works at a
time: the others block reading stdin, so each one's timings see the whole
machine, and turns alternate between them so that the machine's drift hits
all alike.

Parent side::

    child = Child("keras3", [python, "-m", "benchmarks.keras_table", "--serve", ...], env)
    reply = child.request({"op": "measure", "steps": 50})   # one request, one reply
    events = child.turn()                                   # "go", then events up to a pause

Child side: :func:`serve` answers requests; :class:`Turns` pauses a long
run (``turns.pause(step)``) and reports events (``turns.event(...)``),
keeping the run's active time (pauses excluded) in ``turns.active()``.
"""

import json
import os
import signal
import subprocess
import sys
import time

MARK = "@@turns "


class ChildError(RuntimeError):
    """A child process failed or broke the protocol."""


class Child:
    """The parent's handle on one child process."""

    def __init__(self, name, argv, env=None, cwd=None):
        self.name = name
        # stderr is inherited: the child's progress shows as it runs.
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1,
                                     start_new_session=True)
        self.finished = False

    def send(self, message):
        try:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise ChildError(f"{self.name}: cannot write to the child ({e}); exit status "
                             f"{self.proc.poll()}") from None

    def read(self):
        """The child's next message; ChildError when it ends without one."""
        while True:
            line = self.proc.stdout.readline()
            if not line:
                status = self.proc.wait()
                raise ChildError(f"{self.name}: the child ended (status {status}) "
                                 f"without answering")
            if line.startswith(MARK):
                message = json.loads(line[len(MARK):])
                if message.get("event") == "error":
                    raise ChildError(f"{self.name}: {message.get('error')}")
                return message
            sys.stderr.write(line)

    def request(self, message):
        self.send(message)
        return self.read()

    def turn(self):
        """Lets a :class:`Turns` child run until its next pause or its end;
        returns the events it sent, the last being "pause" or "done"."""
        self.send({"op": "go"})
        events = []
        while True:
            message = self.read()
            events.append(message)
            if message.get("event") in ("pause", "done"):
                self.finished = message["event"] == "done"
                return events

    def close(self, timeout=30):
        """Ends the child: closes its stdin, then kills its process group."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()


# --------------------------------------------------------------------------
# Child side


def emit(message):
    sys.stdout.write(MARK + json.dumps(message, default=str) + "\n")
    sys.stdout.flush()


def receive():
    """The parent's next message, or None when it closed our stdin."""
    line = sys.stdin.readline()
    return json.loads(line) if line else None


def serve(handlers, **ready):
    """Says it is ready (with the ``ready`` fields), then answers requests
    ``{"op": name, ...}`` with ``handlers[name](message)`` (a dict) until
    stdin closes; a handler's exception is sent as an error."""
    emit(dict(ready, event="ready"))
    while True:
        message = receive()
        if message is None:
            return
        try:
            emit(handlers[message["op"]](message))
        except Exception as e:  # pylint: disable=broad-except
            emit({"event": "error", "error": f"{type(e).__name__}: {e}"[:1000]})


class Turns:
    """A long run's side of the turn-taking: waits for the first "go", then
    :meth:`pause` hands the CPU back at chosen steps."""

    def __init__(self):
        self._active = 0.0
        self._since = None

    def start(self, **ready):
        """Says it is ready (imports done), then waits for the first "go"."""
        emit(dict(ready, event="ready"))
        if receive() is None:
            sys.exit(0)
        self._since = time.perf_counter()

    def active(self):
        """Seconds this run has worked, pauses excluded."""
        running = time.perf_counter() - self._since if self._since is not None else 0.0
        return self._active + running

    def event(self, **fields):
        emit(dict(fields, active_s=self.active()))

    def pause(self, step):
        self._active = self.active()
        self._since = None
        emit({"event": "pause", "step": step, "active_s": self._active})
        if receive() is None:
            sys.exit(0)
        self._since = time.perf_counter()

    def done(self, **fields):
        emit(dict(fields, event="done", active_s=self.active()))
