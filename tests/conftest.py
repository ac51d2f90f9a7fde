"""Shared test fixtures: running the CLI in a subprocess, tiny datasets."""

import os

from estimator_keras import engines

# Before any test module imports TensorFlow: Keras 2 as tf.keras on TF 2.16+.
engines.prefer_legacy_keras()

import numpy as np  # noqa: E402  pylint: disable=wrong-import-position
import pytest  # noqa: E402  pylint: disable=wrong-import-position

from support import FASHION, cli  # noqa: E402  pylint: disable=wrong-import-position

# Which modules, backends and skips this tox env has (tests/environments.py).
pytest_plugins = ["environments"]


@pytest.fixture
def run_cli():
    """``run_cli(*args, timeout=120) -> (returncode, stdout, stderr)`` of
    ``python -m experiments ARGS`` run from the repository root."""
    return cli


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


@pytest.fixture(scope="session")
def fashion_data(tmp_path_factory):
    """A data dir holding ``fashion_mnist``: the first 3000 train and 3000 test
    examples of the real Fashion-MNIST, in 4 + 1 shards. Tests that damage it
    copy it first."""
    if not os.path.isdir(FASHION):
        pytest.skip("dataset-fashion-mnist is not installed (CI installs it)")
    root = tmp_path_factory.mktemp("fashion")
    rc, out, err = cli("prepare", "fashion_mnist", "--data-dir", root, "--max-examples", 3000,
                       "--shards", 4)
    assert rc == 0, err
    assert "train 3000, test 3000" in out
    return root
