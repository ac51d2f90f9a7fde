"""The tf.data input pipeline: TFRecord shards -> batches of model inputs.

Everything runs inside TensorFlow's graph: files are listed once, split
between input pipelines, read, batched, and then parsed with ONE vectorized
``tf.io.parse_example`` per batch (6-10x faster than parsing record by record
on small records). Python never touches an example.

Example::

    from estimator_keras import make_dataset, make_input_fn

    ds = make_dataset("/data/fashion_mnist", batch_size=128, training=True,
                      features={"image": "image"}, label="label")
    model.fit(ds, steps_per_epoch=100, epochs=3)

    input_fn = make_input_fn("/data/fashion_mnist", 128, training=False,
                             split="test")
    estimator.evaluate(input_fn)
"""

import dataclasses
import logging
import math

import tensorflow as tf

from estimator_keras import input_order, records
from estimator_keras.errors import UsageError
from estimator_keras.input_config import (  # noqa: F401  (re-exported)
    AUTO_CACHE_SHARE, AUTOTUNE_RAM_BATCHES, AUTOTUNE_RAM_FLOOR_MB, CACHE_MODES, CACHE_SHUFFLES,
    SHUFFLE_MODES, InputConfig, cache_decision, example_bytes, mean_record_bytes)
from estimator_keras.schema import IMAGE_ENCODINGS, feature_map

logger = logging.getLogger(__name__)


def parse_examples_fn(schema, mapping, label=None, scale=None, cast=True):
    """A function: batch of serialized Examples -> features dict keyed by
    model input name, or ``(features, labels)`` when ``label`` is given.

    Numeric inputs come as float32 times ``scale``; with ``cast=False`` they
    keep the records' dtypes (see :func:`cast_inputs_fn`)."""
    needed = set(mapping.values()) | ({label} if label else set())
    spec = {}
    for name in needed:
        f = schema[name]
        if f.encoding == "int64":
            spec[name] = tf.io.FixedLenFeature(f.shape, tf.int64)
        elif f.encoding == "float":
            spec[name] = tf.io.FixedLenFeature(f.shape, tf.float32)
        else:
            spec[name] = tf.io.FixedLenFeature([], tf.string)

    def decode(name, value):
        f = schema[name]
        if f.encoding == "raw":
            # decode_raw on the whole batch at once: one op, one copy.
            flat = tf.io.decode_raw(value, tf.as_dtype(f.dtype))
            return tf.reshape(flat, [-1, *f.shape])
        if f.encoding in IMAGE_ENCODINGS:
            images = tf.map_fn(
                lambda b: tf.io.decode_image(b, channels=f.shape[-1],
                                             expand_animations=False),
                value, fn_output_signature=tf.uint8)
            return tf.ensure_shape(images, [None, *f.shape])
        if f.encoding == "int64" and f.dtype != "int64":
            return tf.cast(value, tf.as_dtype(f.dtype))
        return value

    def parse(serialized):
        parsed = tf.io.parse_example(serialized, spec)
        inputs = {name: decode(feature, parsed[feature]) for name, feature in mapping.items()}
        if cast:
            inputs = _cast_inputs(inputs, scale)
        if label is None:
            return inputs
        return inputs, decode(label, parsed[label])

    return parse


def _cast_inputs(inputs, scale):
    out = {}
    for name, value in inputs.items():
        if value.dtype != tf.string:
            value = tf.cast(value, tf.float32)
            if scale is not None:
                value = value * scale
        out[name] = value
    return out


def cast_inputs_fn(scale=None, label=True):
    """A function over ``parse_examples_fn(..., cast=False)``'s batches that
    casts numeric inputs to float32 and applies ``scale``, as ``cast=True``
    would have; labels pass through."""
    if not label:
        return lambda inputs: _cast_inputs(inputs, scale)
    return lambda inputs, labels: (_cast_inputs(inputs, scale), labels)


_logged = set()


def _log_once(key, message):
    # An Estimator calls its input_fn again for every evaluation, and the
    # memory available (so the message) changes a little each time.
    if key not in _logged:
        _logged.add(key)
        logger.info("%s", message)


