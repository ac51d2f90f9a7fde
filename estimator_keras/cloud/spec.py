"""What a cloud job runs and on which machines: :class:`JobSpec` and its checks.

Also the values every request builder shares: the accelerator syntax
(:func:`parse_accelerator`, :data:`VERTEX_GPU_TYPES`), the default machine
type, the module a job runs (:data:`PYTHON_MODULE`) and the prebuilt training
image of an engine (:func:`prebuilt_image`). What an engine needs of a job
(its image, its Keras backends, the tasks it runs) is its registry entry's
(:mod:`estimator_keras.engines.registry`). TF-free.

Prebuilt training images, from Google's list of supported frameworks for
custom training (read 2026):
https://cloud.google.com/vertex-ai/docs/supported-frameworks-list, also at
https://docs.cloud.google.com/gemini-enterprise-agent-platform/machine-learning/supported-frameworks

* ``tf-cpu.2-15.py310`` / ``tf-gpu.2-15.py310``: TensorFlow 2.15, which still
  has ``tf.estimator``; end of patch and support Nov 14, 2024, end of
  availability Nov 14, 2025.
* ``tf-cpu.2-17.py310`` / ``tf-gpu.2-17.py310``: TensorFlow 2.17, the newest
  TensorFlow training image listed; end of patch and support Jul 11, 2025, end of
  availability Jul 11, 2026. Its PyPI packages are ``tensorflow 2.17.x`` and
  ``cloudml-hypertune``, without ``tf-keras``, so the sdist of a job for an
  engine that needs Keras 2 as ``tf.keras`` requires ``tf-keras~=2.17.0``
  (its entry's ``image_requires``).

Each image is published in us-, europe- and asia-docker.pkg.dev.
"""

import dataclasses
import re
from typing import Dict, List, Optional, Tuple

from estimator_keras import io
from estimator_keras.cloud.vertex_options import VertexOptions
from estimator_keras.engines import registry
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

_IMAGE_TEMPLATE = "{host}/vertex-ai/training/tf-{kind}.{version}.py310:latest"

