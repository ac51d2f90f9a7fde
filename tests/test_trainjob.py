"""Kubeflow Trainer v2 (issue 39): ``submit --target trainjob`` and the
TensorFlow runtime it ships, the cluster a TrainJob pod's environment
describes, and real clusters given exactly that environment.

- the manifests round-trip through the ``kubeflow-trainer-api`` 2.3 models;
  the CEL rules of Trainer v2.3.0's CRDs that apply to them hold (evaluated
  with cel-python), and a manifest that breaks one is caught; the manifests
  validate against the OpenAPI schemas of Trainer v2.3.0's CRDs (copies in
  tests/data/trainer-v2.3.0/, with their source and licence), the rules
  listed here are the CRDs' own, and the JAX plugin's variable names are the
  ones read here;
- the Kubeflow SDK (``kubeflow`` 0.5) lists and gets the TensorFlow runtime
  beside Trainer's own, through its Kubernetes backend against a local
  server; the runtime is refused without an image, which would break the
  SDK's ``list_runtimes()`` for the whole cluster;
- the pods' variables (Trainer's JAX plugin's, this package's TensorFlow
  runtime's) make the process group / TF_CONFIG, with an error per variable;
  a TrainJob whose ``numNodes`` alone is edited makes one cluster of that size;
- three local processes, each given a TrainJob pod's environment (built from
  the manifests) in a private network namespace where the job's host names
  point at 127.0.0.1, train as one cluster: estimator in py311; keras and
  keras3 on JAX in the keras env.
"""

import http.server
import json
import os
import re
import subprocess
import sys
import threading

import pytest
import yaml

from estimator_keras.cloud import trainjob
from estimator_keras.cloud.spec import JobSpec
from estimator_keras.distribute import jax_processes, trainjob_pods
from estimator_keras.errors import ClusterConfigError, ConfigError
from support import ROOT, checkpoint_steps, child_env, cli

JOB_DIR = "gs://my-bucket/runs/1"
IMAGE = "gcr.io/p/ek:1"
# Files of github.com/kubeflow/trainer at v2.3.0 (see the folder's README.md).
TRAINER = os.path.join(ROOT, "tests", "data", "trainer-v2.3.0")

# The CEL rules (x-kubernetes-validations) of Trainer v2.3.0's CRDs that a
# manifest of ours meets at creation: (kind, path to the node, rule). Rules
# comparing with oldSelf apply to updates only; managedBy, initializer and
# volume claim rules concern fields we never set.
CEL_RULES = (
    ("TrainJob", "", "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')"),
    ("TrainJob", "", "size(self.metadata.name) <= 63"),
    ("ClusterTrainingRuntime", "spec.mlPolicy",
     "[has(self.torch), has(self.mpi), has(self.jax), has(self.xgboost),has(self.flux)]"
     ".filter(x, x).size() <= 1"),
    ("ClusterTrainingRuntime", "spec.template.spec",
     "!(has(self.startupPolicy) && self.startupPolicy.startupPolicyOrder == 'InOrder' && "
     "self.replicatedJobs.exists(x, has(x.dependsOn)))"),
)


def _manifest(engine, workers=2, **spec_fields):
    args = ["submit", "fashion_mnist_cnn", "--target", "trainjob", "--job-dir", JOB_DIR,
            "--engine", engine, "--container-image", IMAGE, "--cpu", "4", "--memory", "8Gi"]
    if workers:
        args += ["--workers", str(workers)]
    for flag, value in spec_fields.items():
        args += ["--" + flag.replace("_", "-"), str(value)]
    rc, out, err = cli(*args, timeout=120)
    assert rc == 0, err
    return yaml.safe_load(out)


def _runtime():
    rc, out, err = cli("submit", "--target", "trainjob", "--print-runtime",
                       "--container-image", IMAGE, timeout=120)
    assert rc == 0, err
    return yaml.safe_load(out)


def _trainer_file(path):
    with open(os.path.join(TRAINER, path), encoding="utf-8") as f:
        return f.read()


def _jax_distributed():
    """Trainer's own runtime, the keras3 engine's TrainJobs run on."""
    return yaml.safe_load(_trainer_file("manifests/base/runtimes/jax_distributed.yaml"))


