"""What a person sees: progress lines, final lines, a finished run that is a
no-op, `evaluate` and `export` output, global flags anywhere, plain
messages for missing paths."""

import json
import os
import re

import pytest

import environments
from support import checkpoint_steps, cli

# The engines this environment tests (tests/environments.py).
ENGINES = environments.engines_under_test()
pytestmark = pytest.mark.slow


def _train(data, model_dir, *more, engine="keras", steps=40):
    return cli("train", "fashion_mnist_mlp", "--data-dir", data, "--model-dir", model_dir,
               "--max-steps", steps, "--eval-every", 20, "--batch-size", 32,
               "--engine", engine, "--hparams", "log_every_steps=10", *more, timeout=300)


@pytest.fixture(scope="module")
def trained(fashion_data, tmp_path_factory):
    found = {}
    for engine in ENGINES:
        model_dir = tmp_path_factory.mktemp(f"output-{engine}") / "run"
        rc, out, err = _train(fashion_data, model_dir, engine=engine)
        assert rc == 0, err[-3000:]
        found[engine] = {"model_dir": model_dir, "out": out, "err": err, "data": fashion_data}
    return found


@pytest.mark.parametrize("engine", ENGINES)
def test_progress_and_final_lines_say_what_they_measure(trained, engine):
    out, err = trained[engine]["out"], trained[engine]["err"]
    steps = re.findall(r"^step (\d+)/40, loss [\d.]+, [\d.]+ steps/s, [\d,]+ examples/s, "
                       r"(\d+ s|\d+ min \d+ s) left$", err, re.M)
    found = [int(s) for s, _ in steps]
    if engine in ("keras", "keras3"):
        # A line at the end of the call of Keras' training function that
        # passes each multiple of 10: calls of 8 that end at each evaluation
        # (8, 16, 20, 28, 36, 40).
        assert found == [16, 20, 36, 40], err[-2000:]
    else:
        assert found == [10, 20, 30, 40], err[-2000:]
    assert re.search(r"^final metrics: accuracy \d\.\d{4}, loss \d\.\d{4} \(test split, "
                     r"3,000 examples, checkpoint step 40\)$", out, re.M), out
    # One process: no cluster vocabulary.
    for jargon in ("[chief-0]", "Strategy 'auto'", "ps: False", "(average)"):
        assert jargon not in out + err, jargon
    assert re.search(r"^done in \d+ s$", out, re.M), out
    # Each evaluation once, after its step's progress line; each best export
    # once, on the line right after the evaluation that earned it.
    lines = err.splitlines()
    for step in (20, 40):
        evaluated = [i for i, l in enumerate(lines) if l.startswith(f"evaluated step {step}:")]
        progress = [i for i, l in enumerate(lines) if l.startswith(f"step {step}/40")]
        assert len(evaluated) == 1 and len(progress) == 1, err[-2000:]
        assert progress[0] < evaluated[0], err[-2000:]
    best = [i for i, l in enumerate(lines) if l.startswith("new best accuracy")]
    assert best and all(lines[i - 1].startswith("evaluated step") for i in best), err[-2000:]
    assert not [l for l in lines if l.startswith("exported step")], err[-2000:]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_finished_run_is_a_no_op(trained, engine, tmp_path):
    import shutil  # pylint: disable=import-outside-toplevel
    model_dir = tmp_path / "run"
    shutil.copytree(trained[engine]["model_dir"], model_dir)
    export = model_dir / "export"
    stamps = {p: os.stat(export / p).st_mtime_ns for p in ("model.h5", "export.json")}
    steps = checkpoint_steps(model_dir)
    for max_steps in (40, 30):  # at, and below, the model dir's step
        rc, out, err = _train(trained[engine]["data"], model_dir, engine=engine,
                              steps=max_steps)
        assert rc == 0, err[-3000:]
        assert f"is already at step 40 (--max-steps {max_steps}): nothing to train" in err
        assert checkpoint_steps(model_dir) == steps
        assert {p: os.stat(export / p).st_mtime_ns for p in stamps} == stamps
        assert "final metrics: accuracy" in out
    # A missing export is written.
    shutil.rmtree(export)
    rc, out, err = _train(trained[engine]["data"], model_dir, engine=engine)
    assert rc == 0 and (export / "model.h5").exists(), err[-3000:]
    assert checkpoint_steps(model_dir) == steps


def test_evaluate_prints_a_summary_and_json_on_request(trained, fashion_data):
    engine = ENGINES[-1]
    model_dir = trained[engine]["model_dir"]
    rc, out, err = cli("evaluate", "fashion_mnist_mlp", "--data-dir", fashion_data,
                       "--model-dir", model_dir, "--engine", engine)
    assert rc == 0, err[-2000:]
    assert f"evaluated {model_dir} (test split, 3,000 examples, checkpoint step 40):" in out
    assert re.search(r"^  accuracy +\d\.\d{4}$", out, re.M), out
    rc, out, err = cli("--verbose", "evaluate", "fashion_mnist_mlp", "--data-dir", fashion_data,
                       "--model-dir", model_dir, "--engine", engine, "--json")
    assert rc == 0 and json.loads(out)["global_step"] == 40, err[-2000:]


def test_export_writes_what_train_writes_and_keeps_the_richer_one(trained, fashion_data,
                                                                  tmp_path):
    engine = ENGINES[-1]
    model_dir = trained[engine]["model_dir"]
    from_train = json.loads((model_dir / "export" / "export.json").read_text())
    rc, out, err = cli("export", "fashion_mnist_mlp", "--model-dir", model_dir, "--data-dir",
                       fashion_data, "--export-dir", tmp_path / "again")
    assert rc == 0, err[-2000:]
    again = json.loads((tmp_path / "again" / "export.json").read_text())
    for key in ("experiment", "engine", "dataset", "global_step", "metrics", "class_names"):
        assert again[key] == from_train[key], key
    # Into the default folder: that export is of the same checkpoint and as
    # complete, so it stays as it is.
    before = (model_dir / "export" / "export.json").read_bytes()
    rc, out, err = cli("export", "fashion_mnist_mlp", "--model-dir", model_dir)
    assert rc == 0 and "left as it is" in out, out + err
    assert (model_dir / "export" / "export.json").read_bytes() == before


@pytest.mark.parametrize("where", ["before", "after"])
def test_verbose_works_before_or_after_the_command(where):
    args = ["show", "fashion_mnist_cnn", "--hparams", "nope=1"]
    args = (["--verbose"] + args) if where == "before" else (args + ["--verbose"])
    rc, _, err = cli(*args)
    assert rc == 2 and "unknown hparam 'nope'" in err
    assert "Traceback" in err


def test_inspect_says_a_missing_path_does_not_exist(tmp_path):
    rc, _, err = cli("inspect", tmp_path / "nowhere")
    assert rc == 1 and f"{tmp_path / 'nowhere'} does not exist" in err