_ACCELERATOR_RE = re.compile(r"^\s*([A-Za-z0-9_]+)\s*:\s*([0-9]+)\s*$")
_GCS_RE = re.compile(r"^gs://([a-z0-9][a-z0-9._-]{1,220}[a-z0-9])(/.*)?$")
_PROJECT_RE = re.compile(r"^([a-z0-9.-]+:)?[a-z][a-z0-9-]{4,28}[a-z0-9]$")
_REGION_RE = re.compile(r"^[a-z]+(-[a-z]+)+[0-9]+$")
_EXAMPLE_ACCELERATOR = "NVIDIA_TESLA_T4:1"
_MODULE_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


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
    """gs:// directory of the job, Vertex's base output directory: Vertex sets
    AIP_MODEL_DIR=<job_dir>/model/ (the export), AIP_CHECKPOINT_DIR=<job_dir>/checkpoints/
    and AIP_TENSORBOARD_LOG_DIR=<job_dir>/logs/; the package goes to <job_dir>/packages.
    A TFJob or JAXJob trains with --model-dir <job_dir>/model."""
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
    """Extra arguments appended to ``train NAME --data-dir ...``."""
    package_uri: Optional[str] = None
    """gs:// URI of an already uploaded sdist; when unset, submit() builds and uploads one."""
    image: Optional[str] = None
    """Executor image for Vertex's pythonPackageSpec, replacing the prebuilt one;
    the image of a TFJob or JAXJob (as ``container_image``)."""
    data_dir: Optional[str] = None
    """Where train reads records from; defaults to <job_dir>/data."""
    engine: str = "auto"
    """``--engine`` of train; picks the prebuilt image (see :func:`prebuilt_image`):
    ``auto`` runs on the image of the engine ``auto`` picks first."""
    container_image: Optional[str] = None
    """An image with this package installed (the repository's Dockerfile): Vertex
    runs it with containerSpec and no sdist is built or uploaded."""
    modules: List[str] = dataclasses.field(default_factory=list)
    """The user's modules that register experiments and datasets, passed as
    ``--module MOD`` before ``train``. A job that installs packages imports
    them by dotted name (from a package in :attr:`package_dirs`); a job run
    from an image takes whatever the image holds."""
    package_dirs: List[str] = dataclasses.field(default_factory=list)
    """Local folders of the user's own packages (``setup.py`` or
    ``pyproject.toml``): submit() builds each one's sdist and uploads it beside
    this package's into :attr:`extra_package_uris`."""
    extra_package_uris: List[str] = dataclasses.field(default_factory=list)
    """gs:// URIs of the user's uploaded sdists, which the job installs after
    this package's."""
    config: Optional[str] = None
    """train's ``--config`` file: a gs:// URI passed as it is, or a local file
    that submit() uploads to :attr:`config_uri`. A TFJob passes it as given
    (the image holds it)."""
    keras_backend: Optional[str] = None
    """KERAS_BACKEND of the job's containers, for an engine that trains on
    Keras 3's backends: one of its entry's ``backends`` (None: the first)."""
    vertex: VertexOptions = dataclasses.field(default_factory=VertexOptions)
    """What a Vertex AI job asks beyond its pools: Spot VMs or Flex-start,
    restarts, timeout, service account, network, persistent resource, web
    access, TensorBoard, reducers (see
    :mod:`~estimator_keras.cloud.vertex_options`)."""

    def validate(self, for_vertex: bool = False) -> None:
        """Raise ConfigError naming the first invalid field.

        ``for_vertex`` also requires ``project`` and ``region``, and module
        names that a job installing packages can import
        (:meth:`check_package_modules`). Drops trailing slashes from
        ``job_dir`` and ``data_dir``.
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
                    "(Vertex's AIP_* directories under it, or <job_dir>/model for a "
                    "TFJob) or --data-dir." % flag)
            if flag in ("--config", "--module"):
                raise ConfigError(
                    "train_args must not contain %s: set JobSpec.%s, which puts it where "
                    "each platform needs it." % (flag, {"--config": "config",
                                                       "--module": "modules"}[flag]))
        if self.package_uri is not None:
            _check_gs_uri(self.package_uri, "package_uri")
        if self.engine not in registry.choices():
            raise ConfigError("--engine must be one of %s; got %r."
                              % (", ".join(registry.choices()), self.engine))
        if any(a.split("=", 1)[0] == "--engine" for a in self.train_args):
            raise ConfigError("train_args must not contain --engine: set JobSpec.engine, "
                              "which also picks the prebuilt image.")
        for name in ("image", "container_image"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()
                                      or any(c.isspace() for c in value)):
                raise ConfigError("--%s must be an image URI such as "
                                  "us-docker.pkg.dev/PROJECT/REPO/estimator-keras:TAG; got %r."
                                  % (name.replace("_", "-"), value))
        if self.image and self.container_image:
            raise ConfigError(
                "--image (the executor image that installs the uploaded package) and "
                "--container-image (an image with the package already installed) "
                "exclude each other: give one.")
        check_job_engine(self.engine, self.keras_backend, self.workers, self.ps,
                         self.evaluator)
        if not isinstance(self.vertex, VertexOptions):
            raise ConfigError("JobSpec.vertex must be a VertexOptions; got %r." % (self.vertex,))
        self.vertex.check(self, job_entry(self.engine))
        if for_vertex:
            self.check_vertex_image()
        self._validate_user_code(for_vertex)

    def check_vertex_image(self) -> None:
        """ConfigError for a job without ``container_image`` whose engine no
        prebuilt training image serves."""
        entry = job_entry(self.engine)
        if entry.prebuilt_image is None and not self.container_image:
            raise ConfigError(
                "--engine %s on Vertex AI needs --container-image URI: %s, which no Google "
                "prebuilt training image has (so neither --image nor the default executor "
                "image will do)." % (self.engine, entry.image_hint or "an image with this "
                                     "package and what the engine needs installed"))

    def _validate_user_code(self, for_vertex: bool) -> None:
        for name in ("modules", "package_dirs", "extra_package_uris"):
            value = getattr(self, name)
            if not isinstance(value, (list, tuple)) or not all(
                    isinstance(v, str) and v.strip() for v in value):
                raise ConfigError("%s must be a list of non-empty strings; got %r."
                                  % (name, value))
        for uri in self.extra_package_uris:
            _check_gs_uri(uri, "extra_package_uris")
        if self.config is not None and (not isinstance(self.config, str)
                                        or not self.config.strip()):
            raise ConfigError("--config must name a YAML or JSON file; got %r." % (self.config,))
        if self.package_dirs and self.container_image:
            raise ConfigError(
                "--package-dir cannot go with --container-image: a job run from an image "
                "installs nothing, so the image must already contain your code (build "
                "it into the image and pass --module), or drop --container-image to "
                "have the packages installed on the prebuilt image.")
        if for_vertex:
            self.check_package_modules()

    def check_package_modules(self) -> None:
        """A job that pip-installs packages imports :attr:`modules` by name:
        ConfigError for a file or folder path (a containerSpec job, which runs
        an image, takes any)."""
        if self.container_image:
            return
        for module in self.modules:
            if module.endswith(".py") or not _MODULE_NAME_RE.match(module):
                raise ConfigError(
                    "--module %s is not a dotted module name. A Vertex AI job pip-installs "
                    "the packages (this one and each --package-dir) and then imports "
                    "--module by name, so a file or folder path does not exist there: "
                    "pass the name your package installs, e.g. --module my_experiments "
                    "(py_modules=['my_experiments'] in its setup.py), or declare the "
                    "module as an entry point in the group estimator_keras.experiments. "
                    "With --container-image the image's own paths work." % module)

    @property
    def container_env(self) -> Dict[str, str]:
        """Environment variables every container of the job gets: KERAS_BACKEND
        for an engine that trains on Keras 3's backends, nothing otherwise."""
        backends = job_entry(self.engine).backends
        if not backends:
            return {}
        return {"KERAS_BACKEND": self.keras_backend or backends[0]}

    @property
    def model_dir(self) -> str:
        """``<job_dir>/model``: AIP_MODEL_DIR on Vertex, --model-dir of a TFJob."""
        return io.join(self.job_dir.rstrip("/"), "model")

    @property
    def image_engine(self) -> str:
        """The engine whose prebuilt image the job runs on (``auto``: the one
        ``auto`` picks first)."""
        return job_entry(self.engine).name

    @property
    def package_requires(self) -> List[str]:
        """Requirements the uploaded sdist adds for the prebuilt image it runs on."""
        if not self.image and not self.container_image:
            return list(job_entry(self.engine).image_requires)
        return []

    @property
    def config_uri(self) -> Optional[str]:
        """Where the job reads :attr:`config`: the gs:// URI as given, or
        ``<job_dir>/config/<file name>`` for a local file (submit() uploads it)."""
        if not self.config or self.config.startswith("gs://"):
            return self.config
        return io.join(self.job_dir.rstrip("/"), "config", io.basename(self.config))

    @property
    def resolved_data_dir(self) -> str:
        """Where train reads records: ``data_dir`` or ``<job_dir>/data``."""
        return (self.data_dir or io.join(self.job_dir.rstrip("/"), "data")).rstrip("/")

    def train_command_args(self, with_model_dir: bool = False,
                           upload_config: bool = True) -> List[str]:
        """Arguments after ``python -m experiments``: ``[--module MOD ...] train
        NAME --data-dir ...``.

        Vertex jobs pass no ``--model-dir``: the job follows the AIP_* variables
        that the base output directory makes Vertex set. ``with_model_dir`` adds
        ``--model-dir <job_dir>/model`` for platforms without them (a TFJob).
        ``--config`` is :attr:`config_uri`, or :attr:`config` as given with
        ``upload_config=False`` (a TFJob, whose image holds the file).
        """
        args = [arg for module in self.modules for arg in ("--module", module)]
        args += ["train", self.experiment]
        if with_model_dir:
            args += ["--model-dir", self.model_dir]
        args += ["--data-dir", self.resolved_data_dir]
        if self.engine != registry.AUTO:
            args += ["--engine", self.engine]
        config = self.config_uri if upload_config else self.config
        if config:
            args += ["--config", config]
        return args + list(self.train_args)