def _node(manifest, path):
    for part in filter(None, path.split(".")):
        manifest = manifest[part]
    return manifest


def _cel_holds(rule, node):
    celpy = pytest.importorskip("celpy")
    env = celpy.Environment()
    return bool(env.program(env.compile(rule)).evaluate({"self": celpy.json_to_cel(node)}))


# ------------------------------------------------------------ the manifests

# Not "engine": the environments would run each case in one env only.
@pytest.mark.parametrize("job_engine", ["estimator", "keras", "keras3"])
def test_a_trainjob_per_engine_names_its_runtime_and_passes_trainers_models(job_engine):
    engine = job_engine
    manifest = _manifest(engine)
    assert manifest["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
    assert manifest["kind"] == "TrainJob"
    spec = manifest["spec"]
    expected = "jax-distributed" if engine == "keras3" else "estimator-keras-tensorflow"
    assert spec["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org",
                                  "kind": "ClusterTrainingRuntime", "name": expected}
    trainer = spec["trainer"]
    assert trainer["numNodes"] == 3 and trainer["image"] == IMAGE
    assert trainer["command"][:4] == ["python", "-m", "experiments", "train"]
    assert trainer["command"][trainer["command"].index("--engine") + 1] == engine
    assert trainer["command"][trainer["command"].index("--model-dir") + 1] == JOB_DIR + "/model"
    # Nothing beside numNodes says how many nodes there are.
    env = {e["name"]: e["value"] for e in trainer.get("env", [])}
    assert env == ({"KERAS_BACKEND": "jax"} if engine == "keras3" else {})
    assert trainer["resourcesPerNode"] == {"requests": {"cpu": "4", "memory": "8Gi"},
                                           "limits": {"cpu": "4", "memory": "8Gi"}}
    trainjob.check(manifest)
    for kind, path, rule in CEL_RULES:
        if kind == "TrainJob":
            assert _cel_holds(rule, _node(manifest, path)), rule


def test_gpus_are_each_nodes_limit():
    manifest = _manifest("estimator", accelerator="NVIDIA_TESLA_T4:2")
    assert manifest["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "2"
    trainjob.check(manifest)


def test_the_tensorflow_runtime_passes_trainers_models_and_rules():
    runtime = _runtime()
    assert runtime["kind"] == "ClusterTrainingRuntime"
    assert runtime["metadata"]["name"] == "estimator-keras-tensorflow"
    # Trainer's JAX policy, for the node count its plugin gives every pod.
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 1, "jax": {}}
    jobs = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert [j["name"] for j in jobs] == ["node"]
    assert jobs[0]["template"]["metadata"]["labels"] == {
        "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
    container = jobs[0]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert container["name"] == "node" and container["image"] == IMAGE
    fields = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
              for e in container["env"]}
    assert fields["EK_TRAINJOB_NAME"] == "metadata.labels['jobset.sigs.k8s.io/jobset-name']"
    assert fields["EK_TRAINJOB_NODE_INDEX"] == (
        "metadata.annotations['batch.kubernetes.io/job-completion-index']")
    trainjob.check(runtime)
    for kind, path, rule in CEL_RULES:
        if kind == "ClusterTrainingRuntime":
            assert _cel_holds(rule, _node(runtime, path)), rule


def test_the_checks_catch_a_broken_manifest():
    runtime = _runtime()
    broken = json.loads(json.dumps(runtime))
    broken["spec"]["mlPolicy"].update({"jax": {}, "torch": {}})
    assert not _cel_holds(CEL_RULES[2][2], broken["spec"]["mlPolicy"])
    manifest = _manifest("keras3")
    manifest["metadata"]["name"] = "Fashion_MNIST"
    assert not _cel_holds(CEL_RULES[0][2], manifest)
    pytest.importorskip("kubeflow_trainer_api")
    manifest = _manifest("keras3")
    manifest["spec"]["trainer"]["nodes"] = 3
    with pytest.raises(ConfigError, match=r"spec\.trainer\.nodes"):
        trainjob.check(manifest)
    manifest = _manifest("keras3")
    manifest["spec"]["trainer"]["numNodes"] = "three"
    with pytest.raises(ConfigError, match="numNodes"):
        trainjob.check(manifest)


def test_a_long_name_leaves_room_for_the_pods_host_names():
    spec = JobSpec(experiment="x", job_dir=JOB_DIR, engine="keras3", workers=11,
                   display_name="a-very-long-experiment-name-that-goes-on-and-on-and-on-2026")
    name = trainjob.build_trainjob_manifest(spec, IMAGE)["metadata"]["name"]
    assert len(trainjob_pods.host(name, 11).split(".")[0]) <= 63
    assert _cel_holds(CEL_RULES[0][2], {"metadata": {"name": name}})


@pytest.mark.parametrize("flags, names", [(["--ps", "1"], "--ps 1"),
                                          (["--evaluator"], "--evaluator")])
def test_parameter_servers_and_evaluators_are_sent_to_a_tfjob(flags, names):
    rc, out, err = cli("submit", "fashion_mnist_cnn", "--target", "trainjob", "--job-dir",
                       JOB_DIR, "--engine", "estimator", "--container-image", IMAGE, *flags,
                       timeout=120)
    assert rc == 2 and out == ""
    assert names in err and "--target tfjob" in err


def test_bad_resources_and_resources_off_kubernetes_are_refused():
    rc, _, err = cli("submit", "fashion_mnist_cnn", "--target", "trainjob", "--job-dir",
                     JOB_DIR, "--container-image", IMAGE, "--memory", "lots", timeout=120)
    assert rc == 2 and "--memory 'lots' is not a Kubernetes quantity" in err
    rc, _, err = cli("submit", "fashion_mnist_cnn", "--job-dir", JOB_DIR, "--cpu", "8",
                     timeout=120)
    assert rc == 2 and "--cpu sets a TrainJob node's resources" in err


def _crd_schemas():
    documents = {}
    for kind, plural in (("TrainJob", "trainjobs"),
                         ("ClusterTrainingRuntime", "clustertrainingruntimes")):
        crd = yaml.load(_trainer_file(f"manifests/base/crds/trainer.kubeflow.org_{plural}.yaml"),
                        Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
        documents[kind] = version["schema"]["openAPIV3Schema"]
    return documents


def test_manifests_and_variables_match_trainer_v2_3_0():
    import jsonschema  # pylint: disable=import-outside-toplevel  (the test extra)
    # The pods read what Trainer v2.3.0's JAX policy sets (its
    # pkg/runtime/framework/plugins/jax/jax.go, read when this was written:
    # trainjob_pods.JAX_VARIABLES, the node count from the TrainJob's numNodes,
    # the coordinator at the first pod of the "node" job on port 29500). Its
    # code is not copied here; the CRDs below are its published API.
    documents = _crd_schemas()
    for document in documents.values():
        jsonschema.Draft4Validator.check_schema(_openapi_to_jsonschema(document))
    # OpenAPI 3.0's schemas are JSON Schema draft 4's dialect (exclusiveMinimum
    # a boolean), less Kubernetes' extensions.
    schemas = {kind: jsonschema.Draft4Validator(_openapi_to_jsonschema(d))
               for kind, d in documents.items()}
    manifests = [_manifest(e) for e in ("estimator", "keras", "keras3")] + [
        _runtime(), _jax_distributed()]
    for manifest in manifests:
        schemas[manifest["kind"]].validate(manifest)
    # A field the CRD does not have, or a value of the wrong type, fails.
    for path, value in (("spec.trainer.nodes", 3), ("spec.trainer.numNodes", "3")):
        broken = json.loads(json.dumps(manifests[0]))
        *parents, last = path.split(".")
        _node(broken, ".".join(parents))[last] = value
        with pytest.raises(jsonschema.ValidationError):
            schemas["TrainJob"].validate(broken)
    # The rules this module evaluates are the CRDs' own, and no other rule
    # of theirs applies to what our manifests hold.
    found = set()
    for kind, schema in documents.items():
        found |= {(kind, r) for r in _rules(schema) if "oldSelf" not in r}
    ours = {(kind, rule) for kind, _, rule in CEL_RULES}
    assert ours <= {(k, " ".join(r.split())) for k, r in found}


# ------------------------------------------------------------ the Kubeflow SDK

class _KubernetesAPI(http.server.ThreadingHTTPServer):
    """Answers the GETs of the Kubeflow SDK's Kubernetes backend from
    ``objects`` (path: JSON document); 404 for anything else."""

    def __init__(self, objects):
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # pylint: disable=invalid-name
                body = objects.get(self.path.split("?")[0])
                data = json.dumps(body if body is not None else {
                    "kind": "Status", "code": 404, "reason": "NotFound"}).encode()
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):  # pylint: disable=arguments-differ
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def client(self):
        kubernetes = pytest.importorskip("kubernetes")
        sdk = pytest.importorskip("kubeflow.trainer")
        configuration = kubernetes.client.Configuration()
        configuration.host = f"http://127.0.0.1:{self.server_address[1]}"
        return sdk.TrainerClient(backend_config=sdk.KubernetesBackendConfig(
            namespace="team", client_configuration=configuration))


def _cluster_of(runtimes):
    group = "/apis/trainer.kubeflow.org/v1alpha1"
    objects = {
        "/api/v1/namespaces/kubeflow-system/configmaps/kubeflow-trainer-public": {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "kubeflow-trainer-public"},
            "data": {"kubeflow_trainer_version": "v2.3.0"}},
        f"{group}/clustertrainingruntimes": {
            "apiVersion": trainjob.API_VERSION, "kind": "ClusterTrainingRuntimeList",
            "metadata": {}, "items": runtimes},
        f"{group}/namespaces/team/trainingruntimes": {
            "apiVersion": trainjob.API_VERSION, "kind": "TrainingRuntimeList", "metadata": {},
            "items": []}}
    for runtime in runtimes:
        objects[f"{group}/clustertrainingruntimes/{runtime['metadata']['name']}"] = runtime
    return _KubernetesAPI(objects)


