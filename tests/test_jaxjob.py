"""`submit --engine keras3`: the Kubeflow JAXJob (`--target jaxjob`), the Vertex AI
job of JAX processes, `--keras-backend`, and what each target refuses.
No network, no cloud, no Keras: the requests and manifests are only built."""

import json
import re

import pytest
import yaml

from estimator_keras.cloud import jaxjob, tfjob, vertex
from estimator_keras.cloud.spec import JobSpec
from estimator_keras.errors import ConfigError
from estimator_keras.tuning.space import Study, parse_space
from experiments import cli

IMAGE = "us-docker.pkg.dev/my-project/ml/estimator-keras:keras3"
JOB_DIR = "gs://my-bucket/run1"
KUBE_ARGS = ["train", "fashion_mnist_cnn", "--model-dir", JOB_DIR + "/model",
             "--data-dir", JOB_DIR + "/data", "--engine", "keras3"]
VERTEX_ARGS = ["train", "fashion_mnist_cnn", "--data-dir", JOB_DIR + "/data",
               "--engine", "keras3"]


def keras3_spec(**overrides):
    fields = dict(experiment="fashion_mnist_cnn", project="my-project-123",
                  region="us-central1", job_dir=JOB_DIR, display_name="fmnist-jax",
                  engine="keras3", container_image=IMAGE)
    fields.update(overrides)
    return JobSpec(**fields)


# ------------------------------------------------- the training-operator's rules

DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
RESTART_POLICIES = {"Always", "OnFailure", "Never", "ExitCode"}
CLEAN_POD_POLICIES = {"All", "Running", "None"}


def jaxjob_problems(manifest):
    """What the training-operator v1.9 would reject in a JAXJob manifest; [] if nothing.

    Our own structural check (not the operator's schema), of rules read in
    github.com/kubeflow/training-operator at tag v1.9.0:

    * manifests/base/crds/kubeflow.org_jaxjobs.yaml (the CRD's openAPIV3Schema):
      ``spec.jaxReplicaSpecs`` is required, a map of replica specs whose only
      fields are ``replicas`` (integer), ``restartPolicy`` (string) and
      ``template``; the pod spec requires ``containers``, each container requires
      ``name``; ``command`` is a list of strings; ``env`` entries require
      ``name``; ``ports`` entries require an integer ``containerPort``;
      ``runPolicy.cleanPodPolicy`` is a string; ``resources.limits`` values are
      integers or quantity strings.
    * pkg/webhooks/jax/jaxjob_webhook.go (the validating webhook):
      ``metadata.name`` is a DNS-1035 label; ``Worker`` is the only replica
      type; every replica spec has containers, each with an image, and one of
      them is named ``jax``.
    * pkg/apis/kubeflow.org/v1/jax_types.go and pkg/controller.v1/jax/envvar.go:
      the coordinator's port is the ``jax`` container's port named
      ``jaxjob-port`` on the Worker replicas (the controller fails the job
      without one; the defaulter adds 6666 when absent, but our manifests set it,
      so this check requires it), and the coordinator's
      address is the service ``<name>-worker-0``, a name that must itself stay a
      DNS-1035 label of at most 63 characters for every worker index.
    * pkg/apis/kubeflow.org/v1/common_types.go: the restart policies Always,
      OnFailure, Never, ExitCode and clean-pod policies All, Running, None.
    """
    problems = []

    def need(ok, text):
        if not ok:
            problems.append(text)

    need(manifest.get("apiVersion") == "kubeflow.org/v1", "apiVersion")
    need(manifest.get("kind") == "JAXJob", "kind")
    name = manifest.get("metadata", {}).get("name", "")
    need(isinstance(name, str) and len(name) <= 63 and DNS_1035.match(name),
         "metadata.name is not a DNS-1035 label: %r" % (name,))
    spec = manifest.get("spec")
    need(isinstance(spec, dict) and set(spec) <= {"runPolicy", "jaxReplicaSpecs"},
         "spec fields")
    spec = spec if isinstance(spec, dict) else {}
    clean = spec.get("runPolicy", {}).get("cleanPodPolicy", "None")
    need(clean in CLEAN_POD_POLICIES, "runPolicy.cleanPodPolicy %r" % (clean,))
    replica_specs = spec.get("jaxReplicaSpecs")
    need(isinstance(replica_specs, dict) and replica_specs, "spec.jaxReplicaSpecs required")
    for rtype, rspec in (replica_specs or {}).items():
        where = "jaxReplicaSpecs.%s" % rtype
        need(rtype == "Worker", "%s: replica type not supported (only Worker)" % where)
        need(set(rspec) <= {"replicas", "restartPolicy", "template"}, where + " fields")
        replicas = rspec.get("replicas", 1)
        need(isinstance(replicas, int) and not isinstance(replicas, bool) and replicas >= 1,
             where + ".replicas")
        need(rspec.get("restartPolicy", "Never") in RESTART_POLICIES, where + ".restartPolicy")
        containers = rspec.get("template", {}).get("spec", {}).get("containers") or []
        need(containers, where + ": containers must be specified")
        for container in containers:
            cwhere = "%s container %r" % (where, container.get("name"))
            need(isinstance(container.get("name"), str) and container["name"], cwhere + " name")
            need(isinstance(container.get("image"), str) and container["image"],
                 cwhere + ": image required")
            command = container.get("command", [])
            need(isinstance(command, list) and all(isinstance(c, str) for c in command),
                 cwhere + ".command")
            need(all(isinstance(e, dict) and e.get("name") for e in container.get("env", [])),
                 cwhere + ".env")
            need(all(isinstance(p.get("containerPort"), int) for p in container.get("ports", [])),
                 cwhere + ".ports")
            for value in container.get("resources", {}).get("limits", {}).values():
                need(isinstance(value, (int, str)) and not isinstance(value, bool),
                     cwhere + ".resources.limits")
        jax = [c for c in containers if c.get("name") == "jax"]
        need(jax, where + ": must have a container named jax")
        if rtype == "Worker" and jax:
            need(any(p.get("name") == "jaxjob-port" for p in jax[0].get("ports", [])),
                 where + ": the jax container exposes no port named jaxjob-port")
            last = "%s-worker-%d" % (name, replicas - 1)
            need(len(last) <= 63 and DNS_1035.match(last), "service name %r" % last)
    return problems


