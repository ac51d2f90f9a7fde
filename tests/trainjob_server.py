"""A stand-in for Kubeflow Trainer v2.3's TrainJob status server, on
127.0.0.1 over HTTPS, as ``pkg/statusserver/`` of github.com/kubeflow/trainer
(tag v2.3.0) answers:

* ``POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/NS/trainjobs/NAME/status``
  and nothing else (404, a ``metav1.Status``); a body over 64 KiB: 413;
* ``Authorization: Bearer TOKEN``: the token in the token file now (it is
  read at every request, so rewriting the file rotates it), for this
  TrainJob only; else 403;
* the body decoded as Go decodes an ``UpdateTrainJobStatusRequest`` (integers
  for int32 fields, strings for the metric's fields, an RFC 3339
  ``lastUpdatedTime``), then checked as the CRD's schema checks
  ``TrainerStatus`` (progress 0-100, remaining seconds >= 0, at most 256
  metrics, names and values of 1 to 64 characters, ``lastUpdatedTime``
  required): a failure is 422; no ``trainerStatus`` is a 200 that changes
  nothing;
* 200 echoes the request, and the TrainJob's ``status.trainerStatus`` becomes
  the report (the server applies it with server-side apply, one field owner).

What the real server cannot be asked to do: fail the next N requests with 500
(:meth:`StatusServer.fail_next`), hold every request unanswered
(:meth:`StatusServer.hang`), or go down (:meth:`StatusServer.stop`).

The certificates are throwaway ones made in the test's folder: a CA and a
server certificate for IP 127.0.0.1, with the ``cryptography`` package where
it is installed, else the ``openssl`` command.
"""

import datetime
import http.server
import importlib.util
import ipaddress
import json
import os
import re
import secrets
import ssl
import subprocess
import threading
import time

STATUS_PATH = re.compile(r"^/apis/trainer\.kubeflow\.org/v1alpha1/namespaces/([^/]+)/trainjobs/"
                         r"([^/]+)/status$")
RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
MAX_BODY = 1 << 16
INT32 = (-2 ** 31, 2 ** 31 - 1)
MAX_METRICS, MAX_CHARS = 256, 64

# The monotonic time of the last 200 any stand-in gave in this process: the
# SDK refuses a second update within 5 s of a successful one, process-wide.
LAST_DELIVERY = [0.0]


# -- certificates


def make_ca(folder, name="test-ca"):
    """(certificate path, key path) of a new CA in ``folder``."""
    os.makedirs(folder, exist_ok=True)
    cert, key = os.path.join(folder, "ca.crt"), os.path.join(folder, "ca.key")
    if importlib.util.find_spec("cryptography") is None:
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                 "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", f"/CN={name}",
                 "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    else:
        _ca_with_cryptography(name, cert, key)
    return cert, key


def make_server_certificate(folder, ca):
    """(certificate path, key path) for 127.0.0.1, signed by ``ca``."""
    cert, key = os.path.join(folder, "server.crt"), os.path.join(folder, "server.key")
    if importlib.util.find_spec("cryptography") is None:
        request, extensions = os.path.join(folder, "server.csr"), os.path.join(folder, "ext.cnf")
        with open(extensions, "w", encoding="utf-8") as f:
            f.write("subjectAltName = IP:127.0.0.1\n"
                    "basicConstraints = critical, CA:FALSE\n"
                    "keyUsage = critical, digitalSignature\n"
                    "extendedKeyUsage = serverAuth\n"
                    "subjectKeyIdentifier = hash\n"
                    "authorityKeyIdentifier = keyid\n")
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", key, "-out", request, "-subj", "/CN=127.0.0.1")
        _openssl("x509", "-req", "-in", request, "-CA", ca[0], "-CAkey", ca[1], "-set_serial",
                 str(secrets.randbits(63)), "-days", "2", "-out", cert, "-extfile", extensions)
    else:
        _server_with_cryptography(ca, cert, key)
    return cert, key


def _openssl(*args):
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def _ca_with_cryptography(name, cert_path, key_path):
    # pylint: disable=import-outside-toplevel
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    _write_pem(cert, key, cert_path, key_path)


