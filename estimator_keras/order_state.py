"""The input order a model dir's checkpoints continue, stored beside them.

A resumed run continues its training input where its checkpoint's step left
it (:mod:`estimator_keras.input_order`) only under the settings that fixed
the order: the seed, the batch sizes, each input pipeline's share of the
files and its batches per epoch, the cache decision, the shuffle settings
and the train split's shards. ``MODEL_DIR/input_order.json`` stores them in
*segments*: a segment starts at a step, holds the settings and the batches
each pipeline had consumed at that step, and describes every checkpoint from
its step until the next segment's (a step takes ``batches_per_step`` batches
from each pipeline). A run stores its segment, written to a temporary name
and renamed, before it trains a step under it, so the order of every
checkpoint is on disk before the checkpoint is.

Settings that fix nothing (``shuffle_buffer`` without a shuffle,
``cache_shuffle`` without a cache) are compared as absent. A rerun
(:func:`decide`) whose settings match its checkpoint's segment continues
exactly; one whose settings differ is refused
(:class:`OrderChangedError`, exit 2, the model dir untouched) or, asked to
(``restart``), starts a fresh order at the next epoch boundary in a new
segment. A model dir of checkpoints older than this file resumes at the
position derived from the step, as before, and gets its segment then.
Each segment also stores the learning rate its steps train under (a
resumed run says where its cosine decay's horizon moved); a rerun under
another one stores a segment from its step, the order unchanged.

Example::

    from estimator_keras import order_state

    decision = order_state.decide("runs/fm", 1234, settings)
    print(decision.message)   # "the input continues at epoch 2, batch 56 of 469 ..."
    decision.store("runs/fm")
"""

import dataclasses
import hashlib
import json
import math

from estimator_keras import input_order, io
from estimator_keras.engines.optimizers import Schedule
from estimator_keras.errors import ModelDirError, UsageError

FILE = "input_order.json"
VERSION = 1
# The flag that starts a fresh order instead of refusing a changed one.
RESTART_FLAG = "--restart-order"
SHUFFLE_FIELDS = ("shuffle", "shuffle_buffer", "cache_shuffle", "cycle_length", "block_length")


class OrderChangedError(ModelDirError, UsageError):
    """A rerun whose input order settings differ from those its checkpoint
    was trained with (exit 2). ``changed``: ``(setting, stored, new)``."""

    keep_lines = True

    def __init__(self, message, changed=()):
        super().__init__(message)
        self.changed = list(changed)


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """One input pipeline's share: its files, examples and batches per epoch
    (None where the manifest does not count them)."""

    files: int
    examples: int = None
    batches_per_epoch: int = None


@dataclasses.dataclass(frozen=True)
class Settings:
    """What fixes a training input's order, for every pipeline of a run.

    Attributes:
      seed: the seed of every epoch's order (None: a new one each run).
      batch_size: examples per batch of each pipeline.
      global_batch_size: examples per step, all replicas together.
      batches_per_step: batches a step takes from each pipeline.
      asynchronous: parameter-server workers, each at its own pace.
      pipelines: a :class:`Pipeline` per input pipeline, in index order.
      cache: the cache decision (True, False: cache="auto" resolved).
      shuffle, shuffle_buffer, cache_shuffle, cycle_length, block_length:
        as in :class:`~estimator_keras.inputs.InputConfig`.
      dataset: a fingerprint of the train split's shards (:func:`fingerprint`).
      pipeline: the input pipeline that reads them, "tfdata" or "grain"
        (their orders differ; a file from before the field is tf.data's).
    """

    seed: int
    batch_size: int
    global_batch_size: int
    batches_per_step: int
    asynchronous: bool
    pipelines: tuple
    cache: bool
    shuffle: str
    shuffle_buffer: int
    cache_shuffle: str
    cycle_length: int
    block_length: int
    dataset: str
    pipeline: str = "tfdata"

    def to_dict(self):
        out = dataclasses.asdict(self)
        out["pipelines"] = [dataclasses.asdict(p) for p in self.pipelines]
        return out

    @classmethod
    def from_dict(cls, obj):
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in obj.items() if k in fields}
        values["pipelines"] = tuple(Pipeline(**p) for p in obj.get("pipelines") or ())
        missing = {f.name for f in dataclasses.fields(cls)
                   if f.default is dataclasses.MISSING} - set(values)
        if missing:
            raise ValueError(f"missing {', '.join(sorted(missing))}")
        return cls(**values)

    def counted(self):
        """Whether every pipeline's batches per epoch are known."""
        return all(p.batches_per_epoch for p in self.pipelines)

    def in_effect(self):
        """These settings with those that fix nothing set to None:
        ``shuffle_buffer`` without a shuffle, ``cache_shuffle`` without a
        cache or a shuffle (``cache`` and ``cache_shuffle`` are stored
        resolved, "auto" decided), and tf.data's buffers under Grain, whose
        shuffle is global. Compared this way, a file stored with their
        values reads as one without."""
        shuffled = self.shuffle != "none"
        if self.pipeline == "grain":
            # One global shuffle whatever tf.data's shuffle mode says, or none.
            return dataclasses.replace(
                self, shuffle="none" if self.shuffle == "none" else "global",
                shuffle_buffer=None, cache_shuffle=None, cache=False, cycle_length=None,
                block_length=None)
        return dataclasses.replace(
            self, shuffle_buffer=self.shuffle_buffer if shuffled else None,
            cache_shuffle=self.cache_shuffle if shuffled and self.cache else None)


