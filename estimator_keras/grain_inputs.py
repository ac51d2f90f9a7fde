"""The Grain input pipeline: the same TFRecord shards, read without TensorFlow.

The records are read by index (:class:`~estimator_keras.record_index.ShardedRecords`),
so a training epoch is one global shuffle: a permutation of the pipeline's
share of the records that is a pure function of (seed, epoch)
(:func:`epoch_permutation`), cut into batches that stay in their epoch, as
the tf.data pipeline's do (see :mod:`estimator_keras.input_order`). The
``n``-th batch a pipeline serves is batch ``n % B`` of epoch ``n // B``, so a
resumed run starts at the batch its step reached and reads nothing before it.

Each batch is one element of a ``grain.MapDataset`` indexed by that batch
number; its records are read, checked, decoded (``tf.train.Example`` by
:mod:`~estimator_keras.example_codec`, PNG and JPEG by Pillow) and stacked in
worker processes. The batches are those of :func:`estimator_keras.make_dataset`:
the same features and dtypes (numeric inputs as float32 times ``scale``,
labels in their own dtype), dicts keyed by model input name.

Example::

    from estimator_keras import grain_inputs

    train = grain_inputs.make_dataset("/data/fm", 128, training=True, seed=7)
    model.fit(train, steps_per_epoch=100, epochs=3)   # Keras 3 takes Grain datasets
"""

import dataclasses
import io as bytes_io
import itertools
import logging
import math
import os

import numpy as np

from estimator_keras import example_codec, input_order, records
from estimator_keras.errors import DataError, UsageError
from estimator_keras.input_config import InputConfig
from estimator_keras.record_index import ShardedRecords
from estimator_keras.schema import feature_map

logger = logging.getLogger(__name__)

# A training stream has no end; Grain's datasets have a length.
_FOREVER_EPOCHS = 1 << 40
# Arrays below this size pass between processes by copy.
_NO_SHARED_MEMORY = 1 << 62
# The Philox key's second word, so that no other use of the seed draws the
# same stream.
_ORDER_STREAM = 0x5EED_0DE5


def epoch_permutation(count, seed, epoch):
    """The order of ``count`` records in epoch ``epoch``: the argsort of
    Philox's raw output for key (seed mixed with epoch, a constant). The
    raw streams of numpy's bit generators are fixed by their algorithms,
    so the order is the same on every numpy release and platform."""
    if count == 0:
        return np.zeros(0, np.int64)
    key = [input_order.epoch_seed(seed, int(epoch)), _ORDER_STREAM]
    keys = np.random.Philox(key=key).random_raw(count)
    return np.argsort(keys, kind="stable")


def default_workers():
    """Decoding processes: one per core beyond the one training takes, at
    least one, at most four."""
    return max(1, min(4, (os.cpu_count() or 2) - 1))


def _share(sources, files_of, num_shards, index, by_record):
    """Indices into ``sources`` of this pipeline's records: all of its
    files', or, sharding by record, every ``num_shards``-th of each file."""
    if not by_record:
        return np.arange(len(sources), dtype=np.int64)
    parts, start = [], 0
    for count in files_of:
        parts.append(np.arange(start + index, start + count, num_shards, dtype=np.int64))
        start += count
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _decode_image(data, spec):
    """A PNG or JPEG as ``spec``'s uint8 (height, width, channels) array."""
    from PIL import Image  # pylint: disable=import-outside-toplevel  (images only)
    with Image.open(bytes_io.BytesIO(data)) as image:
        channels = spec.shape[-1]
        mode = {1: "L", 3: "RGB", 4: "RGBA"}.get(channels)
        if mode is None:
            raise DataError(f"feature {spec.name!r}: {spec.encoding} images of "
                            f"{channels} channels cannot be decoded without TensorFlow.")
        array = np.asarray(image if image.mode == mode else image.convert(mode))
    array = array.reshape(array.shape[:2] + (channels,))
    if array.shape != spec.shape:
        raise DataError(f"feature {spec.name!r}: an image of shape {array.shape}, the "
                        f"schema says {spec.shape}.")
    return array


