"""Run an experiment as a Vertex AI CustomJob or a Kubeflow TFJob.

Two halves live here:

* the submitting side: :class:`JobSpec` describes a job; :func:`build_custom_job`
  turns it into a Vertex AI ``CustomJob`` request body and
  :func:`build_tfjob_manifest` into a Kubeflow ``TFJob``; :func:`submit` builds an
  sdist of this project, uploads it next to the job and creates the job through
  :class:`Submitter` (the ``gcloud`` CLI, else the ``google-cloud-aiplatform`` SDK);
* the job side: :func:`resolve_vertex_environment` picks the directories a run
  writes to from ``--model-dir`` or the ``AIP_*`` variables Vertex sets, and
  :func:`copy_to_remote` copies local files to ``gs://``.

Nothing here prints; failures raise :class:`~estimator_keras.errors.CloudError`
(something could not be prepared or sent) or
:class:`~estimator_keras.errors.ConfigError` (a value given by the caller is wrong).

Sources for field names, images and formats (read 2026):

* CustomJob / CustomJobSpec REST body, ``baseOutputDirectory`` and the ``AIP_*``
  variables it makes Vertex set:
  https://cloud.google.com/vertex-ai/docs/reference/rest/v1/CustomJobSpec
* WorkerPoolSpec / PythonPackageSpec fields:
  https://cloud.google.com/vertex-ai/docs/training/configure-container-settings
* worker pool order (0 chief, 1 workers, 2 parameter servers, 3 evaluators; an
  unused pool is an empty value):
  https://cloud.google.com/vertex-ai/docs/training/distributed-training
* MachineSpec.acceleratorType values:
  https://cloud.google.com/vertex-ai/docs/reference/rest/v1/MachineSpec
* prebuilt TensorFlow 2.15 training images (tf-cpu.2-15.py310 / tf-gpu.2-15.py310):
  https://cloud.google.com/vertex-ai/docs/training/pre-built-containers
* ``gcloud ai custom-jobs create`` (``--display-name`` required, ``--config`` is a
  YAML ``CustomJobSpec`` with camelCase keys):
  https://cloud.google.com/sdk/gcloud/reference/ai/custom-jobs/create
* TFJob (``kubeflow.org/v1``, ``tfReplicaSpecs``, container named ``tensorflow``):
  https://www.kubeflow.org/docs/components/training/tftraining/
"""

import ast
import dataclasses
import glob
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from estimator_keras.errors import CloudError, ConfigError

logger = logging.getLogger(__name__)

DEFAULT_MACHINE_TYPE = "n1-standard-8"
"""n1 is the machine family T4, V100, P100 and P4 GPUs attach to; 8 vCPUs keep a
tf.data pipeline fed for one or two of them. A100, L4 and H100 GPUs need their own
machine families (a2, g2, a3): pass ``--machine-type`` with those."""

PYTHON_MODULE = "experiments"
"""Module Vertex runs (``python -m experiments train ...``) after installing the sdist."""

# Every NVIDIA value of MachineSpec.AcceleratorType except the retired K80.
# TPUs are left out on purpose: they need the tf-tpu image and a cloud-tpu machine
# type, which this module does not configure.
VERTEX_GPU_TYPES = (
    "NVIDIA_TESLA_P100",
    "NVIDIA_TESLA_V100",
    "NVIDIA_TESLA_P4",
    "NVIDIA_TESLA_T4",
    "NVIDIA_TESLA_A100",
    "NVIDIA_A100_80GB",
    "NVIDIA_L4",
    "NVIDIA_H100_80GB",
    "NVIDIA_H100_MEGA_80GB",
    "NVIDIA_H200_141GB",
    "NVIDIA_B200",
    "NVIDIA_GB200",
    "NVIDIA_RTX_PRO_6000",
)
_TPU_TYPES = ("TPU_V2", "TPU_V3", "TPU_V4_POD", "TPU_V5_LITEPOD")

# Vertex pool indices; the position in workerPoolSpecs is what gives a pool its role.
CHIEF_POOL, WORKER_POOL, PS_POOL, EVALUATOR_POOL = 0, 1, 2, 3

_IMAGE_TEMPLATE = "{host}/vertex-ai/training/tf-{kind}.2-15.py310:latest"

_SDIST_TIMEOUT_S = 600
_GCLOUD_TIMEOUT_S = 600

_ACCELERATOR_RE = re.compile(r"^\s*([A-Za-z0-9_]+)\s*:\s*([0-9]+)\s*$")
_GCS_RE = re.compile(r"^gs://([a-z0-9][a-z0-9._-]{1,220}[a-z0-9])(/.*)?$")
_PROJECT_RE = re.compile(r"^([a-z0-9.-]+:)?[a-z][a-z0-9-]{4,28}[a-z0-9]$")
_REGION_RE = re.compile(r"^[a-z]+(-[a-z]+)+[0-9]+$")
_EXAMPLE_ACCELERATOR = "NVIDIA_TESLA_T4:1"


