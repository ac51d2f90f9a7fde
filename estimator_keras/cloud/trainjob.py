"""Kubeflow Trainer v2: a ``TrainJob`` for a :class:`~estimator_keras.cloud.spec.JobSpec`,
and the ``ClusterTrainingRuntime`` TensorFlow clusters run on. TF-free.

:func:`build_trainjob_manifest` writes a ``trainer.kubeflow.org/v1alpha1``
TrainJob of ``1 + spec.workers`` nodes naming the runtime the engine's registry
entry gives (:attr:`~estimator_keras.engines.registry.Entry.trainjob_runtime`):

* keras3 on JAX: Trainer's built-in ``jax-distributed`` runtime, whose JAX
  plugin sets ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and
  ``JAX_PROCESS_ID`` in every pod;
* the estimator and keras engines: Trainer has no TensorFlow runtime, so this
  package ships one (:func:`build_tensorflow_runtime`, ``submit --target
  trainjob --print-runtime --container-image IMAGE``): one indexed Job of pods
  on JobSet's headless service, whose pods get the job's name and their index
  from the downward API and the node count from Trainer's JAX policy, and
  build ``TF_CONFIG`` from them
  (:mod:`~estimator_keras.distribute.trainjob_pods`). Chief and workers only:
  parameter servers and an evaluator need a TFJob (``--target tfjob``).

:func:`check` round-trips a manifest through the ``kubeflow-trainer-api`` 2.3
models (pip install -e '.[kubeflow]' in the checkout): a field they do not know, or
a value of the wrong type, is a ConfigError naming it.

Sources: github.com/kubeflow/trainer at v2.3.0: manifests/base/crds/ (the
TrainJob and ClusterTrainingRuntime schemas and their CEL rules: a TrainJob's
name is a DNS-1035 label of at most 63 characters; at most one framework
policy per runtime), manifests/base/runtimes/jax_distributed.yaml,
pkg/runtime/framework/plugins/{jax,plainml}/. The Kubeflow SDK (``kubeflow``
0.5, kubeflow/trainer/backends/kubernetes/utils.py): ``list_runtimes()`` fails,
listing none of the cluster's runtimes, when one has a trainer container
without an image.
"""

from typing import Any, Dict, List, Optional

from estimator_keras.cloud.spec import JobSpec, job_entry
from estimator_keras.cloud.tfjob import (check_engine, job_metadata, job_program,
                                         round_trip_losses)
from estimator_keras.distribute import trainjob_pods
from estimator_keras.engines.registry import TENSORFLOW_RUNTIME
from estimator_keras.errors import ConfigError

API_VERSION = "trainer.kubeflow.org/v1alpha1"
API_GROUP = "trainer.kubeflow.org"
RUNTIME_KIND = "ClusterTrainingRuntime"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
"""The label by which Trainer finds the trainer's replicated job in a runtime."""
RESTARTS = 3
"""Times the TensorFlow runtime's JobSet restarts every pod after one failed or
was preempted: the package exits 75 after a checkpoint, and the next run resumes."""


def _resources(gpus: int, cpu: Optional[str], memory: Optional[str]) -> Dict[str, Any]:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v}
    limits = dict(requests)
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    found: Dict[str, Any] = {}
    if requests:
        found["requests"] = requests
    if limits:
        found["limits"] = limits
    return found


def build_trainjob_manifest(spec: JobSpec, image: Optional[str] = None,
                            namespace: Optional[str] = None, cpu: Optional[str] = None,
                            memory: Optional[str] = None) -> Dict[str, Any]:
    """Kubeflow Trainer v2 TrainJob running ``python -m experiments train`` on
    ``1 + spec.workers`` nodes, from an image with this package installed.

    ``cpu`` and ``memory`` (Kubernetes quantities: "8", "500m", "16Gi") are each
    node's requests and limits; GPUs come from ``spec.accelerator``'s count
    (``nvidia.com/gpu``). The name leaves room for the pods' host names,
    ``<name>-node-0-<index>``, within a DNS label's 63 characters.

    Example::

        spec = JobSpec(experiment="fashion_mnist_cnn", job_dir="gs://b/run1",
                       engine="keras3", workers=1)
        print(to_yaml(build_trainjob_manifest(spec, "gcr.io/p/estimator-keras:keras3")))
    """
    check_engine("trainjob", spec.engine)
    entry = job_entry(spec.engine)
    if spec.ps or spec.evaluator:
        raise ConfigError(
            "--target trainjob runs a chief and workers (Kubeflow Trainer's runtimes have one "
            "kind of node); %s needs a TFJob: use --target tfjob, whose operator is "
            "training-operator v1.9." % ("--ps %d" % spec.ps if spec.ps else "--evaluator"))
    image, command, gpus = job_program(spec, image, "Never", "TrainJob")
    nodes = 1 + spec.workers
    # The node count is numNodes alone: both runtimes' pods read it from the
    # JAX_NUM_PROCESSES Trainer sets from it.
    env: List[Dict[str, str]] = [{"name": k, "value": v}
                                 for k, v in spec.container_env.items()]
    trainer: Dict[str, Any] = {"image": image, "command": command, "numNodes": nodes}
    if env:
        trainer["env"] = env
    resources = _resources(gpus, cpu, memory)
    if resources:
        trainer["resourcesPerNode"] = resources
    suffix = "-%s-0-%d" % (trainjob_pods.NODE, nodes - 1)
    return {
        "apiVersion": API_VERSION,
        "kind": "TrainJob",
        "metadata": job_metadata(spec, namespace, max_length=63 - len(suffix)),
        "spec": {"runtimeRef": {"apiGroup": API_GROUP, "kind": RUNTIME_KIND,
                                "name": entry.trainjob_runtime},
                 "trainer": trainer},
    }


