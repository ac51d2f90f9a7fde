"""A real MLflow tracking server for the tests: ``mlflow server`` with a SQLite
backend and a local artifact root, on 127.0.0.1, in a process group of its
own that :meth:`MlflowServer.stop` ends by its PID; a :class:`Relay` in front
of one that stalls the requests a test chooses, and a :class:`Silent` server
that never answers."""

import http.client
import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
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


class Relay:
    """An HTTP relay in front of a server (``with Relay(server.uri, stall) as
    relay:`` -> ``relay.uri``): forwards each request and its answer as they
    are, except a request for which ``stall(method, path)`` is true while
    :meth:`release` has not been called: that one is read and never answered
    (its connection is closed once released, or after ``STALL_S``)."""

    STALL_S = 600

    def __init__(self, target, stall):
        self.target = urllib.parse.urlsplit(target)
        self.stall, self.released = stall, threading.Event()
        self.stalled = []
        relay = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self):
                relay.forward(self)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _forward

            def log_message(self, *args):  # quiet
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.uri = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def forward(self, handler):
        body = _read_body(handler)
        if self.stall(handler.command, handler.path) and not self.released.is_set():
            self.stalled.append((handler.command, handler.path))
            self.released.wait(self.STALL_S)
            handler.close_connection = True
            return
        hop = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
               "proxy-connection", "content-length", "host"}
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in hop}
        connection = http.client.HTTPConnection(self.target.hostname, self.target.port,
                                                timeout=60)
        try:
            connection.request(handler.command, handler.path, body=body, headers=headers)
            answer = connection.getresponse()
            data = answer.read()
        finally:
            connection.close()
        handler.send_response(answer.status, answer.reason)
        for name, value in answer.getheaders():
            if name.lower() not in hop:
                handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(data)

    def release(self):
        """Answers the stalled requests' clients (by closing them) and
        forwards everything from now on."""
        self.released.set()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        return False


def _read_body(handler):
    if "chunked" in handler.headers.get("Transfer-Encoding", "").lower():
        chunks = []
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                handler.rfile.readline()
                return b"".join(chunks)
            chunks.append(handler.rfile.read(size))
            handler.rfile.readline()
    length = int(handler.headers.get("Content-Length") or 0)
    return handler.rfile.read(length) if length else None


class Silent:
    """A server that accepts connections on 127.0.0.1 and never answers
    (``with Silent() as silent:`` -> ``silent.uri``): a socket that listens,
    whose connections the kernel completes and nothing reads."""

    def __init__(self):
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(128)
        self.uri = f"http://127.0.0.1:{self.socket.getsockname()[1]}"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.socket.close()
        return False
