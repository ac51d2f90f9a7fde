"""The order of a training input pipeline, and where a resumed run picks it up.

A training pipeline serves its records epoch after epoch. Epoch ``e``'s order
(which files come first, how the records are shuffled, the cached batches'
order) is a pure function of the seed and ``e``: every random op of the epoch
is seeded with :func:`epoch_seed`, so nothing depends on how many epochs
this process has served before. Batches do not cross from one epoch into the
next (an epoch's last batch may be short), so a pipeline serves a fixed
number of batches per epoch, :func:`batches_per_epoch`, and the ``n``-th
batch it ever serves is batch ``n % B`` of epoch ``n // B`` whoever serves
it. A run resumed at step ``s`` therefore rebuilds the epoch it stopped in
and skips the batches already consumed (:func:`position`), before they are
parsed; each example is seen once per epoch whatever the step of the stop.

Example::

    from estimator_keras import make_dataset

    # A run that restored a checkpoint of step 1234 (one batch a step):
    ds = make_dataset("/data/fm", 128, training=True, seed=7, start_batch=1234)
"""

import dataclasses
import math
import random

from estimator_keras import io

# Seeds fit TensorFlow's int32 seed range once mixed with the epoch.
SEED_RANGE = 2 ** 31 - 1
_EPOCH_MIX = 1_000_003
# The order in which a cached pipeline reads its files once, to fill the
# cache: not an epoch of its own, so it gets a seed no epoch has.
_FILL_EPOCH = -1
# The second half of every shuffle's seed pair (any constant but 0: (0, 0)
# asks the kernel for a random seed).
_SEED2 = 87654321


def _tf():
    """TensorFlow, for the tf.data half of this module: the order's
    arithmetic (seeds, positions, shares) is also the Grain pipeline's,
    which runs without it."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return tf


def new_seed():
    """A seed for a pipeline given none: its order differs from run to run,
    but within the run every epoch is still a function of (seed, epoch)."""
    return random.SystemRandom().randrange(1, SEED_RANGE)


def epoch_seed(seed, epoch):
    """The int64 seed of ``epoch``'s random ops (a tensor when ``epoch`` is)."""
    if isinstance(epoch, int):
        return (int(seed) * _EPOCH_MIX + epoch) % SEED_RANGE
    tf = _tf()
    return (tf.constant(int(seed), tf.int64) * _EPOCH_MIX + tf.cast(epoch, tf.int64)) % SEED_RANGE


@dataclasses.dataclass(frozen=True)
class Position:
    """Where a training pipeline starts.

    Attributes:
      epoch: the epoch it starts in.
      batch: batches of that epoch already consumed, skipped unparsed.
      batches_per_epoch: the pipeline's batches per epoch, None where the
        record count is unknown (no manifest): a resumed run then starts a
        new epoch order at ``epoch`` = the batches consumed, skipping none.
      seed: the seed of every epoch's order (see :func:`epoch_seed`).
    """

    epoch: int
    batch: int
    batches_per_epoch: int
    seed: int

    def describe(self):
        of = f" of {self.batches_per_epoch}" if self.batches_per_epoch else ""
        return f"epoch {self.epoch}, batch {self.batch}{of} (seed {self.seed})"


def position(start_batch, batches_per_epoch, seed):
    """The :class:`Position` after ``start_batch`` batches served."""
    start_batch = int(start_batch or 0)
    if batches_per_epoch is None:
        return Position(start_batch, 0, None, seed)
    epoch, batch = divmod(start_batch, batches_per_epoch)
    return Position(epoch, batch, batches_per_epoch, seed)


@dataclasses.dataclass(frozen=True)
class PipelineShare:
    """What a ``tf.distribute.InputContext`` tells an input pipeline, made
    without TensorFlow: every pipeline function here takes either."""

    num_input_pipelines: int
    input_pipeline_id: int
    num_replicas_in_sync: int


def pipeline_of(input_context, shard=None):
    """``(num_shards, index)``: the input pipelines sharing the files and
    this one's index, from a ``tf.distribute.InputContext`` or ``shard``."""
    if input_context is not None and input_context.num_input_pipelines > 1:
        return input_context.num_input_pipelines, input_context.input_pipeline_id
    if shard is not None:
        return tuple(shard)
    return 1, 0


