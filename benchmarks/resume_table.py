"""Table "resume": what exact resume costs (issue 41).

Three measurements, in one process:

1. **Steady state.** The training pipeline as the experiments build it
   (``make_dataset`` with ``fashion_mnist_mlp``'s settings: batch 128,
   ``shuffle="batch"``, buffer 64, interleave 4 x 16, seed 42; cached, as
   ``cache="auto"`` decides for the 60k training records, and uncached, the
   library's default) against the same pipeline in the order it had before
   issue 41 (files reshuffled at each pass of a ``repeat``, batches shuffled
   across epochs: no position to resume from), rebuilt here from the same
   parts. Examples/s of the pipelines alone, and steps/s of a Keras
   ``fit`` of the experiment's MLP fed by each (the second of two Keras
   epochs of a fit, so that the dataset's start is not timed); the
   variants alternate.
   Target: the exact order >= 0.98 of the old one.
2. **The skip on resume.** A generated dataset of about 1 GB (64x64x3
   images, in 8 shards): seconds from ``make_dataset(start_batch=N)`` to
   its first batch, for N = 0 and for N = the epoch's batches - 1 (the
   longest skip there is), against the same skip done after parsing
   (``make_dataset(...).skip(N)``). Target: the longest skip < 5 s. The
   files were just written, so they are in the page cache, as a resumed
   run's usually are not: the row says so.
3. **tf.data's own iterator checkpoints**, the peer: ``tf.train.Checkpoint``
   of an iterator of the uncached pipeline after 200 batches, at its
   default and with ``experimental_symbolic_checkpoint`` (positions instead
   of buffers, where every dataset of the pipeline supports it): the
   checkpoint's size and the seconds to write and to restore it.
"""

import os
import shutil
import time

import numpy as np

from benchmarks import common, output

TABLE = "resume"
TITLE = "exact resume: the epoch-ordered pipeline vs the old order, and the skip on resume"
BATCH, BUFFER, SEED = 128, 64, 42
THRESHOLD = 0.98
SKIP_TARGET_S = 5.0
PIPELINE_WINDOW_S = 3.0
BIG_SHAPE = (64, 64, 3)
BIG_BYTES = 1 << 30
BIG_SHARDS = 8


def _settings(cache):
    return dict(features=["image"], label="label", shuffle="batch", shuffle_buffer=BUFFER,
                cache=cache, seed=SEED)


def _old_order(path, cache):
    """The pre-issue-41 structure: one repeat over reshuffled files, batches
    shuffled across epochs (cached: one shuffle over the cached epoch,
    reshuffled at each pass of the repeat)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from estimator_keras import inputs, records  # pylint: disable=import-outside-toplevel
    from estimator_keras.schema import feature_map  # pylint: disable=import-outside-toplevel

    resolved = records.resolve(path, "train")
    config = inputs.InputConfig(**_settings(cache))
    mapping = feature_map(resolved.schema, config.features, config.label)
    files = tf.data.Dataset.from_tensor_slices(resolved.files).shuffle(
        len(resolved.files), seed=SEED, reshuffle_each_iteration=True)
    parse = inputs.parse_examples_fn(resolved.schema, mapping, config.label, cast=not cache)
    if not cache:
        files = files.repeat()
    read = files.interleave(lambda f: tf.data.TFRecordDataset(f, buffer_size=1 << 20),
                            cycle_length=config.cycle_length, block_length=config.block_length)
    batches = read.batch(BATCH)
    if not cache:
        batches = batches.shuffle(BUFFER, seed=SEED, reshuffle_each_iteration=True)
    dataset = batches.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if cache:
        epoch = -(-resolved.num_examples // BATCH) + len(resolved.files)
        dataset = dataset.cache().shuffle(epoch, seed=SEED, reshuffle_each_iteration=True)
        dataset = dataset.map(inputs.cast_inputs_fn(), num_parallel_calls=tf.data.AUTOTUNE,
                              deterministic=True).repeat()
    return dataset.prefetch(tf.data.AUTOTUNE).with_options(
        inputs.autotune_options(config, resolved, mapping, BATCH))


def _new_order(path, cache, start_batch=0):
    from estimator_keras.inputs import make_dataset  # pylint: disable=import-outside-toplevel

    return make_dataset(path, BATCH, training=True, start_batch=start_batch, **_settings(cache))


class _Pipeline(common.Variant):
    """Examples/s of a pipeline alone, after one epoch (the cache filled)."""

    def __init__(self, name, build, epoch_batches, window_batches):
        self.name, self.group = name, "pipeline"
        self.description = "examples/s of the pipeline alone"
        self._build, self._epoch, self._window = build, epoch_batches, window_batches
        self._iterator = None

    def build(self):
        self._iterator = iter(self._build())

    def warmup(self):
        # A window of about PIPELINE_WINDOW_S: a cached pipeline serves
        # thousands of batches a second.
        self._window = common.warm_window(self._iterator, self._epoch, PIPELINE_WINDOW_S,
                                          self._window)

    def measure(self):
        start = time.perf_counter()
        for _ in range(self._window):
            next(self._iterator)
        return self._window * BATCH, time.perf_counter() - start

    def extra(self):
        return {"window_batches": self._window}

    def close(self):
        self._iterator = None


class _Training(common.Variant):
    """Steps/s of Keras fit of the MLP fed by a pipeline."""

    def __init__(self, name, build, epoch_batches, window_steps):
        self.name, self.group = name, "training"
        self.description = "steps/s of Model.fit (fashion_mnist_mlp's model, Adam 1e-3)"
        self._build, self._epoch, self._window = build, epoch_batches, window_steps
        self._model = self._data = None

    def build(self):
        from experiments.catalog import models  # pylint: disable=import-outside-toplevel

        self._model = models.seed_mlp({"units": 128, "num_classes": 10})
        self._model.compile("adam", "sparse_categorical_crossentropy")
        self._data = self._build().map(lambda features, labels: (features["image"], labels))

    def warmup(self):
        self._model.fit(self._data, steps_per_epoch=self._epoch + 5, epochs=1, verbose=0)

    def measure(self):
        # Each fit starts the dataset over; its second Keras epoch runs on
        # the iterator the first left, as a run's long fit does.
        timer = _epoch_timer()
        self._model.fit(self._data, steps_per_epoch=self._window, epochs=2, verbose=0,
                        callbacks=[timer])
        return self._window, timer.seconds[-1]


def _epoch_timer():
    """A Keras callback keeping each epoch's seconds (TensorFlow loads late)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    class EpochTimer(tf.keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds, self._start = [], None

        def on_epoch_begin(self, epoch, logs=None):
            self._start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(time.perf_counter() - self._start)

    return EpochTimer()