def _server_with_cryptography(ca, cert_path, key_path):
    # pylint: disable=import-outside-toplevel
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    with open(ca[0], "rb") as f:
        ca_cert = x509.load_pem_x509_certificate(f.read())
    with open(ca[1], "rb") as f:
        ca_key = serialization.load_pem_private_key(f.read(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=False,
                crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    _write_pem(cert, key, cert_path, key_path)


def _write_pem(cert, key, cert_path, key_path):
    # pylint: disable=import-outside-toplevel
    from cryptography.hazmat.primitives import serialization
    with open(cert_path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM,
                                  serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))


# -- the request's checks


class Invalid(Exception):
    """A request the real server answers with 422."""


def _reject_constant(name):
    raise Invalid(f"Invalid payload ({name} is not JSON)")


def _int32(status, field):
    value = status.get(field)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or not INT32[0] <= value <= INT32[1]):
        raise Invalid(f"Invalid payload ({field}: {value!r} is not an int32)")
    return value


def check_request(body):
    """The request ``body`` (bytes) as the server takes it: the decoded
    request, or Invalid with the reason."""
    try:
        request = json.loads(body, parse_constant=_reject_constant)
    except ValueError as e:
        raise Invalid(f"Invalid payload ({e})") from None
    if request is None:
        return {}
    if not isinstance(request, dict):
        raise Invalid("Invalid payload (not an object)")
    status = request.get("trainerStatus")
    if status is None:
        return {}
    if not isinstance(status, dict):
        raise Invalid("Invalid payload (trainerStatus is not an object)")
    # Decoding into Go's types.
    progress = _int32(status, "progressPercentage")
    remaining = _int32(status, "estimatedRemainingSeconds")
    metrics = status.get("metrics") or []
    if not isinstance(metrics, list) or not all(isinstance(m, dict) for m in metrics):
        raise Invalid("Invalid payload (metrics is not a list of objects)")
    for metric in metrics:
        for field in ("name", "value"):
            if not isinstance(metric.get(field, ""), (str, type(None))):
                raise Invalid(f"Invalid payload (a metric's {field} is not a string)")
    stamp = status.get("lastUpdatedTime")
    if stamp is not None:
        if not isinstance(stamp, str) or not RFC3339.match(stamp):
            raise Invalid(f"Invalid payload (lastUpdatedTime {stamp!r} is not RFC 3339)")
        try:
            datetime.datetime.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")
        except ValueError:
            raise Invalid(f"Invalid payload (lastUpdatedTime {stamp!r})") from None
    # The CRD's schema.
    errors = []
    if stamp is None:
        errors.append("status.trainerStatus: lastUpdatedTime is required when trainerStatus "
                      "is present")
    if progress is not None and not 0 <= progress <= 100:
        errors.append(f"status.trainerStatus.progressPercentage: {progress}: must be between "
                      f"0 and 100")
    if remaining is not None and remaining < 0:
        errors.append(f"status.trainerStatus.estimatedRemainingSeconds: {remaining}: must be "
                      f"greater than or equal to 0")
    if len(metrics) > MAX_METRICS:
        errors.append(f"status.trainerStatus.metrics: Too many: {len(metrics)}: must have at "
                      f"most {MAX_METRICS} items")
    for i, metric in enumerate(metrics):
        for field in ("name", "value"):
            text = metric.get(field) or ""
            if not 1 <= len(text) <= MAX_CHARS:
                errors.append(f"status.trainerStatus.metrics[{i}].{field}: {len(text)} "
                              f"characters, not 1 to {MAX_CHARS}")
    if errors:
        raise Invalid("TrainJob is invalid: " + "; ".join(errors))
    return request


def _bearer(header):
    parts = (header or "").split()
    return parts[1] if len(parts) == 2 and parts[0].lower() == "bearer" else ""


# -- the server


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's names)
        self.server.owner.answer(self)

    do_GET = do_PUT = do_PATCH = do_DELETE = do_POST  # noqa: N815

    def log_message(self, format, *args):  # pylint: disable=redefined-builtin
        del format, args


class _HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        del request, client_address  # clients that hang up, failed handshakes


