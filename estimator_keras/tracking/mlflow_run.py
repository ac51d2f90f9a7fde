"""One MLflow run, written from a background thread that training never waits on.

:class:`MlflowRun` queues what a run records (parameters, tags, metrics,
artifacts, a model version, the end) and a daemon thread sends it through
MLflow's ``MlflowClient``, in order, metrics, parameters and tags batched
(``log_batch``). The thread also imports MLflow (seconds) and creates or
continues the run, so training starts at once.

Bounds: at most ``max_pending`` records wait (more are dropped and counted);
each request waits :data:`~estimator_keras.tracking.settings.CLIENT_DEFAULTS`'
10 s at most, without MLflow's own retries; a failed send is retried with
backoff (1 s doubling up to 30 s) while training goes on. A server that is
down or slow makes one warning line for the whole run; a refusal (a 4xx
answer: a parameter whose value changed, say) drops that record with one
line. :meth:`MlflowRun.finish` waits at most its ``timeout`` for the queue
(:data:`OUTAGE_FINISH_WAIT_SECS` while the store does not answer).

Example::

    run = MlflowRun("http://127.0.0.1:5000", experiment="fashion_mnist_cnn",
                    run_name="fm", on_started=remember_id)
    run.params({"train.batch_size": 64})
    run.metrics({"loss": 0.41}, step=100)
    run.artifacts("runs/fm/export", "export")
    run.finish("FINISHED")

TF-free; MLflow is imported on the thread, and only there.
"""

import collections
import logging
import threading
import time

from estimator_keras.tracking import settings

MAX_PENDING = 10000
"""Records that may wait to be sent; more are dropped (and counted)."""
RETRY_SECS = (1.0, 30.0)
"""The first retry after a failed send, and the longest wait between retries."""
FINISH_WAIT_SECS = 30.0
"""What :meth:`MlflowRun.finish` waits at most for the queue to empty."""
OUTAGE_FINISH_WAIT_SECS = 10.0
"""The same when the store has not answered since its last failure."""
# MLflow's limits per log_batch request.
BATCH_LIMITS = {"metric": 1000, "param": 100, "tag": 100}
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 5000
PARENT_TAG = "mlflow.parentRunId"
# A new experiment holds model training runs: MLflow 3's UI then opens it on
# its runs, not on its GenAI overview.
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}

logger = logging.getLogger(__name__)


class _Op:
    """One queued record: a metric, param or tag (batched), or a call."""

    __slots__ = ("kind", "payload", "what")

    def __init__(self, kind, payload, what=""):
        self.kind, self.payload, self.what = kind, payload, what


