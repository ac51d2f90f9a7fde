"""Progress in a Kubeflow Trainer v2 TrainJob's status
(estimator_keras/cloud/trainjob_status.py): reports go through the Kubeflow
SDK over HTTPS to a stand-in of the Trainer's status server
(tests/trainjob_server.py) and pass its checks; the CA file and a rotated
token are used; failures are retried, cost one warning and no training time;
the final report says 100%, or where a preempted run stopped; and a real
``train`` reports its progress and evaluations.

The estimator engine runs in py311 and keras3 on JAX in the keras env; py313
has no Kubeflow SDK and does not run this module (tests/environments.py).
"""

import importlib
import importlib.util
import json
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from estimator_keras.cloud import trainjob_status
from estimator_keras.engines import base
from estimator_keras.errors import Preempted
from support import ROOT, child_env, keras3_installed
from trainjob_server import LAST_DELIVERY, StatusServer, make_ca

sdk = pytest.importorskip("kubeflow.trainer")
SDK_MODULE = importlib.import_module(sdk.update_trainjob_status.__module__)
INSTALL = "pip install -e '.[kubeflow]'"
# A report() that waits on anything but a lock is a bug; 50 ms leaves room
# for a loaded machine.
QUICK_S = 0.05


@pytest.fixture(autouse=True)
def sdk_between_tests(monkeypatch):
    """Each test with a token of its own: the SDK keeps a token it read for
    5 minutes, process-wide (the kubelet rotates the hour-long token after 48
    minutes, so the old one stays valid 12); here it reads the file at every
    send. And no proxy between the SDK and 127.0.0.1."""
    assert hasattr(SDK_MODULE, "_TOKEN_CACHE_TTL_SECONDS"), "the SDK changed: revisit this fixture"
    monkeypatch.setattr(SDK_MODULE, "_TOKEN_CACHE_TTL_SECONDS", 0.0)
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY",
                 "all_proxy", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")


