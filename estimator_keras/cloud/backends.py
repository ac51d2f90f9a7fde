"""How a job reaches Vertex AI: :class:`Submitter` and the ``gcloud`` command lines.

:class:`Submitter` uploads files and creates CustomJobs and
HyperparameterTuningJobs through the ``gcloud`` CLI when it is on PATH, else
through the ``google-cloud-aiplatform`` SDK, whose API client
(``JobServiceClient.create_custom_job`` and
``create_hyperparameter_tuning_job``) takes the whole request body, every
field of it. :func:`gcloud_upload_command`,
:func:`gcloud_create_command` and :func:`gcloud_tuning_command` build the
argument lists both a real run and a dry run show.

``gcloud ai custom-jobs create``:
https://cloud.google.com/sdk/gcloud/reference/ai/custom-jobs/create;
``gcloud ai hp-tuning-jobs create`` (``--config`` is a YAML
HyperparameterTuningJob: displayName, maxTrialCount, parallelTrialCount,
studySpec, trialJobSpec):
https://cloud.google.com/sdk/gcloud/reference/ai/hp-tuning-jobs/create
"""

import json
import logging
import shutil
import subprocess
import tempfile
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from estimator_keras import io
from estimator_keras.cloud.packaging import output_tail
from estimator_keras.cloud.spec import split_gs_uri
from estimator_keras.errors import CloudError, ConfigError

logger = logging.getLogger(__name__)

_GCLOUD_TIMEOUT_S = 600


def gcloud_upload_command(local_path: str, gs_uri: str) -> List[str]:
    """``gcloud storage cp LOCAL GS_URI`` as an argument list."""
    return ["gcloud", "storage", "cp", local_path, gs_uri]


def _pool_flag(pool: Mapping[str, Any]) -> str:
    if not pool:
        return "--worker-pool-spec="
    machine = pool["machineSpec"]
    items = [("machine-type", machine["machineType"]),
             ("replica-count", pool["replicaCount"])]
    if machine.get("acceleratorType"):
        items += [("accelerator-type", machine["acceleratorType"]),
                  ("accelerator-count", machine["acceleratorCount"])]
    if "containerSpec" in pool:
        items += [("container-image-uri", pool["containerSpec"]["imageUri"])]
    else:
        package = pool["pythonPackageSpec"]
        items += [("executor-image-uri", package["executorImageUri"]),
                  ("python-module", package["pythonModule"])]
    for key, value in items:
        if any(c in str(value) for c in ",="):
            raise CloudError("Cannot pass %s=%r to gcloud --worker-pool-spec: the value "
                             "contains ',' or '='." % (key, value))
    return "--worker-pool-spec=" + ",".join("%s=%s" % kv for kv in items)


def _pool_program(pool: Mapping[str, Any]) -> Dict[str, Any]:
    """What a pool runs, without its machines: the part gcloud's flags share
    (Reduction Server's pool runs its image's own program: no command)."""
    if "containerSpec" in pool:
        return {"command": pool["containerSpec"].get("command", []),
                "args": pool["containerSpec"].get("args", [])}
    return {"packageUris": pool["pythonPackageSpec"]["packageUris"],
            "args": pool["pythonPackageSpec"]["args"]}


def _gcloud_list(values: Sequence[str], flag: str) -> str:
    # gcloud list flags split on commas; a leading ^D^ switches the delimiter to D
    # (see `gcloud topic escaping`), which keeps values such as "lr=0.1,units=64" whole.
    for delim in ("|", "~", ";", "@", "#", "!", "%"):
        if not any(delim in v for v in values):
            return "%s=^%s^%s" % (flag, delim, delim.join(values))
    raise CloudError("Cannot pass %s to gcloud: the values use every delimiter "
                     "gcloud can escape (| ~ ; @ # ! %%): %r" % (flag, list(values)))


def gcloud_create_command(request: Mapping[str, Any], project: str, region: str,
                          config_path: str) -> Tuple[List[str], Dict[str, Any]]:
    """``gcloud ai custom-jobs create`` for ``request``: (argument list, --config content).

    The config file holds the request's ``jobSpec``: every field of it
    (scheduling, service account, network, TensorBoard...) whichever form the
    pools take. gcloud rejects an empty worker pool inside ``--config``
    (checked against gcloud 528: "Exactly one of fields [pythonPackageSpec,
    containerSpec] is required"), although the REST API takes one; when a pool
    in the middle is unused, the pools go in ``--worker-pool-spec`` flags instead
    (an empty flag value is an empty pool) with the shared
    ``--python-package-uris`` and ``--args``, and the config keeps the rest of
    the jobSpec. Flags use the ``--flag=value`` form so that no value
    can be read as another flag.
    """
    job_spec = dict(request["jobSpec"])
    pools = job_spec["workerPoolSpecs"]
    argv = ["gcloud", "ai", "custom-jobs", "create",
            "--project=" + project, "--region=" + region,
            "--display-name=" + request["displayName"]]
    if all(pools):
        return argv + ["--config=" + config_path, "--format=json"], job_spec
    used = [_pool_program(p) for p in pools if p]
    if any(p != used[0] for p in used):
        raise CloudError("gcloud can only give every worker pool the same program and "
                         "args when a pool is empty; this request differs per pool.")
    config = {k: v for k, v in job_spec.items() if k != "workerPoolSpecs"}
    argv += ["--config=" + config_path]
    argv += [_pool_flag(p) for p in pools]
    if "command" in used[0]:
        argv += [_gcloud_list(used[0]["command"], "--command")]
    else:
        argv += [_gcloud_list(used[0]["packageUris"], "--python-package-uris")]
    argv += [_gcloud_list(used[0]["args"], "--args"), "--format=json"]
    return argv, config


