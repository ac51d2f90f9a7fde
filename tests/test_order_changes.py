"""A resumed run continues its input order only under the settings its
checkpoint was trained with (``MODEL_DIR/input_order.json``): stopped by real
signals it continues exactly, cached or not; a rerun that changes a setting
the order depends on is refused (exit 2, the model dir untouched) or, with
``--restart-order``, starts a fresh order at the next epoch boundary.

The runs are the keras3 engine's on TensorFlow (py313), over the counting
model of tests/resume_support.py: the model's own count of each example says
what training consumed. The order bookkeeping is the runner's, the same for
every engine; tests/test_exact_resume.py runs the stored order on each."""

import dataclasses
import hashlib
import json
import os
import random
import re
import shutil
import signal

import numpy as np
import pytest

import resume_support
from plugin_support import plugin_env, run_cli
from support import signal_at_step
from estimator_keras import engines, order_state, records
from estimator_keras.engines import optimizers
from estimator_keras.errors import ModelDirError
from estimator_keras.inputs import make_dataset

ENV = {"TF_USE_LEGACY_KERAS": "0", "KERAS_BACKEND": "tensorflow"}
FIRST = 20  # the model dir every changed-setting case starts from: epoch 1, batch 7 of 13
FINAL = 60  # the experiment's max_steps: 4 epochs of 13 batches and 8 of the fifth
# The pipeline's default, uncached (the experiment caches; a cached pipeline
# under both signals: tests/test_exact_resume.py's MLP, whose cache=auto caches).
UNCACHED = ["--hparams", "cache=false,shuffle=batch"]


def _env():
    return plugin_env(**ENV)


def _train(ids_data, model_dir, steps, *extra, check=True):
    module, data_dir = ids_data
    rc, _, err = run_cli("--module", module, "train", resume_support.EXPERIMENT,
                         "--engine", "keras3", "--model-dir", model_dir, "--data-dir", data_dir,
                         "--max-steps", steps, *extra, cwd=os.path.dirname(module), env=_env(),
                         timeout=300)
    if check:
        assert rc == 0, err[-3000:]
    return rc, err


@pytest.fixture(scope="module")
def ids_data(tmp_path_factory):
    return resume_support.prepare(tmp_path_factory.mktemp("ids"))


@pytest.fixture(scope="module")
def trained(ids_data, tmp_path_factory):
    """A model dir trained FIRST steps (a cache: the experiment's default)."""
    model_dir = tmp_path_factory.mktemp("trained") / "model"
    _train(ids_data, model_dir, FIRST)
    return model_dir


def _snapshot(model_dir):
    """Every file under ``model_dir`` with its bytes' hash."""
    found = {}
    for root, _, files in os.walk(model_dir):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, model_dir)] = hashlib.sha256(f.read()).hexdigest()
    return found


def _other_dataset(ids_data, root):
    """The same dataset (name, records) prepared again in 2 train shards."""
    module, _ = ids_data
    data_dir = str(root / "data2")
    rc, _, err = run_cli("--module", module, "prepare", resume_support.DATASET, "--data-dir",
                         data_dir, "--shards", 2, cwd=os.path.dirname(module), timeout=180)
    assert rc == 0, err[-3000:]
    return data_dir


# (case, extra train arguments, the setting the message names, stored, new)
CHANGES = [
    ("batch_size", ["--hparams", "batch_size=32"], "batch_size", "16", "32"),
    ("seed", ["--hparams", "seed=7"], "seed", "42", "7"),
    ("cache", ["--hparams", "cache=false"], r"cache decision \(data\.cache\)", "True", "False"),
    ("dataset", None, r"dataset \(the train split's shards\)",
     r"'3 file\(s\), 200 examples, sha256 \w+'", r"'2 file\(s\), 200 examples, sha256 \w+'"),
]