def test_the_kubeflow_sdk_lists_and_gets_the_tensorflow_runtime():
    runtime = _runtime()
    listed = [_jax_distributed(), runtime]
    server = _cluster_of(listed)
    try:
        client = server.client()
        found = {r.name: r for r in client.list_runtimes()}
        assert set(found) == {"jax-distributed", "estimator-keras-tensorflow"}
        got = client.get_runtime("estimator-keras-tensorflow")
        for entry in (found["estimator-keras-tensorflow"], got):
            assert entry.kind.value == "ClusterTrainingRuntime"
            assert entry.trainer.framework == "tensorflow" and entry.trainer.image == IMAGE
            assert entry.trainer.num_nodes == 1
        # What the runtime was without an image: the SDK lists nothing at all.
        runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"][
            "template"]["spec"]["containers"][0].pop("image")
        with pytest.raises(Exception, match="doesn't have trainer container"):
            client.list_runtimes()
    finally:
        server.shutdown()
        server.server_close()


def test_the_tensorflow_runtime_is_refused_without_an_image(tmp_path):
    out_file = tmp_path / "runtime.yaml"
    rc, out, err = cli("submit", "--target", "trainjob", "--print-runtime", "--output",
                       out_file, timeout=120)
    assert rc == 2 and out == "" and not out_file.exists()
    assert "--container-image" in err and "list_runtimes()" in err, err
    with pytest.raises(ConfigError, match="needs --container-image"):
        trainjob.build_tensorflow_runtime("")