# --------------------------------------------------------------------------- spec


def parse_accelerator(text: str) -> Tuple[str, int]:
    """Parse ``TYPE:COUNT`` into ``(type, count)``.

    The type is matched case-insensitively against :data:`VERTEX_GPU_TYPES` and
    returned upper-case.

    >>> parse_accelerator("NVIDIA_TESLA_T4:1")
    ('NVIDIA_TESLA_T4', 1)
    """
    if not isinstance(text, str):
        raise ConfigError(
            "--accelerator: expected a string TYPE:COUNT, for example %s; got %r."
            % (_EXAMPLE_ACCELERATOR, text))
    match = _ACCELERATOR_RE.match(text)
    if not match:
        raise ConfigError(
            "--accelerator: expected TYPE:COUNT, for example %s (a Vertex AI "
            "accelerator type, a colon, and how many per machine); got %r."
            % (_EXAMPLE_ACCELERATOR, text))
    kind, count = match.group(1).upper(), int(match.group(2))
    if kind in _TPU_TYPES:
        raise ConfigError(
            "--accelerator: %s is a TPU; this submitter only configures GPU jobs "
            "(TPUs need the tf-tpu image and a cloud-tpu machine type). Use one of: %s."
            % (kind, ", ".join(VERTEX_GPU_TYPES)))
    if kind not in VERTEX_GPU_TYPES:
        raise ConfigError(
            "--accelerator: unknown accelerator type %r in %r; expected one of: %s "
            "(for example %s)." % (kind, text, ", ".join(VERTEX_GPU_TYPES),
                                   _EXAMPLE_ACCELERATOR))
    if not 1 <= count <= 16:
        raise ConfigError(
            "--accelerator: the count in %r must be between 1 and 16 GPUs per "
            "machine, for example %s." % (text, _EXAMPLE_ACCELERATOR))
    return kind, count


def _check_gs_uri(value: str, flag: str) -> str:
    if not isinstance(value, str) or not _GCS_RE.match(value.rstrip("/") or value):
        raise ConfigError(
            "%s must be a Cloud Storage URI like gs://BUCKET/PATH, BUCKET being 3-63 "
            "lower-case letters, digits, '-', '_' or '.' (Vertex AI replicas cannot "
            "see local paths); got %r." % (flag, value))
    return value.rstrip("/")


@dataclasses.dataclass
class JobSpec:
    """What to run in the cloud, and on which machines.

    Build one with keyword arguments; :meth:`validate` (called by every builder)
    checks it.

    Example::

        spec = JobSpec(experiment="fashion_mnist_cnn", project="my-proj",
                       region="us-central1", job_dir="gs://my-bucket/runs/1",
                       workers=2, accelerator="NVIDIA_TESLA_T4:1",
                       train_args=["--max-steps", "2000"])
    """

    experiment: str
    """Experiment name passed to ``train`` (e.g. ``fashion_mnist_cnn``)."""
    job_dir: str
    """gs:// directory of the job: model in <job_dir>/model, package in <job_dir>/packages."""
    project: Optional[str] = None
    """Google Cloud project id; required for Vertex AI, unused for a TFJob."""
    region: Optional[str] = None
    """Vertex AI region such as us-central1; required for Vertex AI, unused for a TFJob."""
    workers: int = 0
    """Worker replicas besides the chief."""
    ps: int = 0
    """Parameter-server replicas (parameter-server training)."""
    evaluator: bool = False
    """Whether to add one evaluator replica."""
    machine_type: str = DEFAULT_MACHINE_TYPE
    """Compute Engine machine type of every replica."""
    accelerator: Optional[str] = None
    """GPUs per chief/worker/evaluator replica as TYPE:COUNT, e.g. NVIDIA_TESLA_T4:1."""
    display_name: Optional[str] = None
    """Job name shown in the console; defaults to the experiment name."""
    train_args: List[str] = dataclasses.field(default_factory=list)
    """Extra arguments appended to ``train NAME --model-dir ... --data-dir ...``."""
    package_uri: Optional[str] = None
    """gs:// URI of an already uploaded sdist; when unset, submit() builds and uploads one."""
    image: Optional[str] = None
    """Container image: replaces the prebuilt executor image on Vertex; required for a TFJob."""
    data_dir: Optional[str] = None
    """Where train reads records from; defaults to <job_dir>/data."""

    def validate(self, for_vertex: bool = False) -> None:
        """Raise ConfigError naming the first invalid field.

        ``for_vertex`` also requires ``project`` and ``region``. Drops trailing
        slashes from ``job_dir`` and ``data_dir``.
        """
        if not isinstance(self.experiment, str) or not self.experiment.strip():
            raise ConfigError("The experiment NAME must be a non-empty string; got %r."
                              % (self.experiment,))
        self.job_dir = _check_gs_uri(self.job_dir, "--job-dir")
        if self.data_dir is not None:
            self.data_dir = _check_gs_uri(self.data_dir, "--data-dir")
        if for_vertex:
            if not self.project or not _PROJECT_RE.match(self.project):
                raise ConfigError(
                    "--project must be a Google Cloud project id (6-30 lower-case "
                    "letters, digits or hyphens, starting with a letter), for example "
                    "my-project-123; got %r." % (self.project,))
            if not self.region or not _REGION_RE.match(self.region):
                raise ConfigError(
                    "--region must be a Vertex AI region such as us-central1 or "
                    "europe-west4; got %r." % (self.region,))
        for name in ("workers", "ps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError("--%s must be a whole number >= 0; got %r."
                                  % (name, value))
        if not isinstance(self.evaluator, bool):
            raise ConfigError("evaluator must be True or False; got %r." % (self.evaluator,))
        if not isinstance(self.machine_type, str) or not re.match(
                r"^[a-z][a-z0-9-]*$", self.machine_type):
            raise ConfigError(
                "--machine-type must be a Compute Engine machine type such as %s; "
                "got %r." % (DEFAULT_MACHINE_TYPE, self.machine_type))
        if self.accelerator is not None:
            parse_accelerator(self.accelerator)
        if self.display_name is not None and (
                not self.display_name.strip() or len(self.display_name) > 128):
            raise ConfigError(
                "--display-name must be 1 to 128 characters; got %r." % (self.display_name,))
        if not isinstance(self.train_args, (list, tuple)) or not all(
                isinstance(a, str) for a in self.train_args):
            raise ConfigError("train_args must be a list of strings; got %r."
                              % (self.train_args,))
        for arg in self.train_args:
            flag = arg.split("=", 1)[0]
            if flag in ("--model-dir", "--data-dir"):
                raise ConfigError(
                    "train_args must not contain %s: the job sets it from --job-dir "
                    "(model in <job_dir>/model) or --data-dir." % flag)
        if self.package_uri is not None:
            _check_gs_uri(self.package_uri, "package_uri")

    @property
    def model_dir(self) -> str:
        """Where train writes checkpoints and exports: ``<job_dir>/model``."""
        return self.job_dir.rstrip("/") + "/model"

    @property
    def resolved_data_dir(self) -> str:
        """Where train reads records: ``data_dir`` or ``<job_dir>/data``."""
        return (self.data_dir or self.job_dir.rstrip("/") + "/data").rstrip("/")

    def train_command_args(self) -> List[str]:
        """Arguments after ``python -m experiments``: ``train NAME --model-dir ...``."""
        return (["train", self.experiment, "--model-dir", self.model_dir,
                 "--data-dir", self.resolved_data_dir] + list(self.train_args))