@pytest.mark.slow
@pytest.mark.parametrize("case,extra,setting,stored,new", CHANGES, ids=[c[0] for c in CHANGES])
def test_a_changed_setting_is_refused_naming_it_and_the_model_dir_is_untouched(
        ids_data, trained, tmp_path, case, extra, setting, stored, new):
    model_dir = tmp_path / "model"
    shutil.copytree(trained, model_dir)
    before = _snapshot(model_dir)
    if extra is None:  # the dataset, re-prepared in other shards
        extra = ["--data-dir", _other_dataset(ids_data, tmp_path)]
    rc, err = _train(ids_data, model_dir, FIRST + 10, *extra, check=False)
    assert rc == 2, (case, err[-3000:])
    assert re.search(rf"checkpoint of step {FIRST} continues an input order whose settings this "
                     rf"run changes: {setting}: stored {stored}, now {new} ", err), err[-3000:]
    assert "--restart-order" in err and "continues at" not in err
    assert _snapshot(model_dir) == before, case


@pytest.mark.slow
def test_restart_order_starts_a_fresh_order_at_the_next_epoch_boundary(ids_data, trained,
                                                                       tmp_path):
    """Twice the batch: the stopped epoch (1, at batch 7 of 13) is left, and
    the new order's epochs of 7 batches each see every example once."""
    model_dir = tmp_path / "model"
    shutil.copytree(trained, model_dir)
    before = resume_support.counts(model_dir)
    _, err = _train(ids_data, model_dir, FIRST + 10, "--hparams", "batch_size=32",
                    "--restart-order")
    assert ("resuming at step 20: the input order's settings changed (batch_size 16 -> 32); "
            "--restart-order: the input starts a fresh order at epoch 2, the next epoch "
            "boundary") in err, err[-3000:]
    assert "continues at" not in err
    # 10 steps of the new order: epoch 2 whole (7 batches of 32, the last of 8), 3 of epoch 3.
    resume_support.check_once_per_epoch(resume_support.counts(model_dir) - before, 10,
                                        batch=32)
    # Stored: a rerun with the new settings continues the new order exactly.
    _, err = _train(ids_data, model_dir, FIRST + 12, "--hparams", "batch_size=32")
    assert "the input continues at epoch 3, batch 3 of 7 (seed 42)" in err, err[-3000:]
    resume_support.check_once_per_epoch(resume_support.counts(model_dir) - before, 12,
                                        batch=32)


@pytest.mark.slow
def test_cache_auto_keeps_the_decision_stored_with_the_order(ids_data, tmp_path):
    """A budget that would not cache on the rerun: the stored decision (to
    cache) is kept, so the stopped epoch continues in its own order."""
    model_dir = tmp_path / "model"
    _train(ids_data, model_dir, FIRST, "--hparams", "cache=auto,cache_budget_mb=1000")
    assert json.loads((model_dir / order_state.FILE).read_text())[
        "segments"][0]["settings"]["cache"] is True
    _, err = _train(ids_data, model_dir, FIRST + 15, "--hparams",
                    "cache=auto,cache_budget_mb=0.000001")
    assert ("cache=auto: caching the training input, as decided when its stored order began "
            "(input_order.json); from the memory available now: not caching") in err, err[-3000:]
    assert "the input continues at epoch 1, batch 7 of 13 (seed 42)" in err, err[-3000:]
    resume_support.check_once_per_epoch(resume_support.counts(model_dir), FIRST + 15)


@pytest.mark.slow
def test_skip_corrupt_says_the_position_is_approximate(ids_data, trained, tmp_path):
    model_dir = tmp_path / "model"
    shutil.copytree(trained, model_dir)
    _, err = _train(ids_data, model_dir, FIRST + 5, "--skip-corrupt")
    assert ("resuming at step 20: the input resumes at about epoch 1, batch 7 of 13 (seed 42): "
            "--skip-corrupt drops unreadable records") in err, err[-3000:]
    assert "continues at" not in err