def job_entry(engine: str) -> registry.Entry:
    """The registry entry a job of ``--engine engine`` runs: ``auto`` is the
    engine it picks first where that engine's image has it (the first of
    the registry's auto order), an unknown name a ConfigError."""
    if engine == registry.AUTO:
        return (registry.auto_order() or registry.entries())[0]
    return registry.get(engine)


def keras_backends() -> Tuple[str, ...]:
    """Every ``--keras-backend`` some engine trains on, defaults first."""
    found: List[str] = []
    for entry in registry.entries():
        found += [b for b in entry.backends if b not in found]
    return tuple(found)


def check_job_engine(engine: str, keras_backend: Optional[str], workers: int = 0,
                     ps: int = 0, evaluator: bool = False) -> None:
    """ConfigError for what the engine cannot run of a job: ``--keras-backend``
    on an engine without Keras 3 backends or outside its backends, parameter
    servers or an evaluator it has no tasks for, several processes on a
    backend that trains one."""
    entry = job_entry(engine)
    if not entry.backends:
        if keras_backend is not None:
            with_backends = [e.name for e in registry.entries() if e.backends]
            raise ConfigError(
                "--keras-backend applies to %s only (it sets KERAS_BACKEND in the job's "
                "containers); the %s engine trains with TensorFlow's own Keras. Drop "
                "--keras-backend, or add --engine %s."
                % (" or ".join("--engine " + n for n in with_backends), entry.name,
                   with_backends[0] if with_backends else "NAME"))
        return
    if keras_backend is not None and keras_backend not in entry.backends:
        raise ConfigError("--keras-backend must be one of %s; got %r."
                          % (", ".join(entry.backends), keras_backend))
    missing = [(flag, task) for flag, task in (("--ps %d" % ps, "ps"),
                                               ("--evaluator", "evaluator"))
               if (ps if task == "ps" else evaluator) and task not in entry.cluster.tasks]
    if missing:
        flag, task = missing[0]
        instead, what = (("add training processes with --workers N", "parameter-server training")
                         if task == "ps" else
                         ("the job evaluates as it trains, every --eval-every steps",
                          "a separate evaluator"))
        others = [e.name for e in registry.entries() if task in e.cluster.tasks]
        raise ConfigError(
            "%s cannot go with --engine %s: it %s, every process a worker that trains and "
            "evaluates, so there are no parameter servers and no evaluator task. Drop %s "
            "(%s)%s."
            % (flag, entry.name, entry.cluster.how, flag.split()[0], instead,
               ", or use --engine %s (on Vertex AI or --target tfjob) for %s"
               % (others[0], what) if others else ""))
    backend = keras_backend or entry.backends[0]
    if workers and backend not in entry.multi_process_backends:
        raise ConfigError(
            "--keras-backend %s cannot train with --workers %d: %s. Use --keras-backend %s "
            "(the default), whose processes train together, or drop --workers to train on "
            "one machine." % (backend, workers, entry.no_tf_multi_worker or
                              "the %s engine trains one process on it" % entry.name,
                              " or ".join(entry.multi_process_backends) or "another"))


def prebuilt_image(gpu: bool, region: Optional[str] = None, engine: str = registry.AUTO) -> str:
    """URI of the prebuilt training image for ``engine`` (its registry entry's
    ``prebuilt_image``: TensorFlow 2.15 for the estimator, 2.17 for the keras
    engine).

    Each image is published in us-, europe- and asia-docker.pkg.dev; any of them
    works anywhere, the nearest one starts faster.

    >>> prebuilt_image(True, "europe-west4")
    'europe-docker.pkg.dev/vertex-ai/training/tf-gpu.2-15.py310:latest'
    >>> prebuilt_image(False, "us-central1", engine="keras")
    'us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-17.py310:latest'
    """
    host = "us-docker.pkg.dev"
    if region and region.startswith("europe-"):
        host = "europe-docker.pkg.dev"
    elif region and region.startswith("asia-"):
        host = "asia-docker.pkg.dev"
    version = job_entry(engine).prebuilt_image
    if version is None:
        raise ConfigError("no prebuilt training image runs --engine %s: pass --container-image "
                          "(%s)." % (engine, job_entry(engine).image_hint))
    return _IMAGE_TEMPLATE.format(host=host, kind="gpu" if gpu else "cpu", version=version)