class BatchDecoder:
    """Records' bytes -> one batch as the tf.data pipeline serves it.

    Each record is parsed once; each feature's values are gathered over the
    batch and turned into one array (raw bytes joined and viewed, numbers
    read in one pass), so the cost per record is the parse. A record that
    does not fit the schema is decoded again alone by
    :func:`estimator_keras.example_codec.decode_example`, whose error names
    the feature and what it holds.

    Args:
      schema: the records' schema (name -> FeatureSpec).
      mapping: model input name -> record feature.
      label: the label feature, or None.
      scale: numeric inputs are cast to float32 and multiplied by it.
    """

    def __init__(self, schema, mapping, label=None, scale=None):
        self.mapping, self.label, self.scale = dict(mapping), label, scale
        names = set(self.mapping.values()) | ({label} if label else set())
        self.wanted = {name: schema[name] for name in sorted(names)}
        # FeatureSpec.size multiplies the shape out on every call.
        self._sizes = {name: spec.size for name, spec in self.wanted.items()}

    def __call__(self, batch):
        example = example_codec.message_class("Example")()
        columns = {name: [] for name in self.wanted}
        for data in batch:
            try:
                example.ParseFromString(data)
            except Exception:  # pylint: disable=broad-except  (protobuf's DecodeError)
                example_codec.decode_example(self.wanted, data)  # raises, naming why
                raise
            feature = example.features.feature
            for name, spec in self.wanted.items():
                if name not in feature:
                    example_codec.decode_example(self.wanted, data)
                columns[name].append(getattr(feature[name], example_codec.KINDS[spec.encoding]).value)
        arrays = {name: self._array(spec, self._sizes[name], columns[name], batch)
                  for name, spec in self.wanted.items()}
        features = {}
        for input_name, feature_name in self.mapping.items():
            value = arrays[feature_name]
            if value.dtype != object:
                value = value.astype(np.float32)
                if self.scale is not None:
                    value *= np.float32(self.scale)
            features[input_name] = value
        if self.label is None:
            return features
        return features, arrays[self.label]

    def _array(self, spec, size, values, batch):
        count = len(values)
        if spec.encoding in ("bytes", "png", "jpeg"):
            if any(len(v) != 1 for v in values):
                self._refuse(batch)
            if spec.encoding == "bytes":
                return np.array([v[0] for v in values], dtype=object)
            return np.stack([_decode_image(v[0], spec) for v in values])
        if spec.encoding == "raw":
            dtype = np.dtype(spec.dtype)
            joined = b"".join(v[0] if len(v) == 1 else b"" for v in values)
            if len(joined) != count * size * dtype.itemsize or \
                    any(len(v) != 1 for v in values):
                self._refuse(batch)
            return np.frombuffer(joined, dtype).reshape((count,) + spec.shape)
        if any(len(v) != size for v in values):
            self._refuse(batch)
        dtype = np.int64 if spec.encoding == "int64" else np.float32
        if size == 1:
            flat = np.fromiter((v[0] for v in values), dtype, count=count)
        else:
            flat = np.fromiter(itertools.chain.from_iterable(values), dtype,
                               count=count * size)
        return flat.astype(spec.dtype, copy=False).reshape((count,) + spec.shape)

    def _refuse(self, batch):
        """Raises the SchemaError of the first record that does not fit."""
        for data in batch:
            example_codec.decode_example(self.wanted, data)
        raise DataError("a batch's records do not fit the schema, though each one decodes "
                        "alone; this is a bug: please report it.")


class _Batches:
    """Batch number -> that batch's records' bytes (a Grain map over batch
    numbers; pickled into every worker process)."""

    def __init__(self, source, share, batch_size, batches_per_epoch, seed, shuffle):
        self.source, self.share = source, share
        self.batch_size, self.batches_per_epoch = batch_size, batches_per_epoch
        self.seed, self.shuffle = seed, shuffle
        self._order = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_order"] = None
        return state

    def _epoch_order(self, epoch):
        if self._order is None or self._order[0] != epoch:
            order = (self.share[epoch_permutation(len(self.share), self.seed, epoch)]
                     if self.shuffle else self.share)
            self._order = (epoch, order)
        return self._order[1]

    def __call__(self, number):
        epoch, batch = divmod(int(number), self.batches_per_epoch)
        order = self._epoch_order(epoch)
        return self.source.read_many(order[batch * self.batch_size:(batch + 1) * self.batch_size])


def _grain():
    try:
        import grain  # pylint: disable=import-outside-toplevel
    except ImportError:
        raise UsageError("the Grain input pipeline needs Grain: pip install grain "
                         "(or pip install -e '.[jax]' from a checkout).") from None
    return grain


