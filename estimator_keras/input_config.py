"""How an input pipeline reads and shapes examples: :class:`InputConfig`,
shared by the tf.data pipeline (:mod:`estimator_keras.inputs`) and the Grain
one (:mod:`estimator_keras.grain_inputs`); it imports no TensorFlow.

Example::

    from estimator_keras.input_config import InputConfig

    config = InputConfig(features={"image": "image"}, shuffle="record", seed=7)
"""

import dataclasses
import math

import numpy as np

from estimator_keras import io
from estimator_keras.errors import UsageError
from estimator_keras.manifest import SHARD_RE
from estimator_keras.memory import available_memory_mb
from estimator_keras.schema import IMAGE_ENCODINGS

SHUFFLE_MODES = ("batch", "record", "none")
CACHE_MODES = (False, True, "auto")
CACHE_SHUFFLES = ("auto", "batches", "records")
# cache="auto" without cache_budget_mb: this share of the available memory.
AUTO_CACHE_SHARE = 0.25
# tf.data's autotuned buffers (the final prefetch above all, which grows each
# time training finds it empty and never shrinks) may hold this many served
# batches, and at least AUTOTUNE_RAM_FLOOR_MB; TensorFlow's own budget is half
# the machine's memory.
AUTOTUNE_RAM_BATCHES = 16
AUTOTUNE_RAM_FLOOR_MB = 16


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
      cache: False (default), True or "auto". True keeps one epoch of parsed
        batches in memory, in the records' own dtypes (uint8 images stay
        uint8; the float32 cast and ``scale`` come after the cache), and
        serves every later epoch from it; in training the cached batches are
        shuffled over the whole epoch, a new order each epoch (see
        ``cache_shuffle``), so the first batch comes once the first epoch is
        read. Memory grows during the first epoch only. "auto" caches when
        that epoch's size in memory, computed from the manifest, fits
        ``cache_budget_mb``, and logs the decision with its reason. Each
        input pipeline caches only its own share of the files.
      cache_budget_mb: the budget of cache="auto", in MB per pipeline; None:
        a quarter of the memory available when the pipeline is built.
      cache_shuffle: what a cached training pipeline shuffles every epoch.
        "batches": the cached batches in a new order; which records share a
        batch stays as the first epoch formed them (the cheapest). "records":
        new batches every epoch: the epoch's batches, in their new order, are
        joined in runs of ``shuffle_buffer`` records (shuffle="record") or
        ``shuffle_buffer`` batches (shuffle="batch"), their records permuted
        and cut into batches again (memory copies of whole runs, no
        per-record work). "auto" (default): "records" with shuffle="record",
        "batches" otherwise. Uncached pipelines form new batches every epoch
        whatever this says.
      autotune_ram_mb: the RAM budget of tf.data's autotuning
        (``tf.data.Options().autotune.ram_budget``) for the buffers it sizes
        itself, the final prefetch above all; None (default): 16 served
        batches, at least 16 MB. TensorFlow's own default, half the
        machine's memory, lets the prefetch buffer grow every time training
        catches up with it, epoch after epoch.
      skip_corrupt: drop records that fail to read (CRC mismatch, truncation)
        instead of failing; a batch holding a record that reads but does not
        parse to the schema is dropped whole (parsing is one op per batch).
      seed: seeds shuffling; None for a different order every run.
      cache_decided: ``(cache?, reason)`` of cache="auto" in training, decided
        by the caller (a resumed run keeps its stored decision); None: here.
    """

    features: object = None
    label: str = "label"
    scale: float = None
    shuffle: str = "batch"
    shuffle_buffer: int = 64
    cycle_length: int = 4
    block_length: int = 16
    parallel_reads: bool = False
    cache: object = False
    cache_budget_mb: float = None
    cache_shuffle: str = "auto"
    autotune_ram_mb: float = None
    skip_corrupt: bool = False
    seed: int = None
    cache_decided: tuple = None

    def __post_init__(self):
        if self.shuffle not in SHUFFLE_MODES:
            raise UsageError(f"shuffle must be one of {', '.join(SHUFFLE_MODES)}; "
                             f"given {self.shuffle!r}.")
        for name in ("shuffle_buffer", "cycle_length", "block_length"):
            if int(getattr(self, name)) < 1:
                raise UsageError(f"{name} must be a positive integer; given "
                                 f"{getattr(self, name)!r}.")
        if self.cache != "auto":
            if self.cache not in (True, False):
                raise UsageError(f"cache must be True, False or \"auto\"; given "
                                 f"{self.cache!r}.")
            self.cache = bool(self.cache)
        if self.cache_budget_mb is not None and not float(self.cache_budget_mb) > 0:
            raise UsageError(f"cache_budget_mb must be a positive number of MB (or None "
                             f"for a quarter of the available memory); given "
                             f"{self.cache_budget_mb!r}.")
        if self.cache_shuffle not in CACHE_SHUFFLES:
            raise UsageError(f"cache_shuffle must be one of {', '.join(CACHE_SHUFFLES)}; "
                             f"given {self.cache_shuffle!r}.")
        if self.cache_shuffle == "records" and self.shuffle == "none":
            raise UsageError("cache_shuffle=\"records\" shuffles records and shuffle=\"none\" "
                             "asks for none: choose shuffle=\"batch\" or \"record\", or "
                             "cache_shuffle=\"auto\".")
        if self.autotune_ram_mb is not None and not float(self.autotune_ram_mb) > 0:
            raise UsageError(f"autotune_ram_mb must be a positive number of MB (or None "
                             f"for {AUTOTUNE_RAM_BATCHES} batches); given "
                             f"{self.autotune_ram_mb!r}.")

    def reforms_batches(self):
        """Whether a cached training pipeline forms new batches every epoch."""
        if self.cache_shuffle == "auto":
            return self.shuffle == "record"
        return self.cache_shuffle == "records"


# --------------------------------------------------------------------------- cache sizing

def example_bytes(schema, names, record_bytes=None):
    """Bytes that one example's ``names`` features take in memory once parsed
    and decoded, before any float32 cast (what the cache holds). Opaque
    ``bytes`` features count as ``record_bytes`` each (the serialized
    record's size: a bound), or 0 when unknown."""
    total = 0
    for name in names:
        f = schema[name]
        if f.encoding == "bytes":
            total += int(record_bytes or 0)
        elif f.encoding == "float":
            total += 4 * f.size
        elif f.encoding in IMAGE_ENCODINGS:
            total += f.size
        else:
            total += np.dtype(f.dtype).itemsize * f.size
    return total


def _split_of(resolved):
    """The split a manifest's shard names say these files hold, or None."""
    match = SHARD_RE.match(io.basename(resolved.files[0])) if resolved.files else None
    return match.group("split") if match else None


def _describe(resolved):
    where = io.parent(resolved.files[0]) if resolved.files else "?"
    split = _split_of(resolved)
    return f"split {split!r} of {where}" if split else f"{len(resolved.files)} file(s) in {where}"


def mean_record_bytes(resolved):
    """Mean serialized size of a record, from the manifest, or None."""
    split = _split_of(resolved)
    if resolved.manifest is None or split not in resolved.manifest.splits:
        return None
    return sum(s.num_bytes for s in resolved.manifest.splits[split].shards) / resolved.num_examples


def cache_decision(config, resolved, names, num_shards=1):
    """``(cache?, reason)`` for ``config.cache`` over ``resolved``'s records,
    ``names`` being the features a pipeline keeps and ``num_shards`` the
    number of pipelines sharing the files. The reason is one line."""
    if config.cache != "auto":
        return config.cache, f"cache={config.cache}"
    what = _describe(resolved)
    if num_shards > 1:
        what += f", share 1/{num_shards}"
    if not resolved.num_examples:
        return False, (f"cache=auto: not caching {what}: its size is unknown (no manifest "
                       f"with example counts)")
    per_example = example_bytes(resolved.schema, names, mean_record_bytes(resolved))
    examples = math.ceil(resolved.num_examples / num_shards)
    need_mb = examples * per_example / 2.0 ** 20
    if config.cache_budget_mb is not None:
        budget_mb = float(config.cache_budget_mb)
        source = f"{_mb(budget_mb)} MB (cache_budget_mb)"
    else:
        available, where = available_memory_mb()
        budget_mb = AUTO_CACHE_SHARE * available
        source = f"{_mb(budget_mb)} MB = a quarter of the {_mb(available)} MB available ({where})"
    fits = need_mb <= budget_mb
    return fits, (f"cache=auto: {'caching' if fits else 'not caching'} {what}: "
                  f"{_mb(need_mb)} MB in memory ({examples:,} examples x {per_example:,} "
                  f"bytes) {'fits' if fits else 'exceeds'} the budget of {source}")


def _mb(value):
    return f"{value:,.1f}" if value >= 1 else f"{value:.2g}"
