"""Checking a user's files before a dataset is written from them.

Importers (:mod:`estimator_keras.sources.layouts`,
:mod:`estimator_keras.sources.tfrecords`) read every input once before
writing: the writer needs to know how many examples there are, so a file
that turns out unreadable must be found, and skipped, first. This module
holds what they share: the checks run in worker processes
(:func:`parallel_map`, :func:`check_images`), the record of what was skipped
and why (:class:`Skipped`, :class:`Imported`), the majority votes on size and
channels, and the deterministic split (:func:`hash_split`).
"""

import collections
import dataclasses
import hashlib
import multiprocessing
import sys
import time
from typing import NamedTuple

import numpy as np

from estimator_keras import io
from estimator_keras.errors import DataError
from estimator_keras.sources.images import BadImage, inspect_image, mask_ids, plan_storage

_CHUNK = 64


class Skipped(NamedTuple):
    """One input left out of the dataset: what it is and why."""

    item: str
    reason: str

    def __str__(self):
        return f"{self.item} ({self.reason})"


@dataclasses.dataclass
class Imported:
    """What an importer found: the sources to write and what it left out.

    Attributes:
      splits: dict split name -> source, ready for ``write_dataset``.
      skipped: list of :class:`Skipped`.
      notes: lines for the summary (sizes chosen, images resized...).
      origin: what was read (a folder or a glob), for the manifest.
      unit: what the inputs are ("files", "records"), for the summary.
    """

    splits: dict
    skipped: list
    notes: list
    origin: str
    unit: str = "files"

    def __post_init__(self):
        self.skipped = sorted(self.skipped, key=lambda s: s.item)


def describe_skipped(skipped, limit=10):
    """'N files skipped: a (why), b (why), ... and M more' or ''."""
    if not skipped:
        return ""
    shown = "; ".join(str(s) for s in skipped[:limit])
    more = f"; and {len(skipped) - limit} more" if len(skipped) > limit else ""
    return f"{shown}{more}"


def refuse_skipped(skipped, what):
    """DataError for ``--strict``: the unreadable inputs, named with their reasons."""
    if skipped:
        raise DataError(
            f"{len(skipped)} {what} are not readable and --strict is set: "
            f"{describe_skipped(sorted(skipped))}. Fix or remove them, or drop --strict "
            f"to skip them.")


class Progress:
    """'  LABEL: done/total UNIT (pct)' on stderr, at most every ``interval`` s."""

    def __init__(self, label, total, unit, enabled=True, interval=2.0):
        self.label, self.total, self.unit = label, total, unit
        self.enabled, self.interval = enabled, interval
        self.done, self.shown = 0, time.monotonic()

    def add(self, n):
        self.done += n
        if not self.enabled:
            return
        now = time.monotonic()
        if self.done >= self.total or now - self.shown >= self.interval:
            self.shown = now
            share = 100 * self.done // max(self.total, 1)
            sys.stderr.write(f"  {self.label}: {self.done}/{self.total} {self.unit} "
                             f"({share}%)\n")
            sys.stderr.flush()


def parallel_map(fn, jobs, num_workers=1, on_result=None):
    """``[fn(job) for job in jobs]``, in ``num_workers`` spawned processes when
    more than one; ``on_result(result)`` is called as each one arrives, in
    order. ``fn`` must be a module-level function and jobs picklable."""
    results = []
    if num_workers > 1 and len(jobs) > 1:
        # spawn, not fork: a forked child of a process that already runs
        # TensorFlow's thread pools can deadlock.
        with multiprocessing.get_context("spawn").Pool(min(num_workers, len(jobs))) as pool:
            for result in pool.imap(fn, jobs):
                results.append(result)
                if on_result:
                    on_result(result)
        return results
    for job in jobs:
        results.append(fn(job))
        if on_result:
            on_result(results[-1])
    return results


def _check_chunk(job):
    kind, paths = job
    return [_check_one(kind, path) for path in paths]