def fingerprint(resolved):
    """A short hash of the files a training input reads: each file's name,
    examples and bytes as the manifest records them (name and size on disk
    without a manifest), and when the manifest was written. Re-preparing
    (other shards, records or counts, or the same sizes with other records)
    changes it; a copy of the dataset elsewhere does not."""
    counts, made = {}, None
    if resolved.manifest is not None:
        for split in resolved.manifest.splits.values():
            for shard in split.shards:
                counts[io.basename(shard.file)] = [shard.num_examples, shard.num_bytes]
        # Fixed-size records (every built-in image) give a re-prepared split
        # the same names, counts and bytes: the manifest's own making (its
        # writer's time, to the microsecond) tells.
        made = (resolved.manifest.created or {}).get("time")
    shards = []
    for path in resolved.files:
        name = io.basename(path)
        shards.append([name, *counts.get(name, [None, io.size(path)])])
    digest = hashlib.sha256(json.dumps([shards, made], sort_keys=True).encode()).hexdigest()
    examples = sum(s[1] or 0 for s in shards)
    return f"{len(shards)} file(s), {examples:,} examples, sha256 {digest[:12]}"


def pipelines(resolved, num_pipelines, batch_size):
    """The :class:`Pipeline` of each of ``num_pipelines`` sharing ``resolved``'s files."""
    out = []
    for index in range(num_pipelines):
        files, by_record = input_order.pipeline_files(resolved.files, num_pipelines, index)
        examples = input_order.pipeline_examples(resolved, files, num_pipelines, index,
                                                 by_record)
        out.append(Pipeline(len(files), examples,
                            input_order.batches_per_epoch(examples, batch_size)))
    return tuple(out)


# ------------------------------------------------------------------ the stored segments

@dataclasses.dataclass(frozen=True)
class Segment:
    """The order from ``step`` on: ``starts[i]``, the batches pipeline ``i``
    had consumed at ``step``, and the :class:`Settings`; ``schedule``: the
    learning rate the steps from ``step`` on train under (an
    :class:`~estimator_keras.engines.optimizers.Schedule`; None in files
    written before it was stored). It fixes no order: a resumed run whose
    cosine decay ends elsewhere says so (:func:`~estimator_keras.engines.
    optimizers.schedule_changed`), and stores its own from its step."""

    step: int
    starts: tuple
    settings: Settings
    schedule: Schedule = None

    def consumed(self, index, step):
        """Batches pipeline ``index`` has consumed at ``step`` (synchronous runs)."""
        return self.starts[index] + (int(step) - self.step) * self.settings.batches_per_step

    def to_dict(self):
        out = {"step": self.step, "starts": list(self.starts),
               "settings": self.settings.to_dict()}
        if self.schedule is not None:
            out["schedule"] = dataclasses.asdict(self.schedule)
        return out


def path(model_dir):
    return io.join(model_dir, FILE)


def load(model_dir):
    """The model dir's segments, oldest first ([] when it has none)."""
    where = path(model_dir)
    if not io.exists(where):
        return []
    try:
        obj = json.loads(io.read_text(where))
        if obj.get("version") != VERSION:
            raise ValueError(f"version {obj.get('version')!r}, where this package writes "
                             f"{VERSION}")
        segments = [_checked(Segment(s["step"], tuple(s["starts"]),
                                     Settings.from_dict(s["settings"]),
                                     Schedule(**s["schedule"]) if s.get("schedule") else None))
                    for s in obj["segments"]]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ModelDirError(
            f"{where} is not a valid record of the input order ({e}); move it aside to "
            f"resume at the position derived from the checkpoint's step.") from e
    return sorted(segments, key=lambda s: s.step)


