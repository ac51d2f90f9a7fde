"""Handing freed heap memory back to the system during long runs.

TensorFlow's CPU tensors live in the C library's heap. glibc's malloc keeps
the blocks that freed tensors leave in per-thread arenas and reuses them; when
a pipeline allocates blocks of changing sizes every epoch (the runs that
``cache_shuffle="records"`` joins, permutes and cuts into new batches), the
arenas fragment and the free pages in them stay resident: the process's memory
creeps up epoch after epoch although nothing is kept (measured in
BENCHMARKS.md). ``malloc_trim(0)`` returns every whole free page of every arena
to the system in a few milliseconds, so the engines call
:func:`release_free_memory` after each checkpoint. Setting glibc's mmap
threshold instead stops the creep too, but makes every batch a fresh mapping
and halves the cached pipeline's speed.
"""

import ctypes
import functools


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    try:
        # The C library the process already runs on (None: its own symbols).
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None  # not glibc (musl, macOS): nothing to call


def release_free_memory():
    """Returns the heap's free pages to the system where the C library is
    glibc; True when it did, False elsewhere (a no-op)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
