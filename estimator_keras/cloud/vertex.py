"""Vertex AI request bodies for a :class:`~estimator_keras.cloud.spec.JobSpec`.

:func:`build_custom_job` returns the JSON-ready ``CustomJob`` that
``projects.locations.customJobs.create`` takes, :func:`build_tuning_job` the
``HyperparameterTuningJob`` of ``projects.locations.hyperparameterTuningJobs.create``
(its ``trialJobSpec`` is the CustomJob's ``jobSpec``); sending them is
:mod:`~estimator_keras.cloud.backends`' job. TF-free.

A worker pool runs either the uploaded sdists (this package's, then the
user's own) on a prebuilt image (``pythonPackageSpec``: ``executorImageUri``,
``packageUris``, ``pythonModule``, ``args``) or an image with the package
installed (``containerSpec``: ``imageUri``, ``command``, ``args``):
https://cloud.google.com/vertex-ai/docs/training/configure-container-settings.
Pool 2 holds parameter servers, or Reduction Server's reducers; the job-wide
fields beside the pools (scheduling, service account, network, persistent
resource, web access, TensorBoard) come from
:mod:`~estimator_keras.cloud.vertex_options`, and
:mod:`~estimator_keras.cloud.vertex_check` parses every body with
google-cloud-aiplatform's own types.
The HyperparameterTuningJob body (``studySpec``, ``maxTrialCount``,
``parallelTrialCount``, ``trialJobSpec``), under "Resource: HyperparameterTuningJob" in
https://cloud.google.com/vertex-ai/docs/reference/rest/v1/projects.locations.hyperparameterTuningJobs
"""

from typing import Any, Dict, List

from estimator_keras.cloud import vertex_options
from estimator_keras.cloud.spec import PYTHON_MODULE, JobSpec, parse_accelerator, prebuilt_image
from estimator_keras.errors import ConfigError
from estimator_keras.tuning.space import Study

CONTAINER_COMMAND = ["python", "-m", PYTHON_MODULE]
"""What a containerSpec runs (the Dockerfile's ENTRYPOINT, spelled out so that any
image with the package installed works)."""

TUNING_TRIAL_ARGS = ("--tuning-trial", "--hypertune-metric")
"""Appended to a tuning trial's arguments, with the metric: Vertex appends each
trial's ``--<parameter>=<value>`` after them, which ``train --tuning-trial`` reads
as hparams, and the chief reports the metric to Vertex at the end."""

# Vertex pool indices; the position in workerPoolSpecs is what gives a pool its role.
CHIEF_POOL, WORKER_POOL, PS_POOL, EVALUATOR_POOL = 0, 1, 2, 3


def _vertex_pool(spec: JobSpec, replicas: int, with_accelerator: bool,
                 args: List[str]) -> Dict[str, Any]:
    machine: Dict[str, Any] = {"machineType": spec.machine_type}
    gpu = bool(with_accelerator and spec.accelerator)
    if gpu:
        kind, count = parse_accelerator(spec.accelerator)
        machine["acceleratorType"] = kind
        machine["acceleratorCount"] = count
    pool: Dict[str, Any] = {"machineSpec": machine, "replicaCount": replicas}
    if spec.container_image:
        pool["containerSpec"] = {"imageUri": spec.container_image,
                                 "command": list(CONTAINER_COMMAND), "args": list(args)}
        if spec.container_env:
            pool["containerSpec"]["env"] = [{"name": k, "value": v}
                                            for k, v in spec.container_env.items()]
        return pool
    pool["pythonPackageSpec"] = {
        "executorImageUri": spec.image or prebuilt_image(gpu, spec.region, spec.image_engine),
        "packageUris": [spec.package_uri] + list(spec.extra_package_uris),
        "pythonModule": PYTHON_MODULE,
        "args": list(args),
    }
    return pool


