"""Keras 3 across processes on JAX's distributed runtime (issue 24): real
processes on 127.0.0.1, each bounded by a timeout and ended by PID.

- two and three processes train as one: identical weights in every process,
  each pipeline on its own share, and the training steps computed on
  processes x batch examples each (tests/jax_child.py); each evaluates its
  share of the eval split, and the combined metrics are one process's;
- every process resumes from process 0's checkpoint, even from a model dir
  of its own that holds none;
- ``cluster --engine keras3 --workers 1``: trains, exports once (process 0),
  writes ``best/`` once, after training, and a rerun of the finished run is
  a no-op on every process;
- SIGTERM to the launcher, or to process 0 alone, stops every process after
  one checkpoint of a step they agree on (exit 75), and a rerun resumes it;
- SIGKILL of a process stops the others, and a rerun resumes.
"""

import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from support import ROOT, checkpoint_steps, child_env, keras3_installed, latest_step

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not keras3_installed() or importlib.util.find_spec("jax") is None,
                       reason="Keras 3 or JAX is not installed (pip install -e '.[jax]')"),
]

TIMEOUT = 300
BATCH = 8  # tests/jax_child.py's
EVAL_EXAMPLES = 72  # tests/jax_child.py's


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tf_config(coordinator, processes, rank):
    cluster = {"chief": [coordinator]}
    if processes > 1:
        # The workers' own addresses are never dialled: JAX joins through the coordinator.
        cluster["worker"] = [f"127.0.0.1:{_free_port()}" for _ in range(processes - 1)]
    task = {"type": "chief", "index": 0} if rank == 0 else {"type": "worker", "index": rank - 1}
    return json.dumps({"cluster": cluster, "task": task})


def _run_group(tmp_path, name, steps, model_dirs):
    """Runs tests/jax_child.py in len(model_dirs) processes, process r on
    model_dirs[r]; returns each process's results (its npz)."""
    processes = len(model_dirs)
    coordinator = f"127.0.0.1:{_free_port()}"
    out = tmp_path / name
    out.mkdir()
    procs = []
    try:
        for rank in range(processes):
            env = child_env(KERAS_BACKEND="jax",
                            TF_CONFIG=_tf_config(coordinator, processes, rank))
            log = open(out / f"process-{rank}.log", "w")
            procs.append(subprocess.Popen(
                [sys.executable, os.path.join(ROOT, "tests", "jax_child.py"),
                 str(model_dirs[rank]), str(out), str(steps)],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True))
            log.close()
        for proc in procs:
            proc.wait(timeout=TIMEOUT)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
    logs = [(out / f"process-{r}.log").read_text()[-3000:] for r in range(processes)]
    assert [p.returncode for p in procs] == [0] * processes, logs
    return [np.load(out / f"process-{r}.npz") for r in range(processes)]


def _weights(result):
    return [result[k] for k in sorted((k for k in result.files if k.startswith("w")),
                                      key=lambda k: int(k[1:]))]


@pytest.mark.parametrize("processes", [2, 3])
def test_processes_train_as_one(processes, tmp_path):
    steps = 12
    results = _run_group(tmp_path, "out", steps, [tmp_path / "model"] * processes)
    weights = sorted(k for k in results[0].files if k.startswith("w"))
    assert weights
    for rank, result in enumerate(results):
        assert int(result["step"]) == steps
        for key in weights:
            np.testing.assert_array_equal(result[key], results[0][key],
                                          err_msg=f"process {rank}, weight {key}")
        # Each pipeline read only its own share of the examples.
        assert len(result["seen"]) >= steps * BATCH
        assert set(result["seen"] % processes) == {rank}
    # The training steps computed on every process's batch: processes x batch each.
    assert float(results[0]["counted"]) == steps * BATCH * processes
    # One writer: process 0's checkpoints; the others write no file, except
    # what TensorFlow's AutoGraph writes while it converts the test's
    # pipeline (its generated modules, and its probe of the temp dir).
    assert any("keras3-checkpoints" in str(p) for p in results[0]["files_written"]), \
        list(results[0]["files_written"])
    system_tmp = tempfile.gettempdir()
    for rank, result in enumerate(results[1:], 1):
        written = [str(p) for p in result["files_written"] if str(p) != system_tmp
                   and not os.path.basename(str(p)).startswith("__autograph_generated_file")]
        assert written == [], (rank, list(result["files_written"]))
    assert latest_step(tmp_path / "model") == steps
    assert not [n for n in os.listdir(tmp_path / "model") if n.startswith(".")]
    # Each process evaluated its own share of the eval split, and the
    # combined metrics are one process's evaluation of the whole split.
    shares = []
    for rank, result in enumerate(results):
        told = [line for line in result["log"] if "evaluation shared by" in str(line)]
        assert len(told) == 1, (rank, list(result["log"]))
        share, whole = map(int, re.search(r"evaluates (\d+) of the (\d+) examples",
                                          str(told[0])).groups())
        assert whole == EVAL_EXAMPLES and share < whole
        shares.append(share)
        assert json.loads(str(result["metrics"])) == json.loads(str(results[0]["metrics"]))
    assert sum(shares) == EVAL_EXAMPLES
    combined = json.loads(str(results[0]["metrics"]))
    alone = json.loads(str(results[0]["alone"]))
    assert set(combined) == set(alone) == {"loss", "accuracy", "examples_seen"}
    assert combined["examples_seen"] == alone["examples_seen"] == EVAL_EXAMPLES
    assert combined["accuracy"] == pytest.approx(alone["accuracy"], abs=1e-6)
    assert combined["loss"] == pytest.approx(alone["loss"], rel=1e-5)


