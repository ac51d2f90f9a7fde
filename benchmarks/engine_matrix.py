"""Which Keras training features work on this TensorFlow, with Keras 2
(tf-keras) and with Keras 3, and what the keras3 engine does on each Keras 3
backend: the measurements behind the "What runs where" table of
docs/explanation/engines.md.

Each case runs in fresh processes (a chief and a worker on 127.0.0.1 for the
multi-worker cases), bounded by a timeout and ended by PID::

    python -m benchmarks.engine_matrix              # everything this environment has
    python -m benchmarks.engine_matrix --keras 3    # plain Keras 3 only
    python -m benchmarks.engine_matrix --keras3-engine jax   # the engine on JAX only

Prints one line per case: ok, refused (the engine said no, with its
message's first sentence), or the failure's last line.
"""

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

from estimator_keras.distribute.launcher import free_ports

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = ("fit", "fit_accuracy_metric", "fit_multi_worker", "backup_shared_dir",
         "backup_dir_per_worker")

# One task's program: a small model fit on generated data. Argument: a JSON
# with case, workdir and task index.
TASK = textwrap.dedent("""
    import json, os, sys
    spec = json.loads(sys.argv[1])
    import numpy as np
    import tensorflow as tf
    multi = spec["case"] not in ("fit", "fit_accuracy_metric")
    strategy = tf.distribute.MultiWorkerMirroredStrategy() if multi else tf.distribute.get_strategy()
    x = np.random.default_rng(0).random((512, 8)).astype("float32")
    y = (x.sum(axis=1) > 4).astype("int64")
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32)
    with strategy.scope():
        inputs = tf.keras.Input((8,))
        outputs = tf.keras.layers.Dense(2, activation="softmax")(
            tf.keras.layers.Dense(16, activation="relu")(inputs))
        model = tf.keras.Model(inputs, outputs)
        # Compiled metrics only where the case asks: they fail on their own
        # on some Keras 3 / TensorFlow pairs.
        metrics = ["accuracy"] if spec["case"] == "fit_accuracy_metric" else None
        model.compile("adam", "sparse_categorical_crossentropy", metrics)
    callbacks = []
    if spec["case"] == "backup_shared_dir":
        callbacks.append(tf.keras.callbacks.BackupAndRestore(os.path.join(spec["workdir"], "backup")))
    elif spec["case"] == "backup_dir_per_worker":
        callbacks.append(tf.keras.callbacks.BackupAndRestore(
            os.path.join(spec["workdir"], "backup-%d" % spec["index"])))
    model.fit(data, epochs=2, steps_per_epoch=10, callbacks=callbacks, verbose=0)
    print("KERAS", type(model).__module__)
""")


def _keras_env(major):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_USE_LEGACY_KERAS="1" if major == 2 else "0")
    if major == 2 and importlib.util.find_spec("tf_keras") is None:
        # TensorFlow 2.15's own tf.keras is Keras 2; asking it for tf-keras
        # would fail.
        env.pop("TF_USE_LEGACY_KERAS")
    env.pop("TF_CONFIG", None)
    return env


def _run_tasks(case, major, timeout):
    workdir = tempfile.mkdtemp(prefix=f"engine-matrix-{case}-")
    count = 1 if case in ("fit", "fit_accuracy_metric") else 2
    ports = free_ports(count)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"]}
    if count > 1:
        cluster["worker"] = [f"127.0.0.1:{p}" for p in ports[1:]]
    procs = []
    for index in range(count):
        env = _keras_env(major)
        if count > 1:
            task = {"type": "chief", "index": 0} if index == 0 else {"type": "worker",
                                                                     "index": index - 1}
            env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": task})
        spec = json.dumps({"case": case, "workdir": workdir, "index": index})
        procs.append(subprocess.Popen([sys.executable, "-c", TASK, spec], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, start_new_session=True))
    outputs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=timeout)
            outputs.append((proc.returncode, out))
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout} s"
    finally:
        for proc in procs:
            _end(proc)
    failed = [(rc, out) for rc, out in outputs if rc != 0]
    if not failed:
        module = next((line.split()[1] for _, out in outputs for line in out.splitlines()
                       if line.startswith("KERAS ")), "?")
        return f"ok ({module.split('.src.')[0]})"
    lines = [line for line in failed[0][1].splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line]
    return "FAILS: " + (errors[-1] if errors else lines[-1] if lines else f"exit {failed[0][0]}")[:200]


