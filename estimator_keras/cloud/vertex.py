"""The Vertex AI ``CustomJob`` request body for a :class:`~estimator_keras.cloud.spec.JobSpec`.

:func:`build_custom_job` returns the JSON-ready dict that
``projects.locations.customJobs.create`` takes; sending it is
:mod:`~estimator_keras.cloud.backends`' job. TF-free.
"""

from typing import Any, Dict, List

from estimator_keras.cloud.spec import PYTHON_MODULE, JobSpec, parse_accelerator, prebuilt_image
from estimator_keras.errors import ConfigError

# Vertex pool indices; the position in workerPoolSpecs is what gives a pool its role.
CHIEF_POOL, WORKER_POOL, PS_POOL, EVALUATOR_POOL = 0, 1, 2, 3


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