def _job_spec(spec: JobSpec, args: List[str]) -> Dict[str, Any]:
    spec.validate()
    if not spec.package_uri and not spec.container_image:
        raise ConfigError(
            "JobSpec.package_uri is not set: the job installs the package from "
            "Cloud Storage. submit() builds and uploads it and fills this in; when "
            "calling the builders yourself, pass package_uri='gs://.../pkg.tar.gz', or "
            "container_image= an image with the package installed.")
    if spec.package_dirs:
        raise ConfigError(
            "JobSpec.package_dirs %s are not uploaded yet: submit() builds and uploads "
            "them and lists them in extra_package_uris; when calling the builders "
            "yourself, pass extra_package_uris=['gs://.../pkg.tar.gz'] instead."
            % ", ".join(spec.package_dirs))
    spec.check_package_modules()
    spec.check_vertex_image()
    options = spec.vertex
    args = vertex_options.job_args(options, args)
    pools: List[Dict[str, Any]] = [_vertex_pool(spec, 1, True, args)]
    pools.append(_vertex_pool(spec, spec.workers, True, args) if spec.workers else {})
    if spec.ps:
        pools.append(_vertex_pool(spec, spec.ps, False, args))
    elif options.reduction_server:
        pools.append(vertex_options.reduction_server_pool(options, spec.region))
    else:
        pools.append({})
    pools.append(_vertex_pool(spec, 1, True, args) if spec.evaluator else {})
    while pools and not pools[-1]:
        pools.pop()
    job_spec = {"workerPoolSpecs": pools,
                "baseOutputDirectory": {"outputUriPrefix": spec.job_dir}}
    job_spec.update(vertex_options.job_spec_fields(options))
    return job_spec


def build_custom_job(spec: JobSpec) -> Dict[str, Any]:
    """Vertex AI CustomJob request body for ``spec``.

    The body is what ``projects.locations.customJobs.create`` takes:
    ``{"displayName": ..., "jobSpec": {"workerPoolSpecs": [...],
    "baseOutputDirectory": {"outputUriPrefix": job_dir}}}``. Pools sit at Vertex's
    fixed indices (0 chief, 1 workers, 2 parameter servers, 3 evaluator); an unused
    pool before a used one is ``{}`` and trailing unused pools are left out.
    Chief, workers and evaluator get the accelerator and the GPU image; parameter
    servers only hold variables, so they run on the CPU image without GPUs.
    A keras3 job runs ``spec.container_image`` (required) with KERAS_BACKEND in
    ``containerSpec.env``: pool 0 is process 0, the coordinator of JAX's
    distributed runtime, pool 1 the other processes; Vertex sets CLUSTER_SPEC in
    every replica, from which ``train`` finds its peers.
    With ``spec.vertex.reduction_server`` pool 2 holds the reducers (Google's
    Reduction Server image on CPU machines) and a job left at ``--strategy
    auto`` is passed ``--strategy multi_worker_mirrored``; the other options of
    ``spec.vertex`` (scheduling, service account, network, persistent resource,
    web access, TensorBoard) are ``jobSpec`` fields beside the pools.
    The arguments carry no ``--model-dir``: the base output directory makes Vertex
    set AIP_MODEL_DIR, AIP_CHECKPOINT_DIR and AIP_TENSORBOARD_LOG_DIR, which the
    job follows. ``spec.package_uri`` must be set (``submit`` sets it after
    uploading) unless ``spec.container_image`` runs the job.

    Example::

        body = build_custom_job(JobSpec(experiment="fashion_mnist_cnn",
            job_dir="gs://b/run1", region="us-central1",
            package_uri="gs://b/run1/packages/estimator_keras-0.1.0.tar.gz"))
    """
    job_spec = _job_spec(spec, spec.train_command_args())
    return {"displayName": spec.display_name or spec.experiment, "jobSpec": job_spec}


def tuning_trial_args(spec: JobSpec, metric: str) -> List[str]:
    """A tuning trial's arguments: the job's, then ``--tuning-trial
    --hypertune-metric METRIC`` (Vertex appends the trial's values after them)."""
    return spec.train_command_args() + [TUNING_TRIAL_ARGS[0], TUNING_TRIAL_ARGS[1], metric]


def build_tuning_job(spec: JobSpec, study: Study) -> Dict[str, Any]:
    """Vertex AI HyperparameterTuningJob request body: ``study`` over trials that
    each run the worker pools :func:`build_custom_job` would.

    Each trial's CustomJob gets the base output directory
    ``<job_dir>/<trial id>``, so its AIP_* directories are per trial, and the
    fields of ``spec.vertex`` (``trialJobSpec`` is a CustomJobSpec).

    Example::

        study = Study(load_space("space.yaml"), metric="accuracy", max_trials=8,
                      parallel_trials=2, algorithm="random")
        body = build_tuning_job(spec, study)
    """
    study_spec = study.study_spec()
    return {
        "displayName": spec.display_name or spec.experiment,
        "studySpec": study_spec,
        "maxTrialCount": study.max_trials,
        "parallelTrialCount": study.parallel_trials,
        "trialJobSpec": _job_spec(spec, tuning_trial_args(spec, study.metric)),
    }
