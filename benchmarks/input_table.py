"""Table "input": examples/s of input pipelines, with nothing training.

tf.data pipelines are consumed in-graph: ``dataset.take(k + n).reduce(...)``
inside a ``tf.function``, with ``tf.timestamp()`` taken inside the reduce
function at batch k, so the window times n batches of steady state (the
first k batches fill shuffle buffers and thread pools; the time to the first
batch is reported separately as ``startup_ms``). The queue-runner pipeline
can only run in a v1 graph, so it is consumed by ``session.run`` of its
batch op, one call per batch; ``feed_dict`` is a v1 ``session.run`` per
batch fed from numpy, as in the seed question.

Pipelines compared (batch 128, 60k Fashion-MNIST records of ~830 bytes):

- ``default``: this package's ``make_dataset(training=True)``;
- ``raw_read``: ``TFRecordDataset(files).repeat().batch(128)``, no parsing:
  the reader's speed, an upper bound for anything that parses;
- ``raw_read + parse``: the same plus the vectorized parse map: what parsing
  alone costs;
- ``guide_recipe``: the tf.data guide's recipe: parallel interleave, record
  shuffle(10000), batch, vectorized parse map, prefetch;
- ``per_record_parse``: ``parse_single_example`` per record, then batch;
- ``queue_runners``: the seed answer's string_input_producer + TFRecordReader
  + shuffle_batch (32 threads), and the same with 2 threads;
- ``feed_dict``: numpy batches fed to placeholders;
- ``experiments default (cache=auto)``: what ``python -m experiments train``
  reads: the same pipeline with ``cache="auto"``, which caches Fashion-MNIST;
  timed after its first epoch (the cache fills before the first batch);
- ``pkg ...``: this package's pipeline with one knob changed, to justify the
  defaults.

Beside the rates, :mod:`benchmarks.cache_memory` measures the resident
memory of pipelines over 10 epochs, each in a fresh process: cached and
uncached, each with the package's bound on tf.data's autotuned buffers
(``InputConfig.autotune_ram_mb``) and with TensorFlow's own budget (half
the available memory, the unbounded "before"), and a cached pipeline that
forms new batches every epoch (``cache_shuffle="records"``), with and without
what a training run does to malloc (:mod:`estimator_keras.memory`: arenas
capped, free heap memory handed back after each epoch).
"""

import time

from benchmarks import cache_memory, common, legacy, output
from benchmarks.common import IMAGE, LABEL, Variant

TABLE = "input"
TITLE = "input pipelines alone, examples/s (batch 128)"
SKIP_BATCHES = 20
EXPERIMENTS_DEFAULT = "experiments default (cache=auto)"
MEMORY_EPOCHS = 10

# (name, overrides of InputConfig, why)
KNOBS = [
    ("pkg cycle_length=1", {"cycle_length": 1}, "one file at a time (file order still shuffled)"),
    ("pkg cycle_length=2", {"cycle_length": 2}, ""),
    ("pkg cycle_length=8", {"cycle_length": 8}, ""),
    ("pkg block_length=1", {"block_length": 1}, "interleave record by record"),
    ("pkg block_length=128", {"block_length": 128}, "one batch's worth per file turn"),
    ("pkg parallel_reads=True", {"parallel_reads": True}, "parallel interleave"),
    ("pkg shuffle=record(10000)", {"shuffle": "record", "shuffle_buffer": 10000},
     "classic per-record shuffle buffer"),
    ("pkg shuffle=none", {"shuffle": "none"}, "no shuffling at all"),
    ("pkg shuffle_buffer=16", {"shuffle_buffer": 16}, "batch shuffle buffer of 16 batches"),
    ("pkg cache=True", {"cache": True}, "one epoch of uint8 batches in memory, "
     "reshuffled every epoch; timed after the first epoch"),
    ("pkg cache=True,cache_shuffle=records", {"cache": True, "cache_shuffle": "records"},
     "the same, forming new batches every epoch (records permuted within runs of 64 "
     "batches); timed after the first epoch"),
    ("pkg cycle=2,block=128", {"cycle_length": 2, "block_length": 128}, "combination"),
]
# make_dataset's structure rebuilt (custom_pipeline) for knobs InputConfig lacks.
CUSTOM = [
    ("custom = default", {}, "make_dataset's training pipeline rebuilt step by step "
     "(a check: should match `default`)"),
    ("custom parse map sequential", {"parse_parallel": False},
     "parse map without num_parallel_calls"),
    ("custom no prefetch", {"prefetch": False}, "without the final prefetch"),
]
# tf.data.Options applied on top of the default pipeline (not InputConfig knobs).
OPTIONS = [
    ("pkg +options max_intra_op=1", {"threading.max_intra_op_parallelism": 1}),
    ("pkg +options threadpool=2", {"threading.private_threadpool_size": 2}),
]


