"""A user's own package for the plugin tests: its module, its setup.py, and
running the CLI beside it (tests/test_plugins.py, tests/test_plugins_cluster.py)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

from support import child_env

MODULE = "ek_stripes_plugin"
DISTRIBUTION = "ek-stripes-plugin"
ENTRY_POINT = "stripes"
EXPERIMENT = "ek_stripes_dense"
DATASET = "ek_stripes"

# What a user writes: a dataset and an experiment sized from it.
PLUGIN_SOURCE = '''"""Stripes: 6x6 grey images, bright in the top or in the bottom half."""

import numpy as np

from experiments import (DataConfig, Experiment, ExperimentConfig, TrainConfig, register,
                         register_dataset)


def stripes(source_dir=None, download_dir=None):
    rng = np.random.default_rng(0)

    def split(n):
        labels = rng.integers(0, 2, n)
        images = rng.integers(0, 60, (n, 6, 6, 1)).astype(np.uint8)
        images[labels == 0, :3] += 150
        images[labels == 1, 3:] += 150
        return {"image": images, "label": labels}

    return {"train": split(640), "test": split(200)}


register_dataset("ek_stripes", "6x6 grey stripes, bright top or bottom", stripes,
                 labels={"label": {"num_classes": 2, "class_names": ["top", "bottom"]}})


def dense(hparams, data):
    import tensorflow as tf

    inputs = tf.keras.Input(shape=data.input_shape, name=data.input_name)
    x = tf.keras.layers.Flatten()(tf.keras.layers.Rescaling(1 / 255)(inputs))
    x = tf.keras.layers.Dense(hparams["units"], activation="relu")(x)
    outputs = tf.keras.layers.Dense(data.num_classes, activation="softmax")(x)
    return tf.keras.Model(inputs, outputs)


register(Experiment(
    config=ExperimentConfig(
        name="ek_stripes_dense", description="a small dense net on stripes",
        data=DataConfig(dataset="ek_stripes"),
        train=TrainConfig(batch_size=32, max_steps=60, eval_every_steps=60,
                          log_every_steps=20, learning_rate=0.01),
        model={"units": 16}),
    build_model=dense))
'''

SETUP_PY = f'''from setuptools import setup

setup(name="{DISTRIBUTION}", version="0.1", py_modules=["{MODULE}"],
      entry_points={{"estimator_keras.experiments": ["{ENTRY_POINT} = {MODULE}"]}})
'''


def write_package(directory, source=PLUGIN_SOURCE, setup_py=SETUP_PY, module=MODULE):
    """The user's package folder: setup.py and one module; returns its path."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "setup.py"), "w", encoding="utf-8") as f:
        f.write(setup_py)
    with open(os.path.join(directory, module + ".py"), "w", encoding="utf-8") as f:
        f.write(source)
    return str(directory)


def install_offline(package_dir, site_dir, timeout=180):
    """``pip install`` of the package into ``site_dir`` only: no index, no
    build isolation, no dependencies (nothing is downloaded, and the test
    environment itself is left as it is). It builds from a copy, so that no
    build or egg-info folder lands in ``package_dir``."""
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    source = tempfile.mkdtemp(prefix="ek-plugin-build-")
    shutil.copytree(str(package_dir), source, dirs_exist_ok=True)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
             "--no-index", "--target", str(site_dir), source],
            env=env, capture_output=True, text=True, timeout=timeout)
    finally:
        shutil.rmtree(source)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return str(site_dir)


def plugin_env(*site_dirs, **extra):
    """The CLI's environment: this tree and ``site_dirs`` importable, no
    EK_MODULES unless given."""
    env = child_env()
    env.pop("EK_MODULES", None)
    env["PYTHONPATH"] = os.pathsep.join([str(s) for s in site_dirs] + [env["PYTHONPATH"]])
    env.update(extra)
    return env


def run_cli(*args, cwd, env=None, timeout=120):
    """``python -m experiments ARGS`` in ``cwd``: (returncode, stdout, stderr)."""
    proc = subprocess.run([sys.executable, "-m", "experiments", *map(str, args)],
                          cwd=str(cwd), env=env or plugin_env(), capture_output=True,
                          text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def read_export(export_dir):
    with open(os.path.join(str(export_dir), "export.json"), encoding="utf-8") as f:
        return json.load(f)


# A model with an Embedding (sparse gradients): tests/test_embeddings.py.
EMBEDDING_MODULE = "ek_tags_plugin"
EMBEDDING_EXPERIMENT = "ek_tags_embedding"
EMBEDDING_DATASET = "ek_tags"

EMBEDDING_SOURCE = '''"""Tags: a float vector of noise and an int64 category; the label is the
category's class, so only the category's embedding can learn it."""

import numpy as np

from experiments import (DataConfig, Experiment, ExperimentConfig, TrainConfig, register,
                         register_dataset)

CATEGORIES = 16


def tags(source_dir=None, download_dir=None):
    rng = np.random.default_rng(0)
    classes = rng.permutation(np.arange(CATEGORIES) % 2)

    def split(n):
        category = rng.integers(0, CATEGORIES, n).astype(np.int64)
        vector = rng.standard_normal((n, 3)).astype(np.float32)
        return {"vector": vector, "category": category, "label": classes[category]}

    return {"train": split(64), "test": split(64)}


register_dataset("ek_tags", "a noise vector and an int64 category", tags,
                 labels={"label": {"num_classes": 2, "class_names": ["no", "yes"]}})


def embedding(hparams, data):
    import tensorflow as tf

    vector = tf.keras.Input(shape=(3,), name="vector")
    category = tf.keras.Input(shape=(), dtype="int64", name="category")
    embedded = tf.keras.layers.Embedding(CATEGORIES, hparams["dim"])(category)
    x = tf.keras.layers.Concatenate()([vector, embedded])
    outputs = tf.keras.layers.Dense(2, activation="softmax")(x)
    return tf.keras.Model([vector, category], outputs)


# Records in file order: in a cluster each task's epoch (one of the 2 train
# files) is a full batch and a short one, and the tasks' short batches come at
# the same steps. Sixteen categories in 2 dimensions: a random embedding does
# not separate their classes, a trained one does.
register(Experiment(
    config=ExperimentConfig(
        name="ek_tags_embedding", description="a category's embedding beside a vector",
        data=DataConfig(dataset="ek_tags", features={"vector": "vector", "category": "category"},
                        shuffle="none"),
        train=TrainConfig(batch_size=24, max_steps=30, eval_every_steps=30,
                          log_every_steps=10, learning_rate=0.05),
        model={"dim": 2}),
    build_model=embedding))

'''


def write_module(directory, source, module):
    """The user's module file ``directory/module.py``, for ``--module``; returns its path."""
    os.makedirs(str(directory), exist_ok=True)
    path = os.path.join(str(directory), module + ".py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(source)
    return path


def prepare_embedding_data(root):
    """The embedding plugin module written under ``root`` and a data dir
    holding its dataset in 2 train files (one per training task)."""
    module = write_module(root, EMBEDDING_SOURCE, EMBEDDING_MODULE)
    data_dir = str(root / "data")
    rc, _, err = run_cli("--module", module, "prepare", EMBEDDING_DATASET, "--data-dir", data_dir,
                         "--shards", 2, cwd=root, timeout=180)
    assert rc == 0, err[-3000:]
    return module, data_dir
