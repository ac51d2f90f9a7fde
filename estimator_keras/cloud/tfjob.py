"""A Kubeflow ``TFJob`` manifest for a :class:`~estimator_keras.cloud.spec.JobSpec`, as YAML.

:func:`build_tfjob_manifest` builds the ``kubeflow.org/v1`` object and
:func:`to_yaml` writes it for ``kubectl create -f``. The helpers every
Kubeflow job shares (:func:`job_program`, :func:`job_metadata`,
:func:`replica_spec`) serve :mod:`~estimator_keras.cloud.jaxjob` too. TF-free.
"""

import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

import yaml

from estimator_keras.cloud.spec import PYTHON_MODULE, JobSpec, job_entry, parse_accelerator
from estimator_keras.engines import registry
from estimator_keras.errors import ConfigError


RESTART_POLICIES = ("OnFailure", "Never", "Always", "ExitCode")
"""A replica's ``restartPolicy`` in the training-operator's ReplicaSpec."""


def k8s_name(text: str, max_length: int = 63) -> str:
    """A DNS-1035 label made of ``text``, at most ``max_length`` characters: what
    the training-operator's webhooks require of a job's name."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    name = re.sub(r"-{2,}", "-", name)
    if name[:1].isdigit():
        name = "job-" + name
    name = name[:max_length].strip("-")
    if not name:
        raise ConfigError(
            "Cannot make a Kubernetes object name out of %r: it needs letters or "
            "digits (pass --display-name)." % (text,))
    return name


def job_metadata(spec: JobSpec, namespace: Optional[str],
                 max_length: int = 63) -> Dict[str, Any]:
    """``metadata`` of a Kubeflow job: its name from the display name (or the
    experiment), and the namespace when given."""
    metadata: Dict[str, Any] = {"name": k8s_name(spec.display_name or spec.experiment,
                                                 max_length)}
    if namespace:
        metadata["namespace"] = namespace
    return metadata


def job_program(spec: JobSpec, image: Optional[str], restart_policy: str,
                kind: str) -> Tuple[str, List[str], int]:
    """What every replica of a Kubeflow job (``kind``: TFJob, JAXJob) of ``spec``
    runs: ``(image, command, GPUs per GPU replica)``, after the checks they share.

    The image must already contain this package (a Kubeflow job installs no
    sdist): ``image``, else ``spec.container_image``, else ``spec.image``; so
    must the user's ``spec.modules`` and ``spec.config`` file, which the command
    names as given. Kubeflow sets no AIP_* variables: the command passes
    ``--model-dir <job_dir>/model``.
    """
    spec.validate()
    image = image or spec.container_image or spec.image
    if not image:
        raise ConfigError(
            "A %s needs --image or --container-image: a container image with this "
            "package installed (build one from the repository's Dockerfile; for example "
            "us-docker.pkg.dev/PROJECT/REPO/estimator-keras:TAG)." % kind)
    if restart_policy not in RESTART_POLICIES:
        raise ConfigError("restart_policy must be %s or %s; got %r."
                          % (", ".join(RESTART_POLICIES[:-1]), RESTART_POLICIES[-1],
                             restart_policy))
    if spec.package_dirs or spec.extra_package_uris:
        raise ConfigError(
            "A %s installs no packages (--package-dir): build your code into the "
            "image, and pass --module with the module name or path it has there." % kind)
    gpus = parse_accelerator(spec.accelerator)[1] if spec.accelerator else 0
    command = ["python", "-m", PYTHON_MODULE] + spec.train_command_args(
        with_model_dir=True, upload_config=False)
    return image, command, gpus


def replica_spec(count: int, restart_policy: str,
                 container: Dict[str, Any]) -> Dict[str, Any]:
    """A ReplicaSpec of ``count`` pods running ``container``."""
    return {"replicas": count, "restartPolicy": restart_policy,
            "template": {"spec": {"containers": [container]}}}


def gpu_limits(gpus: int) -> Dict[str, Any]:
    """A container's ``resources`` asking for ``gpus`` NVIDIA GPUs (none: empty)."""
    return {"resources": {"limits": {"nvidia.com/gpu": gpus}}} if gpus else {}