def batches_per_step(input_context):
    """Batches a training step takes from each input pipeline: one per
    replica the pipeline feeds."""
    if input_context is None or input_context.num_input_pipelines < 1:
        return 1
    return max(1, input_context.num_replicas_in_sync // input_context.num_input_pipelines)



def resumable_input_fn(make_dataset, resolved, batch_size, training, config, num_epochs,
                       shard, start_step, resume):
    """The ``input_fn`` of a pipeline's ``make_dataset`` over ``resolved``
    (see :func:`estimator_keras.make_input_fn`): it takes what an Estimator
    passes and ``start_step``, from which a training pipeline knows the
    batches consumed (``batches_per_step`` a step, or where ``resume``, an
    :class:`~estimator_keras.order_state.Decision`, says)."""
    resumed_at = start_step

    # Estimator inspects the argument names and passes only those it knows.
    def input_fn(params=None, mode=None, config=None, input_context=None,  # pylint: disable=unused-argument
                 start_step=None):
        step = int((resumed_at if start_step is None else start_step) or 0)
        per_step, index = batches_per_step(input_context), pipeline_of(input_context, shard)[1]
        start_batch = (step * per_step if resume is None else
                       resume.start_batch(index, step, per_step))
        return make_dataset(resolved, batch_size, training=training, config=pipeline_config,
                            num_epochs=num_epochs, input_context=input_context, shard=shard,
                            start_batch=start_batch)

    pipeline_config = config
    input_fn.files = resolved
    return input_fn


def pipeline_files(files, num_shards, index):
    """``(files, by_record)``: what pipeline ``index`` of ``num_shards``
    reads. With at least as many files as pipelines each pipeline reads
    every ``num_shards``-th file; with fewer, every file, keeping every
    ``num_shards``-th record of each (``by_record`` True)."""
    if num_shards <= 1:
        return list(files), False
    if len(files) >= num_shards:
        return list(files)[index::num_shards], False
    return list(files), True


def file_counts(resolved, files):
    """The manifest's record count of each of ``files``, or None where the
    manifest does not count one of them."""
    if resolved.manifest is None:
        return None
    by_name = {}
    for split in resolved.manifest.splits.values():
        for shard in split.shards:
            by_name[io.basename(shard.file)] = shard.num_examples
    counts = [by_name.get(io.basename(path)) for path in files]
    return None if None in counts else counts


def pipeline_examples(resolved, files, num_shards=1, index=0, by_record=False):
    """Records pipeline ``index`` reads in one epoch, from the manifest's
    shard counts; None where a file's count is unknown."""
    counts = file_counts(resolved, files)
    if counts is None:
        return None
    return sum(len(range(index, count, num_shards)) if by_record else count
               for count in counts)


def batches_per_epoch(examples, batch_size):
    """Batches a pipeline serves per epoch (the last one may be short)."""
    if examples is None:
        return None
    return max(1, math.ceil(examples / int(batch_size)))


def epoch_files(files, seed, epoch, shuffle):
    """A tensor of ``files`` in epoch ``epoch``'s order."""
    tf = _tf()
    names = tf.constant(list(files))
    if not shuffle:
        return names
    keys = tf.random.stateless_uniform(
        [len(files)], seed=tf.stack([epoch_seed(seed, epoch), tf.constant(1, tf.int64)]))
    return tf.gather(names, tf.argsort(keys))


def fill_files(files, seed, shuffle):
    """The files in the order a cached pipeline reads them once."""
    tf = _tf()
    return epoch_files(files, seed, tf.constant(_FILL_EPOCH, tf.int64), shuffle)


def shuffled(dataset, buffer_size, seed):
    """``dataset`` through a shuffle buffer of ``buffer_size`` seeded with
    exactly (``seed``, a constant): ``Dataset.shuffle`` would mix
    TensorFlow's global seed into an epoch's seed (and cannot take a seed
    tensor in a graph when that global seed is 0). The op is the one
    ``Dataset.shuffle`` builds, told to keep one order per iterator."""
    tf = _tf()
    spec = tf.nest.flatten(dataset.element_spec)
    variant = tf.raw_ops.ShuffleDatasetV3(
        input_dataset=tf.data.experimental.to_variant(dataset),
        buffer_size=tf.constant(int(buffer_size), tf.int64),
        seed=tf.cast(seed, tf.int64), seed2=tf.constant(_SEED2, tf.int64),
        seed_generator=tf.raw_ops.DummySeedGenerator(),
        output_types=[s.dtype for s in spec], output_shapes=[s.shape for s in spec],
        reshuffle_each_iteration=False)
    return tf.data.experimental.from_variant(variant, dataset.element_spec)


def epochs(position, num_epochs=None):
    """A dataset of epoch numbers from ``position.epoch`` (to ``num_epochs``
    exclusive, or forever)."""
    tf = _tf()
    if num_epochs is None:
        return tf.data.Dataset.counter(start=position.epoch, dtype=tf.int64)
    return tf.data.Dataset.range(position.epoch, int(num_epochs), output_type=tf.int64)


def stream(position, one_epoch, num_epochs=None, overlap=False):
    """The epochs from ``position``, each ``one_epoch(epoch)`` (a dataset of
    batches), with the batches already consumed skipped. With ``overlap``
    the next epoch starts reading (and filling its shuffle buffer) while
    this one is served, in order: no pause at each epoch's start."""
    if overlap:
        served = epochs(position, num_epochs).interleave(
            one_epoch, cycle_length=1, num_parallel_calls=1, deterministic=True)
    else:
        served = epochs(position, num_epochs).flat_map(one_epoch)
    return served.skip(position.batch) if position.batch else served
