"""What a Vertex AI job asks beyond its worker pools: :class:`VertexOptions`.

Scheduling (Spot VMs, Flex-start with its longest wait, restarting the whole
job when a worker restarts, a timeout), the identity and network the job runs
with, a persistent resource to run on, interactive shells, a Vertex AI
TensorBoard to stream to, and Reduction Server reducers in worker pool 2.
:meth:`VertexOptions.check` refuses what Vertex or the job cannot take,
:func:`job_spec_fields` writes the ``CustomJobSpec`` fields (the same in a
CustomJob's ``jobSpec`` and a tuning job's ``trialJobSpec``),
:func:`reduction_server_pool` the reducers' pool and :func:`job_args` the
strategy a job with reducers trains with. TF-free; it imports no other module
of :mod:`estimator_keras.cloud`, so :class:`~estimator_keras.cloud.spec.JobSpec`
can hold one.

Sources (read 2026):

* ``Scheduling`` (``strategy`` SPOT or FLEX_START, ``maxWaitDuration``,
  ``restartJobOnWorkerRestart``, ``timeout``), ``serviceAccount``, ``network``
  (``projects/{project number}/global/networks/{name}``),
  ``persistentResourceId``, ``enableWebAccess``, ``tensorboard``
  (``projects/{project}/locations/{location}/tensorboards/{id}``):
  https://cloud.google.com/vertex-ai/docs/reference/rest/v1/CustomJobSpec and
  google-cloud-aiplatform's ``aiplatform_v1.CustomJobSpec`` and ``Scheduling``.
* Flex-start (Dynamic Workload Scheduler): L4, A100, H100, H200 or B200 GPUs, a
  timeout of 7 days or less, the same machine configuration in every worker
  pool; ``maxWaitDuration`` 0 waits indefinitely, the default is a day:
  https://cloud.google.com/vertex-ai/docs/training/schedule-jobs-dws
* Reduction Server: worker pool 2 runs
  ``{us,europe,asia}-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest``
  on CPU machines (n1-highcpu-16 recommended), for GPU workers whose framework
  all-reduces with NCCL; prebuilt TensorFlow training images (2.3+) carry its
  NCCL plugin, a custom image needs the ``google-reduction-server`` package:
  https://cloud.google.com/vertex-ai/docs/training/distributed-training
* Vertex AI TensorBoard with custom training requires a service account
  (roles/storage.admin and roles/aiplatform.user), and the job, the
  TensorBoard instance and a regional bucket in one region:
  https://cloud.google.com/vertex-ai/docs/experiments/tensorboard-setup and
  https://cloud.google.com/vertex-ai/docs/experiments/tensorboard-training
"""

import dataclasses
import re
from typing import Any, Dict, List, Optional

from estimator_keras.engines import registry
from estimator_keras.errors import ConfigError

DEFAULT_REDUCTION_SERVER_MACHINE_TYPE = "n1-highcpu-16"
"""Google's recommended reducer: 16 vCPUs with 32 Gbps of egress, no GPU."""

REDUCTION_SERVER_IMAGE = "{host}/vertex-ai-restricted/training/reductionserver:latest"
"""Google's Reduction Server image; ``host`` is us-, europe- or asia-docker.pkg.dev."""

REDUCTION_SERVER_STRATEGY = "multi_worker_mirrored"
"""The strategy a job with reducers trains with: TensorFlow's NCCL all-reduce
across workers, which the reducers take over."""

FLEX_START_GPUS = ("L4", "A100", "H100", "H200", "B200")
"""GPU families Dynamic Workload Scheduler provisions (matched in the
MachineSpec.acceleratorType name)."""

FLEX_START_MAX_TIMEOUT_S = 7 * 24 * 3600
"""The longest ``--timeout`` of a Flex-start job."""

_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_DURATION_RE = re.compile(r"^(?:\d+(?:\.\d+)?[dhms])+$")
_DURATION_PART_RE = re.compile(r"(\d+(?:\.\d+)?)([dhms])")
_SERVICE_ACCOUNT_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*@[a-z0-9][a-z0-9.-]*\.[a-z]+$")
_NETWORK_RE = re.compile(r"^projects/([^/]+)/global/networks/([^/]+)$")
_NETWORK_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_RESOURCE_ID_RE = re.compile(r"^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$")
_TENSORBOARD_RE = re.compile(r"^projects/([^/]+)/locations/([^/]+)/tensorboards/([^/]+)$")
_MACHINE_TYPE_RE = re.compile(r"^[a-z][a-z0-9-]*$")


