"""Helpers shared by the tests: running the CLI and fresh interpreters,
ending what they start, reading checkpoints."""

import importlib.metadata
import importlib.util
import json
import os
import pathlib
import re
import signal
import struct
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FASHION = "/usr/share/datasets/fashion-mnist"


def keras3_installed():
    try:
        return int(importlib.metadata.version("keras").split(".")[0]) >= 3
    except importlib.metadata.PackageNotFoundError:
        return False


# The keras3 engine's backends as test parameters, each skipped where it
# cannot run; tests/environments.py says which environment runs which.
KERAS3_BACKENDS = [
    pytest.param("tensorflow", marks=[pytest.mark.keras3_backend("tensorflow"), pytest.mark.skipif(
        not keras3_installed(), reason="Keras 3 is not installed (TensorFlow <= 2.15)")]),
    pytest.param("jax", marks=[pytest.mark.keras3_backend("jax"), pytest.mark.skipif(
        not keras3_installed() or importlib.util.find_spec("jax") is None,
        reason="Keras 3 or JAX is not installed (pip install -e '.[jax]')")]),
]


def child_env(**extra):
    """The environment for a child Python: this tree importable, TF quiet,
    no inherited TF_CONFIG (a test that wants one passes it)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    if "TF_CONFIG" not in extra:
        env.pop("TF_CONFIG", None)
    return env


def cli(*args, timeout=300, env=None):
    """``python -m experiments ARGS`` from the repository root; returns
    (returncode, stdout, stderr). subprocess.run kills it at the timeout."""
    proc = subprocess.run([sys.executable, "-m", "experiments", *map(str, args)],
                          cwd=ROOT, env=env or child_env(), capture_output=True, text=True,
                          timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def start_cli(*args, log):
    """Starts the CLI in its own process group (end it with kill_group)."""
    return subprocess.Popen([sys.executable, "-m", "experiments", *map(str, args)],
                            cwd=ROOT, env=child_env(), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def latest_step(model_dir):
    """Step of the checkpoint a restart restores, or None: the one the model
    dir's ``checkpoint`` file names, or the keras3 engine's index names."""
    path = os.path.join(str(model_dir), "checkpoint")
    keras3_index = os.path.join(str(model_dir), "keras3-checkpoints.json")
    if os.path.exists(keras3_index):
        with open(keras3_index) as f:
            match = re.search(r'"latest": "ckpt-(\d+)\.weights\.h5"', f.read())
    elif os.path.exists(path):
        with open(path) as f:
            match = re.search(r'^model_checkpoint_path: ".*?model\.ckpt-(\d+)"', f.read(), re.M)
    else:
        return None
    return int(match.group(1)) if match else None


def checkpoint_steps(model_dir):
    """Steps of the checkpoints in model_dir (TF checkpoints, or the keras3
    engine's weights files), ascending."""
    model_dir = str(model_dir)
    names = os.listdir(model_dir) if os.path.isdir(model_dir) else []
    found = (re.match(r"model\.ckpt-(\d+)\.index$|ckpt-(\d+)\.weights\.h5$", n) for n in names)
    return sorted(int(m.group(1) or m.group(2)) for m in found if m)


def latest_checkpoint_weights(model_dir):
    """(path, {name: array}) of the model weights in the newest checkpoint of
    any engine in model_dir (TF checkpoints: the layers' variables; the
    keras3 engine's weights files: every array outside the optimizer's)."""
    import h5py  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    steps = checkpoint_steps(model_dir)
    assert steps, f"no checkpoint in {model_dir}"
    keras3 = os.path.join(str(model_dir), f"ckpt-{steps[-1]}.weights.h5")
    if os.path.exists(keras3):
        found = {}
        with h5py.File(keras3, "r") as f:
            f.visititems(lambda name, obj: found.__setitem__(name, obj[()]) if isinstance(
                obj, h5py.Dataset) and not name.startswith("optimizer") else None)
        return keras3, found
    latest = tf.train.latest_checkpoint(str(model_dir))
    reader = tf.train.load_checkpoint(latest)
    return latest, {key: reader.get_tensor(key) for key in reader.get_variable_to_shape_map()
                    if "layer_with_weights" in key and "OPTIMIZER" not in key}


def checkpoint_files(model_dir):
    """name -> bytes of every checkpoint file of any engine in model_dir."""
    names = [n for n in os.listdir(str(model_dir))
             if n.startswith(("model.ckpt", "ckpt-")) or n in ("checkpoint",
                                                                "keras3-checkpoints.json")]
    return {n: open(os.path.join(str(model_dir), n), "rb").read() for n in names}


def checkpoint_name(step):
    """A pattern for the name of the checkpoint of ``step`` in log lines, of
    any engine (``model.ckpt-150``, ``ckpt-150.weights.h5``)."""
    return rf"(?:model\.)?ckpt-{int(step)}\b"


def export_model_file(export_dir):
    """The export's Keras model file: model.keras (keras3), else model.h5."""
    keras3 = os.path.join(str(export_dir), "model.keras")
    return keras3 if os.path.exists(keras3) else os.path.join(str(export_dir), "model.h5")


# Makes any import of this package fail, even where it is installed (tox).
NO_PACKAGE = ("import sys\n"
              "sys.modules['estimator_keras'] = None\n"
              "sys.modules['experiments'] = None\n")


def fresh_python(code, cwd, timeout=180, **variables):
    """Runs code in an isolated interpreter in which this package cannot be
    imported (what a plain Keras user has), with the environment variables
    given set; returns its stdout."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", **variables)
    proc = subprocess.run([sys.executable, "-I", "-c", NO_PACKAGE + code], cwd=str(cwd),
                          env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def record_frames(path):
    """(start offset, data length) of each record of an uncompressed TFRecord
    file, from its framing: length (8) + CRC (4) + data + CRC (4)."""
    with open(path, "rb") as f:
        data = f.read()
    frames, pos = [], 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[pos:pos + 8])
        frames.append((pos, length))
        pos += 16 + length
    return frames


def flip_byte_in_record(path, index):
    """Flips one byte in the middle of record ``index``'s data; returns the
    record's start offset (where a reader reports the corruption)."""
    start, length = record_frames(path)[index]
    with open(path, "r+b") as f:
        f.seek(start + 12 + length // 2)
        byte = f.read(1)
        f.seek(start + 12 + length // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    return start


def sample_flag_value(action, known):
    """A flag of ``action`` and argv values for it that differ from its
    default: ``known`` maps flags to values that must be real (files, dirs)."""
    flag = next(s for s in action.option_strings if s.startswith("--"))
    if action.nargs == 0:
        return flag, []
    if flag in known:
        return flag, [known[flag]]
    if action.choices:
        return flag, [[c for c in action.choices if c != action.default][-1]]
    if action.type in (int, float):
        return flag, [str(action.type(3))]
    return flag, ["sample-%s" % action.dest]


def vertex_env(base, trial_id=None, **extra):
    """The environment Vertex AI gives a one-replica job whose base output
    directory is ``base`` (local here): the AIP_* folders, TF_CONFIG naming
    the chief alone, and for a tuning trial its id and metric file."""
    from estimator_keras.distribute.launcher import free_ports  # pylint: disable=import-outside-toplevel

    env = child_env(AIP_MODEL_DIR=f"{base}/model/", AIP_CHECKPOINT_DIR=f"{base}/checkpoints/",
                    AIP_TENSORBOARD_LOG_DIR=f"{base}/logs/",
                    TF_CONFIG=json.dumps({"cluster": {"chief": [f"127.0.0.1:{free_ports(1)[0]}"]},
                                          "task": {"type": "chief", "index": 0}, "job": {}}),
                    **extra)
    if trial_id is not None:
        env.update(CLOUD_ML_TRIAL_ID=str(trial_id),
                   CLOUD_ML_HP_METRIC_FILE=os.path.join(str(base), "hypertune", "output.metrics"))
    return env


def assert_vertex_layout(base, model_file, steps=20):
    """A run under :func:`vertex_env` wrote where Vertex looks: checkpoints in
    AIP_CHECKPOINT_DIR, the export flat in AIP_MODEL_DIR (Model Registry
    imports its root) with ``model_file``, and event files in the log dir.
    Returns (export.json, the event files)."""
    assert checkpoint_steps(os.path.join(base, "checkpoints"))[-1] == steps
    model = os.path.join(base, "model")
    assert os.path.isfile(os.path.join(model, "saved_model.pb"))
    assert os.path.isdir(os.path.join(model, "variables"))
    for name in (model_file, "weights.h5", "export.json"):
        assert os.path.isfile(os.path.join(model, name)), name
    assert not os.path.exists(os.path.join(model, "saved_model"))
    stray = [n for n in os.listdir(model)
             if n.startswith(("model.ckpt", "events.out", "checkpoint", "ckpt-"))]
    assert not stray, stray
    events = [os.path.join(d, f) for d, _, files in os.walk(os.path.join(base, "logs"))
              for f in files if f.startswith("events.out.tfevents")]
    assert events, "no event files in AIP_TENSORBOARD_LOG_DIR"
    with open(os.path.join(model, "export.json"), encoding="utf-8") as f:
        return json.load(f), events


def session_hparams(paths):
    """The HParams of the last session-start summary in the event files ``paths``."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from tensorboard.plugins.hparams import metadata  # pylint: disable=import-outside-toplevel

    found = {}
    for path in paths:
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == metadata.SESSION_START_INFO_TAG:
                    found = metadata.parse_session_start_info_plugin_data(
                        value.metadata.plugin_data.content).hparams
    return found


def signal_at_step(argv, step, sig, log_path, cwd=ROOT, env=None, timeout=240):
    """Runs ``python -m experiments ARGV`` (its output to ``log_path``) until
    it logs a progress line at or past ``step``, then sends it ``sig``: a real
    signal at a step of the run's own choosing. Returns (exit status, the last
    step logged). The child is killed by its process group if it outlives this."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "experiments", *map(str, argv)],
                                cwd=str(cwd), env=env or child_env(), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + timeout
            while True:
                text = pathlib.Path(log_path).read_text()
                logged = [int(s) for s in re.findall(r"^step (\d+)/", text, re.M)]
                if logged and max(logged) >= step:
                    break
                assert proc.poll() is None, text[-3000:]
                assert time.monotonic() < deadline, text[-3000:]
                time.sleep(0.002)
            os.kill(proc.pid, sig)
            return proc.wait(timeout=90), max(logged)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)


def generated_examples(n, seed=0):
    """(schema, examples) of every kind a record holds: raw uint8 images,
    int64 labels and vectors, float vectors and bytes, features named out of
    sorted order (a writer must sort an Example's map keys to match TF's)."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    from estimator_keras.schema import FeatureSpec  # pylint: disable=import-outside-toplevel

    schema = {"label": FeatureSpec("label", "int64", (), "int64"),
              "image": FeatureSpec("image", "uint8", (8, 8, 3), "raw"),
              "weights": FeatureSpec("weights", "float32", (5,), "float"),
              "caption": FeatureSpec("caption", "string", (), "bytes"),
              "b_ids": FeatureSpec("b_ids", "int64", (3,), "int64"),
              "a_depth": FeatureSpec("a_depth", "float32", (2, 2), "raw")}
    rng = np.random.default_rng(seed)
    examples = [{
        "label": rng.integers(0, 10),
        "image": rng.integers(0, 256, (8, 8, 3), dtype=np.uint8),
        "weights": (rng.normal(size=5) * 10.0 ** rng.integers(-30, 30)).astype(np.float32),
        "caption": rng.bytes(int(rng.integers(0, 40))),
        "b_ids": rng.integers(-2**63, 2**63 - 1, 3, dtype=np.int64),
        "a_depth": rng.random((2, 2), dtype=np.float32)} for _ in range(n)]
    return schema, examples


def png_bytes(pixels):
    """A PNG of uint8 pixels (height, width, 1 or 3), written by hand: no
    TensorFlow or Pillow is needed to make the test's images."""
    import zlib  # pylint: disable=import-outside-toplevel

    height, width, channels = pixels.shape

    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))

    rows = b"".join(b"\0" + pixels[y].tobytes() for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, {1: 0, 3: 2}[channels], 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
            + chunk(b"IEND", b""))
