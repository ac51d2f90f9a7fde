"""One MLflow run, written from a background thread that training never waits on.

Tracking is split in two: ``estimator_keras.tracking`` is how any run
reaches MLflow (where, through which process, within which bounds), and
what a ``train`` or ``tune`` run records (its config, dataset and command
line, and the versions that the engines' registry entries name) is the
runner's, in ``experiments.training.tracked`` and ``experiments.tuning.tracked``.

:class:`MlflowRun` queues what a run records (parameters, tags, metrics,
artifacts, a model version, the end) and a daemon thread sends it, in order,
metrics, parameters and tags batched (``log_batch``), to a process of its own
(:mod:`~estimator_keras.tracking.sender`) that sends it through MLflow's
``MlflowClient``. That process imports MLflow (seconds) and creates or
continues the run while training starts; this one never imports MLflow and
its environment is left as it is.

Bounds: at most ``max_pending`` records wait (more are dropped and counted);
each request waits :data:`~estimator_keras.tracking.settings.CLIENT_DEFAULTS`'
10 s at most, without MLflow's own retries; a failed send is retried with
backoff (1 s doubling up to 30 s) while training goes on. A server that is
down or slow makes one warning line for the whole run; a refusal (a 4xx
answer: a parameter whose value changed, say) drops that record with one
line. :meth:`MlflowRun.finish` waits at most its ``timeout`` for the queue
(:data:`OUTAGE_FINISH_WAIT_SECS` once the store does not answer), then ends
the sending process, a request in flight with it. A run's end goes before
the uploads queued after it (:meth:`MlflowRun.end`): its status never waits
on them.

Example::

    run = MlflowRun("http://127.0.0.1:5000", experiment="fashion_mnist_cnn",
                    run_name="fm", on_started=remember_id)
    run.params({"train.batch_size": 64})
    run.metrics({"loss": 0.41}, step=100)
    run.end("FINISHED")
    run.artifacts("runs/fm/export", "export")
    run.finish()

TF-free and MLflow-free.
"""

import atexit
import collections
import json
import logging
import os
import subprocess
import threading
import time

from estimator_keras.tracking import sender, settings

MAX_PENDING = 10000
"""Records that may wait to be sent; more are dropped (and counted)."""
RETRY_SECS = (1.0, 30.0)
"""The first retry after a failed send, and the longest wait between retries."""
FINISH_WAIT_SECS = 30.0
"""What :meth:`MlflowRun.finish` waits at most for the queue to empty."""
OUTAGE_FINISH_WAIT_SECS = 10.0
"""The same once the store does not answer (from the start of the wait)."""
# MLflow's limits per log_batch request.
BATCH_LIMITS = {"metric": 1000, "param": 100, "tag": 100}
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 5000
# A new experiment holds model training runs: MLflow 3's UI then opens it on
# its runs, not on its GenAI overview.
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}

logger = logging.getLogger(__name__)


class _Op:
    """One queued record: a metric, param or tag (batched), or a call."""

    __slots__ = ("kind", "payload", "what")

    def __init__(self, kind, payload, what=""):
        self.kind, self.payload, self.what = kind, payload, what


class _Failure(Exception):
    """The sender's answer to a request that failed."""

    def __init__(self, reason, refused=False):
        super().__init__(reason)
        self.reason, self.refused = reason, refused


