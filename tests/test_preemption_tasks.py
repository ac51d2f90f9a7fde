"""What a SIGTERM to one task of a real local cluster keeps (docs: the table
"what a SIGTERM to each task keeps"): the checkpoint's step, the launcher's
exit status, and where a rerun resumes.

The keras engine's multi-worker cases run with a stand-in GCE metadata
server on 127.0.0.1, which makes TensorFlow's platform detection say GCE_CPU
(a Vertex AI CPU VM), where TensorFlow's PreemptionCheckpointHandler does
nothing. The engine's own agreement on a step does not ask what platform it
is on: the cases check that no task asked the stand-in, so what they keep is
what a GCE CPU VM keeps.
"""

import os
import re
import signal
import subprocess
import time

import pytest

import test_distributed
from gce_metadata import MetadataServer
from support import ROOT, child_env
from test_distributed import Cluster, _global_step, _train_flags, needs_estimator

pytestmark = pytest.mark.slow

EVERY = 100  # steps between periodic checkpoints
PREEMPTED = 75


class _Run(Cluster):
    """A `cluster` run with extra environment (the metadata server's)."""

    def __init__(self, *args, env=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.env = env or {}

    def start(self):
        self.out = open(self.out_path, "w", encoding="utf-8")
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(self.command, cwd=ROOT,
                                     env=child_env(PYTHONHASHSEED="0", **self.env),
                                     stdin=subprocess.DEVNULL, stdout=self.out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        return self


def _logged(run, task="chief-0"):
    if not os.path.exists(os.path.join(run.log_dir, f"{task}.log")):
        return []
    return [int(s) for s in re.findall(r"\] step (\d+)/", run.log(task))]


def _checkpoint_steps(model_dir):
    """The step in each checkpoint the model dir still lists, oldest first."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from estimator_keras.checkpoints import checkpoint_step  # pylint: disable=import-outside-toplevel
    state = tf.train.get_checkpoint_state(str(model_dir))
    assert state, f"no checkpoint in {model_dir}"
    return [checkpoint_step(path) for path in state.all_model_checkpoint_paths]


# (engine, strategy, task signalled, GCE CPU, what is kept, the launcher's exit
# status or statuses)
CASES = [
    pytest.param("keras", "multi_worker_mirrored", "chief-0", True, "current", PREEMPTED,
                 id="keras-mwms-chief-gce"),
    pytest.param("keras", "multi_worker_mirrored", "worker-0", True, "current", PREEMPTED,
                 id="keras-mwms-worker-gce"),
    pytest.param("estimator", "parameter_server", "worker-0", False, "current", PREEMPTED,
                 marks=needs_estimator, id="estimator-ps-worker"),
    pytest.param("estimator", "parameter_server", "ps-0", False, "periodic", 1,
                 marks=needs_estimator, id="estimator-ps-ps"),
    # The worker's flag rides on the step's gradient sum: chief and worker
    # stop after that same step, and the chief saves it.
    pytest.param("estimator", "multi_worker_mirrored", "worker-0", False, "current", PREEMPTED,
                 marks=needs_estimator, id="estimator-mwms-worker"),
]


@pytest.mark.parametrize("engine,strategy,target,gce,kept,status", CASES)
def test_what_a_sigterm_to_one_task_keeps(fashion_data, tmp_path, engine, strategy, target, gce,
                                          kept, status):
    model_dir = tmp_path / "run"
    cluster = ["--workers", "1"] + (["--ps", "1"] if strategy == "parameter_server" else [])
    flags = _train_flags(str(fashion_data), 100000, EVERY, "--engine", engine, "--strategy",
                         strategy, "--preemption-grace", "10", log_every=10)
    with MetadataServer() as server:
        env = server.env() if gce else {}
        run = _Run(model_dir, tmp_path / "logs-1", cluster, flags, timeout=150, env=env).start()
        try:
            deadline = time.monotonic() + 120
            # Past the first periodic checkpoint, and (parameter servers) with
            # the worker training too.
            while not (max(_logged(run), default=0) > EVERY + 20 and (
                    strategy != "parameter_server" or _logged(run, "worker-0"))):
                assert run.proc.poll() is None, run.output()[-3000:]
                assert time.monotonic() < deadline, run.output()[-3000:]
                time.sleep(0.05)
            before = max(_logged(run))
            os.kill(run.pids()[target], signal.SIGTERM)
            run.wait()
        finally:
            run.assert_nothing_left()
        asked = server.requests
    # No task asked which platform it is on (the stand-in answers GCE_CPU):
    # the preemption agreement does not depend on it.
    assert asked == [], asked
    saved, _ = _global_step(str(model_dir))
    chief = run.log("chief-0")
    assert run.returncode in (status if isinstance(status, tuple) else (status,)), \
        run.output()[-3000:]
    if kept == "periodic":
        # Nothing saved the step in progress: a rerun starts from the last
        # periodic checkpoint (training may have gone on until the grace of
        # the task signalled ran out). The chief's saver writes one at the
        # first step it sees EVERY or more past the one before; the worker's
        # asynchronous updates can carry that a step or more past a hundred,
        # so what marks them periodic is their spacing, not their remainder.
        steps = _checkpoint_steps(model_dir)
        assert steps[-1] == saved and "preempted at step" not in chief, (steps, chief[-2000:])
        assert all(later - earlier >= EVERY for earlier, later in zip(steps, steps[1:])), steps
        return
    assert saved >= before, (saved, before, chief[-2000:])
    assert f"preempted at step {saved}" in chief, chief[-2000:]
    if strategy == "multi_worker_mirrored":
        worker = run.log("worker-0")
        assert f"stopped at step {saved} with the rest of the cluster" in worker, worker[-2000:]

    again = _Run(model_dir, tmp_path / "logs-2", cluster,
                 _train_flags(str(fashion_data), saved + 20, 100000, "--engine", engine,
                              "--strategy", strategy, log_every=10), timeout=150).run()
    try:
        assert again.returncode == 0, again.output()[-3000:]
    finally:
        again.assert_nothing_left()
    assert f"resuming from {model_dir}/model.ckpt-{saved}" in again.log("chief-0")
    # Parameter servers: asynchronous updates may overshoot by a step per worker.
    assert saved + 20 <= _global_step(str(model_dir))[0] <= saved + 22


def test_metadata_stand_in_makes_tensorflow_see_a_gce_cpu_vm():
    """The stand-in really is what TensorFlow's detection takes for GCE
    (checked with TensorFlow's own detection, in a child process)."""
    code = ("from tensorflow.python.distribute.failure_handling import failure_handling_util as u\n"
            "print(u.detect_platform().name)")
    with MetadataServer() as server:
        out = subprocess.run([test_distributed.PYTHON, "-c", code], cwd=ROOT,
                             env=child_env(**server.env()), capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split()[-1] == "GCE_CPU"
        assert "/computeMetadata/v1/instance/hostname" in server.requests
