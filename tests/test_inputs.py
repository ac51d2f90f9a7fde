"""Tests of estimator_keras.inputs: the tf.data pipeline over TFRecord shards.

Every example carries a unique ``id`` so that tests can count exactly what a
pipeline yields; datasets are a few dozen tiny examples.
"""

import collections
import json
import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from support import child_env, flip_byte_in_record
from estimator_keras import inputs, records
from estimator_keras.errors import ConfigError, SchemaError, UsageError
from estimator_keras.inputs import InputConfig, cache_decision, make_dataset, make_input_fn
from estimator_keras.records import RecordFiles, encode_example, write_records
from estimator_keras.schema import FeatureSpec
from estimator_keras.sources import ImageFolderSource


def _ids(dataset):
    """The ids a dataset yields, in order, when ``id`` is its label."""
    return [int(i) for _, labels in dataset for i in labels.numpy()]


def _file_order(directory):
    """The ids of a dataset's shards read raw, shard after shard."""
    names = sorted(n for n in os.listdir(directory) if ".tfrecord" in n)
    return [tf.train.Example.FromString(r.numpy()).features.feature["id"].int64_list.value[0]
            for n in names for r in tf.data.TFRecordDataset(os.path.join(directory, n))]


# --------------------------------------------------------------------------- sharding

@pytest.mark.parametrize("num_files,num_pipelines,seed", [
    (5, 2, 0), (5, 2, None),          # files split between pipelines
    (1, 2, None), (3, 4, None),       # fewer files than pipelines: records split
])
@pytest.mark.parametrize("how", ["input_context", "shard"])
def test_pipelines_together_see_each_example_once(tiny_dataset, caplog, how, num_files,
                                                  num_pipelines, seed):
    directory, _ = tiny_dataset(n=45, num_shards=num_files)
    seen = []
    with caplog.at_level(logging.WARNING, logger="estimator_keras.inputs"):
        for index in range(num_pipelines):
            if how == "input_context":
                kwargs = {"input_context": tf.distribute.InputContext(
                    num_input_pipelines=num_pipelines, input_pipeline_id=index,
                    num_replicas_in_sync=num_pipelines)}
            else:
                kwargs = {"shard": (num_pipelines, index)}
            seen.append(_ids(make_dataset(directory, 4, training=True, num_epochs=1,
                                          features=["vec"], label="id", seed=seed,
                                          **kwargs)))
    assert sorted(i for ids in seen for i in ids) == list(range(45))
    assert all(ids for ids in seen)
    record_path = any("sharding by record" in r.getMessage() for r in caplog.records)
    assert record_path == (num_files < num_pipelines)


def test_record_sharded_pipelines_over_two_epochs(tiny_dataset):
    directory, _ = tiny_dataset(n=45, num_shards=2)
    counts = collections.Counter()
    for index in range(3):
        counts.update(_ids(make_dataset(directory, 4, training=True, num_epochs=2,
                                        features=["vec"], label="id", shard=(3, index))))
    assert sorted(counts) == list(range(45)) and set(counts.values()) == {2}


# --------------------------------------------------------------------------- evaluation

def test_evaluation_reads_every_example_once_in_order(tiny_dataset):
    directory, _ = tiny_dataset(n=43, num_shards=3, shuffle=False)
    batches = list(make_dataset(directory, 8, training=False, split="train",
                                features=["vec"], label="id"))
    assert [int(b[1].shape[0]) for b in batches] == [8, 8, 8, 8, 8, 3]
    assert [int(i) for b in batches for i in b[1].numpy()] == list(range(43))

    shuffled, _ = tiny_dataset(n=43, num_shards=3, name="shuffled")
    order = _ids(make_dataset(shuffled, 8, training=False, split="train",
                              features=["vec"], label="id"))
    assert order == _file_order(shuffled) and order != sorted(order)
    # The same through an Estimator input_fn; the default split for
    # evaluation is "test", which this dataset lacks.
    input_fn = make_input_fn(shuffled, 8, training=False, split="train", features=["vec"],
                             label="id")
    assert _ids(input_fn()) == order


# --------------------------------------------------------------------------- shuffling