# The keras3 engine through `python -m experiments`, on one Keras 3 backend:
# train + export + a plain Keras 3 load of model.keras; a rerun to more steps
# resumes; SIGKILL then SIGTERM (exit 75) resume from checkpoints; --strategy
# mirrored; a local cluster of two training tasks; mixed_bfloat16; a
# two-trial `tune` study.
ENGINE_CASES = ("train_export", "rerun_resumes", "sigkill_sigterm", "mirrored", "cluster",
                "bfloat16", "tune")
BACKENDS = ("tensorflow", "jax")
PREEMPTED = 75
# A fresh Keras 3 process that knows nothing of estimator_keras: load and predict.
LOAD = textwrap.dedent("""
    import sys
    import numpy as np
    import keras
    model = keras.saving.load_model(sys.argv[1], compile=False)
    print("PREDICT", np.asarray(model.predict(np.zeros((4, 28, 28, 1), "uint8"), verbose=0)).shape)
""")


class Probe:
    """Runs `python -m experiments ...` of the keras3 engine on one backend,
    in a fresh session bounded by ``timeout``, ended by PID."""

    def __init__(self, backend, data_dir, workdir, timeout):
        self.backend, self.data_dir, self.workdir = backend, data_dir, workdir
        self.timeout = timeout
        self.env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3",
                        PYTHONPATH=os.pathsep.join(
                            p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p))
        self.env.pop("TF_CONFIG", None)

    def model_dir(self, case):
        return os.path.join(self.workdir, f"{self.backend}-{case}")

    def argv(self, case, *extra, command="train", max_steps=20, eval_every=10):
        return [sys.executable, "-m", "experiments", command, "fashion_mnist_mlp",
                "--engine", "keras3", "--data-dir", self.data_dir,
                "--model-dir", self.model_dir(case), "--max-steps", str(max_steps),
                "--eval-every", str(eval_every), "--batch-size", "32", *extra]

    def start(self, argv, log):
        return subprocess.Popen(argv, env=self.env, cwd=self.workdir, stdout=log,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def run(self, argv):
        """(exit status, output); raises TimeoutError after the timeout."""
        with tempfile.TemporaryFile("w+") as log:
            proc = self.start(argv, log)
            try:
                proc.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired as e:
                raise TimeoutError(f"timed out after {self.timeout:g} s") from e
            finally:
                _end(proc)
            log.seek(0)
            return proc.returncode, log.read()

    def latest_step(self, case):
        from estimator_keras.engines.keras3 import checkpoints as keras3_checkpoints  # pylint: disable=import-outside-toplevel

        try:
            latest = keras3_checkpoints.latest(self.model_dir(case))
        except Exception:  # pylint: disable=broad-except  (read while being written)
            return None
        return keras3_checkpoints.step_of(latest) if latest else None

    def wait_for_checkpoint(self, case, proc, above, log):
        deadline = time.monotonic() + self.timeout
        while (self.latest_step(case) or 0) <= above:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(_failure(proc.returncode, log.read()))
            if time.monotonic() > deadline:
                raise TimeoutError(f"no checkpoint past step {above} in {self.timeout:g} s")
            time.sleep(0.2)
        return self.latest_step(case)


def _end(proc):
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _failure(rc, out):
    lines = [line for line in out.splitlines() if line.strip()]
    if rc == 2 and lines:
        # The CLI's one-paragraph refusal: its first sentence.
        error = next((line for line in lines if line.startswith("error")), lines[-1])
        return "refused: " + error.split(". ")[0][:200]
    errors = [line for line in lines if "Error" in line]
    return f"FAILS (exit {rc}): " + (errors[-1] if errors else lines[-1] if lines else "")[:200]


def _train_export(probe):
    rc, out = probe.run(probe.argv("train_export"))
    if rc != 0:
        return _failure(rc, out)
    export = os.path.join(probe.model_dir("train_export"), "export")
    missing = [n for n in ("model.keras", "weights.h5", "saved_model/saved_model.pb")
               if not os.path.isfile(os.path.join(export, n))]
    if missing:
        return f"FAILS: the export lacks {', '.join(missing)}"
    rc, out = probe.run([sys.executable, "-c", LOAD, os.path.join(export, "model.keras")])
    if rc != 0 or "PREDICT (4, 10)" not in out:
        return "FAILS: a plain Keras 3 process: " + _failure(rc, out)
    return "ok (train, export, model.keras loaded by plain Keras 3)"


def _rerun_resumes(probe):
    for steps in (10, 20):
        rc, out = probe.run(probe.argv("rerun_resumes", max_steps=steps))
        if rc != 0:
            return _failure(rc, out)
    if "(step 10)" not in out or probe.latest_step("rerun_resumes") != 20:
        return "FAILS: the rerun did not continue from step 10 to 20"
    return "ok (resumed at step 10, ended at 20)"


def _sigkill_sigterm(probe):
    argv = probe.argv("sigkill_sigterm", max_steps=100000, eval_every=5)
    with tempfile.TemporaryFile("w+") as log:
        proc = probe.start(argv, log)
        try:
            killed_at = probe.wait_for_checkpoint("sigkill_sigterm", proc, 0, log)
        finally:
            _end(proc)
    with tempfile.TemporaryFile("w+") as log:
        proc = probe.start(argv, log)
        try:
            probe.wait_for_checkpoint("sigkill_sigterm", proc, killed_at, log)
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=probe.timeout)
        finally:
            _end(proc)
        log.seek(0)
        out = log.read()
    if rc != PREEMPTED:
        return _failure(rc, out)
    if f"(step {killed_at})" not in out:
        return f"FAILS: the rerun after SIGKILL did not resume from step {killed_at}"
    return (f"ok (SIGKILL at checkpoint {killed_at}, resumed; SIGTERM saved step "
            f"{probe.latest_step('sigkill_sigterm')} and exited {PREEMPTED})")