def _rules(node):
    for rule in node.get("x-kubernetes-validations", []):
        yield " ".join(rule["rule"].split())
    for child in node.get("properties", {}).values():
        yield from _rules(child)
    if isinstance(node.get("items"), dict):
        yield from _rules(node["items"])


_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf")


def _openapi_to_jsonschema(node):
    """A CRD's structural schema as JSON Schema, each subschema converted
    once: unknown fields refused where the API server prunes them,
    int-or-string values allowed, Kubernetes' extensions dropped."""
    out = {k: v for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if "properties" in node:
        out["properties"] = {k: _openapi_to_jsonschema(v) for k, v in node["properties"].items()}
        if not node.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    for key in ("items", "additionalProperties", "not"):
        if isinstance(node.get(key), dict):
            out[key] = _openapi_to_jsonschema(node[key])
    for key in _SUBSCHEMA_LISTS:
        if key in node:
            out[key] = [_openapi_to_jsonschema(v) for v in node[key]]
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    return out


# ------------------------------------------------------------ what a pod is told

def test_the_jax_plugins_variables_make_a_process_group():
    environ = {"JAX_COORDINATOR_ADDRESS": "job-node-0-0.job:29500", "JAX_NUM_PROCESSES": "3",
               "JAX_PROCESS_ID": "2"}
    group = jax_processes.from_environ(environ)
    assert (group.coordinator, group.num_processes, group.process_id) == (
        "job-node-0-0.job:29500", 3, 2)
    assert "TrainJob" in group.source
    assert jax_processes.from_environ({}) is None


@pytest.mark.parametrize("missing", trainjob_pods.JAX_VARIABLES)
def test_each_missing_jax_variable_is_named(missing):
    environ = {"JAX_COORDINATOR_ADDRESS": "job-node-0-0.job:29500", "JAX_NUM_PROCESSES": "3",
               "JAX_PROCESS_ID": "0"}
    del environ[missing]
    with pytest.raises(ClusterConfigError, match="missing " + missing):
        jax_processes.from_environ(environ)


@pytest.mark.parametrize("name, value, message", [
    ("JAX_COORDINATOR_ADDRESS", "job-node-0-0.job", "port"),
    ("JAX_COORDINATOR_ADDRESS", "job-node-0-0.job:99999", "port"),
    ("JAX_NUM_PROCESSES", "0", "JAX_NUM_PROCESSES='0'"),
    ("JAX_PROCESS_ID", "3", "JAX_PROCESS_ID='3' is not a whole number from 0 to 2"),
])
def test_bad_jax_variables_are_named(name, value, message):
    environ = {"JAX_COORDINATOR_ADDRESS": "job-node-0-0.job:29500", "JAX_NUM_PROCESSES": "3",
               "JAX_PROCESS_ID": "1", name: value}
    with pytest.raises(ClusterConfigError, match=message):
        jax_processes.from_environ(environ)


def test_a_jaxjobs_and_a_trainjobs_variables_together_are_refused():
    environ = {"JAX_COORDINATOR_ADDRESS": "job-node-0-0.job:29500", "JAX_NUM_PROCESSES": "2",
               "JAX_PROCESS_ID": "1", "COORDINATOR_ADDRESS": "h", "COORDINATOR_PORT": "6666",
               "NUM_PROCESSES": "2", "PROCESS_ID": "1"}
    with pytest.raises(ClusterConfigError, match="one pod belongs to one job"):
        jax_processes.from_environ(environ)


def _tf_pod(index, nodes=3, job="fmnist"):
    # The runtime's variables, and the JAX plugin's (the node count).
    return {"EK_TRAINJOB_NAME": job, "EK_TRAINJOB_NODE_INDEX": str(index),
            "EK_TRAINJOB_PORT": "2222", "JAX_NUM_PROCESSES": str(nodes),
            "JAX_PROCESS_ID": str(index), "JAX_COORDINATOR_ADDRESS": f"{job}-node-0-0.{job}:29500"}


@pytest.mark.parametrize("index, task", [(0, {"type": "chief", "index": 0}),
                                         (1, {"type": "worker", "index": 0}),
                                         (2, {"type": "worker", "index": 1})])
def test_the_tensorflow_runtimes_variables_make_tf_config(index, task):
    environ = _tf_pod(index)
    config = trainjob_pods.export_tf_config(environ)
    assert json.loads(environ["TF_CONFIG"]) == config
    assert config == {"cluster": {"chief": ["fmnist-node-0-0.fmnist:2222"],
                                  "worker": ["fmnist-node-0-1.fmnist:2222",
                                             "fmnist-node-0-2.fmnist:2222"]},
                      "task": task}
    assert trainjob_pods.export_tf_config({}) is None


@pytest.mark.parametrize("missing", trainjob_pods.TF_VARIABLES)
def test_each_missing_tensorflow_runtime_variable_is_named(missing):
    environ = _tf_pod(1)
    del environ[missing]
    with pytest.raises(ClusterConfigError, match="missing " + missing):
        trainjob_pods.export_tf_config(environ)


@pytest.mark.parametrize("name, value, message", [
    ("EK_TRAINJOB_NAME", "Bad_Name", "not a TrainJob name"),
    ("EK_TRAINJOB_NAME", "Fmnist", "not a TrainJob name"),
    ("JAX_NUM_PROCESSES", "0", "JAX_NUM_PROCESSES='0'"),
    ("EK_TRAINJOB_NODE_INDEX", "3", "from 0 to 2"),
    ("EK_TRAINJOB_PORT", "http", "EK_TRAINJOB_PORT='http'"),
])
def test_bad_tensorflow_runtime_variables_are_named(name, value, message):
    environ = dict(_tf_pod(1), **{name: value})
    with pytest.raises(ClusterConfigError, match=message):
        trainjob_pods.export_tf_config(environ)


def test_tf_config_and_the_runtimes_variables_together_are_refused():
    environ = dict(_tf_pod(0), TF_CONFIG='{"cluster": {"chief": ["h:1"]}}')
    with pytest.raises(ClusterConfigError, match="both TF_CONFIG and the TrainJob variables"):
        trainjob_pods.export_tf_config(environ)
    assert environ["TF_CONFIG"] == '{"cluster": {"chief": ["h:1"]}}'


# ------------------------------------------------------------ real pods

TIMEOUT = 420


def _pod_environments(manifest, runtime):
    """Each pod's environment as Kubernetes and Trainer v2.3.0 would make it
    from ``manifest`` on ``runtime``: the runtime's container variables (the
    downward API's fields filled in), the JAX plugin's three where the
    runtime's policy is JAX (pkg/runtime/framework/plugins/jax/jax.go: the
    count is the TrainJob's numNodes), then the TrainJob's own."""
    job, nodes = manifest["metadata"]["name"], manifest["spec"]["trainer"]["numNodes"]
    (container,) = runtime["spec"]["template"]["spec"]["replicatedJobs"][0][
        "template"]["spec"]["template"]["spec"]["containers"]
    pods = []
    for index in range(nodes):
        fields = {"metadata.labels['jobset.sigs.k8s.io/jobset-name']": job,
                  "metadata.annotations['batch.kubernetes.io/job-completion-index']": str(index)}
        env = {"HOSTNAME": f"{job}-node-0-{index}", "JOB_COMPLETION_INDEX": str(index)}
        for item in container.get("env", []):
            env[item["name"]] = item.get("value") or fields[
                item["valueFrom"]["fieldRef"]["fieldPath"]]
        if "jax" in runtime["spec"]["mlPolicy"]:
            env.update({"JAX_NUM_PROCESSES": str(nodes), "JAX_PROCESS_ID": str(index),
                        "JAX_COORDINATOR_ADDRESS": f"{job}-node-0-0.{job}:29500"})
        env.update({e["name"]: e["value"] for e in manifest["spec"]["trainer"].get("env", [])})
        pods.append(env)
    return pods


@pytest.mark.parametrize("nodes", [1, 2, 5])
def test_a_trainjob_whose_num_nodes_alone_is_edited_is_one_cluster_of_that_many(nodes):
    spec = JobSpec(experiment="fashion_mnist_cnn", job_dir=JOB_DIR, engine="estimator",
                   workers=2, display_name="fmnist")
    manifest = trainjob.build_trainjob_manifest(spec, IMAGE)
    manifest["spec"]["trainer"]["numNodes"] = nodes
    hosts = [f"fmnist-node-0-{i}.fmnist:2222" for i in range(nodes)]
    runtime = trainjob.build_tensorflow_runtime(IMAGE)
    for index, env in enumerate(_pod_environments(manifest, runtime)):
        config = trainjob_pods.tf_config(env)
        assert config["cluster"]["chief"] + config["cluster"].get("worker", []) == hosts
        assert config["task"] == ({"type": "chief", "index": 0} if index == 0 else
                                  {"type": "worker", "index": index - 1})


def test_a_pod_of_a_runtime_without_the_node_count_is_told_to_reinstall_it():
    # The plain-ML runtime of earlier releases: Trainer sets no count.
    runtime = trainjob.build_tensorflow_runtime(IMAGE)
    runtime["spec"]["mlPolicy"].pop("jax")
    spec = JobSpec(experiment="fashion_mnist_cnn", job_dir=JOB_DIR, engine="estimator",
                   workers=1)
    (env, _) = _pod_environments(trainjob.build_trainjob_manifest(spec, IMAGE), runtime)
    with pytest.raises(ClusterConfigError, match=r"no JAX_NUM_PROCESSES.*--print-runtime"):
        trainjob_pods.tf_config(env)


def _run_pods(tmp_path, engine, data_dir):
    manifest = _manifest(engine, display_name="fmnist-trainjob")
    runtime = _jax_distributed() if engine == "keras3" else _runtime()
    model_dir = tmp_path / "model"
    command = list(manifest["spec"]["trainer"]["command"])
    command[command.index("--model-dir") + 1] = str(model_dir)
    command[command.index("--data-dir") + 1] = str(data_dir)
    command = [sys.executable] + command[1:] + [
        "--max-steps", "20", "--eval-every", "10", "--batch-size", "16"]
    job = manifest["metadata"]["name"]
    base = child_env()
    for name in list(base):
        if name.startswith(("JAX_", "EK_TRAINJOB_")) or name in ("TF_CONFIG", "CLUSTER_SPEC"):
            del base[name]
    pods = []
    for index, env in enumerate(_pod_environments(manifest, runtime)):
        pods.append({"env": dict(base, **env), "argv": command, "cwd": ROOT,
                     "hostname": env["HOSTNAME"],
                     "log": str(tmp_path / f"pod-{index}.log")})
    plan = {"hosts": [trainjob_pods.host(job, i) for i in range(len(pods))], "pods": pods,
            "timeout": TIMEOUT, "result": str(tmp_path / "result.json")}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "--net",
                    sys.executable, os.path.join(ROOT, "tests", "trainjob_pods_run.py"),
                    str(tmp_path / "plan.json")], timeout=TIMEOUT + 120, check=True)
    result = json.loads((tmp_path / "result.json").read_text())
    logs = [(tmp_path / f"pod-{i}.log").read_text() for i in range(len(pods))]
    return result["returncodes"], logs, model_dir