def _check_one(kind, path):
    try:
        data = io.read_bytes(path)
    except Exception as e:  # pylint: disable=broad-except  (OSError or TF's remote errors)
        return f"cannot be read ({type(e).__name__}: {str(e)[:200]})"
    try:
        info = inspect_image(data)
    except BadImage as e:
        return str(e)
    if kind != "mask":
        return info
    if info.fmt != "png" or info.palette:
        raise DataError(
            f"masks must be grayscale PNGs whose pixel values are class ids; {path} is "
            f"{'a palette PNG' if info.palette else info.fmt.upper()}. Convert it to "
            f"8-bit grayscale PNG (JPEG blurs class ids; palette colours lose them).")
    return info, int(mask_ids(data, info.depth, path).max(initial=0))


def check_images(paths, kind="image", num_workers=1, progress=True, label="checking",
                 mapper=None):
    """Decodes every file once; for each path its ImageInfo (for ``kind``
    "mask": (ImageInfo, largest class id)) or, when unreadable, a str saying
    why. Masks that are readable but not grayscale PNGs are a DataError.

    ``mapper`` runs the checks instead of :func:`parallel_map` (same
    arguments and result), e.g. as a Beam pipeline."""
    jobs = [(kind, paths[i:i + _CHUNK]) for i in range(0, len(paths), _CHUNK)]
    bar = Progress(label, len(paths), "files", progress)
    chunks = (mapper or parallel_map)(_check_chunk, jobs, num_workers,
                                      lambda part: bar.add(len(part)))
    return [result for chunk in chunks for result in chunk]


def most_common_size(sizes):
    """The most frequent (height, width); ties go to the larger, then taller."""
    counts = collections.Counter(tuple(s) for s in sizes)
    return max(counts, key=lambda s: (counts[s], s[0] * s[1], s[0]))


def majority_channels(greys):
    """1 when most images are grey, else 3 (colour wins a tie)."""
    greys = list(greys)
    return 1 if 2 * sum(map(bool, greys)) > len(greys) else 3


def hash_split(keys, groups, fraction):
    """Which examples go to the test split: in each group (class), the
    ``round(n * fraction)`` whose keys hash lowest, keeping one for training.

    The choice depends only on each key (a file path, a record's place), so it
    is the same on every machine and run, and adding files moves few others.
    """
    n = len(keys)
    digests = np.array([int.from_bytes(hashlib.sha1(str(k).encode("utf-8")).digest()[:8],
                                       "big") for k in keys], dtype=np.uint64)
    groups = np.asarray(groups, dtype=np.int64)
    order = np.lexsort((digests, groups))
    test = np.zeros(n, dtype=bool)
    bounds = np.flatnonzero(np.diff(groups[order])) + 1
    for members in np.split(order, bounds) if n else []:
        take = min(int(len(members) * fraction + 0.5), len(members) - 1)
        test[members[:take]] = True
    return test


def size_note(what, size, chosen_by_user, sizes):
    """A summary line on the size chosen and how many inputs it resizes."""
    resized = sum(1 for s in sizes if tuple(s) != tuple(size))
    how = "as asked" if chosen_by_user else "the most common size"
    return (f"{what} {size[0]}x{size[1]} ({how}; {resized} of {len(sizes)} "
            f"resized)")


def channels_note(what, channels, chosen_by_user, greys, total):
    """A summary line on the channels chosen and how many inputs are grey."""
    how = "as asked" if chosen_by_user else "what most are"
    return f"{what} channels {channels} ({how}; {greys} of {total} grey)"


def plan_images(infos, image_size=None, channels=None, stored=""):
    """(size, channels, encoding, re-encode flags, summary lines) for images:
    ``image_size`` and ``channels`` when given, else the most common size and
    what most images are; the encoding is :func:`plan_storage`'s."""
    size = image_size or most_common_size(i.size for i in infos)
    chosen = channels or majority_channels(i.grey for i in infos)
    encoding, reencode = plan_storage(infos, chosen, size)
    notes = [size_note("image", size, image_size is not None, [i.size for i in infos]),
             channels_note("image", chosen, channels, sum(i.grey for i in infos), len(infos))
             + f", stored as {encoding}{stored}"]
    return size, chosen, encoding, reencode, notes