def parse_duration(text: Any, flag: str, allow_zero: bool = False) -> str:
    """``text`` (``3600s``, ``90m``, ``2h``, ``1h30m``, ``1d``, or a bare number
    of seconds) as Google's Duration JSON form, whole seconds: ``"5400s"``.

    >>> parse_duration("1h30m", "--timeout")
    '5400s'
    """
    value = text.strip().lower() if isinstance(text, str) else text
    seconds = None
    if isinstance(value, int) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and re.fullmatch(r"\d+(?:\.\d+)?", value):
        seconds = float(value)
    elif isinstance(value, str) and _DURATION_RE.match(value):
        seconds = sum(float(n) * _UNITS[u] for n, u in _DURATION_PART_RE.findall(value))
    if seconds is None or seconds != int(seconds) or seconds < 0 or (
            seconds == 0 and not allow_zero):
        raise ConfigError(
            "%s must be a duration of %swhole seconds such as 3600s, 90m, 2h or 1h30m "
            "(units d, h, m, s; a bare number is seconds); got %r."
            % (flag, "zero or more " if allow_zero else "one or more ", text))
    return "%ds" % int(seconds)


def _seconds(duration: str) -> int:
    return int(duration[:-1])


def _strategy(train_args) -> str:
    """``--strategy`` among the job's train arguments, or "auto"."""
    args = list(train_args)
    for index, arg in enumerate(args):
        if arg.startswith("--strategy="):
            return arg.split("=", 1)[1]
        if arg == "--strategy" and index + 1 < len(args):
            return args[index + 1]
    return "auto"


