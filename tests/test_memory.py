"""estimator_keras.memory: free heap pages go back to the system (glibc), and
the engines hand them back at their checkpoints."""

import json
import platform
import re
import subprocess
import sys

import pytest

from support import ROOT, child_env

# A fragmented heap: 64 KiB blocks (below glibc's mmap threshold) where every
# 16th stays allocated, so the free ones cannot be returned by shrinking the
# heap's top; only a trim hands their pages back.
_CHILD = r"""
import ctypes, json, sys
from benchmarks.output import rss_mb
from estimator_keras import memory

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
blocks = []
for _ in range(4000):
    block = libc.malloc(64 * 1024)
    ctypes.memset(block, 1, 64 * 1024)  # resident
    blocks.append(block)
full = rss_mb()
for i, block in enumerate(blocks):
    if i % 16:
        libc.free(block)
freed = rss_mb()
released = memory.release_free_memory()
print(json.dumps({"full": full, "freed": freed, "trimmed": rss_mb(), "released": released}))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc_trim")
def test_release_free_memory_returns_a_fragmented_heaps_free_pages():
    proc = subprocess.run([sys.executable, "-c", _CHILD], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["released"] is True
    # About 250 MB written, 15/16 of it freed: free() alone keeps it resident
    # (the kept blocks pin the heap), the release hands most of it back.
    assert found["full"] - found["freed"] < 50, found
    assert found["freed"] - found["trimmed"] > 150, found


# Six threads allocate at once: glibc gives each new thread an arena of its
# own until the cap; malloc_stats() lists the arenas on stderr.
_ARENAS = r"""
import ctypes, sys, threading
from estimator_keras import memory
kwargs = eval(sys.argv[1])
print("cap", None if kwargs is None else memory.limit_arenas(**kwargs), flush=True)
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
barrier = threading.Barrier(7)
def work():
    libc.malloc(64 * 1024)
    barrier.wait()
threads = [threading.Thread(target=work) for _ in range(6)]
for t in threads:
    t.start()
barrier.wait()
libc.malloc_stats()
for t in threads:
    t.join()
"""


def _arenas(kwargs, arena_max=None):
    """(the cap limit_arenas(**kwargs) set, or "None"; the arenas of the
    child's seven threads); kwargs None: no call."""
    environ = child_env()
    environ.pop("MALLOC_ARENA_MAX", None)
    if arena_max:
        environ["MALLOC_ARENA_MAX"] = arena_max
    proc = subprocess.run([sys.executable, "-c", _ARENAS, repr(kwargs)], cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.split()[1], len(re.findall(r"^Arena \d+:", proc.stderr, re.M))


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's arenas")
def test_limit_arenas_caps_the_arenas_of_new_threads_unless_the_user_set_it():
    assert _arenas(None)[1] == 7  # without it, one arena per thread
    assert _arenas({"count": 2}) == ("2", 2)
    # The user's MALLOC_ARENA_MAX wins: nothing is set.
    assert _arenas({"count": 2}, arena_max="5") == ("None", 5)


def test_the_estimator_engine_releases_memory_every_interval(monkeypatch):
    pytest.importorskip("tensorflow_estimator")
    from estimator_keras import memory
    from estimator_keras.engines.estimator import engine as estimator

    calls = []
    monkeypatch.setattr(memory, "release_free_memory", lambda: calls.append(1) or True)
    hook = estimator.ReleaseMemoryHook(every_steps=3)
    for _ in range(10):
        hook.after_run(None, None)
    assert len(calls) == 3