def _stop(ids_data, model_dir, step, sig, extra, log_path):
    """Trains to FINAL until a progress line at or past ``step``, then sends
    ``sig``; returns (exit status, the last step logged)."""
    module, data_dir = ids_data
    hparams = ",".join(["log_every_steps=1", *extra[1:]])  # extra: [] or ["--hparams", ...]
    argv = ["--module", module, "train", resume_support.EXPERIMENT, "--engine", "keras3",
            "--model-dir", model_dir, "--data-dir", data_dir, "--max-steps", FINAL,
            "--hparams", hparams]
    return signal_at_step(argv, step, sig, log_path, cwd=os.path.dirname(module), env=_env())


@pytest.mark.slow
def test_sigterm_then_sigkill_at_random_steps_continue_exactly(ids_data, tmp_path):
    """The uncached pipeline stopped by SIGTERM at a random step (its
    checkpoint is that step), then by SIGKILL at a random step after the
    next periodic checkpoint (the rerun trains the lost steps again on the
    same batches): the model's count of every example equals the run's never
    stopped."""
    extra, pipeline = UNCACHED, "uncached"
    rng = random.Random(f"{pipeline}-{os.getpid()}")
    term, kill = rng.randrange(3, 19), rng.randrange(41, 55)  # periodic checkpoints: 20, 40
    model_dir = tmp_path / "stopped"
    status, termed = _stop(ids_data, model_dir, term, signal.SIGTERM, extra, tmp_path / "1.log")
    assert status == 75, (term, (tmp_path / "1.log").read_text()[-3000:])
    status, killed = _stop(ids_data, model_dir, kill, signal.SIGKILL, extra, tmp_path / "2.log")
    assert status == -signal.SIGKILL, (kill, (tmp_path / "2.log").read_text()[-3000:])
    second = (tmp_path / "2.log").read_text()
    assert re.search(r"resuming at step \d+: the input continues at epoch \d+, batch \d+ of 13 "
                     r"\(seed 42\), skipping the consumed batches unparsed; the position and "
                     r"settings are stored", second), second[-3000:]
    _, err = _train(ids_data, model_dir, FINAL, *extra)
    assert re.search(r"resuming at step \d+: the input continues at epoch \d+, batch \d+ of 13 "
                     r"\(seed 42\), skipping the consumed batches unparsed; the position and "
                     r"settings are stored", err), err[-3000:]
    _train(ids_data, tmp_path / "whole", FINAL, *extra)
    np.testing.assert_array_equal(resume_support.counts(model_dir),
                                  resume_support.counts(tmp_path / "whole"),
                                  err_msg=f"{pipeline}: SIGTERM at {termed}, SIGKILL at {killed}")


def _settings(resolved, tasks, batch, asynchronous):
    return order_state.Settings(
        seed=5, batch_size=batch, global_batch_size=batch, batches_per_step=1,
        asynchronous=asynchronous, pipelines=order_state.pipelines(resolved, tasks, batch),
        cache=False, shuffle="batch", shuffle_buffer=4, cache_shuffle="batches",
        cycle_length=4, block_length=16, dataset=order_state.fingerprint(resolved))


def test_parameter_server_workers_start_a_whole_fresh_epoch(tiny_dataset, tmp_path):
    """Asynchronous workers: the global step (here 9, after 3 epochs of a
    worker's 3 batches at an even pace) is not what one worker consumed.
    Each starts a whole epoch past the even share's, skipping no batch of
    it; the log says so and does not say "continues"."""
    directory, _ = tiny_dataset(n=24, num_shards=2)
    resolved = records.resolve(directory, "train")
    settings = _settings(resolved, 2, 4, asynchronous=True)
    assert [p.batches_per_epoch for p in settings.pipelines] == [3, 3]
    decision = order_state.decide(str(tmp_path), 9, settings)
    assert decision.how == "asynchronous" and "continues" not in decision.message
    assert "each worker starts a fresh epoch of its share (epoch 2, epoch 2" in decision.message
    for index in range(2):
        start = decision.start_batch(index, 9, 1)
        assert start == 2 * 3 < 9  # not the global step's 9 batches of its own share
        served = make_dataset(directory, 4, training=True, features=["vec"], label="id", seed=5,
                              shuffle="batch", shuffle_buffer=4, shard=(2, index),
                              start_batch=start)
        ids = [int(i) for _, labels in served.take(3) for i in labels]
        share = order_state.pipelines(resolved, 2, 4)[index].examples
        assert sorted(ids) == sorted(set(ids)) and len(ids) == share == 12, (index, ids)