def make_dataset(data, batch_size, *, training, split=None, config=None, num_epochs=None,
                 input_context=None, shard=None, start_batch=0, workers=None, **overrides):
    """The Grain dataset of ``(features, labels)`` batches, as
    :func:`estimator_keras.make_dataset` (same arguments) builds with
    tf.data.

    Training: each epoch a global shuffle of this pipeline's records (or
    file order with ``shuffle="none"``), forever or ``num_epochs`` times,
    from batch ``start_batch`` of the stream on; an epoch's last batch may
    be short. Evaluation: every record once, in file order. ``workers``:
    decoding processes (None: :func:`default_workers`; 0: in this process).
    The tf.data settings that shape its buffers (``shuffle_buffer``,
    ``cycle_length``, ``block_length``, ``parallel_reads``, ``cache``) have
    no part here: reads are by index and the shuffle is global.
    """
    grain = _grain()
    config = dataclasses.replace(config or InputConfig(), **overrides)
    batch_size = int(batch_size)
    if batch_size < 1:
        raise UsageError(f"batch_size must be a positive integer; given {batch_size!r}.")
    if config.skip_corrupt:
        raise UsageError("skip_corrupt is a setting of the tf.data pipeline; the Grain pipeline "
                         "reads records by index and stops at a corrupt one, naming it "
                         "(estimator_keras.verify checks every record of a dataset).")
    resolved = (data if isinstance(data, records.RecordFiles) else
                records.resolve(data, split or ("train" if training else "test")))
    mapping = feature_map(resolved.schema, config.features, config.label)
    num_shards, index = input_order.pipeline_of(input_context, shard)
    files, by_record = input_order.pipeline_files(resolved.files, num_shards, index)
    counts = input_order.file_counts(resolved, files)
    source = ShardedRecords(files, resolved.compression, counts=counts)
    share = _share(source, source.counts, num_shards, index, by_record)
    if training and not len(share):
        raise DataError(f"input pipeline {index} of {num_shards} has no training records "
                        f"(its files: {', '.join(files) or 'none'}): write the split with "
                        f"records in every shard, or train with fewer processes.")
    decoder = BatchDecoder(resolved.schema, mapping, config.label, config.scale)
    per_epoch = max(1, math.ceil(len(share) / batch_size))
    if training:
        seed = config.seed if config.seed is not None else input_order.new_seed()
        start = input_order.position(start_batch, per_epoch, seed)
        if start_batch:
            logger.debug("the training input resumes at %s", start.describe())
        epochs = _FOREVER_EPOCHS if num_epochs is None else int(num_epochs)
        numbers = grain.MapDataset.range(int(start_batch or 0), epochs * per_epoch)
        reader = _Batches(source, share, batch_size, per_epoch, seed,
                          shuffle=config.shuffle != "none")
    else:
        numbers = grain.MapDataset.range(0, per_epoch if len(share) else 0)
        reader = _Batches(source, share, batch_size, per_epoch, 0, shuffle=False)
    batches = numbers.map(reader).map(decoder)
    workers = default_workers() if workers is None else int(workers)
    if not training:
        return batches
    stream = batches.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
    if workers:
        # Batches come back through pipes, not shared memory: Keras never
        # closes the iterator, and the batches still buffered at the end of
        # a fit would stay in /dev/shm until the process exits (a warning then).
        stream = grain.experimental.WithOptionsIterDataset(
            stream, grain.experimental.DatasetOptions(min_shm_size=_NO_SHARED_MEMORY))
        _absl_defaults()
        stream = stream.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers,
                                                                 per_worker_buffer_size=2))
    return stream


def _absl_defaults():
    """Grain's process prefetch reads an absl flag, which absl refuses to
    read before a command line is parsed; this program parses its own
    (argparse), so absl's flags keep their defaults."""
    from absl import flags  # pylint: disable=import-outside-toplevel  (Grain's dependency)
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def make_input_fn(data, batch_size, *, training, split=None, config=None, num_epochs=None,
                  shard=None, start_step=0, resume=None, **overrides):
    """An ``input_fn`` over :func:`make_dataset`, as
    :func:`estimator_keras.make_input_fn` is over tf.data's (the same
    arguments; the files are resolved now)."""
    input_config = dataclasses.replace(config or InputConfig(), **overrides)
    resolved = records.resolve(data, split or ("train" if training else "test"))
    feature_map(resolved.schema, input_config.features, input_config.label)
    return input_order.resumable_input_fn(make_dataset, resolved, batch_size, training,
                                          input_config, num_epochs, shard, start_step, resume)
