"""Shared test fixtures: running the CLI in a subprocess, tiny datasets."""

import os
import struct
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_env(**extra):
    """The environment for a child Python: this tree importable, TF quiet."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    return env


def _run_cli(*args, timeout=120):
    # subprocess.run kills the child when the timeout expires.
    proc = subprocess.run([sys.executable, "-m", "experiments", *map(str, args)],
                          cwd=ROOT, env=child_env(), capture_output=True, text=True,
                          timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture
def run_cli():
    """``run_cli(*args, timeout=120) -> (returncode, stdout, stderr)`` of
    ``python -m experiments ARGS`` run from the repository root."""
    return _run_cli


def tiny_arrays(n=40, seed=0):
    """Small arrays of every kind the writer handles; ``id`` is unique per example."""
    rng = np.random.default_rng(seed)
    return {
        "id": np.arange(n, dtype=np.int64),
        "image": rng.integers(0, 256, (n, 4, 3, 1), dtype=np.uint8),
        "vec": rng.standard_normal((n, 3)).astype(np.float32),
        "name": np.array([f"example-{i}".encode() for i in range(n)], dtype=object),
        "label": rng.integers(0, 10, n).astype(np.int64),
    }


@pytest.fixture
def tiny_dataset(tmp_path):
    """A factory: ``tiny_dataset(n=40, num_shards=4, **write_records kwargs)``
    writes :func:`tiny_arrays` under tmp_path and returns (directory, arrays)."""
    from estimator_keras.records import write_records  # pylint: disable=import-outside-toplevel

    def make(n=40, num_shards=4, name="ds", seed=0, **kwargs):
        arrays = tiny_arrays(n, seed)
        directory = str(tmp_path / name)
        kwargs.setdefault("progress", False)
        write_records(arrays, directory, num_shards=num_shards, seed=seed, **kwargs)
        return directory, arrays

    return make


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