def _steady(settings, path, epoch_batches):
    window = 100 if settings.quick else 1000
    repeats = 2 if settings.quick else max(3, settings.repeats)
    rows, targets = [], []
    for cache in (True, False):
        label = "cached" if cache else "uncached"
        for kind, make, unit in (("pipeline", _Pipeline, "examples/s"),
                                 ("training", _Training, "steps/s")):
            old = make(f"{kind}, {label}, old order", lambda c=cache: _old_order(path, c),
                       epoch_batches, window)
            new = make(f"{kind}, {label}, exact order", lambda c=cache: _new_order(path, c),
                       epoch_batches, window)
            measured = common.run_alternating([old, new], repeats, f"{TABLE} {kind} {label}")
            found = common.rows_from([old, new], measured, reference=old.name, unit=unit)
            rows += found
            value = found[1].get("ratio")
            targets.append(common.target(
                f"resume.{kind}.{label}", f"{kind} ({label}): exact order / old order, "
                f"{unit}", value, THRESHOLD,
                why=found[1].get("error") or found[0].get("error")))
    return rows, targets


class _Source:
    """``n`` images of BIG_SHAPE computed from their index (the example-source
    protocol of estimator_keras.sources: features, len, read)."""

    def __init__(self, n):
        from estimator_keras.schema import FeatureSpec  # pylint: disable=import-outside-toplevel

        self.n = n
        self.features = {"image": FeatureSpec("image", "uint8", BIG_SHAPE, "raw"),
                         "label": FeatureSpec("label", "int64", (), "int64")}

    def __len__(self):
        return self.n

    def read(self, indices):
        indices = np.asarray(indices)
        images = np.empty((len(indices), *BIG_SHAPE), np.uint8)
        for k, i in enumerate(indices):
            images[k] = np.random.default_rng(int(i)).integers(0, 256, BIG_SHAPE, np.uint8)
        return {"image": images, "label": indices.astype(np.int64) % 10}


def _big_dataset(settings):
    from estimator_keras.records import write_dataset  # pylint: disable=import-outside-toplevel

    path = os.path.join(settings.workdir, TABLE, "one-gb")
    if os.path.exists(os.path.join(path, "dataset.json")):
        return path
    shutil.rmtree(path, ignore_errors=True)
    record = int(np.prod(BIG_SHAPE)) + 64
    n = (64 * BATCH) if settings.quick else BIG_BYTES // record
    common.say(f"[{TABLE}] writing {n:,} records of {BIG_SHAPE} (~{n * record / 2**30:.2f} GB)")
    write_dataset({"train": _Source(n)}, path, num_shards=BIG_SHARDS, progress=False)
    return path


