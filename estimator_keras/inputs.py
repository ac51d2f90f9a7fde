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

import tensorflow as tf

from estimator_keras import records
from estimator_keras.errors import SchemaError, UsageError
from estimator_keras.schema import IMAGE_ENCODINGS

logger = logging.getLogger(__name__)

SHUFFLE_MODES = ("batch", "record", "none")


@dataclasses.dataclass
class InputConfig:
    """How a pipeline reads and shapes examples (see :func:`make_dataset`).

    Attributes:
      features: model input name -> record feature name; a list of feature
        names (each keyed by its own name); or None for every feature but
        the label.
      label: record feature holding the label (class id, mask...), or None.
      scale: multiply numeric inputs by this after casting to float32
        (None: leave raw values; the experiments scale inside the model so
        that exported models take raw records' values).
      shuffle: "batch" (default: shuffle file order each epoch and whole
        batches in a buffer; cheap, and enough for shards that the writer
        already shuffled), "record" (the classic per-record shuffle buffer;
        several times slower on small records), or "none".
      shuffle_buffer: buffer size, in batches for "batch", records for "record".
      cycle_length: files read at once, interleaved block by block.
      block_length: consecutive records taken from one file before moving to
        the next.
      parallel_reads: read the interleaved files on parallel threads (pays
        off on remote storage; on local disk with 2 cores it costs more than
        it brings).
      cache: keep parsed batches in memory after the first epoch (datasets
        that fit in memory only).
      skip_corrupt: drop records that fail to read (CRC mismatch, truncation)
        instead of failing; a batch holding a record that reads but does not
        parse to the schema is dropped whole (parsing is one op per batch).
      seed: seeds shuffling; None for a different order every run.
    """

    features: object = None
    label: str = "label"
    scale: float = None
    shuffle: str = "batch"
    shuffle_buffer: int = 64
    cycle_length: int = 4
    block_length: int = 16
    parallel_reads: bool = False
    cache: bool = False
    skip_corrupt: bool = False
    seed: int = None

    def __post_init__(self):
        if self.shuffle not in SHUFFLE_MODES:
            raise UsageError(f"shuffle must be one of {', '.join(SHUFFLE_MODES)}; "
                             f"given {self.shuffle!r}.")
        for name in ("shuffle_buffer", "cycle_length", "block_length"):
            if int(getattr(self, name)) < 1:
                raise UsageError(f"{name} must be a positive integer; given "
                                 f"{getattr(self, name)!r}.")


def feature_map(schema, features=None, label="label"):
    """Model input name -> record feature name, checked against the schema."""
    if label is not None and label not in schema:
        raise SchemaError(f"label feature {label!r} is not in the records; they "
                          f"hold {sorted(schema)}.")
    if features is None:
        mapping = {name: name for name in schema if name != label}
    elif isinstance(features, dict):
        mapping = dict(features)
    elif isinstance(features, str):
        mapping = {features: features}
    else:
        mapping = {name: name for name in features}
    missing = sorted(f for f in mapping.values() if f not in schema)
    if missing:
        raise SchemaError(f"the records have no feature(s) {missing}; expected one "
                          f"of {sorted(schema)} (mapping given: {mapping}).")
    if not mapping:
        raise SchemaError(f"no input features: the records hold only {sorted(schema)} "
                          f"and {label!r} is the label.")
    return mapping


def check_feature_keys(model, feature_keys):
    """Raises SchemaError unless the features are exactly the model's inputs."""
    expected = set(model.input_names)
    given = set(feature_keys)
    if expected != given:
        raise SchemaError(
            f"the input pipeline's features must be keyed by the model's input "
            f"names: expected {sorted(expected)}, given {sorted(given)}, missing "
            f"{sorted(expected - given)}, unexpected {sorted(given - expected)}. "
            f"Map record features to inputs with InputConfig(features={{input: "
            f"feature}}).")


def parse_examples_fn(schema, mapping, label=None, scale=None):
    """A function: batch of serialized Examples -> features dict keyed by
    model input name, or ``(features, labels)`` when ``label`` is given."""
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
        inputs = {}
        for input_name, feature_name in mapping.items():
            value = decode(feature_name, parsed[feature_name])
            if value.dtype != tf.string:
                value = tf.cast(value, tf.float32)
                if scale is not None:
                    value = value * scale
            inputs[input_name] = value
        if label is None:
            return inputs
        return inputs, decode(label, parsed[label])

    return parse


