"""Training progress in a Kubeflow Trainer v2 TrainJob's status.

With Kubeflow Trainer v2.3's ``TrainJobStatus`` feature gate (alpha, off by
default), every trainer pod of a TrainJob gets three variables:
``KUBEFLOW_TRAINER_SERVER_URL`` (the controller's endpoint for this TrainJob's
status), ``KUBEFLOW_TRAINER_SERVER_CA_CERT`` (the CA file of its certificate)
and ``KUBEFLOW_TRAINER_SERVER_TOKEN`` (the path of a projected service-account
token, which the kubelet rotates). :func:`from_environment` returns a
:class:`StatusReporter` where they are set; it sends through the Kubeflow
SDK's ``kubeflow.trainer.update_trainjob_status`` (``pip install -e
'.[kubeflow]'`` in the checkout), which reads the three variables, the CA file
and the token file itself (it re-reads the token every 5 minutes).

What a report holds (``trainerStatus`` of the endpoint's
``UpdateTrainJobStatusRequest``):

* ``progressPercentage``: global step / max_steps, rounded down (a resumed run
  starts at the step it resumes from); 100 once training has ended;
* ``estimatedRemainingSeconds``: the time left at this run's steps/s;
* ``metrics``: ``global_step``, the training ``loss`` of the latest progress
  line and ``eval_NAME`` for every metric of the latest evaluation; values
  written ``%.6g``, names and values clipped to the API's 64 characters, at
  most 256 of them.

How it is sent: the SDK's call is synchronous (a 5 s timeout), does not retry,
and refuses (returning False, as on a failure) a second update within 5 s of
a successful one. So a reporter keeps only the latest report (a newer one
replaces one not sent yet) and sends it from a daemon thread: at least
:data:`MIN_INTERVAL_SECS` after the last delivery when the percentage or the
evaluation changed, :data:`IDLE_INTERVAL_SECS` when only the loss and the time
left did. A failed send is retried with backoff (5 s, doubling up to 60 s). An
endpoint that fails makes one warning line, not one per attempt: the SDK's
own warnings about this reporter's sends are folded into it. Nothing here
raises into training, and no call waits on the network except
:meth:`StatusReporter.finish`, which waits at most :data:`FINISH_WAIT_SECS`.

Example::

    reporter = from_environment(max_steps=5000)     # None outside such a TrainJob
    if reporter is not None:
        with reporter:                               # a Preempted reports the step reached
            ...  # reporter.progress(step, loss, seconds_left) per progress line,
                 # reporter.evaluation(metrics) after each evaluation
            reporter.finish(5000, final_metrics)      # 100%

Sources (read 2026): github.com/kubeflow/trainer at v2.3.0,
``pkg/statusserver/`` (the endpoint: POST, bearer token, 403/422/500 with a
``metav1.Status``), ``pkg/apis/trainer/v1alpha1/trainjob_types.go``
(``TrainerStatus``, ``Metric``: the limits above) and
``pkg/runtime/framework/plugins/trainjobstatus/`` (the variables); the
``kubeflow`` 0.5.0 SDK's ``update_trainjob_status``.

TF-free.
"""

import contextlib
import logging
import math
import os
import re
import threading
import time

from estimator_keras.errors import Preempted

URL_VARIABLE = "KUBEFLOW_TRAINER_SERVER_URL"
CA_VARIABLE = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
TOKEN_VARIABLE = "KUBEFLOW_TRAINER_SERVER_TOKEN"
INSTALL = "pip install -e '.[kubeflow]' (from the package's checkout)"

SDK_THROTTLE_SECS = 5.0
"""The SDK sends nothing within this long of its last successful update."""
SDK_TIMEOUT_SECS = 5.0
"""How long the SDK waits for the server."""
MIN_INTERVAL_SECS = SDK_THROTTLE_SECS + 0.1
"""Between deliveries when the percentage or the evaluation changed."""
IDLE_INTERVAL_SECS = 10.0
"""Between deliveries when only the loss and the time left changed."""
RETRY_SECS = (5.0, 60.0)
"""The first retry after a failed send, and the longest wait between retries."""
FINISH_RETRY_SECS = 1.0
"""Between attempts at the final report."""
FINISH_WAIT_SECS = 12.0
"""What :meth:`StatusReporter.finish` waits at most: the SDK's throttle window,
one request's timeout and 2 s to spare."""
PREEMPTED_WAIT_SECS = 7.0
"""The same after a preemption, whose grace period is running: the throttle
window and a prompt answer."""

# The API's limits (trainer.kubeflow.org/v1alpha1 TrainerStatus and Metric).
MAX_METRICS = 256
MAX_NAME = 64
MAX_VALUE = 64
MAX_SECONDS = 2 ** 31 - 1  # estimatedRemainingSeconds is an int32

