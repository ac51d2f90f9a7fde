"""End-to-end distributed training on real local clusters (127.0.0.1).

Each cluster test runs ``python -m experiments cluster ...`` as a child process,
bounded by a timeout, and afterwards checks by PID and by a /proc scan for the
test's unique model dir that no task survived. The pipeline test checks the
file split between input pipelines in-process on a tiny dataset of ids.
"""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from estimator_keras import engines, inputs, records
from estimator_keras.distribute.tf_config import ClusterInfo
from experiments.config import types as config_lib
from experiments.training import context as context_lib
from support import ROOT, child_env, fresh_python

pytestmark = pytest.mark.slow

PYTHON = sys.executable
EXPERIMENT = "fashion_mnist_mlp"
STARTED = re.compile(r"Started (\w+-\d+) \(pid (\d+)\)")
needs_estimator = pytest.mark.skipif(not engines.estimator_available(),
                                     reason="tf.estimator ends at TF 2.15")


# --------------------------------------------------------------------------- helpers

@pytest.fixture(scope="module")
def data_dir(fashion_data):
    # Prepared once (conftest): otherwise every cluster's chief prepares it
    # while the other tasks wait for the manifest.
    return str(fashion_data)


def _env():
    # No inherited TF_CONFIG: the launcher gives each task its own.
    return child_env(PYTHONHASHSEED="0")


