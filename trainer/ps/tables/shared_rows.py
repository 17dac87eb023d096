"""Sparse tables shared with Hogwild processes (trainer/loop/hogwild_processes.py).

Forked trainer processes read and update one table's rows in place, as Hogwild
threads do. Before the fork, ``share_table`` moves a table's rows, optimizer
state, statistics and index into shared memory (``shared_array``), with room
for the rows the pass may add so that adding them moves nothing; while the
processes train, the table's ``_insert`` adds rows through its
``SharedRowAdder``, in whichever process meets a new id, one process at a
time (a lock shared by the processes, and the row count in shared memory). Each new row is written
before the index shows its id, and the index publishes a row number after its
key (release order, ``_rows.pyx``), so a process looking ids up meanwhile,
without the lock, finds a complete row or none. Tables with an entry or a
budget are not shared: admitting, evicting and renumbering rows is one
process's bookkeeping.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from multiprocessing import get_context

import numpy as np
import torch

from .table import SparseTable, as_u64

__all__ = [
    "SharedRowAdder", "SharedRowsFull", "add_pull_ticks", "pull_ticks", "rows_missing",
    "set_pull_ticks", "share_table", "shared_array", "sharing",
]


_WAIT_SECONDS = 0.05


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


class SharedRowAdder:
    """Adds rows to a shared table for every process, one at a time: the
    table's ``_add_rows`` while the processes run (``attach``), called by its
    ``_insert`` with the table's own lock held."""

    def __init__(self, table: SparseTable) -> None:
        self.table = table
        self._lock = get_context("fork").Lock()  # a semaphore the forks share
        self._rows = shared_array((1,), np.int64)  # the row count, for every process
        self._rows[0] = len(table)
        # Called every _WAIT_SECONDS while this process waits for the lock; may
        # raise to give up (a process killed while holding it never releases it).
        self.waiting: Callable[[], None] | None = None

    def attach(self) -> None:
        """From now on, this process adds the table's rows through here."""
        self.table._add_rows = self

    def resume(self) -> None:
        """Before a pass of processes forked in an earlier one: the row count
        is this process's again (it may have added rows between passes)."""
        self._rows[0] = len(self.table)

    def catch_up(self) -> None:
        """In a forked process, before a pass: its index counts the rows
        that the others added since."""
        self.table._index.set_size(int(self._rows[0]))

    def detach(self) -> None:
        """The processes are done: the table adds rows itself again, its row
        count the one they reached."""
        self.table._index.set_size(int(self._rows[0]))
        self.table._add_rows = None

    def __call__(self, name: str, ids: np.ndarray) -> None:
        """Adds rows for the distinct uint64 ``ids`` that have none (another
        process may have added some since this one looked).

        Raises:
            SharedRowsFull: no room left for them.
        """
        table = self.table
        while not self._lock.acquire(timeout=_WAIT_SECONDS):
            if self.waiting is not None:
                self.waiting()
        try:
            table._index.set_size(int(self._rows[0]))
            new_ids = ids[table._index.lookup(ids) < 0]
            count = new_ids.shape[0]
            if count == 0:
                return
            start = table._index.size
            room = table._weights.shape[0]
            if start + count > room or not table._index.fits(start + count):
                raise SharedRowsFull(
                    f"table '{table.name}': {start + count} rows needed, room was made for "
                    f"{room} before the Hogwild processes started"
                )
            rows = np.arange(start, start + count, dtype=np.int64)
            table._init_new_rows(rows, new_ids)
            made = table._index.lookup_or_insert(new_ids)  # published after the rows
            if not np.array_equal(made, rows):
                raise ValueError(f"table '{name}': rows must be added for distinct ids")
            self._rows[0] = start + count
        finally:
            self._lock.release()


def share_table(table: SparseTable, extra_rows: int) -> None:
    """Moves ``table``'s arrays and index into shared memory (unless an earlier
    pass did, with room enough), with room for ``extra_rows`` more rows.

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
        # Kept from an earlier pass only if nothing moved since: a shrink
        # compacts the rows in place but rebuilds the index in private memory.
        kept = all(_is_shared(a) and a.shape[0] >= rows for a in table._arrays())
        if not (kept and _is_shared(table._index.cells) and table._index.fits(rows)):
            arrays = []
            for array in table._arrays():
                moved = shared_array((rows, *array.shape[1:]), array.dtype)
                moved[:used] = array[:used]
                arrays.append(moved)
            table._set_arrays(arrays)
            table._index._grow(rows, shared_array)


def sharing(table: SparseTable) -> tuple:
    """What a forked process's view of ``table`` rests on: the identities of
    its shared arrays and index, and its optimizer. Equal while the view holds."""
    return (
        id(table), tuple(id(a) for a in table._arrays()), id(table._index.cells),
        id(table.optimizer), repr(table.optimizer.hyper),
    )


def rows_missing(table: SparseTable, ids: np.ndarray | torch.Tensor) -> int:
    """How many of the distinct ``ids`` have no row in ``table``."""
    ids = as_u64(ids)
    with table._lock:
        return int((table._index.lookup(ids) < 0).sum())


def pull_ticks(table: SparseTable) -> int:
    """The table's count of training pulls (its statistics' clock)."""
    return table._stats.clock.tick


def set_pull_ticks(table: SparseTable, tick: int) -> None:
    """Sets the clock (a forked process, to the calling process's at a pass's start)."""
    with table._lock:
        table._stats.clock.tick = tick


def add_pull_ticks(table: SparseTable, pulls: int) -> None:
    """Advances the clock by the training pulls other processes made."""
    with table._lock:
        table._stats.clock.tick += pulls
