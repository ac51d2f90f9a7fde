"""One training process per model dir: a lock that a crash does not leave stuck.

Two independent ``train`` runs writing one model dir would interleave
checkpoints and corrupt each other's progress. :class:`ModelDirLock` writes
``MODEL_DIR/.train.lock`` (pid, host, time) with an exclusive create; a lock
whose process no longer runs on this host is stale and taken over.

Example::

    with ModelDirLock("/tmp/run"):
        train(...)
"""

import json
import logging
import os
import socket
import time

from estimator_keras.errors import ModelDirError

logger = logging.getLogger(__name__)

LOCK_NAME = ".train.lock"


def pid_alive(pid):
    """True when a process with this PID runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ModelDirLock:
    """Exclusive use of a local model dir by one process (a no-op for
    remote ``gs://`` dirs, whose object stores offer no exclusive create;
    there the cluster scheduler is the guard)."""

    def __init__(self, model_dir):
        self.model_dir = str(model_dir)
        self.path = os.path.join(self.model_dir, LOCK_NAME)
        self.held = False

    def acquire(self):
        if "://" in self.model_dir:
            return self
        try:
            os.makedirs(self.model_dir, exist_ok=True)
        except OSError as e:
            raise ModelDirError(f"cannot create model dir {self.model_dir}: "
                                f"{e.strerror}.") from e
        if not os.access(self.model_dir, os.W_OK):
            raise ModelDirError(f"model dir {self.model_dir} is not writable; choose "
                                f"another --model-dir or fix its permissions.")
        me = {"pid": os.getpid(), "host": socket.gethostname(), "time": time.time()}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                owner = self._read_owner()
                if owner and owner.get("host") == me["host"] and pid_alive(owner.get("pid", -1)):
                    raise ModelDirError(
                        f"model dir {self.model_dir} is in use by process "
                        f"{owner['pid']} (started {time.ctime(owner.get('time', 0))}); "
                        f"two training runs must not share a model dir. Wait for it, "
                        f"stop it, or use another --model-dir.") from None
                if owner and owner.get("host") != me["host"]:
                    raise ModelDirError(
                        f"model dir {self.model_dir} is locked by process "
                        f"{owner.get('pid')} on host {owner.get('host')}; if that run "
                        f"is gone, delete {self.path}.") from None
                logger.warning("taking over a stale lock in %s left by process %s, "
                               "which is no longer running", self.model_dir,
                               owner.get("pid") if owner else "?")
                try:
                    os.remove(self.path)
                except FileNotFoundError:
                    pass
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self.held = True
            return self
        raise ModelDirError(f"could not lock model dir {self.model_dir}: another "
                            f"process keeps taking the lock.")

    def _read_owner(self):
        try:
            with open(self.path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def release(self):
        if self.held:
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass
            self.held = False

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