def gcloud_tuning_command(request: Mapping[str, Any], project: str, region: str,
                          config_path: str) -> Tuple[List[str], Dict[str, Any]]:
    """``gcloud ai hp-tuning-jobs create`` for ``request``: (argument list, --config content).

    The config file holds the whole HyperparameterTuningJob. gcloud has no
    worker-pool flags for tuning jobs and rejects an empty pool inside
    ``--config``, so a request with an unused pool between used ones (``--ps``
    without ``--workers``) raises CloudError; the SDK backend takes it.
    """
    pools = request["trialJobSpec"]["workerPoolSpecs"]
    if not all(pools):
        raise CloudError(
            "gcloud cannot create this tuning job: its trials have an unused worker pool "
            "between used ones (parameter servers without workers), which gcloud's "
            "--config rejects. Add --workers 1, or submit through the Vertex AI SDK "
            "(pip install google-cloud-aiplatform; Submitter(backend='sdk')).")
    argv = ["gcloud", "ai", "hp-tuning-jobs", "create",
            "--project=" + project, "--region=" + region,
            "--display-name=" + request["displayName"],
            "--config=" + config_path, "--format=json"]
    return argv, dict(request)


_AUTH_MARKERS = ("gcloud auth login", "active account", "auth tokens",
                 "reauthentication", "credentials", "unauthenticated")
_PERMISSION_MARKERS = ("permission_denied", "permission denied", "does not have",
                       "403", "forbidden")


def _run_gcloud(argv: List[str], what: str) -> subprocess.CompletedProcess:
    logger.info("running: %s", argv)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True,
                              timeout=_GCLOUD_TIMEOUT_S, check=False)
    except FileNotFoundError as exc:
        raise CloudError("gcloud disappeared from PATH while %s." % what) from exc
    except subprocess.TimeoutExpired as exc:
        raise CloudError("gcloud took over %d s while %s and was stopped."
                         % (_GCLOUD_TIMEOUT_S, what)) from exc
    if proc.returncode != 0:
        text = (proc.stderr or "") + (proc.stdout or "")
        lowered = text.lower()
        if any(m in lowered for m in _AUTH_MARKERS):
            raise CloudError(
                "gcloud is not signed in (or its credentials expired) while %s. Run "
                "`gcloud auth login` and `gcloud config set project PROJECT`, then "
                "submit again. gcloud said:\n%s" % (what, output_tail(text)))
        if any(m in lowered for m in _PERMISSION_MARKERS):
            raise CloudError(
                "Permission denied while %s: the signed-in account needs write access "
                "to the bucket and permission to create Vertex AI custom jobs in the "
                "project. gcloud said:\n%s" % (what, output_tail(text)))
        raise CloudError("gcloud failed (exit %d) while %s. gcloud said:\n%s"
                         % (proc.returncode, what, output_tail(text)))
    return proc


def _sdk_error(exc: BaseException, what: str) -> CloudError:
    module = type(exc).__module__ or ""
    if module.startswith("google.auth") or "credential" in type(exc).__name__.lower():
        return CloudError(
            "No usable Google Cloud credentials while %s (%s: %s). Run `gcloud auth "
            "application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a "
            "service-account key file." % (what, type(exc).__name__, exc))
    return CloudError("The Google Cloud SDK failed while %s: %s: %s"
                      % (what, type(exc).__name__, exc))