@pytest.mark.parametrize("mode", ["batch", "record", "none"])
def test_training_epoch_sees_each_example_once(tiny_dataset, mode):
    directory, _ = tiny_dataset(n=60, num_shards=5)

    def epoch(seed, **kwargs):
        return _ids(make_dataset(directory, 4, training=True, num_epochs=1, shuffle=mode,
                                 seed=seed, features=["vec"], label="id", **kwargs))

    one, again, two = epoch(1), epoch(1), epoch(2)
    for order in (one, two):
        assert sorted(order) == list(range(60))
    assert one == again
    if mode == "none":
        # 12 records a shard fit in one block: files come whole, in order.
        assert one == two == _file_order(directory)
        assert epoch(None, cycle_length=1, block_length=5) == one
    else:
        assert one != two
        assert one != _file_order(directory)


def test_training_repeats_forever_by_default(tiny_dataset):
    directory, _ = tiny_dataset(n=10, num_shards=2)
    dataset = make_dataset(directory, 4, training=True, seed=0, features=["vec"], label="id")
    # Epochs of 4 + 4 + 2: batches stay within their epoch.
    counts = collections.Counter(_ids(dataset.take(30)))  # 100 examples: ten epochs
    assert sorted(counts) == list(range(10)) and sum(counts.values()) == 100


# --------------------------------------------------------------------------- features

def test_features_map_to_model_inputs(tiny_dataset):
    directory, arrays = tiny_dataset(n=20, num_shards=2)
    config = InputConfig(features={"pixels": "image", "ident": "id", "title": "name"},
                         label="label")
    dataset = make_dataset(directory, 6, training=False, split="train", config=config)
    seen = 0
    for features, labels in dataset:
        assert set(features) == {"pixels", "ident", "title"}
        ids = features["ident"].numpy().astype(int)
        assert np.array_equal(features["pixels"].numpy(), arrays["image"][ids])
        assert features["title"].numpy().tolist() == arrays["name"][ids].tolist()
        assert labels.dtype == tf.int64
        assert labels.numpy().tolist() == arrays["label"][ids].tolist()
        seen += len(ids)
    assert seen == 20

    only_features = make_dataset(directory, 6, training=False, split="train",
                                 features={"a": "vec", "b": "image"}, label=None)
    assert set(only_features.element_spec) == {"a", "b"}
    first = next(iter(only_features))
    assert first["a"].shape == (6, 3) and first["b"].shape == (6, 4, 3, 1)

    with pytest.raises(SchemaError) as info:
        make_dataset(directory, 6, training=True, features={"pixels": "img"})
    assert "'img'" in str(info.value)
    assert "['id', 'image', 'label', 'name', 'vec']" in str(info.value)
    with pytest.raises(SchemaError) as info:
        make_input_fn(directory, 6, training=True, features=["vec"], label="target")
    assert "'target'" in str(info.value) and "'label'" in str(info.value)


def test_scale(tiny_dataset):
    directory, arrays = tiny_dataset(n=12, num_shards=1)
    features, labels = next(iter(make_dataset(
        directory, 12, training=False, split="train", features=["image", "id"],
        label="label", scale=1 / 255)))
    ids = np.rint(features["id"].numpy() * 255).astype(int)
    assert sorted(ids.tolist()) == list(range(12))
    np.testing.assert_allclose(features["image"].numpy(),
                               arrays["image"][ids].astype(np.float32) / 255, rtol=1e-6)
    assert features["image"].numpy().max() <= 1.0
    # Labels are never scaled.
    assert labels.numpy().tolist() == arrays["label"][ids].tolist()


def test_png_images_decode_exactly(tmp_path):
    rng = np.random.default_rng(3)
    originals = {}
    for label, cls in enumerate(("cat", "dog")):
        (tmp_path / "images" / cls).mkdir(parents=True)
        for k in range(3):
            image = rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)
            (tmp_path / "images" / cls / f"{k}.png").write_bytes(
                tf.io.encode_png(image).numpy())
            originals[image.tobytes()] = label
    source = ImageFolderSource(str(tmp_path / "images"))
    assert source.features["image"].encoding == "png"
    write_records(source, tmp_path / "ds", num_shards=2, progress=False)
    got = {}
    for features, labels in make_dataset(str(tmp_path / "ds"), 4, training=False,
                                         split="train", features=["image"]):
        images = features["image"].numpy()
        assert images.shape[1:] == (5, 7, 3)
        for image, label in zip(images, labels.numpy()):
            got[image.astype(np.uint8).tobytes()] = int(label)
    assert got == originals


