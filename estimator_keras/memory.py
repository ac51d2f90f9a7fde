"""Keeping a long run's heap from creeping up.

TensorFlow's CPU tensors live in the C library's heap. glibc's malloc keeps
the blocks that freed tensors leave in per-thread arenas (up to eight per
core) and reuses them; when a pipeline allocates blocks of changing sizes
every epoch (the runs that ``cache_shuffle="records"`` joins, permutes and
cuts into new batches), the arenas fragment and their free pages stay
resident: the process's memory creeps up epoch after epoch although nothing
is kept (measured in BENCHMARKS.md). Two calls stop it:
:func:`limit_arenas` (one arena per core, before TensorFlow starts its
threads; ``python -m experiments`` calls it first) and
:func:`release_free_memory` (``malloc_trim``: every whole free page back to
the system in a few milliseconds; the engines call it after each
checkpoint). Setting glibc's mmap threshold instead stops the creep too, but
makes every batch a fresh mapping and halves the cached pipeline's speed.
Both are no-ops where the C library is not glibc.
"""

import ctypes
import functools
import os

from estimator_keras import io

# Where no operating-system figure is readable.
FALLBACK_AVAILABLE_MB = 2048
# mallopt's parameter for the most arenas (glibc's malloc.h).
_M_ARENA_MAX = -8


@functools.lru_cache(maxsize=1)
def _glibc():
    try:
        # The C library the process already runs on (None: its own symbols).
        libc = ctypes.CDLL(None)
        return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:
        return None


def release_free_memory():
    """Returns the heap's free pages to the system where the C library is
    glibc; True when it did, False elsewhere (a no-op)."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def limit_arenas(count=None, environ=None):
    """Caps glibc's malloc arenas at ``count`` (default: one per core,
    at least 2) for the threads that start from now on; call it before
    importing TensorFlow. A ``MALLOC_ARENA_MAX`` that the user set wins.
    Returns the cap set, or None when nothing was set."""
    environ = os.environ if environ is None else environ
    libc = _glibc()
    if libc is None or environ.get("MALLOC_ARENA_MAX"):
        return None
    count = int(count or max(2, os.cpu_count() or 1))
    return count if libc.mallopt(_M_ARENA_MAX, count) == 1 else None


def _meminfo_mb(field):
    try:
        for line in io.read_text("/proc/meminfo").splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room_mb():
    """Memory left under this process's cgroup limit (containers), or None."""
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                          "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            text = io.read_text(limit).strip()
            if text == "max" or int(text) >= 1 << 60:
                return None
            return (int(text) - int(io.read_text(usage).strip())) / 2.0 ** 20
        except (OSError, ValueError):
            continue
    return None


def available_memory_mb():
    """``(MB, where the figure comes from)``: MemAvailable from /proc/meminfo,
    lowered to the room left under a cgroup limit; elsewhere the operating
    system's free pages, else half its physical memory, else a fixed guess."""
    found, source = _meminfo_mb("MemAvailable"), "MemAvailable"
    room = _cgroup_room_mb()
    if room is not None and (found is None or room < found):
        found, source = room, "cgroup limit"
    if found is None:
        try:
            found = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2.0 ** 20
            source = "free physical pages"
        except (AttributeError, ValueError, OSError):
            try:
                found = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2.0 ** 21
                source = "half the physical memory"
            except (AttributeError, ValueError, OSError):
                found, source = FALLBACK_AVAILABLE_MB, "no memory figure readable: a guess"
    return max(0.0, found), source