def _checked(segment):
    """``segment`` when its numbers can place a batch; ValueError naming the
    first that cannot (a hand-edited file)."""
    def whole(value, what, least=0):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"{what} is {value!r}, not a whole number >= {least}")
    whole(segment.step, "a segment's step")
    pipelines = segment.settings.pipelines
    if not pipelines or len(segment.starts) != len(pipelines):
        raise ValueError(f"the segment of step {segment.step} has {len(segment.starts)} "
                         f"start(s) for {len(pipelines)} pipeline(s)")
    for start in segment.starts:
        whole(start, f"a start of the segment of step {segment.step}")
    for pipeline in pipelines:
        whole(pipeline.batches_per_epoch, "a pipeline's batches_per_epoch")
        whole(pipeline.examples, "a pipeline's examples")
    whole(segment.settings.batch_size, "batch_size", 1)
    whole(segment.settings.batches_per_step, "batches_per_step", 1)
    schedule = segment.schedule
    if schedule is not None:
        if schedule.max_steps is not None:
            whole(schedule.max_steps, "a schedule's max_steps", 1)
        if schedule.learning_rate is not None and (
                isinstance(schedule.learning_rate, bool)
                or not isinstance(schedule.learning_rate, (int, float))):
            raise ValueError(f"a schedule's learning_rate is {schedule.learning_rate!r}, not a "
                             f"number")
    return segment


def store(model_dir, segments):
    """Writes ``segments`` to ``MODEL_DIR/input_order.json`` atomically."""
    io.makedirs(model_dir)
    io.atomic_write(path(model_dir), json.dumps(
        {"version": VERSION, "segments": [s.to_dict() for s in segments]}, indent=1) + "\n")


# ------------------------------------------------------------------ a rerun's decision

@dataclasses.dataclass(frozen=True)
class Decision:
    """Where a run's input starts, and what it stores.

    Attributes:
      step: the checkpoint's step (0: a fresh run).
      starts: batches each pipeline has consumed at ``step``: its input skips
        them (see :meth:`start_batch`).
      how: "fresh", "continues", "derived" (no stored order), "restarts"
        (settings changed, ``restart``), "new order" (no seed or counts),
        "approximate" (``--skip-corrupt``), "asynchronous" (ps workers).
      message: the log line of a resumed run (None for a fresh one).
      segments: the segments to store before training (None: as they are).
      trained_schedule: the learning rate the checkpoint's last step
        trained under, as stored (None: not stored, or a fresh run).
    """

    step: int
    starts: tuple
    how: str
    message: str = None
    segments: list = None
    trained_schedule: Schedule = None

    def start_batch(self, index, step, batches_per_step):
        """Batches pipeline ``index`` has consumed at ``step`` (its input
        skips them), ``batches_per_step`` a step."""
        base = self.starts[index] if index < len(self.starts) else self.starts[-1]
        return base + max(0, int(step) - self.step) * int(batches_per_step)

    def store(self, model_dir):
        if self.segments is not None:
            store(model_dir, self.segments)


def _changes(stored, new):
    """``(setting, stored, new)`` for each setting that fixes the order and
    differs, compared as in effect (:meth:`Settings.in_effect`)."""
    stored, new = stored.in_effect(), new.in_effect()
    out = []
    for name, label in (("seed", "seed"), ("batch_size", "batch_size"),
                        ("global_batch_size", "global batch (batch_size x replicas)"),
                        ("asynchronous", "parameter-server workers")):
        if getattr(stored, name) != getattr(new, name):
            out.append((label, getattr(stored, name), getattr(new, name)))
    if stored.batch_size != new.batch_size:
        # The global batch and the batches per epoch follow from it.
        out = [c for c in out if not c[0].startswith("global batch")]
    if len(stored.pipelines) != len(new.pipelines):
        out.append(("input pipelines", len(stored.pipelines), len(new.pipelines)))
    elif stored.pipelines != new.pipelines and stored.batch_size == new.batch_size \
            and stored.dataset == new.dataset:
        out.append(("batches per epoch of each pipeline",
                    [p.batches_per_epoch for p in stored.pipelines],
                    [p.batches_per_epoch for p in new.pipelines]))
    if stored.pipeline != new.pipeline:
        out.append(("input pipeline (data.pipeline)", stored.pipeline, new.pipeline))
    if stored.cache != new.cache:
        out.append(("cache decision (data.cache)", stored.cache, new.cache))
    for name in SHUFFLE_FIELDS:
        old_value, new_value = getattr(stored, name), getattr(new, name)
        # A setting in effect on one side only: the shuffle or cache change
        # that turned it on or off is named already.
        if old_value != new_value and None not in (old_value, new_value):
            out.append((f"data.{name}", old_value, new_value))
    if stored.dataset != new.dataset:
        out.append(("dataset (the train split's shards)", stored.dataset, new.dataset))
    return out


