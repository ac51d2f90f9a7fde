"""Vertex AI's newer job fields (Spot VMs, Flex-start, restarts, timeout,
service account, network, persistent resource, web access, TensorBoard,
Reduction Server), built through `submit --dry-run` and parsed with
google-cloud-aiplatform's own v1 types; every refusal; the SDK backend sending
the whole body. Runs where the cloud extra is installed (py311). No network."""

import json
import types
import warnings

import pytest
from google.protobuf import json_format

from estimator_keras.cloud import backends, submission, vertex_check, vertex_options
from estimator_keras.cloud.spec import JobSpec
from estimator_keras.cloud.vertex_options import VertexOptions, parse_duration
from estimator_keras.errors import ConfigError
from experiments import cli

with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)
    from google.cloud import aiplatform_v1

Strategy = aiplatform_v1.Scheduling.Strategy
JOB_DIR = "gs://my-bucket/run1"
SA = "trainer@my-project-123.iam.gserviceaccount.com"
BOARD = "projects/my-project-123/locations/us-central1/tensorboards/1234"
NETWORK = "projects/123456789012/global/networks/my-vpc"
VERTEX = ["--project", "my-project-123", "--region", "us-central1", "--job-dir", JOB_DIR,
          "--display-name", "newer-fields"]
GPU_WORKERS = ["--workers", "2", "--accelerator", "NVIDIA_TESLA_T4:1"]
EVERY_SPOT_FLAG = ["--spot", "--restart-on-preemption", "--timeout", "6h",
                   "--service-account", SA, "--network", NETWORK, "--enable-web-access",
                   "--tensorboard", BOARD, "--reduction-server", "3",
                   "--reduction-server-machine-type", "n2-highcpu-16"]
REDUCERS = "us-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest"