def test_an_order_stored_at_the_checkpoints_step_is_kept_only_if_this_run_matches_it(
        tiny_dataset, tmp_path):
    """A segment stored at step S by a run that trained no step of it (it
    died first) does not decide for a rerun with the settings before it."""
    directory, _ = tiny_dataset(n=24, num_shards=2)
    resolved = records.resolve(directory, "train")
    old, new = _settings(resolved, 1, 4, False), _settings(resolved, 1, 8, False)
    model_dir = str(tmp_path)
    order_state.decide(model_dir, 0, old).store(model_dir)
    with pytest.raises(order_state.OrderChangedError, match="batch_size: stored 4, now 8"):
        order_state.decide(model_dir, 10, new)
    restarted = order_state.decide(model_dir, 10, new, restart=True)
    restarted.store(model_dir)
    assert restarted.starts == (2 * 3,)  # 10 of 6 batches: epoch 1 under way; epoch 2 of 3
    assert order_state.decide(model_dir, 10, new).starts == (6,)
    back = order_state.decide(model_dir, 10, old)
    assert back.how == "continues" and back.starts == (10,)
    back.store(model_dir)
    assert [s.step for s in order_state.load(model_dir)] == [0]
    legacy = order_state.decide(str(tmp_path / "legacy"), 10, old)
    assert legacy.how == "derived" and "the position is derived from the step" in legacy.message


@pytest.mark.slow
@pytest.mark.skipif(not engines.estimator_available(), reason="tf.estimator ends at TF 2.15")
def test_a_parameter_server_cluster_resumes_each_worker_at_a_fresh_epoch(ids_data, tmp_path):
    """A real chief + worker + ps cluster (estimator), trained to step 30 and
    rerun: no task claims to continue; each worker starts the epoch after an
    even share of the steps (15: epochs of 9 and 5 batches), stored."""
    module, data_dir = ids_data
    logs = {}
    for steps in (30, 40):
        log_dir = tmp_path / f"logs-{steps}"
        rc, out, err = run_cli("--module", module, "cluster", resume_support.EXPERIMENT,
                               "--workers", 1, "--ps", 1, "--strategy", "parameter_server",
                               "--engine", "estimator", "--model-dir", tmp_path / "model",
                               "--log-dir", log_dir, "--quiet", "--timeout", 300,
                               "--data-dir", data_dir, "--max-steps", steps,
                               cwd=os.path.dirname(module),
                               env=plugin_env(TF_USE_LEGACY_KERAS="0"), timeout=360)
        assert rc == 0, out[-3000:] + err[-3000:]
        logs[steps] = {p.stem: p.read_text() for p in log_dir.iterdir()}
    for task in ("chief-0", "worker-0"):
        assert ("resuming at step 30 on parameter-server workers: each takes batches at its own "
                "pace and the checkpoint does not say how many each took, so each worker starts "
                "a fresh epoch of its share (epoch 2, epoch 3: after an even share of 15 steps), "
                "skipping nothing") in logs[40][task], logs[40][task][-3000:]
        assert "continues at" not in logs[40][task]
    stored = [(s.step, s.starts) for s in order_state.load(str(tmp_path / "model"))]
    assert stored == [(0, (0, 0)), (30, (2 * 9, 3 * 5))]


