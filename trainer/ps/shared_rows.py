"""Sparse tables shared with Hogwild processes (trainer/hogwild_processes.py).

Forked trainer processes read and update one table's rows in place, as Hogwild
threads do: before the fork, ``share_rows`` moves a table's rows, optimizer
state, statistics and index into shared memory (``shared_array``) with room for
the rows the pass may add, so that adding them moves nothing. Only the parent
adds rows (``add_rows_in_place``, asked by a process whose pull found an id
without one, through ``SparseTable._add_rows``): each new row is written before
the index shows its id, and the index publishes a row number after its key
(release order, ``_rows.pyx``), so a process probing meanwhile finds a complete
row or none. Tables with an entry or a budget are not shared: admitting,
evicting and renumbering rows is one process's bookkeeping.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable

import numpy as np
import torch

from .table import SparseTable, as_u64

__all__ = [
    "SharedRowsFull", "add_pull_ticks", "add_rows_in_place", "add_rows_locked", "pull_ticks",
    "rows_missing", "set_row_source", "share_rows", "shared_array",
]


class SharedRowsFull(RuntimeError):
    """A shared table needs more rows than room was made for."""


def shared_array(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A zeroed array in anonymous shared memory: a process forked later
    writes to the same pages. Pages are allocated when first written, so room
    that is never used costs address space only."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    memory = mmap.mmap(-1, max(count * dtype.itemsize, 1))  # MAP_SHARED | MAP_ANONYMOUS
    return np.frombuffer(memory, dtype=dtype, count=count).reshape(shape)


def _is_shared(array: np.ndarray) -> bool:
    """Whether ``array`` views ``shared_array``'s memory."""
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap)


def share_rows(table: SparseTable, extra_rows: int) -> None:
    """Moves ``table``'s arrays and index into shared memory, with room for
    ``extra_rows`` more rows.

    Raises:
        ValueError: a table with an entry or a row budget.
    """
    with table._lock:
        if not table._fixed:
            raise ValueError(
                f"table '{table.name}' has an entry or a row budget: one process "
                "admits, evicts and renumbers its rows"
            )
        used = table._index.size
        rows = max(used + int(extra_rows), 1)
        shared = _is_shared(table._weights) and table._weights.shape[0] >= rows
        if shared and table._index.fits(rows):
            return  # shared by an earlier pass, with room enough
        arrays = []
        for array in table._arrays():
            shared = shared_array((rows, *array.shape[1:]), array.dtype)
            shared[:used] = array[:used]
            arrays.append(shared)
        table._set_arrays(arrays)
        table._index._grow(rows, shared_array)


def add_rows_in_place(table: SparseTable, ids: np.ndarray | torch.Tensor) -> int:
    """Adds rows for those of the distinct ``ids`` that have none, within the
    room ``share_rows`` made, each row written before the index shows its id;
    the number of rows added.

    Raises:
        SharedRowsFull: no room left for them.
    """
    with table._lock:
        return add_rows_locked(table, ids)


def add_rows_locked(table: SparseTable, ids: np.ndarray | torch.Tensor) -> int:
    """``add_rows_in_place`` for a caller that holds the table's lock (the
    table's own ``_insert``, in the process that adds rows)."""
    ids = as_u64(ids)
    new_ids = ids[table._index.lookup(ids) < 0]
    count = new_ids.shape[0]
    if count == 0:
        return 0
    start = table._index.size
    room = table._weights.shape[0]
    if start + count > room or not table._index.fits(start + count):
        raise SharedRowsFull(
            f"table '{table.name}': {start + count} rows needed, room was made for "
            f"{room} before the Hogwild processes started"
        )
    rows = np.arange(start, start + count, dtype=np.int64)
    table._init_new_rows(rows, new_ids)
    made = table._index.lookup_or_insert(new_ids)
    if not np.array_equal(made, rows):
        raise ValueError(f"table '{table.name}': add_rows_in_place needs distinct ids")
    return count


def rows_missing(table: SparseTable, ids: np.ndarray) -> int:
    """How many of the distinct uint64 ``ids`` have no row in ``table``."""
    with table._lock:
        return int((table._index.lookup(ids) < 0).sum())


def pull_ticks(table: SparseTable) -> int:
    """The table's count of training pulls (its statistics' clock)."""
    return table._stats.clock.tick


def add_pull_ticks(table: SparseTable, pulls: int) -> None:
    """Advances the clock by the training pulls other processes made."""
    with table._lock:
        table._stats.clock.tick += pulls


def set_row_source(table: SparseTable, add_rows: Callable[[str, np.ndarray], None] | None) -> None:
    """Where ``table`` gets rows for new ids: ``add_rows(name, ids)`` (a
    Hogwild process asking the calling one, or the calling one adding them
    within the shared room with the lock held); None: the table itself."""
    table._add_rows = add_rows
