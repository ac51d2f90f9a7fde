"""Tests of estimator_keras.distribute and the `cluster` subcommand.

Launcher tests run a tiny Python program per task instead of TensorFlow; every
launch has a small timeout and every test checks by PID that nothing survived.
"""

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from estimator_keras.distribute import groups, launcher
from estimator_keras.distribute.launcher import (ClusterInterrupted, ClusterTaskError,
                                                 ClusterTimeoutError, free_ports,
                                                 launch_local_cluster)
from estimator_keras.distribute.strategy import (choose_strategy, global_batch_size,
                                                 make_train_distribute, num_replicas)
from estimator_keras.distribute.tf_config import ClusterInfo, build_tf_config, parse_tf_config
from estimator_keras.errors import ClusterConfigError, ConfigError, UsageError
from experiments.commands import cluster as cluster_cmd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tf_config(cluster_spec, task_type=None, index=0):
    config = {"cluster": cluster_spec}
    if task_type is not None:
        config["task"] = {"type": task_type, "index": index}
    return json.dumps(config)


def config_error(value):
    with pytest.raises(ClusterConfigError) as info:
        parse_tf_config(value)
    return str(info.value)


# --------------------------------------------------------------------------- TF_CONFIG

def test_no_tf_config_is_local():
    for info in (parse_tf_config(env={}), parse_tf_config(""), parse_tf_config("  "),
                 parse_tf_config("{}"), parse_tf_config('{"cluster": {}}'),
                 parse_tf_config('{"cluster": {}, "task": {"type": "worker", "index": 0}}')):
        assert not info.is_distributed
        assert info.is_chief and not info.is_evaluator
        assert info.num_workers == 1 and not info.has_ps
        assert info.task_address is None


def test_reads_environment():
    value = tf_config({"chief": ["h0:1"], "worker": ["h1:1", "h2:1"]}, "worker", 1)
    info = parse_tf_config(env={"TF_CONFIG": value})
    assert info.is_distributed and not info.is_chief
    assert (info.task_type, info.task_index, info.task_name) == ("worker", 1, "worker-1")
    assert info.num_workers == 3 and info.task_address == "h2:1"


def test_valid_ps_cluster_and_evaluator():
    spec = {"chief": ["h0:2222"], "worker": ["h1:2222"], "ps": ["h2:2222"]}
    ps = parse_tf_config(tf_config(spec, "ps", 0))
    assert ps.has_ps and ps.num_workers == 2 and ps.task_type == "ps"
    evaluator = parse_tf_config(tf_config(spec, "evaluator", 0))
    assert evaluator.is_evaluator and not evaluator.is_chief and evaluator.task_address is None
    chief_only = parse_tf_config(tf_config({"chief": ["[::1]:2222"]}, "chief", 0))
    assert chief_only.is_distributed and chief_only.num_workers == 1
    # A string index is what some launchers write; TF accepts it.
    assert parse_tf_config(
        '{"cluster": {"chief": ["h:1"]}, "task": {"type": "chief", "index": "0"}}').is_chief


def test_invalid_json_names_position():
    text = '{"cluster": {"chief": ["h:1"],}}'
    message = config_error(text)
    assert "not valid JSON" in message and "near" in message
    # Where Python's json points (its wording and column changed in 3.13).
    try:
        json.loads(text)
    except json.JSONDecodeError as e:
        where, pos = f"line {e.lineno} column {e.colno} (character {e.pos})", e.pos
    assert where in message, message
    assert pos in (29, 30)  # the trailing comma, or the quote it lacks after it


def test_not_an_object():
    message = config_error('["chief"]')
    assert "must be a JSON object" in message and '["chief"]' in message


def test_cluster_not_a_mapping():
    message = config_error('{"cluster": ["h0:1", "h1:1"], "task": {"type": "chief"}}')
    assert "'cluster' must be an object" in message and '["h0:1", "h1:1"]' in message


def test_cluster_type_not_a_list():
    message = config_error(tf_config({"chief": "h0:1"}, "chief"))
    assert "cluster['chief'] must be a list" in message and '"h0:1"' in message


def test_empty_address_list():
    message = config_error(tf_config({"chief": ["h0:1"], "worker": []}, "chief"))
    assert "cluster['worker'] is an empty list" in message


