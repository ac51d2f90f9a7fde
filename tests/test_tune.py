"""Hyperparameter tuning: the search space, the Vertex tuning request, the
metric report, HParams summaries, and local studies (a stand-in trainer for
the scheduling rules, then a real study of fashion_mnist_mlp)."""

import argparse
import collections
import csv
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time

import mock
import pytest
import yaml

from estimator_keras.cloud import backends, hypertune, packaging, submission, vertex
from estimator_keras.cloud.spec import JobSpec
from estimator_keras.errors import CloudError, ConfigError, Preempted, UsageError
from estimator_keras.tuning import space as space_lib
from experiments.commands import submit as submit_cmd
from experiments.commands import tune as tune_cmd
from experiments.tuning import runner as tune
from support import ROOT, child_env, cli, sample_flag_value
from tune_trainer import fake_python  # pylint: disable=unused-import

ISSUE_SPACE = """\
learning_rate: {type: double, min: 0.0001, max: 0.01, scale: log}
batch_size: {type: integer, min: 64, max: 256}
dropout: {type: discrete, values: [0.25, 0.5]}
optimizer: {type: categorical, values: [adam, rmsprop]}
"""

ISSUE_STUDY_PARAMETERS = [
    {"parameterId": "learning_rate", "doubleValueSpec": {"minValue": 0.0001, "maxValue": 0.01},
     "scaleType": "UNIT_LOG_SCALE"},
    {"parameterId": "batch_size", "integerValueSpec": {"minValue": 64, "maxValue": 256},
     "scaleType": "UNIT_LINEAR_SCALE"},
    {"parameterId": "dropout", "discreteValueSpec": {"values": [0.25, 0.5]},
     "scaleType": "UNIT_LINEAR_SCALE"},
    {"parameterId": "optimizer", "categoricalValueSpec": {"values": ["adam", "rmsprop"]}},
]


@pytest.fixture
def issue_space(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(ISSUE_SPACE)
    return str(path)


# ------------------------------------------------------------------ search space


def test_the_issues_space_file_becomes_vertex_parameters(issue_space):
    space = space_lib.load_space(issue_space)
    assert space.names == ["learning_rate", "batch_size", "dropout", "optimizer"]
    assert space.study_parameters() == ISSUE_STUDY_PARAMETERS
    study = space_lib.Study(space, metric="accuracy", algorithm="random")
    assert study.study_spec() == {"metrics": [{"metricId": "accuracy", "goal": "MAXIMIZE"}],
                                  "parameters": ISSUE_STUDY_PARAMETERS,
                                  "algorithm": "RANDOM_SEARCH"}
    assert space_lib.Study(space, metric="loss").study_spec()["metrics"] == [
        {"metricId": "loss", "goal": "MINIMIZE"}]
    assert space_lib.Study(space).study_spec()["algorithm"] == "ALGORITHM_UNSPECIFIED"


@pytest.mark.parametrize("text, needle", [
    ("lr: {type: float, min: 0.1, max: 1}", "unknown type 'float'"),
    ("lr: {type: double, min: 0.1, max: 1, step: 2}", "unknown key 'step'"),
    ("lr: {type: double, min: 0.1, max: 1, scale: exp}", "unknown scale 'exp'"),
    ("lr: {type: double, min: 0.0, max: 1, scale: log}", "log scale needs min > 0"),
    ("lr: {type: double, min: 1, max: 0.1}", "must be below max"),
    ("lr: {type: double, max: 1}", "needs min"),
    ("units: {type: integer, min: 1.5, max: 9}", "whole number"),
    ("units: {type: discrete, values: []}", "non-empty list"),
    ("units: {type: discrete, values: [a, b]}", "must be numbers"),
    ("opt: {type: categorical, values: [adam, adam]}", "repeat"),
    ("opt: {type: categorical, values: [adam], scale: log}", "unknown key 'scale'"),
    ("opt: adam", "must map to"),
    ("[1, 2]", "must map hyperparameter names"),
    ("lr: {type: double, min: 0.1, max: 1", "not valid YAML"),
])
def test_space_errors_name_the_file_parameter_and_key(tmp_path, text, needle):
    path = tmp_path / "space.yaml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError, match=needle) as info:
        space_lib.load_space(str(path))
    assert str(path) in str(info.value)


def test_trial_values_are_deterministic_per_seed_and_inside_the_ranges(issue_space):
    space = space_lib.load_space(issue_space)
    first = [space.trial_values(n, seed=3) for n in range(1, 41)]
    assert first == [space.trial_values(n, seed=3) for n in range(1, 41)]
    assert first != [space.trial_values(n, seed=4) for n in range(1, 41)]
    # trial 7 does not depend on the trials before it (resuming draws the same)
    assert space.trial_values(7, seed=3) == first[6]
    for values in first:
        assert 0.0001 <= values["learning_rate"] <= 0.01
        assert isinstance(values["batch_size"], int) and 64 <= values["batch_size"] <= 256
        assert values["dropout"] in (0.25, 0.5) and values["optimizer"] in ("adam", "rmsprop")
    # a log scale spreads the draws over the decades
    rates = [v["learning_rate"] for v in first]
    assert sum(r < 0.001 for r in rates) >= 10 and sum(r >= 0.001 for r in rates) >= 10


def test_grid_walks_every_combination_and_refuses_doubles(tmp_path, issue_space):
    path = tmp_path / "grid.yaml"
    path.write_text("units: {type: integer, min: 1, max: 3}\n"
                    "optimizer: {type: categorical, values: [adam, sgd]}\n")
    space = space_lib.load_space(str(path))
    assert space.grid_size() == 6
    assert [space.trial_values(n, algorithm="grid") for n in range(1, 7)] == [
        {"units": u, "optimizer": o} for u in (1, 2, 3) for o in ("adam", "sgd")]
    with pytest.raises(ConfigError, match="no trial 7"):
        space.trial_values(7, algorithm="grid")
    with pytest.raises(ConfigError, match="learning_rate is double"):
        space_lib.Study(space_lib.load_space(issue_space), algorithm="grid").validate()


# ------------------------------------------------------------ Vertex tuning job


PACKAGE = "gs://my-bucket/tune/packages/estimator_keras-0.2.0.tar.gz"


def _spec(**overrides):
    fields = dict(experiment="fashion_mnist_mlp", project="my-project-123",
                  region="us-central1", job_dir="gs://my-bucket/tune", display_name="tune-1",
                  workers=1, accelerator="NVIDIA_TESLA_T4:1", package_uri=PACKAGE,
                  train_args=["--max-steps", "500"])
    fields.update(overrides)
    return JobSpec(**fields)


def test_tuning_request_holds_the_study_and_the_custom_jobs_pools(issue_space):
    spec = _spec()
    study = space_lib.Study(space_lib.load_space(issue_space), metric="accuracy", goal="max",
                            algorithm="random", max_trials=12,
                            parallel_trials=3)
    body = vertex.build_tuning_job(spec, study)
    assert body["displayName"] == "tune-1"
    assert body["maxTrialCount"] == 12 and body["parallelTrialCount"] == 3
    assert body["studySpec"] == {"metrics": [{"metricId": "accuracy", "goal": "MAXIMIZE"}],
                                 "parameters": ISSUE_STUDY_PARAMETERS,
                                 "algorithm": "RANDOM_SEARCH"}
    trial_job = body["trialJobSpec"]
    custom = vertex.build_custom_job(spec)["jobSpec"]
    assert trial_job["baseOutputDirectory"] == custom["baseOutputDirectory"] == {
        "outputUriPrefix": "gs://my-bucket/tune"}
    assert len(trial_job["workerPoolSpecs"]) == len(custom["workerPoolSpecs"]) == 2
    for trial_pool, pool in zip(trial_job["workerPoolSpecs"], custom["workerPoolSpecs"]):
        args = trial_pool["pythonPackageSpec"].pop("args")
        plain = pool["pythonPackageSpec"].pop("args")
        assert trial_pool == pool  # machines, images, package: the same pools
        assert args == plain + ["--tuning-trial", "--hypertune-metric", "accuracy"]
        assert "--model-dir" not in args
    json.dumps(body)


def parse_submit(argv):
    parser = argparse.ArgumentParser(prog="experiments")
    submit_cmd.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["submit"] + argv)