def _engines_here():
    env = os.environ.get("TOX_ENV_NAME", "")
    return ["estimator"] if env == "py311" else ["keras", "keras3"] if env == "keras" else []


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["estimator", "keras", "keras3"])
def test_three_pods_given_a_trainjobs_environment_train_as_one_cluster(engine, fashion_data,
                                                                       tmp_path):
    if engine not in _engines_here():
        pytest.skip(f"the {engine} engine's TrainJob runs in another tox env")
    codes, logs, model_dir = _run_pods(tmp_path, engine, fashion_data)
    assert codes == [0, 0, 0], "\n\n".join(log[-3000:] for log in logs)
    chief = logs[0]
    if engine == "keras3":
        assert "3 JAX processes" in chief and "(3 replica(s))" in chief
    else:
        assert "strategy multi_worker_mirrored" in chief and "(3 replica(s))" in chief
    for log in logs:
        assert "trained to step 20" in log
    # One model dir, written by the chief alone: pod 0.
    assert "exported" in chief and all("exported" not in log for log in logs[1:])
    assert max(checkpoint_steps(model_dir)) == 20
    assert json.loads((model_dir / "export" / "export.json").read_text())["global_step"] == 20


# ------------------------------------------------------------ the docs' table of targets

def test_the_targets_table_follows_the_registry_and_the_refusals():
    from estimator_keras.cloud import targets
    by_name = {t.name: targets.facts(t) for t in targets.TARGETS}
    assert set(by_name) == {"vertex", "trainjob", "tfjob", "jaxjob"}
    # What the table says an engine runs is what submit accepts, and "no"
    # is what it refuses.
    for target, facts in by_name.items():
        for engine in ("estimator", "keras", "keras3"):
            args = ["submit", "fashion_mnist_mlp", "--target", target, "--job-dir", JOB_DIR,
                    "--engine", engine, "--container-image", IMAGE, "--dry-run"]
            if target == "vertex":
                args += ["--project", "my-project", "--region", "us-central1"]
            rc, _, err = cli(*args, timeout=120)
            assert (rc == 0) == (facts[f"--engine {engine}"] != "no"), (target, engine, err)
    assert by_name["trainjob"]["--engine estimator"] == "chief + worker"
    assert by_name["tfjob"]["--engine estimator"] == "chief + worker + ps + evaluator"