# --------------------------------------------------------------------------
# Pipelines (also used by the tests, with num_epochs=1)


def package_pipeline(path, batch_size, num_epochs=None, seed=None, **overrides):
    """This package's training pipeline, with InputConfig overrides."""
    from estimator_keras import inputs  # pylint: disable=import-outside-toplevel

    return inputs.make_dataset(path, batch_size, training=True, num_epochs=num_epochs,
                               seed=seed, features={IMAGE: IMAGE}, label=LABEL, **overrides)


def raw_read_pipeline(files, batch_size, num_epochs=None, compression=None):
    """Sequential read + batch of serialized records; no parsing."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    return tf.data.TFRecordDataset(files, compression or "").repeat(num_epochs).batch(batch_size)


def raw_parse_pipeline(files, schema, batch_size, num_epochs=None, compression=None):
    """Sequential read + batch + the package's vectorized parse: what parsing
    costs on top of the raw read, with no interleave and no shuffle."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from estimator_keras import inputs  # pylint: disable=import-outside-toplevel

    parse = inputs.parse_examples_fn(schema, {IMAGE: IMAGE}, LABEL)
    ds = raw_read_pipeline(files, batch_size, num_epochs, compression)
    return ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def guide_recipe_pipeline(files, schema, batch_size, num_epochs=None, compression=None,
                          seed=None, shuffle_buffer=10000):
    """The tf.data performance guide's recipe: shuffled file list, parallel
    interleave of the files, record-level shuffle, batch, vectorized parse
    map, prefetch."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from estimator_keras import inputs  # pylint: disable=import-outside-toplevel

    autotune = tf.data.AUTOTUNE
    parse = inputs.parse_examples_fn(schema, {IMAGE: IMAGE}, LABEL)
    ds = tf.data.Dataset.from_tensor_slices(list(files)).shuffle(len(files), seed=seed)
    ds = ds.interleave(lambda f: tf.data.TFRecordDataset(f, compression or ""),
                       num_parallel_calls=autotune)
    ds = ds.shuffle(shuffle_buffer, seed=seed).repeat(num_epochs).batch(batch_size)
    return ds.map(parse, num_parallel_calls=autotune).prefetch(autotune)


def per_record_pipeline(files, schema, batch_size, num_epochs=None, compression=None):
    """``parse_single_example`` (+ decode_raw) per record, in parallel, then
    batch: the pre-vectorization way, without any shuffle (its best case)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    spec = schema[IMAGE]
    features = {IMAGE: tf.io.FixedLenFeature([], tf.string),
                LABEL: tf.io.FixedLenFeature([], tf.int64)}

    def parse_one(serialized):
        parsed = tf.io.parse_single_example(serialized, features)
        image = tf.reshape(tf.io.decode_raw(parsed[IMAGE], tf.as_dtype(spec.dtype)), spec.shape)
        return {IMAGE: tf.cast(image, tf.float32)}, parsed[LABEL]

    ds = tf.data.TFRecordDataset(files, compression or "").repeat(num_epochs)
    ds = ds.map(parse_one, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(batch_size).prefetch(tf.data.AUTOTUNE)


def custom_pipeline(files, schema, batch_size, num_epochs=None, compression=None, seed=None,
                    cycle_length=4, block_length=16, shuffle_buffer=64, parse_parallel=True,
                    prefetch=True):
    """make_dataset's training path (shuffle="batch") rebuilt step by step,
    to try knobs InputConfig does not expose: a sequential parse map and no
    prefetch. With the defaults it is the same pipeline as ``default``."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from estimator_keras import inputs  # pylint: disable=import-outside-toplevel

    parse = inputs.parse_examples_fn(schema, {IMAGE: IMAGE}, LABEL)
    ds = tf.data.Dataset.from_tensor_slices(list(files)).shuffle(len(files), seed=seed)
    ds = ds.repeat(num_epochs).interleave(
        lambda f: tf.data.TFRecordDataset(f, compression or "", buffer_size=1 << 20),
        cycle_length=cycle_length, block_length=block_length)
    ds = ds.batch(batch_size).shuffle(shuffle_buffer, seed=seed)
    if parse_parallel:
        ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=seed is not None)
    else:
        ds = ds.map(parse)
    return ds.prefetch(tf.data.AUTOTUNE) if prefetch else ds


def with_options(dataset, settings):
    """``dataset`` with tf.data.Options given as {"threading.x": value}."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    options = tf.data.Options()
    for key, value in settings.items():
        group, name = key.split(".")
        setattr(getattr(options, group), name, value)
    return dataset.with_options(options)


# --------------------------------------------------------------------------
# Consumers


def reduce_consumer(dataset, skip=SKIP_BATCHES):
    """A tf.function ``consume(n) -> (examples, seconds, startup_seconds)``
    that reduces ``skip + n`` batches in-graph and times the last n."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    skip = tf.constant(int(skip), tf.int64)
    zero_i = tf.constant(0, tf.int64)

    @tf.function
    def consume(n):
        t_call = tf.timestamp()
        with tf.control_dependencies([t_call]):
            n = tf.identity(n)

        def step(state, element):
            i, count, t_first, t_skip = state
            now = tf.timestamp()
            size = tf.cast(tf.shape(tf.nest.flatten(element)[0])[0], tf.int64)
            # Batch `skip` marks the start, so only later batches count.
            count = count + tf.where(i > skip, size, zero_i)
            t_first = tf.where(tf.equal(i, 0), now, t_first)
            t_skip = tf.where(tf.equal(i, skip), now, t_skip)
            return i + 1, count, t_first, t_skip

        init = (zero_i, zero_i, tf.constant(0.0, tf.float64), tf.constant(0.0, tf.float64))
        i, count, t_first, t_skip = dataset.take(skip + n).reduce(init, step)
        with tf.control_dependencies([i, count, t_first, t_skip]):
            t_end = tf.timestamp()
        return count, t_end - t_skip, t_first - t_call

    return consume


class TFDataVariant(Variant):
    """A tf.data pipeline consumed in-graph by :func:`reduce_consumer`."""

    consumed = "in-graph dataset.reduce in tf.function"

    def __init__(self, name, make, settings, description="", group="baseline",
                 skip=SKIP_BATCHES):
        self.name, self.make, self.settings = name, make, settings
        self.description, self.group = description, group
        self.skip = skip
        self.batches = 50
        self.startup = []

    def build(self):
        self.consume = reduce_consumer(self.make(), self.skip)

    def _run(self, batches):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        count, seconds, startup = self.consume(tf.constant(batches, tf.int64))
        self.startup.append(float(startup))
        return int(count), float(seconds)

    def warmup(self):
        self._run(self.batches)
        count, seconds = self._run(self.batches)
        self.batches = common.window_size(count / max(seconds, 1e-9) / self.settings.batch_size,
                                          self.settings.window_s, 10, 20000)

    def measure(self):
        return self._run(self.batches)

    def extra(self):
        startup = round(1000 * common.median(self.startup), 1) if self.startup else None
        return {"startup_ms": startup, "window_batches": self.batches}


class QueueRunnerVariant(Variant):
    """The seed answer's queue-runner input, consumed by ``session.run`` of
    the batch op. A fresh session per window, so its threads never run in
    the background of another variant's window."""

    consumed = "v1 session.run(batch op) per batch"
    group = "baseline"

    def __init__(self, name, files, schema, settings, num_threads, description=""):
        self.name, self.files, self.schema, self.settings = name, files, schema, settings
        self.num_threads, self.description = num_threads, description
        self.batches = 50

    def build(self):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        self.graph = tf.Graph()
        with self.graph.as_default():
            self.fetch = legacy.queue_runner_batch(self.files, self.schema,
                                                   self.settings.batch_size, self.num_threads)

    def _run(self, batches):
        with legacy.QueueRunnerSession(self.graph) as sess:
            for _ in range(SKIP_BATCHES):
                sess.run(self.fetch)
            start = time.perf_counter()
            examples = 0
            for _ in range(batches):
                _, labels = sess.run(self.fetch)
                examples += len(labels)
            return examples, time.perf_counter() - start

    def warmup(self):
        count, seconds = self._run(self.batches)
        self.batches = common.window_size(count / seconds / self.settings.batch_size,
                                          self.settings.window_s, 10, 20000)

    def measure(self):
        return self._run(self.batches)


class FeedDictVariant(Variant):
    """The seed question's loop without the training: a placeholder fed a
    numpy batch at each ``session.run``."""

    consumed = "v1 session.run(feed_dict=numpy batch) per batch"
    group = "baseline"

    def __init__(self, name, arrays, schema, settings, description=""):
        self.name, self.arrays, self.schema, self.settings = name, arrays, schema, settings
        self.description = description
        self.batches = 50

    def build(self):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        images, labels = self.arrays
        # The seed's next_batch handed out float32 arrays; convert once.
        self.batcher = legacy.NumpyBatcher(images.astype("float32"), labels,
                                           self.settings.batch_size, self.settings.seed)
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.images, self.labels = legacy.placeholders(self.schema)
            # Depends on both placeholders so both feeds are used.
            self.fetch = tf.size(self.images, out_type=tf.int64) + tf.size(self.labels,
                                                                          out_type=tf.int64)
        self.session = tf.compat.v1.Session(graph=self.graph)

    def _run(self, batches):
        start = time.perf_counter()
        examples = 0
        for _ in range(batches):
            x, y = self.batcher.next_batch()
            self.session.run(self.fetch, feed_dict={self.images: x, self.labels: y})
            examples += len(y)
        return examples, time.perf_counter() - start

    def warmup(self):
        self._run(SKIP_BATCHES)
        count, seconds = self._run(self.batches)
        self.batches = common.window_size(count / seconds / self.settings.batch_size,
                                          self.settings.window_s, 10, 20000)

    def measure(self):
        return self._run(self.batches)

    def close(self):
        self.session.close()


# --------------------------------------------------------------------------


def variants(path, settings, knobs=True):
    """Every variant of the table, baselines first."""
    resolved = common.dataset_info(path, "train")
    files, schema, compression = resolved.files, resolved.schema, resolved.compression
    b = settings.batch_size
    out = [
        TFDataVariant("default", lambda: package_pipeline(path, b), settings,
                      "make_dataset(training=True): interleave(cycle 4, block 16) -> batch "
                      "-> shuffle(64 batches) -> vectorized parse -> prefetch"),
        TFDataVariant(EXPERIMENTS_DEFAULT, lambda: package_pipeline(path, b, cache="auto"),
                      settings, "the same with cache=\"auto\" (the experiments' default): "
                      "one epoch parsed and cached (uint8) before the first batch, then "
                      "batches from memory in a new order each epoch, cast to float32"),
        TFDataVariant("raw_read", lambda: raw_read_pipeline(files, b, compression=compression),
                      settings, "TFRecordDataset(files).repeat().batch(128), no parsing"),
        TFDataVariant("raw_read + parse",
                      lambda: raw_parse_pipeline(files, schema, b, compression=compression),
                      settings, "raw_read + vectorized parse map + prefetch (no interleave, "
                      "no shuffle): the cost of parsing alone"),
        TFDataVariant("guide_recipe",
                      lambda: guide_recipe_pipeline(files, schema, b, compression=compression),
                      settings, "parallel interleave -> shuffle(10000) -> batch -> "
                      "vectorized parse -> prefetch"),
        TFDataVariant("per_record_parse",
                      lambda: per_record_pipeline(files, schema, b, compression=compression),
                      settings, "parse_single_example per record (parallel map), then batch"),
        QueueRunnerVariant("queue_runners", files, schema, settings, legacy.SEED_THREADS,
                           "string_input_producer + TFRecordReader + shuffle_batch, "
                           "32 threads (the seed answer)"),
        QueueRunnerVariant("queue_runners_2threads", files, schema, settings, 2,
                           "the same with num_threads=2"),
        FeedDictVariant("feed_dict", common.load_arrays(path, "train"), schema, settings,
                        "numpy next_batch fed to placeholders (the seed question)"),
    ]
    if knobs:
        for name, overrides, why in KNOBS:
            out.append(TFDataVariant(
                name, lambda o=overrides: package_pipeline(path, b, **o), settings,
                f"default with {', '.join(f'{k}={v}' for k, v in overrides.items())}"
                f"{'; ' + why if why else ''}", group="knob"))
        budget = dict(memory_variants())["no cache, TensorFlow's autotune budget"]
        out.append(TFDataVariant(
            "pkg autotune budget=TensorFlow's", lambda: package_pipeline(path, b, **budget),
            settings, f"default with tf.data's own autotune RAM budget (half the available "
            f"memory, {budget['autotune_ram_mb']:,.0f} MB) instead of the package's 16 "
            f"batches: the bound's cost in speed", group="knob"))
        for name, kwargs, why in CUSTOM:
            out.append(TFDataVariant(
                name, lambda k=kwargs: custom_pipeline(files, schema, b,
                                                       compression=compression, **k),
                settings, why, group="knob"))
        for name, options in OPTIONS:
            out.append(TFDataVariant(
                name, lambda o=options: with_options(package_pipeline(path, b), o), settings,
                f"default + tf.data.Options {options}", group="knob"))
    return out


def run(settings, path=None, knobs=True):
    """Runs the table; returns its result dict."""
    common.quiet_tensorflow()
    path = path or common.dataset_path(settings)
    load_start = output.load_average()
    vs = variants(path, settings, knobs)
    m = common.run_alternating(vs, settings.repeats_for(7), TABLE, reference="default")
    rows = common.rows_from(vs, m, reference="default", unit="examples/s")
    default = common.row_median(rows, "default")

    def default_over(name):
        return common.local_ratio(m.log, "default", name)

    # Against the faster of the two queue-runner settings.
    qr = [r for r in (default_over("queue_runners"), default_over("queue_runners_2threads"))
          if r is not None]

    targets = [
        common.target("input.default_abs", "default pipeline examples/s, in-graph", default,
                      300000),
        common.target("input.vs_raw_0.5", "default / raw sequential read",
                      default_over("raw_read"), 0.5),
        common.target("input.vs_raw_0.8", "default / raw sequential read (issue 2)",
                      default_over("raw_read"), 0.8),
        common.target("input.vs_guide", "default / tf.data guide recipe",
                      default_over("guide_recipe"), 3.0),
        common.target("input.vs_queue_runners", "default / best queue-runner setting",
                      min(qr) if qr else None, 8.0),
        common.target("input.vs_per_record_8", "default / per-record parsing",
                      default_over("per_record_parse"), 8.0),
        common.target("input.vs_per_record_3", "default / per-record parsing (issue 2)",
                      default_over("per_record_parse"), 3.0),
        common.target("input.cached_vs_raw", "experiments' default pipeline (cache=auto) "
                      "after its first epoch / raw sequential read",
                      common.local_ratio(m.log, EXPERIMENTS_DEFAULT, "raw_read"), 2.0,
                      why="the experiments' default did not cache: see its log line"
                      if common.row_median(rows, EXPERIMENTS_DEFAULT) is None else None),
    ]
    memory = memory_rows(path, settings)
    targets += memory_targets(memory)
    return {"table": TABLE, "title": TITLE, "unit": "examples/s", "rows": rows,
            "columns": ["name", "median", "min", "max", "ratio", "ratio_best", "startup_ms"],
            "targets": targets, "dataset": path, "memory": memory,
            "num_examples": common.dataset_info(path).num_examples,
            "load_before": load_start, "load_after": output.load_average(),
            "notes": ["ratio = median over windows of (rate / mean rate of the nearest "
                      "`default` windows before and after it; `default` runs after every 3 "
                      "other windows); targets use the same local ratios",
                      "ratio_best = best window / best `default` window",
                      "startup_ms = time from starting a pass to its first batch (excluded "
                      "from the rate)"]}


def memory_rows(path, settings):
    """RSS per epoch of a cache=True pipeline and of the uncached default,
    each in a fresh process; with the manifest's estimate of the cache."""
    from estimator_keras import inputs  # pylint: disable=import-outside-toplevel

    epochs = 4 if settings.quick else MEMORY_EPOCHS
    resolved = common.dataset_info(path, "train")
    estimate = resolved.num_examples * inputs.example_bytes(resolved.schema, [IMAGE, LABEL])
    out = []
    for name, overrides in memory_variants():
        try:
            result = cache_memory.measure(path, epochs, settings.batch_size, overrides,
                                          release=name not in KEEP_FREE_MEMORY)
        except Exception as e:  # pylint: disable=broad-except
            result = {"error": f"{type(e).__name__}: {e}"[:500]}
        result.update(name=name, cache_estimate_mb=estimate / 2.0 ** 20)
        common.say(f"[{TABLE}] memory {name}: {result.get('rss_mb') or result.get('error')}")
        out.append(result)
    return out


# The "before" of estimator_keras.memory (malloc as glibc sets it).
RECORDS_KEPT = "cache=True, cache_shuffle=records, glibc's malloc defaults"
KEEP_FREE_MEMORY = (RECORDS_KEPT,)


def memory_variants():
    """(name, InputConfig overrides) of the memory rows; the first is the
    cache target's. "TensorFlow's budget" is tf.data's own default RAM
    budget, half the available memory: the autotuned buffers unbounded."""
    from estimator_keras import inputs, memory  # pylint: disable=import-outside-toplevel

    tensorflow_budget = {"autotune_ram_mb": max(1.0, memory.available_memory_mb()[0] / 2)}
    return [("cache=True", {"cache": True}),
            ("cache=True, cache_shuffle=records", {"cache": True, "cache_shuffle": "records"}),
            (RECORDS_KEPT, {"cache": True, "cache_shuffle": "records"}),
            ("cache=True, TensorFlow's autotune budget", dict(tensorflow_budget, cache=True)),
            ("no cache", {}),
            ("no cache, TensorFlow's autotune budget", tensorflow_budget)]


MEMORY_TARGETS = (("cache=True", "input.cache_rss", "cache=True"),
                  ("cache=True, cache_shuffle=records", "input.reshuffle_rss",
                   "cache=True, new batches every epoch (cache_shuffle=records)"),
                  ("no cache", "input.nocache_rss", "no cache"))


def memory_targets(memory):
    """RSS growth targets (< 5% from epoch 2 to the last) of the bounded
    pipelines; the TensorFlow-budget rows, and the records row that keeps its
    free heap memory, are the "before" beside them."""
    by_name = {m.get("name"): m for m in memory}
    targets = []
    for name, tid, label in MEMORY_TARGETS:
        row = by_name.get(name, {})
        before_name, before_label = ((RECORDS_KEPT, "with glibc's malloc defaults")
                                     if name == "cache=True, cache_shuffle=records" else
                                     (f"{name}, TensorFlow's autotune budget",
                                      "with TensorFlow's autotune budget"))
        before = by_name.get(before_name, {})
        beside = (f"; {before_label}: {output.fmt_value(before['growth'])}"
                  if before.get("growth") is not None else "")
        targets.append(common.target(
            tid, f"{label}: RSS growth from epoch 2 to epoch "
            f"{row.get('epochs', MEMORY_EPOCHS)} (fraction)", row.get("growth"), 0.05, op="<",
            why=row.get("error") or f"RSS per epoch (MB): {row.get('rss_mb')}{beside}"))
    return targets