@pytest.mark.parametrize("address, expected", [
    ("localhost", "has no port"),
    (":2222", "has no port"),
    ("h0:http", "port 'http' is not a number"),
    ("h0:70000", "port 70000 is out of range"),
    ("h0:0", "port 0 is out of range"),
    (2222, "not a string"),
])
def test_bad_address(address, expected):
    message = config_error(tf_config({"chief": ["h0:1"], "worker": [address]}, "chief"))
    assert "cluster['worker'][0]" in message and expected in message
    assert repr(address) in message or str(address) in message


def test_unknown_task_type_lists_allowed():
    message = config_error(tf_config({"master": ["h0:1"], "worker": ["h1:1"]}, "worker"))
    assert "unknown task type(s) 'master'" in message
    assert "chief, worker, ps, evaluator" in message and "old name of 'chief'" in message


def test_no_chief():
    message = config_error(tf_config({"worker": ["h0:1", "h1:1"]}, "worker"))
    assert "no 'chief'" in message and "requires an explicit chief" in message
    assert '"worker": ["h0:1", "h1:1"]' in message


def test_more_than_one_chief():
    message = config_error(tf_config({"chief": ["h0:1", "h1:1"]}, "chief"))
    assert "2 chiefs" in message and '["h0:1", "h1:1"]' in message
    assert "exactly one" in message


def test_evaluator_inside_cluster():
    message = config_error(tf_config({"chief": ["h0:1"], "evaluator": ["h1:1"]}, "evaluator"))
    assert "lists an 'evaluator'" in message and '["h1:1"]' in message
    assert "outside the cluster spec" in message


def test_duplicate_addresses_name_both_tasks():
    message = config_error(tf_config({"chief": ["h0:1"], "worker": ["h1:1", "h0:1"]}, "chief"))
    assert "'h0:1'" in message and "chief-0 and worker-1" in message


def test_ps_without_training_tasks():
    message = config_error(tf_config({"ps": ["h0:1"]}, "ps"))
    assert "parameter servers" in message and "no 'chief' or 'worker'" in message
    assert '["h0:1"]' in message


def test_task_missing_lists_cluster():
    message = config_error(tf_config({"chief": ["h0:1"], "worker": ["h1:1", "h2:1"]}))
    assert "no 'task'" in message
    assert "chief (index 0), worker (indices 0-1)" in message


def test_task_type_not_in_cluster():
    message = config_error(tf_config({"chief": ["h0:1"]}, "ps", 0))
    assert "type 'ps'" in message and "does not have" in message
    assert "the cluster has: chief (index 0)" in message


def test_task_index_out_of_range():
    message = config_error(tf_config({"chief": ["h0:1"], "worker": ["h1:1"]}, "worker", 1))
    assert "index 1 is out of range for 'worker'" in message
    assert "worker (index 0)" in message


@pytest.mark.parametrize("task, expected", [
    ({"index": 0}, "has no 'type'"),
    ({"type": "boss", "index": 0}, "task type 'boss' is unknown"),
    ({"type": "chief", "index": -1}, "non-negative integer; got -1"),
    ({"type": "chief", "index": "x"}, "non-negative integer; got 'x'"),
    ({"type": "evaluator", "index": 1}, "evaluator's index must be 0"),
])
def test_bad_task(task, expected):
    value = json.dumps({"cluster": {"chief": ["h0:1"]}, "task": task})
    assert expected in config_error(value)


def test_task_without_cluster():
    message = config_error('{"task": {"type": "evaluator", "index": 0}}')
    assert "has no cluster" in message and '"evaluator"' in message


def test_build_tf_config_round_trip_and_validates():
    spec = {"chief": ["127.0.0.1:5000"], "ps": ["127.0.0.1:5001"]}
    info = parse_tf_config(build_tf_config(spec, "ps", 0))
    assert info.cluster == spec and info.task_name == "ps-0"
    with pytest.raises(ClusterConfigError, match="out of range"):
        build_tf_config(spec, "ps", 1)


def test_free_ports_distinct_and_bindable():
    import socket
    ports = free_ports(6)
    assert len(set(ports)) == 6
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


# --------------------------------------------------------------------------- strategies

LOCAL = ClusterInfo({}, "chief", 0)
CHIEF_ONLY = ClusterInfo({"chief": ["h:1"]}, "chief", 0)
MULTI = {"chief": ["h:1"], "worker": ["h:2"]}
PS = {"chief": ["h:1"], "worker": ["h:2"], "ps": ["h:3"]}