class Submitter:
    """Uploads files and creates Vertex AI jobs.

    Uses the ``gcloud`` CLI when it is on PATH, else the ``google-cloud-aiplatform``
    SDK when importable; with neither, each call raises CloudError saying how to
    install one. ``backend`` forces ``"gcloud"`` or ``"sdk"``; ``sdk``, the
    ``(aiplatform, storage)`` modules the SDK backend uses instead of importing
    ``google.cloud.aiplatform`` and ``google.cloud.storage`` (a test passes fakes).

    Example::

        s = Submitter()
        uri = s.upload("dist/pkg.tar.gz", "gs://b/run1/packages/pkg.tar.gz")
        job = s.create_job(build_custom_job(spec), "my-proj", "us-central1")
    """

    def __init__(self, backend: Optional[str] = None, sdk: Optional[Tuple[Any, Any]] = None):
        if backend not in (None, "gcloud", "sdk"):
            raise ConfigError("Submitter backend must be 'gcloud', 'sdk' or None; got %r."
                              % (backend,))
        self._backend = backend
        self._sdk = sdk

    def _sdk_modules(self):
        return self._sdk if self._sdk is not None else self._import_sdk()

    @property
    def backend(self) -> str:
        """``"gcloud"`` or ``"sdk"``; raises CloudError when neither is available."""
        if self._backend:
            return self._backend
        if shutil.which("gcloud"):
            return "gcloud"
        try:
            self._import_sdk()
        except ImportError:
            raise CloudError(
                "Cannot submit: neither the gcloud CLI nor the Vertex AI Python SDK is "
                "installed. Install one of them: the Google Cloud CLI "
                "(https://cloud.google.com/sdk/docs/install, then `gcloud auth login`), "
                "or `pip install google-cloud-aiplatform google-cloud-storage` (then "
                "`gcloud auth application-default login` or "
                "GOOGLE_APPLICATION_CREDENTIALS). Use --dry-run to only print the "
                "request.") from None
        return "sdk"

    @staticmethod
    def _import_sdk():
        from google.cloud import aiplatform, storage  # pylint: disable=import-outside-toplevel
        return aiplatform, storage

    def upload(self, local_path: str, gs_uri: str) -> str:
        """Copy ``local_path`` to ``gs_uri``; return ``gs_uri``."""
        split_gs_uri(gs_uri)
        if not io.isfile(local_path):
            raise CloudError("Cannot upload %s: no such file." % local_path)
        what = "uploading %s to %s" % (local_path, gs_uri)
        if self.backend == "gcloud":
            _run_gcloud(gcloud_upload_command(local_path, gs_uri), what)
            return gs_uri
        _, storage = self._sdk_modules()
        bucket, blob = split_gs_uri(gs_uri)
        try:
            storage.Client().bucket(bucket).blob(blob).upload_from_filename(local_path)
        except Exception as exc:  # pylint: disable=broad-except
            raise _sdk_error(exc, what) from exc
        return gs_uri

    def create_job(self, request: Mapping[str, Any], project: str,
                   region: str) -> Dict[str, Any]:
        """Create the CustomJob ``request`` in ``project``/``region``.

        Returns the created job as far as the backend reports it; ``name`` is the
        job's resource name.
        """
        return self._create("custom", request, project, region)

    def create_tuning_job(self, request: Mapping[str, Any], project: str,
                          region: str) -> Dict[str, Any]:
        """Create the HyperparameterTuningJob ``request`` in ``project``/``region``.

        Returns the created job as far as the backend reports it; ``name`` is the
        job's resource name.
        """
        return self._create("tuning", request, project, region)

    def _create(self, kind: str, request: Mapping[str, Any], project: str,
                region: str) -> Dict[str, Any]:
        noun, command, config_name = _JOB_KINDS[kind]
        what = "creating the Vertex AI %s %r" % (noun, request.get("displayName"))
        if self.backend == "gcloud":
            workdir = io.new_dir(tempfile.gettempdir(), "vertex-job-")
            try:
                config_path = io.join(workdir, config_name)
                argv, config = command(request, project, region, config_path)
                io.atomic_write(config_path, json.dumps(config, indent=2))
                proc = _run_gcloud(argv, what)
            finally:
                io.rmtree(workdir)
            try:
                return json.loads(proc.stdout)
            except ValueError:
                return {"output": (proc.stdout or "").strip()}
        aiplatform, _ = self._sdk_modules()
        try:
            if kind == "custom":
                name = _sdk_custom_job(aiplatform, request, project, region)
            else:
                name = _sdk_tuning_job(aiplatform, request, project, region)
        except Exception as exc:  # pylint: disable=broad-except
            raise _sdk_error(exc, what) from exc
        return {"name": name, "displayName": request["displayName"]}


def _sdk_client(aiplatform, region):
    return aiplatform.gapic.JobServiceClient(
        client_options={"api_endpoint": "%s-aiplatform.googleapis.com" % region})


def _sdk_custom_job(aiplatform, request, project, region) -> str:
    # The API client takes the whole request (the SDK's CustomJob class would
    # pass on the worker pools and the output directory only). from_json reads
    # the REST body's JSON names and durations as the REST API does.
    job = _sdk_client(aiplatform, region).create_custom_job(
        parent="projects/%s/locations/%s" % (project, region),
        custom_job=aiplatform.gapic.CustomJob.from_json(json.dumps(request)))
    return job.name


def _sdk_tuning_job(aiplatform, request, project, region) -> str:
    # The SDK's HyperparameterTuningJob class wants its own parameter objects;
    # the API client takes the request as it is.
    job = _sdk_client(aiplatform, region).create_hyperparameter_tuning_job(
        parent="projects/%s/locations/%s" % (project, region),
        hyperparameter_tuning_job=aiplatform.gapic.HyperparameterTuningJob.from_json(
            json.dumps(request)))
    return job.name


# kind -> (what it is called, the gcloud command builder, its --config file name)
_JOB_KINDS = {"custom": ("custom job", gcloud_create_command, "job_spec.json"),
              "tuning": ("hyperparameter tuning job", gcloud_tuning_command,
                         "hptuning_job.json")}