def make_dataset(data, batch_size, *, training, split=None, config=None,
                 num_epochs=None, input_context=None, shard=None, **overrides):
    """Builds the ``tf.data.Dataset`` of ``(features, labels)`` batches.

    Args:
      data: a dataset directory (with ``dataset.json``), a glob of TFRecord
        files, or a :class:`records.RecordFiles`.
      batch_size: examples per batch (per input pipeline / replica).
      training: True: shuffled and repeated (``num_epochs`` times, forever by
        default). False: one pass over every example in file order, none
        dropped, the last batch may be smaller.
      split: split to read from a dataset directory; default "train" when
        training, else "test".
      config: an :class:`InputConfig`; keyword ``overrides`` replace its fields.
      num_epochs: passes over the data when training (None: forever).
      input_context: a ``tf.distribute.InputContext``; each pipeline reads
        its own share of the files.
      shard: ``(num_shards, index)`` to use when there is no input_context
        (parameter-server workers).

    Returns:
      A dataset yielding ``({input_name: tensor}, labels)``, or just the
      features dict when the config's label is None.
    """
    config = dataclasses.replace(config or InputConfig(), **overrides)
    if int(batch_size) < 1:
        raise UsageError(f"batch_size must be a positive integer; given {batch_size!r}.")
    if isinstance(data, records.RecordFiles):
        resolved = data
    else:
        resolved = records.resolve(data, split or ("train" if training else "test"),
                                   check_sizes=not config.skip_corrupt)
    mapping = feature_map(resolved.schema, config.features, config.label)
    files = list(resolved.files)

    num_shards, index = 1, 0
    if input_context is not None and input_context.num_input_pipelines > 1:
        num_shards, index = input_context.num_input_pipelines, input_context.input_pipeline_id
    elif shard is not None:
        num_shards, index = shard
    dataset = tf.data.Dataset.from_tensor_slices(files)
    shard_records = False
    if num_shards > 1:
        if len(files) >= num_shards:
            dataset = dataset.shard(num_shards, index)
        else:
            # Fewer files than pipelines: every pipeline reads every file and
            # keeps one record in num_shards. Slower, but nothing is seen twice.
            logger.warning("%d file(s) for %d input pipelines: sharding by record; "
                           "write more shards for faster reading", len(files), num_shards)
            shard_records = True
    if training and config.shuffle != "none":
        dataset = dataset.shuffle(len(files), seed=config.seed,
                                  reshuffle_each_iteration=True)
    if training:
        dataset = dataset.repeat(num_epochs)

    def read(path):
        records_in_file = tf.data.TFRecordDataset(path, resolved.compression or "",
                                                  buffer_size=1 << 20)
        if shard_records:
            # Sharding each file by record position keeps the pipelines'
            # shares disjoint whatever order each one reads the files in
            # (file shuffling with seed=None differs between pipelines).
            records_in_file = records_in_file.shard(num_shards, index)
        return records_in_file

    # Order may vary only where the caller asked for a shuffle without a seed.
    ordered = not training or config.shuffle == "none" or config.seed is not None
    if training:
        parallel = {"num_parallel_calls": tf.data.AUTOTUNE,
                    "deterministic": ordered} if config.parallel_reads else {}
        dataset = dataset.interleave(read, cycle_length=config.cycle_length,
                                     block_length=config.block_length, **parallel)
    else:
        # Evaluation reads files in order so that predictions line up with
        # the records.
        dataset = dataset.flat_map(read)
    if config.skip_corrupt:
        dataset = dataset.apply(tf.data.experimental.ignore_errors(log_warning=True))
    if training and config.shuffle == "record":
        dataset = dataset.shuffle(config.shuffle_buffer, seed=config.seed,
                                  reshuffle_each_iteration=True)
    dataset = dataset.batch(int(batch_size), drop_remainder=False)
    if training and config.shuffle == "batch" and not config.cache:
        dataset = dataset.shuffle(config.shuffle_buffer, seed=config.seed,
                                  reshuffle_each_iteration=True)
    dataset = dataset.map(parse_examples_fn(resolved.schema, mapping, config.label, config.scale),
                          num_parallel_calls=tf.data.AUTOTUNE,
                          deterministic=ordered)
    if config.skip_corrupt:
        dataset = dataset.apply(tf.data.experimental.ignore_errors(log_warning=True))
    if config.cache:
        dataset = dataset.cache()
        if training and config.shuffle == "batch":
            dataset = dataset.shuffle(config.shuffle_buffer, seed=config.seed,
                                      reshuffle_each_iteration=True)
    return dataset.prefetch(tf.data.AUTOTUNE)


def make_input_fn(data, batch_size, *, training, split=None, config=None,
                  num_epochs=None, shard=None, **overrides):
    """An Estimator ``input_fn`` over the same pipeline as :func:`make_dataset`.

    Files are resolved now, so a missing or incomplete dataset fails here and
    not an hour into training. The returned function accepts the arguments
    an Estimator passes (``params``, ``mode``, ``config``, ``input_context``).

    Example::

        train_fn = make_input_fn("/data/fm", 128, training=True)
        eval_fn = make_input_fn("/data/fm", 128, training=False, split="test")
    """
    input_config = dataclasses.replace(config or InputConfig(), **overrides)
    if isinstance(data, records.RecordFiles):
        resolved = data
    else:
        # With skip_corrupt a truncated shard is read up to its damage
        # instead of being refused for its size.
        resolved = records.resolve(data, split or ("train" if training else "test"),
                                   check_sizes=not input_config.skip_corrupt)
    feature_map(resolved.schema, input_config.features, input_config.label)

    # Estimator inspects the argument names and passes only those it knows.
    def input_fn(params=None, mode=None, config=None, input_context=None):  # pylint: disable=unused-argument
        return make_dataset(resolved, batch_size, training=training,
                            config=input_config, num_epochs=num_epochs,
                            input_context=input_context, shard=shard)

    input_fn.files = resolved
    return input_fn
