"""Returning freed memory to the operating system, how much there is, and the
garbage collector kept off the caller's objects while a load runs.

glibc keeps freed heap memory (the parser's growable buffers, arrays replaced by
a shuffle) for reuse instead of returning it; on a 1M-record Criteo load that is
~100 bytes per record of resident memory that nothing uses (measured: RSS delta
368 bytes/record before ``malloc_trim``, 268 after, the store's exact size).
Paddle users report the same symptom after ``release_memory`` (Paddle #72527).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import os
import sys
import threading
from collections.abc import Iterator

# Where a container's memory limit is (cgroup v2, then v1), seen from inside it.
_CGROUP_LIMITS = (
    "/sys/fs/cgroup/memory.max",
    "/sys/fs/cgroup/memory/memory.limit_in_bytes",
)


def _load_malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (e.g. musl): nothing to trim
        return None


_malloc_trim = _load_malloc_trim()

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def return_large_blocks(threshold: int = 1 << 20) -> bool:
    """Makes glibc map every block of ``threshold`` bytes or more on its own,
    returned to the OS when freed, and give back heap tops past it: for a
    process (a parameter server) whose requests allocate and free blocks of
    megabytes on many threads. glibc otherwise raises its mapping threshold
    after such frees, to 32 MiB, and keeps the blocks in per-thread heaps
    (measured: a server holding 10M rows grew 110.8 bytes a row, 98.5 with
    this). Whether it was set (False: not glibc)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold)) and bool(
        mallopt(_M_TRIM_THRESHOLD, threshold)
    )


def release_free_memory() -> None:
    """Gives the heap's free pages back to the OS (glibc); a no-op elsewhere."""
    if _malloc_trim is not None:
        _malloc_trim(0)


def memory_limit_bytes() -> int | None:
    """The most memory this process could ever use: the machine's physical
    memory, or its container's limit when that is lower; None when unknown.

    A plan that needs more than this cannot succeed, whoever announced it.
    """
    limits = []
    with contextlib.suppress(ValueError, OSError, AttributeError):  # no such sysconf names
        limits.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    for path in _CGROUP_LIMITS:
        try:
            with open(path, encoding="ascii") as file:
                text = file.read().strip()
        except (OSError, UnicodeDecodeError):
            continue
        if text.isdigit():  # "max": no limit
            limits.append(int(text))
    positive = [limit for limit in limits if limit > 0]
    return min(positive) if positive else None


_frozen_lock = threading.Lock()
_frozen_loads = 0  # loads running with the caller's objects frozen
_froze = False  # whether those loads froze them (not the caller, before)
# Objects frozen before any caller could freeze its own: none up to Python
# 3.11; 3.12 starts with some (375 in 3.12.1), and a count above that is the
# caller's freeze. Read at import: a process that froze before importing
# datafeed has its freeze taken for the interpreter's.
_FROZEN_AT_START = gc.get_freeze_count()


@contextlib.contextmanager
def callers_objects_frozen() -> Iterator[None]:
    """While a load runs, the objects that existed before it are out of the
    collector's reach (``gc.freeze``), and put back after (``gc.unfreeze``).

    A full collection during a load would traverse every object of the
    caller's process (a script that imported torch holds some 170,000 of them
    before it builds anything); with them frozen, a collection traverses only
    what was made since, as little as the load allocates. The
    loads of several threads (a preload during training) share one freeze.
    A process that froze its objects itself keeps them frozen.
    """
    global _frozen_loads, _froze
    with _frozen_lock:
        if _frozen_loads == 0:
            _froze = gc.get_freeze_count() <= _FROZEN_AT_START
            if _froze:
                gc.freeze()
        _frozen_loads += 1
    try:
        yield
    finally:
        with _frozen_lock:
            _frozen_loads -= 1
            if _frozen_loads == 0 and _froze:
                gc.unfreeze()
                _froze = False
