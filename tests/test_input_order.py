"""A training pipeline's order is a function of (seed, epoch), and one
started at any batch continues the uninterrupted stream exactly: the
guarantee under a resumed run (the runs themselves: tests/test_exact_resume.py)."""

import random
import shutil

import numpy as np
import pytest
import tensorflow as tf

from estimator_keras import input_order
from estimator_keras.inputs import make_dataset

# Settings a resumed pipeline must continue exactly, each with interleave on.
SETTINGS = {
    "batch": {"shuffle": "batch", "shuffle_buffer": 3},
    "record": {"shuffle": "record", "shuffle_buffer": 7},
    "none": {"shuffle": "none"},
    "batch-cache": {"shuffle": "batch", "cache": True},
    "record-cache": {"shuffle": "record", "cache": True, "shuffle_buffer": 9},
    "batch-cache-records": {"shuffle": "batch", "cache": True, "cache_shuffle": "records"},
    "record-parallel": {"shuffle": "record", "parallel_reads": True},
}
N, SHARDS, BATCH = 46, 5, 4  # 12 batches an epoch, the last one of 2
RESUMES = 6  # start batches drawn per setting


def _batches(dataset, count):
    return [labels.numpy().tolist() for _, labels in dataset.take(count)]


def _build(directory, start_batch=0, shard=None, **settings):
    return make_dataset(directory, BATCH, training=True, features=["vec"], label="id",
                        seed=11, cycle_length=2, block_length=3, shard=shard,
                        start_batch=start_batch, **settings)


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_a_pipeline_started_at_any_batch_continues_the_stream(tiny_dataset, name):
    directory, _ = tiny_dataset(n=N, num_shards=SHARDS)
    settings = SETTINGS[name]
    whole = _batches(_build(directory, **settings), 12 * 4)
    ids = [i for batch in whole for i in batch]
    for epoch in range(4):
        assert sorted(ids[epoch * N:(epoch + 1) * N]) == list(range(N)), (name, epoch)
    assert sorted(len(b) for b in whole[:12]) == [2] + [4] * 11  # batches stay in their epoch
    if settings.get("shuffle") != "none":
        assert len({tuple(ids[e * N:(e + 1) * N]) for e in range(4)}) == 4
    draws = random.Random(name).sample(range(1, 12 * 3), RESUMES)
    for start in draws:
        resumed = _batches(_build(directory, start_batch=start, **settings), 12)
        assert resumed == whole[start:start + 12], (name, start)


def test_the_order_depends_on_the_seed_and_the_epoch_only(tiny_dataset):
    directory, _ = tiny_dataset(n=N, num_shards=SHARDS)
    first = _batches(_build(directory, shuffle="record"), 24)
    # Built again after other pipelines and random ops: the same order.
    tf.random.uniform([3])
    _batches(_build(directory, shuffle="batch"), 5)
    assert _batches(_build(directory, shuffle="record"), 24) == first
    other = make_dataset(directory, BATCH, training=True, features=["vec"], label="id",
                         seed=12, shuffle="record", cycle_length=2, block_length=3)
    assert _batches(other, 24) != first


@pytest.mark.parametrize("cache", [False, True])
def test_pipelines_of_a_cluster_resume_their_own_share(tiny_dataset, cache):
    """Two pipelines (workers) of unequal shares: 3 and 2 of 5 files; each
    resumed at the same step continues its own stream, and together they
    see every example once per epoch."""
    directory, _ = tiny_dataset(n=50, num_shards=SHARDS)
    for index in range(2):
        whole = _batches(_build(directory, shard=(2, index), cache=cache), 30)
        for start in random.Random(index).sample(range(1, 20), 4):
            resumed = _batches(_build(directory, shard=(2, index), cache=cache,
                                      start_batch=start), 10)
            assert resumed == whole[start:start + 10], (index, start)
    per_epoch = [input_order.batches_per_epoch(30, BATCH), input_order.batches_per_epoch(20, BATCH)]
    assert per_epoch == [8, 5]
    seen = []
    for index, batches in enumerate(per_epoch):
        seen += [i for b in _batches(_build(directory, shard=(2, index), cache=cache), batches)
                 for i in b]
    assert sorted(seen) == list(range(50))


def test_a_cached_pipeline_reads_its_files_once(tiny_dataset, tmp_path):
    directory, _ = tiny_dataset(n=N, num_shards=SHARDS)
    copy = str(tmp_path / "copy")
    shutil.copytree(directory, copy)
    iterator = iter(_build(copy, shuffle="record", cache=True))
    first = [int(i) for _ in range(12) for i in next(iterator)[1].numpy()]
    shutil.rmtree(copy)  # later epochs must come from memory
    later = [int(i) for _ in range(24) for i in next(iterator)[1].numpy()]
    assert sorted(first) == list(range(N))
    assert sorted(later[:N]) == sorted(later[N:]) == list(range(N))


def test_without_counts_a_resumed_pipeline_starts_a_new_epoch_order(tiny_dataset, tmp_path):
    directory, _ = tiny_dataset(n=N, num_shards=SHARDS)
    pattern = directory + "/train-*"
    fresh = _batches(_build(pattern, shuffle="record"), 12)
    resumed = _batches(_build(pattern, shuffle="record", start_batch=5), 12)
    assert sorted(i for b in resumed for i in b) == list(range(N))
    assert resumed != fresh


def test_positions():
    assert input_order.position(0, 12, 3) == input_order.Position(0, 0, 12, 3)
    assert input_order.position(29, 12, 3) == input_order.Position(2, 5, 12, 3)
    assert input_order.position(29, None, 3) == input_order.Position(29, 0, None, 3)
    assert input_order.batches_per_epoch(46, 4) == 12
    assert input_order.pipeline_files(list("abcde"), 2, 1) == (["b", "d"], False)
    assert input_order.pipeline_files(list("a"), 2, 1) == (["a"], True)
    seeds = {input_order.epoch_seed(7, e) for e in range(1000)}
    assert len(seeds) == 1000
    assert int(input_order.epoch_seed(7, tf.constant(5, tf.int64))) == input_order.epoch_seed(7, 5)
    assert np.all(np.array(sorted(seeds)) < input_order.SEED_RANGE)