def _first_batch_s(build):
    start = time.perf_counter()
    next(iter(build()))
    return time.perf_counter() - start


def _skip_rows(settings):
    from estimator_keras import manifest  # pylint: disable=import-outside-toplevel

    path = _big_dataset(settings)
    found = manifest.load_manifest(path)
    examples = found.splits["train"].num_examples
    size = sum(s.num_bytes for s in found.splits["train"].shards)
    last = -(-examples // BATCH) - 1
    settings_big = dict(_settings(False), features=["image"])

    def exact(start):
        from estimator_keras.inputs import make_dataset  # pylint: disable=import-outside-toplevel
        return lambda: make_dataset(path, BATCH, training=True, start_batch=start,
                                    **settings_big)

    def parsed_skip():
        from estimator_keras.inputs import make_dataset  # pylint: disable=import-outside-toplevel
        return make_dataset(path, BATCH, training=True, **settings_big).skip(last)

    cases = [("first batch, start_batch=0", exact(0)),
             (f"first batch, start_batch={last} (skip unparsed)", exact(last)),
             (f"first batch, skip({last}) after parsing", parsed_skip)]
    times = {name: [] for name, _ in cases}
    for _ in range(1 if settings.quick else 3):
        for name, build in cases:
            times[name].append(_first_batch_s(build))
    rows = [{"name": name, "group": "skip", "unit": "s", "median": common.median(values),
             "min": min(values), "max": max(values), "samples": [round(v, 3) for v in values],
             "description": f"{examples:,} records, {size / 2**30:.2f} GB in {BIG_SHARDS} "
                            f"shards, batch {BATCH}; files in the page cache"}
            for name, values in times.items()]
    target = common.target("resume.skip_s", f"seconds to the first batch of a run resumed "
                           f"{last} batches into an epoch of {size / 2**30:.2f} GB",
                           rows[1]["median"], SKIP_TARGET_S, op="<")
    return rows, target, path


def _iterator_checkpoint_rows(settings, path):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    rows = []
    for symbolic in (False, True):
        name = f"tf.data iterator checkpoint{', symbolic' if symbolic else ''}"
        row = {"name": name, "group": "iterator checkpoint", "unit": "s",
               "description": "tf.train.Checkpoint of the uncached pipeline's iterator "
                              "after 200 batches"}
        try:
            options = tf.data.Options()
            options.experimental_symbolic_checkpoint = symbolic
            dataset = _new_order(path, False).with_options(options)
            iterator = iter(dataset)
            for _ in range(200):
                next(iterator)
            where = os.path.join(settings.workdir, TABLE, "iterator-" + str(symbolic))
            shutil.rmtree(where, ignore_errors=True)
            checkpoint = tf.train.Checkpoint(iterator=iterator)
            start = time.perf_counter()
            saved = checkpoint.write(os.path.join(where, "ckpt"))
            row["write_s"] = time.perf_counter() - start
            row["bytes"] = sum(os.path.getsize(os.path.join(where, f)) for f in os.listdir(where))
            fresh = iter(dataset)
            start = time.perf_counter()
            tf.train.Checkpoint(iterator=fresh).read(saved).assert_consumed()
            next(fresh)
            row["restore_s"] = time.perf_counter() - start
            row["median"] = row["restore_s"]
        except Exception as e:  # pylint: disable=broad-except
            row["error"] = f"{type(e).__name__}: {e}"[:400]
        rows.append(row)
    return rows


def run(settings):
    common.quiet_tensorflow()
    path = common.dataset_path(settings)
    examples = common.dataset_info(path).num_examples
    epoch_batches = -(-examples // BATCH)
    load_start = output.load_average()
    rows, targets = _steady(settings, path, epoch_batches)
    skip_rows, skip_target, big = _skip_rows(settings)
    rows += skip_rows + _iterator_checkpoint_rows(settings, path)
    targets.append(skip_target)
    if not settings.quick:
        shutil.rmtree(big, ignore_errors=True)
    return {"table": TABLE, "title": TITLE, "unit": "", "rows": rows, "targets": targets,
            "columns": ["name", "median", "min", "max", "ratio", "bytes", "write_s",
                        "restore_s"],
            "data_dir": path, "load_before": load_start, "load_after": output.load_average(),
            "notes": [f"pipeline and training rows: {BATCH} examples a batch, the median of "
                      f"alternating windows (pipelines: about {PIPELINE_WINDOW_S:g} s each; "
                      f"training: {1000 if not settings.quick else 100} steps); ratio: each "
                      f"window over the nearest windows of the old order "
                      f"(benchmarks/common.py local_ratio)",
                      "skip rows: seconds from building the pipeline to its first batch "
                      "(TensorFlow's graph building included, the same in every row)"]}