# ------------------------------------------------------------------ Vertex AI body


def prebuilt_image(gpu: bool, region: Optional[str] = None) -> str:
    """URI of the prebuilt TensorFlow 2.15 training image.

    Each image is published in us-, europe- and asia-docker.pkg.dev; any of them
    works anywhere, the nearest one starts faster.

    >>> prebuilt_image(True, "europe-west4")
    'europe-docker.pkg.dev/vertex-ai/training/tf-gpu.2-15.py310:latest'
    """
    host = "us-docker.pkg.dev"
    if region and region.startswith("europe-"):
        host = "europe-docker.pkg.dev"
    elif region and region.startswith("asia-"):
        host = "asia-docker.pkg.dev"
    return _IMAGE_TEMPLATE.format(host=host, kind="gpu" if gpu else "cpu")


def _vertex_pool(spec: JobSpec, replicas: int, with_accelerator: bool) -> Dict[str, Any]:
    machine: Dict[str, Any] = {"machineType": spec.machine_type}
    gpu = bool(with_accelerator and spec.accelerator)
    if gpu:
        kind, count = parse_accelerator(spec.accelerator)
        machine["acceleratorType"] = kind
        machine["acceleratorCount"] = count
    image = spec.image or prebuilt_image(gpu, spec.region)
    return {
        "machineSpec": machine,
        "replicaCount": replicas,
        "pythonPackageSpec": {
            "executorImageUri": image,
            "packageUris": [spec.package_uri],
            "pythonModule": PYTHON_MODULE,
            "args": spec.train_command_args(),
        },
    }