def test_every_process_resumes_from_the_checkpoint_process_0_chose(tmp_path):
    """Process 1 sees an empty model dir of its own (one that is not shared):
    it resumes from process 0's checkpoint all the same, as if the dir were
    shared, and writes nothing."""
    first = tmp_path / "first"
    _run_group(tmp_path, "out-first", 12, [first, first])
    assert latest_step(first) == 12
    shared, apart, empty = tmp_path / "shared", tmp_path / "apart", tmp_path / "empty"
    shutil.copytree(first, shared)
    shutil.copytree(first, apart)
    expected = _run_group(tmp_path, "out-shared", 24, [shared, shared])
    results = _run_group(tmp_path, "out-apart", 24, [apart, empty])
    for rank, result in enumerate(results):
        assert int(result["step"]) == 24
        resumed = [str(line) for line in result["log"] if "resuming from" in str(line)]
        assert resumed and "step 12, process 0's choice" in resumed[0], (rank, resumed)
        for got, want in zip(_weights(result), _weights(expected[rank])):
            np.testing.assert_allclose(got, want, atol=1e-6, err_msg=f"process {rank}")
    assert latest_step(apart) == 24
    assert os.listdir(empty) == []


def _cluster_args(fashion_data, model_dir, log_dir, max_steps, eval_every, *extra):
    return [sys.executable, "-m", "experiments", "cluster", "fashion_mnist_mlp",
            "--engine", "keras3", "--workers", "1", "--model-dir", str(model_dir),
            "--log-dir", str(log_dir), "--data-dir", str(fashion_data),
            "--max-steps", str(max_steps), "--eval-every", str(eval_every),
            "--batch-size", "16", "--timeout", str(TIMEOUT), *extra]


def _run_cluster(args, tmp_path, name):
    log_path = tmp_path / f"{name}.log"
    with open(log_path, "w") as log:
        proc = subprocess.run(args, cwd=ROOT, env=child_env(KERAS_BACKEND="jax"), stdout=log,
                              stderr=subprocess.STDOUT, timeout=TIMEOUT + 60)
    return proc.returncode, log_path.read_text()


def _pids(text):
    return {name: int(pid) for name, pid in re.findall(r"Started (\S+) \(pid (\d+)\)", text)}


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _assert_all_gone(pids):
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [n for n, p in pids.items() if _alive(p)]


def test_cluster_trains_exports_once_and_a_finished_rerun_is_a_noop(fashion_data, tmp_path):
    model_dir, logs = tmp_path / "run", tmp_path / "logs"
    evaluations = tmp_path / "evaluations.jsonl"  # what tune's pruner reads of a trial
    args = _cluster_args(fashion_data, model_dir, logs, 40, 20, "--evaluations-file",
                         evaluations)
    rc, out = _run_cluster(args, tmp_path, "first")
    assert rc == 0, out[-4000:]
    assert "Local cluster finished" in out
    pids = _pids(out)
    assert set(pids) == {"chief-0", "worker-0"}
    _assert_all_gone(pids)
    chief, worker = (logs / "chief-0.log").read_text(), (logs / "worker-0.log").read_text()
    assert "strategy multi_worker_mirrored (2 JAX processes" in chief and "engine keras3" in chief
    assert "32 global (2 replica(s))" in chief
    for log in (chief, worker):
        assert "trained to step 40" in log
    # Process 0 alone writes the export and the checkpoints.
    assert "exported:" in chief and "exported" not in worker
    assert (model_dir / "export" / "model.keras").is_file()
    assert json.loads((model_dir / "export" / "export.json").read_text())["global_step"] == 40
    assert checkpoint_steps(model_dir) == [0, 20, 40]
    # best/ is written once, after training: an evaluation only sets its
    # checkpoint aside, so no export holds the worker up meanwhile.
    evaluated = [float(a) for a in re.findall(r"evaluated step \d+: accuracy ([\d.]+)", chief)]
    assert len(evaluated) == 2
    # Process 0 alone records each evaluation, once.
    recorded = [json.loads(line) for line in evaluations.read_text().splitlines()]
    assert [r["step"] for r in recorded] == [20, 40]
    assert [r["metrics"]["accuracy"] for r in recorded] == pytest.approx(evaluated, abs=1e-4)
    assert "its checkpoint is set aside" in chief
    assert chief.count("new best accuracy") == 1
    assert chief.index("new best accuracy") > chief.index("trained to step 40")
    best = json.loads((model_dir / "best" / "export.json").read_text())
    assert best["metrics"]["accuracy"] == pytest.approx(max(evaluated), abs=1e-4)
    assert not (model_dir / "best-candidate").exists()

    index = model_dir / "keras3-checkpoints.json"
    written = index.stat().st_mtime_ns
    rc, out = _run_cluster(args, tmp_path, "again")
    assert rc == 0, out[-4000:]
    chief, worker = (logs / "chief-0.log").read_text(), (logs / "worker-0.log").read_text()
    assert "already at step 40" in chief
    for log in (chief, worker):
        assert "trained to step" not in log and "evaluated step" not in log
    assert index.stat().st_mtime_ns == written
    _assert_all_gone(_pids(out))