TUNE_ARGV = ["fashion_mnist_mlp", "--project", "my-project-123", "--region", "us-central1",
             "--job-dir", "gs://my-bucket/tune", "--display-name", "tune-1",
             "--max-steps", "500", "--max-trials", "8", "--parallel-trials", "2",
             "--algorithm", "random", "--dry-run"]


def test_submit_tune_dry_run_prints_the_request_and_calls_nothing(capsys, tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("learning_rate: {type: double, min: 0.0001, max: 0.01, scale: log}\n"
                     "units: {type: discrete, values: [64, 128, 256]}\n")
    with mock.patch("subprocess.run") as run, mock.patch("subprocess.Popen") as popen, \
            mock.patch.object(backends.Submitter, "create_tuning_job") as create, \
            mock.patch.object(backends.Submitter, "upload") as upload:
        # the real registry: the space's keys are checked against the experiment
        assert submit_cmd.run(parse_submit(TUNE_ARGV + ["--tune", str(space)])) == 0
    for m in (run, popen, create, upload):
        m.assert_not_called()
    out = capsys.readouterr().out
    request_text, _, rest = out.partition("\n\n")
    request = json.loads(request_text)
    assert request["maxTrialCount"] == 8 and request["parallelTrialCount"] == 2
    assert [p["parameterId"] for p in request["studySpec"]["parameters"]] == [
        "learning_rate", "units"]
    assert request["studySpec"]["parameters"][1]["discreteValueSpec"] == {
        "values": [64.0, 128.0, 256.0]}
    (pool,) = request["trialJobSpec"]["workerPoolSpecs"]
    assert pool["pythonPackageSpec"]["args"][-3:] == ["--tuning-trial", "--hypertune-metric",
                                                     "accuracy"]
    commands = [line for line in rest.splitlines() if line and not line.startswith("#")]
    assert commands[-1].split()[:4] == ["gcloud", "ai", "hp-tuning-jobs", "create"]


def test_submit_tune_refuses_unknown_hyperparameters_and_loose_flags(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("learning_rate: {type: double, min: 0.0001, max: 0.01}\n"
                     "filters: {type: integer, min: 8, max: 64}\n")
    with pytest.raises(ConfigError, match="parameter 'filters'.*unknown hparam 'filters'"):
        submit_cmd.run(parse_submit(TUNE_ARGV + ["--tune", str(space)]))
    base = TUNE_ARGV[:TUNE_ARGV.index("--max-trials")]
    with pytest.raises(UsageError, match="--tune needs --max-trials"):
        submit_cmd.run(parse_submit(base + ["--tune", str(space), "--dry-run"]),
                       known_experiments=lambda name: object())
    with pytest.raises(UsageError, match="only apply with --tune FILE"):
        submit_cmd.run(parse_submit(base + ["--max-trials", "3", "--dry-run"]),
                       known_experiments=lambda name: object())


def test_submit_tune_packages_uploads_then_creates_the_tuning_job(tmp_path, issue_space):
    submitter = mock.Mock(spec=backends.Submitter)
    submitter.upload.side_effect = lambda local, uri: uri
    submitter.create_tuning_job.return_value = {"name": "projects/1/hyperparameterTuningJobs/5"}
    study = space_lib.Study(space_lib.load_space(issue_space), max_trials=4)
    with mock.patch.object(packaging, "build_sdist",
                           return_value=str(tmp_path / "estimator_keras-0.2.0.tar.gz")):
        result = submission.submit(_spec(package_uri=None), submitter=submitter,
                                   project_root=str(tmp_path), study=study)
    submitter.create_job.assert_not_called()
    request, project, region = submitter.create_tuning_job.call_args[0]
    assert (project, region) == ("my-project-123", "us-central1")
    assert request["trialJobSpec"]["workerPoolSpecs"][0]["pythonPackageSpec"][
        "packageUris"] == [PACKAGE]
    assert result["job"]["name"].endswith("/5")


def test_gcloud_and_sdk_create_the_tuning_job(issue_space):
    study = space_lib.Study(space_lib.load_space(issue_space), max_trials=4)
    request = vertex.build_tuning_job(_spec(), study)
    seen = {}

    def fake_run(argv, **kwargs):
        config = [a for a in argv if a.startswith("--config=")][0].split("=", 1)[1]
        with open(config, encoding="utf-8") as f:
            seen["config"] = json.load(f)
        seen["argv"] = argv
        return subprocess.CompletedProcess(argv, 0, stdout='{"name": "hp/1"}', stderr="")

    with mock.patch("shutil.which", return_value="/usr/bin/gcloud"), \
            mock.patch("subprocess.run", side_effect=fake_run):
        job = backends.Submitter().create_tuning_job(request, "my-project-123", "us-central1")
    assert seen["argv"][:4] == ["gcloud", "ai", "hp-tuning-jobs", "create"]
    assert "--display-name=tune-1" in seen["argv"] and "--region=us-central1" in seen["argv"]
    assert seen["config"] == request and job == {"name": "hp/1"}

    gapic = mock.Mock()
    gapic.JobServiceClient.return_value.create_hyperparameter_tuning_job.return_value.name = \
        "projects/1/locations/us-central1/hyperparameterTuningJobs/9"
    aiplatform = mock.Mock(gapic=gapic)
    with mock.patch("shutil.which", return_value=None), \
            mock.patch.object(backends.Submitter, "_import_sdk",
                              staticmethod(lambda: (aiplatform, mock.Mock()))):
        job = backends.Submitter().create_tuning_job(request, "my-project-123", "us-central1")
    assert gapic.JobServiceClient.call_args[1] == {
        "client_options": {"api_endpoint": "us-central1-aiplatform.googleapis.com"}}
    kwargs = gapic.JobServiceClient.return_value.create_hyperparameter_tuning_job.call_args[1]
    assert kwargs["parent"] == "projects/my-project-123/locations/us-central1"
    # The whole body, as the REST API takes it, becomes the API's message.
    message = gapic.HyperparameterTuningJob.from_json.return_value
    assert kwargs["hyperparameter_tuning_job"] is message
    (payload,), _ = gapic.HyperparameterTuningJob.from_json.call_args
    sent = json.loads(payload)
    assert sent == request and sent["maxTrialCount"] == 4
    assert sent["studySpec"]["parameters"][0]["doubleValueSpec"] == {
        "minValue": 0.0001, "maxValue": 0.01}
    assert job["name"].endswith("/9")

    # gcloud rejects an empty pool in --config and has no pool flags for tuning jobs
    gappy = vertex.build_tuning_job(_spec(workers=0, ps=1), study)
    with pytest.raises(CloudError, match="unused worker pool"):
        backends.gcloud_tuning_command(gappy, "my-project-123", "us-central1", "c.json")


# ------------------------------------------------------------------ metric report


@pytest.fixture
def fresh_hypertune(monkeypatch, tmp_path):
    monkeypatch.setattr(hypertune, "_entries", collections.deque(maxlen=hypertune.MAX_ENTRIES))
    monkeypatch.setattr(hypertune, "_reporter", None)
    path = tmp_path / "hypertune" / "output.metrics"
    monkeypatch.setenv("CLOUD_ML_HP_METRIC_FILE", str(path))
    monkeypatch.setenv("CLOUD_ML_TRIAL_ID", "7")
    return path


def test_report_writes_the_documented_metric_file_without_the_package(fresh_hypertune):
    with mock.patch.dict(sys.modules, {"hypertune": None}), \
            mock.patch("time.time", return_value=1525851440.123456):
        assert hypertune.report("accuracy", 0.8125, step=200) == str(fresh_hypertune)
        hypertune.report("accuracy", 0.85, step=None)
    assert fresh_hypertune.read_text() == (
        '{"accuracy": "0.8125", "checkpoint_path": "", "global_step": "200", '
        '"timestamp": 1525851440.123456, "trial": "7"}\n'
        '{"accuracy": "0.85", "checkpoint_path": "", "global_step": "0", '
        '"timestamp": 1525851440.123456, "trial": "7"}\n')
    with mock.patch.dict(sys.modules, {"hypertune": None}):
        for i in range(150):
            hypertune.report("loss", i, step=i)
    lines = fresh_hypertune.read_text().splitlines()
    assert len(lines) == 100 and json.loads(lines[-1])["loss"] == "149.0"
    assert [n for n in os.listdir(fresh_hypertune.parent)] == ["output.metrics"]


def test_report_uses_cloudml_hypertune_when_installed(fresh_hypertune):
    package = mock.Mock()
    package.HyperTune.return_value.metric_path = "/tmp/hypertune/output.metrics"
    with mock.patch.dict(sys.modules, {"hypertune": package}):
        assert hypertune.report("accuracy", 0.9, step=300) == "/tmp/hypertune/output.metrics"
        hypertune.report("accuracy", 0.95, step=400)
    package.HyperTune.assert_called_once_with()
    reporter = package.HyperTune.return_value
    assert reporter.report_hyperparameter_tuning_metric.call_args_list == [
        mock.call(hyperparameter_metric_tag="accuracy", metric_value=0.9, global_step=300),
        mock.call(hyperparameter_metric_tag="accuracy", metric_value=0.95, global_step=400)]
    assert not fresh_hypertune.exists()


# -------------------------------------------------------------- HParams summaries


def test_hparams_summaries_read_back(tmp_path):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from tensorboard.plugins.hparams import metadata  # pylint: disable=import-outside-toplevel
    from estimator_keras import summaries  # pylint: disable=import-outside-toplevel

    hparams = {"learning_rate": 0.003, "units": 128, "optimizer": "adam", "cache": False}
    with tf.Graph().as_default():  # as from inside an Estimator's graph
        path = summaries.write_hparams(str(tmp_path / "trial-1"), hparams,
                                       {"accuracy": 0.84, "loss": 0.45, "global_step": 2000},
                                       step=2000)
    assert os.path.dirname(path) == str(tmp_path / "trial-1")
    found, scalars = None, {}
    for event in tf.compat.v1.train.summary_iterator(path):
        for value in event.summary.value:
            if value.tag == metadata.SESSION_START_INFO_TAG:
                found = metadata.parse_session_start_info_plugin_data(
                    value.metadata.plugin_data.content)
            elif value.HasField("tensor"):
                scalars[value.tag] = (event.step, float(tf.make_ndarray(value.tensor)))
    assert {k: v.WhichOneof("kind") for k, v in found.hparams.items()} == {
        "learning_rate": "number_value", "units": "number_value",
        "optimizer": "string_value", "cache": "bool_value"}
    assert found.hparams["learning_rate"].number_value == pytest.approx(0.003)
    assert found.hparams["optimizer"].string_value == "adam"
    assert found.hparams["cache"].bool_value is False
    assert scalars == {"accuracy": (2000, pytest.approx(0.84)),
                       "loss": (2000, pytest.approx(0.45))}


# ------------------------------------------------------- local study: the rules


def _study_config(tmp_path, python, space_text, algorithm="grid", trials=None, parallel=2,
                  folder="study", **kwargs):
    path = tmp_path / "space.yaml"
    path.write_text(space_text)
    space = space_lib.load_space(str(path))
    study = space_lib.Study(space, metric="accuracy", goal="max",
                            max_trials=trials or space.grid_size(), parallel_trials=parallel)
    kwargs.setdefault("grace_s", 2.0)
    kwargs.setdefault("seed", 0)
    kwargs.setdefault("plots", False)
    return tune.StudyConfig("fake", study, str(tmp_path / folder), python=python,
                            train_args=["--max-steps", "7"], algorithm=algorithm, **kwargs)


def _calls(config, trial):
    path = os.path.join(tune.trial_dir(config.model_dir, trial), "calls.txt")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [int(line) for line in f.read().split()]


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _by_values(trials, *names):
    return {tuple(t.hparams[n] for n in names): t for t in trials}


def test_study_records_failures_picks_the_best_and_resumes(tmp_path, fake_python):
    config = _study_config(tmp_path, fake_python,
                           "x: {type: discrete, values: [0.1, 0.9, 0.5]}\n"
                           "mode: {type: categorical, values: [ok, fail]}\n")
    result = tune.run_study(config)
    assert sorted(t.trial for t in result.trials) == list(range(6))
    by = _by_values(result.trials, "x", "mode")
    assert len(by) == 6  # the grid: each combination once
    for x in (0.1, 0.9, 0.5):
        assert by[(x, "ok")].status == "succeeded" and by[(x, "ok")].metric == x
        assert by[(x, "fail")].status == "failed"
        assert "failed on purpose" in by[(x, "fail")].message
        assert "exit 1" in by[(x, "fail")].message
    best = by[(0.9, "ok")]
    assert result.best is not None and result.best.trial == best.trial
    assert result.best.export_dir == os.path.join(config.model_dir, "trial-%d" % best.trial,
                                                  "export")
    assert result.best.steps == 7
    # The best export is copied whole, with the trial it came from.
    with open(os.path.join(config.model_dir, "best", "trial.json"), encoding="utf-8") as f:
        assert json.load(f)["trial"] == best.trial
    assert os.path.exists(os.path.join(config.model_dir, "best", "export.json"))

    with open(os.path.join(config.model_dir, "trials.csv"), encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [r["trial"] for r in rows] == [str(n) for n in range(6)]
    assert {(r["x"], r["mode"]): r["accuracy"] for r in rows} == {
        ("0.1", "ok"): "0.1", ("0.9", "ok"): "0.9", ("0.5", "ok"): "0.5",
        ("0.1", "fail"): "", ("0.9", "fail"): "", ("0.5", "fail"): ""}
    assert all(float(r["wall_time_s"]) >= 0 for r in rows)
    with open(os.path.join(config.model_dir, "trials.json"), encoding="utf-8") as f:
        table = json.load(f)
    assert table["best"] == best.trial and table["study"]["space"]["mode"]["values"] == [
        "ok", "fail"]
    assert sorted(t["status"] for t in table["trials"]) == ["failed"] * 3 + ["succeeded"] * 3
    assert not [n for n in os.listdir(config.model_dir) if ".tmp-" in n]

    # Resumed: nothing finished runs again; --retry-failed runs each failure
    # again as a new trial of the same values, in its place.
    again = tune.run_study(config)
    assert len(again.trials) == 6 and all(len(_calls(config, n)) == 1 for n in range(6))
    retried = tune.run_study(dataclasses_replace(config, retry_failed=True))
    assert all(len(_calls(config, n)) == 1 for n in range(9))
    news = [t for t in retried.trials if t.trial >= 6]
    assert sorted(t.hparams["mode"] for t in news) == ["fail"] * 3
    assert all("retry of trial" in t.message for t in news)
    assert {t.hparams["x"] for t in news} == {0.1, 0.9, 0.5}

    with pytest.raises(ConfigError, match="made by another command.*train_args"):
        tune.run_study(dataclasses_replace(config, train_args=["--max-steps", "8"]))


def dataclasses_replace(config, **changes):
    import dataclasses  # pylint: disable=import-outside-toplevel
    return dataclasses.replace(config, **changes)


def test_trials_past_their_timeout_are_ended_by_pid(tmp_path, fake_python):
    config = _study_config(tmp_path, fake_python,
                           "mode: {type: categorical, values: [hang, stubborn, ok, nometric]}\n"
                           "x: {type: discrete, values: [0.3]}\n",
                           parallel=4, trial_timeout_s=2.0, grace_s=1.0)
    started = time.monotonic()
    result = tune.run_study(config)
    assert time.monotonic() - started < 20
    status = {t.hparams["mode"]: t for t in result.trials}
    assert status["hang"].status == "timeout" and "--trial-timeout" in status["hang"].message
    assert status["stubborn"].status == "timeout"  # ignored SIGTERM: SIGKILL after the grace
    assert status["ok"].status == "succeeded" and result.best.trial == status["ok"].trial
    assert status["nometric"].status == "failed"
    assert "no metric 'accuracy'; its metrics: global_step, loss" in status["nometric"].message
    for trial in result.trials:
        assert not any(_pid_alive(pid) for pid in _calls(config, trial.trial))


def test_a_stopped_study_ends_its_trials_and_resumes_the_rest(tmp_path, fake_python,
                                                              monkeypatch):
    hold = tmp_path / "hold"
    hold.write_text("")
    monkeypatch.setenv("FAKE_HOLD", str(hold))
    config = _study_config(tmp_path, fake_python,
                           "x: {type: discrete, values: [0.2, 0.4, 0.6, 0.8]}\n", parallel=4)
    table = os.path.join(config.model_dir, "trials.json")

    def statuses():
        try:
            with open(table, encoding="utf-8") as f:
                return {r["hparams"]["x"]: r["status"] for r in json.load(f)["trials"]}
        except (OSError, ValueError):
            return {}

    def stop_when_two_hold():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if statuses() == {0.2: "succeeded", 0.4: "succeeded", 0.6: "running",
                              0.8: "running"}:
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=stop_when_two_hold)
    watcher.start()
    with pytest.raises(Preempted, match="Run the same command again"):
        tune.run_study(config)
    watcher.join()
    assert statuses() == {0.2: "succeeded", 0.4: "succeeded", 0.6: "interrupted",
                          0.8: "interrupted"}
    with open(table, encoding="utf-8") as f:
        number = {r["hparams"]["x"]: r["trial"] for r in json.load(f)["trials"]}
    held = _calls(config, number[0.6]) + _calls(config, number[0.8])
    assert len(held) == 2 and not any(_pid_alive(pid) for pid in held)
    assert signal.getsignal(signal.SIGTERM) is not None  # handlers put back

    hold.unlink()
    result = tune.run_study(config)
    assert sorted(t.trial for t in result.trials) == [0, 1, 2, 3]  # the same trials, resumed
    assert [t.status for t in result.trials] == ["succeeded"] * 4
    assert {x: len(_calls(config, n)) for x, n in number.items()} == {
        0.2: 1, 0.4: 1, 0.6: 2, 0.8: 2}
    assert result.best.hparams["x"] == 0.8


def test_pruned_trials_stop_at_an_evaluation_and_say_where(tmp_path, fake_python,
                                                           monkeypatch):
    # Each stand-in trial reports accuracy x * step / 7 at steps 1..7; the
    # median pruner judges from the fifth trial on (four finished first).
    monkeypatch.setenv("FAKE_EVALS", "7")
    monkeypatch.setenv("FAKE_EVAL_PAUSE", "0.4")
    values = [0.9, 0.8, 0.85, 0.95, 0.1, 0.2, 0.15, 0.05]
    config = _study_config(tmp_path, fake_python,
                           "x: {type: discrete, values: [%s]}\n" % ", ".join(map(str, values)),
                           parallel=1, pruner="median", first_eval_step=1, max_steps=7,
                           plots=True)
    # The trials run in this order: the grid's, pinned by enqueueing.
    study, _ = tune.open_study(config)
    for x in values:
        study.enqueue_trial({"x": x})
    result = tune.run_study(config)
    by = {t.hparams["x"]: t for t in result.trials}
    for x in values[:4]:
        assert by[x].status == "succeeded" and by[x].metric == x
    for x in values[4:]:
        assert by[x].status == "pruned", by[x]
        assert 1 <= by[x].pruned_at < 7 and by[x].message == "pruned at step %d" % by[x].pruned_at
        assert by[x].metric == pytest.approx(x * by[x].pruned_at / 7.0)
        # SIGTERM'd when the pruner said so: no export, its folder kept.
        assert not os.path.exists(os.path.join(by[x].model_dir, "export"))
        assert os.path.exists(os.path.join(by[x].model_dir, "evaluations.jsonl"))
    assert result.best.hparams["x"] == 0.95
    for name in ("optimization_history", "param_importances", "intermediate_values"):
        assert os.path.getsize(os.path.join(config.model_dir, name + ".png")) > 5000


WORKER = """\
import json, sys
sys.path.insert(0, %(root)r)
from estimator_keras.errors import Preempted
from estimator_keras.tuning import space as space_lib
from experiments.tuning import runner as tune
space = space_lib.load_space(%(space)r)
study = space_lib.Study(space, metric="accuracy", goal="max", max_trials=%(trials)d,
                        parallel_trials=%(parallel)d)
config = tune.StudyConfig("fake", study, sys.argv[1], python=%(python)r,
                          train_args=["--max-steps", "7"], algorithm="random",
                          storage=%(storage)r, heartbeat_s=1, grace_s=2.0, plots=False)
try:
    result = tune.run_study(config)
except Preempted:
    sys.exit(75)
print(json.dumps([[t.trial, t.status] for t in result.trials]))
"""


def _workers(tmp_path, fake_python, storage, trials, parallel=2):
    space = tmp_path / "space.yaml"
    space.write_text("x: {type: double, min: 0.0, max: 1.0}\n")
    script = tmp_path / "worker.py"
    script.write_text(WORKER % {"root": ROOT, "space": str(space), "trials": trials,
                                "parallel": parallel, "python": fake_python,
                                "storage": storage})
    return script


def _ran(folder):
    """{trial number: PIDs of its stand-in trainer} of one worker's folder."""
    out = {}
    for name in os.listdir(folder) if os.path.isdir(folder) else ():
        calls = os.path.join(folder, name, "calls.txt")
        if name.startswith("trial-") and os.path.exists(calls):
            with open(calls, encoding="utf-8") as f:
                out[int(name[len("trial-"):])] = f.read().split()
    return out


def test_a_trial_beats_from_its_start_so_a_worker_dead_before_its_first_poll_is_found(
        tmp_path, fake_python, monkeypatch):
    """A worker killed between starting a trial and its first poll: Optuna
    finds stale only trials with a heartbeat on record, so without one from
    the start the trial stays RUNNING and the other workers wait for it for
    ever. Started and never polled, the trial is stale past the grace."""
    import optuna  # pylint: disable=import-outside-toplevel
    monkeypatch.setenv("FAKE_EVALS", "100")
    space = tmp_path / "space.yaml"
    space.write_text("x: {type: double, min: 0.0, max: 1.0}\n")
    study = space_lib.Study(space_lib.load_space(str(space)), metric="accuracy", goal="max",
                            max_trials=1, parallel_trials=1)
    config = tune.StudyConfig("fake", study, str(tmp_path / "a"), python=fake_python,
                              train_args=["--max-steps", "7"], algorithm="random",
                              storage="sqlite:///%s" % (tmp_path / "shared.db"),
                              heartbeat_s=1, grace_s=2.0, plots=False)
    optuna_study, storage = tune.open_study(config)
    runner = tune._Runner(config, optuna_study, storage)  # pylint: disable=protected-access
    trial = runner._next()  # pylint: disable=protected-access
    runner.start(trial)
    try:
        # Past the grace (twice the heartbeat) with no poll: sqlite's clock has whole
        # seconds, so a beat at 0.0 s still reads 2 s old at 2.9 s, and not stale.
        time.sleep(3.5)
        optuna.storages.fail_stale_trials(optuna_study)
        assert optuna_study.trials[trial.number].state.name == "FAIL"
    finally:
        for run in runner.running.values():
            os.killpg(run.proc.pid, signal.SIGKILL)
            run.proc.wait(timeout=30)


def test_two_tune_commands_share_one_sqlite_study(tmp_path, fake_python, monkeypatch):
    monkeypatch.setenv("FAKE_EVALS", "3")
    monkeypatch.setenv("FAKE_EVAL_PAUSE", "0.2")
    storage = "sqlite:///%s" % (tmp_path / "shared.db")
    script = _workers(tmp_path, fake_python, storage, trials=12)
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / w)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=child_env(),
                              start_new_session=True)
             for w in ("a", "b")]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], [o[1][-4000:] for o in outs]
    ran_a, ran_b = _ran(tmp_path / "a"), _ran(tmp_path / "b")
    # 12 trials in all, each run once, by one worker or the other; both worked.
    assert sorted(list(ran_a) + list(ran_b)) == list(range(12))
    assert ran_a and ran_b and all(len(p) == 1 for p in {**ran_a, **ran_b}.values())
    for out, _ in outs:  # each worker's table is the whole study
        assert json.loads(out.splitlines()[-1]) == [[n, "succeeded"] for n in range(12)]