def _field_env(name: str, path: str) -> Dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def build_tensorflow_runtime(image: str, name: str = TENSORFLOW_RUNTIME) -> Dict[str, Any]:
    """The ClusterTrainingRuntime the estimator and keras engines' TrainJobs run on.

    One replicated job ``node`` of indexed pods on JobSet's headless service
    (stable host names ``<job>-node-0-<index>.<job>``). Each pod gets
    ``EK_TRAINJOB_NAME`` (its JobSet's name, which is the TrainJob's),
    ``EK_TRAINJOB_NODE_INDEX`` (its completion index) and ``EK_TRAINJOB_PORT``.
    The ML policy is Trainer's JAX one, for its ``JAX_NUM_PROCESSES``: the node
    count, which Trainer sets from the TrainJob's ``numNodes`` (the plain-ML
    policy gives a pod no count, and torch's would have the Kubeflow SDK wrap
    commands in torchrun); the pods read nothing else of it. Pods do not
    restart alone (``restartPolicy: Never``, no retries): a failed or preempted
    pod restarts the whole JobSet, up to :data:`RESTARTS` times, and training
    resumes from the last checkpoint.

    ``image`` (one with this package installed) is the node's image where a
    TrainJob gives none, and what the Kubeflow SDK lists for the runtime; it is
    required: the SDK's ``list_runtimes()`` fails, listing none of the
    cluster's runtimes, when one has a trainer container without an image.
    """
    if not image:
        raise ConfigError(
            "The TensorFlow ClusterTrainingRuntime (--print-runtime) needs --container-image "
            "URI (or --image): the image of its nodes, with this package installed (build one "
            "from the repository's Dockerfile and push it where the cluster pulls from). A "
            "runtime without an image makes the Kubeflow SDK's list_runtimes() fail for every "
            "user of the cluster.")
    container: Dict[str, Any] = {
        "name": trainjob_pods.NODE,
        "image": image,
        "env": [_field_env("EK_TRAINJOB_NAME",
                           "metadata.labels['%s']" % trainjob_pods.JOBSET_NAME_LABEL),
                _field_env("EK_TRAINJOB_NODE_INDEX", trainjob_pods.COMPLETION_INDEX_FIELD),
                {"name": "EK_TRAINJOB_PORT", "value": str(trainjob_pods.TF_PORT)}],
        "ports": [{"name": "tf-server", "containerPort": trainjob_pods.TF_PORT}]}
    return {
        "apiVersion": API_VERSION,
        "kind": RUNTIME_KIND,
        "metadata": {"name": name,
                     "labels": {"trainer.kubeflow.org/framework": "tensorflow"}},
        "spec": {
            "mlPolicy": {"numNodes": 1, trainjob_pods.NODE_COUNT_POLICY_FIELD: {}},
            "template": {"spec": {
                "failurePolicy": {"maxRestarts": RESTARTS},
                "replicatedJobs": [{
                    "name": trainjob_pods.NODE,
                    "template": {
                        "metadata": {"labels": {ANCESTOR_LABEL: "trainer"}},
                        "spec": {"backoffLimit": 0, "template": {"spec": {
                            "restartPolicy": "Never",
                            "containers": [container]}}}}}]}}},
    }


def check(manifest: Dict[str, Any]) -> None:
    """ConfigError unless ``manifest`` (a TrainJob or ClusterTrainingRuntime)
    round-trips through Kubeflow Trainer's API models unchanged: every field
    known to them, every value of its type. Nothing is checked when
    ``kubeflow-trainer-api`` is not installed."""
    try:
        # pylint: disable=import-outside-toplevel
        from kubeflow_trainer_api import models
    except ImportError:
        return
    model = {"TrainJob": models.TrainerV1alpha1TrainJob,
             RUNTIME_KIND: models.TrainerV1alpha1ClusterTrainingRuntime}[manifest["kind"]]
    try:
        kept = model.from_dict(manifest).to_dict()
    except ValueError as e:  # pydantic's ValidationError is a ValueError
        raise ConfigError("the %s does not fit Kubeflow Trainer's API (kubeflow-trainer-api "
                          "models): %s" % (manifest["kind"], e)) from e
    unknown = round_trip_losses(manifest, kept)
    if unknown:
        raise ConfigError("the %s has fields Kubeflow Trainer's API does not know, or values "
                          "it changes: %s." % (manifest["kind"], ", ".join(unknown)))