@pytest.fixture
def sdk_window():
    """The SDK refuses an update within 5 s of its last success, process-wide:
    a test that counts on its first send waits that long after any delivery."""
    wait = LAST_DELIVERY[0] + trainjob_status.SDK_THROTTLE_SECS + 0.2 - time.monotonic()
    if wait > 0:
        time.sleep(wait)


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A started stand-in whose variables are set, with a token of its own."""
    with StatusServer(tmp_path / "server", token=f"token-{tmp_path.name}") as running:
        for name, value in running.env().items():
            monkeypatch.setenv(name, value)
        yield running


class Reporters:
    """Makes reporters from the environment, keeps their lines, closes them."""

    def __init__(self):
        self.lines, self.made = [], []

    def __call__(self, max_steps=1000, **options):
        reporter = trainjob_status.from_environment(max_steps, self.lines.append, **options)
        assert reporter is not None, self.lines
        self.made.append(reporter)
        return reporter

    @property
    def warnings(self):
        return [line for line in self.lines if line.startswith("warning: ")]


@pytest.fixture
def reporters():
    made = Reporters()
    yield made
    for reporter in made.made:
        reporter.close()


def _timed(call, *args, **kwargs):
    start = time.monotonic()
    call(*args, **kwargs)
    return time.monotonic() - start


def _metrics(status):
    return {m["name"]: m["value"] for m in status.get("metrics", [])}


def _post(server, document, token=None, path=None, method="POST"):
    """(code, answer) of one request to ``server``, trusting its CA only."""
    context = ssl.create_default_context(cafile=server.ca[0])
    url = server.url if path is None else server.url.split("/apis/")[0] + path
    request = urllib.request.Request(
        url, data=json.dumps(document).encode() if method == "POST" else None, method=method,
        headers={"Authorization": f"Bearer {token or open(server.token_path).read().strip()}",
                 "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


# -- the pieces


def test_the_progress_meter_hands_each_progress_line_to_on_progress():
    lines, calls = [], []
    meter = base.ProgressMeter(10, log=lines.append, max_steps=100,
                               on_progress=lambda *args: calls.append(args))
    for step in range(1, 46):
        meter.update(step, loss=1.0 / step, now=step * 0.5)
    assert [c[0] for c in calls] == [10, 20, 30, 40] and len(lines) == 4
    step, loss, left, rate = calls[-1]
    # 39 steps in 19.5 s since step 1: 60 steps more take 30 s; 10 steps in
    # 5 s since the line before.
    assert loss == pytest.approx(1 / 40) and left == pytest.approx(30.0)
    assert rate == pytest.approx(2.0)
    assert lines[-1].endswith("30 s left")
    # The summary at the end: the rest of the steps, none left to go.
    meter.finish(45)
    assert calls[-1][0] == 45 and calls[-1][2] == 0.0 and calls[-1][3] == pytest.approx(2.0)
    hooks = base.TrainingHooks(on_progress=lambda *args: calls.append(args))
    hooks.on_progress(50, 0.5, 12.0)
    assert calls[-1] == (50, 0.5, 12.0, None)
    base.TrainingHooks().on_progress(50, 0.5, 12.0)  # nothing to call: nothing happens


def test_metrics_are_kept_within_the_apis_limits():
    many = {f"m{i:03d}": i / 3 for i in range(300)}
    shaped = trainjob_status.api_metrics({"global_step": np.int64(120), "loss": np.float32(0.5),
                                          "x" * 70: 1, "": 2.0, "empty": "", **many})
    assert len(shaped) == 256
    assert shaped["global_step"] == "120" and shaped["loss"] == "0.5"
    assert shaped["x" * 64] == "1" and "" not in shaped and "empty" not in shaped
    assert shaped["m001"] == "0.333333" and "m252" in shaped and "m253" not in shaped
    assert all(1 <= len(k) <= 64 and 1 <= len(v) <= 64 for k, v in shaped.items())
    assert trainjob_status.metric_value(1e-12) == "1e-12"
    assert trainjob_status.metric_value(float("nan")) == "nan"
    assert trainjob_status.metric_value("v" * 80) == "v" * 64


def test_the_latest_report_is_sent_and_sends_are_paced():
    """No network: a stand-in for the SDK's call records what it is given."""
    sent, latest = [], [0]

    def send(percent, seconds_left, metrics):
        sent.append((time.monotonic(), percent, int(metrics["global_step"]), latest[0]))
        return True

    lines = []
    reporter = trainjob_status.StatusReporter(1000, send, log=lines.append, min_interval=0.3,
                                              idle_interval=0.8)
    try:
        # A new percentage every 10 steps: sends every 0.3 s, each of the
        # latest step (a few steps may come while one is sent).
        for step in range(1, 181):
            latest[0] = step
            assert _timed(reporter.progress, step, 0.5) < QUICK_S
            time.sleep(0.01)
        time.sleep(0.4)
        busy = list(sent)
        gaps = [b[0] - a[0] for a, b in zip(busy, busy[1:])]
        assert len(busy) >= 4 and min(gaps) >= 0.29, gaps
        assert all(posted - step <= 2 for _, _, step, posted in busy), busy
        assert busy[-1][2] == 180 and busy[-1][1] == 18
        # The same percentage, only the loss changing: every 0.8 s.
        for i in range(150):
            assert _timed(reporter.progress, 185, 0.1 + i / 1000) < QUICK_S
            time.sleep(0.01)
        idle = [s for s in sent if s not in busy]
        idle_gaps = [b[0] - a[0] for a, b in zip([busy[-1]] + idle, idle)]
        assert 1 <= len(idle) <= 3 and min(idle_gaps) >= 0.79, idle_gaps
        assert reporter.finish(1000, {"accuracy": 0.9, "global_step": 1000}, timeout=2)
        assert sent[-1][1] == 100 and not lines
    finally:
        reporter.close()


def test_without_the_variable_nothing_reports(monkeypatch):
    monkeypatch.delenv(trainjob_status.URL_VARIABLE, raising=False)
    lines = []
    assert trainjob_status.from_environment(1000, lines.append) is None
    assert not lines


def test_without_the_sdk_one_warning_names_the_extra(monkeypatch):
    monkeypatch.setenv(trainjob_status.URL_VARIABLE, "https://trainer.kubeflow-system.svc:10443/"
                       "apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainjobs/x/status")
    monkeypatch.setitem(sys.modules, "kubeflow.trainer", None)  # import fails
    lines = []
    assert trainjob_status.from_environment(1000, lines.append) is None
    assert len(lines) == 1 and lines[0].startswith("warning: ") and INSTALL in lines[0], lines


# -- reports through the SDK


