"""Local studies as they run: how a trial's end is recorded (real children,
real signals), Optuna's CMA-ES and QMC samplers on real spaces, and a study
that two ``tune`` commands share on one PostgreSQL server, each trial a real
``train``."""

import argparse
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys

import pytest

from estimator_keras.engines import model_dirs
from estimator_keras.errors import ConfigError
from estimator_keras.tuning import space as space_lib
from estimator_keras.tuning import optuna_search as search
from experiments.commands import tune as tune_cmd
from experiments.tuning import runner as tune
from support import ROOT, child_env
from tune_trainer import fake_python  # pylint: disable=unused-import


def _config(tmp_path, python, space_text, trials, algorithm="random", parallel=1, **kwargs):
    path = tmp_path / "space.yaml"
    path.write_text(space_text)
    space = space_lib.load_space(str(path))
    study = space_lib.Study(space, metric="accuracy", goal="max", max_trials=trials,
                            parallel_trials=parallel)
    kwargs.setdefault("seed", 0)
    return tune.StudyConfig("fake", study, str(tmp_path / "study"), python=python,
                            train_args=["--max-steps", "7"], algorithm=algorithm,
                            grace_s=5.0, plots=False, **kwargs)


def _states(config):
    study, _ = tune.open_study(config)
    return {t.number: t for t in study.get_trials(deepcopy=False)}


def _signals(trial):
    """The signals the stand-in trainer of ``trial`` got."""
    path = os.path.join(trial.model_dir, "signals.txt")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return f.read().split()


# ------------------------------------------------------- how a trial's end is recorded


def test_a_trial_that_exits_0_after_the_pruners_sigterm_is_recorded_by_its_exit(
        tmp_path, fake_python, monkeypatch):
    # Successive halving keeps a trial at a rung only if it is the best there
    # so far (fewer than three have reached it): the trials after the first,
    # worse at step 1, are each pruned there and get SIGTERM.
    monkeypatch.setenv("FAKE_EVALS", "7")
    monkeypatch.setenv("FAKE_EVAL_PAUSE", "0.25")
    config = _config(tmp_path, fake_python,
                     "x: {type: discrete, values: [0.9, 0.1]}\n"
                     "mode: {type: categorical, values: [ok, finish, quit0]}\n",
                     trials=4, pruner="asha", first_eval_step=1, max_steps=7)
    study, _ = tune.open_study(config)
    for x, mode in ((0.9, "ok"), (0.1, "finish"), (0.1, "quit0"), (0.1, "ok")):
        study.enqueue_trial({"x": x, "mode": mode})
    result = tune.run_study(config)
    by = {(t.hparams["x"], t.hparams["mode"]): t for t in result.trials}
    states = _states(config)

    first = by[(0.9, "ok")]
    assert first.status == "succeeded" and _signals(first) == []
    assert states[first.trial].state.name == "COMPLETE"

    # The pruner stopped these at step 1: each got the signal.
    finished, quit0, stopped = by[(0.1, "finish")], by[(0.1, "quit0")], by[(0.1, "ok")]
    for trial in (finished, quit0, stopped):
        assert _signals(trial) == ["SIGTERM"], trial

    # It trained to its end and exported before the signal took effect, and
    # exited 0: complete, with its export's metric and steps.
    assert finished.status == "succeeded", finished
    assert states[finished.trial].state.name == "COMPLETE"
    assert states[finished.trial].value == pytest.approx(0.1) == finished.metric
    assert finished.steps == 7 and finished.export_dir == os.path.join(
        finished.model_dir, "export")
    assert "pruned at step 1" in finished.message and finished.pruned_at is None

    # Exit 0 with nothing exported, or 75 once its checkpoint was saved: pruned.
    for trial in (quit0, stopped):
        assert trial.status == "pruned" and trial.pruned_at == 1, trial
        assert states[trial.trial].state.name == "PRUNED"
        assert trial.message == "pruned at step 1" and trial.export_dir is None
        assert not os.path.exists(os.path.join(trial.model_dir, "export"))
    assert result.best.trial == first.trial


