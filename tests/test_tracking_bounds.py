"""What tracking (``--track``) promises at its edges, against a real ``mlflow
server``: a cloud job's ``gs://`` export becomes a model version; a run's end
does not wait on its uploads, and a rerun repairs a run left RUNNING;
tracking leaves the process's environment and MLflow's own state as they
were; a server that never answers costs one warning and bounded time.

The trainings run the real CLI on the keras3 engine (this interpreter's)."""

import os
import subprocess
import sys
import time

import pytest

from estimator_keras.tracking import mlflow_run, settings
from experiments.training import tracked
from mlflow_server import MlflowServer, Relay, Silent
from support import ROOT, child_env, kill_group

pytest.importorskip("mlflow")

MLP = "fashion_mnist_mlp"
# Where a PUT uploads a file to a server's artifact store.
UPLOAD = "/api/2.0/mlflow-artifacts/artifacts/"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with MlflowServer(tmp_path_factory.mktemp("mlflow")) as running:
        yield running


def test_a_cloud_jobs_gs_export_is_registered_with_its_uri_as_the_source(server):
    # What the job's chief does at its end (`submit --track URL --register
    # NAME`: the export is on gs://, which this test cannot reach, and is not
    # copied: the version names it).
    lines = []
    run = mlflow_run.MlflowRun(server.uri, experiment="cloud", run_name="job", log=lines.append)
    export = "gs://bucket/jobs/fm-1/model/export"
    run.tags({"export_uri": export})
    run.end("FINISHED")
    tracked.register_export(run, "fm-cloud", export, lines.append)
    assert run.finish(timeout=120), lines
    (version,) = server.client().search_model_versions("name = 'fm-cloud'")
    assert (version.source, version.run_id) == (export, run.run_id)
    assert lines == [f"registered {export} in MLflow as 'fm-cloud' version {version.version}"]


def test_tracking_leaves_the_environment_and_mlflows_tracking_uri_as_they_were(
        server, tmp_path, monkeypatch):
    # pylint: disable-next=import-outside-toplevel
    import mlflow
    for name in (*settings.CLIENT_DEFAULTS, "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    environ, uri = dict(os.environ), mlflow.get_tracking_uri()
    assert not mlflow.is_tracking_uri_set()
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "export.json").write_text("{}")
    lines = []
    run = mlflow_run.MlflowRun(server.uri, experiment="alone", log=lines.append)
    run.params({"train.max_steps": 3})
    run.metrics({"loss": 0.5}, 3)
    run.artifacts(str(folder), "export")
    assert run.finish(timeout=120), lines
    assert dict(os.environ) == environ
    assert not mlflow.is_tracking_uri_set() and mlflow.get_tracking_uri() == uri
    # ...and the run was recorded, its export uploaded, through the URI it was given.
    client = server.client()
    assert client.get_run(run.run_id).info.status == "FINISHED"
    assert [a.path for a in client.list_artifacts(run.run_id, "export")] == ["export/export.json"]


def _train(model_dir, data, uri, *extra, timeout=400):
    """The CLI, started; (process, log path)."""
    tries = 0
    while os.path.exists(f"{model_dir}.{tries}.log"):
        tries += 1
    log_path = f"{model_dir}.{tries}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "experiments", "train", MLP, "--model-dir", model_dir,
             "--data-dir", str(data), "--max-steps", "20", "--eval-every", "20",
             "--engine", "keras3", "--track", uri, *extra],
            cwd=ROOT, env=child_env(), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
    try:
        proc.wait(timeout=timeout)
    finally:
        kill_group(proc)
    with open(log_path, encoding="utf-8", errors="replace") as f:
        return proc, f.read()


def _export_age(model_dir):
    """Seconds since the export's export.json was written."""
    return time.time() - os.path.getmtime(os.path.join(model_dir, "export", "export.json"))


@pytest.mark.slow
def test_a_run_ends_finished_while_its_upload_stalls_and_a_rerun_repairs_a_running_one(
        server, fashion_data, tmp_path):
    model_dir = str(tmp_path / "stalled")
    with Relay(server.uri, stall=lambda method, path: method == "PUT" and UPLOAD in path) \
            as relay:
        proc, out = _train(model_dir, fashion_data, relay.uri, "--register", "mlp-stalled")
        age = _export_age(model_dir)
        assert proc.returncode == 0, out[-4000:]
        assert relay.stalled, out[-3000:]  # the uploads were held
        # The run's end reached the store; its export did not, and the run says so.
        run_id = tracked.read_run_file(model_dir)["run_id"]
        client = server.client()
        assert client.get_run(run_id).info.status == "FINISHED"
        assert client.list_artifacts(run_id, "export") == []
        assert "did not reach" in out and "registered" not in out, out[-3000:]
        # ...within the wait a store that does not answer gets, once the export is written.
        assert age < mlflow_run.OUTAGE_FINISH_WAIT_SECS + 30, (age, out[-3000:])
        # A run that an earlier version left RUNNING behind a stalled upload:
        client.update_run(run_id, status="RUNNING")
        relay.release()
        proc, again = _train(model_dir, fashion_data, relay.uri, "--register", "mlp-stalled")
        # The same command once more: nothing left to repair, nothing new.
        third_proc, third = _train(model_dir, fashion_data, relay.uri, "--register",
                                   "mlp-stalled")
    assert proc.returncode == 0, again[-4000:]
    assert "nothing to train" in again
    assert f"the MLflow run {run_id}, left RUNNING when its training ended, is FINISHED" in again
    assert client.get_run(run_id).info.status == "FINISHED"
    artifacts = {a.path for a in client.list_artifacts(run_id, "export")}
    assert {"export/export.json", "export/model.keras"} <= artifacts, again[-3000:]
    (version,) = client.search_model_versions("name = 'mlp-stalled'")
    assert version.run_id == run_id and version.source == f"runs:/{run_id}/export"
    assert third_proc.returncode == 0, third[-4000:]
    assert "left RUNNING" not in third and "registered" not in third
    assert len(client.search_model_versions("name = 'mlp-stalled'")) == 1


@pytest.mark.slow
def test_a_server_that_never_answers_costs_one_warning_and_a_bounded_wait(fashion_data,
                                                                          tmp_path):
    model_dir = str(tmp_path / "silent")
    with Silent() as silent:
        proc, out = _train(model_dir, fashion_data, silent.uri)
        age = _export_age(model_dir)
    assert proc.returncode == 0, out[-4000:]
    warnings = [line for line in out.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and f"tracking to {silent.uri}" in warnings[0], out[-3000:]
    assert "did not reach" in out and "done in" in out
    # Training ran to its end; after its export, the run waited a bounded time.
    assert os.path.exists(os.path.join(model_dir, "export", "model.keras"))
    assert age < mlflow_run.FINISH_WAIT_SECS + 30, (age, out[-3000:])
