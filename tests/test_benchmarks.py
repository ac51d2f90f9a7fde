"""Tests of the benchmark code on tiny data: correctness, not speed.

Every pipeline must yield each example exactly once per epoch with the
right values; the old-style loops (queue runners, feed_dict) must run; the
CLI must write JSON of the documented structure.
"""

import collections
import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from benchmarks import (cache_memory, common, input_table, legacy, output, training_table,
                        writing_table)
from benchmarks.common import IMAGE, LABEL
from support import child_env, keras3_installed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N_TRAIN, N_TEST, BATCH = 200, 40, 16


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A Fashion-MNIST-shaped dataset of random images: (directory, arrays)."""
    from estimator_keras.records import write_dataset  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(0)
    arrays = {split: {IMAGE: rng.integers(0, 256, (n, 28, 28, 1), dtype=np.uint8),
                      LABEL: rng.integers(0, 10, n).astype(np.int64)}
              for split, n in (("train", N_TRAIN), ("test", N_TEST))}
    directory = str(tmp_path_factory.mktemp("bench") / "tiny")
    write_dataset(arrays, directory, num_shards={"train": 4, "test": 2}, progress=False,
                  name="tiny", labels={LABEL: {"num_classes": 10, "class_names": None}})
    return directory, arrays


@pytest.fixture
def settings(tiny, tmp_path):
    return common.Settings(data_dir=tiny[0], quick=True, repeats=1, window_s=0.01,
                           workdir=str(tmp_path / "work"), batch_size=BATCH)


def _by_image(arrays):
    return {arrays[IMAGE][i].tobytes(): int(arrays[LABEL][i]) for i in range(len(arrays[LABEL]))}


def _collect(dataset):
    """Counter of (image bytes, label) over a finite dataset of batches."""
    seen = collections.Counter()
    for features, labels in dataset:
        images = features[IMAGE].numpy() if isinstance(features, dict) else features.numpy()
        assert images.dtype == np.float32
        for image, label in zip(images, labels.numpy()):
            seen[(image.astype(np.uint8).tobytes(), int(label))] += 1
    return seen


def _assert_one_epoch(dataset, arrays):
    seen = _collect(dataset)
    expected = collections.Counter((k, v) for k, v in _by_image(arrays).items())
    assert seen == expected


PACKAGE_VARIANTS = [{}] + [overrides for _, overrides, _ in input_table.KNOBS]


@pytest.mark.parametrize("overrides", PACKAGE_VARIANTS, ids=lambda o: str(o) or "default")
def test_package_pipeline_variants_yield_each_example_once(tiny, overrides):
    path, arrays = tiny
    ds = input_table.package_pipeline(path, BATCH, num_epochs=1, seed=1, **overrides)
    _assert_one_epoch(ds, arrays["train"])


def test_other_pipelines_yield_each_example_once(tiny):
    path, arrays = tiny
    resolved = common.dataset_info(path)
    files, schema = resolved.files, resolved.schema
    pipelines = {
        "guide_recipe": input_table.guide_recipe_pipeline(files, schema, BATCH, num_epochs=1,
                                                          seed=1),
        "per_record": input_table.per_record_pipeline(files, schema, BATCH, num_epochs=1),
        "raw_parse": input_table.raw_parse_pipeline(files, schema, BATCH, num_epochs=1),
        "custom": input_table.custom_pipeline(files, schema, BATCH, num_epochs=1, seed=1),
        "custom_sequential": input_table.custom_pipeline(files, schema, BATCH, num_epochs=1,
                                                         parse_parallel=False, prefetch=False),
    }
    for name, opts in input_table.OPTIONS:
        pipelines[name] = input_table.with_options(
            input_table.package_pipeline(path, BATCH, num_epochs=1), opts)
    for name, ds in pipelines.items():
        assert _collect(ds) == collections.Counter(_by_image(arrays["train"]).items()), name


def test_raw_read_yields_every_record(tiny):
    path, arrays = tiny
    resolved = common.dataset_info(path)
    sizes, images = [], []
    for batch in input_table.raw_read_pipeline(resolved.files, BATCH, num_epochs=1):
        sizes.append(int(batch.shape[0]))
        parsed = tf.io.parse_example(batch, {IMAGE: tf.io.FixedLenFeature([], tf.string)})
        images += [bytes(b) for b in parsed[IMAGE].numpy()]
    assert sum(sizes) == N_TRAIN and max(sizes) == BATCH
    assert sorted(images) == sorted(_by_image(arrays["train"]))


def test_experiments_pipeline_repeats_whole_cached_epochs(tiny):
    path, arrays = tiny
    ds = input_table.package_pipeline(path, BATCH, cache="auto")
    batches = -(-N_TRAIN // BATCH)
    seen = _collect(ds.take(2 * batches))
    assert seen == collections.Counter({k: 2 for k in _by_image(arrays["train"]).items()})


def test_cache_memory_child_reports_rss_per_epoch(tiny):
    result = cache_memory.measure(tiny[0], epochs=3, batch_size=BATCH,
                                  overrides={"cache": True}, timeout=240)
    assert len(result["rss_mb"]) == 4 and all(v > 10 for v in result["rss_mb"])
    assert result["growth"] == pytest.approx(cache_memory.growth(result["rss_mb"]))
    assert result["examples"] == N_TRAIN and result["overrides"] == {"cache": True}
    assert result["release"] is True
    kept = cache_memory.measure(tiny[0], epochs=2, batch_size=BATCH, overrides={"cache": True},
                                timeout=240, release=False)
    assert kept["release"] is False and len(kept["rss_mb"]) == 3


def test_reduce_consumer_counts_only_timed_batches(tiny):
    path, _ = tiny
    ds = input_table.package_pipeline(path, BATCH, shuffle="none")
    consume = input_table.reduce_consumer(ds, skip=2)
    count, seconds, startup = consume(tf.constant(5, tf.int64))
    # Batches 3..6 follow the start mark at batch 2; all are full (repeat).
    assert int(count) == 4 * BATCH
    assert float(seconds) > 0 and float(startup) >= 0


def test_load_arrays_and_subset(tiny, tmp_path):
    path, arrays = tiny
    images, labels = common.load_arrays(path, "train")
    assert images.dtype == np.uint8 and images.shape == (N_TRAIN, 28, 28, 1)
    assert collections.Counter(_by_image({IMAGE: images, LABEL: labels}).items()) == \
        collections.Counter(_by_image(arrays["train"]).items())
    subset = common.subset_dataset(path, 50, str(tmp_path / "subset"))
    assert common.dataset_info(subset).num_examples == 50
    assert common.dataset_info(subset, "test").num_examples == N_TEST


def test_queue_runner_batches_hold_real_examples(tiny):
    path, arrays = tiny
    resolved = common.dataset_info(path)
    known = _by_image(arrays["train"])
    graph = tf.Graph()
    with graph.as_default():
        fetch = legacy.queue_runner_batch(resolved.files, resolved.schema, BATCH,
                                          num_threads=2, capacity=64, min_after_dequeue=16,
                                          seed=1)
    with legacy.QueueRunnerSession(graph) as sess:
        for _ in range(3):
            images, labels = sess.run(fetch)
            assert images.shape == (BATCH, 28, 28, 1) and images.dtype == np.float32
            for image, label in zip(images, labels):
                assert known[image.astype(np.uint8).tobytes()] == label


def test_numpy_batcher_covers_each_epoch():
    images = np.arange(10)[:, None]
    labels = np.arange(10)
    batcher = legacy.NumpyBatcher(images, labels, 5, seed=0)
    first = np.concatenate([batcher.next_batch()[1] for _ in range(2)])
    second = np.concatenate([batcher.next_batch()[1] for _ in range(2)])
    assert sorted(first) == list(range(10)) and sorted(second) == list(range(10))
    x, y = batcher.next_batch()
    assert (x[:, 0] == y).all()


def test_input_variants_measure(tiny, settings):
    """Every input-table variant builds, warms up and measures on tiny data."""
    variants = input_table.variants(tiny[0], settings, knobs=False)
    m = common.run_alternating(variants, 1, "test", reference="default")
    assert not m.errors
    assert all(len(s) >= 1 and s[0] > 0 for s in m.samples.values())
    rows = common.rows_from(variants, m, reference="default")
    assert all(row["ratio"] > 0 for row in rows)
    assert input_table.EXPERIMENTS_DEFAULT in m.samples


def test_training_variants_run_a_few_steps(tiny, settings):
    """Estimator, fit (numpy and dataset), queue-runner and feed_dict loops
    all train the MLP, alternating in one process."""
    images, labels = common.load_arrays(tiny[0])
    variants = training_table.variants("seed_mlp", tiny[0], settings, (images, labels),
                                       threads=False)
    for v in variants:
        v.warm = 2
    m = common.run_alternating(variants, 1, "test", reference="estimator")
    assert not m.errors, m.errors
    assert set(m.samples) == {"estimator", "estimator cache=False", "fit_numpy",
                              "fit_dataset", "queue_runners", "feed_dict"}
    assert all(s and s[0] > 0 for s in m.samples.values())
    rows = common.rows_from(variants, m, reference="estimator")
    assert rows[0]["ratio"] == pytest.approx(1.0)


@pytest.mark.parametrize("steps", [5, 13, 30])
def test_fit_numpy_steps_runs_exactly_the_steps_asked(tiny, steps):
    images, labels = common.load_arrays(tiny[0])
    model = training_table.compiled("seed_mlp")
    times = []
    epoch = training_table.fit_numpy_steps(model, images, labels, BATCH, steps,
                                           callbacks=[training_table.KerasTimer(times)])
    # 200 examples are 13 batches a pass: 30 steps need more than 2 passes.
    assert len(times) == steps and epoch >= 1
    more = training_table.fit_numpy_steps(model, images, labels, BATCH, steps, epoch,
                                          callbacks=[training_table.KerasTimer(times)])
    assert len(times) == 2 * steps and more > epoch


def test_feed_dict_loop_lowers_the_loss(tiny, settings):
    images, labels = common.load_arrays(tiny[0])
    resolved = common.dataset_info(tiny[0])
    feed = training_table.FeedDictTrainVariant("feed_dict", "seed_mlp", settings,
                                               (images[:32], labels[:32]), resolved.schema)
    feed.build()
    x, y = images[:32].astype("float32"), labels[:32]
    before = feed.session.run(feed.loss, {feed.images: x, feed.labels: y})
    feed.warm = 0
    assert feed._run(30)[0] == 30  # pylint: disable=protected-access
    after = feed.session.run(feed.loss, {feed.images: x, feed.labels: y})
    feed.close()
    assert after < before


@pytest.mark.slow
def test_accuracy_table_on_tiny_data(tiny, settings):
    """Plain Keras and the project's run take turns in their own processes,
    evaluate, and report curves; the knobs measure."""
    from benchmarks import accuracy_table  # pylint: disable=import-outside-toplevel

    result = accuracy_table.run(settings, path=tiny[0], steps=6,
                                runs=["keras_numpy", "project_default", "project_bf16"])
    rows = {row["name"]: row for row in result["rows"]}
    assert set(rows) == {"keras_numpy", "project_default", "project_bf16"}
    for row in rows.values():
        assert not row.get("error"), row.get("error")
        assert row["curve"] and 0.0 <= row["final_accuracy"] <= 1.0 and row["wall_s"] > 0
        times = [c["active_s"] for c in row["curve"]]
        assert times == sorted(times)
    from experiments.catalog import registry  # pylint: disable=import-outside-toplevel
    train = registry.get("fashion_mnist_cnn").config.train
    # The experiment's share of evaluations, over 6 steps.
    every = max(1, round(6 * train.eval_every_steps / train.max_steps))
    assert [c["step"] for c in rows["project_default"]["curve"]] == list(range(every, 7, every))
    assert rows["project_bf16"]["precision"] == "mixed_bfloat16"
    knobs = {row["name"] for row in result["knobs"]}
    assert {"mixed_bfloat16", "XLA auto-clustering", "evaluate batch 1024"} <= knobs
    assert all(row["median"] > 0 for row in result["knobs"]), result["knobs"]
    assert {t["id"] for t in result["targets"]} >= {"accuracy.best_time_to_091",
                                                   "accuracy.issue3_default"}
    json.dumps(result)


def test_accuracy_targets_from_runs():
    from benchmarks import accuracy_table  # pylint: disable=import-outside-toplevel

    def row(name, t091, final):
        return {"name": name, "t091_s": t091, "final_accuracy": final, "step_091": 100}

    rows = [row("keras_numpy", 100.0, 0.926), row("project_default", 95.0, 0.93),
            row("project_fast", 60.0, 0.928), row("project_sloppy", 50.0, 0.92),
            row("project_record_shuffle", 90.0, 0.929)]
    targets = {t["id"]: t for t in accuracy_table.run_targets(rows, 6000)}
    assert targets["accuracy.project_fast.time_to_091"]["met"] is True
    assert targets["accuracy.project_default.time_to_091"]["met"] is False
    assert "0.95" in targets["accuracy.project_default.time_to_091"]["why"]
    sloppy = targets["accuracy.project_sloppy.time_to_091"]
    assert sloppy["met"] is False and "0.92 < 0.925" in sloppy["why"]
    assert targets["accuracy.best_time_to_091"]["value"] == pytest.approx(0.6)
    assert targets["accuracy.default_vs_record_shuffle"]["value"] == pytest.approx(0.1)
    assert targets["accuracy.issue3_vs_keras_accuracy"]["met"] is True
    assert "accuracy.reshuffle_cost" not in targets

    reshuffle = dict(row("project_reshuffle", 93.0, 0.933), wall_s=262.0)
    rows = [row("keras_numpy", 100.0, 0.926), dict(row("project_default", 95.0, 0.93),
                                                    wall_s=250.0), reshuffle]
    targets = {t["id"]: t for t in accuracy_table.run_targets(rows, 6000)}
    cost, gain = targets["accuracy.reshuffle_cost"], targets["accuracy.reshuffle_gain"]
    assert cost["value"] == pytest.approx(1.048) and cost["met"] is True
    assert gain["value"] == pytest.approx(0.3) and gain["met"] is True

    # The keras3 engine's run must end at the experiment's accuracy.
    for final, met in ((0.931, True), (0.92, False)):
        rows = [row("keras_numpy", 100.0, 0.926), row("project_keras3", 99.0, final)]
        targets = {t["id"]: t for t in accuracy_table.run_targets(rows, 6000)}
        assert targets["accuracy.keras3_final"]["met"] is met
        assert targets["accuracy.keras3_final"]["value"] == final


def test_accuracy_default_runs_drop_the_float32_repeat_only_where_auto_is_float32():
    from benchmarks import accuracy_runs  # pylint: disable=import-outside-toplevel

    assert accuracy_runs.default_runs(False) == list(accuracy_runs.DEFAULT_RUNS)
    assert "project_fp32" in accuracy_runs.DEFAULT_RUNS
    without = accuracy_runs.default_runs(True)
    assert "project_fp32" not in without
    assert set(accuracy_runs.DEFAULT_RUNS) - set(without) == {"project_fp32"}
    assert {"project_default", "project_keras3"} <= set(without)


def test_accuracy_run_plans_scale_batch_steps_and_evaluation():
    from benchmarks import accuracy_runs  # pylint: disable=import-outside-toplevel

    plain = accuracy_runs.plan_for("project_default", 6000, 1 / 3, 500)
    assert (plain["steps"], plain["eval_every"], plain["batch_size"]) == (6000, 2000, 128)
    assert plain["learning_rate"] == pytest.approx(1e-3)
    big = accuracy_runs.plan_for("project_bf16_b256_warmup", 6000, 1 / 3, 500, 2e-3)
    assert (big["steps"], big["batch_size"], big["turn"]) == (3000, 256, 250)
    assert big["learning_rate"] == pytest.approx(2e-3 * 2 ** 0.5)
    assert big["eval_every"] == 500
    # Plain Keras keeps its Adam 1e-3 whatever the experiment's rate.
    keras = accuracy_runs.plan_for("keras_numpy", 6000, 1 / 3, 500, 2e-3)
    assert keras["learning_rate"] == pytest.approx(1e-3)
    assert accuracy_runs.plan_for("project_eval2000", 6000, 469 / 6000, 500)["eval_every"] == 2000
    assert set(accuracy_runs.DEFAULT_RUNS) <= set(accuracy_runs.RUNS)



def test_recipe_runs_give_the_peer_the_experiments_recipe_and_pair_like_precision_with_like():
    from benchmarks import accuracy_runs, recipe_table  # pylint: disable=import-outside-toplevel

    # The peer runs the experiment's own rate, steps and evaluation cadence.
    for name in (recipe_table.PEER_DEFAULT, recipe_table.PEER_SPE8, recipe_table.PEER_BEST):
        spec = accuracy_runs.plan_for(name, 6000, 469 / 6000, 500, 2e-3)
        assert (spec["steps"], spec["eval_every"], spec["batch_size"]) == (6000, 469, 128)
        assert spec["learning_rate"] == pytest.approx(2e-3)
    assert accuracy_runs.RUNS[recipe_table.PEER_DEFAULT].get("steps_per_execution", 1) == 1
    assert "precision" not in accuracy_runs.RUNS[recipe_table.PEER_DEFAULT]
    best = accuracy_runs.RUNS[recipe_table.PEER_BEST]
    assert (best["steps_per_execution"], best["precision"]) == (8, "mixed_bfloat16")

    def row(name, precision, wall, t091, step):
        return {"name": name, "precision": precision, "wall_s": wall, "t091_s": t091,
                "step_091": step}

    rows = [row(recipe_table.ENGINE_AUTO, "mixed_bfloat16", 240.0, 60.0, 1407),
            row(recipe_table.ENGINE_FP32, "float32", 400.0, 110.0, 1407),
            row(recipe_table.PEER_DEFAULT, "float32", 500.0, 160.0, 1407),
            row(recipe_table.PEER_SPE8, "float32", 300.0, 100.0, 1407),
            row(recipe_table.PEER_BEST, "mixed_bfloat16", 200.0, 40.0, 938)]
    pairs = {p["name"]: p for p in recipe_table.pair_rows(rows)}
    assert pairs["bf16_vs_best"]["precision"] == "mixed_bfloat16 / mixed_bfloat16"
    assert pairs["fp32_vs_spe8"]["precision"] == "float32 / float32"
    assert pairs["bf16_vs_best"]["wall_ratio"] == pytest.approx(1.2)
    assert pairs["fp32_vs_default"]["wall_ratio"] == pytest.approx(0.8)
    targets = {t["id"]: t for t in recipe_table.pair_targets(list(pairs.values()))}
    assert set(targets) == {"recipe.bf16_vs_best.wall", "recipe.bf16_vs_best.t091",
                            "recipe.fp32_vs_spe8.wall", "recipe.fp32_vs_spe8.t091"}
    # Slower than the careful user by more than a tenth is not met; within it is.
    assert targets["recipe.bf16_vs_best.wall"]["met"] is False
    assert targets["recipe.bf16_vs_best.t091"]["met"] is False
    assert "step 1407 / 938" in targets["recipe.bf16_vs_best.t091"]["why"]
    assert targets["recipe.fp32_vs_spe8.t091"]["met"] is True
    assert targets["recipe.fp32_vs_spe8.wall"]["met"] is False


TURNS_CHILD = """
import sys
from benchmarks import turns
clock = turns.Turns()
clock.start(name="fake")
for step in range(1, 7):
    if step % 3 == 0:
        clock.event(event="eval", step=step, accuracy=step / 10)
    if step % 2 == 0:
        clock.pause(step)