def test_the_evaluation_at_the_last_step_is_not_judged(tmp_path, fake_python, monkeypatch):
    # One evaluation, at the trial's last step: the second trial is worse
    # there, but nothing is left to prune; it ends by itself.
    monkeypatch.setenv("FAKE_EVALS", "1")
    monkeypatch.setenv("FAKE_EVAL_PAUSE", "0.5")
    config = _config(tmp_path, fake_python, "x: {type: discrete, values: [0.9, 0.1]}\n",
                     trials=2, pruner="asha", first_eval_step=1, max_steps=1)
    study, _ = tune.open_study(config)
    for x in (0.9, 0.1):
        study.enqueue_trial({"x": x})
    result = tune.run_study(config)
    assert [(t.hparams["x"], t.status) for t in result.trials] == [
        (0.9, "succeeded"), (0.1, "succeeded")]
    assert all(_signals(t) == [] for t in result.trials)


def test_the_last_step_is_the_one_every_trial_trains(tmp_path):
    parser = argparse.ArgumentParser(prog="experiments")
    tune_cmd.add_parser(parser.add_subparsers(dest="command"))
    space = tmp_path / "space.yaml"
    space.write_text("learning_rate: {type: double, min: 0.0001, max: 0.1, scale: log}\n")

    def config(*extra):
        return tune_cmd.build_config(parser.parse_args(
            ["tune", "fashion_mnist_mlp", "--space", str(space), "--model-dir",
             str(tmp_path / "study"), *extra]))

    # Given as tune's fixed hparams as well as by the flags.
    by_hparams = config("--hparams", "max_steps=40,eval_every_steps=20")
    assert (by_hparams.max_steps, by_hparams.first_eval_step) == (40, 20)
    by_flags = config("--max-steps", "30", "--eval-every", "50")
    assert (by_flags.max_steps, by_flags.first_eval_step) == (30, 30)


# ------------------------------------------------------------- CMA-ES and QMC


def test_cmaes_samples_a_space_of_two_ranges_generation_by_generation(tmp_path, fake_python):
    config = _config(tmp_path, fake_python,
                     "x: {type: double, min: 0.0, max: 1.0}\n"
                     "units: {type: integer, min: 8, max: 512, scale: log}\n",
                     trials=8, algorithm="cmaes", seed=5)
    result = tune.run_study(config)
    assert len(result.trials) == 8 and all(t.status == "succeeded" for t in result.trials)
    for t in result.trials:
        assert 0.0 <= t.hparams["x"] <= 1.0 and isinstance(t.hparams["units"], int)
        assert 8 <= t.hparams["units"] <= 512
    trials = _states(config)
    # Optuna's CmaEsSampler drew every trial after its first (a random
    # start), keeping its optimizer in the storage between the samplers tune
    # makes for each draw: its first generation (6 trials for two
    # parameters), then, told their results, the second.
    generations = [trials[n].system_attrs.get("cma:generation") for n in sorted(trials)]
    assert generations == [None] + [0] * 6 + [1], generations
    assert any(k.startswith("cma:optimizer") for t in trials.values() for k in t.system_attrs)


def test_cmaes_refuses_a_space_of_one_range(tmp_path):
    parser = argparse.ArgumentParser(prog="experiments")
    tune_cmd.add_parser(parser.add_subparsers(dest="command"))
    space = tmp_path / "space.yaml"
    space.write_text("learning_rate: {type: double, min: 0.0001, max: 0.1, scale: log}\n")
    args = parser.parse_args(["tune", "fashion_mnist_mlp", "--space", str(space), "--model-dir",
                              str(tmp_path / "study"), "--algorithm", "cmaes"])
    with pytest.raises(ConfigError) as refused:
        tune_cmd.build_config(args)
    message = str(refused.value)
    assert str(space) in message and "two or more numeric ranges" in message
    assert "has 1: learning_rate" in message and "--algorithm tpe or qmc" in message
    with pytest.raises(ConfigError, match="two or more numeric ranges"):
        search.sampler(space_lib.load_space(str(space)), "cmaes", seed=1)
    # QMC takes the same space.
    assert type(search.sampler(space_lib.load_space(str(space)), "qmc", seed=1)).__name__ == \
        "QMCSampler"