def test_a_dataset_prepared_again_with_the_same_sizes_is_another_dataset(tmp_path):
    """Fixed-size records give a re-prepared split the same shard names,
    counts and bytes; other records in them are still another dataset."""
    rng = np.random.default_rng(0)
    arrays = {"x": rng.standard_normal((40, 3)).astype(np.float32),
              "label": rng.integers(0, 4, 40)}
    folder = str(tmp_path / "ds")
    records.write_dataset({"train": arrays}, folder, num_shards=2, progress=False)
    first = order_state.fingerprint(records.resolve(folder, "train"))
    rotated = {k: np.roll(v, 7, axis=0) for k, v in arrays.items()}
    records.write_dataset({"train": rotated}, folder, num_shards=2, progress=False)
    again = records.resolve(folder, "train")
    assert [s.num_bytes for s in again.manifest.splits["train"].shards] == \
        [s.num_bytes for s in records.resolve(folder, "train").manifest.splits["train"].shards]
    assert order_state.fingerprint(again) != first
    # A copy elsewhere is the same dataset.
    copy = str(tmp_path / "copy")
    shutil.copytree(folder, copy)
    assert order_state.fingerprint(records.resolve(copy, "train")) == \
        order_state.fingerprint(again)


def test_restart_order_without_a_stored_order_starts_past_the_step(tiny_dataset, tmp_path):
    """A model dir with no input_order.json (written before it, or the file
    removed): --restart-order cannot know what the step consumed under other
    settings, so it starts a fresh order past it; without the flag the line
    says the position is derived, never that it is stored."""
    directory, _ = tiny_dataset(n=24, num_shards=2)
    resolved = records.resolve(directory, "train")
    settings = _settings(resolved, 1, 8, False)  # 3 batches an epoch
    model_dir = str(tmp_path / "m")
    restarted = order_state.decide(model_dir, 4, settings, restart=True)
    assert restarted.how == "restarts" and restarted.starts == (6,)  # epoch 2 of 3 batches
    assert "starts a fresh order at epoch 2" in restarted.message
    assert "continues" not in restarted.message
    derived = order_state.decide(model_dir, 4, settings)
    assert derived.how == "derived" and "or the file was removed" in derived.message


@pytest.mark.parametrize("edit, says", [
    (lambda o: o["segments"][0].update(starts=[]), "0 start(s) for 1 pipeline(s)"),
    (lambda o: o["segments"][0].update(step=1.7), "step is 1.7"),
    (lambda o: o["segments"][0].update(starts=[-5]), "is -5"),
    (lambda o: o["segments"][0]["settings"]["pipelines"][0].update(batches_per_epoch=-1),
     "batches_per_epoch is -1"),
    (lambda o: o["segments"][0]["settings"].update(pipelines=[]), "for 0 pipeline(s)"),
    (lambda o: o.update(version=99), "version 99"),
    (lambda o: o["segments"][0].update(schedule={"decay": "cosine", "learning_rate": 0.1,
                                                 "max_steps": 0}), "max_steps is 0"),
    (lambda o: o["segments"][0].update(schedule={"decay": "cosine", "learning_rate": "fast",
                                                 "max_steps": 9}), "learning_rate is 'fast'"),
])
def test_a_hand_edited_order_file_is_refused_naming_what_is_wrong(tiny_dataset, tmp_path,
                                                                  edit, says):
    directory, _ = tiny_dataset(n=24, num_shards=2)
    settings = _settings(records.resolve(directory, "train"), 1, 8, False)
    model_dir = str(tmp_path / "m")
    order_state.decide(model_dir, 0, settings).store(model_dir)
    with open(order_state.path(model_dir), encoding="utf-8") as f:
        obj = json.load(f)
    edit(obj)
    with open(order_state.path(model_dir), "w", encoding="utf-8") as f:
        json.dump(obj, f)
    with pytest.raises(ModelDirError, match="is not a valid record of the input order") as e:
        order_state.decide(model_dir, 4, settings)
    assert says in str(e.value)