def test_another_ca_is_refused_with_one_warning(sdk_window, server, reporters, tmp_path,
                                                monkeypatch, caplog):
    other_ca, _ = make_ca(tmp_path / "other-ca", name="another-ca")
    monkeypatch.setenv(trainjob_status.CA_VARIABLE, other_ca)
    reporter = reporters(1000, retry=(0.1, 0.2), finish_retry=0.1)
    for step in range(10, 400, 10):
        assert _timed(reporter.progress, step, 0.5) < QUICK_S
        time.sleep(0.02)
    time.sleep(0.5)
    assert reporter.attempts >= 4 and reporter.deliveries == 0
    assert not server.records  # no request got past the TLS handshake
    assert not reporter.finish(1000, timeout=1.0)
    assert len(reporters.warnings) == 1, reporters.lines
    assert "CERTIFICATE_VERIFY_FAILED" in reporters.warnings[0]
    assert not [r for r in caplog.records if r.levelno >= 30]  # the SDK's own warnings folded


def test_a_server_that_is_down_costs_one_warning_and_no_time(sdk_window, server, reporters,
                                                             caplog):
    server.stop()  # its port refuses connections
    reporter = reporters(1000, retry=(0.05, 0.1), finish_retry=0.05)
    times = []
    for step in range(1, 301):
        times.append(_timed(reporter.progress, step, 0.5))
        if step % 100 == 0:
            times.append(_timed(reporter.evaluation, {"accuracy": 0.5, "global_step": step}))
        time.sleep(0.005)
    assert max(times) < QUICK_S, sorted(times)[-5:]
    assert reporter.attempts >= 5 and reporter.deliveries == 0
    start = time.monotonic()
    assert not reporter.finish(300, timeout=1.0)
    assert time.monotonic() - start < 1.5
    assert len(reporters.warnings) == 1, reporters.lines
    assert "Connection refused" in reporters.warnings[0] or "Errno" in reporters.warnings[0]
    assert "did not reach" in reporters.lines[-1]  # said once more, not as a warning
    assert not [r for r in caplog.records if r.levelno >= 30]


def test_a_hanging_server_does_not_slow_training_and_finish_is_bounded(sdk_window, server,
                                                                      reporters):
    server.hang()
    reporter = reporters(1000)
    times = []
    for step in range(10, 1000, 10):
        times.append(_timed(reporter.progress, step, 0.5))
        time.sleep(0.01)
    assert max(times) < QUICK_S, sorted(times)[-5:]
    start = time.monotonic()
    assert not reporter.finish(1000, {"accuracy": 0.9, "global_step": 1000})
    waited = time.monotonic() - start
    assert trainjob_status.FINISH_WAIT_SECS - 0.5 <= waited <= trainjob_status.FINISH_WAIT_SECS + 1
    assert waited < 15
    assert len(server.records) >= 2 and reporter.deliveries == 0
    assert len(reporters.warnings) == 1, reporters.lines
    assert "timed out" in reporters.warnings[0], reporters.warnings


def test_a_failed_send_is_retried_until_delivered(sdk_window, server, reporters, caplog):
    server.fail_next(2)
    reporter = reporters(1000, retry=(0.2, 1.0))
    reporter.progress(100, 0.5, 60)
    assert server.wait_for(lambda: server.accepted, 10), server.codes()
    assert server.codes() == [500, 500, 200]
    gaps = [b["time"] - a["time"] for a, b in zip(server.records, server.records[1:])]
    assert 0.19 <= gaps[0] and 0.39 <= gaps[1], gaps  # backoff: 0.2 s, then 0.4 s
    assert server.status["progressPercentage"] == 10
    assert len(reporters.warnings) == 1 and "HTTP 500" in reporters.warnings[0], reporters.lines
    assert not [r for r in caplog.records if r.levelno >= 30]