def test_the_rule_check_finds_what_the_operator_rejects():
    good = jaxjob.build_jaxjob_manifest(keras3_spec(workers=1))
    assert jaxjob_problems(good) == []
    worker = good["spec"]["jaxReplicaSpecs"]["Worker"]
    container = worker["template"]["spec"]["containers"][0]
    broken = [
        ({**good, "kind": "TFJob"}, "kind"),
        ({**good, "metadata": {"name": "1-job"}}, "DNS-1035"),
        ({**good, "metadata": {"name": "j" * 60}}, "service name"),
        ({**good, "spec": {}}, "jaxReplicaSpecs required"),
        ({**good, "spec": {"jaxReplicaSpecs": {"Chief": worker}}}, "only Worker"),
        ({**good, "spec": {"jaxReplicaSpecs": {"Worker": {**worker, "restartPolicy": "x"}}}},
         "restartPolicy"),
    ]
    for field, value, needle in (("name", "tensorflow", "named jax"),
                                 ("image", "", "image required"),
                                 ("ports", [], "jaxjob-port"),
                                 ("env", [{"value": "jax"}], ".env")):
        bad = json.loads(json.dumps(good))
        bad["spec"]["jaxReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0] = {
            **container, field: value}
        broken.append((bad, needle))
    for manifest, needle in broken:
        problems = jaxjob_problems(manifest)
        assert any(needle in p for p in problems), (needle, problems)


# ------------------------------------------------------------------ the manifest


