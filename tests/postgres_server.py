"""A throwaway PostgreSQL server for the tests: Debian's ``postgresql``
package (``.ci/run`` installs it), a fresh cluster in a temporary folder,
listening on 127.0.0.1 only, trust authentication, ended by its PID.

``initdb`` and ``postgres`` refuse to run as root: as root they run as the
``postgres`` user the package creates (``setpriv``, which execs, so the PID
is the server's own).
"""

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time


def _binary(name):
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    path = found[-1] if found else shutil.which(name)
    if not path:
        raise RuntimeError(f"PostgreSQL's {name} is not installed: apt-get install postgresql "
                           f"(.ci/run installs it)")
    return path


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``with Server() as url:`` a SQLAlchemy URL of an empty database."""

    def __init__(self, timeout_s=60):
        self.timeout_s = timeout_s
        self.folder = self.proc = None
        self.port = _free_port()

    def _as_owner(self):
        if os.geteuid() != 0:
            return []
        return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"]

    def __enter__(self):
        self.folder = tempfile.mkdtemp(prefix="ek-postgres-")
        data, sockets = os.path.join(self.folder, "data"), os.path.join(self.folder, "run")
        os.mkdir(sockets)
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            for path in (self.folder, sockets):
                os.chown(path, owner.pw_uid, owner.pw_gid)
        subprocess.run(self._as_owner() + [_binary("initdb"), "-D", data, "-U", "postgres",
                                           "--auth=trust", "-E", "UTF8"],
                       check=True, capture_output=True, timeout=self.timeout_s)
        self.log = open(os.path.join(self.folder, "server.log"), "wb")  # pylint: disable=consider-using-with
        self.proc = subprocess.Popen(
            self._as_owner() + [_binary("postgres"), "-D", data, "-h", "127.0.0.1",
                                "-p", str(self.port), "-k", sockets],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("PostgreSQL did not start: " + self._log_tail())
            ready = subprocess.run([_binary("pg_isready"), "-h", "127.0.0.1", "-p",
                                    str(self.port)], capture_output=True, timeout=10)
            if ready.returncode == 0:
                return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
            time.sleep(0.2)
        raise RuntimeError("PostgreSQL did not answer in time: " + self._log_tail())

    def _log_tail(self):
        with open(os.path.join(self.folder, "server.log"), "rb") as f:
            return f.read().decode(errors="replace")[-2000:]

    def __exit__(self, *exc):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # PostgreSQL's fast shutdown
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if getattr(self, "log", None):
            self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)