def build_custom_job(spec: JobSpec) -> Dict[str, Any]:
    """Vertex AI CustomJob request body for ``spec``.

    The body is what ``projects.locations.customJobs.create`` takes:
    ``{"displayName": ..., "jobSpec": {"workerPoolSpecs": [...],
    "baseOutputDirectory": {"outputUriPrefix": job_dir}}}``. Pools sit at Vertex's
    fixed indices (0 chief, 1 workers, 2 parameter servers, 3 evaluator); an unused
    pool before a used one is ``{}`` and trailing unused pools are left out.
    Chief, workers and evaluator get the accelerator and the GPU image; parameter
    servers only hold variables, so they run on the CPU image without GPUs.
    ``spec.package_uri`` must be set (``submit`` sets it after uploading).

    Example::

        body = build_custom_job(JobSpec(experiment="fashion_mnist_cnn",
            job_dir="gs://b/run1", region="us-central1",
            package_uri="gs://b/run1/packages/estimator_keras-0.1.0.tar.gz"))
    """
    spec.validate()
    if not spec.package_uri:
        raise ConfigError(
            "JobSpec.package_uri is not set: the CustomJob installs the package from "
            "Cloud Storage. submit() builds and uploads it and fills this in; when "
            "calling build_custom_job yourself, pass package_uri='gs://.../pkg.tar.gz'.")
    pools: List[Dict[str, Any]] = [_vertex_pool(spec, 1, True)]
    pools.append(_vertex_pool(spec, spec.workers, True) if spec.workers else {})
    pools.append(_vertex_pool(spec, spec.ps, False) if spec.ps else {})
    pools.append(_vertex_pool(spec, 1, True) if spec.evaluator else {})
    while pools and not pools[-1]:
        pools.pop()
    return {
        "displayName": spec.display_name or spec.experiment,
        "jobSpec": {
            "workerPoolSpecs": pools,
            "baseOutputDirectory": {"outputUriPrefix": spec.job_dir},
        },
    }


# ------------------------------------------------------------------- Kubeflow TFJob


def _k8s_name(text: str) -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    name = re.sub(r"-{2,}", "-", name)[:63].strip("-")
    if not name:
        raise ConfigError(
            "Cannot make a Kubernetes object name out of %r: it needs letters or "
            "digits (pass --display-name)." % (text,))
    return name


def build_tfjob_manifest(spec: JobSpec, image: Optional[str] = None,
                         namespace: Optional[str] = None,
                         restart_policy: str = "OnFailure") -> Dict[str, Any]:
    """Kubeflow ``kubeflow.org/v1`` TFJob running ``python -m experiments train``.

    Replica specs are Chief (1), Worker, PS and Evaluator, each only when asked for.
    The training-operator injects TF_CONFIG into the container named
    ``tensorflow`` and rejects a replica without one, hence the fixed name. The
    image must already contain this package (a TFJob does not install sdists).
    With an accelerator, chief/worker/evaluator containers get
    ``nvidia.com/gpu`` limits of its count (the type is the cluster's business:
    node pools, not the manifest). ``runPolicy.cleanPodPolicy: Running`` removes
    the parameter servers, which never exit on their own, once the chief is done.

    Example::

        manifest = build_tfjob_manifest(spec, "gcr.io/p/estimator-keras:1")
        print(to_yaml(manifest))
    """
    spec.validate()
    image = image or spec.image
    if not image:
        raise ConfigError(
            "A TFJob needs --image: a container image with this package installed "
            "(for example gcr.io/PROJECT/estimator-keras:TAG).")
    if restart_policy not in ("OnFailure", "Never", "Always", "ExitCode"):
        raise ConfigError("restart_policy must be OnFailure, Never, Always or ExitCode; "
                          "got %r." % (restart_policy,))
    gpus = parse_accelerator(spec.accelerator)[1] if spec.accelerator else 0
    command = ["python", "-m", PYTHON_MODULE] + spec.train_command_args()

    def replica(count: int, with_gpu: bool) -> Dict[str, Any]:
        container: Dict[str, Any] = {"name": "tensorflow", "image": image,
                                     "command": list(command)}
        if with_gpu and gpus:
            container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
        return {"replicas": count, "restartPolicy": restart_policy,
                "template": {"spec": {"containers": [container]}}}

    replicas: Dict[str, Any] = {"Chief": replica(1, True)}
    if spec.workers:
        replicas["Worker"] = replica(spec.workers, True)
    if spec.ps:
        replicas["PS"] = replica(spec.ps, False)
    if spec.evaluator:
        replicas["Evaluator"] = replica(1, True)
    metadata: Dict[str, Any] = {"name": _k8s_name(spec.display_name or spec.experiment)}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": metadata,
        "spec": {"runPolicy": {"cleanPodPolicy": "Running"},
                 "tfReplicaSpecs": replicas},
    }


def _yaml_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    # A JSON string is a valid YAML double-quoted scalar, so quoting is always safe.
    return json.dumps(str(value))


def _yaml_lines(value: Any, indent: int) -> List[str]:
    pad = " " * indent
    lines: List[str] = []
    if isinstance(value, dict):
        if not value:
            return [pad + "{}"]
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                lines.append("%s%s:" % (pad, _yaml_scalar(key)))
                lines.extend(_yaml_lines(item, indent + 2))
            else:
                lines.append("%s%s: %s" % (pad, _yaml_scalar(key), _yaml_inline(item)))
    elif isinstance(value, list):
        if not value:
            return [pad + "[]"]
        for item in value:
            if isinstance(item, (dict, list)) and item:
                nested = _yaml_lines(item, indent + 2)
                lines.append(pad + "- " + nested[0].lstrip())
                lines.extend(nested[1:])
            else:
                lines.append(pad + "- " + _yaml_inline(item))
    else:
        lines.append(pad + _yaml_scalar(value))
    return lines


