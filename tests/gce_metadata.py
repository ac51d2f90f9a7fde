"""A stand-in for the GCE metadata server on 127.0.0.1, answering as a GCE
CPU VM does: TensorFlow's platform detection
(``failure_handling_util.on_gcp``) asks ``http://$GCE_METADATA_IP/
computeMetadata/v1/instance/hostname`` with the ``Metadata-Flavor: Google``
header, and a 200 there, with no GPU or TPU visible, makes it GCE_CPU.

Example::

    with MetadataServer() as server:
        env = child_env(**server.env())   # children now detect GCE_CPU
"""

import http.server
import threading

PATHS = {
    "/computeMetadata/v1/instance/hostname": "vertex-worker.c.project.internal",
    "/computeMetadata/v1/instance/maintenance-event": "NONE",
}


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        self.server.requests.append(self.path)
        body = PATHS.get(self.path)
        # The real server refuses requests without the header.
        if self.headers.get("Metadata-Flavor") != "Google":
            status, body = 403, ""
        elif body is None:
            status, body = 404, ""
        else:
            status = 200
        data = body.encode()
        self.send_response(status)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Type", "application/text")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        del args  # quiet


class MetadataServer:
    """Serves :data:`PATHS` on 127.0.0.1 (a free port) in a daemon thread;
    ``requests`` lists the paths asked for."""

    def __init__(self):
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.requests = []
        self._thread = None

    @property
    def address(self):
        host, port = self._server.server_address[:2]
        return f"{host}:{port}"

    @property
    def requests(self):
        return list(self._server.requests)

    def env(self):
        """What a child's environment needs for TensorFlow to find this server
        (and not send the request through a proxy)."""
        return {"GCE_METADATA_IP": self.address, "NO_PROXY": "127.0.0.1,localhost",
                "no_proxy": "127.0.0.1,localhost"}

    def __enter__(self):
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="gce-metadata")
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
        return False