def _start_cluster(args, tmp_path, name):
    log = open(tmp_path / f"{name}.log", "w")
    proc = subprocess.Popen(args, cwd=ROOT, env=child_env(KERAS_BACKEND="jax"), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    return proc


def _wait_for(path, pattern, proc, timeout=TIMEOUT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        found = re.search(pattern, text)
        if found:
            return found
        assert proc.poll() is None, f"ended with {proc.returncode}:\n{text[-4000:]}"
        time.sleep(0.5)
    raise AssertionError(f"{pattern!r} did not appear in {path} within {timeout} s")


def _interrupted(args, tmp_path, logs, after, whom, sig):
    """Starts the cluster, waits for ``after`` in process 0's log, then
    sends ``sig`` to ``whom(launcher_pid, task_pids)``; returns (exit status,
    the launcher's output, the tasks' pids)."""
    proc = _start_cluster(args, tmp_path, "first")
    try:
        _wait_for(logs / "chief-0.log", after, proc)
        pids = _pids((tmp_path / "first.log").read_text())
        os.kill(whom(proc.pid, pids), sig)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    return proc.returncode, (tmp_path / "first.log").read_text(), pids


@pytest.mark.parametrize("target", ["launcher", "process 0"])
def test_sigterm_checkpoints_an_agreed_step_and_a_rerun_resumes(target, fashion_data,
                                                                tmp_path):
    model_dir, logs = tmp_path / "run", tmp_path / "logs"
    every = ("--hparams", "log_every_steps=50")
    args = _cluster_args(fashion_data, model_dir, logs, 5000, 2500, *every)
    # Past the first checkpoint (step 0) and well into training.
    rc, out, pids = _interrupted(
        args, tmp_path, logs, r"step [1-9]\d\d+/5000",
        lambda launcher, tasks: launcher if target == "launcher" else tasks["chief-0"],
        signal.SIGTERM)
    assert rc == 75, out[-4000:]
    assert "PREEMPTED" in out
    _assert_all_gone(pids)
    saved = latest_step(model_dir)
    assert 100 <= saved < 2500, checkpoint_steps(model_dir)
    chief, worker = (logs / "chief-0.log").read_text(), (logs / "worker-0.log").read_text()
    # Both stopped after the same step, the one process 0 saved.
    assert f"preempted at step {saved}" in chief
    assert f"stopped at step {saved} with the rest of the cluster" in worker
    assert not (model_dir / "export").exists()

    rc, out = _run_cluster(_cluster_args(fashion_data, model_dir, logs, saved + 20, 2500,
                                         *every), tmp_path, "again")
    assert rc == 0, out[-4000:]
    # Process 0 restores the checkpoint it saved, and every process gets it.
    resumed = {"chief-0": f"resuming from {model_dir / f'ckpt-{saved}.weights.h5'} "
                          f"(step {saved}, process 0's choice)",
               "worker-0": f"resuming from process 0's checkpoint (step {saved}, "
                           f"process 0's choice)"}
    for name, line in resumed.items():
        log = (logs / f"{name}.log").read_text()
        assert line in log, name
        assert f"trained to step {saved + 20}" in log, name


def test_sigkill_of_a_process_stops_the_others_and_a_rerun_resumes(fashion_data, tmp_path):
    model_dir, logs = tmp_path / "run", tmp_path / "logs"
    args = _cluster_args(fashion_data, model_dir, logs, 5000, 50)
    rc, out, pids = _interrupted(args, tmp_path, logs, r"evaluated step 50:",
                                 lambda launcher, tasks: tasks["worker-0"], signal.SIGKILL)
    assert rc == 1, out[-4000:]
    assert "worker-0" in out and "SIGKILL" in out
    _assert_all_gone(pids)
    saved = latest_step(model_dir)
    assert saved >= 50

    rc, out = _run_cluster(_cluster_args(fashion_data, model_dir, logs, saved + 10, 50),
                           tmp_path, "again")
    assert rc == 0, out[-4000:]
    assert f"resuming from {model_dir / f'ckpt-{saved}.weights.h5'}" in (
        logs / "chief-0.log").read_text()