def _processes_mentioning(text):
    """PIDs (other than this process) whose command line contains ``text``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if text in cmdline:
            found.append((int(entry), cmdline.strip()))
    return found


def _kill_leftovers(text):
    left = _processes_mentioning(text)
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


class Cluster:
    """One run of the `cluster` command, bounded by ``bound`` seconds."""

    def __init__(self, model_dir, log_dir, cluster_flags, train_flags, timeout=150):
        self.model_dir = str(model_dir)
        self.log_dir = str(log_dir)
        self.out_path = os.path.join(str(log_dir) + ".launcher.out")
        self.command = [PYTHON, "-m", "experiments", "cluster", EXPERIMENT, *cluster_flags,
                        "--model-dir", self.model_dir, "--log-dir", self.log_dir,
                        "--timeout", str(timeout), "--evaluator-grace", "60", "--quiet",
                        *train_flags]
        # The launcher's own limit plus its stop time (SIGTERM, 5 s, SIGKILL).
        self.bound = timeout + 45
        self.proc = None

    def start(self):
        self.out = open(self.out_path, "w", encoding="utf-8")
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(self.command, cwd=ROOT, env=_env(), stdin=subprocess.DEVNULL,
                                     stdout=self.out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        return self

    def wait(self):
        try:
            self.returncode = self.proc.wait(timeout=max(1, self.bound - self.elapsed()))
        except subprocess.TimeoutExpired:
            # SIGTERM lets the launcher stop its tasks (they run in their own
            # sessions, so killing the launcher alone would orphan them).
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
            self.out.close()
            left = _kill_leftovers(self.model_dir)
            pytest.fail(f"`cluster` did not exit within {self.bound} s; leftovers killed: "
                        f"{left}\n{self.output()[-3000:]}")
        self.out.close()
        self.wall = self.elapsed()
        return self

    def run(self):
        return self.start().wait()

    def elapsed(self):
        return time.monotonic() - self.started_at

    def output(self):
        with open(self.out_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def pids(self):
        return {name: int(pid) for name, pid in STARTED.findall(self.output())}

    def log(self, task):
        with open(os.path.join(self.log_dir, f"{task}.log"), encoding="utf-8",
                  errors="replace") as f:
            return f.read()

    def assert_nothing_left(self):
        survivors = []
        for name, pid in self.pids().items():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if self.model_dir.encode() in f.read():
                        survivors.append(f"{name} (pid {pid})")
            except OSError:
                pass  # gone
        left = _kill_leftovers(self.model_dir)
        assert not survivors and not left, f"still running: {survivors} {left}"


def _train_flags(data_dir, max_steps, eval_every, *more, log_every=20):
    return ["--data-dir", data_dir, "--max-steps", str(max_steps), "--eval-every",
            str(eval_every), "--batch-size", "32", "--hparams", f"log_every_steps={log_every}",
            *more]


def _assert_rates(log, examples_per_step):
    """Every progress line's examples/s is its steps/s times the examples one
    global step consumes."""
    rates = re.findall(r"([\d.]+) steps/s, ([\d,]+) examples/s", log)
    assert rates, log[-2000:]
    for steps, examples in rates:
        assert abs(float(steps) * examples_per_step - float(examples.replace(",", ""))) <= \
            examples_per_step, (steps, examples)


def _global_step(model_dir):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from estimator_keras.checkpoints import checkpoint_step  # pylint: disable=import-outside-toplevel
    checkpoint = tf.train.latest_checkpoint(model_dir)
    assert checkpoint, f"no checkpoint in {model_dir}"
    # Either engine's: the Estimator's global step, or the keras engine's
    # optimizer iterations.
    step = checkpoint_step(checkpoint)
    assert step is not None, f"no step in {checkpoint}"
    return step, checkpoint


def _load_in_plain_keras(export_dir, cwd):
    """Loads model.h5 and weights.h5 in a fresh interpreter that cannot import
    this package, and returns what it saw."""
    code = textwrap.dedent(f"""
        import json
        import numpy as np
        import tensorflow as tf
        model = tf.keras.models.load_model({os.path.join(export_dir, 'model.h5')!r},
                                           compile=False)
        probs = model.predict(np.zeros((2, 28, 28, 1), np.uint8), verbose=0)
        twin = tf.keras.models.clone_model(model)
        twin.load_weights({os.path.join(export_dir, 'weights.h5')!r})
        same = all(np.array_equal(a, b) for a, b in zip(model.get_weights(), twin.get_weights()))
        print(json.dumps({{"inputs": model.input_names, "shape": list(probs.shape),
                           "sums": probs.sum(axis=1).tolist(), "weights_equal": same}}))
    """)
    return json.loads(fresh_python(code, cwd, timeout=120).strip().splitlines()[-1])


def _assert_no_final_export(log, task):
    """Only the chief exports MODEL_DIR/export and prints the summary; the
    evaluator may only refresh MODEL_DIR/best after its evaluations."""
    assert "final metrics:" not in log, task
    exported = [line for line in log.splitlines() if "exported" in line]
    assert all(line.rstrip().endswith("/best") for line in exported), (task, exported)
    if task != "evaluator-0":
        assert not exported, task


def _files_named(root, predicate):
    """Matching paths under root, outside ``best/`` (the best-model export,
    which the evaluator writes after evaluations)."""
    return sorted(os.path.relpath(os.path.join(d, n), root)
                  for d, dirs, files in os.walk(root) for n in dirs + files
                  if predicate(n) and not os.path.relpath(os.path.join(d, n), root)
                  .startswith("best"))


# --------------------------------------------------------------------------- ps

@needs_estimator
def test_parameter_server_cluster_with_evaluator(data_dir, tmp_path):
    model_dir = tmp_path / "ps-model"
    # 3000 steps: the worker starts 5 s after the chief (the Estimator's
    # per-index delay), and an idle machine runs this MLP at ~300 steps/s, so
    # the run must be long enough for the worker to join the training.
    max_steps = 3000
    evaluations = tmp_path / "evaluations.jsonl"  # what tune's pruner reads of a trial
    run = Cluster(model_dir, tmp_path / "ps-logs", ["--workers", "1", "--ps", "1", "--evaluator"],
                  _train_flags(data_dir, max_steps, 1000, "--evaluations-file",
                               str(evaluations), log_every=50)).run()
    try:
        assert run.returncode == 0, run.output()[-3000:]
        assert set(run.pids()) == {"chief-0", "worker-0", "ps-0", "evaluator-0"}
        out = run.output()
        assert re.search(r"ps-0\s+ended by the launcher", out), out[-2000:]
        assert re.search(r"evaluator-0\s+exited with status 0", out), out[-2000:]
        logs = {t: run.log(t) for t in run.pids()}
    finally:
        run.assert_nothing_left()

    # Asynchronous updates: a task can take one more step on a stale read of
    # the global step, so the end may overshoot by up to one step per trainer.
    step, checkpoint = _global_step(str(model_dir))
    assert max_steps <= step <= max_steps + 2, step
    for task in ("chief-0", "worker-0", "ps-0"):
        assert "strategy parameter_server" in logs[task], logs[task][-1000:]
    assert re.search(r"\[worker-0\] (step|trained to step) \d+", logs["worker-0"]), \
        "the worker never trained:\n" + logs["worker-0"][-2000:]
    # Asynchronous: one global step is one batch of one task, whatever the
    # number of workers.
    _assert_rates(logs["chief-0"], 32)

    # The evaluator builds no training strategy and reports its evaluations,
    # the last one of the final checkpoint.
    evaluator = logs["evaluator-0"]
    assert "[evaluator-0] experiment fashion_mnist_mlp: strategy none" in evaluator
    evaluated = [int(s) for s in re.findall(r"evaluated step (\d+): accuracy \d\.\d+", evaluator)]
    assert evaluated and max(evaluated) >= max_steps, evaluator[-2000:]
    # The task that evaluates records each evaluation, once, as it happens.
    recorded = [json.loads(line) for line in evaluations.read_text().splitlines()]
    assert [r["step"] for r in recorded] == evaluated

    # Only the chief exports and prints the final summary, exactly once.
    assert logs["chief-0"].count("final metrics:") == 1
    assert logs["chief-0"].count("exported:") == 1
    for task in ("worker-0", "ps-0", "evaluator-0"):
        _assert_no_final_export(logs[task], task)
    assert _files_named(str(model_dir), lambda n: "export" in n) == ["export", "export/export.json"]
    assert _files_named(str(model_dir), lambda n: n in ("model.h5", "weights.h5",
                                                        "saved_model")) == [
        "export/model.h5", "export/saved_model", "export/weights.h5"]
    assert (model_dir / "best" / "model.h5").exists()  # the evaluator's best-model export
    with open(model_dir / "export" / "export.json") as f:
        info = json.load(f)
    assert info["checkpoint"] == checkpoint and info["global_step"] == step

    loaded = _load_in_plain_keras(str(model_dir / "export"), tmp_path)
    assert loaded["inputs"] == ["image"] and loaded["shape"] == [2, 10]
    assert np.allclose(loaded["sums"], 1.0, atol=1e-5) and loaded["weights_equal"]


# --------------------------------------------------------------------------- multi-worker

@needs_estimator
def test_multi_worker_mirrored_export_equals_last_checkpoint(data_dir, tmp_path):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    model_dir = tmp_path / "mwms-model"
    # The explicit strategy reaches the evaluator too, which must not build it
    # (TensorFlow would fail with KeyError: 'evaluator').
    run = Cluster(model_dir, tmp_path / "mwms-logs", ["--workers", "1", "--evaluator"],
                  _train_flags(data_dir, 60, 30, "--strategy", "multi_worker_mirrored")).run()
    try:
        assert run.returncode == 0, run.output()[-3000:]
        assert set(run.pids()) == {"chief-0", "worker-0", "evaluator-0"}
        logs = {t: run.log(t) for t in run.pids()}
    finally:
        run.assert_nothing_left()

    for task in ("chief-0", "worker-0"):
        assert "strategy multi_worker_mirrored" in logs[task] and "(2 replica(s))" in logs[task]
    assert "[evaluator-0] experiment fashion_mnist_mlp: strategy none" in logs["evaluator-0"]
    assert "evaluated step 60: accuracy" in logs["evaluator-0"], logs["evaluator-0"][-2000:]
    _assert_rates(logs["chief-0"], 64)  # synchronous: 2 replicas x 32 per step
    assert "final metrics:" in logs["chief-0"]
    for task in ("worker-0", "evaluator-0"):
        _assert_no_final_export(logs[task], task)
    # Synchronous training: exactly max_steps.
    step, checkpoint = _global_step(str(model_dir))
    assert step == 60
    assert _files_named(str(model_dir), lambda n: n.startswith("tmp_worker")) == []
    assert _files_named(str(model_dir), lambda n: "export" in n) == ["export", "export/export.json"]

    reader = tf.train.load_checkpoint(checkpoint)
    model = tf.keras.models.load_model(str(model_dir / "export" / "model.h5"), compile=False)
    dense = [layer for layer in model.layers if layer.weights]
    assert len(dense) == 3
    for i, layer in enumerate(dense):
        for name, value in (("kernel", layer.kernel), ("bias", layer.bias)):
            saved = reader.get_tensor(f"layer_with_weights-{i}/{name}/.ATTRIBUTES/VARIABLE_VALUE")
            np.testing.assert_array_equal(value.numpy(), saved, err_msg=f"{layer.name}/{name}")


# --------------------------------------------------------------------------- input split

@pytest.fixture(scope="module")
def id_datasets(tmp_path_factory):
    """Train splits of 203 records (ids 0..202) in 5 files and in 1 file."""
    root = tmp_path_factory.mktemp("ids")
    n = 203
    arrays = {"id": np.arange(n, dtype=np.int64), "label": np.arange(n, dtype=np.int64) % 3}
    paths = {}
    for shards in (5, 1):
        path = str(root / f"ids-{shards}")
        records.write_dataset({"train": arrays, "test": arrays}, path,
                              num_shards={"train": shards, "test": 1}, progress=False)
        paths[shards] = path
    return paths, n


def _ids(dataset):
    seen = []
    for features, _ in dataset:
        seen.extend(int(v) for v in features["id"].numpy().reshape(-1))
    return seen


def _assert_exact_cover(parts, n):
    assert all(parts), f"an input pipeline read nothing: sizes {[len(p) for p in parts]}"
    everything = sorted(i for part in parts for i in part)
    assert everything == list(range(n)), (
        f"read {len(everything)} ids for {n} examples; duplicates "
        f"{sorted({i for i in everything if everything.count(i) > 1})[:10]}, missing "
        f"{sorted(set(range(n)) - set(everything))[:10]}")


@pytest.mark.parametrize("shards", [5, 1])
def test_ps_tasks_split_the_training_data(id_datasets, shards, monkeypatch):
    paths, n = id_datasets
    config = config_lib.ExperimentConfig(
        name="ids", description="ids",
        data=config_lib.DataConfig(dataset="ids", features={"id": "id"}, label="label"),
        train=config_lib.TrainConfig(batch_size=16))
    real = inputs.make_input_fn

    def one_epoch(*args, **kwargs):
        if kwargs.get("training"):
            kwargs["num_epochs"] = 1
        return real(*args, **kwargs)

    monkeypatch.setattr(inputs, "make_input_fn", one_epoch)
    spec = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]}
    parts = []
    for task in ("chief", "worker"):
        train_fn, _ = context_lib.input_fns(config, paths[shards], ClusterInfo(spec, task, 0))
        parts.append(_ids(train_fn()))
    _assert_exact_cover(parts, n)
    # The evaluator reads the whole eval split; a ps builds its pipelines too.
    for task in ("evaluator", "ps"):
        train_fn, eval_fn = context_lib.input_fns(config, paths[shards], ClusterInfo(spec, task, 0))
        assert sorted(_ids(eval_fn())) == list(range(n))


@pytest.mark.parametrize("shards", [5, 1])
def test_multi_worker_pipelines_split_the_training_data(id_datasets, shards):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    paths, n = id_datasets
    input_fn = inputs.make_input_fn(paths[shards], 16, training=True, num_epochs=1,
                                    config=inputs.InputConfig(features={"id": "id"}))
    parts = [_ids(input_fn(input_context=tf.distribute.InputContext(
        num_input_pipelines=2, input_pipeline_id=i, num_replicas_in_sync=2)))
        for i in range(2)]
    _assert_exact_cover(parts, n)


# --------------------------------------------------------------------------- failure

@pytest.mark.parametrize("engine", [pytest.param("estimator", marks=needs_estimator), "keras"])
def test_killed_worker_fails_the_run_and_a_rerun_resumes(data_dir, tmp_path, engine):
    model_dir = tmp_path / "kill-model"
    max_steps, every = 600, 100
    flags = (["--workers", "1"],
             _train_flags(data_dir, max_steps, every, "--strategy", "multi_worker_mirrored",
                          "--engine", engine, log_every=50))
    first = Cluster(model_dir, tmp_path / "kill-logs-1", *flags, timeout=120).start()
    try:
        # Mid-training: once the first checkpoint after step 0 is on disk.
        deadline = time.monotonic() + 120
        while not (model_dir / f"model.ckpt-{every}.index").exists():
            assert first.proc.poll() is None, "the run ended early:\n" + first.output()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint:\n" + first.output()[-3000:]
            time.sleep(0.05)
        worker = first.pids()["worker-0"]
        os.kill(worker, signal.SIGKILL)
        killed_at = time.monotonic()
        first.wait()
        # The launcher notices at once; stopping the rest takes at most its
        # SIGTERM grace (5 s) plus reaping.
        assert time.monotonic() - killed_at < 30
        assert first.returncode == 1, first.output()[-3000:]
        assert "task worker-0 was killed by signal SIGKILL (9)" in first.output()
    finally:
        first.assert_nothing_left()
    before, _ = _global_step(str(model_dir))
    assert every <= before < max_steps

    second = Cluster(model_dir, tmp_path / "kill-logs-2", *flags, timeout=120).run()
    try:
        assert second.returncode == 0, second.output()[-3000:]
        chief = second.log("chief-0")
    finally:
        second.assert_nothing_left()
    if engine == "estimator":
        assert f"resuming from {model_dir}/model.ckpt-{before}" in chief, chief[-2000:]
    else:
        # BackupAndRestore's backup is never older than the model dir's
        # latest checkpoint (written after it), else the checkpoint is used.
        assert ("restoring the interrupted run" in chief
                or f"resuming from {model_dir}/model.ckpt-{before}" in chief), chief[-2000:]
    steps = [int(s) for s in re.findall(r"\] step (\d+)", chief)]
    assert steps and min(steps) > before, steps
    step, _ = _global_step(str(model_dir))
    assert step == max_steps
    assert _files_named(str(model_dir), lambda n: n.startswith("tmp_worker")) == []


# --------------------------------------------------------------------------- preemption

PREEMPTION_TARGETS = ("chief", "launcher")


@pytest.mark.parametrize("engine", [pytest.param("estimator", marks=needs_estimator), "keras"])
@pytest.mark.parametrize("target", PREEMPTION_TARGETS)
def test_sigterm_to_the_chief_or_the_launcher_keeps_the_step(data_dir, tmp_path, engine, target):
    """SIGTERM (a preemption) to the chief of a multi_worker_mirrored cluster, or
    to the `cluster` launcher: the newest checkpoint is no older than the last
    step the chief logged before the signal, and a rerun resumes from it."""
    model_dir = tmp_path / "run"
    flags = (["--workers", "1"],
             _train_flags(data_dir, 100000, 50000, "--strategy", "multi_worker_mirrored",
                          "--engine", engine, log_every=10))
    run = Cluster(model_dir, tmp_path / "logs-1", *flags, timeout=150).start()
    try:
        deadline = time.monotonic() + 120
        logged = []
        while len(logged) < 3:  # a few progress lines: training is under way
            assert run.proc.poll() is None, run.output()[-3000:]
            assert time.monotonic() < deadline, run.output()[-3000:]
            time.sleep(0.05)
            if os.path.exists(os.path.join(run.log_dir, "chief-0.log")):
                logged = [int(s) for s in re.findall(r"\] step (\d+)/", run.log("chief-0"))]
        pid = run.pids()["chief-0"] if target == "chief" else run.proc.pid
        before = max(int(s) for s in re.findall(r"\] step (\d+)/", run.log("chief-0")))
        os.kill(pid, signal.SIGTERM)
        run.wait()
    finally:
        run.assert_nothing_left()
    chief = run.log("chief-0")
    assert "preempted at step" in chief, chief[-3000:]
    saved, _ = _global_step(str(model_dir))
    assert saved >= before, (before, saved, chief[-2000:])
    assert f"preempted at step {saved}" in chief
    # Every training task stopped at the chief's step and exited 75.
    assert run.returncode == 75, run.output()[-3000:]
    assert f"stopped at step {saved} with the rest of the cluster" in run.log("worker-0")

    again = Cluster(model_dir, tmp_path / "logs-2", ["--workers", "1"],
                    _train_flags(data_dir, saved + 20, 50000, "--strategy",
                                 "multi_worker_mirrored", "--engine", engine, log_every=10),
                    timeout=150).run()
    try:
        assert again.returncode == 0, again.output()[-3000:]
    finally:
        again.assert_nothing_left()
    assert f"resuming from {model_dir}/model.ckpt-{saved}" in again.log("chief-0")
    assert _global_step(str(model_dir))[0] == saved + 20


@needs_estimator
def test_a_chief_that_never_writes_the_initial_weights_is_a_model_dir_error(tmp_path,
                                                                            monkeypatch):
    """A worker waits for the chief's initial weights in the shared model
    dir; their absence is the model dir's fault (not shared, or another
    one), not the data's: ModelDirError, which names the dir."""
    from estimator_keras.engines.estimator import engine as estimator  # pylint: disable=import-outside-toplevel
    from estimator_keras.errors import DataError, ModelDirError  # pylint: disable=import-outside-toplevel
    monkeypatch.setattr(estimator, "CHIEF_WAIT_SECS", 0)
    logged = []
    with pytest.raises(ModelDirError, match="did not write the initial weights") as caught:
        estimator._wait_for_warm_start(str(tmp_path), logged.append)
    assert not isinstance(caught.value, DataError)
    assert str(tmp_path / "keras") in str(caught.value)