def test_a_report_passes_the_servers_checks_and_ends_at_100_percent(sdk_window, server,
                                                                    reporters, caplog):
    reporter = reporters(1000)
    assert reporters.lines == ["progress goes to TrainJob ml/tiny's status"]
    assert _timed(reporter.progress, 250, np.float32(0.123456789), 90.4) < QUICK_S
    assert server.wait_for(lambda: server.accepted, 10), (server.codes(), reporters.lines)
    first = server.accepted[0]
    assert first["progressPercentage"] == 25
    assert 85 <= first["estimatedRemainingSeconds"] <= 90
    assert _metrics(first) == {"global_step": "250", "loss": "0.123457"}
    # An evaluation of many metrics, one with a long name: all within limits.
    many = {f"m{i:03d}": i for i in range(300)}
    final = {"accuracy": 0.87654321, "loss": 0.5, "a" * 80: 1.0, "global_step": 1000, **many}
    start = time.monotonic()
    assert reporter.finish(1000, final)
    # The SDK's 5 s window after the first delivery, then one request.
    assert time.monotonic() - start < trainjob_status.FINISH_WAIT_SECS
    assert set(server.codes()) == {200}, server.codes()
    last = server.status
    assert last["progressPercentage"] == 100 and last["estimatedRemainingSeconds"] == 0
    metrics = _metrics(last)
    assert len(metrics) == 256
    assert metrics["global_step"] == "1000" and metrics["eval_accuracy"] == "0.876543"
    assert metrics["eval_loss"] == "0.5" and metrics["loss"] == "0.123457"
    assert ("eval_" + "a" * 80)[:64] in metrics
    sends = [r["time"] for r in server.records]
    assert sends[1] - sends[0] >= trainjob_status.SDK_THROTTLE_SECS
    assert not reporters.warnings and not [r for r in caplog.records if r.levelno >= 30]
    # Finished: later reports go nowhere.
    reporter.progress(1000, 0.1, 0)
    time.sleep(0.2)
    assert len(server.records) == 2


def test_a_rewritten_token_file_is_read_again(sdk_window, server, reporters, monkeypatch):
    # Here the SDK keeps the token it read for 8 s, as it keeps one for 5
    # minutes: the first send after the rotation still carries the old token.
    monkeypatch.setattr(SDK_MODULE, "_TOKEN_CACHE_TTL_SECONDS", 8.0)
    reporter = reporters(1000, retry=(0.5, 1.0))
    old = open(server.token_path).read().strip()
    reporter.progress(100, 0.5, 60)
    assert server.wait_for(lambda: server.accepted, 15), server.codes()
    server.write_token("token-rotated")
    rotated = len(server.records)
    reporter.progress(200, 0.4, 50)
    assert server.wait_for(lambda: len(server.accepted) == 2, 20), server.codes()
    after = server.records[rotated:]
    assert [r["token"] for r in after if r["code"] == 200] == ["token-rotated"]
    assert {r["token"] for r in after if r["code"] == 403} == {old}
    assert server.status["progressPercentage"] == 20
    # The refusals of the old token: one warning, and a line when it passed.
    # The reporter's thread says so once the accepted response is back: wait for it.
    again = "progress reaches TrainJob ml/tiny's status again"
    assert server.wait_for(lambda: reporters.lines and reporters.lines[-1] == again, 10), \
        reporters.lines
    assert len(reporters.warnings) == 1 and "HTTP 403" in reporters.warnings[0]


def test_a_preempted_run_reports_the_step_it_reached(sdk_window, server, reporters):
    reporter = reporters(1000)
    with pytest.raises(Preempted):
        with reporter:
            reporter.progress(300, 0.5, 70)
            assert server.wait_for(lambda: server.accepted, 10), server.codes()
            reporter.progress(410, 0.4, 60)
            raise Preempted("preempted at step 420", step=420)
    final = server.status
    assert final["progressPercentage"] == 42, server.accepted
    assert "estimatedRemainingSeconds" not in final
    assert _metrics(final)["global_step"] == "420"
    assert not reporters.warnings


# -- the stand-in checks what the Trainer checks


def test_the_stand_in_refuses_what_the_trainer_refuses(server):
    good = {"progressPercentage": 5, "estimatedRemainingSeconds": 10,
            "metrics": [{"name": "loss", "value": "0.5"}],
            "lastUpdatedTime": "2026-08-01T10:00:00.123456+00:00"}
    bad = [dict(good, progressPercentage=101), dict(good, progressPercentage=50.5),
           dict(good, estimatedRemainingSeconds=-1), dict(good, lastUpdatedTime="yesterday"),
           {k: v for k, v in good.items() if k != "lastUpdatedTime"},
           dict(good, metrics=[{"name": "n" * 65, "value": "1"}]),
           dict(good, metrics=[{"name": "loss", "value": ""}]),
           dict(good, metrics=[{"name": "loss", "value": 0.5}]),
           dict(good, metrics=[{"name": f"m{i}", "value": "1"} for i in range(257)])]
    for status in bad:
        code, answer = _post(server, {"trainerStatus": status})
        assert code == 422 and answer["status"] == "Failure", (status, code, answer)
    assert _post(server, {"trainerStatus": good}, token="stolen")[0] == 403
    other = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainjobs/other/status"
    assert _post(server, {"trainerStatus": good}, path=other)[0] == 403
    assert _post(server, {}, method="GET")[0] == 404
    assert server.status is None
    code, answer = _post(server, {"trainerStatus": good})
    assert code == 200 and answer == {"trainerStatus": good} and server.status == good


