"""A Kubeflow ``JAXJob`` manifest for a keras3 :class:`~estimator_keras.cloud.spec.JobSpec`.

:func:`build_jaxjob_manifest` builds the ``kubeflow.org/v1`` object of the
training-operator (v1.9) and :func:`~estimator_keras.cloud.tfjob.to_yaml`
writes it. TF-free.

The operator sets COORDINATOR_ADDRESS, COORDINATOR_PORT, NUM_PROCESSES and
PROCESS_ID in every pod, and ``train`` joins JAX's distributed runtime from
them, so the command carries no cluster flags. Worker 0 is the coordinator
and process 0.
"""

from typing import Any, Dict, Optional

from estimator_keras.cloud.spec import JobSpec
from estimator_keras.cloud.tfjob import (check_engine, gpu_limits, job_metadata, job_program,
                                         replica_spec, to_yaml)

__all__ = ["CONTAINER_NAME", "PORT", "PORT_NAME", "build_jaxjob_manifest", "to_yaml"]

CONTAINER_NAME = "jax"
"""The operator injects its variables into, and its webhook requires, a container
of this name."""
PORT, PORT_NAME = 6666, "jaxjob-port"
"""The coordinator's port: the operator reads COORDINATOR_PORT from the port of
this name on Worker 0's ``jax`` container (its default)."""
REPLICA_TYPE = "Worker"
"""The only replica type a JAXJob has."""


def build_jaxjob_manifest(spec: JobSpec, image: Optional[str] = None,
                          namespace: Optional[str] = None,
                          restart_policy: str = "OnFailure") -> Dict[str, Any]:
    """Kubeflow ``kubeflow.org/v1`` JAXJob running ``python -m experiments train``
    with ``--engine keras3``.

    One ``Worker`` replica spec of ``1 + spec.workers`` pods, each a container
    named ``jax`` with the port ``jaxjob-port`` (6666) and KERAS_BACKEND from
    ``spec.keras_backend`` (default jax). Image, command, GPU limits, restart
    policy and the checks are the TFJob's
    (:func:`~estimator_keras.cloud.tfjob.job_program`). The name leaves room for
    ``-worker-N``: the operator names each pod's service so, and Worker 0's is
    the coordinator's address. ``runPolicy.cleanPodPolicy: Running``: a process
    whose peer failed waits in JAX's collectives, and is removed once the job
    has ended.

    Example::

        spec = JobSpec(experiment="fashion_mnist_cnn", job_dir="gs://b/run1",
                       engine="keras3", workers=1)
        print(to_yaml(build_jaxjob_manifest(spec, "gcr.io/p/estimator-keras:keras3")))
    """
    check_engine("jaxjob", spec.engine)
    image, command, gpus = job_program(spec, image, restart_policy, "JAXJob")
    processes = 1 + spec.workers
    container: Dict[str, Any] = {
        "name": CONTAINER_NAME, "image": image, "command": command,
        "env": [{"name": k, "value": v} for k, v in spec.container_env.items()],
        "ports": [{"name": PORT_NAME, "containerPort": PORT}]}
    container.update(gpu_limits(gpus))
    suffix = "-%s-%d" % (REPLICA_TYPE.lower(), processes - 1)
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "JAXJob",
        "metadata": job_metadata(spec, namespace, max_length=63 - len(suffix)),
        "spec": {"runPolicy": {"cleanPodPolicy": "Running"},
                 "jaxReplicaSpecs": {
                     REPLICA_TYPE: replica_spec(processes, restart_policy, container)}},
    }
