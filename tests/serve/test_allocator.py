"""The C heap trimmed on a timer (serve/allocator.py): glibc's free pages go back to the system."""

from __future__ import annotations

import ctypes
import sys
import threading
import time

import pytest

from budgetproxy.serve.allocator import TRIM_THREAD, start_heap_trim

glibc = pytest.mark.skipif(not sys.platform.startswith("linux")
                           or not hasattr(ctypes.CDLL(None), "gnu_get_libc_version"),
                           reason="glibc only")


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))


@glibc
def test_freed_heap_pages_between_kept_blocks_leave_the_process() -> None:
    """Blocks of 200-300 KB (heap-served once glibc's mmap threshold has risen), every other
    one freed: 100 MiB free in the heap, pinned by the blocks kept around them, until a trim."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    libc.free(libc.malloc(8 * 1024 * 1024))  # freed mapped block: the threshold rises to it
    blocks = []
    for i in range(800):
        size = 200 * 1024 + (i % 7) * 16 * 1024
        p = libc.malloc(size)
        ctypes.memset(p, 1, size)  # resident
        blocks.append(p)
    for p in blocks[::2]:
        libc.free(p)
    before = _rss_kib()
    stop = start_heap_trim(0.01)
    assert stop is not None
    try:
        deadline = time.monotonic() + 5
        while _rss_kib() > before - 80 * 1024 and time.monotonic() < deadline:
            time.sleep(0.02)
        after = _rss_kib()
    finally:
        stop.set()
        for p in blocks[1::2]:
            libc.free(p)
    assert before - after >= 80 * 1024, (before, after)  # of the ~100 MiB freed


@glibc
def test_the_trim_thread_stops_when_asked() -> None:
    stop = start_heap_trim(0.01)
    assert stop is not None
    assert any(t.name == TRIM_THREAD for t in threading.enumerate())
    stop.set()
    time.sleep(0.05)
    assert not any(t.name == TRIM_THREAD and t.is_alive() for t in threading.enumerate())
