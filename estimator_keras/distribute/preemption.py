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

In a synchronous cluster (MultiWorkerMirroredStrategy) every worker must
stop after the same step, or the others wait forever in their next
all-reduce: :class:`StopAgreement` has the workers agree on it, whichever of
them was signalled (the estimator engine's tasks send their flag in each
step's gradient sum instead: ``engines.estimator.sums.PreemptionHook``), and
:meth:`PreemptionWatch.stop_with_others` makes a task that learns of
another's signal stop as if it had got one.

When the ``with`` block ends, the signal handlers the process had before
are back and the watchdog stands down: a library caller that catches
Preempted goes on as before. A program that exits on Preempted (the
command line) calls :func:`exit_on_preemption` first: then SIGTERM stays
ignored on the way out.

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
import time

from estimator_keras.distribute import groups
from estimator_keras.errors import Preempted

logger = logging.getLogger(__name__)

DEFAULT_GRACE_SECS = 20.0
SIGNALS = (signal.SIGTERM, signal.SIGINT)
# About how often the workers of a synchronous cluster compare notes.
AGREE_EVERY_SECS = 1.0
# Whether the process ends once Preempted is raised (see exit_on_preemption).
_EXITING = {"on_preemption": False}


def exit_on_preemption(exiting=True):
    """Says that this process exits once Preempted is raised (the command
    line does): after a preemption SIGTERM then stays ignored, so that a
    second one (a launcher passing the first one on) cannot turn the exit
    status 75 into a kill. Without it, a watch puts back the handlers the
    process had."""
    _EXITING["on_preemption"] = bool(exiting)


class PreemptionWatch:
    """Watches for SIGTERM and SIGINT while training (main thread only).

    Args:
      grace: seconds between the signal and the end of the process, at the
        latest.
      stop_at_once: raise Preempted from the signal handler itself, for tasks
        that run no training steps.
      log: ``fn(str)`` for the lines it writes.
      saves: whether this task writes the checkpoint (a single process, or
        the chief of a cluster). Such a task that the watchdog ends before it
        saved exits 1: status 75 promises the current step, and only the
        task that writes it knows whether it was kept.
      final_checkpoint: ``fn() -> step or None``: the step of a checkpoint
        of the run's last step, once one is saved. A signal that comes while
        the run evaluates or exports after that step has nothing to save:
        the watchdog then ends the process with status 75, since the rerun
        that finishes the export trains nothing.
    """

    def __init__(self, grace=DEFAULT_GRACE_SECS, stop_at_once=False, log=None, saves=True,
                 final_checkpoint=None):
        self.grace = float(grace)
        self.stop_at_once = stop_at_once
        self.saves = saves
        self.final_checkpoint = final_checkpoint
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
        exiting = self.requested and _EXITING["on_preemption"]
        for sig, handler in self._previous.items():
            if sig == signal.SIGTERM and exiting:
                # On the way out: a second SIGTERM must not turn the exit
                # into a kill.
                handler = signal.SIG_IGN
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}
        if not exiting:
            # The caller has control again: nothing may end the process now.
            self.finish()
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

    def stop_with_others(self):
        """Another task of a synchronous cluster was signalled, and this one
        stops after the same step: as if it had been signalled too (the
        same grace, and Preempted once it stops)."""
        if self.requested:
            return
        self._event.set()
        self.log(f"another task of the cluster received a signal: stopping with it after "
                 f"this step (at most {self.grace:g} s)")
        threading.Thread(target=self._watchdog, name="preemption-watchdog",
                         daemon=True).start()

    def _watchdog(self):
        if self._finished.wait(self.grace):
            return
        final = self._final_step() if self.saved_step is None else None
        if final is not None:
            self.saved_step = final
            self.log(f"stopped {self.grace:g} s after the signal, while evaluating or exporting "
                     f"after the last step: the checkpoint of step {final} is saved; rerun the "
                     f"same command to write what was cut short (the export)")
        elif self.saved_step is None:
            self.log(f"no checkpoint could be saved within {self.grace:g} s; the last "
                     f"periodic checkpoint is what a rerun resumes from")
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        kept = self.saved_step is not None or self.stop_at_once or not self.saves
        os._exit(Preempted.exit_code if kept else 1)  # no clean-up past the grace period

    def _final_step(self):
        if self.final_checkpoint is None or not self.saves:
            return None
        try:
            return self.final_checkpoint()
        except Exception:  # pylint: disable=broad-except  (the watchdog must still end it)
            return None

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


class StopAgreement:
    """Tells each worker of a synchronous cluster when to stop for a
    preemption: after the same step on every worker, whichever was signalled.

    Every so many steps (about :data:`AGREE_EVERY_SECS` of training) the
    workers all-reduce whether they have seen a signal and how many steps
    they propose until the next time. Both numbers come out of the
    all-reduce the same on every worker, so every worker compares notes at
    the same steps and all stop together. (TensorFlow's
    PreemptionCheckpointHandler agrees through the coordination service
    instead, but switches itself off on GCE CPU and TPU VMs, where Vertex AI
    runs.) Outside a multi-worker cluster it is the watch's own flag, read
    every step.

    Args:
      watch: the task's :class:`PreemptionWatch`.
      group: what training runs under: a
        :class:`~estimator_keras.distribute.groups.TrainingGroup`, a
        ``tf.distribute`` strategy, or None (see :func:`groups.of`).
      every_secs: about how often the workers compare notes.
    """

    MAX_STEPS_BETWEEN = 10000

    def __init__(self, watch, group, every_secs=AGREE_EVERY_SECS):
        self.watch, self.group, self.every_secs = watch, groups.of(group), float(every_secs)
        self.in_cluster = self.group.multi_process
        self._next = None
        self._since = None

    def stop_after(self, step):
        """True when training must stop after ``step`` (a count that is the
        same on every worker, e.g. the global step)."""
        if not self.in_cluster:
            return self.watch.requested
        now = time.monotonic()
        if self._next is None:
            # The first step (with its tracing) says nothing of the pace.
            self._next, self._since = step, (step, now)
        if step < self._next:
            return False
        done, secs = step - self._since[0], now - self._since[1]
        proposed = done / secs * self.every_secs if done and secs > 0 else 1.0
        stop, between = self.group.mean([1.0 if self.watch.requested else 0.0, proposed])
        self._next = step + min(max(1, int(round(between))), self.MAX_STEPS_BETWEEN)
        self._since = (step, time.monotonic())
        return stop > 0
