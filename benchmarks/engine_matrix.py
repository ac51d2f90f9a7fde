"""Which Keras training features work on this TensorFlow, with Keras 2
(tf-keras) and with Keras 3: the measurements behind the README's
"Engines and versions" table.

Each case runs in fresh processes (a chief and a worker on 127.0.0.1 for the
multi-worker cases), bounded by a timeout and ended by PID::

    python -m benchmarks.engine_matrix              # both Keras versions, if installed
    python -m benchmarks.engine_matrix --keras 3    # one of them

Prints one line per case: ok, or the failure's last line.
"""

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap

from estimator_keras.distribute.launcher import free_ports

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
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    failed = [(rc, out) for rc, out in outputs if rc != 0]
    if not failed:
        module = next((line.split()[1] for _, out in outputs for line in out.splitlines()
                       if line.startswith("KERAS ")), "?")
        return f"ok ({module.split('.src.')[0]})"
    lines = [line for line in failed[0][1].splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line]
    return "FAILS: " + (errors[-1] if errors else lines[-1] if lines else f"exit {failed[0][0]}")[:200]


def _keras_installed(major):
    probe = subprocess.run([sys.executable, "-c", "import tensorflow as tf; print(tf.keras.Model.__module__)"],
                           env=_keras_env(major), capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        return False
    module = probe.stdout.strip()
    return (".engine." in module) == (major == 2)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine_matrix", allow_abbrev=False,
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--keras", type=int, choices=(2, 3), action="append",
                        help="Keras major version(s) to try (default: both)")
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"comma-separated subset of {', '.join(CASES)}")
    parser.add_argument("--timeout", type=float, default=180.0,
                        help="seconds per case (default 180)")
    args = parser.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        parser.error(f"unknown case(s) {unknown}; expected some of {', '.join(CASES)}")
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    print(f"TensorFlow {tf.__version__}, Python {sys.version.split()[0]}")
    for major in args.keras or (2, 3):
        if not _keras_installed(major):
            print(f"Keras {major}: not available as tf.keras here")
            continue
        for case in cases:
            print(f"Keras {major}  {case:<24} {_run_tasks(case, major, args.timeout)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
