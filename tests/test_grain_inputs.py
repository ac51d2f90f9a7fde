"""The Grain input pipeline: the tf.data pipeline's batches without
TensorFlow, each training epoch a global shuffle that is a function of
(seed, epoch), a resumed stream that continues the uninterrupted one, and
pipelines of a cluster that split the records between them.

Where TensorFlow is installed the batches are compared with tf.data's;
the rest runs without it too."""

import numpy as np
import pytest

from estimator_keras import input_order, order_state, pipeline_choice, records
from estimator_keras.engines import registry
from estimator_keras.errors import ConfigError, SchemaError
from estimator_keras.schema import FeatureSpec
from support import child_env, cli, generated_examples

pytest.importorskip("grain")
from estimator_keras import grain_inputs  # noqa: E402  pylint: disable=wrong-import-position

IDS = 203  # records of the ids dataset: 7 shards of 29
BATCH = 16  # 13 batches an epoch, the last one of 11


def _ids_dataset(directory, shards=7):
    ids = np.arange(IDS, dtype=np.int64)
    records.write_records({"id": ids, "label": ids % 10}, str(directory), split="train",
                          num_shards=shards, seed=3)
    records.write_records({"id": ids[:40], "label": ids[:40] % 10}, str(directory),
                          split="test", num_shards=2, seed=3)
    return str(directory)


@pytest.fixture(scope="module")
def ids_data(tmp_path_factory):
    return _ids_dataset(tmp_path_factory.mktemp("ids"))


def _stream(directory, count, workers=0, **kwargs):
    """The ids of the first ``count`` training batches."""
    settings = {"features": {"id": "id"}, "label": "label", "seed": 7}
    settings.update(kwargs.pop("settings", {}))
    dataset = grain_inputs.make_dataset(directory, BATCH, training=True, workers=workers,
                                        **settings, **kwargs)
    iterator = iter(dataset)
    return [next(iterator)[0]["id"].astype(np.int64).ravel() for _ in range(count)]