def _yaml_inline(value: Any) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return _yaml_scalar(value)


def _emit_yaml(data: Any) -> str:
    """Block-style YAML for dicts/lists/scalars, for when PyYAML is missing."""
    return "\n".join(_yaml_lines(data, 0)) + "\n"


def to_yaml(manifest: Mapping[str, Any]) -> str:
    """YAML text of ``manifest`` (PyYAML when importable, else a small emitter)."""
    try:
        import yaml  # pylint: disable=import-outside-toplevel
    except ImportError:
        return _emit_yaml(manifest)
    return yaml.safe_dump(manifest, sort_keys=False, default_flow_style=False)


# ------------------------------------------------------------------------ packaging


def sdist_command(dist_dir: str) -> List[str]:
    """Argument list that builds the sdist into ``dist_dir`` (run in the project root)."""
    return [sys.executable, "setup.py", "sdist", "--dist-dir", dist_dir]


def build_sdist(project_root: str, dist_dir: str) -> str:
    """Build a source distribution of the project; return the .tar.gz path.

    Runs ``python setup.py sdist --dist-dir DIST_DIR`` in ``project_root`` (an
    argument list, no shell). Raises CloudError with the end of the output when
    the build fails or produces no archive.
    """
    setup_py = os.path.join(project_root, "setup.py")
    if not os.path.isfile(setup_py):
        raise CloudError(
            "Cannot build the package to upload: %s does not exist. Submit from a "
            "source checkout of estimator-keras, or pass an uploaded package as "
            "package_uri." % setup_py)
    os.makedirs(dist_dir, exist_ok=True)
    dist_dir = os.path.abspath(dist_dir)
    before = {p: os.path.getmtime(p) for p in glob.glob(os.path.join(dist_dir, "*.tar.gz"))}
    argv = sdist_command(dist_dir)
    logger.info("building sdist: %s (in %s)", argv, project_root)
    try:
        proc = subprocess.run(argv, cwd=project_root, capture_output=True, text=True,
                              timeout=_SDIST_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise CloudError("Building the sdist in %s took over %d s and was stopped."
                         % (project_root, _SDIST_TIMEOUT_S)) from exc
    output = (proc.stdout or "") + (proc.stderr or "")
    if proc.returncode != 0:
        raise CloudError("Building the sdist failed (%s exited %d). Last output:\n%s"
                         % (" ".join(argv[1:]), proc.returncode, _tail(output)))
    built = [p for p in glob.glob(os.path.join(dist_dir, "*.tar.gz"))
             if before.get(p) != os.path.getmtime(p)]
    if not built:
        raise CloudError("`setup.py sdist` succeeded but wrote no .tar.gz into %s. "
                         "Last output:\n%s" % (dist_dir, _tail(output)))
    return max(built, key=os.path.getmtime)


def expected_sdist_name(project_root: str) -> str:
    """Best guess of the sdist file name, read from setup.py without running it.

    Used only to show the upload path in a dry run; falls back to
    ``PACKAGE.tar.gz`` when name or version are not literals.
    """
    try:
        with open(os.path.join(project_root, "setup.py"), encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return "PACKAGE.tar.gz"
    found: Dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id",
                                                  getattr(node.func, "attr", "")) == "setup":
            for kw in node.keywords:
                if kw.arg in ("name", "version") and isinstance(kw.value, ast.Constant) \
                        and isinstance(kw.value.value, str):
                    found[kw.arg] = kw.value.value
    if "version" not in found:
        # setup.py may read the version from the package, as ours does.
        try:
            with open(os.path.join(project_root, "estimator_keras", "__init__.py"),
                      encoding="utf-8") as f:
                match = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M)
            if match:
                found["version"] = match.group(1)
        except OSError:
            pass
    if "name" not in found or "version" not in found:
        return "PACKAGE.tar.gz"
    # `setup.py sdist` runs with this interpreter's setuptools; from 69.3 on it
    # writes PEP 625 names (runs of -_. become _), before that runs of other
    # characters became -.
    try:
        from importlib.metadata import version  # pylint: disable=import-outside-toplevel
        setuptools_version = tuple(int(p) for p in re.findall(r"\d+", version("setuptools"))[:2])
    except Exception:  # pylint: disable=broad-except
        setuptools_version = (99,)
    if setuptools_version >= (69, 3):
        name = re.sub(r"[-_.]+", "_", found["name"]).lower()
    else:
        name = re.sub(r"[^A-Za-z0-9.]+", "-", found["name"])
    return "%s-%s.tar.gz" % (name, found["version"])


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join((text or "").strip().splitlines()[-lines:])


# ------------------------------------------------------------------------ submitting


def gcloud_upload_command(local_path: str, gs_uri: str) -> List[str]:
    """``gcloud storage cp LOCAL GS_URI`` as an argument list."""
    return ["gcloud", "storage", "cp", local_path, gs_uri]