def _resolve(data, split, training, config):
    """The :class:`~estimator_keras.records.RecordFiles` of ``data`` (which
    may already be one); the split defaults to train or test."""
    if isinstance(data, records.RecordFiles):
        return data
    # With skip_corrupt a truncated shard is read up to its damage instead
    # of being refused for its size.
    return records.resolve(data, split or ("train" if training else "test"),
                           check_sizes=not config.skip_corrupt)


def make_dataset(data, batch_size, *, training, split=None, config=None,
                 num_epochs=None, input_context=None, shard=None, start_batch=0,
                 **overrides):
    """Builds the ``tf.data.Dataset`` of ``(features, labels)`` batches.

    Args:
      data: a dataset directory (with ``dataset.json``), a glob of TFRecord
        files, or a :class:`records.RecordFiles`.
      batch_size: examples per batch (per input pipeline / replica).
      training: True: shuffled and repeated (``num_epochs`` times, forever by
        default), each epoch's order a function of the seed and the epoch
        (see :mod:`estimator_keras.input_order`). False: one pass over every
        example in file order, none dropped, the last batch may be smaller.
      split: split to read from a dataset directory; default "train" when
        training, else "test".
      config: an :class:`InputConfig`; keyword ``overrides`` replace its fields.
      num_epochs: passes over the data when training (None: forever).
      input_context: a ``tf.distribute.InputContext``; each pipeline reads
        its own share of the files.
      shard: ``(num_shards, index)`` to use when there is no input_context
        (parameter-server workers).
      start_batch: training: batches of this pipeline's stream already
        consumed (a resumed run: its step times the batches a step takes
        from this pipeline). The stream starts in the epoch they reach and
        skips the consumed batches of it without parsing them.

    Returns:
      A dataset yielding ``({input_name: tensor}, labels)``, or just the
      features dict when the config's label is None.
    """
    config = dataclasses.replace(config or InputConfig(), **overrides)
    if int(batch_size) < 1:
        raise UsageError(f"batch_size must be a positive integer; given {batch_size!r}.")
    resolved = _resolve(data, split, training, config)
    mapping = feature_map(resolved.schema, config.features, config.label)

    num_shards, index = input_order.pipeline_of(input_context, shard)
    files, by_record = input_order.pipeline_files(resolved.files, num_shards, index)
    if by_record:
        # Fewer files than pipelines: every pipeline reads every file and
        # keeps one record in num_shards. Slower, but nothing is seen twice.
        logger.warning("%d file(s) for %d input pipelines: sharding by record; "
                       "write more shards for faster reading", len(files), num_shards)
    label_names = [config.label] if config.label else []
    decided = config.cache_decided if training and config.cache == "auto" else None
    cache, reason = decided or cache_decision(
        config, resolved, set(mapping.values()) | set(label_names), num_shards)
    if config.cache == "auto":
        _log_once((tuple(resolved.files), num_shards, index, cache, config.cache_budget_mb),
                  reason)

    def read(path):
        records_in_file = tf.data.TFRecordDataset(path, resolved.compression or "",
                                                  buffer_size=1 << 20)
        if by_record:
            # By record position: the pipelines' shares stay disjoint
            # whatever order each one reads the files in.
            records_in_file = records_in_file.shard(num_shards, index)
        return records_in_file

    # Order may vary only where the caller asked for a shuffle without a seed.
    ordered = not training or config.shuffle == "none" or config.seed is not None
    parse = parse_examples_fn(resolved.schema, mapping, config.label, config.scale,
                              cast=not cache)
    if training:
        dataset = _training_stream(config, resolved, files, read, parse, int(batch_size),
                                   cache, ordered, num_epochs, num_shards, index, by_record,
                                   start_batch)
    else:
        # Evaluation reads files in order so that predictions line up with
        # the records.
        dataset = _readable(config, tf.data.Dataset.from_tensor_slices(files).flat_map(read))
        dataset = _parsed(config, dataset.batch(int(batch_size)), parse, ordered)
        if cache:
            dataset = dataset.cache()
    if cache:
        # In order when training: an unordered map could move a batch from
        # one epoch into the next.
        dataset = dataset.map(cast_inputs_fn(config.scale, bool(config.label)),
                              num_parallel_calls=tf.data.AUTOTUNE,
                              deterministic=ordered or training)
    return dataset.prefetch(tf.data.AUTOTUNE).with_options(
        autotune_options(config, resolved, mapping, batch_size))