# What each Kubeflow job kind trains under, for refusals.
KUBEFLOW_KINDS = ("trainjob", "tfjob", "jaxjob")
_KIND_RUNS = {"trainjob": "a TrainJob's nodes train as a TF_CONFIG cluster or a JAX process "
                          "group",
              "tfjob": "a TFJob's replicas train under TensorFlow's MultiWorkerMirroredStrategy",
              "jaxjob": "a JAXJob's processes train together with JAX's distributed runtime",
              "katib": "a Katib trial is one pod that runs train"}


def check_engine(target: str, engine: str) -> None:
    """ConfigError for an engine the Kubeflow job ``target`` (tfjob, jaxjob, katib) cannot
    run: the engine's registry entry lists the job kinds that run it."""
    entry = job_entry(engine)
    if target in entry.job_kinds:
        return
    runs = registry.with_job_kind(target)
    kinds = [k for k in entry.job_kinds if k in KUBEFLOW_KINDS]
    if kinds:
        instead = "use %s, which run%s it" % (" or ".join("--target " + k for k in kinds),
                                             "" if len(kinds) > 1 else "s")
    else:
        instead = "submit it to Vertex AI"
    why = ("; %s" % entry.no_tf_multi_worker) if target == "tfjob" and \
        entry.no_tf_multi_worker else ""
    raise ConfigError(
        "--target %s runs %s only (%s%s); got --engine %s. Add %s, or %s."
        % (target, " or ".join("--engine " + n for n in runs), _KIND_RUNS[target], why,
           engine, " or ".join("--engine " + n for n in runs), instead))


def build_tfjob_manifest(spec: JobSpec, image: Optional[str] = None,
                         namespace: Optional[str] = None,
                         restart_policy: str = "OnFailure") -> Dict[str, Any]:
    """Kubeflow ``kubeflow.org/v1`` TFJob running ``python -m experiments train``.

    Replica specs are Chief (1), Worker, PS and Evaluator, each only when asked for.
    The training-operator injects TF_CONFIG into the container named
    ``tensorflow`` and rejects a replica without one, hence the fixed name. The
    image and command are :func:`job_program`'s. With an accelerator,
    chief/worker/evaluator containers get ``nvidia.com/gpu`` limits of its count
    (the type is the cluster's business: node pools, not the manifest).
    ``runPolicy.cleanPodPolicy: Running`` removes the parameter servers, which
    never exit on their own, once the chief is done. ``--engine keras3`` is
    refused (:func:`check_engine`).

    Example::

        manifest = build_tfjob_manifest(spec, "gcr.io/p/estimator-keras:1")
        print(to_yaml(manifest))
    """
    check_engine("tfjob", spec.engine)
    image, command, gpus = job_program(spec, image, restart_policy, "TFJob")

    def replica(count: int, with_gpu: bool) -> Dict[str, Any]:
        container: Dict[str, Any] = {"name": "tensorflow", "image": image,
                                     "command": list(command)}
        container.update(gpu_limits(gpus if with_gpu else 0))
        return replica_spec(count, restart_policy, container)

    replicas: Dict[str, Any] = {"Chief": replica(1, True)}
    if spec.workers:
        replicas["Worker"] = replica(spec.workers, True)
    if spec.ps:
        replicas["PS"] = replica(spec.ps, False)
    if spec.evaluator:
        replicas["Evaluator"] = replica(1, True)
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": job_metadata(spec, namespace),
        "spec": {"runPolicy": {"cleanPodPolicy": "Running"},
                 "tfReplicaSpecs": replicas},
    }


def round_trip_losses(given: Any, kept: Any, where: str = "",
                      values: bool = True) -> List[str]:
    """Paths in ``given`` (a manifest) that ``kept`` (its round trip through an
    API's models) lost, and with ``values`` those whose value it changed."""
    if isinstance(given, dict):
        kept = kept if isinstance(kept, dict) else {}
        out: List[str] = []
        for key, value in given.items():
            path = "%s.%s" % (where, key) if where else key
            out += [path] if key not in kept else round_trip_losses(value, kept[key], path,
                                                                    values)
        return out
    if isinstance(given, list) and isinstance(kept, list) and (
            not values or len(given) == len(kept)):
        return [p for i, (g, k) in enumerate(zip(given, kept))
                for p in round_trip_losses(g, k, "%s[%d]" % (where, i), values)]
    return [where] if values and given != kept else []


def to_yaml(manifest: Mapping[str, Any]) -> str:
    """Block-style YAML of ``manifest``, keys in the order the builder wrote them."""
    return yaml.safe_dump(manifest, sort_keys=False, default_flow_style=False)
