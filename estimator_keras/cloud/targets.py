"""Where ``submit --target`` sends a job, and what each target supports: the
facts the docs' table of targets is generated from. TF-free.

Which engines a target runs is each engine's registry entry's
(:attr:`~estimator_keras.engines.registry.Entry.job_kinds`); which cluster
tasks an engine has is its entry's too. A target adds what it can hold of
them and what the platform does around the run.
"""

import dataclasses
from typing import Dict, List, Tuple

from estimator_keras.engines import registry


@dataclasses.dataclass(frozen=True)
class Target:
    """One ``--target`` of ``submit``."""

    name: str
    """The ``--target`` value."""
    creates: str
    """What it creates or writes."""
    platform: str
    """Where it runs, and the versions it was written against."""
    tasks: Tuple[str, ...]
    """Cluster tasks its jobs can hold (an engine runs those it has too)."""
    gpus: str
    """How a job gets GPUs."""
    preemption: str
    """What happens when a machine is preempted or a pod fails."""
    progress: str
    """Where progress and metrics show while the job runs."""


TARGETS = (
    Target("vertex", "a CustomJob (a HyperparameterTuningJob with --tune), sent",
           "Vertex AI", ("chief", "worker", "ps", "evaluator"),
           "--accelerator TYPE:COUNT per machine",
           "--restart-on-preemption restarts the job, which resumes from its last "
           "checkpoint; --spot and --flex-start for cheaper machines",
           "the job's logs; a Vertex TensorBoard with --tensorboard"),
    Target("trainjob", "a TrainJob manifest (and, once per cluster, --print-runtime)",
           "Kubernetes with Kubeflow Trainer v2 (v2.3)", ("chief", "worker"),
           "--accelerator's count as nvidia.com/gpu per node; --cpu, --memory",
           "the TensorFlow runtime restarts every pod (3 times), which resume from the "
           "last checkpoint; Trainer's jax-distributed runtime fails the job",
           "the TrainJob's status (progress, time left, metrics) where the TrainJobStatus "
           "feature gate is on; the pods' logs"),
    Target("tfjob", "a TFJob manifest", "Kubernetes with Kubeflow training-operator v1.9",
           ("chief", "worker", "ps", "evaluator"),
           "--accelerator's count as nvidia.com/gpu per replica",
           "restartPolicy OnFailure restarts a pod, which resumes from the last checkpoint",
           "the pods' logs"),
    Target("jaxjob", "a JAXJob manifest", "Kubernetes with Kubeflow training-operator v1.9",
           ("chief", "worker"), "--accelerator's count as nvidia.com/gpu per replica",
           "restartPolicy OnFailure restarts a pod, which resumes from the last checkpoint",
           "the pods' logs"),
)


def engines_of(target: Target) -> List[str]:
    """The engines whose registry entries list ``target``."""
    return list(registry.with_job_kind(target.name))


def facts(target: Target) -> Dict[str, str]:
    """What ``target`` supports, in words, per engine: {row: text}."""
    rows = {"creates": target.creates, "runs on": target.platform}
    for name in registry.names():
        if name not in engines_of(target):
            rows[f"--engine {name}"] = "no"
            continue
        tasks = [t for t in target.tasks if t in registry.get(name).cluster.tasks]
        rows[f"--engine {name}"] = " + ".join(tasks)
    rows.update({"GPUs": target.gpus, "preemption": target.preemption,
                 "progress": target.progress})
    return rows