def _pool_flag(pool: Mapping[str, Any]) -> str:
    if not pool:
        return "--worker-pool-spec="
    machine = pool["machineSpec"]
    package = pool["pythonPackageSpec"]
    items = [("machine-type", machine["machineType"]),
             ("replica-count", pool["replicaCount"])]
    if machine.get("acceleratorType"):
        items += [("accelerator-type", machine["acceleratorType"]),
                  ("accelerator-count", machine["acceleratorCount"])]
    items += [("executor-image-uri", package["executorImageUri"]),
              ("python-module", package["pythonModule"])]
    for key, value in items:
        if any(c in str(value) for c in ",="):
            raise CloudError("Cannot pass %s=%r to gcloud --worker-pool-spec: the value "
                             "contains ',' or '='." % (key, value))
    return "--worker-pool-spec=" + ",".join("%s=%s" % kv for kv in items)


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

    The config file holds the request's ``jobSpec``. gcloud rejects an empty
    worker pool inside ``--config`` (checked against gcloud 528: "Exactly one of
    fields [pythonPackageSpec, containerSpec] is required"), although the REST API
    takes one; when a pool in the middle is unused, the pools go in
    ``--worker-pool-spec`` flags instead (an empty flag value is an empty pool)
    with the shared ``--python-package-uris`` and ``--args``, and the config keeps
    the rest of the jobSpec. Flags use the ``--flag=value`` form so that no value
    can be read as another flag.
    """
    job_spec = dict(request["jobSpec"])
    pools = job_spec["workerPoolSpecs"]
    argv = ["gcloud", "ai", "custom-jobs", "create",
            "--project=" + project, "--region=" + region,
            "--display-name=" + request["displayName"]]
    if all(pools):
        return argv + ["--config=" + config_path, "--format=json"], job_spec
    used = [p["pythonPackageSpec"] for p in pools if p]
    if any(p["packageUris"] != used[0]["packageUris"] or p["args"] != used[0]["args"]
           for p in used):
        raise CloudError("gcloud can only give every worker pool the same packages and "
                         "args when a pool is empty; this request differs per pool.")
    config = {k: v for k, v in job_spec.items() if k != "workerPoolSpecs"}
    argv += ["--config=" + config_path]
    argv += [_pool_flag(p) for p in pools]
    argv += [_gcloud_list(used[0]["packageUris"], "--python-package-uris"),
             _gcloud_list(used[0]["args"], "--args"),
             "--format=json"]
    return argv, config


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
                "submit again. gcloud said:\n%s" % (what, _tail(text)))
        if any(m in lowered for m in _PERMISSION_MARKERS):
            raise CloudError(
                "Permission denied while %s: the signed-in account needs write access "
                "to the bucket and permission to create Vertex AI custom jobs in the "
                "project. gcloud said:\n%s" % (what, _tail(text)))
        raise CloudError("gcloud failed (exit %d) while %s. gcloud said:\n%s"
                         % (proc.returncode, what, _tail(text)))
    return proc


def _split_gs(uri: str) -> Tuple[str, str]:
    match = _GCS_RE.match(uri)
    if not match or not (match.group(2) or "").strip("/"):
        raise ConfigError("Expected gs://BUCKET/OBJECT; got %r." % (uri,))
    return match.group(1), match.group(2).lstrip("/")


def _snake_case(data: Any) -> Any:
    # The SDK builds proto-plus messages, which take proto field names, not JSON names.
    if isinstance(data, dict):
        return {re.sub(r"(?<!^)([A-Z])", r"_\1", k).lower(): _snake_case(v)
                for k, v in data.items()}
    if isinstance(data, list):
        return [_snake_case(v) for v in data]
    return data


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
    install one. ``backend`` forces ``"gcloud"`` or ``"sdk"``.

    Example::

        s = Submitter()
        uri = s.upload("dist/pkg.tar.gz", "gs://b/run1/packages/pkg.tar.gz")
        job = s.create_job(build_custom_job(spec), "my-proj", "us-central1")
    """

    def __init__(self, backend: Optional[str] = None):
        if backend not in (None, "gcloud", "sdk"):
            raise ConfigError("Submitter backend must be 'gcloud', 'sdk' or None; got %r."
                              % (backend,))
        self._backend = backend

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
        _split_gs(gs_uri)
        if not os.path.isfile(local_path):
            raise CloudError("Cannot upload %s: no such file." % local_path)
        what = "uploading %s to %s" % (local_path, gs_uri)
        if self.backend == "gcloud":
            _run_gcloud(gcloud_upload_command(local_path, gs_uri), what)
            return gs_uri
        _, storage = self._import_sdk()
        bucket, blob = _split_gs(gs_uri)
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
        what = "creating the Vertex AI custom job %r" % request.get("displayName")
        if self.backend == "gcloud":
            workdir = tempfile.mkdtemp(prefix="vertex-job-")
            try:
                config_path = os.path.join(workdir, "job_spec.json")
                argv, config = gcloud_create_command(request, project, region, config_path)
                with open(config_path, "w", encoding="utf-8") as f:
                    json.dump(config, f, indent=2)
                proc = _run_gcloud(argv, what)
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
            try:
                return json.loads(proc.stdout)
            except ValueError:
                return {"output": (proc.stdout or "").strip()}
        aiplatform, _ = self._import_sdk()
        job_spec = request["jobSpec"]
        base_dir = job_spec.get("baseOutputDirectory", {}).get("outputUriPrefix")
        try:
            job = aiplatform.CustomJob(
                display_name=request["displayName"],
                worker_pool_specs=_snake_case(job_spec["workerPoolSpecs"]),
                base_output_dir=base_dir, staging_bucket=base_dir,
                project=project, location=region)
            if hasattr(job, "submit"):
                job.submit()
            else:
                job.run(sync=False)
            name = job.resource_name
        except Exception as exc:  # pylint: disable=broad-except
            raise _sdk_error(exc, what) from exc
        return {"name": name, "displayName": request["displayName"]}


def default_project_root() -> str:
    """The source checkout this module sits in (the folder holding setup.py)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def submit(spec: JobSpec, dry_run: bool = False, submitter: Optional[Submitter] = None,
           project_root: Optional[str] = None) -> Dict[str, Any]:
    """Package, upload and start ``spec`` as a Vertex AI CustomJob.

    In order: build the sdist (:func:`build_sdist`), upload it to
    ``<job_dir>/packages/<file>``, build the request (:func:`build_custom_job`),
    create the job. With ``spec.package_uri`` set, the first two steps are skipped.

    With ``dry_run`` nothing is built, uploaded or created: the result holds the
    request and, as argument lists, the commands a real run would amount to
    (``gcloud`` form; the real run uses a temporary dist folder and config file).

    Returns ``{"dry_run", "request", "package_uri"}`` plus ``"commands"`` and
    ``"config"`` (the --config content) for a dry run, or ``"job"`` otherwise.
    """
    spec.validate(for_vertex=True)
    project_root = project_root or default_project_root()
    if dry_run:
        commands: List[List[str]] = []
        planned = dataclasses.replace(spec)
        if not planned.package_uri:
            file_name = expected_sdist_name(project_root)
            planned.package_uri = "%s/packages/%s" % (spec.job_dir, file_name)
            commands.append(sdist_command("dist"))
            commands.append(gcloud_upload_command(os.path.join("dist", file_name),
                                                  planned.package_uri))
        request = build_custom_job(planned)
        create_argv, config = gcloud_create_command(request, spec.project, spec.region,
                                                    "job_spec.json")
        commands.append(create_argv)
        return {"dry_run": True, "request": request, "package_uri": planned.package_uri,
                "commands": commands, "config": config}

    submitter = submitter or Submitter()
    spec = dataclasses.replace(spec)
    if not spec.package_uri:
        dist_dir = tempfile.mkdtemp(prefix="estimator-keras-sdist-")
        try:
            archive = build_sdist(project_root, dist_dir)
            spec.package_uri = submitter.upload(
                archive, "%s/packages/%s" % (spec.job_dir, os.path.basename(archive)))
        finally:
            shutil.rmtree(dist_dir, ignore_errors=True)
    request = build_custom_job(spec)
    job = submitter.create_job(request, spec.project, spec.region)
    return {"dry_run": False, "request": request, "package_uri": spec.package_uri,
            "job": job}


# ---------------------------------------------------------------------- job side


def _parent_uri(path: str) -> str:
    stripped = path.rstrip("/")
    head, sep, _ = stripped.rpartition("/")
    if not sep or head.endswith(":/") or head.endswith(":") or not head:
        return stripped
    return head


def _join(base: str, *parts: str) -> str:
    out = base.rstrip("/")
    for part in parts:
        part = part.replace(os.sep, "/").strip("/")
        if part and part != ".":
            out += "/" + part
    return out


def resolve_vertex_environment(model_dir: Optional[str] = None,
                               env: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """Directories a training run should use, from ``--model-dir`` or Vertex's AIP_* vars.

    Vertex sets, when the job has a base output directory B: ``AIP_MODEL_DIR`` =
    B/model/ (where the final, servable model belongs), ``AIP_CHECKPOINT_DIR`` =
    B/checkpoints/ and ``AIP_TENSORBOARD_LOG_DIR`` = B/logs/.

    Mapping (keys of the result):

    * ``model_dir`` -- the Estimator's model_dir (checkpoints and event files):
      ``model_dir`` when given (it wins over everything), else
      ``AIP_CHECKPOINT_DIR``, else the parent of ``AIP_MODEL_DIR`` (B).
    * ``checkpoint_dir`` -- same as ``model_dir``: an Estimator checkpoints there.
    * ``tensorboard_dir`` -- with an explicit ``model_dir``, that folder (the
      Estimator's summaries are there); else ``AIP_TENSORBOARD_LOG_DIR`` when set,
      else ``model_dir``.
    * ``export_dir`` -- where to write the final exported model: with an explicit
      ``model_dir``, ``<model_dir>/export``; else ``AIP_MODEL_DIR`` when set, else
      ``<model_dir>/export``.
    * ``source`` -- ``"flag"`` or ``"vertex"``.

    Trailing slashes are removed. Raises ConfigError when neither ``model_dir``
    nor any AIP_* directory is available.

    >>> resolve_vertex_environment(env={"AIP_MODEL_DIR": "gs://b/j/model/",
    ...     "AIP_CHECKPOINT_DIR": "gs://b/j/checkpoints/",
    ...     "AIP_TENSORBOARD_LOG_DIR": "gs://b/j/logs/"})["model_dir"]
    'gs://b/j/checkpoints'
    """
    env = os.environ if env is None else env
    if model_dir:
        base = model_dir.rstrip("/") or model_dir
        return {"model_dir": base, "checkpoint_dir": base, "tensorboard_dir": base,
                "export_dir": _join(base, "export"), "source": "flag"}
    aip_model = (env.get("AIP_MODEL_DIR") or "").strip()
    aip_ckpt = (env.get("AIP_CHECKPOINT_DIR") or "").strip()
    aip_logs = (env.get("AIP_TENSORBOARD_LOG_DIR") or "").strip()
    if aip_ckpt:
        base = aip_ckpt.rstrip("/")
    elif aip_model:
        base = _parent_uri(aip_model)
    else:
        raise ConfigError(
            "No model directory: pass --model-dir DIR, or run under Vertex AI with a "
            "base output directory so that AIP_MODEL_DIR / AIP_CHECKPOINT_DIR are set.")
    return {
        "model_dir": base,
        "checkpoint_dir": base,
        "tensorboard_dir": aip_logs.rstrip("/") if aip_logs else base,
        "export_dir": aip_model.rstrip("/") if aip_model else _join(base, "export"),
        "source": "vertex",
    }


def copy_to_remote(local_path: str, remote_path: str) -> List[str]:
    """Copy a file, or a directory tree, to ``remote_path`` with ``tf.io.gfile``.

    Keras' HDF5 writer (h5py) only writes local files, so a model is saved
    locally first and copied with this to ``gs://``. ``remote_path`` is the
    destination itself (a file for a file, a folder for a folder); existing
    files are replaced. Each file is written under a temporary name and renamed,
    so a reader never sees half a file (on GCS a rename is a copy and delete, so
    that holds per object, not per tree). Returns the destination files written.

    Example::

        model.save("/tmp/m.h5")
        copy_to_remote("/tmp/m.h5", os.environ["AIP_MODEL_DIR"] + "model.h5")
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    gfile = tf.io.gfile
    if not gfile.exists(local_path):
        raise CloudError("Cannot copy %s to %s: the local path does not exist."
                         % (local_path, remote_path))
    if "://" not in remote_path and gfile.isdir(local_path):
        src, dst = os.path.abspath(local_path), os.path.abspath(remote_path)
        if dst == src or dst.startswith(src.rstrip(os.sep) + os.sep):
            raise CloudError("Cannot copy %s into %s: the destination is inside the "
                             "source." % (local_path, remote_path))

    def copy_file(src: str, dst: str) -> None:
        tmp = "%s.tmp-%s" % (dst, uuid.uuid4().hex)
        try:
            gfile.copy(src, tmp, overwrite=True)
            gfile.rename(tmp, dst, overwrite=True)
        except tf.errors.OpError as exc:
            try:
                if gfile.exists(tmp):
                    gfile.remove(tmp)
            except tf.errors.OpError:
                pass
            raise CloudError("Copying %s to %s failed: %s" % (src, dst, exc.message)) from exc

    written: List[str] = []
    if not gfile.isdir(local_path):
        parent = _parent_uri(remote_path) if "://" in remote_path else os.path.dirname(
            os.path.abspath(remote_path))
        if parent:
            gfile.makedirs(parent)
        copy_file(local_path, remote_path)
        return [remote_path]
    started = time.time()
    for root, _, files in gfile.walk(local_path):
        rel = os.path.relpath(root, local_path)
        dest_root = _join(remote_path, rel)
        gfile.makedirs(dest_root)
        for name in sorted(files):
            dst = _join(dest_root, name)
            copy_file(os.path.join(root, name), dst)
            written.append(dst)
    logger.info("copied %d files from %s to %s in %.1f s", len(written), local_path,
                remote_path, time.time() - started)
    return written


__all__ = [
    "DEFAULT_MACHINE_TYPE", "VERTEX_GPU_TYPES", "JobSpec", "Submitter",
    "build_custom_job", "build_sdist", "build_tfjob_manifest", "copy_to_remote",
    "expected_sdist_name", "gcloud_create_command", "gcloud_upload_command",
    "parse_accelerator", "prebuilt_image", "resolve_vertex_environment",
    "sdist_command", "submit", "to_yaml",
]
