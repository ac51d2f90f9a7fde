"""Where a run is tracked, and how this package's MLflow client behaves.

Tracking is split in two: ``estimator_keras.tracking`` is how any run
reaches MLflow (where, through which process, within which bounds), and
what a ``train`` or ``tune`` run records (its config, dataset and command
line, and the versions that the engines' registry entries name) is the
runner's, in ``experiments.training.tracked`` and ``experiments.tuning.tracked``.

``--track [URI]`` (or ``EK_TRACKING_URI``) turns tracking on. The URI is an
``http(s)://`` tracking server (``databricks`` too: MLflow resolves it from its
own profile), a database (``sqlite:``, ``postgresql:``, ``mysql:``...), or a
local file ending in ``.db`` (a SQLite database). ``--track`` alone takes
``MLFLOW_TRACKING_URI`` where it is set, else MLflow's own default,
``sqlite:///mlflow.db`` in the working directory: what ``mlflow ui`` run there
shows. Local paths are made absolute, so that every process of a run agrees.

A folder or ``file:`` URI is MLflow's file store, which MLflow 3 keeps in
maintenance and refuses unless ``MLFLOW_ALLOW_FILE_STORE=true``: without it,
such a URI is refused here, before training, rather than by MLflow after it
started.

:data:`CLIENT_DEFAULTS` bounds MLflow's HTTP client and keeps its telemetry
off, in the environment of the process that talks to MLflow
(:mod:`~estimator_keras.tracking.sender`), never in the training process's;
each is a default the user's own variable overrides.

TF-free and MLflow-free: nothing here imports MLflow.
"""

import os
import re
import urllib.parse

from estimator_keras.errors import ConfigError

URI_VARIABLE = "EK_TRACKING_URI"
"""Turns tracking on like ``--track URI`` (the flag wins)."""
PARENT_VARIABLE = "EK_TRACKING_PARENT_RUN_ID"
"""Set by ``tune`` for its trials: the study's run, which their runs nest under."""
MLFLOW_URI_VARIABLE = "MLFLOW_TRACKING_URI"
DEFAULT_DATABASE = "mlflow.db"
FILE_STORE_VARIABLE = "MLFLOW_ALLOW_FILE_STORE"
SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")
INSTALL = "pip install -e '.[mlflow]' (from the package's checkout)"

# Schemes MLflow's tracking stores take.
REMOTE_SCHEMES = ("http", "https", "databricks", "databricks-uc")
DATABASE_SCHEMES = ("postgresql", "mysql", "mssql")
_SCHEME = re.compile(r"^([a-z][a-z0-9+.-]*):", re.I)

# The sender's environment where the user has not set them (MLflow reads
# these from the environment only): MLflow's HTTP client otherwise waits
# 120 s per request and retries up to 7 times (minutes on a dead server); the
# background sender retries on its own schedule instead. Telemetry: MLflow
# 3.2+ sends usage data unless told not to. The run's URL printed on stdout
# would mix with the results printed there.
CLIENT_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}


def resolve(flag=None, environ=None, cwd=None, flag_name="--track"):
    """The tracking URI a run uses, or None when tracking is off.

    ``flag`` is ``--track``'s value: None when not given (then
    ``EK_TRACKING_URI`` decides), "" when given without a URI. Raises
    ConfigError naming ``flag_name`` (or the variable) for a URI MLflow
    cannot track to."""
    environ = os.environ if environ is None else environ
    cwd = cwd or os.getcwd()
    source = flag_name
    if flag is None:
        flag = environ.get(URI_VARIABLE)
        source = URI_VARIABLE
        if flag is None:
            return None
    flag = flag.strip()
    if not flag:
        if environ.get(MLFLOW_URI_VARIABLE, "").strip():
            flag, source = environ[MLFLOW_URI_VARIABLE].strip(), MLFLOW_URI_VARIABLE
        else:
            return "sqlite:///" + os.path.join(cwd, DEFAULT_DATABASE)
    return _checked(flag, source, cwd, environ)


def _scheme(uri):
    found = _SCHEME.match(uri or "")
    # One letter: a Windows drive, not a scheme.
    return found.group(1).lower() if found and len(found.group(1)) > 1 else ""


def _checked(uri, source, cwd, environ):
    scheme = _scheme(uri)
    if scheme in ("", "file"):
        path = urllib.parse.urlsplit(uri).path if scheme else uri
        path = os.path.abspath(os.path.join(cwd, os.path.expanduser(path)))
        if path.endswith(SQLITE_SUFFIXES):
            return "sqlite:///" + path
        if environ.get(FILE_STORE_VARIABLE, "").strip().lower() in ("true", "1"):
            return path
        raise ConfigError(
            f"{source} {uri}: a folder is MLflow's file store, which MLflow 3 keeps in "
            f"maintenance and refuses. Give a SQLite file ({path}.db, or "
            f"sqlite:///{path}/mlflow.db), a database or an http(s):// tracking server; or set "
            f"{FILE_STORE_VARIABLE}=true to use the file store anyway.")
    if scheme == "sqlite":
        path = uri[len("sqlite:///"):] if uri.lower().startswith("sqlite:///") else None
        if not path or path.startswith(":memory:"):
            raise ConfigError(f"{source} {uri}: expected sqlite:///PATH to a database file.")
        return "sqlite:///" + os.path.join(cwd, os.path.expanduser(path))
    if scheme in REMOTE_SCHEMES or scheme.split("+")[0] in DATABASE_SCHEMES:
        if scheme in ("http", "https") and not urllib.parse.urlsplit(uri).hostname:
            raise ConfigError(f"{source} {uri!r} names no host; expected a tracking server "
                              f"such as http://127.0.0.1:5000.")
        return uri
    raise ConfigError(
        f"{source} {uri!r}: MLflow cannot track to a {scheme}: URI. Expected an http(s):// "
        f"tracking server, a database URI (sqlite:, postgresql:...) or a local .db file (gs:// "
        f"and other buckets hold MLflow's artifacts, behind a tracking server, not its runs).")


def is_remote(uri):
    """True for a tracking server, service or database reached over the network."""
    scheme = _scheme(uri)
    return scheme in REMOTE_SCHEMES or scheme.split("+")[0] in DATABASE_SCHEMES


def shown(uri):
    """The URI as a message may print it: without a password."""
    parts = urllib.parse.urlsplit(uri or "")
    if parts.password:
        host = parts.hostname + (f":{parts.port}" if parts.port else "")
        return urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))
    return uri