@pytest.mark.slow
def test_a_finished_run_with_an_unreadable_order_file_still_reruns(ids_data, trained,
                                                                   tmp_path):
    """Nothing left to train needs no input order: a rerun at the run's own
    --max-steps ends as a finished run does, whatever the file holds."""
    model_dir = tmp_path / "model"
    shutil.copytree(trained, model_dir)
    (model_dir / order_state.FILE).write_text('{"version": 1, "segm')
    rc, err = _train(ids_data, model_dir, FIRST, check=False)
    assert rc == 0, err[-3000:]
    rc, err = _train(ids_data, model_dir, FIRST + 4, check=False)
    assert rc != 0 and "is not a valid record of the input order" in err, err[-3000:]


@pytest.mark.slow
def test_a_rerun_that_trains_nothing_leaves_config_yaml_as_it_was(ids_data, trained, tmp_path):
    """config.yaml describes what trained the checkpoints: a rerun already
    at --max-steps with other settings trains no step and rewrites nothing."""
    model_dir = tmp_path / "model"
    shutil.copytree(trained, model_dir)
    before = (model_dir / "config.yaml").read_bytes()
    for extra in (["--hparams", "batch_size=64"], ["--hparams", "seed=7"]):
        _, err = _train(ids_data, model_dir, FIRST, *extra)
        assert f"is already at step {FIRST} (--max-steps {FIRST}): nothing to train" in err, \
            err[-3000:]
        assert (model_dir / "config.yaml").read_bytes() == before, extra


# (case, the first run's hparams, the rerun's: only a setting that changes no order)
IRRELEVANT = [
    ("shuffle_buffer without a shuffle", "cache=false,shuffle=none,shuffle_buffer=32",
     "cache=false,shuffle=none,shuffle_buffer=8"),
    ("cache_shuffle without a cache", "cache=false,cache_shuffle=auto",
     "cache=false,cache_shuffle=batches"),
]


@pytest.mark.slow
@pytest.mark.parametrize("case,first,rerun", IRRELEVANT, ids=[c[0] for c in IRRELEVANT])
def test_a_setting_not_in_effect_changes_no_order_and_the_run_continues(ids_data, tmp_path,
                                                                         case, first, rerun):
    model_dir = tmp_path / "model"
    _train(ids_data, model_dir, FIRST, "--hparams", first)
    rc, err = _train(ids_data, model_dir, FIRST + 5, "--hparams", rerun, check=False)
    assert rc == 0, (case, err[-3000:])
    assert "resuming at step 20: the input continues at epoch 1, batch 7 of 13 (seed 42)" in err, \
        err[-3000:]
    assert "cosine decay" not in err  # a constant rate has no horizon to move
    resume_support.check_once_per_epoch(resume_support.counts(model_dir), FIRST + 5)


def test_settings_are_compared_only_where_in_effect(tiny_dataset, tmp_path):
    """shuffle_buffer without a shuffle and cache_shuffle without a cache
    fix nothing: a change of either continues; in effect, it is refused.
    An order file written before the schedule was stored still decides."""
    directory, _ = tiny_dataset(n=24, num_shards=2)
    base = _settings(records.resolve(directory, "train"), 1, 8, False)
    cases = [
        (dict(shuffle="none", shuffle_buffer=4), dict(shuffle="none", shuffle_buffer=99), None),
        (dict(cache_shuffle="records"), dict(cache_shuffle="batches"), None),
        (dict(cache=True, cache_shuffle="records"), dict(cache=True, cache_shuffle="batches"),
         "data.cache_shuffle: stored 'records', now 'batches'"),
        (dict(shuffle_buffer=4), dict(shuffle_buffer=99), "data.shuffle_buffer: stored 4, now 99"),
    ]
    for index, (old, new, refused) in enumerate(cases):
        model_dir = str(tmp_path / str(index))
        order_state.decide(model_dir, 0, dataclasses.replace(base, **old)).store(model_dir)
        # As the files before the stored schedule: no "schedule" key.
        with open(order_state.path(model_dir), encoding="utf-8") as f:
            obj = json.load(f)
        for segment in obj["segments"]:
            segment.pop("schedule", None)
        with open(order_state.path(model_dir), "w", encoding="utf-8") as f:
            json.dump(obj, f)
        if refused:
            with pytest.raises(order_state.OrderChangedError, match=re.escape(refused)):
                order_state.decide(model_dir, 4, dataclasses.replace(base, **new))
        else:
            decision = order_state.decide(model_dir, 4, dataclasses.replace(base, **new))
            assert decision.how == "continues" and decision.starts == (4,), (old, new)