# --------------------------------------------------------------------------- corruption

def test_skip_corrupt_yields_readable_records(tiny_dataset):
    directory, _ = tiny_dataset(n=40, num_shards=4)
    shards = [os.path.join(directory, f"train-0000{i}-of-00004.tfrecord") for i in range(4)]
    per_shard = [_file_order(directory)[k * 10:(k + 1) * 10] for k in range(4)]
    flip_byte_in_record(shards[1], 3)
    bad = per_shard[1][3]
    readable = set(per_shard[0] + per_shard[2] + per_shard[3] + per_shard[1][:3])

    for training in (False, True):
        kwargs = {"num_epochs": 1, "seed": 0} if training else {"split": "train"}
        ids = _ids(make_dataset(directory, 4, training=training, skip_corrupt=True,
                                features=["vec"], label="id", **kwargs))
        assert len(ids) == len(set(ids))
        assert readable <= set(ids) and bad not in ids

        with pytest.raises(tf.errors.DataLossError):
            _ids(make_dataset(directory, 4, training=training, features=["vec"],
                              label="id", **kwargs))


def test_skip_corrupt_drops_batches_that_do_not_parse(tmp_path):
    # Whole CRCs around a payload that is not an Example: it reads, then
    # fails in the one parse op of its batch.
    schema = {"id": FeatureSpec("id", "int64", (), "int64")}
    path = str(tmp_path / "mixed.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for i in range(12):
            if i == 5:
                writer.write(b"not an example")
            writer.write(encode_example(schema, {"id": np.int64(i)}))
    files = RecordFiles([path], schema, None)
    ids = [int(i) for b in make_dataset(files, 4, training=False, skip_corrupt=True,
                                        features=["id"], label=None)
           for i in b["id"].numpy()]
    # Batch 1 holds records 4, the bad one, 5 and 6.
    assert ids == [0, 1, 2, 3] + list(range(7, 12))
    with pytest.raises(tf.errors.InvalidArgumentError):
        for _ in make_dataset(files, 4, training=False, features=["id"], label=None):
            pass


# --------------------------------------------------------------------------- cache

def _epochs(ids, size):
    return [ids[k:k + size] for k in range(0, len(ids), size)]


@pytest.mark.parametrize("mode", ["batch", "record"])
def test_cache_serves_each_example_once_per_epoch_in_new_orders(tiny_dataset, mode):
    directory, arrays = tiny_dataset(n=60, num_shards=5)
    dataset = make_dataset(directory, 4, training=True, cache=True, shuffle=mode,
                           features=["image", "vec"], label="id", scale=0.5)
    epochs = _epochs([int(i) for _, labels in dataset.take(6 * 15) for i in labels.numpy()], 60)
    assert len(epochs) == 6
    for order in epochs:
        assert sorted(order) == list(range(60))
    assert len({tuple(order) for order in epochs}) == 6
    # Cast and scale come after the cache, exactly as without it.
    for features, labels in dataset.take(20):
        ids = labels.numpy()
        assert features["image"].dtype == tf.float32
        np.testing.assert_allclose(features["image"].numpy(),
                                   arrays["image"][ids].astype(np.float32) * 0.5)
        np.testing.assert_allclose(features["vec"].numpy(), arrays["vec"][ids] * 0.5,
                                   rtol=1e-6)


def _batch_epochs(dataset, batches_per_epoch, epochs):
    """Each epoch's batches as a list of frozensets of ids."""
    batches = [frozenset(labels.numpy().tolist())
               for _, labels in dataset.take(batches_per_epoch * epochs)]
    return [batches[k:k + batches_per_epoch]
            for k in range(0, len(batches), batches_per_epoch)]


@pytest.mark.parametrize("shuffle,cache_shuffle", [("record", None), ("record", "records"),
                                                   ("batch", "records")])
def test_cached_epochs_draw_new_batches(tiny_dataset, shuffle, cache_shuffle):
    # 62 examples in batches of 4: 15 full batches and a short one.
    directory, _ = tiny_dataset(n=62, num_shards=2)
    chosen = {"cache_shuffle": cache_shuffle} if cache_shuffle else {}
    dataset = make_dataset(directory, 4, training=True, cache=True, shuffle=shuffle,
                           features=["vec"], label="id", seed=3, **chosen)
    epochs = _batch_epochs(dataset, 16, 4)
    for epoch in epochs:
        assert sorted(len(b) for b in epoch) == [2] + [4] * 15
        assert sorted(i for b in epoch for i in b) == list(range(62))
    for later in epochs[1:]:
        # Batches that met again by chance: a few at most, not the epoch.
        assert len(set(epochs[0]) & set(later)) <= 4, (epochs[0], later)


def test_cached_batches_keep_their_records_by_default(tiny_dataset):
    """shuffle="batch" (the default) with a cache: every epoch serves the
    first epoch's batches in a new order, as InputConfig.cache_shuffle says."""
    directory, _ = tiny_dataset(n=62, num_shards=2)
    dataset = make_dataset(directory, 4, training=True, cache=True, features=["vec"],
                           label="id", seed=3)
    epochs = _batch_epochs(dataset, 16, 3)
    assert all(set(epoch) == set(epochs[0]) for epoch in epochs)
    assert epochs[0] != epochs[1]  # the same batches, in a new order
    assert InputConfig().cache_shuffle == "auto" and not InputConfig().reforms_batches()
    assert InputConfig(shuffle="record").reforms_batches()


def test_cached_new_batches_repeat_with_their_seed(tiny_dataset):
    """Seeded runs repeat themselves; another seed (what a resumed run gets,
    engines.base.run_seed) draws other batches."""
    directory, _ = tiny_dataset(n=40, num_shards=2)

    def batches(seed):
        dataset = make_dataset(directory, 4, training=True, cache=True, shuffle="record",
                               features=["vec"], label="id", seed=seed)
        return [labels.numpy().tolist() for _, labels in dataset.take(30)]

    first = batches(5)
    assert batches(5) == first
    assert batches(6) != first


def test_cache_shuffle_values_are_checked():
    for bad in ({"cache_shuffle": "yes"}, {"cache_shuffle": "records", "shuffle": "none"},
                {"autotune_ram_mb": 0}):
        with pytest.raises(UsageError):
            InputConfig(**bad)


def test_cache_epochs_stay_whole_when_the_pipeline_is_unordered(tiny_dataset):
    # Without a seed the maps may reorder batches; none may cross from one
    # epoch into the next. A crossing showed in about 1 pipeline in 20.
    directory, _ = tiny_dataset(n=60, num_shards=5)
    for _ in range(40):
        dataset = make_dataset(directory, 4, training=True, cache=True, shuffle="record",
                               features=["image", "vec"], label="id", seed=None)
        ids = [int(i) for _, labels in dataset.take(6 * 15) for i in labels.numpy()]
        for order in _epochs(ids, 60):
            assert sorted(order) == list(range(60))


def test_cache_keeps_records_dtypes_in_memory(tiny_dataset):
    directory, _ = tiny_dataset(n=20, num_shards=2)
    resolved = records.resolve(directory, "train")
    config = InputConfig(features=["image"], label="id", cache=True)
    parse = inputs.parse_examples_fn(resolved.schema, {"image": "image"}, "id", cast=False)
    cached = inputs._cached_batches(  # pylint: disable=protected-access
        config, tf.data.TFRecordDataset(resolved.files), parse, 4, 0, True, True)
    assert "Cache" in type(cached).__name__
    features, labels = cached.element_spec
    served, _ = make_dataset(directory, 4, training=True, config=config).element_spec
    assert served["image"].dtype == tf.float32
    assert features["image"].dtype == tf.uint8 and labels.dtype == tf.int64


def test_cached_epochs_read_memory_not_files(tiny_dataset):
    """After one epoch a cached pipeline no longer needs its files: the
    proof that later epochs come from memory."""
    directory, _ = tiny_dataset(n=40, num_shards=4)
    cached = iter(make_dataset(directory, 4, training=True, cache=True, seed=0,
                               features=["vec"], label="id"))
    plain = iter(make_dataset(directory, 4, training=True, seed=0, features=["vec"],
                              label="id", shuffle="none", cycle_length=1, block_length=1))
    first = [int(i) for _ in range(10) for i in next(cached)[1].numpy()]
    assert sorted(first) == list(range(40))
    next(plain)
    for name in os.listdir(directory):
        if ".tfrecord" in name:
            os.remove(os.path.join(directory, name))
    later = [int(i) for _ in range(20) for i in next(cached)[1].numpy()]
    assert sorted(later) == sorted(2 * list(range(40)))
    with pytest.raises(tf.errors.NotFoundError):
        for _ in range(40):
            next(plain)


def test_cache_with_pipelines_caches_each_share(tiny_dataset):
    directory, _ = tiny_dataset(n=48, num_shards=4)
    seen = []
    for index in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=index,
                                             num_replicas_in_sync=2)
        dataset = make_dataset(directory, 4, training=True, cache=True, input_context=context,
                               features=["vec"], label="id")
        ids = [int(i) for _, labels in dataset.take(12) for i in labels.numpy()]
        assert collections.Counter(ids) == collections.Counter(2 * ids[:24])
        seen.append(set(ids))
    assert not seen[0] & seen[1] and seen[0] | seen[1] == set(range(48))


