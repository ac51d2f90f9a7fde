"""The package a cloud job would receive really runs, and a run under
Vertex AI's environment writes where Vertex expects."""

import inspect
import json
import os
import pathlib
import subprocess
import sys
import sysconfig
import tarfile

import pytest

from estimator_keras.cloud import packaging, vertex
from estimator_keras.cloud.spec import JobSpec
from estimator_keras.tuning import space as space_lib
from support import ROOT, assert_vertex_layout, cli, session_hparams, vertex_env

pytestmark = pytest.mark.slow


def test_sdist_installs_offline_and_runs(fashion_data, tmp_path):
    sdist = packaging.build_sdist(ROOT, str(tmp_path / "dist"))
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    for module in ("estimator_keras/records.py", "estimator_keras/inputs.py",
                   "experiments/__main__.py", "experiments/catalog/fashion_mnist.py", "setup.py"):
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


def _require_wiring(tuning=False):
    """What these tests need: export_model(..., flat=True) for Vertex's layout,
    and for a tuning trial `train --tuning-trial --hypertune-metric M`."""
    from estimator_keras import export  # pylint: disable=import-outside-toplevel
    from experiments import cli  # pylint: disable=import-outside-toplevel
    missing = []
    if "flat" not in inspect.signature(export.export_model).parameters:
        missing.append("export_model(..., flat=True)")
    if tuning:
        try:
            cli.build_parser().parse_args(["train", "x", "--tuning-trial",
                                           "--hypertune-metric", "accuracy"])
        except SystemExit:
            missing.append("train --tuning-trial --hypertune-metric")
    assert not missing, "not wired: " + ", ".join(missing)


BUCKET = "gs://my-bucket"


def _vertex_run(request, fashion_data, bucket, trial_id=None, appended=()):
    """Runs what Vertex would run for ``request``'s chief, here: its args with
    local folders standing in for gs:// (data -> the prepared Fashion-MNIST
    slice), and the AIP_* variables Vertex sets for the job's base output
    directory (per trial for a tuning job)."""
    job_spec = request.get("jobSpec") or request["trialJobSpec"]
    package = job_spec["workerPoolSpecs"][0]["pythonPackageSpec"]

    def local(uri):
        if uri == BUCKET + "/data":
            return str(fashion_data)
        return uri.replace(BUCKET, str(bucket)) if uri.startswith(BUCKET) else uri

    args = [local(a) for a in package["args"]] + list(appended)
    assert package["pythonModule"] == "experiments" and args[0] == "train"
    assert "--model-dir" not in args
    base = local(job_spec["baseOutputDirectory"]["outputUriPrefix"])
    if trial_id is not None:
        base = "%s/%s" % (base, trial_id)
    env = vertex_env(base, trial_id)
    rc, out, err = cli(*args, env=env)
    assert rc == 0, err[-3000:]
    return pathlib.Path(base), out


def _assert_vertex_layout(base, out):
    info, events = assert_vertex_layout(base, "model.h5")
    assert str(base / "model" / "model.h5") in out
    assert 0.0 < info["metrics"]["accuracy"] <= 1.0
    return info, events


def test_vertex_environment_decides_where_things_go(fashion_data, tmp_path):
    """The pair together: the arguments `submit` builds, run with the AIP_*
    variables Vertex sets for that job's base output directory, write where
    Vertex expects."""
    _require_wiring()
    spec = JobSpec(experiment="fashion_mnist_mlp", project="my-project-123",
                   region="us-central1", job_dir=BUCKET + "/job", data_dir=BUCKET + "/data",
                   package_uri=BUCKET + "/job/packages/estimator_keras-0.2.0.tar.gz",
                   train_args=["--max-steps", "20", "--eval-every", "20", "--batch-size", "32"])
    base, out = _vertex_run(vertex.build_custom_job(spec), fashion_data, tmp_path / "bucket")
    assert base == tmp_path / "bucket" / "job"
    _assert_vertex_layout(base, out)
    assert sorted(os.listdir(base)) == ["checkpoints", "logs", "model"]


def test_vertex_tuning_trial_reports_its_metric_and_hparams(fashion_data, tmp_path):
    """A trial of `submit --tune`: its args, plus the value Vertex appends, with
    the per-trial AIP_* folders; it reports the metric the documented way and
    writes HParams summaries."""
    _require_wiring(tuning=True)
    space = tmp_path / "space.yaml"
    space.write_text("learning_rate: {type: double, min: 0.0001, max: 0.01, scale: log}\n")
    spec = JobSpec(experiment="fashion_mnist_mlp", project="my-project-123",
                   region="us-central1", job_dir=BUCKET + "/tune", data_dir=BUCKET + "/data",
                   package_uri=BUCKET + "/tune/packages/estimator_keras-0.2.0.tar.gz",
                   train_args=["--max-steps", "20", "--eval-every", "20", "--batch-size", "32"])
    study = space_lib.Study(space_lib.load_space(str(space)), metric="accuracy", max_trials=2)
    base, out = _vertex_run(vertex.build_tuning_job(spec, study), fashion_data,
                            tmp_path / "bucket", trial_id=3, appended=["--learning_rate=0.003"])
    assert base == tmp_path / "bucket" / "tune" / "3"
    info, events = _assert_vertex_layout(base, out)

    (line,) = (base / "hypertune" / "output.metrics").read_text().splitlines()
    report = json.loads(line)
    assert report["trial"] == "3" and report["global_step"] == "20"
    assert float(report["accuracy"]) == pytest.approx(info["metrics"]["accuracy"])

    assert session_hparams(events)["learning_rate"].number_value == pytest.approx(0.003)
