"""The C heap of the serving process: its free pages returned to the system on a timer.

Kept turns (store/turn_log.py) are request bodies of up to hundreds of KB that live for
minutes, made and freed among bodies of the same sizes that live for one call. glibc serves
large blocks from a mapping of their own only until the first few are freed (its mmap
threshold then rises to their size), so every body comes from the heap, where the long-lived
ones stand between the freed space of the short-lived ones: that space stays resident, and
grows as bodies grow (bench/README.md, the session soak: 20 to 46 MiB free in the heap over
three minutes, with the memory in use level). `malloc_trim` hands the free pages inside the
heap back to the system (they are faulted in again if used). A fixed mmap threshold did the
same for blocks past it but cost 26% more CPU a call with 345 KB bodies (a mapping, its page
faults and its unmapping for every body), so it is not used.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ctypes import _NamedFuncPointer

TRIM_THREAD = "budgetproxy-heap-trim"


def _glibc(name: str) -> _NamedFuncPointer | None:
    """The C library function `name` of this process, or None where it has none (musl,
    macOS, a glibc too old for it)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None)[name]  # the C library this process already runs on
    except (OSError, AttributeError):
        return None


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None (musl, macOS)."""
    trim = _glibc("malloc_trim")
    if trim is None:
        return None
    trim.argtypes = (ctypes.c_size_t,)
    trim.restype = ctypes.c_int
    return trim


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (  # noqa: RUF012 (ctypes reads it)
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def heap_reader() -> Callable[[], tuple[int, int]] | None:
    """A reading of the C heap as (bytes in use, bytes free inside it) from glibc's
    `mallinfo2` (2.33 and later), or None. The free bytes are what fragmentation holds: space
    between blocks in use, most of it handed back to the system by the trim and resident
    again once reused; what is in use is what the process keeps (bodies, long strings)."""
    mallinfo2 = _glibc("mallinfo2")
    if mallinfo2 is None:
        return None
    mallinfo2.argtypes = ()
    mallinfo2.restype = _MallInfo2

    def read() -> tuple[int, int]:
        info = mallinfo2()
        return info.uordblks + info.hblkhd, info.fordblks  # (blocks mapped alone are in use)

    return read


def start_heap_trim(interval_s: float) -> threading.Event | None:
    """Trim the C heap every `interval_s` in a daemon thread (ctypes lets go of the GIL for
    the call, so requests are served meanwhile); set the returned event to stop. None where
    there is no glibc."""
    trim = _malloc_trim()
    if trim is None:
        return None
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(interval_s):
            trim(0)

    threading.Thread(target=run, name=TRIM_THREAD, daemon=True).start()
    return stop