def _where(settings, consumed):
    """"epoch 2, batch 56 of 469", with "(pipeline i)" after each where there are several."""
    places = []
    for pipeline, n in zip(settings.pipelines, consumed):
        epoch, batch = divmod(n, pipeline.batches_per_epoch)
        places.append(f"epoch {epoch}, batch {batch} of {pipeline.batches_per_epoch}")
    if len(places) == 1:
        return places[0]
    return "; ".join(f"{p} (pipeline {i})" for i, p in enumerate(places))


def _next_epoch(settings, consumed):
    """The first epoch no pipeline has started: where a fresh order begins."""
    return max(math.ceil(n / p.batches_per_epoch) for p, n in zip(settings.pipelines, consumed))


def _covering(segments, step):
    """The segments that may describe the checkpoint of ``step``, newest
    first: the last one starting at or before it, and, where that one starts
    at ``step`` itself (no step trained under it yet), the one before."""
    before = [s for s in segments if s.step <= step]
    if before and before[-1].step == step and len(before) > 1:
        return [before[-1], before[-2]]
    return before[-1:]


def stored_cache(model_dir, step, pipeline="tfdata"):
    """The cache decision stored for the checkpoint of ``step``, or None
    (also where another input ``pipeline`` made it: Grain never caches)."""
    found = _covering(load(model_dir), step) if step else []
    if not found or found[0].settings.pipeline != pipeline:
        return None
    return found[0].settings.cache


def decide(model_dir, step, settings, restart=False, approximate=False, schedule=None):
    """The :class:`Decision` of a run at checkpoint ``step`` (0: none) with
    ``settings`` and learning rate ``schedule`` (stored with the order; None:
    not stored); ``approximate``: records may be dropped (--skip-corrupt).
    Raises :class:`OrderChangedError` where the settings changed and
    ``restart`` is False."""
    step = int(step or 0)
    segments = load(model_dir) if step else []
    kept = [s for s in segments if s.step < step]
    decision = _decide(model_dir, step, settings, restart, approximate, schedule, segments, kept)
    # The segment the checkpoint's last step was trained in.
    return dataclasses.replace(decision, trained_schedule=kept[-1].schedule if kept else None)


