"""The package a cloud job would receive really runs, and a run under
Vertex AI's environment writes where Vertex expects."""

import json
import os
import subprocess
import sys
import sysconfig
import tarfile

import pytest

from estimator_keras.cloud import packaging
from estimator_keras.distribute.launcher import free_ports
from support import ROOT, checkpoint_steps, child_env, cli

pytestmark = pytest.mark.slow


def test_sdist_installs_offline_and_runs(fashion_data, tmp_path):
    sdist = packaging.build_sdist(ROOT, str(tmp_path / "dist"))
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    for module in ("estimator_keras/records.py", "estimator_keras/inputs.py",
                   "experiments/__main__.py", "experiments/fashion_mnist.py", "setup.py"):
        assert any(n.endswith(module) for n in names), module

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    # The already-installed TensorFlow, seen through a .pth file: no network.
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip()
    with open(os.path.join(site, "outer.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TF_CONFIG")}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PIP_NO_INDEX="1")
    done = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                           "--no-build-isolation", sdist], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    work = tmp_path / "elsewhere"  # not the checkout: imports must come from the venv
    work.mkdir()
    where = subprocess.run([python, "-c", "import experiments, estimator_keras; "
                            "print(experiments.__file__, estimator_keras.__file__)"],
                           cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr
    assert where.stdout.count(str(venv)) == 2, where.stdout

    listing = subprocess.run([python, "-m", "experiments", "list"], cwd=work, env=env,
                             capture_output=True, text=True, timeout=120)
    assert listing.returncode == 0 and "fashion_mnist_cnn" in listing.stdout
    run = subprocess.run([python, "-m", "experiments", "train", "fashion_mnist_mlp",
                          "--data-dir", str(fashion_data), "--model-dir", str(work / "run"),
                          "--max-steps", "20", "--eval-every", "20", "--batch-size", "32"],
                         cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (work / "run" / "export" / "model.h5").exists()


def test_vertex_environment_decides_where_things_go(fashion_data, tmp_path):
    base = tmp_path / "job"
    env = child_env(
        AIP_MODEL_DIR=f"{base}/model/", AIP_CHECKPOINT_DIR=f"{base}/checkpoints/",
        AIP_TENSORBOARD_LOG_DIR=f"{base}/logs/",
        # As Vertex sets it for a single-replica job: the chief alone.
        TF_CONFIG=json.dumps({"cluster": {"chief": [f"127.0.0.1:{free_ports(1)[0]}"]},
                              "task": {"type": "chief", "index": 0}, "job": {}}))
    rc, out, err = cli("train", "fashion_mnist_mlp", "--data-dir", fashion_data,
                       "--max-steps", 20, "--eval-every", 20, "--batch-size", 32, env=env)
    assert rc == 0, err[-3000:]
    assert checkpoint_steps(base / "checkpoints")[-1] == 20
    assert (base / "model" / "model.h5").exists()
    assert (base / "model" / "saved_model" / "saved_model.pb").exists()
    assert [n for n in os.listdir(base / "logs") if n.startswith("events.out.tfevents")]
    assert str(base / "model" / "model.h5") in out
