"""A newcomer's first hour: each slip is answered with what was wrong and
what to do, before TensorFlow loads; --track says a run is recorded only
once MLflow has it; the checkout installs through its build backend and
ignores what the docs' examples leave in it."""

import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

from estimator_keras.errors import ConfigError
from estimator_keras.tuning import space as space_lib
from experiments import cli
from docs_pages import DOC_PATHS, TITLE
from support import ROOT, child_env


def _usage_error(capsys, argv):
    """stderr of a command line refused with exit 2 (by argparse or a command)."""
    try:
        rc = cli.main(argv)
    except SystemExit as e:
        rc = e.code
    assert rc == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("body, says", [
    ("{tpye: double, min: 0.0001, max: 0.01}",
     "parameter 'learning_rate': unknown key 'tpye' (did you mean type?) and no type; "
     "expected type: one of double, integer, discrete, categorical."),
    ("{type: doubel, min: 0.0001, max: 0.01}",
     "parameter 'learning_rate': unknown type 'doubel' (did you mean double?)"),
    ("{type: discrete, value: [0.1, 0.2]}",
     "parameter 'learning_rate': unknown key 'value' (did you mean values?) for type discrete"),
], ids=["tpye", "doubel", "value"])
def test_a_misspelt_field_of_a_space_file_is_named_with_the_close_one(tmp_path, body, says):
    path = tmp_path / "space.yaml"
    path.write_text(f"learning_rate: {body}\n")
    with pytest.raises(ConfigError) as e:
        space_lib.load_space(str(path))
    assert str(e.value).startswith(f"{path}: {says}"), str(e.value)