def _dry_run(capsys, argv):
    """The request ``submit NAME ARGV --dry-run`` prints, and the lines after it."""
    code = cli.main(["submit", "fashion_mnist_cnn", *argv, "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 0, err
    body, _, rest = out.partition("\n\n")
    return json.loads(body), rest


def _parsed(request, kind="custom"):
    """``request`` parsed as google-cloud-aiplatform's own message."""
    message = getattr(aiplatform_v1, vertex_check.KINDS[kind]).pb()()
    return json_format.ParseDict(request, message)


def _refused(capsys, argv):
    """stderr of ``submit NAME ARGV --dry-run``, which must exit 2."""
    assert cli.main(["submit", "fashion_mnist_cnn", *argv, "--dry-run"]) == 2, argv
    return capsys.readouterr().err


def test_every_spot_flag_reaches_the_custom_job_and_parses(capsys):
    request, rest = _dry_run(capsys, VERTEX + GPU_WORKERS + ["--evaluator"] + EVERY_SPOT_FLAG)
    job = _parsed(request).job_spec
    assert job.scheduling.strategy == Strategy.SPOT
    assert job.scheduling.restart_job_on_worker_restart is True
    assert job.scheduling.timeout.seconds == 6 * 3600
    assert request["jobSpec"]["scheduling"]["timeout"] == "21600s"
    assert (job.service_account, job.network, job.tensorboard) == (SA, NETWORK, BOARD)
    assert job.enable_web_access is True
    # pool 2: Google's reducers on CPU machines; the chief, workers and evaluator around it
    pools = job.worker_pool_specs
    assert [p.replica_count for p in pools] == [1, 2, 3, 1]
    reducers = pools[2]
    assert reducers.container_spec.image_uri == REDUCERS
    assert reducers.machine_spec.machine_type == "n2-highcpu-16"
    assert not reducers.machine_spec.accelerator_type and not reducers.container_spec.args
    for index in (0, 1, 3):
        args = list(pools[index].python_package_spec.args)
        assert args[args.index("--strategy") + 1] == "multi_worker_mirrored", args
        assert pools[index].machine_spec.accelerator_count == 1
    # every pool is used, so gcloud's --config is the jobSpec, new fields and all
    assert "--config=job_spec.json" in rest and "--worker-pool-spec" not in rest


def test_flex_start_and_a_persistent_resource_parse(capsys):
    request, _ = _dry_run(capsys, VERTEX + [
        "--accelerator", "NVIDIA_A100_80GB:8", "--machine-type", "a2-ultragpu-8g", "--workers",
        "1", "--flex-start", "--max-wait", "90m", "--timeout", "2d"])
    scheduling = _parsed(request).job_spec.scheduling
    assert scheduling.strategy == Strategy.FLEX_START
    assert (scheduling.max_wait_duration.seconds, scheduling.timeout.seconds) == (5400, 172800)

    request, _ = _dry_run(capsys, VERTEX + ["--flex-start", "--max-wait", "0",
                                            "--accelerator", "NVIDIA_L4:1"])
    assert request["jobSpec"]["scheduling"] == {"strategy": "FLEX_START",
                                                "maxWaitDuration": "0s"}
    _parsed(request)

    request, _ = _dry_run(capsys, VERTEX + ["--persistent-resource-id", "my-gpu-pool",
                                            "--restart-on-preemption"])
    job = _parsed(request).job_spec
    assert job.persistent_resource_id == "my-gpu-pool"
    assert job.scheduling.restart_job_on_worker_restart is True
    assert job.scheduling.strategy == Strategy.STRATEGY_UNSPECIFIED


def test_the_tuning_jobs_trials_carry_the_fields(capsys, tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("learning_rate: {type: double, min: 0.001, max: 0.1, scale: log}\n")
    request, rest = _dry_run(capsys, VERTEX + GPU_WORKERS + EVERY_SPOT_FLAG + [
        "--tune", str(space), "--max-trials", "4"])
    trial = _parsed(request, "tuning").trial_job_spec
    assert trial.scheduling.strategy == Strategy.SPOT and trial.tensorboard == BOARD
    assert (trial.service_account, trial.network, trial.enable_web_access) == (SA, NETWORK, True)
    assert trial.worker_pool_specs[2].container_spec.image_uri == REDUCERS
    args = list(trial.worker_pool_specs[0].python_package_spec.args)
    # the strategy goes before the trial flags, after which Vertex appends each value
    assert args[-5:] == ["--strategy", "multi_worker_mirrored", "--tuning-trial",
                         "--hypertune-metric", "accuracy"]
    assert "hptuning_job.json" in rest


def test_the_gcloud_flag_form_keeps_the_new_fields_in_its_config():
    # An unused pool in the middle (a ps without workers) puts the pools in
    # gcloud's flags; its --config keeps everything else of the jobSpec.
    spec = JobSpec(experiment="fashion_mnist_cnn", job_dir=JOB_DIR, project="my-project-123",
                   region="us-central1", ps=1, display_name="x",
                   container_image="gcr.io/p/ek:1",
                   vertex=VertexOptions(spot=True, timeout="45", service_account=SA))
    result = submission.submit(spec, dry_run=True)
    assert result["request"]["jobSpec"]["workerPoolSpecs"][1] == {}
    assert any(a.startswith("--worker-pool-spec=") for a in result["commands"][-1])
    assert result["config"] == {"baseOutputDirectory": {"outputUriPrefix": JOB_DIR},
                                "scheduling": {"strategy": "SPOT", "timeout": "45s"},
                                "serviceAccount": SA}


@pytest.mark.parametrize("given, written", [
    ("3600s", "3600s"), ("90m", "5400s"), ("2h", "7200s"), ("1h30m", "5400s"),
    ("1d", "86400s"), ("45", "45s"), ("1.5m", "90s"), (" 2H ", "7200s")])
def test_durations_are_written_in_seconds(given, written, capsys):
    assert parse_duration(given, "--timeout") == written
    request, _ = _dry_run(capsys, VERTEX + ["--timeout", given.strip()])
    assert request["jobSpec"]["scheduling"] == {"timeout": written}
    assert _parsed(request).job_spec.scheduling.timeout.seconds == int(written[:-1])


# (extra flags, what the one paragraph must name)
REFUSED = [
    (["--spot", "--flex-start", "--accelerator", "NVIDIA_L4:1"],
     ["--spot and --flex-start exclude each other", "SPOT", "FLEX_START"]),
    (["--max-wait", "1h"], ["--max-wait applies to --flex-start only"]),
    (["--flex-start"], ["--flex-start needs GPUs", "--accelerator"]),
    (["--flex-start", "--accelerator", "NVIDIA_TESLA_T4:1"],
     ["--flex-start with --accelerator NVIDIA_TESLA_T4", "L4, A100, H100, H200 or B200"]),
    (["--flex-start", "--accelerator", "NVIDIA_H100_80GB:8", "--timeout", "8d"],
     ["--timeout 691200s (8 days)", "7 days"]),
    (["--flex-start", "--accelerator", "NVIDIA_L4:1", "--workers", "1", "--ps", "1"],
     ["--flex-start cannot go with --ps", "same machine configuration"]),
    (["--flex-start", "--accelerator", "NVIDIA_L4:1", "--workers", "1",
      "--reduction-server", "1"], ["--flex-start cannot go with --reduction-server"]),
    (["--spot", "--persistent-resource-id", "my-pool"],
     ["--persistent-resource-id cannot go with --spot"]),
    (["--persistent-resource-id", "My_Pool"], ["--persistent-resource-id must be", "'My_Pool'"]),
    (["--timeout", "0"], ["--timeout must be a duration of one or more whole seconds"]),
    (["--timeout", "1w"], ["--timeout must be a duration", "'1w'"]),
    (["--timeout", "0.5s"], ["--timeout must be a duration", "whole seconds"]),
    (["--flex-start", "--accelerator", "NVIDIA_L4:1", "--max-wait=-5m"],
     ["--max-wait must be a duration of zero or more"]),
    (["--service-account", "trainer"], ["--service-account must be a service account's email"]),
    (["--network", "projects/my-project/global/networks/vpc"],
     ["--network must be", "project's number (not its id)"]),
    (["--network", "my-vpc"], ["--network must be", "projects/PROJECT_NUMBER/global/networks"]),
    (["--tensorboard", "1234", "--service-account", SA],
     ["--tensorboard must be", "projects/PROJECT/locations/REGION/tensorboards/ID"]),
    (["--tensorboard", "projects/p/locations/europe-west4/tensorboards/1",
      "--service-account", SA], ["is in europe-west4", "--region us-central1"]),
    (["--tensorboard", BOARD], ["--tensorboard needs --service-account", "roles/storage.admin",
                                "roles/aiplatform.user"]),
    (GPU_WORKERS + ["--ps", "1", "--reduction-server", "1"],
     ["--reduction-server cannot go with --ps 1", "worker pool 2"]),
    (GPU_WORKERS + ["--engine", "keras3", "--container-image", "gcr.io/p/ek:keras3",
                    "--reduction-server", "1"],
     ["--reduction-server cannot go with --engine keras3", "keras-team/keras#20585",
      "--engine estimator or --engine keras"]),
    (["--workers", "2", "--reduction-server", "1"],
     ["--reduction-server needs --accelerator", "NCCL"]),
    (["--accelerator", "NVIDIA_TESLA_T4:1", "--reduction-server", "1"],
     ["--reduction-server needs --workers"]),
    (GPU_WORKERS + ["--strategy", "none", "--reduction-server", "1"],
     ["--reduction-server cannot go with --strategy none", "multi_worker_mirrored"]),
    (["--reduction-server-machine-type", "n1-highcpu-16"],
     ["--reduction-server-machine-type applies with --reduction-server N only"]),
    (GPU_WORKERS + ["--reduction-server", "1", "--reduction-server-machine-type", "N1 big"],
     ["--reduction-server-machine-type must be a Compute Engine machine type"]),
]


@pytest.mark.parametrize("extra, needles", REFUSED,
                         ids=[" ".join(e).replace("/", "_")[:60] for e, _ in REFUSED])
def test_each_impossible_combination_is_refused_in_one_paragraph(extra, needles, capsys):
    err = _refused(capsys, VERTEX + extra)
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, (needle, err)


def test_vertex_flags_are_refused_with_other_targets(capsys):
    err = _refused(capsys, ["--target", "tfjob", "--job-dir", JOB_DIR, "--container-image",
                            "gcr.io/p/ek:1", "--spot", "--timeout", "1h"])
    assert "--spot and --timeout are Vertex AI's own" in err and "--target tfjob" in err
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["submit", "fashion_mnist_cnn", *VERTEX, "--reduction-server", "0",
                  "--dry-run"])
    assert exit_info.value.code == 2
    assert "expected a whole number of reducers > 0" in capsys.readouterr().err


def test_the_check_names_a_field_that_does_not_parse():
    good = {"displayName": "x", "jobSpec": {"workerPoolSpecs": [{}],
                                            "scheduling": {"strategy": "SPOT"}}}
    assert vertex_check.check_request(good) is True
    for bad, needle in (({"jobSpec": {"schedulingg": {}}}, 'no field named "schedulingg"'),
                        ({"jobSpec": {"scheduling": {"strategy": "SPOTS"}}},
                         "Invalid enum value SPOTS"),
                        ({"jobSpec": {"scheduling": {"timeout": "2h"}}},
                         "CustomJob.jobSpec.scheduling.timeout"),
                        ({"trialJobSpec": {"enableWebAccess": "yes"}},
                         "HyperparameterTuningJob.trialJobSpec.enableWebAccess")):
        kind = "tuning" if "trialJobSpec" in bad else "custom"
        with pytest.raises(ConfigError, match="does not parse") as info:
            vertex_check.check_request(bad, kind)
        assert needle in str(info.value), str(info.value)


def test_without_the_sdk_nothing_is_checked(monkeypatch):
    # The Quickstart's environment has no cloud extra: submit goes on unchecked.
    monkeypatch.setattr(vertex_check, "sdk_types", lambda: None)
    assert vertex_check.check_request({"jobSpec": {"schedulingg": {}}}) is False


def test_submit_checks_the_body_it_built(capsys, monkeypatch):
    real = vertex_options.job_spec_fields
    monkeypatch.setattr(vertex_options, "job_spec_fields",
                        lambda options: {**real(options), "spotInstances": True})
    err = _refused(capsys, VERTEX + ["--spot"])
    assert 'no field named "spotInstances"' in err and "aiplatform_v1.CustomJob" in err


class FakeJobServiceClient:
    """Stands in for aiplatform.gapic.JobServiceClient: records what it is sent."""

    sent = []

    def __init__(self, client_options):
        self.client_options = client_options

    def create_custom_job(self, parent, custom_job):
        self.sent.append((self.client_options, parent, custom_job))
        return types.SimpleNamespace(name=parent + "/customJobs/42")

    def create_hyperparameter_tuning_job(self, parent, hyperparameter_tuning_job):
        self.sent.append((self.client_options, parent, hyperparameter_tuning_job))
        return types.SimpleNamespace(name=parent + "/hyperparameterTuningJobs/43")


def test_the_sdk_backend_sends_the_whole_body(capsys, tmp_path):
    fake = types.SimpleNamespace(gapic=types.SimpleNamespace(
        JobServiceClient=FakeJobServiceClient, CustomJob=aiplatform_v1.CustomJob,
        HyperparameterTuningJob=aiplatform_v1.HyperparameterTuningJob))
    submitter = backends.Submitter(backend="sdk", sdk=(fake, None))
    FakeJobServiceClient.sent.clear()
    request, _ = _dry_run(capsys, VERTEX + GPU_WORKERS + EVERY_SPOT_FLAG)
    job = submitter.create_job(request, "my-project-123", "us-central1")
    assert job == {"name": "projects/my-project-123/locations/us-central1/customJobs/42",
                   "displayName": "newer-fields"}
    options, parent, message = FakeJobServiceClient.sent[-1]
    assert options == {"api_endpoint": "us-central1-aiplatform.googleapis.com"}
    assert parent == "projects/my-project-123/locations/us-central1"
    assert aiplatform_v1.CustomJob.pb(message) == _parsed(request)
    spec = message.job_spec
    assert (spec.scheduling.strategy, spec.service_account, spec.tensorboard) == (
        Strategy.SPOT, SA, BOARD)
    assert spec.worker_pool_specs[2].container_spec.image_uri == REDUCERS

    space = tmp_path / "space.yaml"
    space.write_text("dense_units: {type: integer, min: 16, max: 64}\n")
    request, _ = _dry_run(capsys, VERTEX + ["--spot", "--timeout", "1h", "--tune", str(space),
                                            "--max-trials", "2"])
    submitter.create_tuning_job(request, "my-project-123", "us-central1")
    _, _, message = FakeJobServiceClient.sent[-1]
    assert aiplatform_v1.HyperparameterTuningJob.pb(message) == _parsed(request, "tuning")
    assert message.trial_job_spec.scheduling.timeout.seconds == 3600
