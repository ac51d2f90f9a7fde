"""A real MLflow tracking server for the tests: ``mlflow server`` with a SQLite
backend and a local artifact root, on 127.0.0.1, in a process group of its
own that :meth:`MlflowServer.stop` ends by its PID."""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

START_TIMEOUT_S = 120


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env():
    env = dict(os.environ)
    env.update(MLFLOW_DISABLE_TELEMETRY="true", PYTHONUNBUFFERED="1")
    return env


class MlflowServer:
    """``with MlflowServer(folder) as server:`` -> ``server.uri``, ``server.client()``."""

    def __init__(self, folder, port=None):
        self.folder = str(folder)
        self.port = port or free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc = None
        self.log_path = os.path.join(self.folder, "server.log")

    def start(self):
        os.makedirs(self.folder, exist_ok=True)
        command = [sys.executable, "-m", "mlflow", "server",
                   "--backend-store-uri", f"sqlite:///{self.folder}/mlflow.db",
                   "--artifacts-destination", os.path.join(self.folder, "artifacts"),
                   "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=server_env(),
                                         start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited {self.proc.returncode}: "
                                   f"{self.log()[-3000:]}")
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=2) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"mlflow server did not answer within {START_TIMEOUT_S} s: "
                           f"{self.log()[-3000:]}")

    def stop(self):
        """Ends the server's whole process group (uvicorn and its job runner)."""
        if self.proc is None:
            return
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        # The group may outlive its leader for a moment.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc = None

    def log(self):
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def client(self):
        # pylint: disable-next=import-outside-toplevel
        from mlflow import MlflowClient
        return MlflowClient(tracking_uri=self.uri)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False
