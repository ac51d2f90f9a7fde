"""One training process per model dir: a lock that a crash does not leave stuck.

Two independent ``train`` runs writing one model dir would interleave
checkpoints and corrupt each other's progress. :class:`ModelDirLock` holds an
exclusive ``flock`` on ``MODEL_DIR/.train.lock`` and records its owner (pid,
host, time) in it. The kernel drops the flock when its process dies, so a
lock left by a crash is taken over by exactly one of the processes that find
it: there is nothing to delete first, and so no moment two of them can win.

Example::

    with ModelDirLock("/tmp/run"):
        train(...)
"""

import errno
import fcntl
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
    remote ``gs://`` dirs, whose object stores offer no locks; there the
    cluster scheduler is the guard).

    The lock file names its owner. A file naming a process of another host
    is refused even when no flock holds it (a lock on a network file system
    may not reach this host); delete it once that run is gone.
    """

    def __init__(self, model_dir):
        self.model_dir = str(model_dir)
        self.path = os.path.join(self.model_dir, LOCK_NAME)
        self.held = False
        self._fd = None

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
        # A holder that releases unlinks the file; a few retries cover
        # opening a file just before it was unlinked.
        for _ in range(10):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise ModelDirError(f"cannot lock model dir {self.model_dir}: "
                                        f"{e.strerror}.") from e
                raise self._in_use(self._read_owner(), me) from None
            if not self._is_current(fd):
                os.close(fd)
                continue
            owner = self._read_owner()
            if owner and owner.get("host") != me["host"]:
                os.close(fd)
                raise self._in_use(owner, me)
            if owner and owner.get("pid") != me["pid"]:
                logger.warning("taking over a stale lock in %s left by process %s, "
                               "which is no longer running", self.model_dir,
                               owner.get("pid", "?"))
            data = json.dumps(me).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
            self._fd = fd
            self.held = True
            return self
        raise ModelDirError(f"could not lock model dir {self.model_dir}: another "
                            f"process keeps taking the lock.")

    def _is_current(self, fd):
        """True when ``fd`` is still the file at ``self.path`` (not one a
        releasing holder unlinked after we opened it)."""
        try:
            here, there = os.fstat(fd), os.stat(self.path)
        except FileNotFoundError:
            return False
        return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)

    def _in_use(self, owner, me):
        if owner and owner.get("host") not in (None, me["host"]):
            return ModelDirError(
                f"model dir {self.model_dir} is locked by process "
                f"{owner.get('pid')} on host {owner.get('host')}; if that run "
                f"is gone, delete {self.path}.")
        who = (f"process {owner['pid']} (started {time.ctime(owner.get('time', 0))})"
               if owner and "pid" in owner else "another process")
        return ModelDirError(
            f"model dir {self.model_dir} is in use by {who}; two training runs must not "
            f"share a model dir. Wait for it, stop it, or use another --model-dir.")

    def _read_owner(self):
        try:
            with open(self.path, encoding="utf-8") as f:
                owner = json.load(f)
        except (OSError, ValueError):
            return None
        return owner if isinstance(owner, dict) else None

    def release(self):
        if self.held:
            # Unlink while still holding the flock, and only our own file.
            if self._is_current(self._fd):
                try:
                    os.remove(self.path)
                except FileNotFoundError:
                    pass
            os.close(self._fd)
            self._fd = None
            self.held = False

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
