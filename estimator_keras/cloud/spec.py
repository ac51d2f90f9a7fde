"""What a cloud job runs and on which machines: :class:`JobSpec` and its checks.

Also the values every request builder shares: the accelerator syntax
(:func:`parse_accelerator`, :data:`VERTEX_GPU_TYPES`), the default machine
type, the module a job runs (:data:`PYTHON_MODULE`) and the prebuilt training
images (:func:`prebuilt_image`). TF-free.
"""

import dataclasses
import re
from typing import List, Optional, Tuple

from estimator_keras.errors import ConfigError

DEFAULT_MACHINE_TYPE = "n1-standard-8"
"""n1 is the machine family T4, V100, P100 and P4 GPUs attach to; 8 vCPUs keep a
tf.data pipeline fed for one or two of them. A100, L4 and H100 GPUs need their own
machine families (a2, g2, a3): pass ``--machine-type`` with those."""

PYTHON_MODULE = "experiments"
"""Module Vertex runs (``python -m experiments train ...``) after installing the sdist."""

# Every NVIDIA value of MachineSpec.AcceleratorType except the retired K80.
# TPUs are left out on purpose: they need the tf-tpu image and a cloud-tpu machine
# type, which the request builders do not configure.
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

_IMAGE_TEMPLATE = "{host}/vertex-ai/training/tf-{kind}.2-15.py310:latest"

_ACCELERATOR_RE = re.compile(r"^\s*([A-Za-z0-9_]+)\s*:\s*([0-9]+)\s*$")
_GCS_RE = re.compile(r"^gs://([a-z0-9][a-z0-9._-]{1,220}[a-z0-9])(/.*)?$")
_PROJECT_RE = re.compile(r"^([a-z0-9.-]+:)?[a-z][a-z0-9-]{4,28}[a-z0-9]$")
_REGION_RE = re.compile(r"^[a-z]+(-[a-z]+)+[0-9]+$")
_EXAMPLE_ACCELERATOR = "NVIDIA_TESLA_T4:1"


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


def split_gs_uri(uri: str) -> Tuple[str, str]:
    """``gs://BUCKET/OBJECT`` as ``(BUCKET, OBJECT)``; ConfigError for anything else."""
    match = _GCS_RE.match(uri)
    if not match or not (match.group(2) or "").strip("/"):
        raise ConfigError("Expected gs://BUCKET/OBJECT; got %r." % (uri,))
    return match.group(1), match.group(2).lstrip("/")


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