def _readable(config, records_read):
    if config.skip_corrupt:
        return records_read.apply(tf.data.experimental.ignore_errors(log_warning=True))
    return records_read


def _parsed(config, batches, parse, ordered):
    batches = batches.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=ordered)
    if config.skip_corrupt:
        batches = batches.apply(tf.data.experimental.ignore_errors(log_warning=True))
    return batches


def _training_stream(config, resolved, files, read, parse, batch_size, cache, ordered,
                     num_epochs, num_shards, index, by_record, start_batch):
    """Epoch after epoch from the position ``start_batch`` reaches; uncached
    batches are skipped before they are parsed."""
    seed = config.seed if config.seed is not None else input_order.new_seed()
    examples = input_order.pipeline_examples(resolved, files, num_shards, index, by_record)
    start = input_order.position(start_batch, input_order.batches_per_epoch(examples, batch_size),
                                 seed)
    if start_batch:
        logger.debug("the training input resumes at %s", start.describe())
    shuffle = config.shuffle != "none"
    parallel = {"num_parallel_calls": tf.data.AUTOTUNE,
                "deterministic": ordered} if config.parallel_reads else {}

    def interleaved(names):
        return _readable(config, tf.data.Dataset.from_tensor_slices(names).interleave(
            read, cycle_length=config.cycle_length, block_length=config.block_length,
            **parallel))

    if not cache:
        def one_epoch(epoch):
            records_of_epoch = interleaved(input_order.epoch_files(files, seed, epoch, shuffle))
            seed_of_epoch = input_order.epoch_seed(seed, epoch)
            if config.shuffle == "record":
                records_of_epoch = input_order.shuffled(records_of_epoch,
                                                        config.shuffle_buffer, seed_of_epoch)
            batches = records_of_epoch.batch(batch_size)
            if config.shuffle == "batch":
                batches = input_order.shuffled(batches, config.shuffle_buffer, seed_of_epoch)
            return batches

        return _parsed(config, input_order.stream(start, one_epoch, num_epochs, overlap=True),
                       parse, ordered)

    # Cached runs of batches get their records permuted after the cache; a
    # record shuffle before it would only colour the first epoch.
    reform = shuffle and config.reforms_batches()
    cached = _cached_batches(config, interleaved(input_order.fill_files(files, seed, shuffle)),
                             parse, batch_size, seed, ordered, shuffle_records=not reform)
    if not shuffle:
        return input_order.stream(start, lambda epoch: cached, num_epochs)
    epoch_batches = _epoch_batches(config, resolved, batch_size, num_shards)

    def one_cached_epoch(epoch):
        # Shuffling the cached batches (references, not copies) over the
        # whole epoch gives each epoch its own order.
        seed_of_epoch = input_order.epoch_seed(seed, epoch)
        batches = input_order.shuffled(cached, epoch_batches, seed_of_epoch)
        if reform:
            batches = _reform_batches(batches, batch_size,
                                      _run_batches(config, batch_size, epoch_batches),
                                      seed_of_epoch)
        return batches

    return input_order.stream(start, one_cached_epoch, num_epochs)


def served_example_bytes(schema, mapping, label=None, record_bytes=None):
    """Bytes of one example as the pipeline serves it: numeric inputs as
    float32, opaque ``bytes`` inputs as ``record_bytes`` (or 0), the label in
    its own dtype."""
    total = sum(int(record_bytes or 0) if schema[name].encoding == "bytes"
                else 4 * schema[name].size for name in mapping.values())
    if label:
        total += example_bytes(schema, [label], record_bytes)
    return total