clock.done(step=6)
"""


def test_turns_children_take_turns():
    from benchmarks import turns  # pylint: disable=import-outside-toplevel

    children = [turns.Child(f"c{i}", [sys.executable, "-c", TURNS_CHILD], env=child_env())
                for i in range(2)]
    try:
        assert [c.read()["name"] for c in children] == ["fake", "fake"]
        log = []
        while not all(c.finished for c in children):
            for c in children:
                if not c.finished:
                    log.append((c.name, [e["event"] for e in c.turn()]))
        assert log[:2] == [("c0", ["pause"]), ("c1", ["pause"])]
        assert log[2] == ("c0", ["eval", "pause"])
        assert [name for name, events in log if events[-1] == "done"] == ["c0", "c1"]
    finally:
        for c in children:
            c.close()


def test_turns_server_answers_and_reports_errors():
    from benchmarks import turns  # pylint: disable=import-outside-toplevel

    code = ("from benchmarks import turns\n"
            "turns.serve({'double': lambda m: {'value': 2 * m['x']},"
            " 'fail': lambda m: 1 / 0}, kind='test')\n")
    child = turns.Child("server", [sys.executable, "-c", code], env=child_env())
    try:
        assert child.read()["kind"] == "test"
        assert child.request({"op": "double", "x": 21})["value"] == 42
        with pytest.raises(turns.ChildError, match="ZeroDivisionError"):
            child.request({"op": "fail"})
    finally:
        child.close()


@pytest.mark.slow
def test_shapes_table_quick(tmp_path):
    from benchmarks import shapes_table  # pylint: disable=import-outside-toplevel

    settings = common.Settings(data_dir=str(tmp_path / "data"), quick=True, repeats=1,
                               workdir=str(tmp_path / "work"))
    result = shapes_table.run(settings, steps=4, examples=64)
    row = result["rows"][0]
    assert not row.get("error"), row.get("error")
    assert 0.0 <= row["mean_iou"] <= 1.0 and 0.0 <= row["pixel_accuracy"] <= 1.0
    assert row["global_step"] == 4
    assert result["targets"][0]["id"] == "shapes.mean_iou"


CLUSTER_TF_ROWS = ("batch 16: one process", "batch 16: chief + 1 worker")
CLUSTER_JAX_ROWS = ("batch 16: keras3 on JAX, one process", "batch 16: keras3 on JAX, 2 processes")


@pytest.mark.slow
def test_cluster_table_quick(tiny, settings):
    from benchmarks import cluster_table  # pylint: disable=import-outside-toplevel

    jax = common.jax_python(settings)
    result = cluster_table.run(settings, batches=(16,), steps=6)
    rows = {row["name"]: row for row in result["rows"]}
    assert list(rows) == [*CLUSTER_TF_ROWS, *CLUSTER_JAX_ROWS]
    for name in CLUSTER_TF_ROWS + (CLUSTER_JAX_ROWS if jax else ()):
        assert not rows[name].get("error"), rows[name].get("error")
        assert rows[name]["median"] > 0 and "not_measured" not in rows[name]
    for name in () if jax else CLUSTER_JAX_ROWS:
        assert rows[name]["median"] is None and rows[name]["not_measured"]
    assert rows["batch 16: chief + 1 worker"]["replicas"] == 2
    assert rows["batch 16: keras3 on JAX, 2 processes"]["replicas"] == 2
    assert [t["id"] for t in result["targets"]] == ["cluster.b16"]
    assert result["targets"][0]["value"] > 0
    assert result["python_jax"] == jax
    assert any(n.startswith("batch 16: keras3 on JAX, 2 processes / one process: ")
               for n in result["notes"]) == bool(jax)
    json.dumps(result)


def _fake_cluster_runs(monkeypatch, rates):
    """Replaces the cluster table's runs: each returns ``rates[(jax, workers)]``
    examples/s at once; returns the list of (workers, jax interpreter) run."""
    from benchmarks import cluster_table  # pylint: disable=import-outside-toplevel

    calls = []

    def one(settings, data, batch, steps, workers, k, jax=None):
        calls.append((workers, jax))
        rate = rates[bool(jax), workers]
        return {"seconds": 1.0, "step": steps, "steps_per_s": rate / batch,
                "examples_per_s": rate}

    monkeypatch.setattr(cluster_table, "_one", one)
    return calls


def test_cluster_table_alternates_the_jax_rows_with_the_others(tiny, settings, monkeypatch):
    from benchmarks import cluster_table  # pylint: disable=import-outside-toplevel

    monkeypatch.setattr(common, "jax_python", lambda settings: "/jax/python")
    calls = _fake_cluster_runs(monkeypatch, {(False, 0): 100.0, (False, 1): 80.0,
                                             (True, 0): 200.0, (True, 1): 300.0})
    settings.repeats = 2
    result = cluster_table.run(settings, batches=(16,), steps=6)
    one_round = [(0, None), (0, "/jax/python"), (1, None), (1, "/jax/python")]
    assert calls == one_round + one_round[::-1]
    rows = {row["name"]: row for row in result["rows"]}
    assert list(rows) == [*CLUSTER_TF_ROWS, *CLUSTER_JAX_ROWS]
    assert [rows[n]["median"] for n in CLUSTER_JAX_ROWS] == [200.0, 300.0]
    assert [rows[n]["ratio"] for n in CLUSTER_JAX_ROWS] == [1.0, pytest.approx(1.5)]
    assert rows[CLUSTER_TF_ROWS[1]]["ratio"] == pytest.approx(0.8)
    # The JAX rows are information: the targets are the MultiWorkerMirrored ones alone.
    assert [(t["id"], t["value"]) for t in result["targets"]] == [("cluster.b16",
                                                                   pytest.approx(0.8))]
    assert "batch 16: keras3 on JAX, 2 processes / one process: 1.50x examples/s " \
           "(information, not a target)" in result["notes"]
    assert any("/jax/python" in n and "share" in n for n in result["notes"])


def test_cluster_table_reports_the_jax_rows_not_measured_without_jax(tiny, settings,
                                                                     monkeypatch, tmp_path):
    from benchmarks import cluster_table, report  # pylint: disable=import-outside-toplevel

    assert common.no_jax_reason(settings).startswith("no interpreter with Keras 3 and JAX")
    settings.python_jax = str(tmp_path / "no-such-python")
    calls = _fake_cluster_runs(monkeypatch, {(False, 0): 100.0, (False, 1): 80.0})
    result = cluster_table.run(settings, batches=(16,), steps=6)
    assert calls == [(0, None), (1, None)]
    reason = f"--python-jax {settings.python_jax} cannot import jax and keras"
    rows = {row["name"]: row for row in result["rows"]}
    assert list(rows) == [*CLUSTER_TF_ROWS, *CLUSTER_JAX_ROWS]
    for name in CLUSTER_JAX_ROWS:
        assert rows[name]["median"] is None and rows[name]["ratio"] is None
        assert rows[name]["not_measured"] == reason and not rows[name]["error"]
    for name in CLUSTER_TF_ROWS:
        assert rows[name]["median"] > 0 and "not_measured" not in rows[name]
    assert [t["id"] for t in result["targets"]] == ["cluster.b16"]
    assert result["targets"][0]["met"] is False
    assert f"keras3 on JAX rows: not measured: {reason}" in result["notes"]
    markdown = report.table_markdown(result)
    assert markdown.count("(not measured: --python-jax") == 2, markdown
    assert output.format_table(result).count("not measured: --python-jax") == 3


def test_cluster_runs_put_the_jax_rows_on_the_keras3_engine(settings, monkeypatch):
    from benchmarks import cluster_table  # pylint: disable=import-outside-toplevel

    calls = []

    def run_experiments(args, timeout, python=None, env=None):
        args = [str(a) for a in args]
        calls.append((args, python, env))
        line = "trained to step 6: loss 2.3, 4.0 steps/s, 128 examples/s on average\n"
        if args[0] == "cluster":
            log_dir = args[args.index("--log-dir") + 1]
            os.makedirs(log_dir)
            with open(os.path.join(log_dir, "chief-0.log"), "w") as f:
                f.write(line)
            return 0, "", "", 1.0
        return 0, "", line, 1.0

    monkeypatch.setattr(common, "run_experiments", run_experiments)
    jax_run = cluster_table._one(settings, "DATA", 16, 6, 1, 0,  # pylint: disable=protected-access
                                 jax="/jax/python")
    tf_run = cluster_table._one(settings, "DATA", 16, 6, 0, 0)  # pylint: disable=protected-access
    assert jax_run["examples_per_s"] == 128 and tf_run["steps_per_s"] == 4.0
    (jax_args, jax_python, jax_env), (tf_args, tf_python, tf_env) = calls
    assert jax_args[:2] == ["cluster", "fashion_mnist_mlp"] and "--engine" not in tf_args
    assert jax_args[jax_args.index("--engine") + 1] == "keras3"
    assert jax_args[jax_args.index("--workers") + 1] == "1"
    assert (jax_python, jax_env) == ("/jax/python", {"KERAS_BACKEND": "jax",
                                                     "TF_USE_LEGACY_KERAS": None})
    assert tf_args[0] == "train" and (tf_python, tf_env) == (settings.python_estimator, None)


def test_run_experiments_sets_and_removes_variables(monkeypatch):
    seen = {}

    def run(argv, **kwargs):
        seen.update(argv=argv, env=kwargs["env"])
        return subprocess.CompletedProcess(argv, 0, "out", "err")

    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    rc, out, err, _ = common.run_experiments(["train", "x"], 10, "/py",
                                             env={"KERAS_BACKEND": "jax",
                                                  "TF_USE_LEGACY_KERAS": None})
    assert (rc, out, err) == (0, "out", "err")
    assert seen["argv"] == ["/py", "-m", "experiments", "train", "x"]
    assert seen["env"]["KERAS_BACKEND"] == "jax" and "TF_USE_LEGACY_KERAS" not in seen["env"]


def test_plots_and_report(tmp_path):
    pytest.importorskip("matplotlib")
    from benchmarks import plots, report  # pylint: disable=import-outside-toplevel

    curve = [{"step": 100, "active_s": 10.0, "accuracy": 0.85},
             {"step": 200, "active_s": 20.0, "accuracy": 0.92}]
    results = {"tables": {
        "accuracy": {"table": "accuracy", "rows": [
            {"name": "keras_numpy", "curve": curve, "final_accuracy": 0.92},
            {"name": "project_default", "curve": curve, "final_accuracy": 0.92}],
            "columns": ["name", "final_accuracy"],
            "targets": [common.target("a.t", "time", 0.8, 0.7, op="<=")]},
        "input": {"table": "input", "unit": "examples/s", "rows": [
            {"name": "default", "median": 3e5, "min": 2e5, "max": 4e5, "group": "baseline"},
            {"name": "pkg cache=True", "median": 5e6, "min": 4e6, "max": 6e6, "group": "knob"}],
            "memory": [{"name": "cache=True", "rss_mb": [400.0, 450.0, 450.0], "growth": 0.0,
                        "cache_mb": 50.0, "cache_estimate_mb": 47.0}],
            "targets": [common.target("i.t", "rate", 5e6, 1e6)]}}}
    written = plots.write_plots(results, str(tmp_path), prefix="x-")
    assert sorted(os.path.basename(p) for p in written) == ["x-" + plots.ACCURACY_PNG,
                                                            "x-" + plots.INPUT_PNG]
    for path in written:
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    text = report.glance_markdown(results)
    assert "| accuracy | time | 0.8 | <= 0.7 | **not met** | measured 0.8, needs <= 0.7" in text
    assert "| input | rate |" in text and "**met**" in text
    table = report.table_markdown(results["tables"]["input"])
    assert "| cache=True | 400, 450, 450 | 0 | 50.00 | 47.00 |" in table


def test_generated_source_is_deterministic_and_picklable():
    source = writing_table.GeneratedSource(100, seed=3)
    a = source.read(np.array([5, 0, 5]))
    assert a[IMAGE].shape == (3, 28, 28, 1) and a[IMAGE].dtype == np.uint8
    assert (a[IMAGE][0] == a[IMAGE][2]).all() and not (a[IMAGE][0] == a[IMAGE][1]).all()
    clone = pickle.loads(pickle.dumps(source))
    assert len(clone) == 100
    assert (clone.read(np.array([5]))[IMAGE] == a[IMAGE][:1]).all()
    assert set(source.features) == {IMAGE, LABEL}


def test_writer_child_reports_examples_and_peak_rss(tmp_path):
    result = writing_table.run_child({"kind": "generated", "n": 300, "workers": 1,
                                      "out": str(tmp_path / "gen")}, timeout=120)
    assert result["examples"] == 300 and result["bytes"] > 300 * 784
    assert result["peak_rss_self_mb"] > 10 and result["peak_rss_wait4_mb"] > 10
    from estimator_keras import manifest  # pylint: disable=import-outside-toplevel
    assert manifest.load_manifest(str(tmp_path / "gen")).splits["train"].num_examples == 300


class _Fake(common.Variant):
    """A variant whose rate follows a shared machine "speed" that changes
    over time, times its own factor."""

    def __init__(self, name, factor, clock):
        self.name, self.factor, self.clock = name, factor, clock

    def warmup(self):
        pass

    def measure(self):
        self.clock.append(len(self.clock))
        # 9 windows a round in the test below: the speed doubles or halves
        # from one round to the next.
        speed = 1.0 if ((len(self.clock) - 1) // 9) % 2 == 0 else 2.0
        return self.factor * speed, 1.0


def test_run_alternating_interleaves_the_reference_and_local_ratio_sees_through_drift():
    clock = []
    variants = [_Fake("ref", 10.0, clock)] + [_Fake(f"v{i}", 10.0 * i, clock)
                                              for i in range(1, 6)]
    m = common.run_alternating(variants, 4, "test", reference="ref", ref_every=2)
    names = [name for name, _ in m.log]
    # Each round: ref, two others, ref, two others, ref, one other, ref.
    assert names[:8] == ["ref", "v1", "v2", "ref", "v3", "v4", "ref", "v5"]
    assert all(len(m.samples[f"v{i}"]) == 4 for i in range(1, 6))
    # Every window's nearest reference windows ran in its own round, at its
    # speed, so the factor comes out exactly.
    for i in range(1, 6):
        assert common.local_ratio(m.log, f"v{i}", "ref") == pytest.approx(i)
        assert common.local_ratio(m.log, "ref", f"v{i}") == pytest.approx(1 / i)
    rows = common.rows_from(variants, m, reference="ref")
    assert rows[0]["ratio"] == 1.0 and rows[2]["ratio"] == pytest.approx(2.0)
    assert rows[2]["max"] == pytest.approx(40.0)


def test_targets_and_formatting():
    assert common.target("a", "x", 1.2, 1.0)["met"] is True
    assert "why" not in common.target("a", "x", 1.2, 1.0)
    missed = common.target("a", "x", 0.2, 0.1, op="<", why="too much")
    assert missed["met"] is False
    assert missed["why"] == "measured 0.2, needs < 0.1 (100.0% over); too much"
    assert common.target("a", "x", None, 1.0, why="crashed")["why"] == "not measured: crashed"
    assert common.target("a", "x", 0.3, 0.3, op="<=")["met"] is True
    assert common.target("a", "x", None, 1.0)["met"] is None
    text = output.format_table({
        "table": "t", "title": "demo", "unit": "u/s",
        "rows": [{"name": "a", "median": 1234.5, "min": 1000.0, "max": 1500.0, "ratio": 1.0}],
        "targets": [common.target("t.x", "a ratio", 1.0, 0.9)]})
    assert "1,234" in text and "1.000x" in text and "MET" in text


def test_write_json_is_whole_or_not_at_all(tmp_path):
    path = tmp_path / "results" / "latest.json"
    output.write_json({"tables": {"a": np.float32(1.5)}}, str(path))
    assert json.loads(path.read_text()) == {"tables": {"a": 1.5}}
    circular = {"rows": [1, 2]}
    circular["rows"].append(circular)
    with pytest.raises(ValueError, match="[Cc]ircular"):
        output.write_json({"tables": circular}, str(path))
    assert json.loads(path.read_text()) == {"tables": {"a": 1.5}}
    assert os.listdir(path.parent) == ["latest.json"]  # no temporary file left


def test_a_target_is_met_only_when_every_round_meets_it():
    swung = common.target("k.mlp", "engine / baseline", None, 1.0, rounds=[1.05, 0.98, 1.1])
    assert swung["met"] is False
    assert swung["value"] == pytest.approx(1.05)
    assert swung["spread"] == [0.98, 1.05, 1.1]
    assert swung["why"].startswith("1 of 3 rounds miss (round 2: 0.98), needs >= 1 (2.0% short)")
    # Two rounds miss: the shortfall is the worse one's, whichever came first.
    twice = common.target("k.mlp", "engine / baseline", None, 1.0, rounds=[0.98, 0.9, 1.1])
    assert twice["why"].startswith("2 of 3 rounds miss (round 1: 0.98, round 2: 0.9), needs "
                                   ">= 1 (the worst 10.0% short)"), twice["why"]
    over = common.target("t", "seconds", None, 10.0, op="<", rounds=[10.5, 12.0, 9.0])
    assert "(the worst 20.0% over)" in over["why"], over["why"]
    steady = common.target("k.mlp", "engine / baseline", None, 1.0, rounds=[1.05, 1.01, 1.1])
    assert steady["met"] is True and steady["value"] == pytest.approx(1.05)
    # A round that measured nothing (its process failed) cannot count as met.
    lost = common.target("k.mlp", "engine / baseline", None, 1.0, rounds=[1.05, None, 1.1])
    assert lost["met"] is False and "round 2: unmeasured" in lost["why"]
    assert common.target("k.mlp", "x", None, 1.0, rounds=[None, None])["met"] is None

    # The spread is printed: in the text tables and in the report.
    from benchmarks import report  # pylint: disable=import-outside-toplevel
    text = output.format_table({"table": "keras", "rows": [], "targets": [swung, steady]})
    assert "[3 rounds, min / median / max 0.98 / 1.05 / 1.1]" in text and "NOT MET" in text
    lines = report.targets_markdown([swung, common.target("one", "single", 2.0, 1.0)])
    assert lines[0] == "| target | value | rounds: min / median / max | need | met | why |"
    assert lines[2].startswith("| engine / baseline | 1.05 | 0.98 / 1.05 / 1.1 (3) | >= 1.0 | "
                               "**not met** | 1 of 3 rounds miss")
    assert lines[3] == "| single | 2 | - | >= 1.0 | **met** |  |"


def _round(ratio, samples, error=None):
    result = {"table": "keras", "seconds": 10.0, "notes": ["n"],
              "rows": [{"name": "engine", "median": 1.0, "samples": [1.0], "ratio": 1.0},
                       {"name": "baseline", "median": samples[0], "samples": samples,
                        "ratio": 1 / ratio}],
              "targets": [common.target("keras.mlp", "engine / baseline", ratio, 1.0,
                                        why="cause given by the table")]}
    return {"table": "keras", "error": error} if error else result


def test_rounds_merge_pools_windows_and_needs_every_round():
    from benchmarks import report, rounds  # pylint: disable=import-outside-toplevel

    merged = rounds.merge([_round(1.05, [2.0, 4.0]), _round(0.98, [3.0]),
                           _round(1.1, [5.0])])
    assert merged["rounds"] == 3 and merged["seconds"] == 30.0
    baseline = merged["rows"][1]
    assert baseline["samples"] == [2.0, 4.0, 3.0, 5.0]
    assert (baseline["median"], baseline["min"], baseline["max"]) == (3.5, 2.0, 5.0)
    assert baseline["ratio_rounds"] == pytest.approx([1 / 1.05, 1 / 0.98, 1 / 1.1])
    assert baseline["ratio"] == pytest.approx(1 / 1.05)
    (t,) = merged["targets"]
    assert t["met"] is False and t["rounds"] == [1.05, 0.98, 1.1]
    assert t["why"].endswith("; cause given by the table")
    table = report.table_markdown(dict(merged, columns=["name", "median", "ratio"]))
    assert "| name | median | ratio | ratio_rounds |" in table
    assert "| baseline | 3.50 | 0.9524x | 0.9524x, 1.020x, 0.9091x |" in table

    lost = rounds.merge([_round(1.2, [1.0]), _round(1.2, [1.0], error="child exited")])
    assert lost["targets"][0]["met"] is False
    assert lost["round_errors"] == ["round 2: child exited"]


def test_cli_runs_the_ratio_tables_in_rounds(monkeypatch, tmp_path):
    from benchmarks import cli  # pylint: disable=import-outside-toplevel

    calls = []
    fake = iter([_round(1.05, [2.0]), _round(0.98, [2.0]), _round(1.1, [2.0])])

    def run_child(args, table, workdir, pythons, round_no=None):
        calls.append((table, round_no))
        return next(fake)

    monkeypatch.setattr(cli, "_run_child", run_child)
    out = tmp_path / "r.json"
    assert cli.main(["--tables", "keras", "--json", str(out), "--no-plots",
                     "--workdir", str(tmp_path / "w")]) == 0
    assert calls == [("keras", 1), ("keras", 2), ("keras", 3)]
    result = json.loads(out.read_text())
    assert result["meta"]["rounds"] == {"keras": 3}
    assert result["tables"]["keras"]["targets"][0]["met"] is False
    args = cli.build_parser().parse_args(["--quick"])
    assert cli.rounds_for("keras", args) == 1 and cli.rounds_for("accuracy", args) == 1
    args = cli.build_parser().parse_args(["--rounds", "2"])
    assert cli.rounds_for("input", args) == 2 and cli.rounds_for("accuracy", args) == 1


def test_memory_targets_put_the_bound_beside_tensorflows_budget():
    memory = [{"name": "cache=True", "growth": 0.01, "rss_mb": [1.0], "epochs": 10},
              {"name": "cache=True, TensorFlow's autotune budget", "growth": 0.048},
              {"name": "no cache", "growth": 0.02, "rss_mb": [1.0], "epochs": 10},
              {"name": "no cache, TensorFlow's autotune budget", "growth": 0.49}]
    targets = {t["id"]: t for t in input_table.memory_targets(memory)}
    assert targets["input.cache_rss"]["met"] and targets["input.nocache_rss"]["met"]
    assert targets["input.reshuffle_rss"]["met"] is None
    assert "TensorFlow's autotune budget: 0.49" in targets["input.nocache_rss"]["cause"]
    memory.append({"name": input_table.RECORDS_KEPT, "growth": 0.11})
    memory.append({"name": "cache=True, cache_shuffle=records", "growth": 0.01})
    reshuffle = {t["id"]: t for t in input_table.memory_targets(memory)}["input.reshuffle_rss"]
    assert reshuffle["met"] and "glibc's malloc defaults: 0.11" in reshuffle["cause"]
    names = [name for name, _ in input_table.memory_variants()]
    assert names[0] == "cache=True" and "no cache, TensorFlow's autotune budget" in names


def test_cli_quick_input_writes_json(tiny, tmp_path):
    out = tmp_path / "out.json"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--tables", "input", "--data-dir",
         tiny[0], "--json", str(out), "--repeats", "1", "--window", "0.01",
         "--workdir", str(tmp_path / "work")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert {"command", "started", "finished", "settings", "machine"} <= set(result["meta"])
    assert result["meta"]["machine"]["nproc"] >= 1
    table = result["tables"]["input"]
    names = {row["name"] for row in table["rows"]}
    assert {"default", "raw_read", "raw_read + parse", "guide_recipe", "per_record_parse",
            "queue_runners", "feed_dict", "pkg cycle_length=1"} <= names
    for row in table["rows"]:
        assert row["median"] > 0 and row["samples"] and row["consumed"], row
    assert {t["id"] for t in table["targets"]} >= {"input.default_abs", "input.vs_raw_0.5",
                                                   "input.vs_guide", "input.vs_queue_runners"}
    assert "== input" in proc.stdout and "target input.default_abs" in proc.stdout


def test_cli_rejects_unknown_table():
    from benchmarks import cli  # pylint: disable=import-outside-toplevel
    with pytest.raises(SystemExit):
        cli.parse_tables("input,nope")
    assert cli.parse_tables("all") == list(cli.TABLES)
    assert {"keras", "accuracy", "shapes", "cluster"} <= set(cli.TABLES)
    assert cli.environment_of() in ("estimator", "keras")



def test_engine_matrix_runs_a_case_and_reports_it():
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.engine_matrix", "--keras", "2", "--cases", "fit",
         "--timeout", "120"], cwd=ROOT, env=child_env(), capture_output=True, text=True,
        timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = [l for l in proc.stdout.splitlines() if l.startswith("Keras 2")]
    assert len(line) == 1 and line[0].split()[2:4] == ["fit", "ok"], proc.stdout
    # Only --keras given: no keras3 engine probes.
    assert "keras3 engine" not in proc.stdout


@pytest.mark.skipif(keras3_installed(), reason="checks an environment without Keras 3")
def test_engine_matrix_names_what_to_install_for_the_keras3_engine():
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.engine_matrix", "--keras3-engine", "jax"],
        cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "keras3 engine, jax        not installed here" in proc.stdout, proc.stdout
    assert "pip install -e '.[jax]'" in proc.stdout and "Keras 2" not in proc.stdout


def test_cli_passes_no_accuracy_knobs_to_the_table_child():
    from benchmarks import cli  # pylint: disable=import-outside-toplevel

    pythons = {"estimator": None, "keras": None}
    args = cli.build_parser().parse_args(["--tables", "accuracy", "--no-accuracy-knobs"])
    assert args.accuracy_knobs is False
    assert "--no-accuracy-knobs" in cli._child_args(  # pylint: disable=protected-access
        args, "python", "accuracy", "t.json", "/work", pythons)
    args = cli.build_parser().parse_args(["--tables", "accuracy"])
    assert args.accuracy_knobs is True
    assert "--no-accuracy-knobs" not in cli._child_args(  # pylint: disable=protected-access
        args, "python", "accuracy", "t.json", "/work", pythons)


def test_cadence_table_compares_the_medians_and_alternates(tiny, settings, monkeypatch):
    from benchmarks import cadence_table  # pylint: disable=import-outside-toplevel

    monkeypatch.setattr(common, "jax_python", lambda settings: "/jax/python")
    # Seconds of each run, in the order each backend's runs come.
    seconds = {("tensorflow", 200): [10.0, 12.0, 11.0], ("tensorflow", 201): [11.0, 30.0, 11.5],
               ("jax", 200): [20.0, 20.0, 20.0], ("jax", 201): [21.0, 20.0, 19.0]}
    calls = []

    def one(settings, python, data, backend, every, k):
        calls.append((backend, every, k, python))
        return {"seconds": seconds[backend, every][k], "steps_per_s": 100.0, "step": 600}

    monkeypatch.setattr(cadence_table, "_one", one)
    settings.repeats = 3
    result = cadence_table.run(settings)
    tf_runs = [c[:3] for c in calls if c[0] == "tensorflow"]
    assert tf_runs == [("tensorflow", 200, 0), ("tensorflow", 201, 0), ("tensorflow", 201, 1),
                       ("tensorflow", 200, 1), ("tensorflow", 200, 2), ("tensorflow", 201, 2)]
    assert {c[3] for c in calls if c[0] == "jax"} == {"/jax/python"}
    rows = {row["name"]: row["median"] for row in result["rows"]}
    assert rows == {"tensorflow, --eval-every 200": 11.0, "tensorflow, --eval-every 201": 11.5,
                    "jax, --eval-every 200": 20.0, "jax, --eval-every 201": 20.0}
    targets = {t["id"]: t for t in result["targets"]}
    # One slow run (30 s) moves a repeat's ratio, not the medians'.
    assert targets["cadence.tensorflow"]["value"] == pytest.approx(11.0 / 11.5)
    assert targets["cadence.tensorflow"]["met"] is True
    assert targets["cadence.tensorflow"]["per_repeat"][1] == pytest.approx(0.4)
    assert targets["cadence.jax"]["value"] == pytest.approx(1.0)


def test_cadence_table_misses_when_the_odd_cadence_is_slower(tiny, settings, monkeypatch):
    from benchmarks import cadence_table  # pylint: disable=import-outside-toplevel

    monkeypatch.setattr(common, "jax_python", lambda settings: None)
    monkeypatch.setattr(cadence_table, "_one", lambda settings, python, data, backend, every, k: {
        "seconds": 10.0 if every == 200 else 20.0, "steps_per_s": 1.0, "step": 600})
    result = cadence_table.run(settings)
    (tf_target, jax_target) = result["targets"]
    assert tf_target["met"] is False and tf_target["value"] == pytest.approx(0.5)
    assert "needs >= 0.87" in tf_target["why"]
    assert jax_target["met"] is None  # no interpreter with JAX: not measured


@pytest.mark.slow
def test_embedding_table_runs_both_sums_in_a_real_cluster(settings, monkeypatch):
    from benchmarks import embedding_table  # pylint: disable=import-outside-toplevel

    # A small table: the two ways differ here too, by less.
    monkeypatch.setattr(embedding_table, "QUICK", (20_000, 8, 3))
    result = embedding_table.run(settings)
    rows = {row["name"]: row for row in result["rows"]}
    assert set(rows) == {"dense sum", "sparse sum"}
    for row in rows.values():
        assert row["error"] is None and len(row["samples"]) == 1, row
        assert row["median"] > 0
    assert "20,000 x 128 float32 table (10 MB)" in result["notes"][0], result["notes"]


def test_embedding_table_alternates_and_compares_per_repeat(settings, monkeypatch):
    from benchmarks import embedding_table  # pylint: disable=import-outside-toplevel

    rates = {"dense": [2.0, 1.0, 4.0], "sparse": [20.0, 30.0, 8.0]}
    calls = []

    def one(settings, mode, rows, steps, warmup, k):
        calls.append((mode, k))
        return {"steps_per_s": rates[mode][k], "network": "private"}

    monkeypatch.setattr(embedding_table, "_one", one)
    settings.repeats = 3
    result = embedding_table.run(settings)
    assert calls == [("dense", 0), ("sparse", 0), ("sparse", 1), ("dense", 1),
                     ("dense", 2), ("sparse", 2)]
    rows = {row["name"]: row["median"] for row in result["rows"]}
    assert rows == {"dense sum": 2.0, "sparse sum": 20.0}
    assert result["notes"][1] == "sparse / dense steps/s per repeat: 10, 30, 2"
    assert result["notes"][2] == "sparse / dense of the medians: 10"


def test_every_table_names_its_commit_and_whether_its_code_changed_since():
    """BENCHMARKS.md's "Where each table comes from": every table once, with
    the commit it ran on and its published file; "current" only where git
    shows none of its code changed since that commit, "stale: why" only
    where some did."""
    from benchmarks import cli, provenance  # pylint: disable=import-outside-toplevel

    with open(os.path.join(ROOT, "BENCHMARKS.md"), encoding="utf-8") as f:
        runs = provenance.read_runs(f.read())
    assert set(runs) == set(cli.TABLES)
    for table, run in runs.items():
        if run["state"] == provenance.NOT_RUN:
            # A table never run yet names no commit and no file.
            assert (run["commit"], run["file"]) == ("-", "-"), (table, run)
            continue
        assert os.path.isfile(os.path.join(ROOT, run["file"])), (table, run["file"])
        changed = provenance.changed_since(run["commit"], provenance.code_paths(table))
        if run["state"] == "current":
            assert changed == [], f"table {table} is called current, but since {run['commit']} " \
                                  f"these changed: {changed}"
        else:
            assert run["state"].startswith("stale: ") and len(run["state"]) > len("stale: "), \
                (table, run["state"])
            assert changed, f"table {table} is called stale, but none of its code changed " \
                            f"since {run['commit']}: call it current"


def test_a_tables_code_is_the_library_and_the_benchmark_modules_that_run_it():
    from benchmarks import provenance  # pylint: disable=import-outside-toplevel

    paths = provenance.code_paths("cadence")
    for path in ("estimator_keras", "experiments", "setup.py", "benchmarks/cadence_table.py",
                 "benchmarks/cli.py", "benchmarks/common.py", "benchmarks/rounds.py"):
        assert path in paths
    assert "benchmarks/embedding_table.py" not in paths
    assert "benchmarks/embedding_table.py" in provenance.code_paths("embedding")
    # A file a table runs through that changed since a commit is found.
    first = subprocess.run(["git", "-C", ROOT, "rev-list", "--max-parents=0", "HEAD"],
                           capture_output=True, text=True, check=True).stdout.split()[0]
    assert "estimator_keras/engines/base.py" in provenance.changed_since(first, paths)
    with pytest.raises(RuntimeError, match="does not know commit 0000000"):
        provenance.changed_since("0000000", paths)


def test_benchmarks_md_runs_section_refuses_a_table_listed_twice():
    from benchmarks import provenance  # pylint: disable=import-outside-toplevel

    row = "| `cadence` | `a3b9aee` | then | `x.json` | current |"
    text = f"{provenance.SECTION}\n\n| table | commit | run | file | state |\n{row}\n{row}\n"
    with pytest.raises(ValueError, match="twice"):
        provenance.read_runs(text)
    assert provenance.read_runs(text.replace(row + "\n", "", 1))["cadence"] == {
        "commit": "a3b9aee", "when": "then", "file": "x.json", "state": "current"}
    never = "| `grain` | - | - | - | not run yet |"
    assert provenance.read_runs(text.replace(row + "\n", never + "\n", 1))["grain"] == {
        "commit": "-", "when": "-", "file": "-", "state": provenance.NOT_RUN}


def test_a_figure_is_quoted_on_the_side_of_its_threshold_that_the_json_value_is():
    # 0.97988 rounds to 0.980 at three digits, over a >= 0.98 target it misses.
    assert output.fmt_value(0.9798777568823078, 0.98, ">=") == "0.9799"
    assert output.fmt_value(0.9798777568823078) == "0.98"
    assert output.fmt_value(1.10004, 1.10, "<=") == "1.10004"
    assert output.fmt_value(0.984, 1.0, ">=") == "0.984"
    assert output.fmt_value(2.5e-7 + 1.0, 1.0, "<=") != "1"
    target = common.target("t", "d", 0.9798777568823078, 0.98)
    assert target["met"] is False
    assert "measured 0.9799, needs >= 0.98 (0.012% short)" in target["why"]
    line = [line for line in output.format_table({"table": "t", "targets": [target]})
            .splitlines() if "target t:" in line][0]
    assert ": 0.9799 (need >= 0.98) NOT MET" in line
    assert output.fmt_ratio(0.9798777568823078) == "0.9799x"
    assert output.fmt_ratio(1.0) == "1.000x"


def test_benchmarks_md_quotes_the_resume_tables_ratios_as_its_json_has_them():
    """The published table's ratio cells are the JSON's values to four digits
    (its 0.97988 is 0.9799x, not a rounded 0.98x over the target it missed)."""
    from benchmarks import provenance, report  # pylint: disable=import-outside-toplevel

    with open(os.path.join(ROOT, "BENCHMARKS.md"), encoding="utf-8") as f:
        text = f.read()
    run = provenance.read_runs(text)["resume"]
    with open(os.path.join(ROOT, run["file"]), encoding="utf-8") as f:
        result = json.load(f)["tables"]["resume"]
    for line in report.rows_markdown(result["rows"], result["columns"], result.get("unit", "")):
        assert line in text.splitlines(), line


def test_a_stalled_turn_is_flagged_in_the_round_and_the_merged_result():
    assert output.stalled_turns([10.0, 11.0, 9.5, 31.0, 10.2]) == [3]
    assert output.stalled_turns([10.0, 19.9, 10.0]) == []
    assert output.stalled_turns([10.0, 40.0]) == []  # two turns have no median to trust
    rows = [{"name": "engine", "turns_s": [10.0, 10.5, 45.0, 9.8], "stalled_turns": [2]},
            {"name": "peer", "turns_s": [8.0, 8.1, 8.2], "stalled_turns": []}]
    from benchmarks import accuracy_table, rounds  # pylint: disable=import-outside-toplevel
    lines = accuracy_table.stalled(rows)
    assert lines == ["engine: turn 3 of 4 took 45.0 s, over twice the median of its turns "
                     "(10.2 s)"]
    one = {"table": "recipe", "rows": [], "targets": [common.target("t", "d", 1.0, 1.1, "<=")],
           "stalled": []}
    two = dict(one, stalled=lines)
    merged = rounds.merge([one, two, one])
    assert merged["stalled_rounds"] == [2]
    assert merged["stalled"] == [f"round 2: {lines[0]}"]
    assert f"  STALLED: round 2: {lines[0]}" in output.format_table(merged).splitlines()
    from benchmarks import report  # pylint: disable=import-outside-toplevel
    assert f"- round 2: {lines[0]}" in report.table_markdown(merged).splitlines()


def test_the_recipe_and_cluster_tables_run_in_rounds_and_merge_their_runs():
    from benchmarks import cli, rounds  # pylint: disable=import-outside-toplevel
    assert {"recipe", "cluster"} <= set(cli.ROUND_TABLES)
    pair = {"name": "bf16_vs_best", "wall_ratio": 1.0, "t091_ratio": 1.0}
    results = [{"rows": [{"name": "e", "wall_s": w}], "pairs": [dict(pair, wall_ratio=r)],
                "targets": []} for w, r in ((100.0, 0.9), (300.0, 1.2), (110.0, 1.0))]
    merged = rounds.merge(results)
    assert merged["rows"][0]["wall_s"] == 110.0
    assert merged["rows"][0]["wall_s_rounds"] == [100.0, 300.0, 110.0]
    assert merged["pairs"][0]["wall_ratio"] == 1.0
    assert merged["pairs"][0]["wall_ratio_rounds"] == [0.9, 1.2, 1.0]


def test_the_keras_table_evaluates_as_train_does():
    """The engine's windows run the experiments' own evaluation (the whole
    split, as `train` runs it), not a shortened one."""
    import ast  # pylint: disable=import-outside-toplevel
    from benchmarks import keras_table  # pylint: disable=import-outside-toplevel
    with open(keras_table.__file__, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and getattr(node.func, "attr", None) == "experiment_plan"]
    assert calls, "keras_table builds no experiment plan"
    assert all("eval_steps" not in {k.arg for k in call.keywords} for call in calls)


def test_the_grain_tables_import_no_tensorflow_until_they_time_tf_data(tiny):
    code = ("import sys\n"
            "from benchmarks import grain_accuracy_table, grain_table\n"
            "grain_table.pipeline_settings('fashion_mnist_cnn')\n"
            f"assert grain_table._first_pass({tiny[0]!r}, {BATCH}) == {-(-N_TRAIN // BATCH)}\n"
            "assert 'tensorflow' not in sys.modules, 'tensorflow imported'\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_grain_accuracy_run_says_whether_it_imported_tensorflow(tmp_path):
    from benchmarks import grain_accuracy_table as table  # pylint: disable=import-outside-toplevel

    # `list` imports no TensorFlow; the wrapper reports so at exit.
    proc = subprocess.run([sys.executable, "-c", table.WRAPPER, "list"], cwd=ROOT,
                          env=child_env(), capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert table.MARK + '{"tensorflow_imported": false}' in proc.stderr
    assert "fashion_mnist_cnn" in proc.stdout


def test_the_grain_accuracy_table_times_0_91_from_the_start_and_judges_the_last_evaluation():
    from benchmarks import grain_accuracy_table as table  # pylint: disable=import-outside-toplevel
    from experiments.tuning.evaluations import Evaluation  # pylint: disable=import-outside-toplevel

    evals = [Evaluation(469, 1000.0 + 60, {"accuracy": 0.88}),
             Evaluation(938, 1000.0 + 120, {"accuracy": 0.912}),
             Evaluation(1407, 1000.0 + 180, {"accuracy": 0.921})]
    row = dict(table.fill_evaluations(evals, 1000.0), tensorflow_imported=False,
               tensorflow_installed=True, python="py")
    assert (row["t091_s"], row["step_091"], row["final_accuracy"]) == (120.0, 938, 0.921)
    final, free = table.targets_of(row)
    assert final["met"] is False and "step 938" in final["why"]
    assert free["value"] == 1.0 and free["met"] is True
    row["tensorflow_imported"] = True
    assert table.targets_of(row)[1]["met"] is False
    args = table.train_args("d", "m", "e.jsonl", quick=True)
    assert args[:4] == ["train", "fashion_mnist_cnn", "--engine", "keras3"]
    assert "pipeline=grain" in args and "--max-steps" in args
    assert "--max-steps" not in table.train_args("d", "m", "e.jsonl")