logger = logging.getLogger(__name__)
_TRAINJOB = re.compile(r"/namespaces/([^/]+)/trainjobs/([^/]+)/status/?$")
_CAUSE = re.compile(r"\[(?:SSL: \w+|Errno -?\d+)\][^'\"()]*|Read timed out|HTTP \d{3}")


def from_environment(max_steps, log=None, **options):
    """A started :class:`StatusReporter` for a run to ``max_steps`` when
    ``KUBEFLOW_TRAINER_SERVER_URL`` is set, else None. Where it is set but the
    Kubeflow SDK does not import, one warning naming the extra, and None.
    ``log`` takes the reporter's lines (warnings start with "warning: "; by
    default they go to this module's logger); ``options`` go to the reporter."""
    url = os.environ.get(URL_VARIABLE)
    if not url:
        return None
    try:
        # pylint: disable=import-outside-toplevel  (an optional package)
        from kubeflow.trainer import update_trainjob_status
    except ImportError as e:
        _say(log, f"{URL_VARIABLE} is set (a Kubeflow TrainJob with the TrainJobStatus feature "
                  f"gate) but the Kubeflow SDK does not import ({e}): training goes on without "
                  f"progress in the TrainJob's status. For it: {INSTALL}", warning=True)
        return None
    reporter = StatusReporter(max_steps, update_trainjob_status, log=log,
                              target=trainjob_name(url), **options)
    _say(log, f"progress goes to {reporter.target}'s status")
    return reporter


def trainjob_name(url):
    """"TrainJob NAMESPACE/NAME" out of the status endpoint's URL (the URL
    itself when it has another shape)."""
    found = _TRAINJOB.search(url or "")
    return f"TrainJob {found.group(1)}/{found.group(2)}" if found else url


def metric_value(value):
    """A metric value as the API takes it: a string of 1 to 64 characters,
    numbers written compactly (``%.6g``; integers whole); None when empty."""
    if isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, int) or (hasattr(value, "dtype") and value.dtype.kind in "iu"):
        text = str(int(value))
    elif isinstance(value, str):
        text = value
    else:
        try:
            text = "%.6g" % float(value)
        except (TypeError, ValueError):
            text = str(value)
    return text[:MAX_VALUE] or None


def api_metrics(metrics):
    """``{name: value}`` -> ``{name: string}`` within the API's limits: names
    clipped to 64 characters (the first of names that clip alike kept), empty
    names and values left out, at most 256 entries, in the given order."""
    out = {}
    for name, value in metrics.items():
        name = str(name)[:MAX_NAME]
        text = metric_value(value)
        if name and text is not None and name not in out:
            out[name] = text
            if len(out) == MAX_METRICS:
                break
    return out


def _say(log, message, warning=False):
    if log is not None:
        log(("warning: " if warning else "") + message)
    elif warning:
        logger.warning(message)
    else:
        logger.info(message)


def _short(reason):
    """The part of an SDK message that says what failed."""
    found = _CAUSE.search(reason)
    text = found.group(0).strip() if found else reason
    return text if len(text) <= 200 else text[:197] + "..."


class _Report:
    """What one send carries (a snapshot of the reporter's latest numbers)."""

    def __init__(self, seq, percent, seconds_left, metrics, key):
        self.seq, self.percent, self.seconds_left = seq, percent, seconds_left
        self.metrics, self.key = metrics, key
        self.content = (percent, seconds_left, metrics)


class _SendersRecords(logging.Filter):
    """Keeps the SDK's log records made on the sender thread out of the logs
    (the reporter says what failed, once) and remembers their messages."""

    def __init__(self):
        super().__init__()
        self.thread = None
        self.messages = []

    def filter(self, record):
        if record.thread != self.thread:
            return True
        if record.levelno >= logging.WARNING:
            self.messages.append(record.getMessage())
        return False


