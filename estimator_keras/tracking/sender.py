"""The process that talks to MLflow for one tracked run (``--track``).

Tracking is split in two: ``estimator_keras.tracking`` is how any run
reaches MLflow (where, through which process, within which bounds), and
what a ``train`` or ``tune`` run records (its config, dataset and command
line, and the versions that the engines' registry entries name) is the
runner's, in ``experiments.training.tracked`` and ``experiments.tuning.tracked``.

:class:`~estimator_keras.tracking.mlflow_run.MlflowRun` starts it with
:func:`command` and :func:`environment`, and sends it one request per line
on its stdin, as JSON; it answers each with one line, ``{"ok": {...}}`` or
``{"error": REASON, "refused": BOOL}`` (refused: an answer a retry would get
again, a 4xx but 429).

Why a process of its own: MLflow reads its HTTP client's bounds (request
timeout, retries), its usage telemetry and whether it prints a run's URL on
stdout from environment variables only, and MLflow 3.1 (Python 3.9) uploads
to a server's ``mlflow-artifacts:`` store through the process's tracking URI
whatever the client's. Here they are this process's own: the training
process's environment and MLflow state stay as they were, and a request that
never ends is ended with this process.

MLflow is imported here, and only here.
"""

import json
import os
import sys

REQUESTS = ("start", "batch", "artifacts", "register", "end", "repair")


URI_VARIABLE = "EK_SENDER_TRACKING_URI"
"""The sender's tracking URI (not on its command line: it may hold a password)."""


def command():
    """How to start it: this interpreter, this package."""
    return [sys.executable, "-m", "estimator_keras.tracking.sender"]


def environment(uri, environ, defaults):
    """The sender's environment: ``environ`` (not changed) with each of
    ``defaults`` where unset, the URI, and this package importable."""
    env = dict(environ)
    for name, value in defaults.items():
        env.setdefault(name, value)
    env[URI_VARIABLE] = uri
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, environ.get("PYTHONPATH")) if p)
    return env


class Sender:
    """The requests, on an ``MlflowClient`` bound to ``uri``."""

    def __init__(self, uri):
        # pylint: disable=import-outside-toplevel  (an optional package)
        import mlflow
        from mlflow import MlflowClient, entities
        if not mlflow.is_tracking_uri_set():
            # MLflow 3.1 uploads artifacts through the process's URI (see the
            # module's notes); this process tracks one run, to this URI.
            mlflow.set_tracking_uri(uri)
        self.client, self.entities = MlflowClient(tracking_uri=uri), entities

    def start(self, experiment, run_name=None, resume_id=None, parent=None, tags=None,
              experiment_tags=None, status="RUNNING", create=True):
        """Continues ``resume_id`` (its status set to ``status`` unless None)
        or, where the store lacks it, creates a run unless not ``create``;
        ``{"run_id", "status", "new", "missing"}`` (run_id None: none)."""
        client, missing = self.client, None
        if resume_id:
            try:
                run = client.get_run(resume_id)
            except Exception as e:  # pylint: disable=broad-except
                if not refused(e):
                    raise
                missing = reason(e)
                if not create:
                    return {"run_id": None, "status": None, "new": False, "missing": missing}
            else:
                if status:
                    client.update_run(resume_id, status=status)
                return {"run_id": resume_id, "status": run.info.status, "new": False}
        found = client.get_experiment_by_name(experiment)
        experiment_id = (found.experiment_id if found is not None else
                         client.create_experiment(experiment, tags=experiment_tags or {}))
        tags = dict(tags or {})
        if parent:
            tags["mlflow.parentRunId"] = parent
        run = client.create_run(experiment_id, run_name=run_name, tags=tags)
        return {"run_id": run.info.run_id, "status": run.info.status, "new": True,
                "missing": missing}

    def batch(self, run_id, metrics=(), params=(), tags=()):
        e = self.entities
        self.client.log_batch(run_id, metrics=[e.Metric(*m) for m in metrics],
                              params=[e.Param(*p) for p in params],
                              tags=[e.RunTag(*t) for t in tags])
        return {}

    def artifacts(self, run_id, local_path, artifact_path=None, folder=True):
        if folder:
            self.client.log_artifacts(run_id, local_path, artifact_path)
        else:
            self.client.log_artifact(run_id, local_path, artifact_path)
        return {}

    def register(self, name, run_id, source, once=False):
        """A new version of ``name`` (created when missing) from ``source``;
        with ``once``, none where ``run_id`` already has one."""
        client = self.client
        try:
            client.get_registered_model(name)
        except Exception as e:  # pylint: disable=broad-except
            if not refused(e):
                raise
            client.create_registered_model(name)
        if once:
            for found in client.search_model_versions(f"run_id = '{run_id}'"):
                if found.name == name:
                    return {"version": found.version, "new": False}
        version = client.create_model_version(name, source=source, run_id=run_id,
                                              await_creation_for=0)
        return {"version": version.version, "new": True}

    def end(self, run_id, status):
        self.client.set_terminated(run_id, status=status)
        return {}

    def repair(self, run_id, local_path=None, artifact_path=None):
        """A run left RUNNING after its training ended: FINISHED, and its
        export uploaded where its artifacts have none."""
        said = {"was": self.client.get_run(run_id).info.status, "uploaded": False}
        if said["was"] == "RUNNING":
            self.client.set_terminated(run_id, status="FINISHED")
        if local_path and not self.client.list_artifacts(run_id, artifact_path):
            self.client.log_artifacts(run_id, local_path, artifact_path)
            said["uploaded"] = True
        return said


def refused(error):
    """True for an answer that a retry would get again (a 4xx but 429)."""
    code = getattr(error, "get_http_status_code", None)
    if code is None:
        return False
    try:
        status = int(code())
    except (TypeError, ValueError):
        return False
    return 400 <= status < 500 and status != 429


def reason(error):
    """The first line of an error's message, at most 200 characters."""
    text = str(getattr(error, "message", "") or error).strip().splitlines()
    first = text[0] if text else type(error).__name__
    return first if len(first) <= 200 else first[:197] + "..."


def main(uri):
    # The answers go on a stdout of their own: anything MLflow prints goes to
    # stderr, not between them.
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)

    def answer(**fields):
        answers.write(json.dumps(fields) + "\n")
        answers.flush()

    try:
        sender = Sender(uri)
    except ImportError as e:
        answer(error=f"MLflow does not import ({e})", refused=True, missing=True)
        return 0
    answer(ok={})
    for line in sys.stdin:
        request = json.loads(line)
        op = request.pop("op")
        if op not in REQUESTS:
            answer(error=f"unknown request {op!r}", refused=True)
            continue
        try:
            answer(ok=getattr(sender, op)(**request))
        except Exception as e:  # pylint: disable=broad-except  (the caller decides)
            answer(error=reason(e), refused=refused(e))
    return 0


if __name__ == "__main__":
    sys.exit(main(os.environ[URI_VARIABLE]))