class StatusServer:
    """The stand-in, for the TrainJob ``namespace``/``name``, its files in
    ``folder`` (``ca`` a (certificate, key) pair: None makes one).

    Attributes:
      records: every request, oldest first: dicts of ``time`` (monotonic),
        ``method``, ``path``, ``token``, ``code`` and ``request`` (the
        decoded request of a 200).
      status: the TrainJob's ``status.trainerStatus`` now.
    """

    def __init__(self, folder, namespace="ml", name="tiny", token="token-1", ca=None):
        os.makedirs(folder, exist_ok=True)
        self.namespace, self.name = namespace, name
        self.ca = ca or make_ca(os.path.join(folder, "ca"))
        self.certificate = make_server_certificate(folder, self.ca)
        self.token_path = os.path.join(folder, "token")
        self.write_token(token)
        self.records, self.status = [], None
        self._lock = threading.Lock()
        self._failing = 0
        self._hanging = False
        self._stopped = threading.Event()
        self._httpd = self._thread = None
        self.port = None

    # -- set-up

    def start(self):
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*self.certificate)
        self._httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,),
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self):
        """Down: the port refuses connections from now on; held requests end."""
        self._stopped.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join(timeout=10)
            self._httpd = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def url(self):
        return (f"https://127.0.0.1:{self.port}/apis/trainer.kubeflow.org/v1alpha1/namespaces/"
                f"{self.namespace}/trainjobs/{self.name}/status")

    def env(self, ca_file=None):
        """The variables the Trainer sets in a trainer pod."""
        return {"KUBEFLOW_TRAINER_SERVER_URL": self.url,
                "KUBEFLOW_TRAINER_SERVER_CA_CERT": ca_file or self.ca[0],
                "KUBEFLOW_TRAINER_SERVER_TOKEN": self.token_path}

    def write_token(self, token):
        """Rotates the token: the file gets ``token``, the only one taken now."""
        with open(self.token_path, "w", encoding="utf-8") as f:
            f.write(token + "\n")

    def fail_next(self, count):
        """The next ``count`` requests get 500."""
        with self._lock:
            self._failing = count

    def hang(self):
        """Every request from now on waits, unanswered, until :meth:`stop`."""
        self._hanging = True

    # -- what came

    @property
    def accepted(self):
        """The ``trainerStatus`` of every request answered 200, oldest first."""
        with self._lock:
            return [r["request"]["trainerStatus"] for r in self.records
                    if r["code"] == 200 and "trainerStatus" in (r["request"] or {})]

    def codes(self):
        with self._lock:
            return [r["code"] for r in self.records]

    def wait_for(self, condition, timeout=30.0):
        """Waits until ``condition()`` is true; returns it (False on timeout)."""
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    # -- answering

    def answer(self, handler):
        length = int(handler.headers.get("Content-Length") or 0)
        record = {"time": time.monotonic(), "method": handler.command, "path": handler.path,
                  "token": _bearer(handler.headers.get("Authorization")), "code": None,
                  "request": None}
        with self._lock:
            self.records.append(record)
            failing = self._failing > 0
            self._failing -= failing
        if length > MAX_BODY:
            return self._reply(handler, record, 413, "Payload too large",
                               "RequestEntityTooLarge")
        body = handler.rfile.read(length)
        if self._hanging:
            self._stopped.wait(120)
            return None
        found = STATUS_PATH.match(handler.path)
        if handler.command != "POST" or not found:
            return self._reply(handler, record, 404, "Not found", "NotFound")
        if failing:
            return self._reply(handler, record, 500, "Internal error", "InternalError")
        with open(self.token_path, encoding="utf-8") as f:
            token = f.read().strip()
        if not record["token"] or record["token"] != token or found.groups() != (
                self.namespace, self.name):
            return self._reply(handler, record, 403, "Forbidden", "Forbidden")
        try:
            request = check_request(body)
        except Invalid as e:
            return self._reply(handler, record, 422, str(e), "Invalid")
        with self._lock:
            record["request"] = request
            if "trainerStatus" in request:
                self.status = request["trainerStatus"]
            LAST_DELIVERY[0] = time.monotonic()
        return self._send(handler, record, 200, request)

    def _reply(self, handler, record, code, message, reason):
        status = {"metadata": {}, "status": "Failure", "message": message, "reason": reason,
                  "code": code}
        return self._send(handler, record, code, status)

    @staticmethod
    def _send(handler, record, code, document):
        data = json.dumps(document).encode()
        record["code"] = code
        handler.send_response(code)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