def test_tune_command_checks_the_space_against_the_experiment(tmp_path):
    parser = argparse.ArgumentParser(prog="experiments")
    tune_cmd.add_parser(parser.add_subparsers(dest="command"))
    space = tmp_path / "space.yaml"

    def config_for(text, *extra):
        space.write_text(text)
        args = parser.parse_args(["tune", "fashion_mnist_mlp", "--space", str(space),
                                  "--model-dir", str(tmp_path / "study"),
                                  "--data-dir", str(tmp_path / "data"), *extra])
        return tune_cmd.build_config(args)

    config = config_for("learning_rate: {type: double, min: 0.0003, max: 0.3, scale: log}\n",
                        "--parallel", "2", "--max-steps", "30", "--hparams", "units=64")
    assert config.study.max_trials == space_lib.DEFAULT_RANDOM_TRIALS
    assert config.study.metric == "accuracy" and config.study.resolved_goal == "max"
    assert config.train_args == ["--data-dir", str(tmp_path / "data"), "--max-steps", "30"]
    assert config.prepare_command[-4:] == ["prepare", "fashion_mnist", "--data-dir",
                                           str(tmp_path / "data")]
    command = tune._trial_command(  # pylint: disable=protected-access
        config, 0, {"learning_rate": 0.001})
    hparams = command[command.index("--hparams") + 1]
    assert hparams.startswith("units=64,learning_rate=")
    assert command[command.index("--model-dir") + 1] == os.path.join(
        str(tmp_path / "study"), "trial-0")
    assert command[command.index("--evaluations-file") + 1] == os.path.join(
        str(tmp_path / "study"), "trial-0", "evaluations.jsonl")

    with pytest.raises(ConfigError, match="parameter 'depth'.*unknown hparam 'depth'"):
        config_for("depth: {type: integer, min: 1, max: 4}\n")
    with pytest.raises(ConfigError, match="parameter 'units'.*expected int"):
        config_for("units: {type: double, min: 0.5, max: 4.5}\n")
    with pytest.raises(ConfigError, match="both in --hparams and in the search space"):
        tune.run_study(config_for("units: {type: integer, min: 1, max: 4}\n",
                                  "--hparams", "units=3"))