def _mirrored(probe):
    rc, out = probe.run(probe.argv("mirrored", "--strategy", "mirrored", max_steps=10))
    return "ok (one process, local devices)" if rc == 0 else _failure(rc, out)


def _cluster(probe):
    rc, out = probe.run(probe.argv("cluster", "--workers", "1", command="cluster",
                                   max_steps=10))
    return "ok (chief + 1 worker)" if rc == 0 else _failure(rc, out)


def _bfloat16(probe):
    rc, out = probe.run(probe.argv("bfloat16", "--hparams", "precision=mixed_bfloat16",
                                   max_steps=10))
    return "ok (mixed_bfloat16)" if rc == 0 else _failure(rc, out)


def _tune(probe):
    space = os.path.join(probe.workdir, f"{probe.backend}-space.yaml")
    with open(space, "w", encoding="utf-8") as f:
        f.write("learning_rate: {type: double, min: 0.0001, max: 0.01, scale: log}\n")
    study = probe.model_dir("tune")
    rc, out = probe.run([sys.executable, "-m", "experiments", "tune", "fashion_mnist_mlp",
                         "--space", space, "--trials", "2", "--model-dir", study,
                         "--engine", "keras3", "--data-dir", probe.data_dir, "--max-steps", "10",
                         "--eval-every", "10", "--batch-size", "32"])
    if rc != 0:
        return _failure(rc, out)
    with open(os.path.join(study, "trials.json"), encoding="utf-8") as f:
        trials = json.load(f)
    trials = trials.get("trials", trials) if isinstance(trials, dict) else trials
    done = [t for t in trials if t.get("status") == "succeeded"]
    if len(done) != 2:
        return f"FAILS: {len(done)} of 2 trials finished: {json.dumps(trials)[:200]}"
    return "ok (2 trials, each a keras3 run)"