class MlflowRun:
    """A run in MLflow's tracking store at ``uri`` (see the module's notes);
    every method but :meth:`finish` returns at once, and none raises.

    Args:
      uri: a resolved tracking URI (:func:`~estimator_keras.tracking.settings.resolve`).
      experiment: the MLflow experiment's name (created when missing).
      run_name: the new run's name.
      run_id: continue this run (a resumed training) instead of starting one;
        where the store no longer has it, a new run starts, with a warning.
      parent_run_id: nest a new run under this one.
      tags: the new run's first tags.
      on_started: called with the run's id once it exists (on the thread).
      log: takes the lines this run has to say (warnings start with
        "warning: "); None: this module's logger.
      max_pending, retry, request_timeout: the bounds above.

    Attributes:
      run_id: the run's id once created or continued, else None.
      dropped: records dropped because the queue was full.
      refused: records the store refused.
    """

    def __init__(self, uri, *, experiment, run_name=None, run_id=None, parent_run_id=None,
                 tags=None, on_started=None, log=None, max_pending=MAX_PENDING,
                 retry=RETRY_SECS):
        self.uri, self.experiment, self.run_name = uri, experiment, run_name
        self.run_id = None
        self._resume_id, self._parent = run_id, parent_run_id
        self._first_tags = dict(tags or {})
        self._on_started, self._log = on_started, log
        self._max_pending, self._retry = max_pending, retry
        self._queue = collections.deque()
        self._cond = threading.Condition()
        self._closing = self._stopped = False
        self._busy = False
        self._outage = self._warned = self._broken = False
        self._last_reason = None
        self.dropped = self.refused = 0
        self.sent = 0
        # MLflow reads these when it sends, so the thread sees them set.
        settings.client_defaults()
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
        call = "log_artifacts" if folder else "log_artifact"
        self._put([_Op("call", (call, local_path, artifact_path),
                       f"the artifacts {local_path}")])

    def register(self, name, artifact_path, on_done=None, run_id=None):
        """Registers ``artifact_path`` of this run (or of ``run_id``) as a
        new version of the registered model ``name`` (created when missing);
        ``on_done(version)`` is called once registered."""
        self._put([_Op("register", (name, artifact_path, on_done, run_id),
                       f"a model version of {name!r}")])

    def tag_run(self, run_id, values):
        """Tags another run (a study's trial), in this run's queue."""
        tags = {str(k): _text(v, MAX_TAG_VALUE) for k, v in values.items()}
        self._put([_Op("other", (run_id, tags), f"tags of run {run_id}")])

    def wait_started(self, timeout):
        """The run's id once it exists, waiting at most ``timeout`` seconds; None
        when it does not exist by then."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.run_id is None and not self._stopped:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return self.run_id

    def finish(self, status="FINISHED", timeout=FINISH_WAIT_SECS):
        """Ends the run with ``status`` (FINISHED, FAILED or KILLED) and waits
        at most ``timeout`` seconds for everything queued to be sent; True
        when it all was. Later records are ignored."""
        self._put([_Op("end", status, "the run's end")], force=True)
        with self._cond:
            if self._outage:
                timeout = min(timeout, OUTAGE_FINISH_WAIT_SECS)
        deadline = time.monotonic() + timeout
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            while (self._queue or self._busy) and not self._broken:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 0.5))
            left_over = len(self._queue) + (1 if self._busy else 0)
            self._stopped = True
            self._cond.notify_all()
            warned, reason = self._warned, self._last_reason
        if left_over:
            why = f" ({reason})" if reason else ""
            self._say(f"{left_over} record(s) of this run did not reach "
                      f"{settings.shown(self.uri)} within {timeout:g} s{why}",
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

    # -- the thread

    def _run(self):
        try:
            client, entities = self._connect()
            if client is None:
                return
            failures = 0
            while True:
                batch = self._take()
                if batch is None:
                    return
                try:
                    try:
                        self._send(client, entities, batch)
                    except Exception as e:  # pylint: disable=broad-except
                        if not _refused(e):
                            raise
                        self._one_by_one(client, entities, batch, e)
                except Exception as e:  # pylint: disable=broad-except  (training goes on)
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
        except Exception as e:  # pylint: disable=broad-except
            self._give_up(f"{type(e).__name__}: {e}")

    def _connect(self):
        """Imports MLflow and creates (or continues) the run; retried like a
        send. (None, None) when MLflow does not import."""
        try:
            # pylint: disable=import-outside-toplevel  (an optional package, on this thread)
            import mlflow
            from mlflow import MlflowClient
            from mlflow import entities
        except ImportError as e:
            self._give_up(f"MLflow does not import ({e}); for it: {settings.INSTALL}")
            return None, None
        if not mlflow.is_tracking_uri_set():
            # MLflow 3.1 (the last for Python 3.9) uploads to a server's
            # mlflow-artifacts: store through the process's tracking URI, not
            # the client's: where the process has none, it is this run's.
            mlflow.set_tracking_uri(self.uri)
        client = MlflowClient(tracking_uri=self.uri)
        failures = 0
        while True:
            with self._cond:
                if self._stopped:
                    return None, None
            try:
                run_id = self._start(client)
                with self._cond:
                    self.run_id = run_id
                    self._cond.notify_all()
                break
            except Exception as e:  # pylint: disable=broad-except
                if _refused(e):
                    self._give_up(_reason(e))
                    return None, None
                failures += 1
                self._failed(e)
                self._sleep(min(self._retry[0] * 2 ** (failures - 1), self._retry[1]))
        if failures:
            self._back()
        if self._on_started is not None:
            self._on_started(self.run_id)
        return client, entities

    def _start(self, client):
        if self._resume_id:
            try:
                run = client.get_run(self._resume_id)
            except Exception as e:  # pylint: disable=broad-except
                if not _refused(e):
                    raise
                self._say(f"run {self._resume_id} is not in {settings.shown(self.uri)} "
                          f"({_reason(e)}): a new run starts", warning=True)
            else:
                client.update_run(run.info.run_id, status="RUNNING")
                return run.info.run_id
        found = client.get_experiment_by_name(self.experiment)
        experiment_id = (found.experiment_id if found is not None else
                         client.create_experiment(self.experiment, tags=EXPERIMENT_TAGS))
        tags = dict(self._first_tags)
        if self._parent:
            tags[PARENT_TAG] = self._parent
        return client.create_run(experiment_id, run_name=self.run_name, tags=tags).info.run_id

    def _send(self, client, entities, batch):
        kind = batch[0].kind
        if kind in BATCH_LIMITS:
            metrics = [entities.Metric(*op.payload) for op in batch if op.kind == "metric"]
            params = [entities.Param(*op.payload) for op in batch if op.kind == "param"]
            tags = [entities.RunTag(*op.payload) for op in batch if op.kind == "tag"]
            client.log_batch(self.run_id, metrics=metrics, params=params, tags=tags)
        elif kind == "call":
            method, local_path, artifact_path = batch[0].payload
            getattr(client, method)(self.run_id, local_path, artifact_path)
        elif kind == "other":
            run_id, tags = batch[0].payload
            client.log_batch(run_id, tags=[entities.RunTag(k, v) for k, v in tags.items()])
        elif kind == "register":
            name, artifact_path, on_done, run_id = batch[0].payload
            run_id = run_id or self.run_id
            try:
                client.get_registered_model(name)
            except Exception as e:  # pylint: disable=broad-except
                if not _refused(e):
                    raise
                client.create_registered_model(name)
            version = client.create_model_version(
                name, source=f"runs:/{run_id}/{artifact_path}", run_id=run_id,
                await_creation_for=0)
            if on_done is not None:
                on_done(version.version)
        elif kind == "end":
            client.set_terminated(self.run_id, status=batch[0].payload)

    def _one_by_one(self, client, entities, batch, error):
        """A refused batch, sent again a record at a time: only what the
        store refuses itself is dropped (a resumed run's parameter whose value
        changed, say), with one line naming them all."""
        if batch[0].kind not in BATCH_LIMITS:
            self._refusal(batch, error)
            return
        refused, reason = [], None
        for op in batch:
            try:
                self._send(client, entities, [op])
            except Exception as e:  # pylint: disable=broad-except
                if not _refused(e):
                    raise
                refused.append(op.payload[0])
                reason = _reason(e)
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
        self._last_reason = _reason(error)
        with self._cond:
            first, self._outage = not self._outage, True
            warn, self._warned = first and not self._warned, True
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
        self._say(f"{settings.shown(self.uri)} refused {what}: {_reason(error)}", warning=True)

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


def _refused(error):
    """True for an answer that a retry would get again (a 4xx but 429)."""
    code = getattr(error, "get_http_status_code", None)
    if code is None:
        return False
    try:
        status = int(code())
    except (TypeError, ValueError):
        return False
    return 400 <= status < 500 and status != 429


def _reason(error):
    text = str(getattr(error, "message", "") or error).strip().splitlines()
    first = text[0] if text else type(error).__name__
    return first if len(first) <= 200 else first[:197] + "..."
