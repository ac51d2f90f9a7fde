"""MLflow tracking (``--track``): against a real ``mlflow server`` (SQLite
backend, local artifact root, 127.0.0.1), read back with ``MlflowClient``.

The trainings run the real CLI in child processes, each engine with its own
interpreter (tests/keras_envs.py): estimator, keras, keras3 on TensorFlow and
on JAX; a cluster of a chief and 2 workers, a SIGTERM'd and resumed run, a
4-trial study and a server killed mid-run."""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from estimator_keras.errors import ConfigError, UsageError
from estimator_keras.tracking import mlflow_run, sender, settings
from experiments.commands import cluster as cluster_cmd
from experiments.commands import submit
from experiments.config import flags as train_flags
from mlflow_server import MlflowServer, free_port
from support import ROOT, child_env, kill_group
import keras_envs

pytest.importorskip("mlflow")

MLP = "fashion_mnist_mlp"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with MlflowServer(tmp_path_factory.mktemp("mlflow")) as running:
        yield running


# ------------------------------------------------------------------ where to track


def test_track_resolves_the_flag_the_environment_and_the_default(tmp_path):
    env, cwd = {}, str(tmp_path)
    assert settings.resolve(None, env) is None  # off unless asked
    # Alone: MLflow's own default, where `mlflow ui` run here looks.
    assert settings.resolve("", env, cwd=cwd) == f"sqlite:///{tmp_path}/mlflow.db"
    assert settings.resolve("runs/t.db", env, cwd=cwd) == f"sqlite:///{tmp_path}/runs/t.db"
    assert settings.resolve("sqlite:///t.db", env, cwd=cwd) == f"sqlite:///{tmp_path}/t.db"
    assert settings.resolve("sqlite:////abs/t.db", env, cwd=cwd) == "sqlite:////abs/t.db"
    env = {"MLFLOW_TRACKING_URI": "http://mlflow.internal:5000"}
    assert settings.resolve("", env) == "http://mlflow.internal:5000"
    assert settings.resolve(None, env) is None  # MLflow's own variable alone turns nothing on
    env[settings.URI_VARIABLE] = "postgresql://u@db/mlflow"
    assert settings.resolve(None, env) == "postgresql://u@db/mlflow"
    assert settings.resolve("https://x.example", env) == "https://x.example"  # the flag wins


def test_a_folder_is_refused_unless_mlflows_file_store_is_allowed(tmp_path):
    cwd = str(tmp_path)
    for uri in ("mlruns", "file:///tmp/mlruns"):
        with pytest.raises(ConfigError, match="--track .*file store.*MLFLOW_ALLOW_FILE_STORE"):
            settings.resolve(uri, {}, cwd=cwd)
    allowed = {"MLFLOW_ALLOW_FILE_STORE": "true"}
    assert settings.resolve("mlruns", allowed, cwd=cwd) == str(tmp_path / "mlruns")
    assert settings.resolve("file:///tmp/mlruns", allowed, cwd=cwd) == "/tmp/mlruns"


@pytest.mark.parametrize("uri, says", [("gs://bucket/mlruns", "gs:"), ("http:///x", "no host"),
                                       ("ftp://h/x", "ftp:"), ("sqlite://", "sqlite:///PATH")])
def test_a_uri_mlflow_cannot_track_to_is_refused_naming_the_flag(uri, says):
    with pytest.raises(ConfigError, match="--track") as e:
        settings.resolve(uri, {})
    assert says in str(e.value)
    with pytest.raises(ConfigError, match=settings.URI_VARIABLE):
        settings.resolve(None, {settings.URI_VARIABLE: uri})


def test_a_password_in_the_uri_is_not_shown():
    assert settings.shown("https://me:secret@mlflow.example:8443/x") == \
        "https://me:***@mlflow.example:8443/x"