def write_probe_data(data_dir, n=256):
    """Random images and labels in Fashion-MNIST's layout, as
    ``DATA_DIR/fashion_mnist``: what the probes train on (they test what runs,
    not what it learns)."""
    import numpy as np  # pylint: disable=import-outside-toplevel

    from estimator_keras.records import write_dataset  # pylint: disable=import-outside-toplevel
    from experiments.catalog.fashion_mnist import CLASS_NAMES  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(0)
    splits = {split: {"image": rng.integers(0, 256, (n, 28, 28, 1), dtype=np.uint8),
                      "label": rng.integers(0, 10, n).astype(np.int64)}
              for split in ("train", "test")}
    write_dataset(splits, os.path.join(data_dir, "fashion_mnist"), num_shards=2,
                  progress=False, name="fashion_mnist",
                  labels={"label": {"num_classes": 10, "class_names": list(CLASS_NAMES)}})


def run_engine_case(case, probe):
    try:
        return {"train_export": _train_export, "rerun_resumes": _rerun_resumes,
                "sigkill_sigterm": _sigkill_sigterm, "mirrored": _mirrored,
                "cluster": _cluster, "bfloat16": _bfloat16, "tune": _tune}[case](probe)
    except (TimeoutError, RuntimeError) as e:
        return f"FAILS: {e}"


def installed_backends():
    """The Keras 3 backends of BACKENDS this interpreter can import."""
    from estimator_keras.engines import keras_setup  # pylint: disable=import-outside-toplevel

    if keras_setup.keras3_installed_version() is None:
        return []
    return [b for b in BACKENDS if importlib.util.find_spec(b) is not None]


def _keras_installed(major):
    probe = subprocess.run([sys.executable, "-c", "import tensorflow as tf; print(tf.keras.Model.__module__)"],
                           env=_keras_env(major), capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        return False
    module = probe.stdout.strip()
    return (".engine." in module) == (major == 2)


def _subset(parser, flag, text, known):
    chosen = [c for c in text.split(",") if c]
    unknown = sorted(set(chosen) - set(known))
    if unknown:
        parser.error(f"{flag}: unknown case(s) {unknown}; expected some of {', '.join(known)}")
    return chosen


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine_matrix", allow_abbrev=False,
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--keras", type=int, choices=(2, 3), action="append",
                        help="plain Keras major version(s) to try (default: both, unless "
                             "only --keras3-engine is given)")
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"comma-separated subset of {', '.join(CASES)}")
    parser.add_argument("--keras3-engine", choices=BACKENDS, action="append", metavar="BACKEND",
                        help=f"probe the keras3 engine on this backend, one of "
                             f"{', '.join(BACKENDS)} (default: every installed one, unless "
                             f"only --keras is given)")
    parser.add_argument("--engine-cases", default=",".join(ENGINE_CASES),
                        help=f"comma-separated subset of {', '.join(ENGINE_CASES)}")
    parser.add_argument("--timeout", type=float, default=180.0,
                        help="seconds per case, or per process of a case (default 180)")
    args = parser.parse_args(argv)
    cases = _subset(parser, "--cases", args.cases, CASES)
    engine_cases = _subset(parser, "--engine-cases", args.engine_cases, ENGINE_CASES)
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    print(f"TensorFlow {tf.__version__}, Python {sys.version.split()[0]}")
    majors = args.keras or (() if args.keras3_engine else (2, 3))
    for major in majors:
        if not _keras_installed(major):
            print(f"Keras {major}: not available as tf.keras here")
            continue
        for case in cases:
            print(f"Keras {major}  {case:<24} {_run_tasks(case, major, args.timeout)}", flush=True)
    backends = args.keras3_engine or (() if args.keras else BACKENDS)
    usable = installed_backends() if backends else []
    for backend in backends:
        if backend not in usable:
            print(f"keras3 engine, {backend:<10} not installed here (Keras 3 and {backend}: "
                  f"pip install -e '.[{'jax' if backend == 'jax' else 'cpu'}]' on Python 3.12+)")
    backends = [b for b in backends if b in usable]
    if backends:
        workdir = tempfile.mkdtemp(prefix="engine-matrix-keras3-")
        try:
            write_probe_data(os.path.join(workdir, "data"))
            for backend in backends:
                probe = Probe(backend, os.path.join(workdir, "data"), workdir, args.timeout)
                for case in engine_cases:
                    print(f"keras3 engine, {backend:<10} {case:<16} "
                          f"{run_engine_case(case, probe)}", flush=True)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
