"""What a Kubeflow Trainer v2 TrainJob tells its pods, read as a cluster. TF-free.

A TrainJob runs one indexed Job of ``numNodes`` pods (JobSet's replicated job
``node``), each with a stable host name ``<job>-node-0-<index>.<job>`` on
the JobSet's headless service. Two runtimes serve this package:

* Trainer's built-in ``jax-distributed`` runtime, whose JAX plugin gives every
  pod ``JAX_COORDINATOR_ADDRESS`` (``host:port`` of pod 0), ``JAX_NUM_PROCESSES``
  and ``JAX_PROCESS_ID`` (the pod's completion index): the keras3 engine's
  process group (:func:`jax_group`);
* this package's TensorFlow runtime (``submit --target trainjob --print-runtime``):
  Trainer has none, so the runtime hands each pod the job's name and its
  completion index through the downward API, and asks for Trainer's JAX policy
  for one of its variables: ``JAX_NUM_PROCESSES``, the node count Trainer sets
  from the TrainJob's ``numNodes`` (the plain-ML policy tells a pod nothing of
  its peers). :func:`tf_config` builds ``TF_CONFIG`` from them (pod 0 the
  chief, the others workers) and :func:`export_tf_config` sets it before
  TensorFlow reads it.

Sources (github.com/kubeflow/trainer at v2.3.0): the JAX plugin,
pkg/runtime/framework/plugins/jax/jax.go (the variables, the coordinator
``<job>-node-0-0.<job>:29500``); pkg/constants/constants.go (``node``, port
29500, the completion index's field path); JobSet's pod host names and
subdomain (jobset.sigs.k8s.io, v1alpha2).
"""

import json
import os
import re

from estimator_keras.distribute.tf_config import whole_number
from estimator_keras.errors import ClusterConfigError

NODE = "node"
"""The replicated job and container name Trainer's runtimes use for the trainer."""
JAX_VARIABLES = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
"""What Trainer's JAX plugin sets in every pod of a ``jax-distributed`` TrainJob."""
TF_VARIABLES = ("EK_TRAINJOB_NAME", "EK_TRAINJOB_NODE_INDEX", "EK_TRAINJOB_PORT")
"""What this package's TensorFlow runtime sets in every pod: the TrainJob's
name (the JobSet's, from the pod's label), the pod's completion index and the
port each task's server listens on."""
NODE_COUNT = "JAX_NUM_PROCESSES"
"""The node count of a pod on the TensorFlow runtime: Trainer's JAX policy sets
it from the TrainJob's ``trainer.numNodes``, the count of pods it starts."""
NODE_COUNT_POLICY_FIELD = "jax"
"""The field of a runtime's ``mlPolicy`` (Trainer's API, not a Keras backend)
whose plugin sets :data:`NODE_COUNT` in every pod."""
TF_PORT = 2222
"""The TensorFlow runtime's port for TensorFlow's gRPC servers."""
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
"""The pod label holding the JobSet's name, which is the TrainJob's."""
COMPLETION_INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
"""The downward-API field of an indexed Job's pod index."""


_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def host(job, index):
    """The stable DNS name of pod ``index`` of TrainJob ``job``."""
    return f"{job}-{NODE}-0-{index}.{job}"


def all_or_none(environ, names, need):
    """True when every one of ``names`` is set, False when none is;
    ClusterConfigError for some: ``need`` says what needs them all, and why."""
    found = [v for v in names if str(environ.get(v, "")).strip()]
    if not found:
        return False
    missing = [v for v in names if v not in found]
    if missing:
        raise ClusterConfigError(
            f"{need}; given {', '.join(found)}, missing {', '.join(missing)}. Set the missing "
            f"ones, or unset them all to train in one process.")
    return True