def test_the_senders_environment_bounds_mlflow_and_leaves_the_users_settings():
    env = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "60", "PYTHONPATH": "/elsewhere"}
    given = dict(env)
    got = sender.environment("http://h:5000", env, settings.CLIENT_DEFAULTS)
    assert env == given  # the caller's environment is not changed
    assert got["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "60"
    assert got["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "0"
    assert got["MLFLOW_DISABLE_TELEMETRY"] == "true"
    assert got["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] == "true"
    assert got["PYTHONPATH"].split(os.pathsep) == [ROOT, "/elsewhere"]


TELEMETRY = """
import json, sys
from mlflow.telemetry.utils import is_telemetry_disabled
from estimator_keras.tracking import mlflow_run
if sys.argv[1] == "track":
    run = mlflow_run.MlflowRun(sys.argv[2], experiment="t")
    assert run.wait_started(60)
    # MLflow's own rule, applied to the environment its sender runs with.
    with open(f"/proc/{run.sender_pid}/environ", "rb") as f:
        pairs = [item.split(b"=", 1) for item in f.read().split(b"\\0") if b"=" in item]
    print(json.dumps({k.decode(): v.decode() for k, v in pairs}))
    run.finish(timeout=30)
else:
    print(is_telemetry_disabled())
"""


def test_mlflows_telemetry_is_off_where_a_run_is_tracked_unless_the_user_turns_it_on(tmp_path):
    pytest.importorskip("mlflow.telemetry")
    if not os.path.exists("/proc/self/environ"):
        pytest.skip("reads the sender's environment from /proc")
    env = {k: v for k, v in child_env().items()
           if k not in ("CI", "PYTEST_CURRENT_TEST", "DO_NOT_TRACK", "MLFLOW_DISABLE_TELEMETRY",
                        "GITHUB_ACTIONS", "TF_BUILD")}

    def run(*args, **extra):
        proc = subprocess.run([sys.executable, "-c", TELEMETRY, *args], cwd=ROOT,
                              env={**env, **extra}, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout.splitlines()[-1]

    def disabled(environment):
        return run("plain", **{k: v for k, v in environment.items() if k not in env})

    store = f"sqlite:///{tmp_path}/mlflow.db"
    # This environment is one where MLflow would send usage data...
    assert run("plain") == "False"
    # ...but not from the process that sends a tracked run's records, unless asked to.
    assert disabled(json.loads(run("track", store))) == "True"
    assert disabled(json.loads(run("track", store, MLFLOW_DISABLE_TELEMETRY="false"))) == "False"


def test_track_goes_back_into_arguments_for_the_trials_and_jobs():
    parser = argparse.ArgumentParser()
    actions = train_flags.add_train_flags(parser)
    for argv, expected in ((["x", "--track"], ["--track"]),
                           (["x", "--track", "http://h:5000"], ["--track", "http://h:5000"]),
                           (["x"], [])):
        args = parser.parse_args(argv)
        written = train_flags.to_argv(actions, args)
        assert [a for a in written if "track" in a or a.startswith("http")] == expected
        assert parser.parse_args(["x", *written]).track == args.track


def test_register_without_track_is_refused_before_training(run_cli, tmp_path):
    env = child_env()
    env.pop(settings.URI_VARIABLE, None)
    rc, _, err = run_cli("train", MLP, "--model-dir", tmp_path / "m", "--register", "fm",
                         env=env)
    assert rc == 2 and "--register fm" in err and "--track" in err, err
    assert not os.path.exists(tmp_path / "m" / "checkpoint")


def test_a_cloud_job_tracks_to_a_server_and_never_to_a_local_store(monkeypatch):
    # pylint: disable=protected-access
    monkeypatch.delenv(settings.URI_VARIABLE, raising=False)
    args = argparse.Namespace(target="vertex", track="runs/mlflow.db", register=None)
    with pytest.raises(ConfigError, match="--track sqlite:///.*/runs/mlflow.db: a vertex job runs"):
        submit._job_tracking_uri(args)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://mlflow.example.com")
    args = argparse.Namespace(target="trainjob", track="", register="fm")
    # A bare --track takes this shell's server, written out for the job.
    assert submit._job_tracking_uri(args) == "https://mlflow.example.com"
    with pytest.raises(ConfigError, match="--register fm"):
        submit._job_tracking_uri(argparse.Namespace(
            target="vertex", track=None, register="fm"))
    with pytest.raises(ConfigError, match="--register fm with --tune"):
        submit._job_tracking_uri(argparse.Namespace(
            target="vertex", track="", register="fm", tune="space.yaml"))


def test_a_cluster_that_tracks_to_a_server_uses_the_host_network(caplog):
    # pylint: disable=protected-access
    command = ["py", "-m", "experiments", "train", MLP, "--track", "--max-steps", "5"]
    command = cluster_cmd._without_flag(command, "--track") + ["--track",
                                                               "http://127.0.0.1:5"]
    assert command == ["py", "-m", "experiments", "train", MLP, "--max-steps", "5",
                       "--track", "http://127.0.0.1:5"]
    auto = argparse.Namespace(network="auto")
    assert cluster_cmd._network(auto, command, {}) == "host"
    assert "the tracking server http://127.0.0.1:5" in caplog.text
    with pytest.raises(UsageError, match="tracking server"):
        cluster_cmd._network(argparse.Namespace(network="private"), command, {})
    local = command[:-1] + ["/tmp/mlruns"]
    assert cluster_cmd._network(auto, local, {}) == "auto"


def test_the_command_and_the_commit_tags(tmp_path):
    # pylint: disable-next=import-outside-toplevel
    from experiments.training import tracked
    cli_tags = tracked.base_tags([os.path.join(ROOT, "experiments", "__main__.py"), "train",
                                  MLP, "--hparams", "units=64,dropout=0.2 "])
    assert cli_tags["command"] == (f"python -m experiments train {MLP} "
                                   f"--hparams 'units=64,dropout=0.2 '")
    assert tracked.base_tags(["fit.py", "--x"])["command"] == "fit.py --x"
    assert tracked.git_commit(str(tmp_path)) is None  # not a checkout
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q"], check=True)
    (tmp_path / "f.txt").write_text("a")
    subprocess.run(git + ["add", "f.txt"], check=True)
    subprocess.run(git + ["commit", "-qm", "c"], check=True)
    head = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert tracked.git_commit(str(tmp_path)) == head
    (tmp_path / "f.txt").write_text("b")
    assert tracked.git_commit(str(tmp_path)) == head + "-dirty"


# ------------------------------------------------------------------ one run, by itself


def _run(server, lines, **kwargs):
    kwargs.setdefault("experiment", "pieces")
    return mlflow_run.MlflowRun(server.uri if server else kwargs.pop("uri"), log=lines.append,
                                **kwargs)


def test_records_reach_the_server_batched_and_in_order(server, tmp_path):
    lines, started = [], []
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "export.json").write_text('{"metrics": {"accuracy": 0.5}}')
    run = _run(server, lines, run_name="batched", on_started=started.append,
               tags={"first": "tag"})
    run.params({f"p{i:03d}": i for i in range(150)})           # over one request's 100
    for step in range(2500):                                     # over one request's 1000
        run.metrics({"loss": 1.0 / (step + 1), "not_a_number": "x"}, step)
    run.tags({"t": "v" * 6000})                                  # clipped to MLflow's limit
    run.artifacts(str(folder), "export")
    versions = []
    run.register("pieces-model", "export", on_done=versions.append)
    assert run.finish(timeout=60), lines
    assert lines == [] and started == [run.run_id]
    client = server.client()
    got = client.get_run(run.run_id)
    assert got.info.status == "FINISHED" and got.info.run_name == "batched"
    assert len(got.data.params) == 150 and got.data.params["p149"] == "149"
    assert got.data.tags["first"] == "tag" and len(got.data.tags["t"]) == mlflow_run.MAX_TAG_VALUE
    history = client.get_metric_history(run.run_id, "loss")
    assert [m.step for m in history] == list(range(2500))
    assert "not_a_number" not in got.data.metrics
    assert [a.path for a in client.list_artifacts(run.run_id, "export")] == ["export/export.json"]
    (version,) = versions
    found = client.get_model_version("pieces-model", version)
    assert found.run_id == run.run_id and found.source == f"runs:/{run.run_id}/export"


def test_a_continued_run_keeps_its_id_and_its_first_values(server):
    lines = []
    first = _run(server, lines, run_name="resumed")
    first.params({"train.max_steps": 100, "train.seed": 42})
    first.metrics({"loss": 1.0}, 10)
    assert first.finish("KILLED", timeout=30)
    again = _run(server, lines, run_id=first.run_id)
    # A rerun with a higher --max-steps: MLflow keeps a parameter's first value.
    again.params({"train.max_steps": 200, "train.seed": 42, "engine": "keras3"})
    again.metrics({"loss": 0.5}, 20)
    assert again.finish(timeout=30)
    assert again.run_id == first.run_id
    got = server.client().get_run(first.run_id)
    assert got.info.status == "FINISHED"
    assert got.data.params == {"train.max_steps": "100", "train.seed": "42", "engine": "keras3"}
    assert [m.step for m in server.client().get_metric_history(first.run_id, "loss")] == [10, 20]
    (line,) = lines
    assert "kept its recorded values of train.max_steps" in line and "warning" not in line


def test_a_server_that_is_down_costs_one_warning_and_bounded_time():
    lines = []
    run = _run(None, lines, uri=f"http://127.0.0.1:{free_port()}", max_pending=50)
    begun = time.monotonic()
    for step in range(100):
        run.metrics({"loss": 1.0}, step)
    assert time.monotonic() - begun < 1.0  # nothing waits on the network
    # The sender has started (it imports MLflow) and tried once.
    deadline = time.monotonic() + 120
    while not lines and time.monotonic() < deadline:
        time.sleep(0.1)
    begun = time.monotonic()
    assert run.finish(timeout=3) is False
    assert time.monotonic() - begun < 8
    warnings = [line for line in lines if line.startswith("warning: ")]
    assert len(warnings) == 1 and "training goes on" in warnings[0], lines
    assert run.dropped == 50
    assert any("did not reach" in line for line in lines), lines


# ------------------------------------------------------------------ trainings


def _train(pair, server, model_dir, data, *extra, timeout=600):
    python, env = keras_envs.interpreter(pair)
    proc = subprocess.run([python, "-m", "experiments", "train", MLP, "--model-dir", model_dir,
                           "--data-dir", data, "--max-steps", "40", "--eval-every", "20",
                           "--engine", _engine(pair), "--track", server.uri, *map(str, extra)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return proc


def _runs(server, experiment=MLP, **filters):
    client = server.client()
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    query = " and ".join(f"tags.{k} = '{v}'" for k, v in filters.items())
    return client.search_runs([found.experiment_id], filter_string=query)


def _run_id(model_dir):
    with open(os.path.join(model_dir, "mlflow-run.json"), encoding="utf-8") as f:
        return json.load(f)["run_id"]


@pytest.mark.slow
@pytest.mark.parametrize("pair", keras_envs.PAIRS)
def test_a_train_run_is_recorded_once_on_every_engine(pair, server, fashion_data, tmp_path):
    model_dir = str(tmp_path / pair)
    proc = _train(pair, server, model_dir, fashion_data, "--register", f"mlp-{pair}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "warning: tracking" not in proc.stderr
    run_id = _run_id(model_dir)
    client = server.client()
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == pair
    params, tags = run.data.params, run.data.tags
    engine = "keras3" if pair.startswith("keras3") else pair
    backend = pair.split("-")[1] if pair.startswith("keras3") else "tensorflow"
    assert (params["engine"], params["backend"], params["strategy"]) == (engine, backend, "none")
    assert params["train.max_steps"] == "40" and params["data.dataset"] == "fashion_mnist"
    assert params["dataset.examples.train"] == "3000" and len(params["dataset.schema_digest"]) == 16
    assert params["model.units"] and params["precision"]
    assert tags["estimator_keras.version"] and tags["version.tensorflow"]
    # What the interpreter has installed; what the run trains with among it.
    assert ("version.jax" in tags or backend != "jax") and (
        "version.tf_keras" in tags or engine != "keras")
    assert engine != "keras3" or tags["version.keras"].startswith("3.")
    assert "--track" in tags["command"] and tags["model_dir"] == model_dir
    # An evaluation at each checkpoint, the loss and the rate of the run's end.
    evals = client.get_metric_history(run_id, "eval_accuracy")
    assert [m.step for m in evals] == [20, 40] and 0.3 < evals[-1].value <= 1.0
    assert [m.step for m in client.get_metric_history(run_id, "loss")][-1] == 40
    assert client.get_metric_history(run_id, "steps_per_sec")[-1].value > 0
    with open(os.path.join(model_dir, "export", "export.json"), encoding="utf-8") as f:
        exported = json.load(f)
    assert abs(exported["metrics"]["accuracy"] - evals[-1].value) < 1e-6
    artifacts = {a.path for a in client.list_artifacts(run_id, "export")}
    assert {"export/export.json", "export/model.h5", "export/weights.h5"} <= artifacts
    assert [a.path for a in client.list_artifacts(run_id) if not a.is_dir] == ["config.yaml"]
    (version,) = client.search_model_versions(f"name = 'mlp-{pair}'")
    assert version.run_id == run_id
    # The same command again: the model dir is at --max-steps, nothing new.
    again = _train(pair, server, model_dir, fashion_data)
    assert again.returncode == 0, again.stderr[-4000:]
    assert [r.info.run_id for r in _runs(server) if r.data.tags.get("model_dir") == model_dir
            ] == [run_id]
    assert len(client.get_metric_history(run_id, "eval_accuracy")) == 2


@pytest.mark.slow
def test_a_cluster_is_one_run_the_chiefs(server, fashion_data, tmp_path):
    python, env = keras_envs.interpreter("estimator")
    model_dir = str(tmp_path / "cluster")
    proc = subprocess.run([python, "-m", "experiments", "cluster", MLP, "--workers", "2",
                           "--model-dir", model_dir, "--quiet", "--timeout", "400", "--",
                           "--data-dir", fashion_data, "--max-steps", "40", "--eval-every", "20",
                           "--engine", "estimator", "--track", server.uri],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "tracking server" in proc.stderr  # the host network, said why
    runs = [r for r in _runs(server) if r.data.tags.get("model_dir") == model_dir]
    assert [r.info.run_id for r in runs] == [_run_id(model_dir)]
    (run,) = runs
    assert run.info.status == "FINISHED"
    assert (run.data.params["strategy"], run.data.params["training_tasks"]) == (
        "multi_worker_mirrored", "3")
    assert server.client().get_metric_history(run.info.run_id, "eval_accuracy")[-1].step == 40


def _engine(pair):
    return "keras3" if pair.startswith("keras3") else pair


def _start_train(pair, server, model_dir, data, log, *extra):
    python, env = keras_envs.interpreter(pair)
    return subprocess.Popen([python, "-m", "experiments", "train", MLP, "--model-dir", model_dir,
                             "--data-dir", data, "--engine", _engine(pair), "--track", server.uri,
                             *map(str, extra)], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for(predicate, proc, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


@pytest.mark.slow
def test_a_preempted_and_resumed_run_stays_one_run(server, fashion_data, tmp_path):
    model_dir = str(tmp_path / "preempted")
    flags = ("--max-steps", "400", "--eval-every", "50", "--batch-size", "32")
    evaluations = os.path.join(model_dir, "evaluations.jsonl")
    with open(tmp_path / "first.log", "wb") as log:
        proc = _start_train("keras", server, model_dir, fashion_data, log, *flags,
                            "--evaluations-file", evaluations)
        try:
            assert _wait_for(lambda: os.path.exists(os.path.join(model_dir, "mlflow-run.json"))
                             and os.path.exists(evaluations), proc, 300), \
                (tmp_path / "first.log").read_text()
            os.killpg(proc.pid, signal.SIGTERM)
            assert proc.wait(timeout=120) == 75, (tmp_path / "first.log").read_text()[-3000:]
        finally:
            kill_group(proc)
    run_id = _run_id(model_dir)
    client = server.client()
    stopped = client.get_run(run_id)
    assert stopped.info.status == "KILLED"
    stopped_at = int(stopped.data.tags["stopped_at_step"])
    assert 50 <= stopped_at < 400
    with open(tmp_path / "second.log", "wb") as log:
        proc = _start_train("keras", server, model_dir, fashion_data, log, *flags)
        try:
            assert proc.wait(timeout=400) == 0, (tmp_path / "second.log").read_text()[-3000:]
        finally:
            kill_group(proc)
    assert "continues in MLflow" in (tmp_path / "second.log").read_text()
    assert _run_id(model_dir) == run_id
    assert [r.info.run_id for r in _runs(server) if r.data.tags.get("model_dir") == model_dir
            ] == [run_id]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(run_id, "eval_accuracy")]
    assert steps == sorted(set(steps)) and steps[-1] == 400 and min(steps) <= stopped_at
    assert any(s > stopped_at for s in steps)


@pytest.mark.slow
def test_a_study_is_a_parent_run_with_a_nested_run_per_trial(server, fashion_data, tmp_path,
                                                             monkeypatch):
    # pylint: disable=import-outside-toplevel  (Optuna: the tune extra)
    pytest.importorskip("optuna")
    from estimator_keras.tuning import space as space_lib
    from estimator_keras.tuning import optuna_search as search
    from experiments.tuning import runner as tune
    python, env = keras_envs.interpreter("keras")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    # The median pruner judges from two finished trials on, so that four
    # trials, two at a time, show one pruned: the last, at a learning rate
    # that learns nothing.
    monkeypatch.setattr(search, "MEDIAN_STARTUP_TRIALS", 2)
    rates = [0.003, 0.002, 0.004, 1e-9]
    space = tmp_path / "space.yaml"
    space.write_text("learning_rate: {type: discrete, values: [1.0e-9, 0.002, 0.003, 0.004]}\n")
    study_def = space_lib.Study(space_lib.load_space(str(space)), metric="accuracy", goal="max",
                                max_trials=4, parallel_trials=2)
    config = tune.StudyConfig(
        MLP, study_def, str(tmp_path / "study"), python=python, pruner="median",
        train_args=["--data-dir", str(fashion_data), "--max-steps", "60", "--eval-every", "10",
                    "--engine", "keras"],
        max_steps=60, first_eval_step=10, plots=False, track=server.uri, register="mlp-best")
    study, _ = tune.open_study(config)
    for rate in rates:
        study.enqueue_trial({"learning_rate": rate})
    result = tune.run_study(config)
    states = {t.trial: t.status for t in result.trials}
    assert states[3] == "pruned" and result.best.trial != 3, states
    parent_id = _run_id(config.model_dir)
    client = server.client()
    parent = client.get_run(parent_id)
    assert parent.info.status == "FINISHED" and parent.data.tags["kind"] == "study"
    assert parent.data.params["pruner"] == "median" and parent.data.params["trials"] == "4"
    assert parent.data.tags["best_trial"] == str(result.best.trial)
    children = _runs(server, **{"mlflow.parentRunId": parent_id})
    by_trial = {int(r.data.tags["trial_number"]): r for r in children}
    assert sorted(by_trial) == [0, 1, 2, 3]
    assert {n: r.data.tags["trial_state"] for n, r in by_trial.items()} == states
    assert by_trial[3].info.status == "KILLED"  # SIGTERM'd by the pruner
    assert int(by_trial[3].data.tags["pruned_at"]) >= 10
    best = by_trial[result.best.trial]
    assert best.data.tags["best_trial"] == "true"
    assert parent.data.tags["best_run_id"] == best.info.run_id
    assert [r for n, r in by_trial.items() if r.data.tags.get("best_trial")] == [best]
    (version,) = client.search_model_versions("name = 'mlp-best'")
    assert version.run_id == best.info.run_id
    best_curve = client.get_metric_history(parent_id, "best_accuracy")
    assert best_curve[-1].value == pytest.approx(result.best.metric)


@pytest.mark.slow
def test_a_server_killed_mid_run_costs_one_warning_and_training_finishes(fashion_data,
                                                                         tmp_path):
    model_dir = str(tmp_path / "orphan")
    with MlflowServer(tmp_path / "doomed") as doomed:
        with open(tmp_path / "train.log", "wb") as log:
            proc = _start_train("keras", doomed, model_dir, fashion_data, log,
                                "--max-steps", "200", "--eval-every", "50", "--batch-size", "32")
            try:
                assert _wait_for(lambda: os.path.exists(
                    os.path.join(model_dir, "mlflow-run.json")), proc, 300)
                doomed.stop()
                assert proc.wait(timeout=400) == 0, (tmp_path / "train.log").read_text()[-3000:]
            finally:
                kill_group(proc)
    out = (tmp_path / "train.log").read_text()
    warnings = [line for line in out.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and "tracking to http://127.0.0.1" in warnings[0], out[-3000:]
    assert "did not reach" in out and "done in" in out
    assert os.path.exists(os.path.join(model_dir, "export", "export.json"))