CACHE_LOG = "estimator_keras.inputs"


def test_cache_auto_decides_from_the_manifest_and_says_why(tiny_dataset, caplog):
    directory, _ = tiny_dataset(n=40, num_shards=4, name="auto")
    # id (int64) + vec (3 float32): 20 bytes an example, 800 bytes in all.
    with caplog.at_level(logging.INFO, logger=CACHE_LOG):
        make_dataset(directory, 4, training=True, cache="auto", features=["vec"], label="id")
    lines = [r.getMessage() for r in caplog.records if r.name == CACHE_LOG]
    assert len(lines) == 1
    assert lines[0].startswith("cache=auto: caching split 'train' of ")
    assert "40 examples x 20 bytes" in lines[0] and "fits the budget" in lines[0]
    assert "available" in lines[0]

    caplog.clear()
    with caplog.at_level(logging.INFO, logger=CACHE_LOG):
        dataset = make_dataset(directory, 4, training=True, cache="auto", cache_budget_mb=1e-4,
                               features=["vec"], label="id")
    lines = [r.getMessage() for r in caplog.records if r.name == CACHE_LOG]
    assert len(lines) == 1 and lines[0].startswith("cache=auto: not caching split 'train'")
    assert "exceeds the budget of 0.0001 MB (cache_budget_mb)" in lines[0]
    # Not cached: the pipeline still reads its files after the first epoch.
    iterator = iter(dataset)
    next(iterator)
    for name in os.listdir(directory):
        if ".tfrecord" in name:
            os.remove(os.path.join(directory, name))
    with pytest.raises(tf.errors.NotFoundError):
        for _ in range(40):
            next(iterator)