@dataclasses.dataclass
class VertexOptions:
    """A Vertex AI job's options beyond its worker pools (``submit``'s "Vertex
    AI job" flags); every one off by default."""

    spot: bool = False
    """``--spot``: Spot VMs (``scheduling.strategy: SPOT``)."""
    flex_start: bool = False
    """``--flex-start``: wait for the GPUs with Dynamic Workload Scheduler
    (``scheduling.strategy: FLEX_START``)."""
    max_wait: Optional[str] = None
    """``--max-wait``: how long a Flex-start job waits for its machines
    (``scheduling.maxWaitDuration``; 0: indefinitely)."""
    restart_on_preemption: bool = False
    """``--restart-on-preemption``: restart the whole job when a worker
    restarts (``scheduling.restartJobOnWorkerRestart``); ``train`` saves a
    checkpoint on SIGTERM and the restarted job resumes from it."""
    timeout: Optional[str] = None
    """``--timeout``: the longest the job runs (``scheduling.timeout``;
    Vertex's default is 7 days)."""
    service_account: Optional[str] = None
    """``--service-account``: the email the job runs as."""
    network: Optional[str] = None
    """``--network``: ``projects/NUMBER/global/networks/NAME``, a VPC peered
    with Vertex AI."""
    persistent_resource_id: Optional[str] = None
    """``--persistent-resource-id``: run on a persistent resource's machines."""
    enable_web_access: bool = False
    """``--enable-web-access``: interactive shells into the job's containers."""
    tensorboard: Optional[str] = None
    """``--tensorboard``: the Vertex AI TensorBoard the job's event files
    stream to, ``projects/P/locations/L/tensorboards/T``."""
    reduction_server: int = 0
    """``--reduction-server N``: N reducers in worker pool 2."""
    reduction_server_machine_type: Optional[str] = None
    """``--reduction-server-machine-type``; None: n1-highcpu-16."""

    def flags(self) -> List[str]:
        """The flags these options stand for, as ``submit`` takes them."""
        named = [("--spot", self.spot), ("--flex-start", self.flex_start),
                 ("--max-wait", self.max_wait),
                 ("--restart-on-preemption", self.restart_on_preemption),
                 ("--timeout", self.timeout), ("--service-account", self.service_account),
                 ("--network", self.network),
                 ("--persistent-resource-id", self.persistent_resource_id),
                 ("--enable-web-access", self.enable_web_access),
                 ("--tensorboard", self.tensorboard),
                 ("--reduction-server", self.reduction_server),
                 ("--reduction-server-machine-type", self.reduction_server_machine_type)]
        return [flag for flag, value in named if value not in (None, False, 0)]

    @property
    def reducer_machine_type(self) -> str:
        """The reducers' machine type."""
        return self.reduction_server_machine_type or DEFAULT_REDUCTION_SERVER_MACHINE_TYPE

    def check(self, spec, entry) -> None:
        """ConfigError, one paragraph naming the flags, for what Vertex or the
        job cannot take; writes the durations in Google's form ("5400s").

        ``spec``: the :class:`~estimator_keras.cloud.spec.JobSpec` holding
        these options (its region, machines, pools, engine and ``--strategy``);
        ``entry``: the registry entry of the engine the job runs.
        """
        for name in ("spot", "flex_start", "restart_on_preemption", "enable_web_access"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError("VertexOptions.%s must be True or False; got %r."
                                  % (name, getattr(self, name)))
        if self.spot and self.flex_start:
            raise ConfigError(
                "--spot and --flex-start exclude each other: both set Vertex's "
                "scheduling.strategy, --spot to SPOT (Spot VMs, which can be preempted) and "
                "--flex-start to FLEX_START (Dynamic Workload Scheduler, which waits for "
                "on-demand GPUs). Give one of them.")
        if self.max_wait is not None:
            if not self.flex_start:
                raise ConfigError(
                    "--max-wait applies to --flex-start only: it is how long a Flex-start "
                    "job waits for its GPUs (scheduling.maxWaitDuration). Add --flex-start, "
                    "or drop --max-wait.")
            self.max_wait = parse_duration(self.max_wait, "--max-wait", allow_zero=True)
        if self.timeout is not None:
            self.timeout = parse_duration(self.timeout, "--timeout")
        if self.flex_start:
            self._check_flex_start(spec)
        if self.persistent_resource_id is not None:
            if not isinstance(self.persistent_resource_id, str) or not _RESOURCE_ID_RE.match(
                    self.persistent_resource_id):
                raise ConfigError(
                    "--persistent-resource-id must be the ID of a persistent resource in the "
                    "job's project and region: 1 to 63 lower-case letters, digits or hyphens, "
                    "starting with a letter, for example my-gpu-pool; got %r."
                    % (self.persistent_resource_id,))
            if self.spot or self.flex_start:
                flag = "--spot" if self.spot else "--flex-start"
                raise ConfigError(
                    "--persistent-resource-id cannot go with %s: a job on a persistent "
                    "resource runs on the machines that resource already holds, so Vertex "
                    "provisions nothing for it and a provisioning strategy has nothing to "
                    "choose. Drop %s, or drop --persistent-resource-id." % (flag, flag))
        self._check_identity(spec)
        if self.reduction_server or self.reduction_server_machine_type is not None:
            self._check_reduction_server(spec, entry)

    def _check_flex_start(self, spec) -> None:
        source = "(https://cloud.google.com/vertex-ai/docs/training/schedule-jobs-dws)"
        if not spec.accelerator:
            raise ConfigError(
                "--flex-start needs GPUs: Dynamic Workload Scheduler provisions L4, A100, "
                "H100, H200 or B200 GPUs for a job %s. Add --accelerator TYPE:COUNT, for "
                "example --accelerator NVIDIA_L4:1 --machine-type g2-standard-8, or drop "
                "--flex-start." % source)
        kind = spec.accelerator.split(":", 1)[0].strip().upper()
        if not any(family in kind.split("_") for family in FLEX_START_GPUS):
            raise ConfigError(
                "--flex-start with --accelerator %s: Dynamic Workload Scheduler provisions "
                "only L4, A100, H100, H200 or B200 GPUs %s. Pick one of those (with its "
                "machine family: g2 for L4, a2 for A100, a3 for H100 and H200, a4 for B200), "
                "or drop --flex-start." % (kind, source))
        if self.timeout is not None and _seconds(self.timeout) > FLEX_START_MAX_TIMEOUT_S:
            raise ConfigError(
                "--timeout %s (%g days) is longer than a Flex-start job may run: 7 days "
                "(604800s) at most %s. Give --timeout 7d or less, or drop --flex-start."
                % (self.timeout, _seconds(self.timeout) / 86400.0, source))
        other = ("--ps (parameter servers run on CPU machines)" if spec.ps else
                 "--reduction-server (reducers run on CPU machines)"
                 if self.reduction_server else None)
        if other:
            raise ConfigError(
                "--flex-start cannot go with %s: Dynamic Workload Scheduler needs the same "
                "machine configuration in every worker pool %s. Drop %s, or drop "
                "--flex-start." % (other, source, other.split()[0]))

    def _check_identity(self, spec) -> None:
        if self.service_account is not None and (
                not isinstance(self.service_account, str)
                or not _SERVICE_ACCOUNT_RE.match(self.service_account)):
            raise ConfigError(
                "--service-account must be a service account's email, for example "
                "trainer@my-project.iam.gserviceaccount.com; got %r." % (self.service_account,))
        if self.network is not None:
            found = _NETWORK_RE.match(self.network) if isinstance(self.network, str) else None
            if (not found or not found.group(1).isdigit()
                    or not _NETWORK_NAME_RE.match(found.group(2))):
                raise ConfigError(
                    "--network must be the full name of a VPC network peered with Vertex AI, "
                    "projects/PROJECT_NUMBER/global/networks/NAME, with the project's number "
                    "(not its id), for example projects/123456789012/global/networks/my-vpc; "
                    "got %r." % (self.network,))
        if self.tensorboard is None:
            return
        found = _TENSORBOARD_RE.match(self.tensorboard) if isinstance(
            self.tensorboard, str) else None
        if not found:
            raise ConfigError(
                "--tensorboard must be a Vertex AI TensorBoard's resource name, "
                "projects/PROJECT/locations/REGION/tensorboards/ID, for example "
                "projects/my-project/locations/us-central1/tensorboards/1234567890 (`gcloud "
                "ai tensorboards list --region REGION` lists them); got %r."
                % (self.tensorboard,))
        if spec.region and found.group(2) != spec.region:
            raise ConfigError(
                "--tensorboard %s is in %s, but the job runs in --region %s: Vertex AI "
                "TensorBoard, the training job and the bucket of --job-dir must be in one "
                "region. Use a TensorBoard in %s (or create one there), or submit to "
                "--region %s." % (self.tensorboard, found.group(2), spec.region,
                                  spec.region, found.group(2)))
        if not self.service_account:
            raise ConfigError(
                "--tensorboard needs --service-account EMAIL: Vertex AI uploads a custom "
                "job's event files to TensorBoard only for a job that runs as a service "
                "account of yours, one with the Storage Admin (roles/storage.admin) and "
                "Vertex AI User (roles/aiplatform.user) roles "
                "(https://cloud.google.com/vertex-ai/docs/experiments/tensorboard-setup). "
                "Create one with `gcloud iam service-accounts create NAME`, grant it the "
                "two roles, and pass --service-account NAME@PROJECT.iam.gserviceaccount.com.")

    def _check_reduction_server(self, spec, entry) -> None:
        count = self.reduction_server
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ConfigError("--reduction-server must be a whole number of reducers >= 1; "
                              "got %r." % (count,))
        if not count:
            raise ConfigError(
                "--reduction-server-machine-type applies with --reduction-server N only: it "
                "is the reducers' machine type. Add --reduction-server N, or drop it.")
        machine = self.reducer_machine_type
        if not isinstance(machine, str) or not _MACHINE_TYPE_RE.match(machine):
            raise ConfigError(
                "--reduction-server-machine-type must be a Compute Engine machine type such "
                "as %s; got %r." % (DEFAULT_REDUCTION_SERVER_MACHINE_TYPE, machine))
        why = ("Reduction Server takes over the NCCL all-reduce of GPU workers training "
               "together (TensorFlow's MultiWorkerMirroredStrategy)")
        # Asked of the registry: the engines that train under TensorFlow's
        # MultiWorkerMirroredStrategy.
        usable = [e.name for e in registry.entries() if not e.no_tf_multi_worker
                  and REDUCTION_SERVER_STRATEGY in e.cluster.strategies]
        if entry.name not in usable:
            raise ConfigError(
                "--reduction-server cannot go with --engine %s: %s, and %s. Drop "
                "--reduction-server, or train with --engine %s."
                % (spec.engine, why, entry.no_tf_multi_worker
                   or "the %s engine does not train that way" % entry.name,
                   " or --engine ".join(usable) or "NAME"))
        if spec.ps:
            raise ConfigError(
                "--reduction-server cannot go with --ps %d: worker pool 2 holds either the "
                "parameter servers or the reducers, and parameter-server training does not "
                "all-reduce. Drop --ps (the workers then train with %s), or drop "
                "--reduction-server." % (spec.ps, REDUCTION_SERVER_STRATEGY))
        if not spec.accelerator:
            raise ConfigError(
                "--reduction-server needs --accelerator TYPE:COUNT: %s, and without GPUs "
                "there is no NCCL all-reduce for the reducers to serve. Add --accelerator "
                "(for example NVIDIA_TESLA_T4:1), or drop --reduction-server." % why)
        if not spec.workers:
            raise ConfigError(
                "--reduction-server needs --workers N (1 or more): %s, and a job of one "
                "machine all-reduces inside it. Add --workers, or drop --reduction-server."
                % why)
        strategy = _strategy(spec.train_args)
        if strategy not in ("auto", REDUCTION_SERVER_STRATEGY):
            raise ConfigError(
                "--reduction-server cannot go with --strategy %s: %s. Use --strategy %s (or "
                "auto, which submit passes on as %s), or drop --reduction-server."
                % (strategy, why, REDUCTION_SERVER_STRATEGY, REDUCTION_SERVER_STRATEGY))


def _image_host(region: Optional[str]) -> str:
    for prefix in ("europe", "asia"):
        if region and region.startswith(prefix + "-"):
            return prefix + "-docker.pkg.dev"
    return "us-docker.pkg.dev"


def reduction_server_image(region: Optional[str]) -> str:
    """Google's Reduction Server image from the copy nearest ``region``.

    >>> reduction_server_image("europe-west4")
    'europe-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest'
    """
    return REDUCTION_SERVER_IMAGE.format(host=_image_host(region))


def reduction_server_pool(options: VertexOptions, region: Optional[str]) -> Dict[str, Any]:
    """Worker pool 2 of a job with reducers: Google's image on CPU machines
    (it runs its own program: no command or arguments of ours)."""
    return {"machineSpec": {"machineType": options.reducer_machine_type},
            "replicaCount": options.reduction_server,
            "containerSpec": {"imageUri": reduction_server_image(region)}}


def job_args(options: VertexOptions, args: List[str]) -> List[str]:
    """The job's arguments: with reducers and no ``--strategy``, ``--strategy
    multi_worker_mirrored`` before any tuning-trial flags, so that no replica
    takes pool 2 for parameter servers."""
    if not options.reduction_server or any(
            a == "--strategy" or a.startswith("--strategy=") for a in args):
        return list(args)
    at = args.index("--tuning-trial") if "--tuning-trial" in args else len(args)
    return list(args[:at]) + ["--strategy", REDUCTION_SERVER_STRATEGY] + list(args[at:])


def job_spec_fields(options: VertexOptions) -> Dict[str, Any]:
    """The ``CustomJobSpec`` fields these options set, in JSON form (none when
    every option is off)."""
    scheduling: Dict[str, Any] = {}
    if options.spot:
        scheduling["strategy"] = "SPOT"
    if options.flex_start:
        scheduling["strategy"] = "FLEX_START"
        if options.max_wait is not None:
            scheduling["maxWaitDuration"] = options.max_wait
    if options.restart_on_preemption:
        scheduling["restartJobOnWorkerRestart"] = True
    if options.timeout is not None:
        scheduling["timeout"] = options.timeout
    fields: Dict[str, Any] = {}
    if scheduling:
        fields["scheduling"] = scheduling
    for key, value in (("serviceAccount", options.service_account),
                       ("network", options.network),
                       ("persistentResourceId", options.persistent_resource_id),
                       ("enableWebAccess", options.enable_web_access or None),
                       ("tensorboard", options.tensorboard)):
        if value is not None:
            fields[key] = value
    return fields
