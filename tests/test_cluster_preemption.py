"""The `cluster` launcher under preemption: SIGTERM is passed on to the
tasks, which get --preemption-grace seconds to save a checkpoint; the ps
tasks outlive the training tasks (the chief saves the variables they hold);
the launcher exits 75 when the training tasks did.

Tasks here are stand-ins (no TensorFlow): they trap SIGTERM, write a file
for the "checkpoint" and exit 75, as `train` does. Every launch is bounded
and every test checks by pid that nothing survived.
"""

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import test_cluster
from support import ROOT, child_env
from estimator_keras.distribute import launcher
from estimator_keras.distribute.launcher import (ClusterInterrupted, ClusterPreempted,
                                                 ClusterTaskError, launch_local_cluster)
from estimator_keras.errors import Preempted

TASK = r'''
import json, os, signal, sys, time
config = json.loads(os.environ["TF_CONFIG"])
name = "%s-%s" % (config["task"]["type"], config["task"]["index"])
out = sys.argv[1]
behaviour = json.loads(sys.argv[2]).get(name, "save")

def mark(what):
    with open(os.path.join(out, name + "." + what + ".tmp"), "w") as f:
        f.write(repr(time.time()))
    os.rename(os.path.join(out, name + "." + what + ".tmp"), os.path.join(out, name + "." + what))

def on_term(signum, frame):
    if not os.path.exists(os.path.join(out, name + ".sigterm")):
        mark("sigterm")  # the first one
    if behaviour == "save":
        time.sleep(0.5)  # writing the checkpoint
        mark("saved")
        sys.exit(75)
    if behaviour == "fail":
        sys.exit(1)
    if behaviour != "stubborn":
        sys.exit(0)

signal.signal(signal.SIGTERM, on_term)
with open(os.path.join(out, name + ".pid"), "w") as f:
    f.write(str(os.getpid()))
mark("ready")
if behaviour.startswith("preempted:"):  # preempted by itself after N seconds
    time.sleep(float(behaviour.split(":")[1]))
    mark("saved")
    sys.exit(75)
while True:
    time.sleep(0.05)
'''

@pytest.fixture
def tasks(tmp_path):
    script = tmp_path / "task.py"
    script.write_text(TASK)
    out = tmp_path / "out"
    out.mkdir()

    def command(behaviours):
        return [sys.executable, str(script), str(out), json.dumps(behaviours)]

    command.out = out
    return command


def marks(out, what):
    return {p.name.split(".")[0]: float(p.read_text()) for p in out.glob(f"*.{what}")}


def wait_ready(out, names, bound=20.0):
    end = time.monotonic() + bound
    while set(marks(out, "ready")) < set(names):
        assert time.monotonic() < end, f"not all of {names} started"
        time.sleep(0.02)


def assert_gone(out):
    test_cluster.assert_gone(test_cluster.pids_of(out))


def sigterm_self_when_ready(out, names):
    def run():
        wait_ready(out, names)
        os.kill(os.getpid(), signal.SIGTERM)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


needs_main_thread = pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(),
    reason="the launcher handles SIGTERM only in the main thread")


@needs_main_thread
def test_sigterm_is_passed_on_and_the_launcher_exits_75_after_the_checkpoint(tasks, tmp_path):
    names = ["chief-0", "worker-0", "ps-0", "evaluator-0"]
    command = tasks({"ps-0": "quit", "evaluator-0": "quit"})
    sigterm_self_when_ready(tasks.out, names)
    started = time.monotonic()
    with pytest.raises(ClusterPreempted) as info:
        launch_local_cluster(command, workers=1, ps=1, evaluator=True, log_dir=tmp_path / "logs",
                             timeout=60, echo=False, kill_grace=1, preemption_grace=10)
    assert time.monotonic() - started < 15
    error = info.value
    assert isinstance(error, Preempted) and error.exit_code == 75
    assert "Rerun the same command to resume" in str(error)
    codes = error.result.returncodes
    assert codes["chief-0"] == 75 and codes["worker-0"] == 75
    saved = marks(tasks.out, "saved")
    assert set(saved) == {"chief-0", "worker-0"}
    # The ps tasks were asked to stop only once the training tasks had saved.
    terms = marks(tasks.out, "sigterm")
    assert terms["ps-0"] >= max(saved.values())
    assert terms["chief-0"] < saved["chief-0"] and terms["evaluator-0"] < saved["chief-0"]
    assert_gone(tasks.out)


@needs_main_thread
def test_tasks_that_do_not_stop_are_killed_after_the_grace(tasks, tmp_path, monkeypatch):
    monkeypatch.setattr(launcher, "PREEMPTION_MARGIN", 0.3)
    command = tasks({"chief-0": "stubborn", "worker-0": "save"})
    sigterm_self_when_ready(tasks.out, ["chief-0", "worker-0"])
    with pytest.raises(ClusterInterrupted) as info:
        launch_local_cluster(command, workers=1, log_dir=tmp_path / "logs", timeout=60,
                             echo=False, kill_grace=0.5, preemption_grace=1.5)
    ended = time.time()
    assert not isinstance(info.value, ClusterPreempted)
    assert info.value.result.returncodes["chief-0"] == -signal.SIGKILL
    # It had the whole grace (and the margin), not the kill grace.
    waited = ended - marks(tasks.out, "sigterm")["chief-0"]
    assert 1.5 <= waited < 1.5 + 0.3 + 0.5 + 5
    assert_gone(tasks.out)