def jax_group(environ):
    """``(coordinator "host:port", processes, this process's id)`` from a
    ``jax-distributed`` TrainJob's variables, or None when none is set.

    Raises:
      ClusterConfigError: some set and others missing, or a bad value.
    """
    if not all_or_none(environ, JAX_VARIABLES,
                        f"a JAX process group from Kubeflow Trainer needs all three of "
                        f"{', '.join(JAX_VARIABLES)} (its jax-distributed runtime sets them in "
                        f"every pod)"):
        return None
    address = environ["JAX_COORDINATOR_ADDRESS"].strip()
    hostname, _, port = address.rpartition(":")
    if not hostname or any(c.isspace() or c == "/" for c in hostname):
        raise ClusterConfigError(
            f"JAX_COORDINATOR_ADDRESS={address!r} is not \"host:port\" (Kubeflow Trainer sets "
            f"\"<job>-node-0-0.<job>:29500\").")
    whole_number("the port of JAX_COORDINATOR_ADDRESS", port, 1, 65535)
    count = whole_number("JAX_NUM_PROCESSES", environ["JAX_NUM_PROCESSES"], 1)
    rank = whole_number("JAX_PROCESS_ID", environ["JAX_PROCESS_ID"], 0, count - 1)
    return address, count, rank


def tf_config(environ):
    """The ``TF_CONFIG`` (a dict) of this pod of a TrainJob on the TensorFlow
    runtime, or None when none of :data:`TF_VARIABLES` is set: :data:`NODE_COUNT`
    pods, pod 0 the chief, pod ``i`` worker ``i - 1``; every task on port
    ``EK_TRAINJOB_PORT``.

    Raises:
      ClusterConfigError: some set and others missing, or a bad value.
    """
    if not all_or_none(environ, TF_VARIABLES,
                        f"a TensorFlow cluster from a Kubeflow TrainJob needs all three of "
                        f"{', '.join(TF_VARIABLES)} (the runtime from `submit --target trainjob "
                        f"--print-runtime` sets them in every pod)"):
        return None
    if not str(environ.get(NODE_COUNT, "")).strip():
        raise ClusterConfigError(
            f"this pod has the TensorFlow TrainJob runtime's {', '.join(TF_VARIABLES)} but no "
            f"{NODE_COUNT}, the node count Trainer's JAX policy sets from the TrainJob's "
            f"numNodes: the ClusterTrainingRuntime on this cluster predates it (a plain-ML "
            f"runtime, which tells a pod nothing of its peers). Install it again: "
            f"python -m experiments submit --target trainjob --print-runtime "
            f"--container-image IMAGE | kubectl apply -f -")
    job = environ["EK_TRAINJOB_NAME"].strip()
    if not _DNS_1035.match(job):
        raise ClusterConfigError(
            f"EK_TRAINJOB_NAME={job!r} is not a TrainJob name (a DNS-1035 label: lower-case "
            f"letters, digits and '-').")
    count = whole_number(NODE_COUNT, environ[NODE_COUNT], 1)
    index = whole_number("EK_TRAINJOB_NODE_INDEX", environ["EK_TRAINJOB_NODE_INDEX"], 0, count - 1)
    port = whole_number("EK_TRAINJOB_PORT", environ["EK_TRAINJOB_PORT"], 1, 65535)
    cluster = {"chief": [f"{host(job, 0)}:{port}"]}
    if count > 1:
        cluster["worker"] = [f"{host(job, i)}:{port}" for i in range(1, count)]
    task = {"type": "chief", "index": 0} if index == 0 else {"type": "worker",
                                                                 "index": index - 1}
    return {"cluster": cluster, "task": task}


def export_tf_config(environ=None):
    """Sets ``TF_CONFIG`` in ``environ`` (``os.environ``) from a TrainJob pod's
    variables, before TensorFlow or this package reads it; returns the dict,
    or None when the pod is not on the TensorFlow runtime.

    Raises:
      ClusterConfigError: bad variables, or ``TF_CONFIG`` set as well (two
        sources of one cluster: which is meant cannot be told).
    """
    environ = os.environ if environ is None else environ
    config = tf_config(environ)
    if config is None:
        return None
    if str(environ.get("TF_CONFIG", "")).strip():
        raise ClusterConfigError(
            f"both TF_CONFIG and the TrainJob variables {', '.join(TF_VARIABLES)} are set; a "
            f"pod of the TensorFlow TrainJob runtime gets its TF_CONFIG from the latter. Unset "
            f"TF_CONFIG, or the EK_TRAINJOB_* variables.")
    environ["TF_CONFIG"] = json.dumps(config)
    return config