def test_a_bad_value_in_a_config_file_names_the_file_and_the_key(capsys, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  max_steps: lots\n")
    err = _usage_error(capsys, ["show", "fashion_mnist_mlp", "--config", str(path)])
    assert f"error: --config {path}: train.max_steps='lots': expected int (default 6000)." in err
    path.write_text("model:\n  units: [64]\n")
    err = _usage_error(capsys, ["show", "fashion_mnist_mlp", "--config", str(path)])
    assert f"error: --config {path}: model.units: expected int like the default" in err
    # --hparams says what it is.
    err = _usage_error(capsys, ["show", "fashion_mnist_mlp", "--hparams", "max_steps=lots"])
    assert "error: hparam max_steps='lots': expected int (default 6000)." in err


def test_a_misspelt_hparam_is_named_with_the_close_one(capsys):
    err = _usage_error(capsys, ["show", "fashion_mnist_mlp", "--hparams", "learnig_rate=0.1"])
    assert "unknown hparam 'learnig_rate' (did you mean learning_rate?) for experiment " \
           "'fashion_mnist_mlp'; valid: batch_size," in err
    err = _usage_error(capsys, ["show", "fashion_mnist_cnn", "--hparams", "dropuot=0.3"])
    assert "unknown hparam 'dropuot' (did you mean dropout?)" in err
    err = _usage_error(capsys, ["show", "fashion_mnist_cnn", "--hparams", "warp_speed=9"])
    assert "unknown hparam 'warp_speed' for experiment" in err  # nothing close: no guess


def test_a_dataset_folder_that_does_not_exist_is_named_as_missing(capsys, tmp_path):
    missing = tmp_path / "photos"
    err = _usage_error(capsys, ["train", "image_classifier", "--dataset", str(missing),
                                "--model-dir", str(tmp_path / "m"), "--data-dir",
                                str(tmp_path / "data")])
    assert f"error: --dataset '{missing}': no such folder." in err
    assert "prepare images" not in err  # nothing there to prepare from
    assert not (tmp_path / "m").exists() and not (tmp_path / "data").exists()


def test_a_commands_flag_before_the_command_is_told_where_it_goes(capsys, tmp_path):
    err = _usage_error(capsys, ["--max-steps", "10", "train", "fashion_mnist_mlp",
                                "--model-dir", str(tmp_path / "m")])
    assert ("error: --max-steps 10: a command's flags go after the command, as in "
            f"`python -m experiments train fashion_mnist_mlp --model-dir {tmp_path / 'm'} "
            "--max-steps 10`; only --module and --verbose may come before it.") in err
    assert "invalid choice" not in err
    err = _usage_error(capsys, ["--verbose", "--engine=keras3", "evaluate", "x"])
    assert "`python -m experiments --verbose evaluate x --engine=keras3`" in err
    assert not (tmp_path / "m").exists()


def test_the_estimator_engine_where_it_cannot_run_suggests_the_engines_that_can():
    from estimator_keras import engines  # pylint: disable=import-outside-toplevel
    runs_here = {name for name, ok, _ in engines.statuses() if ok}
    if "estimator" in runs_here:
        pytest.skip("the estimator engine runs here")
    with pytest.raises(ConfigError) as e:
        engines.resolve_engine("estimator")
    suggested = set(re.findall(r"--engine (\w+)", str(e.value)))
    assert suggested == runs_here and runs_here, (str(e.value), runs_here)


CHILD = """
import sys
from experiments import cli
try:
    rc = cli.main(sys.argv[1:])
except SystemExit as e:
    rc = e.code
print(rc, "tensorflow" in sys.modules)
"""


@pytest.mark.slow
@pytest.mark.parametrize("argv, says", [
    (["train", "fashion_mnist_mpl"], "(did you mean fashion_mnist_mlp?)"),
    (["train", "fashion_mnist_mlp", "--hparams", "learnig_rate=0.1"], "unknown hparam"),
    (["train", "fashion_mnist_mlp", "--preemption-grace", "-1"], "--preemption-grace must"),
    (["train", "fashion_mnist_mlp", "--max-steps", "lots"], "invalid int value: 'lots'"),
    (["train", "image_classifier", "--dataset", "no/such/folder"], "no such folder"),
    (["evaluate", "fashion_mnist_mlp", "--hparams", "units=many"], "hparam units='many'"),
    (["export", "no_such_experiment"], "unknown experiment"),
], ids=lambda v: "-".join(v) if isinstance(v, list) else "")
def test_usage_errors_are_answered_before_tensorflow_is_imported(tmp_path, argv, says):
    proc = subprocess.run([sys.executable, "-c", CHILD, *argv, "--model-dir",
                           str(tmp_path / "m")], cwd=tmp_path, env=child_env(),
                          capture_output=True, text=True, timeout=120)
    assert says in proc.stderr, proc.stderr[-3000:]
    assert proc.stdout.split() == ["2", "False"], (proc.stdout, proc.stderr[-3000:])


@pytest.mark.slow
def test_track_says_the_run_is_recorded_only_once_mlflow_has_it(fashion_data, tmp_path):
    """A tracking server that is down never has the run: training goes on,
    with the warning, and no line says the run is recorded. (Where MLflow
    has it, the tracking page's run shows the line: tests/test_docs.py.)"""
    pytest.importorskip("mlflow")
    from mlflow_server import free_port  # pylint: disable=import-outside-toplevel
    proc = subprocess.run(
        [sys.executable, "-m", "experiments", "train", "fashion_mnist_mlp", "--data-dir",
         str(fashion_data), "--model-dir", str(tmp_path / "m"), "--max-steps", "2",
         "--eval-every", "2", "--track", f"http://127.0.0.1:{free_port()}"],
        cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "warning: tracking to http://127.0.0.1:" in proc.stderr, proc.stderr[-3000:]
    assert "recorded in MLflow" not in proc.stderr and "continues in MLflow" not in proc.stderr


def _written_by_the_docs():
    """The files the docs' examples write in the checkout's folder: titled
    blocks, `cat > FILE`, `--output FILE` and `... > FILE`."""
    found = set()
    for path in DOC_PATHS:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        found.update(t.split(",")[0] for t in TITLE.findall(text))
        found.update(re.findall(r"(?:cat >|--output|['\"] >) ([\w.-]+\.\w+)\b", text))
    return found


@pytest.mark.slow
def test_what_tracking_and_the_docs_examples_leave_in_the_checkout_is_ignored():
    written = _written_by_the_docs()
    assert {"my_experiments.py", "predict.py", "space.yaml", "bad.yaml"} <= written, written
    paths = sorted(written | {"mlflow.db", "mlruns/0/meta.yaml"})
    proc = subprocess.run(["git", "-C", ROOT, "check-ignore", "--no-index", *paths],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode in (0, 1), proc.stderr
    assert sorted(proc.stdout.split()) == paths


def test_the_tracking_pages_study_has_its_own_model_dir():
    def model_dirs(page):
        with open(os.path.join(ROOT, "docs", "howto", page), encoding="utf-8") as f:
            return set(re.findall(r"experiments tune .*?--model-dir (\S+)", f.read(), re.S))

    tracking = model_dirs("tracking.md")
    assert tracking and not tracking & model_dirs("tuning.md"), tracking


@pytest.mark.slow
def test_the_checkout_installs_editable_through_its_build_backend(tmp_path):
    """pip builds the package through pyproject.toml's backend (PEP 517/660),
    not setup.py's legacy path, and the wheel keeps setup.py's extras."""
    import tomllib  # pylint: disable=import-outside-toplevel  (Python 3.11+)
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        system = tomllib.load(f)["build-system"]
    assert system["build-backend"] == "setuptools.build_meta", system
    # A copy: the backend writes its egg-info and build folders beside the sources.
    source = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("estimator_keras", "experiments"):
        shutil.copytree(os.path.join(ROOT, name), source / name, ignore=ignore)
    for name in ("setup.py", "pyproject.toml", "README.md", "MANIFEST.in"):
        shutil.copy(os.path.join(ROOT, name), source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    offline = ["--no-deps", "--no-index", "--no-build-isolation"]
    proc = subprocess.run([*pip, "install", "--dry-run", *offline, "-e", str(source)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Preparing editable metadata (pyproject.toml)" in proc.stdout, proc.stdout
    assert "DEPRECATION" not in proc.stdout + proc.stderr
    proc = subprocess.run([*pip, "wheel", *offline, "-q", "-w", str(tmp_path / "w"),
                           str(source)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = (tmp_path / "w").glob("estimator_keras-*.whl")
    with zipfile.ZipFile(wheel) as z:
        metadata = z.read(next(n for n in z.namelist()
                               if n.endswith(".dist-info/METADATA"))).decode()
    for extra in ("cpu", "gpu", "jax", "keras", "tune", "mlflow", "test"):
        assert f"Provides-Extra: {extra}\n" in metadata, extra
    assert re.search(r'Requires-Dist: tensorflow-cpu==2\.21\.\*; python_version >= "3\.12" '
                     r'and extra == "cpu"', metadata), metadata