def test_jaxjob_manifest_has_one_worker_spec_of_all_processes():
    spec = keras3_spec(workers=2, accelerator="NVIDIA_TESLA_T4:2",
                       train_args=["--max-steps", "500"])
    manifest = jaxjob.build_jaxjob_manifest(spec)
    loaded = yaml.safe_load(jaxjob.to_yaml(manifest))
    assert loaded == manifest
    assert jaxjob_problems(loaded) == []
    assert loaded["apiVersion"] == "kubeflow.org/v1" and loaded["kind"] == "JAXJob"
    assert loaded["metadata"] == {"name": "fmnist-jax"}
    assert loaded["spec"]["runPolicy"] == {"cleanPodPolicy": "Running"}
    assert list(loaded["spec"]["jaxReplicaSpecs"]) == ["Worker"]
    worker = loaded["spec"]["jaxReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 3 and worker["restartPolicy"] == "OnFailure"
    (container,) = worker["template"]["spec"]["containers"]
    assert container == {
        "name": "jax", "image": IMAGE,
        # No cluster flags: the operator sets COORDINATOR_ADDRESS and the rest.
        "command": ["python", "-m", "experiments"] + KUBE_ARGS + ["--max-steps", "500"],
        "env": [{"name": "KERAS_BACKEND", "value": "jax"}],
        "ports": [{"name": "jaxjob-port", "containerPort": 6666}],
        "resources": {"limits": {"nvidia.com/gpu": 2}}}


def test_jaxjob_uses_the_tfjob_image_command_and_options():
    spec = keras3_spec(modules=["my_experiments"], config="/app/c.yaml",
                       container_image=None, image="img:2")
    manifest = jaxjob.build_jaxjob_manifest(spec, namespace="ml", restart_policy="Never")
    (container,) = manifest["spec"]["jaxReplicaSpecs"]["Worker"]["template"]["spec"][
        "containers"]
    assert container["image"] == "img:2"
    assert container["command"] == ["python", "-m", "experiments", "--module",
                                    "my_experiments"] + KUBE_ARGS + ["--config", "/app/c.yaml"]
    assert "resources" not in container
    assert manifest["metadata"] == {"name": "fmnist-jax", "namespace": "ml"}
    assert manifest["spec"]["jaxReplicaSpecs"]["Worker"]["replicas"] == 1
    assert manifest["spec"]["jaxReplicaSpecs"]["Worker"]["restartPolicy"] == "Never"
    with pytest.raises(ConfigError, match="restart_policy"):
        jaxjob.build_jaxjob_manifest(spec, restart_policy="Sometimes")
    with pytest.raises(ConfigError, match="A JAXJob needs --image or --container-image"):
        jaxjob.build_jaxjob_manifest(keras3_spec(container_image=None))
    with pytest.raises(ConfigError, match="A JAXJob installs no packages"):
        jaxjob.build_jaxjob_manifest(keras3_spec(package_dirs=["pkg"], container_image=None),
                                     "img:1")


def test_jaxjob_names_leave_room_for_the_worker_services():
    for display_name, workers in (("A" * 80, 0), ("Run_" + "x" * 70, 11), ("2024 run", 1)):
        manifest = jaxjob.build_jaxjob_manifest(
            keras3_spec(display_name=display_name, workers=workers))
        assert jaxjob_problems(manifest) == [], display_name
    name = jaxjob.build_jaxjob_manifest(keras3_spec(display_name="2024 run"))["metadata"]
    assert name["name"] == "job-2024-run"


def test_jaxjob_backend_tensorflow_on_one_process():
    manifest = jaxjob.build_jaxjob_manifest(keras3_spec(keras_backend="tensorflow"))
    (container,) = manifest["spec"]["jaxReplicaSpecs"]["Worker"]["template"]["spec"][
        "containers"]
    assert container["env"] == [{"name": "KERAS_BACKEND", "value": "tensorflow"}]
    assert jaxjob_problems(manifest) == []


def test_the_builders_refuse_the_other_engines():
    with pytest.raises(ConfigError, match="use --target trainjob or --target tfjob, which run "
                                          "it"):
        jaxjob.build_jaxjob_manifest(keras3_spec(engine="keras"))
    with pytest.raises(ConfigError, match="--target jaxjob") as e:
        tfjob.build_tfjob_manifest(keras3_spec())
    assert "keras-team/keras#20585" in str(e.value)


# ------------------------------------------------------------------ Vertex AI


def test_vertex_keras3_runs_the_image_in_pools_0_and_1():
    spec = keras3_spec(workers=3, accelerator="NVIDIA_L4:1", machine_type="g2-standard-8")
    body = vertex.build_custom_job(spec)
    pools = body["jobSpec"]["workerPoolSpecs"]
    assert [p["replicaCount"] for p in pools] == [1, 3]
    for pool in pools:
        assert pool["machineSpec"] == {"machineType": "g2-standard-8",
                                       "acceleratorType": "NVIDIA_L4", "acceleratorCount": 1}
        assert "pythonPackageSpec" not in pool
        assert pool["containerSpec"] == {
            "imageUri": IMAGE, "command": ["python", "-m", "experiments"],
            "args": VERTEX_ARGS, "env": [{"name": "KERAS_BACKEND", "value": "jax"}]}
    one = vertex.build_custom_job(keras3_spec(keras_backend="tensorflow"))
    (pool,) = one["jobSpec"]["workerPoolSpecs"]
    assert pool["containerSpec"]["env"] == [{"name": "KERAS_BACKEND", "value": "tensorflow"}]


def test_other_engines_get_no_container_env():
    spec = keras3_spec(engine="keras")
    (pool,) = vertex.build_custom_job(spec)["jobSpec"]["workerPoolSpecs"]
    assert "env" not in pool["containerSpec"]


def test_vertex_tuning_trials_run_keras3_pools():
    study = Study(parse_space({"learning_rate": {"type": "double", "min": 0.001,
                                                  "max": 0.1}}),
                  metric="accuracy", max_trials=4, parallel_trials=2)
    body = vertex.build_tuning_job(keras3_spec(workers=1), study)
    pools = body["trialJobSpec"]["workerPoolSpecs"]
    assert [p["replicaCount"] for p in pools] == [1, 1]
    for pool in pools:
        assert pool["containerSpec"]["args"] == VERTEX_ARGS + [
            "--tuning-trial", "--hypertune-metric", "accuracy"]
        assert pool["containerSpec"]["env"] == [{"name": "KERAS_BACKEND", "value": "jax"}]


# ------------------------------------------------------------------ the CLI

KUBE = ["fashion_mnist_cnn", "--job-dir", JOB_DIR, "--display-name", "fmnist-jax",
        "--container-image", IMAGE]
VERTEX = KUBE + ["--project", "my-project-123", "--region", "us-central1", "--dry-run"]
NO_IMAGE = KUBE[:5] + VERTEX[len(KUBE):]


def _submit(capsys, argv):
    rc = cli.main(["submit"] + argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_writes_the_jaxjob(capsys, tmp_path):
    out_file = tmp_path / "jaxjob.yaml"
    rc, _, err = _submit(capsys, KUBE + ["--target", "jaxjob", "--engine", "keras3",
                                         "--workers", "2", "--output", str(out_file)])
    assert rc == 0, err
    assert "kubectl create -f" in err
    manifest = yaml.safe_load(out_file.read_text())
    assert jaxjob_problems(manifest) == []
    worker = manifest["spec"]["jaxReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 3
    assert worker["template"]["spec"]["containers"][0]["command"][3:] == KUBE_ARGS
    rc, out, err = _submit(capsys, KUBE + ["--target", "jaxjob", "--engine", "keras3",
                                           "--keras-backend", "tensorflow"])
    assert rc == 0, err
    env = yaml.safe_load(out)["spec"]["jaxReplicaSpecs"]["Worker"]["template"]["spec"][
        "containers"][0]["env"]
    assert env == [{"name": "KERAS_BACKEND", "value": "tensorflow"}]


def test_cli_vertex_keras3_dry_run(capsys):
    rc, out, err = _submit(capsys, VERTEX + ["--engine", "keras3", "--workers", "2",
                                             "--max-steps", "100"])
    assert rc == 0, err
    request_text, _, commands = out.partition("\n\n")
    pools = json.loads(request_text)["jobSpec"]["workerPoolSpecs"]
    assert [p["replicaCount"] for p in pools] == [1, 2]
    for pool in pools:
        assert pool["containerSpec"]["imageUri"] == IMAGE
        assert pool["containerSpec"]["args"] == VERTEX_ARGS + ["--max-steps", "100"]
        assert pool["containerSpec"]["env"] == [{"name": "KERAS_BACKEND", "value": "jax"}]
    # An image job uploads nothing: the one command creates the job.
    assert [line.split()[:4] for line in commands.splitlines()
            if line and not line.startswith("#")] == [["gcloud", "ai", "custom-jobs", "create"]]


REFUSALS = [
    (KUBE + ["--target", "jaxjob"], "--target jaxjob", "--target tfjob"),
    (KUBE + ["--target", "jaxjob", "--engine", "keras"], "--target jaxjob", "--target tfjob"),
    (KUBE + ["--target", "tfjob", "--engine", "keras3"], "--target tfjob", "--target jaxjob"),
    (KUBE + ["--target", "jaxjob", "--engine", "keras3", "--ps", "1"], "--ps",
     "--workers N"),
    (KUBE + ["--target", "jaxjob", "--engine", "keras3", "--workers", "1", "--evaluator"],
     "--evaluator", "--engine estimator"),
    (KUBE + ["--target", "jaxjob", "--engine", "keras3", "--workers", "1",
             "--keras-backend", "tensorflow"], "--keras-backend tensorflow",
     "--keras-backend jax"),
    (VERTEX + ["--engine", "keras3", "--workers", "2", "--keras-backend", "tensorflow"],
     "--keras-backend tensorflow", "keras-team/keras#20585"),
    (VERTEX + ["--engine", "keras3", "--ps", "1"], "--ps", "--workers N"),
    (VERTEX + ["--engine", "keras", "--keras-backend", "jax"], "--keras-backend",
     "--engine keras3"),
    (NO_IMAGE + ["--engine", "keras3"], "--container-image", "Dockerfile"),
    (NO_IMAGE + ["--engine", "keras3", "--image", IMAGE], "--container-image",
     "STACK=keras3"),
]


@pytest.mark.parametrize("argv, flag, advice", REFUSALS,
                         ids=[" ".join(a for a in r[0] if a not in VERTEX) for r in REFUSALS])
def test_cli_refusals_exit_2_with_one_paragraph(capsys, argv, flag, advice):
    rc, out, err = _submit(capsys, argv)
    assert rc == 2 and out == ""
    message = err.strip()
    assert message.startswith("error: ") and "\n" not in message, err
    assert flag in message and advice in message, message
    if "--engine keras3" in " ".join(argv) and "tensorflow" in argv:
        assert "keras-team/keras#20585" in message


def test_spec_refuses_what_keras3_cannot_run():
    for overrides, needle in (({"ps": 1}, "--ps 1"), ({"evaluator": True}, "--evaluator"),
                              ({"keras_backend": "torch"}, "--keras-backend must be"),
                              ({"workers": 1, "keras_backend": "tensorflow"},
                               "keras-team/keras#20585"),
                              ({"engine": "estimator", "keras_backend": "jax"},
                               "--keras-backend applies to --engine keras3 only")):
        with pytest.raises(ConfigError, match=re.escape(needle)):
            keras3_spec(**overrides).validate()
    with pytest.raises(ConfigError, match="--container-image"):
        keras3_spec(container_image=None, image=IMAGE).validate(for_vertex=True)
    with pytest.raises(ConfigError, match="--container-image"):
        vertex.build_custom_job(keras3_spec(container_image=None,
                                            package_uri=JOB_DIR + "/packages/p.tar.gz"))
    keras3_spec(workers=4).validate(for_vertex=True)