def test_cache_auto_budget_counts_one_pipeline_share(tiny_dataset):
    directory, _ = tiny_dataset(n=40, num_shards=4, name="share")
    from estimator_keras.records import resolve  # pylint: disable=import-outside-toplevel
    resolved = resolve(directory, "train")
    config = InputConfig(cache="auto", cache_budget_mb=600 / 2 ** 20)
    names = {"vec", "id"}
    assert cache_decision(config, resolved, names)[0] is False
    fits, reason = cache_decision(config, resolved, names, num_shards=2)
    assert fits and "share 1/2" in reason and "20 examples x 20 bytes" in reason
    assert cache_decision(InputConfig(cache=True), resolved, names) == (True, "cache=True")
    # Without example counts the size is unknown, and auto does not cache.
    files = RecordFiles(resolved.files, resolved.schema, None)
    fits, reason = cache_decision(InputConfig(cache="auto"), files, names)
    assert not fits and "size is unknown" in reason


def test_cache_option_values_are_checked():
    assert InputConfig(cache=1).cache is True
    assert InputConfig(cache="auto").cache == "auto"
    for bad in ({"cache": "yes"}, {"cache_budget_mb": 0}, {"cache_budget_mb": -5}):
        with pytest.raises(UsageError):
            InputConfig(**bad)


def test_cache_hparams_parse():
    from experiments.catalog import loading as catalog  # pylint: disable=import-outside-toplevel
    from experiments.catalog import registry  # pylint: disable=import-outside-toplevel
    from experiments.config import hparams  # pylint: disable=import-outside-toplevel
    catalog.load()
    config = registry.get("fashion_mnist_mlp").config
    assert config.data.cache == "auto" and config.data.cache_budget_mb is None
    for text, cache, budget in (("cache=auto", "auto", None), ("cache=true", True, None),
                                ("cache=false,cache_budget_mb=64", False, 64),
                                ("cache_budget_mb=0.5", "auto", 0.5)):
        data = hparams.with_overrides(config, hparams.parse_hparams(text)).data
        assert (data.cache, data.cache_budget_mb) == (cache, budget), text
    for text in ("cache=sometimes", "cache_budget_mb=0", "cache_budget_mb=lots"):
        with pytest.raises(ConfigError):
            hparams.with_overrides(config, hparams.parse_hparams(text))