def _cells(trials):
    """Which eighth of each range every trial's values fall in."""
    return (sorted(math.floor(t.hparams["x"] * 8) for t in trials),
            sorted(math.floor((math.log10(t.hparams["rate"]) + 3) / 6 * 8) for t in trials))


QMC_SPACE = ("x: {type: double, min: 0.0, max: 1.0}\n"
             "rate: {type: double, min: 0.001, max: 1000, scale: log}\n")


def test_qmc_workers_without_a_seed_continue_one_sequence(tmp_path, fake_python):
    # Two commands on one storage, neither seeded: the second continues the
    # sequence the first began (each sampler a fresh one, as in another
    # process), so the study's points still fill every eighth once.
    storage = "sqlite:///%s" % (tmp_path / "shared.db")
    first = _config(tmp_path, fake_python, QMC_SPACE, trials=4, algorithm="qmc", seed=None,
                    storage=storage)
    tune.run_study(first)
    second = tune.run_study(dataclasses.replace(first, study=dataclasses.replace(
        first.study, max_trials=9), model_dir=str(tmp_path / "second")))
    drawn = sorted(second.trials, key=lambda t: t.trial)[1:]
    assert len(drawn) == 8 and _cells(drawn) == (list(range(8)), list(range(8))), _cells(drawn)


def test_qmc_draws_a_scrambled_sobol_sequence(tmp_path, fake_python):
    # The first 2**k points of a Sobol sequence, scrambled or not, put one
    # point in each of 2**k equal intervals of every coordinate; 8 random
    # draws in two coordinates would do so about once in 170,000 studies.
    result = tune.run_study(_config(tmp_path, fake_python, QMC_SPACE, trials=9,
                                    algorithm="qmc", seed=3))
    assert [t.status for t in result.trials] == ["succeeded"] * 9
    # Optuna's QMCSampler learns the space from the first trial, drawn at
    # random; the sequence starts with the second.
    drawn = sorted(result.trials, key=lambda t: t.trial)[1:]
    assert _cells(drawn) == (list(range(8)), list(range(8))), _cells(drawn)
    # Another seed scrambles the sequence otherwise.
    (tmp_path / "other").mkdir()
    other = tune.run_study(_config(tmp_path / "other", fake_python, QMC_SPACE, trials=2,
                                   algorithm="qmc", seed=4))
    assert sorted(other.trials, key=lambda t: t.trial)[1].hparams != drawn[0].hparams


# ------------------------------------------- one study, two commands, real trials


def _tune_args(space, folder, storage, data_dir):
    return ["tune", "fashion_mnist_mlp", "--space", str(space), "--trials", "6",
            "--parallel", "1", "--algorithm", "tpe", "--pruner", "asha", "--storage", storage,
            "--model-dir", str(folder), "--data-dir", str(data_dir), "--max-steps", "30",
            "--eval-every", "10", "--batch-size", "32", "--strategy", "none",
            "--trial-timeout", "240", "--no-plots"]