# -- a real training


def _write_vectors(path, n, seed):
    """Float vectors of 8; the class is which of the first three is largest."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 8)).astype(np.float32)
    y = np.argmax(x[:, :3], axis=1).astype(np.int64)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for values, label in zip(x, y):
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "measurements": tf.train.Feature(float_list=tf.train.FloatList(value=values)),
                "class": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            })).SerializeToString())


def _cli(*args, env, timeout=600):
    proc = subprocess.run([sys.executable, "-m", "experiments", *map(str, args)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("engine", [
    pytest.param("estimator", marks=pytest.mark.skipif(
        importlib.util.find_spec("tensorflow_estimator") is None,
        reason="tf.estimator ends with TensorFlow 2.15")),
    pytest.param("keras3", marks=[pytest.mark.keras3_backend("jax"), pytest.mark.skipif(
        not keras3_installed() or importlib.util.find_spec("jax") is None,
        reason="Keras 3 or JAX is not installed")])])
def test_a_training_reports_its_progress_and_evaluations(engine, server, tmp_path):
    env = child_env(**server.env(), NO_PROXY="127.0.0.1")
    if engine == "keras3":
        env["KERAS_BACKEND"] = "jax"
        env.pop("TF_USE_LEGACY_KERAS", None)
    _write_vectors(tmp_path / "train.tfrecord", 400, seed=0)
    _write_vectors(tmp_path / "test.tfrecord", 100, seed=1)
    data_dir, model_dir = tmp_path / "data", tmp_path / "run"
    rc, err = _cli("prepare", "tfrecords", "--source", tmp_path / "train.tfrecord",
                   "--test-source", tmp_path / "test.tfrecord", "--features",
                   "image=measurements", "--label", "class", "--name", "vectors", "--data-dir",
                   data_dir, env=env)
    assert rc == 0, err[-3000:]
    assert not server.records  # prepare reports nothing
    # Long enough for three reports at the SDK's pace of one per 5 s.
    steps = 6000
    train = ("train", "image_classifier", "--dataset", "vectors", "--data-dir", data_dir,
             "--model-dir", model_dir, "--max-steps", steps, "--eval-every", 1500,
             "--batch-size", 16, "--engine", engine, "--hparams", "log_every_steps=100")
    rc, err = _cli(*train, env=env)
    assert rc == 0, err[-3000:]
    assert "progress goes to TrainJob ml/tiny's status" in err
    assert not [line for line in err.splitlines() if "warning" in line and "status" in line]
    reports = server.accepted
    assert set(server.codes()) == {200}, server.codes()
    percents = [r["progressPercentage"] for r in reports]
    assert percents == sorted(percents) and percents[-1] == 100, percents
    assert len({p for p in percents if p < 100}) >= 2, (percents, err[-3000:])
    assert all("loss" in _metrics(r) for r in reports[:-1])
    # An evaluation at a quarter of the steps reaches a report before the end.
    assert any("eval_accuracy" in _metrics(r) for r in reports[:-1]), reports
    final = _metrics(reports[-1])
    assert final["global_step"] == str(steps) and reports[-1]["estimatedRemainingSeconds"] == 0
    assert 0 < float(final["eval_accuracy"]) <= 1 and float(final["eval_loss"]) > 0, final
    # A rerun of the finished model dir trains nothing and says so: 100%
    # with the final evaluation.
    before = len(reports)
    rc, err = _cli(*train, env=env)
    assert rc == 0 and "nothing to train" in err, err[-3000:]
    again = server.accepted[before:]
    assert len(again) == 1 and again[0]["progressPercentage"] == 100, again
    assert _metrics(again[0])["eval_accuracy"] == final["eval_accuracy"]