# ------------------------------------------------------ train's flags reach trials


def _subcommand_parser(parser, command):
    # argparse offers no public listing of a parser's subcommands or actions.
    for action in parser._actions:  # pylint: disable=protected-access
        if isinstance(action.choices, dict) and command in action.choices:
            return action.choices[command]
    raise AssertionError("no subcommand %r" % command)


def _dispatched(argv):
    """The arguments ``python -m experiments ARGV`` hands its command (train
    or tune), after the CLI's own processing, without running it."""
    from experiments import cli  # pylint: disable=import-outside-toplevel
    seen = []

    def keep(args):
        seen.append(args)
        return 0

    with mock.patch.dict(cli.COMMANDS, {"train": keep}), \
            mock.patch.object(tune_cmd, "run", keep):
        assert cli.main(list(map(str, argv))) == 0
    return seen[0]


def _sample_values(tmp_path, tiny_dataset):
    """A value for each of train's flags that is not its default and that tune
    can check (files that exist, numbers in range); others get a generic one."""
    config = tmp_path / "config.yaml"
    config.write_text("model:\n  units: 16\n")
    plugin = tmp_path / "nothing_registered.py"
    plugin.write_text("# a plugin that registers nothing\n")
    dataset, _ = tiny_dataset(n=8, num_shards=1)
    return {"--config": str(config), "--module": str(plugin), "--dataset": dataset,
            "--data-dir": str(tmp_path / "data"), "--hypertune-metric": "accuracy",
            "--model-dir": str(tmp_path / "model"), "--hparams": "units=64",
            # Runs on TensorFlow 2.15 and with tf-keras alike (keras3 does not).
            "--engine": "keras", "--track": f"sqlite:///{tmp_path}/mlflow.db",
            "--register": "fashion"}