def test_each_epoch_serves_every_record_once_in_a_new_order(ids_data):
    per_epoch = input_order.batches_per_epoch(IDS, BATCH)
    batches = _stream(ids_data, 3 * per_epoch)
    assert [len(b) for b in batches[:per_epoch]] == [BATCH] * (per_epoch - 1) + [IDS % BATCH]
    epochs = [np.concatenate(batches[e * per_epoch:(e + 1) * per_epoch]) for e in range(3)]
    for ids in epochs:
        np.testing.assert_array_equal(np.sort(ids), np.arange(IDS))
    assert not np.array_equal(epochs[0], epochs[1])
    # One global shuffle: the first batch draws from every shard, not from a few.
    assert len(set(epochs[0][:BATCH] // 29)) >= 4, epochs[0][:BATCH]


def test_the_order_depends_on_the_seed_and_the_epoch_only(ids_data):
    first = _stream(ids_data, 20)
    np.testing.assert_array_equal(np.concatenate(first), np.concatenate(_stream(ids_data, 20)))
    other = _stream(ids_data, 20, settings={"seed": 8})
    assert not np.array_equal(np.concatenate(first), np.concatenate(other))
    # The permutation itself is Philox's raw stream: fixed on every numpy.
    np.testing.assert_array_equal(grain_inputs.epoch_permutation(5, 7, 0),
                                  grain_inputs.epoch_permutation(5, 7, 0))
    assert sorted(grain_inputs.epoch_permutation(50, 7, 3)) == list(range(50))


@pytest.mark.parametrize("start", [1, 12, 13, 14, 30])
def test_a_stream_started_at_a_batch_continues_the_uninterrupted_one(ids_data, start):
    whole = _stream(ids_data, start + 6)
    resumed = _stream(ids_data, 6, start_batch=start)
    for got, expected in zip(resumed, whole[start:]):
        np.testing.assert_array_equal(got, expected, err_msg=f"from batch {start}")


def test_the_input_fn_resumes_after_the_batches_of_its_step(ids_data):
    """What the engines call: ``input_fn(input_context=None, start_step=S)``,
    one batch a step per pipeline."""
    settings = {"features": {"id": "id"}, "label": "label", "seed": 7}
    input_fn = grain_inputs.make_input_fn(ids_data, BATCH, training=True, start_step=3,
                                          **settings)
    iterator = iter(input_fn(input_context=None, start_step=9))
    resumed = [next(iterator)[0]["id"].astype(np.int64).ravel() for _ in range(4)]
    for got, expected in zip(resumed, _stream(ids_data, 13)[9:]):
        np.testing.assert_array_equal(got, expected)
    assert input_fn.files.num_examples == IDS


def test_worker_processes_serve_the_same_stream(ids_data):
    in_process = _stream(ids_data, 15)
    for got, expected in zip(_stream(ids_data, 15, workers=2), in_process):
        np.testing.assert_array_equal(got, expected)


def test_shuffle_none_serves_the_files_in_order(ids_data):
    ids = np.concatenate(_stream(ids_data, 13, settings={"shuffle": "none"}))
    files = records.resolve(ids_data, "train").files
    np.testing.assert_array_equal(ids, np.concatenate([_file_ids(f) for f in files]))


def _file_ids(path):
    from estimator_keras import example_codec, tfrecord_frames  # pylint: disable=import-outside-toplevel
    return np.array([example_codec.decode_features(r)["id"][0]
                     for r in tfrecord_frames.read_records(path)])


@pytest.mark.parametrize("shards,pipelines", [(7, 2), (1, 2)])
def test_pipelines_of_a_cluster_split_the_records(tmp_path, shards, pipelines):
    directory = _ids_dataset(tmp_path, shards)
    resolved = records.resolve(directory, "train")
    seen = []
    for index in range(pipelines):
        expected = order_state.pipelines(resolved, pipelines, BATCH)[index]
        batches = _stream(directory, expected.batches_per_epoch, shard=(pipelines, index))
        seen.append(np.concatenate(batches))
        assert len(seen[-1]) == expected.examples
    union = np.concatenate(seen)
    np.testing.assert_array_equal(np.sort(union), np.arange(IDS))


def test_evaluation_reads_every_record_once_in_file_order(ids_data):
    batches = list(grain_inputs.make_dataset(ids_data, 16, training=False,
                                             features={"id": "id"}))
    ids = np.concatenate([b[0]["id"].astype(np.int64).ravel() for b in batches])
    files = records.resolve(ids_data, "test").files
    np.testing.assert_array_equal(ids, np.concatenate([_file_ids(f) for f in files]))
    assert [len(b[1]) for b in batches] == [16, 16, 8]


def test_a_record_that_does_not_fit_the_schema_is_named(tmp_path):
    directory = _ids_dataset(tmp_path)
    resolved = records.resolve(directory, "train")
    wrong = dict(resolved.schema, id=FeatureSpec("id", "int64", (2,), "int64"))
    decoder = grain_inputs.BatchDecoder(wrong, {"id": "id"}, "label")
    from estimator_keras import tfrecord_frames  # pylint: disable=import-outside-toplevel
    batch = list(tfrecord_frames.read_records(resolved.files[0]))[:4]
    with pytest.raises(SchemaError, match="'id'"):
        decoder(batch)


# ----------------------------------------------------------------- the same batches as tf.data

def _same_batches(directory, features, scale=None, batch=16, within=0):
    """Grain's and tf.data's evaluation batches of ``directory``: equal
    values (or ``within`` that much of each other, and on average within
    2) and dtypes, feature by feature."""
    from estimator_keras import inputs as tf_inputs  # pylint: disable=import-outside-toplevel
    ours = list(grain_inputs.make_dataset(directory, batch, training=False, features=features,
                                          scale=scale, split="train"))
    theirs = list(tf_inputs.make_dataset(directory, batch, training=False, features=features,
                                         scale=scale, split="train"))
    assert len(ours) == len(theirs) > 1
    for (x, y), (tx, ty) in zip(ours, theirs):
        assert y.dtype == ty.numpy().dtype
        np.testing.assert_array_equal(y, ty.numpy())
        assert sorted(x) == sorted(tx)
        for name in x:
            assert x[name].dtype == tx[name].numpy().dtype, name
            if within:
                difference = np.abs(x[name] - tx[name].numpy())
                assert difference.max() <= within and difference.mean() < 2, (
                    name, difference.max(), difference.mean())
            else:
                np.testing.assert_array_equal(x[name], tx[name].numpy(), err_msg=name)


@pytest.mark.parametrize("scale", [None, 1 / 255])
def test_the_batches_are_tf_data_s_for_every_numeric_encoding(tmp_path, scale):
    """raw uint8 and float32 arrays, int64 and float vectors: the same
    values, each numeric input float32 (times ``scale``), labels int64."""
    pytest.importorskip("tensorflow")  # tf.data's batches to compare with
    from estimator_keras.sources.base import ArraySource  # pylint: disable=import-outside-toplevel
    _, examples = generated_examples(40, seed=5)
    names = ["image", "weights", "b_ids", "a_depth", "label"]
    arrays = {name: np.stack([np.asarray(e[name]) for e in examples]) for name in names}
    arrays["weights"] = arrays["weights"][:, 0]  # a scalar float: the float encoding
    source = ArraySource(arrays, encodings={"b_ids": "int64"})
    assert {s.encoding for s in source.features.values()} == {"raw", "float", "int64"}
    records.write_records(source, str(tmp_path), num_shards=3, progress=False)
    _same_batches(str(tmp_path), names[:-1], scale)


@pytest.mark.parametrize("encoding,mode", [("png", "RGB"), ("png", "L"), ("jpeg", "RGB")])
def test_the_batches_are_tf_data_s_for_images(tmp_path, encoding, mode):
    """An image folder as users have them: RGB and grayscale PNG files
    (lossless: the same pixels), and JPEG files, which Pillow's and
    TensorFlow's builds of libjpeg upsample differently: a few levels apart."""
    pytest.importorskip("tensorflow")  # tf.data's batches (and grey files made RGB)
    pil = pytest.importorskip("PIL.Image")
    from estimator_keras.sources.folders import ImageFolderSource  # pylint: disable=import-outside-toplevel
    rng = np.random.default_rng(3)
    shape = (12, 10, 3) if mode == "RGB" else (12, 10)
    folder = tmp_path / "images"
    for cls in ("cat", "dog"):
        (folder / cls).mkdir(parents=True)
        for k in range(9):
            pil.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(
                folder / cls / f"{k}.{'png' if encoding == 'png' else 'jpg'}")
    source = ImageFolderSource(str(folder))
    assert source.features["image"].encoding == encoding
    records.write_records(source, str(tmp_path / "ds"), num_shards=2, progress=False)
    _same_batches(str(tmp_path / "ds"), ["image"], batch=4,
                  within=8 if encoding == "jpeg" else 0)


# ----------------------------------------------------------------- which pipeline a run takes

def _backend(engine, name):
    return registry.get(engine).backend(name)


def test_the_choice_follows_the_registry_and_what_is_installed(monkeypatch):
    jax, tensorflow = _backend("keras3", "jax"), _backend("keras3", "tensorflow")
    monkeypatch.setattr(pipeline_choice, "tensorflow_installed", lambda: True)
    assert pipeline_choice.choose("auto", jax)[0] == "tfdata"
    assert pipeline_choice.choose("grain", jax)[0] == "grain"
    with pytest.raises(ConfigError, match="does not feed the keras3 engine on tensorflow"):
        pipeline_choice.choose("grain", tensorflow, "the keras3 engine")
    with pytest.raises(ConfigError, match="does not feed"):
        pipeline_choice.choose("grain", None, "the estimator engine")
    monkeypatch.setattr(pipeline_choice, "tensorflow_installed", lambda: False)
    assert pipeline_choice.choose("auto", jax) == (
        "grain", "data.pipeline=auto: TensorFlow is not installed")
    with pytest.raises(ConfigError, match="needs TensorFlow"):
        pipeline_choice.choose("tfdata", jax)
    with pytest.raises(ConfigError, match="must be one of tfdata, grain, auto"):
        pipeline_choice.choose("torch", jax)


def test_train_refuses_grain_where_it_does_not_feed_the_backend(ids_data, tmp_path):
    """`--hparams pipeline=grain` on the keras3 engine's TensorFlow backend:
    one paragraph naming the setting and what it feeds, exit 2, nothing
    written; an unknown pipeline is refused as the hparam it is."""
    pytest.importorskip("tensorflow")
    env = child_env(KERAS_BACKEND="tensorflow", TF_USE_LEGACY_KERAS="0")
    rc, _, err = cli("train", "fashion_mnist_mlp", "--engine", "keras3", "--dataset", ids_data,
                     "--model-dir", tmp_path / "run", "--hparams", "pipeline=grain",
                     timeout=240, env=env)
    assert rc == 2, err[-2000:]
    assert "data.pipeline=grain: the grain pipeline does not feed the keras3 engine on " \
           "tensorflow" in err, err[-2000:]
    assert not (tmp_path / "run" / "input_order.json").exists()
    rc, _, err = cli("train", "fashion_mnist_mlp", "--engine", "keras3", "--dataset", ids_data,
                     "--model-dir", tmp_path / "run", "--hparams", "pipeline=torch",
                     timeout=240, env=env)
    assert rc == 2 and "pipeline must be one of tfdata, grain, auto; given 'torch'" in err, \
        err[-2000:]
    # Grain does not skip damaged records: refused before anything is written.
    env = child_env(KERAS_BACKEND="jax", TF_USE_LEGACY_KERAS="0")
    rc, _, err = cli("train", "fashion_mnist_mlp", "--engine", "keras3", "--dataset", ids_data,
                     "--model-dir", tmp_path / "run", "--hparams", "pipeline=grain",
                     "--skip-corrupt", timeout=240, env=env)
    assert rc == 2 and "--skip-corrupt drops the records tf.data cannot read" in err, \
        err[-2000:]
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_a_model_dir_s_order_names_its_pipeline(tmp_path):
    """A rerun on the other pipeline would read another order: refused,
    naming data.pipeline."""
    directory = _ids_dataset(tmp_path / "data")
    resolved = records.resolve(directory, "train")

    def settings(pipeline):
        return order_state.Settings(
            seed=7, batch_size=BATCH, global_batch_size=BATCH, batches_per_step=1,
            asynchronous=False, pipelines=order_state.pipelines(resolved, 1, BATCH),
            cache=False, shuffle="batch", shuffle_buffer=64, cache_shuffle="batches",
            cycle_length=4, block_length=16, dataset=order_state.fingerprint(resolved),
            pipeline=pipeline)

    model_dir = str(tmp_path / "model")
    order_state.decide(model_dir, 0, settings("grain")).store(model_dir)
    decision = order_state.decide(model_dir, 20, settings("grain"))
    assert "continues at epoch 1, batch 7 of 13" in decision.message
    with pytest.raises(order_state.OrderChangedError, match=r"data\.pipeline.*'grain'.*'tfdata'"):
        order_state.decide(model_dir, 20, settings("tfdata"))


def test_grain_s_own_settings_decide_a_rerun(tmp_path):
    """Under Grain, tf.data's shuffle mode names no order ("batch" and
    "record" are one global shuffle; "none" is not), and a cache decision
    stored by Grain (which never caches) is not tf.data's to keep."""
    directory = _ids_dataset(tmp_path / "data")
    resolved = records.resolve(directory, "train")

    def settings(pipeline, shuffle="batch", cache=False):
        return order_state.Settings(
            seed=7, batch_size=BATCH, global_batch_size=BATCH, batches_per_step=1,
            asynchronous=False, pipelines=order_state.pipelines(resolved, 1, BATCH),
            cache=cache, shuffle=shuffle, shuffle_buffer=64, cache_shuffle="batches",
            cycle_length=4, block_length=16, dataset=order_state.fingerprint(resolved),
            pipeline=pipeline)

    model_dir = str(tmp_path / "model")
    order_state.decide(model_dir, 0, settings("grain")).store(model_dir)
    assert "continues" in order_state.decide(model_dir, 20, settings("grain", "record")).message
    with pytest.raises(order_state.OrderChangedError, match="data.shuffle"):
        order_state.decide(model_dir, 20, settings("grain", "none"))
    assert order_state.stored_cache(model_dir, 20, "grain") is False
    assert order_state.stored_cache(model_dir, 20, "tfdata") is None


def test_a_damaged_record_read_by_index_is_named_without_vouching_for_the_rest(tmp_path):
    from estimator_keras.errors import CorruptRecordError  # pylint: disable=import-outside-toplevel
    from support import flip_byte_in_record  # pylint: disable=import-outside-toplevel
    directory = _ids_dataset(tmp_path, shards=1)
    path = records.resolve(directory, "train").files[0]
    flip_byte_in_record(path, 100)
    batches = iter(grain_inputs.make_dataset(directory, IDS, training=False, split="train",
                                             features={"id": "id"}))
    with pytest.raises(CorruptRecordError, match=r"record 100 .*may be damaged too") as e:
        next(batches)
    assert e.value.path == path and e.value.record == 100


def test_settings_stored_before_the_pipeline_field_read_as_tf_data_s():
    stored = {"seed": 1, "batch_size": 2, "global_batch_size": 2, "batches_per_step": 1,
              "asynchronous": False, "pipelines": [], "cache": False, "shuffle": "batch",
              "shuffle_buffer": 64, "cache_shuffle": "batches", "cycle_length": 4,
              "block_length": 16, "dataset": "x"}
    assert order_state.Settings.from_dict(stored).pipeline == "tfdata"
    del stored["seed"]
    with pytest.raises(ValueError, match="missing seed"):
        order_state.Settings.from_dict(stored)