class MlflowRun:
    """A run in MLflow's tracking store at ``uri`` (see the module's notes);
    every method but :meth:`finish` returns at once, and none raises.

    Args:
      uri: a resolved tracking URI (:func:`~estimator_keras.tracking.settings.resolve`).
      experiment: the MLflow experiment's name (created when missing).
      run_name: the new run's name.
      run_id: continue this run (a resumed training) instead of starting one;
        where the store no longer has it, a new run starts, with a warning.
      resume_status: the status a continued run is set to (None: left as it is).
      new_run: False: where the store does not have ``run_id``, nothing is
        recorded (one line says so) instead of starting a new run.
      parent_run_id: nest a new run under this one.
      tags: the new run's first tags.
      on_started: called with the run's id once it exists (on the thread).
      log: takes the lines this run has to say (warnings start with
        "warning: "); None: this module's logger.
      max_pending, retry: the bounds above.

    Attributes:
      run_id: the run's id once created or continued, else None.
      dropped: records dropped because the queue was full.
      refused: records the store refused.
      sender_pid: the sending process's id once started, else None.
    """

    def __init__(self, uri, *, experiment, run_name=None, run_id=None, resume_status="RUNNING",
                 new_run=True, parent_run_id=None, tags=None, on_started=None, log=None,
                 max_pending=MAX_PENDING, retry=RETRY_SECS):
        self.uri, self.experiment, self.run_name = uri, experiment, run_name
        self.run_id = self.sender_pid = None
        self._resume_id, self._resume_status, self._parent = run_id, resume_status, parent_run_id
        self._new_run = new_run
        self._first_tags = dict(tags or {})
        self._on_started, self._log = on_started, log
        self._max_pending, self._retry = max_pending, retry
        self._queue = collections.deque()
        self._cond = threading.Condition()
        self._closing = self._stopped = self._ended = False
        self._busy = False
        self._outage = self._warned = self._broken = False
        self._last_reason = None
        self._proc = None
        self.dropped = self.refused = 0
        self.sent = 0
        self._thread = threading.Thread(target=self._run, name="mlflow-run", daemon=True)
        self._thread.start()

    # -- what a run records (any thread)

    def params(self, values):
        """Parameters (values written as text, clipped to MLflow's limit)."""
        self._put([_Op("param", (str(k), _text(v, MAX_PARAM_VALUE))) for k, v in values.items()])

    def tags(self, values):
        self._put([_Op("tag", (str(k), _text(v, MAX_TAG_VALUE))) for k, v in values.items()])

    def metrics(self, values, step):
        """Numbers at ``step`` (values that are no number are left out)."""
        now = int(time.time() * 1000)
        ops = []
        for name, value in values.items():
            try:
                number = float(value)
            except (TypeError, ValueError):
                continue
            ops.append(_Op("metric", (str(name), number, now, int(step))))
        self._put(ops)

    def artifacts(self, local_path, artifact_path=None, folder=True):
        """Uploads a folder's files (or one file) under ``artifact_path``."""
        self._put([_Op("artifacts", {"local_path": local_path, "artifact_path": artifact_path,
                                     "folder": folder}, f"the artifacts {local_path}")])

    def register(self, name, artifact_path=None, on_done=None, run_id=None, source=None,
                 once=False):
        """Registers ``artifact_path`` of this run (or of ``run_id``), or the
        URI ``source`` (a ``gs://`` export, say), as a new version of the
        registered model ``name`` (created when missing); ``on_done(version)``
        is called once registered. ``once``: not where the run has a version
        of ``name`` already (``on_done`` is then not called)."""
        self._put([_Op("register", (name, artifact_path, source, run_id, once, on_done),
                       f"a model version of {name!r}")])

    def tag_run(self, run_id, values):
        """Tags another run (a study's trial), in this run's queue."""
        tags = {str(k): _text(v, MAX_TAG_VALUE) for k, v in values.items()}
        self._put([_Op("other", (run_id, tags), f"tags of run {run_id}")])

    def repair(self, local_path=None, artifact_path=None, on_done=None):
        """A continued run (``resume_status=None``) left RUNNING after its
        training ended is set FINISHED, and ``local_path`` uploaded under
        ``artifact_path`` where the run has nothing there; ``on_done(was,
        uploaded)`` is called with what it found."""
        self._put([_Op("repair", (local_path, artifact_path, on_done),
                       "the run's repair")])

    def wait_started(self, timeout):
        """The run's id once it exists, waiting at most ``timeout`` seconds,
        less where the store failed to answer; None when it does not exist
        by then."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.run_id is None and not self._stopped and not self._outage:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return self.run_id

    def end(self, status="FINISHED"):
        """Ends the run with ``status`` (FINISHED, FAILED or KILLED) before
        what is queued after this call: records may follow (an export's
        upload), and the run's status does not wait for them."""
        with self._cond:
            if self._ended:
                return
            self._ended = True
        self._put([_Op("end", status, "the run's end")], force=True)

    def finish(self, status="FINISHED", timeout=FINISH_WAIT_SECS):
        """Ends the run with ``status`` unless :meth:`end` did (None: its
        status is left), and waits at most ``timeout`` seconds for everything
        queued to be sent (less once the store does not answer), then stops
        the sender; True when it all was sent. Later records are ignored."""
        if status:
            self.end(status)
        began = time.monotonic()
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            while (self._queue or self._busy) and not self._broken:
                limit = min(timeout, OUTAGE_FINISH_WAIT_SECS) if self._outage else timeout
                left = began + limit - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 0.5))
            left_over = len(self._queue) + (1 if self._busy else 0)
            waited = min(timeout, OUTAGE_FINISH_WAIT_SECS) if self._outage else timeout
            self._stopped = True
            self._cond.notify_all()
            warned, reason = self._warned, self._last_reason
        # A request in flight (an upload that stalls) ends with the sender.
        self._stop_sender(kill=bool(left_over))
        self._thread.join(timeout=5)
        if left_over:
            why = f" ({reason})" if reason else ""
            self._say(f"{left_over} record(s) of this run did not reach "
                      f"{settings.shown(self.uri)} within {waited:g} s{why}",
                      warning=not warned)
        if self.dropped:
            self._say(f"{self.dropped} record(s) were dropped: more than {self._max_pending} "
                      f"waited to be sent", warning=not warned)
        return not left_over and not self._broken

    # -- the queue

    def _put(self, ops, force=False):
        if not ops:
            return
        with self._cond:
            if self._stopped or (self._closing and not force):
                return
            room = self._max_pending - len(self._queue)
            if not force and room < len(ops):
                self.dropped += len(ops) - max(room, 0)
                ops = ops[:max(room, 0)]
            self._queue.extend(ops)
            self._cond.notify_all()

    def _take(self):
        """The next request: a batch of metrics/params/tags, or one call."""
        with self._cond:
            # Once stopped (finish's wait is over), nothing more is sent.
            while not self._queue and not self._stopped:
                self._cond.wait()
            if self._stopped:
                return None
            head = self._queue[0]
            if head.kind not in BATCH_LIMITS:
                self._busy = True
                return [head]
            batch, counts = [], collections.Counter()
            for op in self._queue:
                if op.kind not in BATCH_LIMITS or counts[op.kind] == BATCH_LIMITS[op.kind]:
                    break
                counts[op.kind] += 1
                batch.append(op)
            self._busy = True
            return batch

    def _done(self, count):
        with self._cond:
            for _ in range(count):
                self._queue.popleft()
            self._busy = False
            self._cond.notify_all()

    # -- the sender

    def _start_sender(self):
        """Starts the sending process and waits for it to import MLflow;
        False (having said why) when it cannot."""
        env = sender.environment(self.uri, os.environ, settings.CLIENT_DEFAULTS)
        with self._cond:
            if self._stopped:
                return False
            try:
                # A session of its own: a SIGTERM or Ctrl-C to training's
                # process group leaves it to send the run's end.
                self._proc = subprocess.Popen(
                    sender.command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                    text=True, encoding="utf-8", start_new_session=True)
            except OSError as e:
                self._proc = None
                failed = f"the MLflow sender does not start ({e})"
            else:
                failed = None
                self.sender_pid = self._proc.pid
                atexit.register(self._stop_sender, True)
        if failed:
            self._give_up(failed)
            return False
        try:
            self._call(None)
        except _Failure as e:
            if not self._gone(e):
                self._give_up(f"{e.reason}; for it: {settings.INSTALL}")
            return False
        return True

    def _call(self, op, **fields):
        """One request to the sender (None: read its first answer); its answer."""
        proc = self._proc
        try:
            if op is not None:
                proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
                proc.stdin.flush()
            line = proc.stdout.readline()
        except (OSError, ValueError) as e:
            line, why = "", e
        else:
            why = None
        if not line:
            code = proc.poll()
            raise _Failure("the MLflow sender ended" + (f" (exit {code})" if code else "") +
                           (f": {why}" if why else ""), refused=None)
        answer = json.loads(line)
        if "error" in answer:
            raise _Failure(answer["error"], bool(answer.get("refused")))
        return answer["ok"]

    def _stop_sender(self, kill=False):
        """Ends the sender: at once (``kill``), else once it has read its
        input's end."""
        with self._cond:
            proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        if not kill:
            try:
                proc.stdin.close()
                proc.wait(timeout=5)
                return
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        proc.kill()
        proc.wait()

    # -- the thread

    def _run(self):
        try:
            if not self._start_sender() or not self._connect():
                return
            failures = 0
            while True:
                batch = self._take()
                if batch is None:
                    return
                try:
                    try:
                        self._send(batch)
                    except _Failure as e:
                        if not e.refused:
                            raise
                        self._one_by_one(batch, e)
                except _Failure as e:  # training goes on
                    if self._gone(e):
                        return
                    failures += 1
                    self._failed(e)
                    with self._cond:
                        self._busy = False
                        self._cond.notify_all()
                    self._sleep(min(self._retry[0] * 2 ** (failures - 1), self._retry[1]))
                    continue
                if failures or self._outage:
                    self._back()
                failures = 0
                self.sent += len(batch)
                self._done(len(batch))
        except Exception as e:  # pylint: disable=broad-except  (training goes on)
            self._give_up(f"{type(e).__name__}: {e}")
        finally:
            self._stop_sender()

    def _gone(self, failure):
        """True where the sender ended: stopped by :meth:`finish`, or by
        itself (said once)."""
        if failure.refused is not None:
            return False
        with self._cond:
            stopped = self._stopped
        if not stopped:
            self._give_up(failure.reason)
        return True

    def _connect(self):
        """Creates (or continues) the run; retried like a send. False when it
        cannot."""
        failures = 0
        while True:
            with self._cond:
                if self._stopped:
                    return False
            try:
                started = self._call(
                    "start", experiment=self.experiment, run_name=self.run_name,
                    resume_id=self._resume_id, parent=self._parent, tags=self._first_tags,
                    experiment_tags=EXPERIMENT_TAGS, status=self._resume_status,
                    create=self._new_run)
                break
            except _Failure as e:
                if self._gone(e):
                    return False
                if e.refused:
                    self._give_up(e.reason)
                    return False
                failures += 1
                self._failed(e)
                self._sleep(min(self._retry[0] * 2 ** (failures - 1), self._retry[1]))
        if started["run_id"] is None:
            self._say(f"run {self._resume_id} is not in {settings.shown(self.uri)} "
                      f"({started['missing']}): nothing is recorded")
            with self._cond:
                self._stopped = True
                self._queue.clear()
                self._cond.notify_all()
            return False
        if started.get("missing"):
            self._say(f"run {self._resume_id} is not in {settings.shown(self.uri)} "
                      f"({started['missing']}): a new run starts", warning=True)
        with self._cond:
            self.run_id = started["run_id"]
            self._cond.notify_all()
        if failures:
            self._back()
        if self._on_started is not None:
            self._on_started(self.run_id)
        return True

    def _send(self, batch):
        kind, payload = batch[0].kind, batch[0].payload
        if kind in BATCH_LIMITS:
            self._call("batch", run_id=self.run_id,
                       **{f"{k}s": [op.payload for op in batch if op.kind == k]
                          for k in BATCH_LIMITS})
        elif kind == "artifacts":
            self._call("artifacts", run_id=self.run_id, **payload)
        elif kind == "other":
            run_id, tags = payload
            self._call("batch", run_id=run_id, tags=list(tags.items()))
        elif kind == "register":
            name, artifact_path, source, run_id, once, on_done = payload
            run_id = run_id or self.run_id
            registered = self._call("register", name=name, run_id=run_id, once=once,
                                    source=source or f"runs:/{run_id}/{artifact_path}")
            if on_done is not None and registered["new"]:
                on_done(registered["version"])
        elif kind == "repair":
            local_path, artifact_path, on_done = payload
            found = self._call("repair", run_id=self.run_id, local_path=local_path,
                               artifact_path=artifact_path)
            if on_done is not None:
                on_done(found["was"], found["uploaded"])
        elif kind == "end":
            self._call("end", run_id=self.run_id, status=payload)

    def _one_by_one(self, batch, error):
        """A refused batch, sent again a record at a time: only what the
        store refuses itself is dropped (a resumed run's parameter whose value
        changed, say), with one line naming them all."""
        if batch[0].kind not in BATCH_LIMITS:
            self._refusal(batch, error)
            return
        refused, reason = [], None
        for op in batch:
            try:
                self._send([op])
            except _Failure as e:
                if not e.refused:
                    raise
                refused.append(op.payload[0])
                reason = e.reason
        if refused:
            self.refused += len(refused)
            self._say(f"{settings.shown(self.uri)} kept its recorded values of "
                      f"{', '.join(refused[:10])}{' ...' if len(refused) > 10 else ''}: {reason}")

    # -- what it says

    def _say(self, message, warning=False):
        if self._log is not None:
            self._log(("warning: " if warning else "") + message)
        elif warning:
            logger.warning(message)
        else:
            logger.info(message)

    def _failed(self, error):
        self._last_reason = error.reason
        with self._cond:
            first, self._outage = not self._outage, True
            warn, self._warned = first and not self._warned, True
            self._cond.notify_all()
        if warn:
            self._say(f"tracking to {settings.shown(self.uri)} failed ({self._last_reason}); "
                      f"training goes on, and the records are retried in the background",
                      warning=True)

    def _back(self):
        with self._cond:
            was, self._outage = self._outage, False
        if was:
            self._say(f"tracking reaches {settings.shown(self.uri)} again")

    def _refusal(self, batch, error):
        self.refused += len(batch)
        what = batch[0].what or (", ".join(op.payload[0] for op in batch[:3]))
        self._say(f"{settings.shown(self.uri)} refused {what}: {error.reason}", warning=True)

    def _give_up(self, reason):
        with self._cond:
            self._broken, self._stopped = True, True
            self._queue.clear()
            self._busy = False
            self._cond.notify_all()
            warn, self._warned = not self._warned, True
        self._say(f"tracking to {settings.shown(self.uri)} stopped: {reason}; training goes on",
                  warning=warn)

    def _sleep(self, seconds):
        """Waits ``seconds``, less when the run is finishing (its deadline is
        short)."""
        deadline = time.monotonic() + seconds
        with self._cond:
            while not self._stopped:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(min(left, 0.25 if self._closing else left))
                if self._closing:
                    deadline = min(deadline, time.monotonic() + 1.0)


def _text(value, limit):
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