def test_every_train_flag_is_accepted_by_tune_and_reaches_each_trial(tmp_path, tiny_dataset):
    from experiments import cli  # pylint: disable=import-outside-toplevel
    train_parser = _subcommand_parser(cli.build_parser(), "train")
    known = _sample_values(tmp_path, tiny_dataset)
    space = tmp_path / "space.yaml"
    space.write_text("learning_rate: {type: double, min: 0.001, max: 0.1, scale: log}\n")
    study = tmp_path / "study"
    baseline = _dispatched(["train", "fashion_mnist_mlp"])
    checked = []
    for action in train_parser._actions:  # pylint: disable=protected-access
        if not action.option_strings or "--help" in action.option_strings:
            continue
        flag, value = sample_flag_value(action, known)
        if flag == "--register":  # registers what --track records
            value += ["--track", known["--track"]]
        given = _dispatched(["train", "fashion_mnist_mlp", flag, *value])
        dest = "modules" if flag == "--module" else action.dest
        assert getattr(given, dest) != getattr(baseline, dest), (flag, "sample is the default")

        per_trial = flag in ("--model-dir", "--evaluations-file")
        tuned = _dispatched(["tune", "fashion_mnist_mlp", "--space", space, "--model-dir",
                             study] + ([] if per_trial else [flag, *value]))
        config = tune_cmd.build_config(tuned)
        for number in (0, 1):
            command = tune._trial_command(  # pylint: disable=protected-access
                config, number, {"learning_rate": 0.001})
            assert command[1:4] == ["-m", "experiments", "train"], command
            received = _dispatched(command[3:])
            if flag == "--model-dir":  # tune's is the study's, each trial has its own
                assert received.model_dir == os.path.join(str(study), "trial-%d" % number)
            elif flag == "--evaluations-file":  # each trial's, where tune reads it
                assert received.evaluations_file == os.path.join(
                    str(study), "trial-%d" % number, "evaluations.jsonl")
            elif flag == "--hparams":  # fixed for every trial, then the space's values
                assert received.hparams.startswith(value[0] + ",learning_rate=")
            elif flag == "--register":  # the study registers its best trial's export
                assert received.register is None and config.register == value[0]
                assert received.track == known["--track"]
            else:
                assert getattr(received, dest) == getattr(given, dest), (flag, command)
        checked.append(flag)
    # The flags this test was written with are among those it found.
    assert {"--config", "--dataset", "--strategy", "--engine", "--skip-corrupt", "--module",
            "--preemption-grace", "--verbose"} <= set(checked), checked


