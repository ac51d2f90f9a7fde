"""Tests for estimator_keras.cloud.* and `experiments submit` (no network, no cloud)."""

import argparse
import json
import os
import shlex
import subprocess
import sys

import mock
import pytest
import yaml

from estimator_keras.cloud import backends, jobenv, packaging, submission, tfjob, vertex
from estimator_keras.cloud.spec import JobSpec, parse_accelerator
from estimator_keras.errors import CloudError, ConfigError, UsageError
from experiments import submit as submit_cmd

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


EXPECTED_ARGS = ["train", "fashion_mnist_cnn",
                 "--model-dir", "gs://my-bucket/run1/model",
                 "--data-dir", "gs://my-bucket/run1/data",
                 "--max-steps", "500", "--hparams", "lr=0.1,units=64"]


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
    assert "gs://my-bucket/run1/model" in body["jobSpec"]["workerPoolSpecs"][0][
        "pythonPackageSpec"]["args"]


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
        "train", "fashion_mnist_cnn", "--model-dir", "gs://my-bucket/run1/model",
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


def test_sdk_path_converts_to_snake_case_and_maps_credential_errors():
    aiplatform = mock.Mock()
    storage = mock.Mock()
    aiplatform.CustomJob.return_value.resource_name = "projects/1/locations/r/customJobs/7"
    request = vertex.build_custom_job(full_spec())
    with mock.patch("shutil.which", return_value=None), \
            mock.patch.object(backends.Submitter, "_import_sdk",
                              staticmethod(lambda: (aiplatform, storage))):
        job = backends.Submitter().create_job(request, "my-project-123", "us-central1")
        kwargs = aiplatform.CustomJob.call_args[1]
        assert kwargs["base_output_dir"] == "gs://my-bucket/run1"
        assert kwargs["location"] == "us-central1"
        first = kwargs["worker_pool_specs"][0]
        assert first["machine_spec"]["accelerator_type"] == "NVIDIA_TESLA_T4"
        assert first["python_package_spec"]["executor_image_uri"] == GPU_IMAGE
        assert job["name"].endswith("/customJobs/7")

        class DefaultCredentialsError(Exception):
            pass
        DefaultCredentialsError.__module__ = "google.auth.exceptions"
        aiplatform.CustomJob.side_effect = DefaultCredentialsError("no ADC")
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
        assert container["command"] == ["python", "-m", "experiments"] + EXPECTED_ARGS
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
                    "source": "vertex"}


def test_resolve_vertex_environment_explicit_model_dir_wins():
    dirs = jobenv.resolve_vertex_environment("gs://b/mine/", env=AIP)
    assert dirs == {"model_dir": "gs://b/mine", "checkpoint_dir": "gs://b/mine",
                    "tensorboard_dir": "gs://b/mine", "export_dir": "gs://b/mine/export",
                    "source": "flag"}


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
    assert pools[0]["pythonPackageSpec"]["args"] == EXPECTED_ARGS[:6] + [
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