def _decide(model_dir, step, settings, restart, approximate, schedule, segments, kept):
    n = len(settings.pipelines)
    if not step:
        return Decision(0, (0,) * n, "fresh",
                        segments=[Segment(0, (0,) * n, settings, schedule)])
    if settings.asynchronous:
        return _asynchronous(step, settings, kept, schedule)
    found = _covering(segments, step)
    match = next((s for s in found if not _changes(s.settings, settings)), None)
    if match is None and found:
        stored = found[0]
        consumed = [stored.consumed(i, step) for i in range(len(stored.starts))]
        changed = _changes(stored.settings, settings)
        if not restart:
            raise _refusal(model_dir, step, stored, changed)
        if stored.settings.counted() and settings.counted():
            epoch = _next_epoch(stored.settings, consumed)
            starts = tuple(epoch * p.batches_per_epoch for p in settings.pipelines)
            where = f"epoch {epoch}, the next epoch boundary"
        else:
            starts, where = (step * settings.batches_per_step,) * n, "a new epoch"
        shown = "; ".join(f"{name} {old!r} -> {new!r}" for name, old, new in changed)
        return Decision(step, starts, "restarts", (
            f"resuming at step {step}: the input order's settings changed ({shown}); "
            f"{RESTART_FLAG}: the input starts a fresh order at {where}, not the stopped "
            f"epoch's"), kept + [Segment(step, starts, settings, schedule)])
    if match is not None:
        starts = tuple(match.consumed(i, step) for i in range(n))
        # Segments past the checkpoint (or one of its step this run does not
        # match) describe steps no checkpoint holds any longer.
        wanted = kept + ([match] if match.step == step else [])
        if schedule is not None and match.schedule != schedule:
            # The steps from here train under this run's learning rate.
            wanted = kept + [Segment(step, starts, settings, schedule)]
        segments_out = None if wanted == segments else wanted
        how, source = "continues", "stored"
    else:
        starts = (step * settings.batches_per_step,) * n
        if restart and settings.counted():
            # No stored order to compare with: what the step consumed under
            # other settings is unknown, so a fresh order begins past it.
            epoch = _next_epoch(settings, starts)
            starts = tuple(epoch * p.batches_per_epoch for p in settings.pipelines)
            return Decision(step, starts, "restarts", (
                f"resuming at step {step}: the model dir stores no input order for this "
                f"checkpoint, so whether its settings changed is unknown; {RESTART_FLAG}: the "
                f"input starts a fresh order at epoch {epoch}, past every batch this step can "
                f"have consumed at this run's batch size"),
                kept + [Segment(step, starts, settings, schedule)])
        segments_out = kept + [Segment(step, starts, settings, schedule)]
        how, source = "derived", "derived"
    if settings.seed is None:
        return _new_order(step, settings, starts, segments_out,
                          "without a seed (train.seed is None): the input starts a new order")
    if not settings.counted():
        return _new_order(step, settings, starts, segments_out,
                          "the dataset has no example counts, so the input starts a new epoch "
                          "order")
    where = _where(settings, starts)
    if source == "derived":
        tail = (f"; the position is derived from the step and this run's settings: the model "
                f"dir stores no input order for this checkpoint (it was written before {FILE}, "
                f"or the file was removed), so a setting changed since is not detected "
                f"({RESTART_FLAG} starts a fresh order past it instead)")
    else:
        tail = f"; the position and settings are stored in {FILE}"
    if approximate:
        return Decision(step, starts, "approximate", (
            f"resuming at step {step}: the input resumes at about {where} (seed "
            f"{settings.seed}): --skip-corrupt drops unreadable records, which shortens epochs "
            f"below the manifest's counts, so the position is approximate; it never skips a "
            f"batch not consumed, and may serve some again{tail}"), segments_out)
    return Decision(step, starts, how, (
        f"resuming at step {step}: the input continues at {where} (seed {settings.seed}), "
        f"skipping the consumed batches unparsed{tail}"), segments_out)


def _new_order(step, settings, starts, segments_out, why):
    return Decision(step, starts, "new order",
                    f"resuming at step {step} {why}, not the stopped epoch's", segments_out)


def _asynchronous(step, settings, kept, schedule):
    """Parameter-server workers: the global step counts every worker's
    steps, and no checkpoint says how many each took. Each starts a fresh
    epoch of its share, the one after an even share of the steps reaches,
    skipping nothing."""
    tasks = len(settings.pipelines)
    share = step // tasks
    if settings.counted():
        epochs = [math.ceil(max(1, share) / p.batches_per_epoch) for p in settings.pipelines]
        starts = tuple(e * p.batches_per_epoch for e, p in zip(epochs, settings.pipelines))
        where = ", ".join(f"epoch {e}" for e in epochs)
    else:
        starts, where = (step,) * tasks, "a new epoch"
    return Decision(step, starts, "asynchronous", (
        f"resuming at step {step} on parameter-server workers: each takes batches at its own "
        f"pace and the checkpoint does not say how many each took, so each worker starts a "
        f"fresh epoch of its share ({where}: after an even share of {share} steps), skipping "
        f"nothing; the stopped epochs are not completed"),
        kept + [Segment(step, starts, settings, schedule)])


def _refusal(model_dir, step, stored, changed):
    shown = "; ".join(f"{name}: stored {old!r}, now {new!r}" for name, old, new in changed)
    return OrderChangedError(
        f"{model_dir}'s checkpoint of step {step} continues an input order whose settings "
        f"this run changes: {shown} (stored in {path(model_dir)} at step {stored.step}).\n"
        f"Continuing at its step under them would skip examples never trained on or serve "
        f"others twice.\n"
        f"Rerun with the stored settings to continue exactly, or add {RESTART_FLAG} to start "
        f"a fresh order at the next epoch boundary.", changed)