@pytest.mark.parametrize("info, gpus, expected", [
    (LOCAL, 0, "none"),
    (LOCAL, 1, "none"),
    (LOCAL, 2, "mirrored"),
    (CHIEF_ONLY, 4, "mirrored"),
    (CHIEF_ONLY, 0, "none"),
    (ClusterInfo(MULTI, "chief", 0), 0, "multi_worker_mirrored"),
    (ClusterInfo(MULTI, "worker", 0), 2, "multi_worker_mirrored"),
    (ClusterInfo(PS, "worker", 0), 0, "parameter_server"),
    (ClusterInfo(PS, "ps", 0), 8, "parameter_server"),
    (ClusterInfo({"chief": ["h:1"], "ps": ["h:3"]}, "chief", 0), 0, "parameter_server"),
    (ClusterInfo(MULTI, "evaluator", 0), 2, "none"),
    (ClusterInfo(PS, "evaluator", 0), 0, "none"),
])
def test_auto_strategy_table(info, gpus, expected):
    assert choose_strategy("auto", info, gpus) == expected


def test_unknown_strategy_lists_choices():
    with pytest.raises(ConfigError) as info:
        choose_strategy("horovod", LOCAL, 0)
    assert "'horovod'" in str(info.value)
    assert "auto, none, mirrored, multi_worker_mirrored, parameter_server" in str(info.value)
    with pytest.raises(ConfigError, match="non-negative integer"):
        choose_strategy("auto", LOCAL, -1)


def test_explicit_strategy_conflicts():
    with pytest.raises(ConfigError, match="needs parameter servers.*no 'ps'"):
        choose_strategy("parameter_server", ClusterInfo(MULTI, "chief", 0), 0)
    with pytest.raises(ConfigError, match="needs parameter servers"):
        choose_strategy("parameter_server", LOCAL, 0)
    with pytest.raises(ConfigError, match="multi_worker_mirrored' cannot run.*ps"):
        choose_strategy("multi_worker_mirrored", ClusterInfo(PS, "chief", 0), 0)
    with pytest.raises(ConfigError, match="one machine.*2 training tasks"):
        choose_strategy("mirrored", ClusterInfo(MULTI, "chief", 0), 2)
    with pytest.raises(ConfigError, match="independent copies"):
        choose_strategy("none", ClusterInfo(MULTI, "worker", 0), 0)


def test_explicit_strategies_that_fit():
    assert choose_strategy("mirrored", LOCAL, 0) == "mirrored"
    assert choose_strategy("none", LOCAL, 4) == "none"
    assert choose_strategy("none", ClusterInfo(PS, "chief", 0), 0) == "none"
    assert choose_strategy("multi_worker_mirrored", CHIEF_ONLY, 0) == "multi_worker_mirrored"
    assert choose_strategy("parameter_server", ClusterInfo(PS, "ps", 0), 0) == "parameter_server"


def test_evaluator_always_gets_none(caplog):
    caplog.set_level("INFO", logger="estimator_keras.distribute.strategy")
    assert choose_strategy("multi_worker_mirrored", ClusterInfo(MULTI, "evaluator", 0), 0) == "none"
    assert "Evaluator task" in caplog.text
    assert choose_strategy("parameter_server", ClusterInfo(PS, "evaluator", 0), 0) == "none"


def test_strategy_objects_without_tensorflow():
    class Fake:
        num_replicas_in_sync = 4
    assert make_train_distribute("none") is None
    assert make_train_distribute("parameter_server") is None
    assert num_replicas(None) == 1 and num_replicas(Fake()) == 4
    assert global_batch_size(32, None) == 32 and global_batch_size(32, Fake()) == 128
    with pytest.raises(ConfigError, match="choose_strategy"):
        make_train_distribute("auto")
    with pytest.raises(ConfigError, match="positive integer"):
        global_batch_size(0, None)
    with pytest.raises(ConfigError, match="evaluator"):
        make_train_distribute("multi_worker_mirrored",
                              cluster_info=ClusterInfo(MULTI, "evaluator", 0))
    with pytest.raises(ConfigError, match="ps"):
        make_train_distribute("multi_worker_mirrored", cluster_info=ClusterInfo(PS, "chief", 0))