def test_tune_refuses_a_space_key_that_a_train_flag_sets(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("batch_size: {type: integer, min: 16, max: 64}\n")
    args = _dispatched(["tune", "fashion_mnist_mlp", "--space", space, "--model-dir",
                        tmp_path / "study", "--batch-size", 32])
    with pytest.raises(ConfigError, match="batch_size set both by --batch-size and by the "
                                          "search space"):
        tune_cmd.build_config(args)
    args = _dispatched(["tune", "fashion_mnist_mlp", "--space", space, "--model-dir",
                        tmp_path / "study", "--max-steps", 0])
    with pytest.raises(ConfigError, match="max_steps must be a positive integer"):
        tune_cmd.build_config(args)


# --------------------------------------------------------- local study: for real


def _tune_command(*args):
    """``python -m experiments tune ...`` once the CLI has the command, else
    the same through tune_cmd directly (with the CLI's exit codes)."""
    from experiments import cli  # pylint: disable=import-outside-toplevel
    try:
        cli.build_parser().parse_args(["tune", "x", "--space", "s", "--model-dir", "d"])
        return [sys.executable, "-m", "experiments", "tune", *map(str, args)]
    except SystemExit:
        pass
    driver = ("import argparse, sys\n"
              "from estimator_keras.errors import EstimatorKerasError, Preempted\n"
              "from experiments.commands import tune as tune_cmd\n"
              "p = argparse.ArgumentParser(prog='experiments')\n"
              "tune_cmd.add_parser(p.add_subparsers(dest='command'))\n"
              "try:\n"
              "    sys.exit(tune_cmd.run(p.parse_args(['tune'] + sys.argv[1:])))\n"
              "except EstimatorKerasError as e:\n"
              "    sys.stderr.write('error: %s\\n' % e)\n"
              "    sys.exit(75 if isinstance(e, Preempted) else 1)\n")
    return [sys.executable, "-c", driver, *map(str, args)]


def _processes_mentioning(text):
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                if text.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


@pytest.mark.slow
def test_real_study_of_the_mlp_on_fashion_mnist_is_interrupted_and_resumed(
        fashion_data, tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("learning_rate: {type: double, min: 0.0003, max: 0.3, scale: log}\n")
    study_dir = tmp_path / "study"
    command = _tune_command("fashion_mnist_mlp", "--space", space, "--trials", 4,
                            "--parallel", 2, "--seed", 1, "--model-dir", study_dir,
                            "--data-dir", fashion_data, "--max-steps", 30, "--eval-every", 30,
                            "--batch-size", 32)
    log = open(tmp_path / "first.log", "w")  # pylint: disable=consider-using-with
    proc = subprocess.Popen(command, cwd=ROOT, env=child_env(), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        table = study_dir / "trials.json"
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            rows = json.loads(table.read_text())["trials"] if table.exists() else []
            if any(r["status"] == "succeeded" for r in rows):
                break
            time.sleep(0.5)
        assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        os.kill(proc.pid, signal.SIGTERM)  # the study, by its PID
        assert proc.wait(timeout=120) == 75, (tmp_path / "first.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    first = {r["trial"]: r for r in json.loads((study_dir / "trials.json").read_text())["trials"]}
    finished = [n for n, r in first.items() if r["status"] == "succeeded"]
    assert finished and all(r["status"] in ("succeeded", "interrupted", "pending")
                            for r in first.values())
    assert not _processes_mentioning(str(study_dir))  # every trial ended
    stamps = {n: os.stat(study_dir / ("trial-%d" % n) / "export" / "export.json").st_mtime_ns
              for n in finished}

    done = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True,
                          timeout=360)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(study_dir / "trials.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [r["trial"] for r in rows] == ["0", "1", "2", "3"]
    assert all(r["status"] == "succeeded" and r["steps"] == "30" for r in rows)
    metrics = {int(r["trial"]): float(r["accuracy"]) for r in rows}
    assert all(0.0 < m <= 1.0 for m in metrics.values())
    best = max(metrics, key=lambda n: (metrics[n], -n))
    assert "best trial %d: accuracy" % best in done.stdout
    assert str(study_dir / ("trial-%d" % best) / "export" / "model.h5") in done.stdout
    for n in finished:  # not run again
        header_lines = [line for line in (study_dir / ("trial-%d" % n) / "train.log")
                        .read_text().splitlines() if line.startswith("$ ")]
        assert len(header_lines) == 1
        assert os.stat(study_dir / ("trial-%d" % n) / "export" / "export.json"
                       ).st_mtime_ns == stamps[n]
    rates = {int(r["trial"]): float(r["learning_rate"]) for r in rows}
    assert len(set(rates.values())) == 4 and all(0.0003 <= r <= 0.3 for r in rates.values())


@pytest.mark.slow
def test_a_real_study_passes_config_and_engine_to_its_trial(fashion_data, tmp_path):
    config = tmp_path / "small.yaml"
    config.write_text("model:\n  units: 16\ntrain:\n  log_every_steps: 10\n")
    space = tmp_path / "space.yaml"
    space.write_text("learning_rate: {type: discrete, values: [0.003]}\n")
    study_dir = tmp_path / "study"
    done = subprocess.run(
        _tune_command("fashion_mnist_mlp", "--space", space, "--trials", 1, "--model-dir",
                      study_dir, "--data-dir", fashion_data, "--config", config, "--engine",
                      "keras", "--strategy", "none", "--max-steps", 20, "--eval-every", 20,
                      "--batch-size", 32),
        cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    trial = study_dir / "trial-0"
    with open(trial / "export" / "export.json", encoding="utf-8") as f:
        exported = json.load(f)
    assert exported["engine"] == "keras" and exported["global_step"] == 20
    recorded = yaml.safe_load((trial / "config.yaml").read_text())
    assert recorded["model"]["units"] == 16 and recorded["train"]["learning_rate"] == 0.003
    assert recorded["train"]["log_every_steps"] == 10


def _wait_for(predicate, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("timed out waiting for " + what)


def test_two_workers_on_postgresql_and_a_killed_ones_trial_is_retried(tmp_path, fake_python,
                                                                     monkeypatch):
    from postgres_server import Server  # pylint: disable=import-outside-toplevel
    monkeypatch.setenv("FAKE_EVALS", "10")
    monkeypatch.setenv("FAKE_EVAL_PAUSE", "0.3")
    with Server() as url:
        script = _workers(tmp_path, fake_python, url, trials=6, parallel=1)
        procs = {w: subprocess.Popen([sys.executable, str(script), str(tmp_path / w)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=child_env(), start_new_session=True)
                 for w in ("a", "b")}
        try:
            # Worker a is killed outright while its first trial trains.
            _wait_for(lambda: _ran(tmp_path / "a"), 60, "worker a's first trial")
            (killed, pids), = _ran(tmp_path / "a").items()
            os.kill(procs["a"].pid, signal.SIGKILL)
            procs["a"].wait(timeout=10)
            # Its trainer dies with it (PR_SET_PDEATHSIG).
            _wait_for(lambda: not _pid_alive(int(pids[0])), 10, "the killed worker's trial")
            out, err = procs["b"].communicate(timeout=180)
        finally:
            for p in procs.values():
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        assert procs["b"].returncode == 0, err[-4000:]
        table = {n: status for n, status in json.loads(out.splitlines()[-1])}
        # The killed trial failed (no heartbeat) and ran again once, on b,
        # with the same values; the study still holds its 6 trials.
        assert table[killed] == "failed"
        with open(tmp_path / "b" / "trials.json", encoding="utf-8") as f:
            rows = {r["trial"]: r for r in json.load(f)["trials"]}
        assert "no heartbeat" in rows[killed]["message"]
        retries = [r for r in rows.values() if "retry of trial %d" % killed in (r["message"] or "")]
        assert len(retries) == 1 and retries[0]["status"] == "succeeded"
        assert retries[0]["hparams"] == rows[killed]["hparams"]
        assert retries[0]["trial"] in _ran(tmp_path / "b")
        assert sorted(table) == list(range(7))
        assert sorted(s for n, s in table.items() if n != killed) == ["succeeded"] * 6
        # Each trial ran once: the killed one on a, every other on b.
        ran_b = _ran(tmp_path / "b")
        assert killed not in ran_b and sorted(ran_b) == sorted(set(range(7)) - {killed})
        assert all(len(p) == 1 for p in ran_b.values())


# ------------------------------------------------------------------ Katib

KATIB_ARGS = ["submit", "fashion_mnist_mlp", "--target", "katib", "--max-trials", "12",
              "--parallel-trials", "3", "--container-image",
              "us-docker.pkg.dev/p/r/estimator-keras:1", "--job-dir", "gs://my-bucket/katib",
              "--data-dir", "gs://my-bucket/data", "--max-steps", "1500", "--eval-every", "250"]
# Katib's StdOut collector's default filter (its metricsFormat).
KATIB_FILTER = r"([\w|-]+)\s*=\s*([+-]?\d*(\.\d+)?([Ee][+-]?\d+)?)"


def _katib(tmp_path, space_text, *extra):
    space = tmp_path / "space.yaml"
    space.write_text(space_text)
    out = tmp_path / "experiment.yaml"
    rc, _, err = cli(*KATIB_ARGS, "--tune", space, "--output", out, *extra)
    assert rc == 0, err
    return yaml.safe_load(out.read_text())


def test_katib_experiment_holds_the_space_and_passes_katibs_models(tmp_path):
    from estimator_keras.cloud import katib  # pylint: disable=import-outside-toplevel
    experiment = _katib(tmp_path, "learning_rate: {type: double, min: 0.0001, max: 0.01, "
                                  "scale: log}\n"
                                  "batch_size: {type: integer, min: 64, max: 256}\n"
                                  "units: {type: discrete, values: [64, 128]}\n"
                                  "optimizer: {type: categorical, values: [adam, rmsprop]}\n",
                        "--pruner", "median")
    katib.check(experiment)  # what the command already did before writing
    spec = experiment["spec"]
    assert experiment["apiVersion"] == "kubeflow.org/v1beta1"
    assert experiment["kind"] == "Experiment"
    assert spec["objective"] == {"type": "maximize", "objectiveMetricName": "accuracy"}
    assert spec["algorithm"] == {"algorithmName": "tpe"}
    assert spec["earlyStopping"] == {"algorithmName": "medianstop"}
    assert (spec["maxTrialCount"], spec["parallelTrialCount"]) == (12, 3)
    assert spec["parameters"] == [
        {"name": "learning_rate", "parameterType": "double",
         "feasibleSpace": {"min": "0.0001", "max": "0.01", "distribution": "logUniform"}},
        {"name": "batch_size", "parameterType": "int",
         "feasibleSpace": {"min": "64", "max": "256"}},
        {"name": "units", "parameterType": "discrete",
         "feasibleSpace": {"list": ["64", "128"]}},
        {"name": "optimizer", "parameterType": "categorical",
         "feasibleSpace": {"list": ["adam", "rmsprop"]}}]
    template = spec["trialTemplate"]
    assert [p["reference"] for p in template["trialParameters"]] == [
        "learning_rate", "batch_size", "units", "optimizer"]
    container, = template["trialSpec"]["spec"]["template"]["spec"]["containers"]
    assert container["name"] == template["primaryContainerName"]
    # One sh -c line, as Katib's StdOut collector runs it anyway.
    assert container["command"][:2] == ["sh", "-c"]
    command = shlex.split(container["command"][2])
    assert command[command.index("--model-dir") + 1] == "gs://my-bucket/katib/trials/" \
                                                        "${trialSpec.Name}"
    assert "--tuning-trial" in command and "--print-evaluations" in command
    assert "--units=${trialParameters.units}" in command

    # A field Katib's models do not know is refused by name, though pydantic
    # alone would drop it without a word.
    spec["parallelTrialCont"] = 3
    spec["parameters"][0]["feasibleSpace"]["maximum"] = "0.1"
    with pytest.raises(ConfigError, match="do not know") as refused:
        katib.check(experiment)
    assert "spec.parallelTrialCont" in str(refused.value)
    assert "spec.parameters[0].feasibleSpace.maximum" in str(refused.value)


@pytest.mark.parametrize("algorithm, katib_name, scale", [
    ("random", "random", "log"), ("cmaes", "cmaes", "linear"), ("qmc", "sobol", "linear"),
    ("sobol", "sobol", "linear"), ("bayesianoptimization", "bayesianoptimization", "log")])
def test_katib_algorithms_take_katibs_names(tmp_path, algorithm, katib_name, scale):
    experiment = _katib(tmp_path, "learning_rate: {type: double, min: 0.0001, max: 0.1, "
                                  "scale: %s}\nunits: {type: integer, min: 16, max: 256}\n"
                        % scale, "--algorithm", algorithm)
    assert experiment["spec"]["algorithm"]["algorithmName"] == katib_name
    assert "earlyStopping" not in experiment["spec"]


def test_katib_hyperband_tunes_the_steps_itself(tmp_path):
    experiment = _katib(tmp_path, "learning_rate: {type: double, min: 0.0001, max: 0.1}\n",
                        "--algorithm", "hyperband", "--parallel-trials", "6",
                        "--max-trials", "7")
    spec = experiment["spec"]
    # Six evaluations of 250 steps: eta 6, r_l 6.5 (tests/test_katib_rules.py).
    assert {s["name"]: s["value"] for s in spec["algorithm"]["algorithmSettings"]} == {
        "resource_name": "evaluations", "eta": "6", "r_l": "6.5"}
    assert spec["parameters"][-1] == {"name": "evaluations", "parameterType": "int",
                                      "feasibleSpace": {"min": "1", "max": "6"}}
    script = spec["trialTemplate"]["trialSpec"]["spec"]["template"]["spec"][
        "containers"][0]["command"][2]
    assert script.count("--max-steps") == 1
    assert script.endswith("--max-steps $((${trialParameters.evaluations} * 250))")


def test_katib_refusals(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("learning_rate: {type: double, min: 0.0001, max: 0.1}\n")
    without_trials = [a for a in KATIB_ARGS if a not in ("--max-trials", "12")]
    rc, _, err = cli(*without_trials)
    assert rc == 2 and "--target katib writes a Katib Experiment: it needs --tune" in err
    rc, _, err = cli(*KATIB_ARGS, "--tune", space, "--workers", 2)
    assert rc == 2 and "each trial as one pod" in err
    rc, _, err = cli(*KATIB_ARGS, "--tune", space, "--algorithm", "grid")
    assert rc == 2 and "Katib's grid (its optuna service, v0.19.0) needs a step" in err
    vertex = [a if a != "katib" else "vertex" for a in KATIB_ARGS]
    rc, _, err = cli(*vertex, "--tune", space, "--algorithm", "tpe", "--dry-run")
    assert rc == 2 and "is Katib's (--target katib)" in err


@pytest.mark.slow
def test_a_katib_trials_command_prints_what_its_collector_reads(fashion_data, tmp_path):
    import re  # pylint: disable=import-outside-toplevel
    experiment = _katib(tmp_path, "learning_rate: {type: double, min: 0.0001, max: 0.1}\n")
    command = experiment["spec"]["trialTemplate"]["trialSpec"]["spec"]["template"]["spec"][
        "containers"][0]["command"]
    # What Katib's controller substitutes, and this machine's folders.
    values = {"${trialParameters.learning_rate}": "0.003",
              "${trialSpec.Name}": "trial-abc"}
    script = command[2]
    for placeholder, value in values.items():
        script = script.replace(placeholder, value)
    argv = shlex.split(script)[3:]
    argv = [str(tmp_path / "katib" / "trials" / "trial-abc") if a.startswith("gs://my-bucket/katib")
            else str(fashion_data) if a == "gs://my-bucket/data" else a for a in argv]
    for flag, value in (("--max-steps", "40"), ("--eval-every", "20")):
        argv[argv.index(flag) + 1] = value
    done = subprocess.run([sys.executable, "-m", "experiments", *argv], cwd=ROOT,
                          env=child_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # Katib reads the trial's whole log (stdout and stderr): its metric
    # appears exactly once per evaluation, as name=value.
    found = [(m.group(1), float(m.group(2))) for line in (done.stdout + done.stderr).splitlines()
             for m in re.finditer(KATIB_FILTER, line) if m.group(1) == "accuracy"]
    assert len(found) == 2 and all(0 < v <= 1 for _, v in found), found
    exported = json.loads((tmp_path / "katib" / "trials" / "trial-abc" / "export" /
                           "export.json").read_text())
    assert exported["metrics"]["accuracy"] == pytest.approx(found[-1][1], abs=1e-5)


def test_a_journal_file_holds_a_study_too(tmp_path, fake_python):
    journal = tmp_path / "shared" / "study.log"
    config = _study_config(tmp_path, fake_python, "x: {type: discrete, values: [0.3, 0.6]}\n",
                           storage="journal:%s" % journal)
    result = tune.run_study(config)
    assert sorted(t.hparams["x"] for t in result.trials) == [0.3, 0.6]
    assert all(t.status == "succeeded" for t in result.trials)
    assert journal.stat().st_size > 0
    assert not os.path.exists(os.path.join(config.model_dir, "study.db"))
    # Run again on the journal: the study is there, nothing runs twice.
    again = tune.run_study(config)
    assert [t.trial for t in again.trials] == [0, 1]
    assert all(len(_calls(config, n)) == 1 for n in (0, 1))


def test_storage_urls_are_checked_and_passwords_kept_out_of_messages(tmp_path):
    from experiments.tuning import studies  # pylint: disable=import-outside-toplevel
    assert studies.describe("postgresql://tuner:secret@db:5432/studies") == \
        "postgresql://tuner:***@db:5432/studies"
    assert studies.describe("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"
    with pytest.raises(UsageError, match="not a storage URL"):
        studies.open_storage(str(tmp_path / "study.db"))
    with pytest.raises(ConfigError, match=r"postgresql://tuner:\*\*\*@127\.0\.0\.1:9/none: "
                                          r"cannot open"):
        studies.open_storage("postgresql://tuner:secret@127.0.0.1:9/none")


def test_a_trial_trains_alone_and_reports_nowhere_even_inside_a_trainjob_pod(monkeypatch):
    from experiments.tuning import runner as tune
    pod = {"KUBEFLOW_TRAINER_SERVER_URL": "https://trainer:10443/x",
           "JAX_COORDINATOR_ADDRESS": "j-node-0-0.j:29500", "JAX_NUM_PROCESSES": "2",
           "JAX_PROCESS_ID": "0", "EK_TRAINJOB_NAME": "j",
           "EK_TRAINJOB_NODE_INDEX": "0", "EK_TRAINJOB_PORT": "2222", "TF_CONFIG": "{}",
           "KEEP_ME": "1"}
    for name, value in pod.items():
        monkeypatch.setenv(name, value)
    env = tune._child_env()
    assert env["KEEP_ME"] == "1"
    assert not (set(pod) - {"KEEP_ME"}) & set(env)