@pytest.mark.slow
def test_a_moved_cosine_horizon_is_said_at_the_resume(ids_data, tmp_path):
    """Raising --max-steps under a cosine decay stretches it: the rerun says
    where the decay now ends and the rate at its step before and after;
    the new horizon is stored, so the next rerun compares with it."""
    model_dir = tmp_path / "model"
    cosine = ["--hparams", "learning_rate_decay=cosine"]
    _, err = _train(ids_data, model_dir, FIRST, *cosine)
    assert "cosine decay now ends" not in err
    _, err = _train(ids_data, model_dir, 40, *cosine)
    # lr 0.05 (the experiment's): at step 20 a tenth under 20 steps, 0.05 * 0.55 under 40.
    assert ("learning rate: cosine decay now ends at step 40 (was 20): the rate at step 20 "
            "goes from 0.005 to 0.0275") in err, err[-3000:]
    assert "the input continues at epoch 1, batch 7 of 13 (seed 42)" in err, err[-3000:]
    _, err = _train(ids_data, model_dir, 50, *cosine)
    assert ("learning rate: cosine decay now ends at step 50 (was 40): the rate at step 40 "
            "goes from 0.005 to 0.009297") in err, err[-3000:]
    assert "(was 20)" not in err


def test_another_decay_is_refused_on_keras3_before_anything_is_written(ids_data, trained):
    """A Keras 3 optimizer keeps a constant rate as a variable and a decay as
    none: its checkpoint cannot continue under the other. Refused naming the
    setting, with the model dir as it was (config.yaml included)."""
    before = _snapshot(trained)
    rc, err = _train(ids_data, trained, 40, "--hparams", "learning_rate_decay=cosine",
                     check=False)
    assert rc == 2, err[-3000:]
    (error,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert re.search(r"learning_rate_decay: the checkpoint of step 20 in .* was trained under "
                     r"constant 0\.05, and this run asks for cosine from 0\.05 to step 40: "
                     r"the keras3 engine's checkpoints .* Keep learning_rate_decay=constant",
                     error), err[-3000:]
    assert _snapshot(trained) == before


def test_the_schedule_is_stored_from_the_step_it_changes_at(tiny_dataset, tmp_path):
    """The order is the same; the segment from the resume step holds the new
    learning rate, and the decision names the one the checkpoint trained under."""
    directory, _ = tiny_dataset(n=24, num_shards=2)
    settings = _settings(records.resolve(directory, "train"), 1, 8, False)
    short, long = (optimizers.Schedule.of(0.01, "cosine", n) for n in (6, 12))
    model_dir = str(tmp_path / "m")
    order_state.decide(model_dir, 0, settings, schedule=short).store(model_dir)
    same = order_state.decide(model_dir, 4, settings, schedule=short)
    assert same.trained_schedule == short and same.segments is None
    moved = order_state.decide(model_dir, 6, settings, schedule=long)
    assert moved.how == "continues" and moved.starts == (6,) and moved.trained_schedule == short
    moved.store(model_dir)
    assert [(s.step, s.starts, s.schedule) for s in order_state.load(model_dir)] == \
        [(0, (0,), short), (6, (6,), long)]
    later = order_state.decide(model_dir, 9, settings, schedule=long)
    assert later.trained_schedule == long and later.starts == (9,) and later.segments is None
