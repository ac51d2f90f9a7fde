"""A Kubeflow ``TFJob`` manifest for a :class:`~estimator_keras.cloud.spec.JobSpec`, as YAML.

:func:`build_tfjob_manifest` builds the ``kubeflow.org/v1`` object and
:func:`to_yaml` writes it for ``kubectl create -f``. TF-free.
"""

import re
from typing import Any, Dict, Mapping, Optional

import yaml

from estimator_keras.cloud.spec import PYTHON_MODULE, JobSpec, parse_accelerator
from estimator_keras.errors import ConfigError


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
    image must already contain this package (a TFJob does not install sdists):
    ``image``, else ``spec.container_image``, else ``spec.image``; so must the
    user's ``spec.modules`` and ``spec.config`` file, which the command names as
    given. The model dir is ``<job_dir>/model`` (``--model-dir``; Kubeflow sets
    no AIP_* variables). With an accelerator, chief/worker/evaluator containers
    get ``nvidia.com/gpu`` limits of its count (the type is the cluster's
    business: node pools, not the manifest). ``runPolicy.cleanPodPolicy:
    Running`` removes the parameter servers, which never exit on their own, once
    the chief is done.

    Example::

        manifest = build_tfjob_manifest(spec, "gcr.io/p/estimator-keras:1")
        print(to_yaml(manifest))
    """
    spec.validate()
    image = image or spec.container_image or spec.image
    if not image:
        raise ConfigError(
            "A TFJob needs --image or --container-image: a container image with this "
            "package installed (build one from the repository's Dockerfile; for example "
            "us-docker.pkg.dev/PROJECT/REPO/estimator-keras:TAG).")
    if restart_policy not in ("OnFailure", "Never", "Always", "ExitCode"):
        raise ConfigError("restart_policy must be OnFailure, Never, Always or ExitCode; "
                          "got %r." % (restart_policy,))
    if spec.package_dirs or spec.extra_package_uris:
        raise ConfigError(
            "A TFJob installs no packages (--package-dir): build your code into the "
            "image, and pass --module with the module name or path it has there.")
    gpus = parse_accelerator(spec.accelerator)[1] if spec.accelerator else 0
    # Kubeflow sets no AIP_* variables: the model dir is passed explicitly. The
    # image holds the user's modules and config file, at the paths given.
    command = ["python", "-m", PYTHON_MODULE] + spec.train_command_args(
        with_model_dir=True, upload_config=False)

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


def to_yaml(manifest: Mapping[str, Any]) -> str:
    """Block-style YAML of ``manifest``, keys in the order the builder wrote them."""
    return yaml.safe_dump(manifest, sort_keys=False, default_flow_style=False)