# What both memory children start with: their imports and the process's RSS.
RSS_CHILD_PRELUDE = textwrap.dedent("""
    import gc, json, sys, time
    from estimator_keras.inputs import make_dataset

    def rss_mb():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
""")

MEMORY_CHILD = RSS_CHILD_PRELUDE + textwrap.dedent("""
    dataset = make_dataset(sys.argv[1], 64, training=True, cache=True, features=["image"],
                           label="label")
    per_epoch = 10000 // 64 + 1
    iterator, rss = iter(dataset), []
    for epoch in range(10):
        for _ in range(per_epoch):
            next(iterator)
        gc.collect()
        rss.append(rss_mb())
    print(json.dumps(rss))
""")


def _run_on_10k_images(child, tmp_path):
    """Runs a memory child on 10k random 28x28 uint8 images in 4 shards;
    returns the JSON it prints last."""
    rng = np.random.default_rng(0)
    arrays = {"image": rng.integers(0, 256, (10000, 28, 28, 1), dtype=np.uint8),
              "label": rng.integers(0, 10, 10000).astype(np.int64)}
    write_records(arrays, tmp_path / "ds", num_shards=4, progress=False)
    proc = subprocess.run([sys.executable, "-c", child, str(tmp_path / "ds")],
                          env=child_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmRSS (Linux)")
def test_cache_memory_stays_flat_after_the_first_epoch(tmp_path):
    """10k 28x28 uint8 images: 7.5 MB an epoch, so a cache that kept growing
    would add 60 MB (> 10% of a TensorFlow process) from epoch 2 to 10."""
    rss = _run_on_10k_images(MEMORY_CHILD, tmp_path)
    growth = (rss[9] - rss[1]) / rss[1]
    assert growth < 0.05, rss


# --------------------------------------------------------------------------- autotuned memory

def test_pipelines_bound_autotuned_memory(tiny_dataset):
    directory, _ = tiny_dataset(n=40, num_shards=2)
    floor = 16 * 2 ** 20
    for kwargs in ({"training": True}, {"training": True, "cache": True},
                   {"training": True, "shuffle": "record", "cache": True},
                   {"training": False, "split": "train"}):
        dataset = make_dataset(directory, 4, features=["vec"], label="id", **kwargs)
        assert dataset.options().autotune.ram_budget == floor, kwargs
    # 16 batches as served: image 4x3x1 and vec 3 as float32, the int64 id.
    big = make_dataset(directory, 20000, training=True, features=["image", "vec"], label="id")
    assert big.options().autotune.ram_budget == 16 * 20000 * (12 * 4 + 3 * 4 + 8)
    chosen = make_dataset(directory, 4, training=True, features=["vec"], label="id",
                          autotune_ram_mb=3)
    assert chosen.options().autotune.ram_budget == 3 * 2 ** 20
    fn = make_input_fn(directory, 4, training=True, features=["vec"], label="id")
    assert fn().options().autotune.ram_budget == floor


BURST_CHILD = RSS_CHILD_PRELUDE + textwrap.dedent("""
    iterator = iter(make_dataset(sys.argv[1], 512, training=True, features=["image"],
                                 label="label"))
    next(iterator)
    base, growth = rss_mb(), []
    for burst in range(9):
        # A pause fills the prefetch buffer, a burst of steps empties it: the
        # pattern under which TensorFlow doubles the buffer, unbounded.
        time.sleep(0.5)
        for _ in range(2 ** (burst + 1)):
            next(iterator)
        gc.collect()
        growth.append(rss_mb() - base)
    print(json.dumps(growth))
""")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmRSS (Linux)")
def test_prefetch_buffer_stays_within_the_budget(tmp_path):
    """An uncached pipeline whose consumer pauses and then catches up: the
    budget (16 batches of 512 float32 28x28 images, 26 MB) bounds what the
    prefetch buffer keeps; without it the buffer grew by 270 MB here."""
    growth = _run_on_10k_images(BURST_CHILD, tmp_path)
    assert max(growth) < 64, growth