@pytest.mark.slow
def test_two_tune_commands_share_a_study_of_real_trials_on_postgresql(fashion_data, tmp_path):
    from postgres_server import Server  # pylint: disable=import-outside-toplevel
    space = tmp_path / "space.yaml"
    # Slower rates learn less in 10 steps: the range's top leads at the first
    # evaluation, where successive halving keeps only the best so far.
    space.write_text("learning_rate: {type: double, min: 0.00001, max: 0.001, scale: log}\n")
    with Server() as url:
        parser = argparse.ArgumentParser(prog="experiments")
        tune_cmd.add_parser(parser.add_subparsers(dest="command"))
        config = tune_cmd.build_config(parser.parse_args(
            _tune_args(space, tmp_path / "a", url, fashion_data)))
        # The study as both commands open it, with the range's top first in
        # its queue (the rest TPE draws): later trials behind it are pruned.
        study, _ = tune.open_study(config)
        study.enqueue_trial({"learning_rate": 0.001})
        # pylint: disable-next=consider-using-with
        logs = {w: open(tmp_path / ("%s.log" % w), "w") for w in "ab"}
        procs = {w: subprocess.Popen(
            [sys.executable, "-m", "experiments"]
            + _tune_args(space, tmp_path / w, url, fashion_data),
            cwd=ROOT, env=child_env(), stdout=logs[w], stderr=subprocess.STDOUT,
            start_new_session=True) for w in "ab"}
        try:
            codes = {w: p.wait(timeout=420) for w, p in procs.items()}
        finally:
            for p in procs.values():
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            for log in logs.values():
                log.close()
        output = {w: (tmp_path / ("%s.log" % w)).read_text() for w in "ab"}
        assert codes == {"a": 0, "b": 0}, {w: output[w][-3000:] for w in "ab"}
        frozen = tune.open_study(config)[0].get_trials(deepcopy=False)

    # The study holds the 6 trials asked for, each numbered once, finished; a
    # trial asked for past them is marked surplus and never ran.
    counted = [t for t in frozen if not t.user_attrs.get("surplus")]
    numbers = [t.number for t in counted]
    assert len(counted) == 6 and len(set(numbers)) == 6, numbers
    assert {t.state.name for t in counted} <= {"COMPLETE", "PRUNED"}
    assert all(t.state.name == "FAIL" for t in frozen if t.user_attrs.get("surplus"))
    # Each ran once, in one command's folder; both commands ran some.
    ran = {w: {int(n.split("-")[1]) for n in os.listdir(tmp_path / w)
               if n.startswith("trial-")} for w in "ab"}
    assert ran["a"] and ran["b"] and not ran["a"] & ran["b"], ran
    assert ran["a"] | ran["b"] == set(numbers)
    assert len({t.user_attrs["worker"] for t in counted}) == 2
    for t in counted:
        log = os.path.join(t.user_attrs["model_dir"], "train.log")
        with open(log, encoding="utf-8") as f:
            assert sum(line.startswith("$ ") for line in f) == 1, log

    # Pruned trials: PRUNED in the study, at the first evaluation (the next
    # rung is the last step, which is not judged), stopped by the signal with
    # a checkpoint and no export (the steps: where the signal landed).
    pruned = [t for t in counted if t.state.name == "PRUNED"]
    assert pruned, [(t.number, t.state.name, t.params) for t in counted]
    for t in pruned:
        assert t.user_attrs["status"] == "pruned" and t.user_attrs["pruned_at"] == 10, t
        assert t.user_attrs["message"].startswith("pruned at step 10"), t.user_attrs
        assert 10 <= t.user_attrs["steps"] <= 30
        folder = t.user_attrs["model_dir"]
        with open(os.path.join(folder, "evaluations.jsonl"), encoding="utf-8") as f:
            last = json.loads(f.read().splitlines()[-1])
        assert last.get("stopped") is True and last["step"] == t.user_attrs["steps"], last
        assert model_dirs.any_checkpoint(folder)
        assert not os.path.exists(os.path.join(folder, "export"))
    # Complete ones: their export's metric.
    for t in counted:
        if t.state.name == "COMPLETE":
            with open(os.path.join(t.user_attrs["export_dir"], "export.json"),
                      encoding="utf-8") as f:
                exported = json.load(f)
            assert exported["global_step"] == 30
            assert exported["metrics"]["accuracy"] == pytest.approx(t.value)

    # Each command's table is the whole study, and its best/ the best trial's export.
    best = max((t for t in counted if t.state.name == "COMPLETE"),
               key=lambda t: (t.value, -t.number))
    for w in "ab":
        with open(tmp_path / w / "trials.json", encoding="utf-8") as f:
            table = json.load(f)
        assert sorted(r["trial"] for r in table["trials"]) == sorted(numbers)
        assert table["best"] == best.number
        with open(tmp_path / w / "best" / "trial.json", encoding="utf-8") as f:
            assert json.load(f)["trial"] == best.number
        assert os.path.isfile(tmp_path / w / "best" / "export.json")
        assert os.path.isfile(tmp_path / w / "best" / "model.h5")
        assert "best trial %d: accuracy" % best.number in output[w]