def autotune_options(config, resolved, mapping, batch_size):
    """``tf.data.Options`` bounding the memory of autotuned buffers: the
    config's ``autotune_ram_mb``, else AUTOTUNE_RAM_BATCHES served batches
    (at least AUTOTUNE_RAM_FLOOR_MB); without tf.data's autotuning thread."""
    if config.autotune_ram_mb is not None:
        budget = float(config.autotune_ram_mb) * 2 ** 20
    else:
        batch = int(batch_size) * served_example_bytes(resolved.schema, mapping, config.label,
                                                       mean_record_bytes(resolved))
        budget = max(AUTOTUNE_RAM_FLOOR_MB * 2 ** 20, AUTOTUNE_RAM_BATCHES * batch)
    options = tf.data.Options()
    # Deleting an iterator cancels its autotuning thread, which can wake
    # before the cancellation shows and sleep out its period (up to 60 s
    # for an iterator that ran a few minutes); Keras' training iterator is
    # often deleted as the interpreter exits, which then waits that long
    # after a run's last line (tests/test_exit.py). Without the thread,
    # AUTOTUNE parallelism is one call per core (at most 16) and the
    # prefetch buffer still grows on demand, within ram_budget.
    options.autotune.enabled = False
    options.autotune.ram_budget = int(budget)
    return options


def _run_batches(config, batch_size, epoch_batches):
    """Batches per run whose records cache_shuffle="records" permutes:
    ``shuffle_buffer`` records (shuffle="record") or batches, at least 2, at
    most an epoch."""
    if config.shuffle == "record":
        per_run = math.ceil(config.shuffle_buffer / int(batch_size))
    else:
        per_run = config.shuffle_buffer
    return max(2, min(per_run, epoch_batches))


def _cached_batches(config, records_read, parse, batch_size, seed, ordered, shuffle_records):
    """One epoch of parsed batches in the records' dtypes, cached: every
    epoch reads memory once the first has filled it."""
    if config.shuffle == "record" and shuffle_records:
        records_read = input_order.shuffled(records_read, config.shuffle_buffer,
                                            input_order.epoch_seed(seed, -1))
    return _parsed(config, records_read.batch(batch_size), parse, ordered).cache()


def _reform_batches(dataset, batch_size, run_batches, seed):
    """New batches out of one epoch's cached ones: each run of
    ``run_batches`` batches is joined, its records permuted, and cut into
    batches again; only the epoch's last batch comes out short. Run ``i``'s
    permutation is a function of (``seed``, ``i``): stateless, so an epoch
    rebuilt after a resume permutes as the first time."""
    runs = dataset.rebatch(batch_size * run_batches)

    def permute(run, element):
        count = tf.shape(tf.nest.flatten(element)[0])[0]
        keys = tf.random.stateless_uniform([count], seed=tf.stack([seed, run]))
        order = tf.argsort(keys)
        return tf.nest.map_structure(lambda t: tf.gather(t, order), element)

    return runs.enumerate().map(permute).rebatch(batch_size)


def _epoch_batches(config, resolved, batch_size, num_shards):
    """Shuffle buffer over cached batches: a pipeline's whole epoch when the
    manifest counts it, else the configured buffer in batches."""
    if resolved.num_examples:
        return math.ceil(resolved.num_examples / num_shards / int(batch_size)) + len(resolved.files)
    if config.shuffle == "record":
        return max(1, config.shuffle_buffer // int(batch_size))
    return config.shuffle_buffer


def make_input_fn(data, batch_size, *, training, split=None, config=None,
                  num_epochs=None, shard=None, start_step=0, resume=None, **overrides):
    """An Estimator ``input_fn`` over the same pipeline as :func:`make_dataset`.

    Files are resolved now, so a missing or incomplete dataset fails here and
    not an hour into training. The returned function accepts the arguments
    an Estimator passes (``params``, ``mode``, ``config``, ``input_context``)
    and ``start_step``: the step training resumes at (default: the one given
    here), from which a training pipeline knows how many of its batches were
    consumed (one a step per replica it feeds) and resumes after them; or,
    given ``resume`` (an :class:`~estimator_keras.order_state.Decision`), after those it says.

    Example::

        train_fn = make_input_fn("/data/fm", 128, training=True)
        eval_fn = make_input_fn("/data/fm", 128, training=False, split="test")
    """
    input_config = dataclasses.replace(config or InputConfig(), **overrides)
    resolved = _resolve(data, split, training, input_config)
    feature_map(resolved.schema, input_config.features, input_config.label)
    return input_order.resumable_input_fn(make_dataset, resolved, batch_size, training,
                                          input_config, num_epochs, shard, start_step, resume)
