"""Stopping on SIGTERM or SIGINT without losing the steps since the last
checkpoint.

Cloud and cluster schedulers preempt with SIGTERM and a short grace period.
:class:`PreemptionWatch` turns the signal into a flag that the engines check
after every training step: they save a checkpoint at the current step and
raise :class:`~estimator_keras.errors.Preempted`, which the CLI turns into
exit status 75. Whatever happens, a watchdog ends the process ``grace``
seconds after the signal, so a stuck save cannot outlive the scheduler's
patience.

A task that trains no steps of its own (a parameter server, the evaluator)
stops at once on the signal: it holds nothing a checkpoint would keep.

Example::

    with PreemptionWatch(grace=20) as watch:
        for step in ...:
            train_one_step()
            if watch.requested:
                save_checkpoint(step)
                raise watch.stopped(step)
"""

import logging
import os
import signal
import sys
import threading

from estimator_keras.errors import Preempted

logger = logging.getLogger(__name__)

DEFAULT_GRACE_SECS = 20.0
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class PreemptionWatch:
    """Watches for SIGTERM and SIGINT while training (main thread only).

    Args:
      grace: seconds between the signal and the end of the process, at the
        latest.
      stop_at_once: raise Preempted from the signal handler itself, for tasks
        that run no training steps.
      log: ``fn(str)`` for the lines it writes.
    """

    def __init__(self, grace=DEFAULT_GRACE_SECS, stop_at_once=False, log=None):
        self.grace = float(grace)
        self.stop_at_once = stop_at_once
        self.log = log or logger.warning
        self.signum = None
        self.saved_step = None
        self._event = threading.Event()
        self._finished = threading.Event()
        self._previous = {}

    @property
    def requested(self):
        """True once a signal arrived."""
        return self._event.is_set()

    def __call__(self):
        # TensorFlow's PreemptionCheckpointHandler polls this.
        return self.requested

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                current = signal.getsignal(sig)
                if current is signal.SIG_IGN:
                    continue  # nohup and friends: the caller wants it ignored
                self._previous[sig] = current
                signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            if sig == signal.SIGTERM and self.requested:
                # Preempted and on the way out: a second SIGTERM (a launcher
                # passing the first one on) must not turn the exit into a kill.
                handler = signal.SIG_IGN
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}
        return False

    def _handle(self, signum, frame):
        del frame
        if self.requested:
            if signum == signal.SIGINT:
                # A second Ctrl-C: the user does not want to wait.
                raise KeyboardInterrupt
            return
        self.signum = signum
        self._event.set()
        name = signal.Signals(signum).name
        self.log(f"received {name}: saving a checkpoint at the current step "
                 f"(at most {self.grace:g} s)")
        threading.Thread(target=self._watchdog, name="preemption-watchdog",
                         daemon=True).start()
        if self.stop_at_once:
            raise self.stopped(None)

    def _watchdog(self):
        if self._finished.wait(self.grace):
            return
        if self.saved_step is None:
            self.log(f"no checkpoint could be saved within {self.grace:g} s; the last "
                     f"periodic checkpoint is what a rerun resumes from")
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(Preempted.exit_code)  # no clean-up may run past the grace period

    def finish(self):
        """The process is about to exit by itself: the watchdog may stand down."""
        self._finished.set()

    def stopped(self, step, by_chief=False):
        """The Preempted error to raise after saving at ``step``; ``by_chief``:
        the chief saved it, not this task (None: no step was saved)."""
        self.saved_step = step
        if step is None:
            return Preempted(f"stopped on {self._signal_name()}; this task keeps no "
                             f"checkpoint of its own. Rerun the same command to resume.")
        if by_chief:
            return Preempted(f"stopped at step {step} with the rest of the cluster; the chief "
                             f"saved that step. Rerun the same command to resume.", step=step)
        return Preempted(f"preempted at step {step}; rerun the same command to resume.",
                         step=step)

    def _signal_name(self):
        return signal.Signals(self.signum).name if self.signum else "a signal"