@needs_estimator
def test_an_async_worker_whose_step_ends_with_the_chiefs_training_ends_cleanly(tmp_path):
    """A parameter-server worker's step in flight can end cancelled when the
    chief ends the training; once the chief's final checkpoint is at
    max_steps that is the worker's end, not its failure. Before it, or for
    any other error, the failure stands."""
    import threading  # pylint: disable=import-outside-toplevel

    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from estimator_keras.engines.estimator import engine as estimator  # pylint: disable=import-outside-toplevel

    def save(directory, step):
        tf.train.Checkpoint(estimator_global_step=tf.Variable(step, dtype=tf.int64)).save(
            os.path.join(directory, "model.ckpt"))

    cancelled = tf.errors.CancelledError(None, None, "Cancelled")
    early, done, late = (str(tmp_path / n) for n in ("early", "done", "late"))
    save(early, 2800)
    save(done, 3000)
    assert estimator.finished_by_chief(cancelled, early, 3000, wait_secs=0) is None
    assert estimator.finished_by_chief(cancelled, done, 3000, wait_secs=0) == 3000
    assert estimator.finished_by_chief(tf.errors.UnavailableError(None, None, "gone"),
                                       done, 3000, wait_secs=0) == 3000
    # An error of the worker's own stays its failure, whatever the step.
    assert estimator.finished_by_chief(tf.errors.InvalidArgumentError(None, None, "bad"),
                                       done, 3000, wait_secs=0) is None
    # The chief's final save can land just after the worker's error.
    os.makedirs(late)
    writer = threading.Timer(1.0, save, (late, 3001))
    writer.start()
    try:
        started = time.monotonic()
        assert estimator.finished_by_chief(cancelled, late, 3000, wait_secs=20) == 3001
        assert time.monotonic() - started < 15
    finally:
        writer.join()