class StatusReporter:
    """Reports a run's progress into a TrainJob's status from a background
    thread (see the module's notes); every method returns at once but
    :meth:`finish`, and none raises.

    Args:
      max_steps: the step training ends at (over all runs).
      send: ``send(progress_percent, estimated_remaining_seconds, metrics)``
        -> True when delivered: the SDK's ``update_trainjob_status``.
      log: takes the reporter's lines (warnings start with "warning: ");
        None: this module's logger.
      target: what the lines call the TrainJob.
      min_interval, idle_interval: seconds between deliveries when the
        percentage or the evaluation changed, and when nothing but the loss
        and the time left did.
      retry: (first retry, longest wait between retries), in seconds.
      finish_retry: seconds between attempts at the final report.

    Attributes:
      attempts: the sends tried so far (the SDK's throttle holding one back
        counts too).
      deliveries: the reports delivered so far.
    """

    def __init__(self, max_steps, send, *, log=None, target="the TrainJob",
                 min_interval=MIN_INTERVAL_SECS, idle_interval=IDLE_INTERVAL_SECS,
                 retry=RETRY_SECS, finish_retry=FINISH_RETRY_SECS):
        self.max_steps = max(1, int(max_steps))
        self.target = target
        self._send, self._log = send, log
        self._min_interval, self._idle_interval = min_interval, max(idle_interval, min_interval)
        self._retry, self._finish_retry = retry, finish_retry
        self._cond = threading.Condition()
        # The latest numbers; _seq counts their changes, _sent the change delivered.
        self._seq = self._sent = 0
        self._step = self._first = self._loss = self._seconds_left = None
        self._posted_at = 0.0
        self._eval, self._eval_seq = {}, 0
        self._final = self._complete = False
        self._delivered_key = self._delivered_content = None
        # The sender's state.
        self._last_success = self._throttled_at = self._last_attempt = None
        self._failures = 0
        self._outage = self._warned = self._stopping = False
        self._broken = self._complained = False
        self._last_reason = None
        self._records = _SendersRecords()
        self.attempts = self.deliveries = 0
        self._sdk_logger = logging.getLogger(getattr(send, "__module__", None) or __name__)
        self._thread = threading.Thread(target=self._run, name="trainjob-status", daemon=True)
        self._thread.start()

    # -- what training calls (from any thread)

    def progress(self, step, loss=None, seconds_left=None):
        """A progress line: the global step, the training loss, the seconds
        left (None: estimated from the steps/s since the first report)."""
        with self._guard():
            now = time.monotonic()
            step = int(step)
            with self._cond:
                if self._final:
                    return
                if self._first is None:
                    self._first = (step, now)
                elif seconds_left is None and step > self._first[0]:
                    seconds_left = ((self.max_steps - step) * (now - self._first[1])
                                    / (step - self._first[0]))
                self._step = step
                if loss is not None:
                    self._loss = float(loss)
                self._set_seconds_left(seconds_left, now)
                self._changed()

    def evaluation(self, metrics):
        """An evaluation's metrics (with ``global_step``): they replace the
        previous evaluation's."""
        with self._guard():
            with self._cond:
                if self._final:
                    return
                self._take_evaluation(metrics)
                self._changed()

    def finish(self, final_step=None, metrics=None, complete=True, timeout=FINISH_WAIT_SECS):
        """Sends the final report and waits for it at most ``timeout``
        seconds; True when it was delivered. ``complete``: training ended
        (100%, no time left); else it stopped early (a preemption): the
        percentage of ``final_step`` (None: the latest step reported).
        ``metrics``: the final evaluation's, when there is one. Later reports
        are ignored."""
        delivered = False
        with self._guard():
            with self._cond:
                if self._final or self._stopping:
                    return False
                if metrics:
                    self._take_evaluation(metrics)
                if final_step is not None:
                    self._step = int(final_step)
                elif self._step is None:
                    self._step = self.max_steps if complete else 0
                self._final, self._complete = True, complete
                if complete:
                    self._set_seconds_left(0, time.monotonic())
                else:
                    self._seconds_left = None
                self._changed()
                target = self._seq
                deadline = time.monotonic() + timeout
                while self._sent < target and not self._broken:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                delivered = self._sent >= target
                self._stop()
                warned, reason = self._warned and self._outage, self._last_reason
            if not delivered:
                why = f" ({_short(reason)})" if reason else ""
                _say(self._log, f"the final progress report did not reach {self.target}'s "
                                f"status within {timeout:g} s{why}", warning=not warned)
        return delivered

    def close(self):
        """Stops sending; a report not sent yet is dropped."""
        with self._cond:
            self._stop()

    def __enter__(self):
        return self

    def __exit__(self, kind, error, trace):
        """A Preempted run reports the step it reached; any other error
        only stops the reporter. The error goes on."""
        if isinstance(error, Preempted):
            self.finish(error.step, complete=False, timeout=PREEMPTED_WAIT_SECS)
        self.close()
        return False

    # -- the numbers (called holding the lock)

    def _set_seconds_left(self, seconds, now):
        if seconds is not None and math.isfinite(seconds):
            self._seconds_left, self._posted_at = max(0.0, float(seconds)), now
        else:
            self._seconds_left = None

    def _take_evaluation(self, metrics):
        self._eval = {f"eval_{k}": v for k, v in metrics.items() if k != "global_step"}
        self._eval_seq += 1
        if metrics.get("global_step") is not None:
            self._step = max(self._step or 0, int(metrics["global_step"]))

    def _changed(self):
        if not self._stopping:
            self._seq += 1
            self._cond.notify_all()

    def _percent(self):
        if self._final and self._complete:
            return 100
        return min(100, max(0, (self._step or 0) * 100 // self.max_steps))

    def _key(self):
        return (self._percent(), self._eval_seq, self._final)

    def _snapshot(self, now):
        metrics = {}
        if self._step is not None:
            metrics["global_step"] = self._step
        if self._loss is not None:
            metrics["loss"] = self._loss
        metrics.update(sorted(self._eval.items()))
        left = None
        if self._seconds_left is not None:
            left = min(MAX_SECONDS, int(round(max(0.0, self._seconds_left
                                                  - (now - self._posted_at)))))
        return _Report(self._seq, self._percent(), left, api_metrics(metrics), self._key())

    # -- the sender thread

    def _run(self):
        self._records.thread = threading.get_ident()
        self._sdk_logger.addFilter(self._records)
        try:
            while True:
                with self._cond:
                    report = self._due()
                if report is None:
                    return
                ok, reason = self._attempt(report)
                with self._cond:
                    line = self._settle(report, ok, reason)
                if line:
                    _say(self._log, *line)
        except Exception as e:  # pylint: disable=broad-except  (training goes on)
            with self._cond:
                self._broken = True
                self._cond.notify_all()
                complained, self._complained = self._complained, True
            if not complained:
                _say(self._log, f"progress reports to {self.target}'s status stopped: "
                                f"{type(e).__name__}: {e}", warning=True)
        finally:
            self._sdk_logger.removeFilter(self._records)

    def _due(self):
        """Waits until the latest report is due; it, or None to stop. A
        report that says what the status already says counts as delivered."""
        while not self._stopping:
            wait = None
            if self._sent != self._seq:
                now = time.monotonic()
                report = self._snapshot(now)
                if report.content == self._delivered_content:
                    self._sent, self._delivered_key = report.seq, report.key
                    self._cond.notify_all()
                    continue
                wait = self._next_send() - now
                if wait <= 0:
                    return report
            self._cond.wait(wait)
        return None

    def _next_send(self):
        times = [0.0]
        new = self._final or self._key() != self._delivered_key
        if self._last_success is not None:
            times.append(self._last_success + (self._min_interval if new
                                               else self._idle_interval))
        if self._throttled_at is not None:
            times.append(self._throttled_at + self._min_interval)
        if self._failures:
            first, longest = self._retry
            backoff = min(first * 2 ** (self._failures - 1), longest)
            if self._final:
                backoff = min(backoff, self._finish_retry)
            times.append(self._last_attempt + backoff)
        return max(times)

    def _attempt(self, report):
        """Sends ``report``: (delivered, why not: None when the SDK's
        throttle held it back)."""
        del self._records.messages[:]
        self.attempts += 1
        try:
            ok = self._send(report.percent, report.seconds_left, report.metrics)
        except Exception as e:  # pylint: disable=broad-except  (the SDK never raises; be sure)
            return False, f"{type(e).__name__}: {e}"
        if ok:
            return True, None
        if self._records.messages:
            return False, self._records.messages[-1]
        if not os.environ.get(URL_VARIABLE):
            return False, f"{URL_VARIABLE} is no longer set"
        token = os.environ.get(TOKEN_VARIABLE)
        try:
            with open(token, encoding="utf-8") as f:
                readable = bool(f.read().strip())
        except (OSError, TypeError, ValueError):
            readable = False
        if not readable:
            return False, f"no token in {TOKEN_VARIABLE} ({token or 'not set'})"
        return False, None

    def _settle(self, report, ok, reason):
        """Takes in a send's outcome; (line, warning) to say, or None."""
        line = None
        now = time.monotonic()
        self._last_attempt = now
        if ok:
            self._sent, self._delivered_key = report.seq, report.key
            self._delivered_content = report.content
            self._last_success, self._throttled_at, self._failures = now, None, 0
            self.deliveries += 1
            if self._outage:
                self._outage = False
                line = (f"progress reaches {self.target}'s status again", False)
        elif reason is None:
            self._throttled_at = now
        else:
            self._failures += 1
            self._last_reason = reason
            if not self._outage:
                self._outage = True
                line = (f"progress could not be reported to {self.target}'s status "
                        f"({_short(reason)}); training goes on, and reports are retried in "
                        f"the background", not self._warned)
                self._warned = True
        self._cond.notify_all()
        return line

    def _stop(self):
        self._stopping = True
        self._cond.notify_all()

    @contextlib.contextmanager
    def _guard(self):
        """An error in a reporter's method becomes one warning line: a
        report must never fail a training."""
        try:
            yield
        except Exception as e:  # pylint: disable=broad-except
            with self._cond:
                complained, self._complained = self._complained, True
            if not complained:
                _say(self._log, f"progress reports to {self.target}'s status failed: "
                                f"{type(e).__name__}: {e}", warning=True)