@needs_main_thread
def test_a_chief_that_fails_on_sigterm_is_no_preemption(tasks, tmp_path):
    command = tasks({"chief-0": "fail", "worker-0": "save"})
    sigterm_self_when_ready(tasks.out, ["chief-0", "worker-0"])
    with pytest.raises(ClusterInterrupted) as info:
        launch_local_cluster(command, workers=1, log_dir=tmp_path / "logs", timeout=60,
                             echo=False, kill_grace=1, preemption_grace=10)
    assert not isinstance(info.value, ClusterPreempted)
    assert info.value.result.returncodes == {"chief-0": 1, "worker-0": 75}
    assert_gone(tasks.out)


def test_a_task_preempted_by_itself_while_the_chief_fails_names_the_chief(tasks, tmp_path):
    command = tasks({"worker-0": "preempted:0.3", "chief-0": "fail"})
    with pytest.raises(ClusterTaskError) as info:
        launch_local_cluster(command, workers=1, log_dir=tmp_path / "logs", timeout=60,
                             echo=False, kill_grace=1, preemption_grace=10)
    assert info.value.task == "chief-0" and info.value.returncode == 1
    assert_gone(tasks.out)


def test_a_task_preempted_by_itself_gives_the_others_their_grace(tasks, tmp_path, caplog):
    command = tasks({"worker-0": "preempted:0.5", "ps-0": "quit"})
    with caplog.at_level(logging.INFO, logger="estimator_keras.distribute.launcher"):
        with pytest.raises(ClusterPreempted) as info:
            launch_local_cluster(command, workers=1, ps=1, log_dir=tmp_path / "logs",
                                 timeout=60, echo=False, kill_grace=1, preemption_grace=10)
    # Every launch says once which network its tasks use.
    fallback = launcher.FALLBACK_WARNING.split("{")[0]
    said = ["private" if m == launcher.PRIVATE_NETWORK_NOTE else "host"
            for m in (r.getMessage() for r in caplog.records)
            if m in (launcher.PRIVATE_NETWORK_NOTE, launcher.ALL_INTERFACES_WARNING)
            or m.startswith(fallback)]
    assert said == [info.value.result.network]
    assert "task worker-0 exited with status 75" in str(info.value)
    assert info.value.result.returncodes["chief-0"] == 75
    saved = marks(tasks.out, "saved")
    assert set(saved) == {"chief-0", "worker-0"}
    assert marks(tasks.out, "sigterm")["ps-0"] >= saved["chief-0"]
    assert_gone(tasks.out)


# A `python -m experiments cluster ...` whose tasks are the stand-ins: the
# launcher is wrapped to swap the command, everything else is the real CLI.
DRIVER = r'''
import json, sys
from estimator_keras.distribute import launcher
from experiments import cli
real = launcher.launch_local_cluster
def swapped(command, **kwargs):
    with open(sys.argv[3], "w") as f:
        json.dump({"command": command, "preemption_grace": kwargs["preemption_grace"]}, f)
    return real(json.loads(sys.argv[2]), **kwargs)
launcher.launch_local_cluster = swapped
sys.exit(cli.main(sys.argv[4:]))
'''


def test_cli_cluster_exits_75_when_its_tasks_saved(tasks, tmp_path):
    record = tmp_path / "record.json"
    argv = ["cluster", "fashion_mnist_mlp", "--workers", "1", "--model-dir", str(tmp_path / "m"),
            "--log-dir", str(tmp_path / "logs"), "--quiet", "--preemption-grace", "7",
            "--max-steps", "5"]
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, "-", json.dumps(tasks({})), str(record), *argv],
        cwd=ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(tasks.out, ["chief-0", "worker-0"], bound=60)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == Preempted.exit_code, (out, err)
    assert "PREEMPTED" in err and "Rerun the same command to resume" in err
    assert err.count("Rerun the same command") == 1
    recorded = json.loads(record.read_text())
    assert recorded["preemption_grace"] == 7
    train = recorded["command"]
    assert train[:5] == [sys.executable, "-m", "experiments", "train", "fashion_mnist_mlp"]
    assert train[train.index("--preemption-grace") + 1] == "7"
    assert set(marks(tasks.out, "saved")) == {"chief-0", "worker-0"}
    assert_gone(tasks.out)


LAUNCHER_SIGTERM_CASES = sum(1 for _name, _value in list(globals().items())
                             if _name.startswith("test_") and callable(_value))
"""Preemption scenarios of the launcher tried here (the README's count)."""