def _run_python(code, timeout):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_parsing_and_choice_do_not_import_tensorflow():
    proc = _run_python("""
        import sys
        from estimator_keras.distribute import strategy, tf_config
        info = tf_config.parse_tf_config('{"cluster": {"chief": ["h:1"], "ps": ["h:2"]},'
                                         ' "task": {"type": "ps", "index": 0}}')
        assert strategy.choose_strategy("auto", info, 0) == "parameter_server"
        assert strategy.make_train_distribute("parameter_server") is None
        assert "tensorflow" not in sys.modules
        print("ok")
    """, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_mirrored_on_two_cpu_devices_reduces():
    # A separate process: logical devices and strategies must be set up before
    # any other TensorFlow op, and the default all-reduce would hang here.
    proc = _run_python("""
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        from estimator_keras.distribute.strategy import (make_train_distribute, num_replicas,
                                                         global_batch_size)
        strategy = make_train_distribute("mirrored", num_gpus=0)
        assert isinstance(strategy, tf.distribute.MirroredStrategy)
        assert num_replicas(strategy) == 2 and global_batch_size(16, strategy) == 32
        per_replica = strategy.run(lambda: tf.constant(1.5))
        total = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
        print("sum", float(total))
    """, timeout=90)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sum 3.0" in proc.stdout


MWMS_TASK = """
import json
import tensorflow as tf  # imported only: no op may run before the strategy exists
from estimator_keras.distribute.strategy import (choose_strategy, make_train_distribute,
                                                 num_replicas)
from estimator_keras.distribute.tf_config import parse_tf_config
info = parse_tf_config()
name = choose_strategy("auto", info, 0)
strategy = make_train_distribute(name)
print(info.task_name, name, num_replicas(strategy), flush=True)
if strategy is not None:
    total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(2.0)), axis=None)
    print("sum", float(total), flush=True)
    # Where this task's server listens, from the kernel's socket tables.
    port = "%04X" % int(info.cluster[info.task_type][info.task_index].rsplit(":", 1)[1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in open(table).read().splitlines()[1:]:
            local, state = row.split()[1], row.split()[3]
            if state == "0A" and local.endswith(":" + port):
                print("listens", table[-4:], local.split(":")[0], flush=True)
    # The training group's collectives across the two processes (process 0:
    # the chief), and its refusal of work one process does alone.
    import numpy as np
    from estimator_keras.distribute import groups
    from estimator_keras.errors import ConfigError
    group = groups.of(strategy)
    rank = 0 if info.task_type == "chief" else 1 + info.task_index
    sums = group.sums([np.array([rank + 1, 10], np.int32), np.full(2, 0.25 * rank, np.float32)])
    first = group.from_process_0({"step": np.int32(100 + rank), "w": np.arange(3.0) * (rank + 1)})
    try:
        with group.alone():
            alone = "ran"
    except ConfigError as e:
        alone = str(e)
    print("group", json.dumps({
        "multi_process": group.multi_process, "mean": group.mean([rank, 1.0]),
        "sums": [v.tolist() for v in sums], "sum_dtypes": [v.dtype.name for v in sums],
        "first": {k: np.asarray(v).tolist() for k, v in first.items()}, "alone": alone}),
        flush=True)
"""

# Addresses in /proc/net/tcp{,6}: every interface, and loopback.
WILDCARDS = {"0" * 8, "0" * 32}
LOOPBACKS = {"0100007F", "00000000000000000000000001000000",
             "0000000000000000FFFF00000100007F"}


def test_multi_worker_mirrored_on_a_local_cluster(tmp_path):
    # Real TensorFlow: chief + worker build the strategy from the TF_CONFIG the
    # launcher wrote and all-reduce across processes; the evaluator stays out.
    script = tmp_path / "task.py"
    script.write_text(MWMS_TASK)
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    result = launch_local_cluster([sys.executable, str(script)], workers=1, evaluator=True,
                                  log_dir=tmp_path / "logs", timeout=90, env=env, echo=False,
                                  evaluator_grace=30, kill_grace=2)
    assert result.returncodes == {"chief-0": 0, "worker-0": 0, "evaluator-0": 0}
    for name in ("chief-0", "worker-0"):
        log = (tmp_path / "logs" / f"{name}.log").read_text()
        assert f"{name} multi_worker_mirrored 2\n" in log and "sum 4.0\n" in log
        # TensorFlow binds its server on every interface (what the launcher
        # warns about). Should it ever bind loopback only, this fails: then
        # drop launcher.ALL_INTERFACES_WARNING.
        listening = {line.split()[2] for line in log.splitlines()
                     if line.startswith("listens ")}
        assert listening and listening <= WILDCARDS, log
        assert not listening & LOOPBACKS
    assert "evaluator-0 none 1\n" in (tmp_path / "logs" / "evaluator-0.log").read_text()
    # Both processes get the group's answers, not their own values.
    for name in ("chief-0", "worker-0"):
        log = (tmp_path / "logs" / f"{name}.log").read_text()
        found = json.loads(next(line for line in log.splitlines()
                                if line.startswith("group "))[len("group "):])
        assert found["multi_process"] is True, found
        assert found["sums"] == [[3, 20], [0.25, 0.25]], found
        assert found["sum_dtypes"] == ["int32", "float32"], found
        assert found["mean"] == [0.5, 1.0], found
        assert found["first"] == {"step": 100, "w": [0.0, 1.0, 2.0]}, found
        assert "alone() is not implemented across the processes" in found["alone"], found
        assert "MultiWorkerMirroredStrategy" in found["alone"], found


def test_a_group_of_several_processes_refuses_what_it_does_not_implement():
    # No default answers for a group with this process's own values.
    class Several(groups.TrainingGroup):
        description = "3 processes of a test"
        multi_process = True

    group = Several()
    calls = {"sums": lambda: group.sums([1.0]), "mean": lambda: group.mean([1.0]),
             "from_process_0": lambda: group.from_process_0(1), "alone": group.alone}
    for method, call in calls.items():
        with pytest.raises(ConfigError, match=rf"^{method}\(\) is not implemented across the "
                                              rf"processes of 3 processes of a test"):
            call()
    # One process alone: its own values are the group's.
    assert groups.OneProcess().sums([2.0]) == [2.0] and groups.OneProcess().from_process_0(3) == 3


# --------------------------------------------------------------------------- launcher

CHILD = r'''
import json, os, signal, sys, time
config = json.loads(os.environ["TF_CONFIG"])
name = "%s-%s" % (config["task"]["type"], config["task"]["index"])
out = sys.argv[2]
with open(os.path.join(out, name + ".tfconfig"), "w") as f:
    f.write(os.environ["TF_CONFIG"])
with open(os.path.join(out, name + ".pid.tmp"), "w") as f:
    f.write(str(os.getpid()))
os.rename(os.path.join(out, name + ".pid.tmp"), os.path.join(out, name + ".pid"))
action = json.loads(sys.argv[1]).get(name, "exit:0")
print("[%s] names itself" % name)  # as a task of a real cluster does
for i in range(30):
    print("%s line %d" % (name, i))
sys.stdout.flush()
kind, _, arg = action.partition(":")
if kind == "exit":
    sys.exit(int(arg))
if kind == "delay":
    seconds, code = arg.split(":")
    time.sleep(float(seconds))
    sys.exit(int(code))
if kind == "after":  # exit once another task is ready, e.g. "after:ps-0:0"
    other, code = arg.split(":")
    end = time.time() + 15
    while not os.path.exists(os.path.join(out, other + ".ready")) and time.time() < end:
        time.sleep(0.02)
    sys.exit(int(code))
if kind == "stubborn":
    signal.signal(signal.SIGTERM, lambda *a: print("%s ignores SIGTERM" % name, flush=True))
open(os.path.join(out, name + ".ready"), "w").close()
while True:
    time.sleep(0.2)
'''


@pytest.fixture
def child(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    out = tmp_path / "out"
    out.mkdir()

    def command(actions):
        return [sys.executable, str(script), json.dumps(actions), str(out)]

    command.out = out
    return command


def wait_for_pid(out, name, bound=10.0):
    path = out / f"{name}.pid"
    end = time.monotonic() + bound
    while not path.exists():
        assert time.monotonic() < end, f"{name} never started"
        time.sleep(0.02)
    return int(path.read_text())


def pids_of(out):
    return {p.name[:-4]: int(p.read_text()) for p in out.glob("*.pid")}


def assert_gone(pids):
    alive = []
    for name, pid in pids.items():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        alive.append(f"{name} (pid {pid})")
        os.kill(pid, signal.SIGKILL)  # do not leak it into the other tests
    assert not alive, f"still alive: {alive}"


def launch(command, **kwargs):
    kwargs.setdefault("timeout", 20)
    kwargs.setdefault("kill_grace", 1.0)
    kwargs.setdefault("echo", False)
    started = time.monotonic()
    try:
        return launch_local_cluster(command, **kwargs)
    finally:
        # Whatever happened, the launcher must not have exceeded its own bound.
        assert time.monotonic() - started < kwargs["timeout"] + 4 * kwargs["kill_grace"] + 15


def test_success_ends_ps_by_pid_and_logs_every_task(child, tmp_path, capsys):
    command = child({"chief-0": "after:ps-0:0", "ps-0": "sleep", "evaluator-0": "delay:0.5:0"})
    result = launch(command, workers=2, ps=1, evaluator=True, log_dir=tmp_path / "logs",
                    echo=True)
    names = ["chief-0", "worker-0", "worker-1", "ps-0", "evaluator-0"]
    assert list(result.returncodes) == names
    assert result.ended_by_launcher == ("ps-0",)
    assert result.returncodes["ps-0"] == -signal.SIGTERM
    assert all(result.returncodes[n] == 0 for n in names if n != "ps-0")
    pids = pids_of(child.out)
    assert pids == result.pids
    assert_gone(pids)
    assert 0 < result.wall_time < 20

    for name in names:
        log = (tmp_path / "logs" / f"{name}.log").read_text()
        assert result.log_paths[name] == str(tmp_path / "logs" / f"{name}.log")
        assert f"{name} line 0\n" in log and f"{name} line 29\n" in log
    echoed = capsys.readouterr().out
    assert "[worker-1] worker-1 line 7\n" in echoed and "[ps-0] ps-0 line 29\n" in echoed
    # A line the task prefixed itself keeps one prefix.
    assert "[worker-1] names itself\n" in echoed and "[worker-1] [worker-1]" not in echoed

    configs = {n: parse_tf_config((child.out / f"{n}.tfconfig").read_text()) for n in names}
    spec = configs["chief-0"].cluster
    assert set(spec) == {"chief", "worker", "ps"} and len(spec["worker"]) == 2
    addresses = [a for group in spec.values() for a in group]
    assert len(set(addresses)) == 4 and all(a.startswith("127.0.0.1:") for a in addresses)
    for name, info in configs.items():
        assert info.cluster == spec and info.task_name == name
    assert configs["evaluator-0"].is_evaluator


def test_stubborn_ps_is_killed_and_evaluator_ended_after_grace(child, tmp_path):
    command = child({"chief-0": "after:ps-0:0", "ps-0": "stubborn", "evaluator-0": "sleep"})
    result = launch(command, workers=0, ps=1, evaluator=True, log_dir=tmp_path / "logs",
                    evaluator_grace=0.5, kill_grace=0.5)
    assert result.returncodes["chief-0"] == 0
    assert set(result.ended_by_launcher) == {"ps-0", "evaluator-0"}
    assert result.returncodes["ps-0"] == -signal.SIGKILL
    assert "ps-0 ignores SIGTERM" in (tmp_path / "logs" / "ps-0.log").read_text()
    assert_gone(pids_of(child.out))


def test_failing_task_named_and_others_stopped(child, tmp_path):
    command = child({"worker-1": "exit:3", "chief-0": "sleep", "worker-0": "sleep",
                     "ps-0": "sleep", "evaluator-0": "sleep"})
    with pytest.raises(ClusterTaskError) as info:
        launch(command, workers=2, ps=1, evaluator=True, log_dir=tmp_path / "logs")
    error = info.value
    assert error.task == "worker-1" and error.returncode == 3
    message = str(error)
    assert "task worker-1 exited with status 3" in message
    assert str(tmp_path / "logs" / "worker-1.log") in message
    # The last 20 of its 30 lines, and not the earlier ones.
    assert "worker-1 line 29" in message and "worker-1 line 10" in message
    assert "worker-1 line 9\n" not in message
    assert len(error.last_lines) == 20
    assert set(error.result.ended_by_launcher) == {"chief-0", "worker-0", "ps-0", "evaluator-0"}
    assert_gone(pids_of(child.out))


@pytest.mark.parametrize("failing", ["ps-0", "evaluator-0"])
def test_ps_or_evaluator_failure_fails_the_run(child, tmp_path, failing):
    command = child({"chief-0": "sleep", "ps-0": "sleep", "evaluator-0": "sleep",
                     failing: "exit:7"})
    with pytest.raises(ClusterTaskError, match=f"task {failing} exited with status 7"):
        launch(command, workers=0, ps=1, evaluator=True, log_dir=tmp_path / "logs")
    assert_gone(pids_of(child.out))


def test_worker_killed_mid_run(child, tmp_path):
    command = child({"chief-0": "sleep", "worker-0": "sleep", "ps-0": "sleep"})

    def kill_worker():
        os.kill(wait_for_pid(child.out, "worker-0"), signal.SIGKILL)

    killer = threading.Thread(target=kill_worker, daemon=True)
    killer.start()
    started = time.monotonic()
    with pytest.raises(ClusterTaskError) as info:
        launch(command, workers=1, ps=1, log_dir=tmp_path / "logs", timeout=30)
    assert time.monotonic() - started < 10
    killer.join(timeout=5)
    assert info.value.task == "worker-0" and info.value.returncode == -signal.SIGKILL
    assert "task worker-0 was killed by signal SIGKILL (9)" in str(info.value)
    assert_gone(pids_of(child.out))


def test_total_timeout_stops_everything(child, tmp_path):
    command = child({"chief-0": "sleep", "worker-0": "stubborn", "ps-0": "sleep"})
    started = time.monotonic()
    with pytest.raises(ClusterTimeoutError) as info:
        launch(command, workers=1, ps=1, log_dir=tmp_path / "logs", timeout=1.5,
               kill_grace=0.5)
    assert 1.5 <= time.monotonic() - started < 8
    message = str(info.value)
    assert "did not finish within 1.5 s" in message
    assert "still running: chief-0, worker-0, ps-0" in message
    assert info.value.running == ["chief-0", "worker-0", "ps-0"]
    # SIGKILL unless the timeout came before it installed its SIGTERM handler.
    assert info.value.result.returncodes["worker-0"] in (-signal.SIGKILL, -signal.SIGTERM)
    assert_gone(pids_of(child.out))


def test_timeout_while_evaluator_runs(child, tmp_path):
    command = child({"evaluator-0": "sleep"})
    with pytest.raises(ClusterTimeoutError, match="still running: evaluator-0"):
        launch(command, workers=0, evaluator=True, log_dir=tmp_path / "logs", timeout=1.5,
               evaluator_grace=60)
    assert_gone(pids_of(child.out))


def test_keyboard_interrupt_stops_all(child, tmp_path, monkeypatch):
    def interrupted(tasks, *args):
        for task in tasks:
            wait_for_pid(child.out, task.name)
        raise KeyboardInterrupt

    monkeypatch.setattr(launcher, "_supervise", interrupted)
    with pytest.raises(KeyboardInterrupt):
        launch(child({"chief-0": "sleep", "ps-0": "stubborn"}), workers=0, ps=1,
               log_dir=tmp_path / "logs", kill_grace=0.5)
    pids = pids_of(child.out)
    assert set(pids) == {"chief-0", "ps-0"}
    assert_gone(pids)


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="the launcher handles SIGTERM only in the main thread")
def test_sigterm_to_launcher_stops_all(child, tmp_path):
    command = child({"chief-0": "sleep", "worker-0": "sleep"})

    def terminate_launcher():
        wait_for_pid(child.out, "worker-0")
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.getsignal(signal.SIGTERM)
    threading.Thread(target=terminate_launcher, daemon=True).start()
    with pytest.raises(ClusterInterrupted, match="SIGTERM"):
        launch(command, workers=1, log_dir=tmp_path / "logs")
    assert signal.getsignal(signal.SIGTERM) == previous
    assert_gone(pids_of(child.out))


def test_launcher_argument_errors(tmp_path):
    with pytest.raises(UsageError, match="list of arguments"):
        launch_local_cluster("python train.py", log_dir=tmp_path)
    with pytest.raises(UsageError, match="workers"):
        launch_local_cluster([sys.executable], workers=-1, log_dir=tmp_path)
    with pytest.raises(UsageError, match="timeout"):
        launch_local_cluster([sys.executable], timeout=0, log_dir=tmp_path)


def test_command_that_cannot_start(tmp_path):
    with pytest.raises(launcher.ClusterError, match="could not start task chief-0"):
        launch_local_cluster([str(tmp_path / "missing-program")], workers=0, log_dir=tmp_path,
                             timeout=10)


# --------------------------------------------------------------------------- CLI

def parse_cli(argv):
    parser = argparse.ArgumentParser(prog="experiments")
    cluster_cmd.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_known_args(argv)


def test_cli_forwards_unknown_flags_and_adds_ps_strategy(monkeypatch, tmp_path, capsys):
    calls = []

    def fake_launch(command, **kwargs):
        calls.append((command, kwargs))
        return launcher.ClusterResult({"chief-0": 0, "ps-0": -15}, {"chief-0": "c.log",
                                      "ps-0": "p.log"}, {"chief-0": 1, "ps-0": 2}, ("ps-0",),
                                      1.0, str(tmp_path))

    monkeypatch.setattr(cluster_cmd.launcher, "launch_local_cluster", fake_launch)
    # ps and evaluator need the estimator engine, which only TF 2.15 has
    # (test_cluster_checks.py tests that check).
    monkeypatch.setattr(cluster_cmd, "_check_engine", lambda args, command: None)
    args, extra = parse_cli(["cluster", "mnist_cnn", "--workers", "1", "--ps", "1", "--evaluator",
                             "--model-dir", "runs/m", "--max-steps", "10", "--eval-every", "5",
                             "--hparams=lr=0.1,units=8", "--log-dir", str(tmp_path),
                             "--timeout", "60"])
    assert extra == ["--max-steps", "10", "--eval-every", "5", "--hparams=lr=0.1,units=8"]
    assert cluster_cmd.run(args, extra) == 0
    command, kwargs = calls[0]
    assert command == [sys.executable, "-m", "experiments", "train", "mnist_cnn", "--model-dir",
                       "runs/m", "--max-steps", "10", "--eval-every", "5",
                       "--hparams=lr=0.1,units=8", "--strategy", "parameter_server",
                       "--preemption-grace", "20"]
    assert kwargs["workers"] == 1 and kwargs["ps"] == 1 and kwargs["evaluator"] is True
    assert kwargs["timeout"] == 60 and kwargs["log_dir"] == str(tmp_path)
    # The tasks import the same copy of the package as this process (the
    # checkout, or site-packages when installed).
    assert kwargs["env"]["PYTHONPATH"].split(os.pathsep)[0] == \
        os.path.dirname(os.path.dirname(os.path.abspath(cluster_cmd.__file__)))
    out = capsys.readouterr().out
    assert f"logs in {tmp_path}" in out and "ps-0" in out and "ended by the launcher" in out

    args, extra = parse_cli(["cluster", "mnist_cnn", "--workers", "2", "--model-dir", "d", "--ps",
                             "1", "--strategy=none", "--log-dir", str(tmp_path)])
    cluster_cmd.run(args, extra)
    assert calls[-1][0][-3] == "--strategy=none" and calls[-1][0].count("--strategy") == 0

    args, extra = parse_cli(["cluster", "mnist_cnn", "--workers", "1", "--model-dir", "d",
                             "--log-dir", str(tmp_path), "--", "--batch-size", "8"])
    cluster_cmd.run(args, extra)
    assert calls[-1][0][-4:-2] == ["--batch-size", "8"] and "--strategy" not in calls[-1][0]


def test_cli_requires_workers_and_model_dir(capsys):
    with pytest.raises(SystemExit):
        parse_cli(["cluster", "mnist_cnn", "--model-dir", "d"])
    with pytest.raises(SystemExit):
        parse_cli(["cluster", "mnist_cnn", "--workers", "1"])
    args, extra = parse_cli(["cluster", "mnist_cnn", "--workers", "-1", "--model-dir", "d"])
    with pytest.raises(UsageError, match="--workers"):
        cluster_cmd.run(args, extra)


def test_cli_says_once_that_the_cluster_finished(monkeypatch, child, tmp_path, capsys, caplog):
    monkeypatch.setattr(cluster_cmd, "_train_argv",
                        lambda args, extra: child({"chief-0": "exit:0", "worker-0": "exit:0"}))
    args, extra = parse_cli(["cluster", "mnist_cnn", "--workers", "1", "--model-dir", "d",
                             "--log-dir", str(tmp_path / "logs"), "--timeout", "20"])
    with caplog.at_level(logging.INFO):
        assert cluster_cmd.run(args, extra) == 0
    captured = capsys.readouterr()
    said = captured.out + captured.err + caplog.text
    assert said.count("Local cluster finished in") == 1, said
    assert "\nLocal cluster finished in" in captured.out
    assert_gone(pids_of(child.out))


def test_cli_failure_prints_last_lines(monkeypatch, child, tmp_path, capsys):
    monkeypatch.setattr(cluster_cmd, "_train_argv",
                        lambda args, extra: child({"chief-0": "exit:4", "worker-0": "sleep"}))
    args, extra = parse_cli(["cluster", "mnist_cnn", "--workers", "1", "--model-dir", "d",
                             "--log-dir", str(tmp_path / "logs"), "--timeout", "20", "--quiet"])
    with pytest.raises(ClusterTaskError, match="chief-0 exited with status 4"):
        cluster_cmd.run(args, extra)
    err = capsys.readouterr().err
    assert "Local cluster FAILED" in err
    assert "chief-0 exited with status 4; last lines of" in err and "chief-0 line 29" in err
    assert "worker-0" in err and "ended by the launcher (SIGTERM)" in err
    assert_gone(pids_of(child.out))
