"""Tuning on every engine: each engine's evaluations reach the study's pruner
while the trial trains (``train --evaluations-file``), a pruned trial is
stopped by SIGTERM and keeps its checkpoint, and the issue's own command
(TPE, Hyperband, 12 trials, 2 at a time) prints pruned trials and plots.

The estimator runs in py311 (TensorFlow 2.15); keras, and keras3 on JAX and
on TensorFlow, in the keras env (TensorFlow 2.21, tf-keras, Keras 3, JAX).
"""

import csv
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from estimator_keras.engines import model_dirs
from support import ROOT, child_env

pytestmark = pytest.mark.slow

# (engine flag, KERAS_BACKEND or None)
ENGINES = {"estimator": ("estimator", None), "keras": ("keras", None),
           "keras3-jax": ("keras3", "jax"), "keras3-tensorflow": ("keras3", "tensorflow")}


def _can_run(case):
    engine, backend = ENGINES[case]
    if engine == "estimator":
        return importlib.util.find_spec("tensorflow_estimator") is not None, \
            "tf.estimator ends with TensorFlow 2.15"
    if engine == "keras":
        return importlib.util.find_spec("tf_keras") is not None or \
            importlib.util.find_spec("tensorflow_estimator") is not None, "no tf-keras"
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    if int(tf.__version__.split(".")[1]) < 16:
        return False, "Keras 3 needs TensorFlow 2.16+"
    if backend == "jax" and importlib.util.find_spec("jax") is None:
        return False, "no JAX"
    return True, ""


def _env(case):
    engine, backend = ENGINES[case]
    env = child_env()
    if engine == "keras3":
        env["KERAS_BACKEND"] = backend
        env.pop("TF_USE_LEGACY_KERAS", None)
    return env


def _tune(*args, env, timeout):
    return subprocess.run([sys.executable, "-m", "experiments", "tune", *map(str, args)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _enqueue(study_dir, name, values):
    """Pins the order of the first trials: the study, made before ``tune``
    opens it, holds them in its queue."""
    import optuna  # pylint: disable=import-outside-toplevel
    study = optuna.create_study(storage="sqlite:///%s" % (study_dir / "study.db"),
                                study_name=name, direction="maximize")
    for value in values:
        study.enqueue_trial(value)


@pytest.mark.parametrize("case", list(ENGINES))
def test_a_trial_falling_behind_is_pruned_at_an_evaluation(case, fashion_data, tmp_path):
    ok, why = _can_run(case)
    if not ok:
        pytest.skip(why)
    engine, _ = ENGINES[case]
    space = tmp_path / "space.yaml"
    space.write_text("learning_rate: {type: discrete, values: [0.003, 0.000001]}\n")
    study_dir = tmp_path / "study"
    study_dir.mkdir()
    # A learning rate that learns, then one that barely moves: at the first
    # evaluation successive halving keeps the better third (here, the first).
    _enqueue(study_dir, "fashion_mnist_mlp",
             [{"learning_rate": 0.003}, {"learning_rate": 0.000001}])
    done = _tune("fashion_mnist_mlp", "--space", space, "--algorithm", "grid", "--trials", 2,
                 "--pruner", "asha", "--model-dir", study_dir, "--data-dir", fashion_data,
                 "--engine", engine, "--max-steps", 600, "--eval-every", 100,
                 "--batch-size", 32, "--strategy", "none", env=_env(case), timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    with open(study_dir / "trials.csv", encoding="utf-8") as f:
        rows = {r["trial"]: r for r in csv.DictReader(f)}
    assert rows["0"]["status"] == "succeeded" and rows["0"]["steps"] == "600", rows
    assert rows["1"]["status"] == "pruned", rows
    assert rows["1"]["message"].startswith("pruned at step 100"), rows["1"]
    assert float(rows["1"]["accuracy"]) < float(rows["0"]["accuracy"])
    assert "trial 1 pruned at step 100" in done.stderr
    # Each evaluation of the engine reached the study, as it happened.
    with open(study_dir / "trial-0" / "evaluations.jsonl", encoding="utf-8") as f:
        steps = [json.loads(line)["step"] for line in f]
    assert steps == [100, 200, 300, 400, 500, 600]
    # The pruned trial saved its checkpoint on the SIGTERM, said at which
    # step (its row's steps: what it trained), and exported nothing.
    pruned = study_dir / "trial-1"
    with open(pruned / "evaluations.jsonl", encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    assert records[0]["step"] == 100 and records[-1].get("stopped") is True, (
        records, (pruned / "train.log").read_text()[-6000:])
    assert int(rows["1"]["steps"]) == records[-1]["step"] >= 100
    assert model_dirs.any_checkpoint(str(pruned))
    assert not (pruned / "export").exists()
    assert "exit 75" not in rows["1"]["message"]


def test_the_issues_study_prunes_and_draws_its_plots(fashion_data, tmp_path):
    ok, why = _can_run("keras3-jax")
    if not ok:
        pytest.skip(why)
    space = tmp_path / "space.yaml"
    space.write_text("learning_rate: {type: double, min: 0.00001, max: 0.1, scale: log}\n"
                     "units: {type: integer, min: 16, max: 256, scale: log}\n")
    study_dir = tmp_path / "study"
    done = _tune("fashion_mnist_mlp", "--space", space, "--algorithm", "tpe", "--pruner",
                 "hyperband", "--trials", 12, "--parallel", 2, "--seed", 3, "--model-dir",
                 study_dir, "--data-dir", fashion_data, "--engine", "keras3", "--max-steps",
                 450, "--eval-every", 50, "--batch-size", 32, env=_env("keras3-jax"),
                 timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    with open(study_dir / "trials.json", encoding="utf-8") as f:
        trials = json.load(f)["trials"]
    assert len(trials) == 12 and len({t["trial"] for t in trials}) == 12
    pruned = [t for t in trials if t["status"] == "pruned"]
    assert pruned and all(t["steps"] < 450 for t in pruned), trials
    assert all(t["status"] in ("succeeded", "pruned") for t in trials)
    for t in pruned:
        assert "[tune] trial %d pruned at step %d" % (t["trial"], t["pruned_at"]) in done.stderr
    assert "best trial" in done.stdout
    for name in ("optimization_history", "param_importances", "intermediate_values"):
        assert os.path.getsize(study_dir / (name + ".png")) > 10000
    best = json.loads((study_dir / "best" / "trial.json").read_text())
    assert best["value"] == max(t["metric"] for t in trials if t["status"] == "succeeded")
