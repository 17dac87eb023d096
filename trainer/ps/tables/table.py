"""Sparse tables: rows keyed by arbitrary 64-bit ids, with optimizer state.

A table keeps no Python object per row. ``IdIndex`` (``_rows.pyx``) is an
open-addressing hash index (linear probing) held in two numpy arrays, probed in
C for a whole batch of ids at once; rows and optimizer state live in growable
arrays (float32, or 16-bit floats with ``storage="float16"``) addressed by the
row numbers the index hands out, and SGD and Adagrad update them in place (C
loops in ``_row_updates.pyx``, as are a GEO sync's adds and merges). The same
class serves a parameter server's shard and a local (non-distributed) table.

A row that was never written holds its initial value, a pure function of the
table's seed and the id (``init_rows``), so every process and every server agrees
on it without talking to the others, and a read-only lookup (evaluation) needs
not create the row.

Lifecycle (``docs/table_lifecycle.md``). Each row has statistics beside its
weights: ``show`` (training pulls that included it: one per batch, per worker),
``click`` (batches in which a record holding it was clicked, when the forward
is given the click slot), its last-seen tick (a counter of training pulls,
mapped to passes by ``set_pass``) and a changed-since-last-save flag. A table
with an ``entry`` (``entries``) creates a row only once the entry admits the
id; ``shrink`` drops rows by the ``CtrAccessorParam`` rule; a table with
``max_rows`` evicts its least recently seen rows instead of growing past it.
Dropping rows renumbers the rest: the row-number methods (``rows``,
``read_rows``, ...) are for tables that never drop rows (GEO's local copies).

Changes since the last save, for a delta save: ``changed_rows()`` (rows pulled
or written since ``mark_saved()``; the flag is one byte per row) and
``dropped_ids()`` (ids shrunk or evicted since, recorded only between a first
``mark_saved()`` and the next, so a table that is never saved keeps no list).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from datafeed.records.memory import release_free_memory

from ...job.errors import CheckpointError
from ._row_updates import adagrad_rows, add_scaled_rows, merge_rows, sgd_rows, take_changes
from ._rows import IdIndex, count_row_steps, pull_rows
from .entries import CtrAccessorParam, EntryAttr
from .ids import as_u64, init_rows, mix64, shard_of, table_seed
from .optim import OptimizerSpec
from .rowstats import RowStats
from .saved_rows import check_rows, selected_columns, ticks_of_passes

log = logging.getLogger(__name__)

__all__ = [
    "IdIndex", "SparseTable", "as_u64", "init_rows", "mix64", "shard_of", "table_seed"
]

_U64 = np.uint64
_HALF_MAX = float(np.finfo(np.float16).max)
# A budget's eviction frees this fraction of the budget at once, so that the
# index rebuild it costs is paid once per max_rows // 16 new rows.
_EVICT_FRACTION = 16
_BUDGET_LOG_SECONDS = 60.0


class SparseTable:
    """One table (or one server's shard of it): id -> float32 row of ``dim``.

    Thread-safe: every public method holds the table's lock, so handler
    threads and Hogwild trainer threads may share it.

    Args:
        name: the table's name (a ``SparseEmbedding``'s ``name``).
        dim: row width.
        optimizer: how pushed gradients update rows.
        seed: the job's seed; initial rows are a function of (seed, name, id).
        init_scale: initial rows are uniform in [-init_scale, init_scale).
        entry: the admission rule (None: every id at its first training pull).
        accessor: when ``shrink`` drops rows (default ``CtrAccessorParam()``).
        max_rows: the most rows this table (shard) holds; None: no bound.
        storage: ``"float32"``, or ``"float16"``: rows and their Adagrad sums
            (as their roots) kept as 16-bit floats (IEEE half), half the bytes,
            for SGD and Adagrad tables. Updates are computed in float32 and
            rounded at random to one of the two halves around them (right on
            average); pulls, reads and saves give float32, sums as sums.
    """

    def __init__(
        self,
        name: str,
        dim: int,
        optimizer: OptimizerSpec,
        seed: int = 0,
        init_scale: float = 0.01,
        *,
        entry: EntryAttr | None = None,
        accessor: CtrAccessorParam | None = None,
        max_rows: int | None = None,
        storage: str = "float32",
    ) -> None:
        if dim < 1:
            raise ValueError(f"table '{name}': dim must be >= 1, got {dim}")
        if max_rows is not None and (isinstance(max_rows, bool) or max_rows < 1):
            raise ValueError(f"table '{name}': max_rows must be None or >= 1, got {max_rows!r}")
        self.name = name
        self.dim = int(dim)
        self.storage = _check_storage(storage, optimizer, name)
        self._half = storage == "float16"
        self.optimizer = optimizer
        self.seed = int(seed)
        self.init_scale = float(init_scale)
        self.entry = entry
        self.accessor = accessor or CtrAccessorParam()
        self.max_rows = None if max_rows is None else int(max_rows)
        self._seed64 = table_seed(name, seed)
        self._index = IdIndex()
        self._lock = threading.Lock()
        self._weights = np.zeros((0, self.dim), dtype=self._row_dtype(np.float32))
        self._state: dict[str, np.ndarray] = {
            key: np.zeros((0, *shape(self.dim)), dtype=self._row_dtype(dtype))
            for key, (shape, dtype) in optimizer.state_layout().items()
        }
        self._stats = RowStats()  # aligned with the rows
        self.evicted = 0  # rows evicted by the budget, in all
        self.renumbered = 0  # times rows were renumbered: row numbers taken before are stale
        # Shared with Hogwild processes: adds rows one process at a time (shared_rows.py).
        self._add_rows: Callable[[str, np.ndarray], None] | None = None
        self._budget_logged = (0.0, 0)

    def __len__(self) -> int:
        return self._index.size

    def set_optimizer(self, optimizer: OptimizerSpec) -> None:
        """Replaces the optimizer; every row's optimizer state starts afresh."""
        _check_storage(self.storage, optimizer, self.name)
        with self._lock:
            self.optimizer = optimizer
            allocated = self._weights.shape[0]
            self._state = {}
            for key, (shape, dtype) in optimizer.state_layout().items():
                array = np.empty((allocated, *shape(self.dim)), dtype=self._row_dtype(dtype))
                array.fill(self._stored(key, optimizer.initial_state(key)))
                self._state[key] = array

    def init_rows(self, ids: np.ndarray) -> np.ndarray:
        """The initial values of ``ids``' rows (a function of the seed and the id)."""
        return init_rows(ids, self.dim, self._seed64, self.init_scale)

    # -- rows ---------------------------------------------------------------

    def _row_dtype(self, dtype: Any) -> Any:
        """How an array of float32 per-row values is stored in this table."""
        return np.float16 if self._half and np.dtype(dtype) == np.float32 else dtype

    def _stored(self, key: str, values: Any) -> Any:
        """Optimizer state ``key``'s values as this table stores them: a 16-bit
        table keeps the root of each Adagrad sum (``_row_updates``)."""
        return np.sqrt(values) if self._half and key == "sum" else values

    def _state_values(self, key: str, stored: np.ndarray) -> np.ndarray:
        """Stored state ``key`` as its float32 values (``_stored`` undone)."""
        values = _float32(stored)
        return np.square(values) if self._half and key == "sum" else values

    def _kernel(self, array: np.ndarray) -> np.ndarray:
        """``array`` as the C kernels take it: 16-bit floats as their bits."""
        return array.view(np.uint16) if array.dtype == np.float16 else array

    def _arrays(self) -> list[np.ndarray]:
        return [self._weights, *self._state.values(), *self._stats.arrays()]

    def _set_arrays(self, arrays: list[np.ndarray]) -> None:
        stats_at = len(arrays) - len(self._stats.arrays())
        self._weights = arrays[0]
        for key, array in zip(list(self._state), arrays[1:stats_at], strict=True):
            self._state[key] = array
        self._stats.set_arrays(arrays[stats_at:])

    def _reserve(self, rows: int) -> None:
        allocated = self._weights.shape[0]
        if rows <= allocated:
            return
        # Half again, not double: a third of the room unused at worst (a
        # half with doubling), for about one more copy of each row.
        new = max(rows, allocated + allocated // 2, 1024)
        if self.max_rows is not None:
            new = max(rows, min(new, self.max_rows))
        self._set_arrays([_grown(array, new) for array in self._arrays()])
        # The arrays left behind are free heap the OS would never get back
        # (glibc keeps freed chunks under 32 MiB): 9 bytes a row at 10M rows.
        release_free_memory()

    def _insert(self, ids: np.ndarray) -> np.ndarray:
        """Row numbers of distinct ``ids``, adding missing rows at their initial
        value with fresh statistics (no admission, no budget). Caller holds the lock."""
        if self._add_rows is not None:  # shared with Hogwild processes
            rows = self._index.lookup(ids)
            if (rows < 0).any():
                self._add_rows(self.name, ids[rows < 0])
                rows = self._index.lookup(ids)
            return rows
        before, cells = self._index.size, self._index.cells
        rows = self._index.lookup_or_insert(ids)
        if self._index.cells is not cells:  # grown: the old cells are free heap
            del cells
            release_free_memory()
        if self._index.size > before:
            new = rows >= before
            new_rows = rows[new]
            self._reserve(self._index.size)
            self._init_new_rows(new_rows, ids[new])
        return rows

    def _init_new_rows(self, rows: np.ndarray, ids: np.ndarray) -> None:
        self._weights[rows] = self.init_rows(ids)
        for key in self.optimizer.state_layout():
            self._state[key][rows] = self._stored(key, self.optimizer.initial_state(key))
        self._stats.created(rows)


    def _rows_for(self, ids: np.ndarray, create: bool) -> np.ndarray:
        """Row numbers of distinct ``ids``, creating missing rows when asked
        (else -1 where missing). Caller holds the lock."""
        if not create:
            return self._index.lookup(ids)
        return self._insert(ids)

    def _seen(self, ids: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """A training pull of distinct ``ids``: admits and creates what its
        rule lets in (evicting for the budget), counts the statistics, copies
        the rows into ``out`` (when given; rows of ids not admitted are left
        as they were); the row numbers, -1 for ids not admitted. Locked."""
        tick = self._stats.next_tick(self._index.size)
        # Rows found are counted (and copied) in the lookup's own loop; rows
        # pulled now are the most recent, so none of them is evicted below.
        rows, missing = pull_rows(
            self._index, ids, self._kernel(self._weights), out, self._stats.records, tick
        )
        if missing:
            self._add_missing(ids, rows, out, tick)
        return rows

    def _add_missing(self, ids: np.ndarray, rows: np.ndarray, out: Any, tick: int) -> None:
        """The rest of a training pull after its lookup (``rows`` -1: no row):
        sets the ``rows`` and ``out`` rows of the ids it admits and creates."""
        stats = self._stats
        missing = np.flatnonzero(rows < 0)
        new_ids = ids[missing]
        sightings = None
        if self.entry is not None:
            counts = stats.pending.sight(new_ids, tick)
            admit = self.entry.admits(new_ids, counts, self._seed64)
            missing, new_ids, sightings = missing[admit], new_ids[admit], counts[admit]
            stats.pending.admitted(new_ids)
            if self.max_rows is not None and len(stats.pending) > self.max_rows:
                # Ids waiting for admission are bounded by the row budget too.
                stats.pending.drop(0, oldest=len(stats.pending) - self.max_rows)
        if new_ids.size:
            if self._make_room(new_ids.shape[0], tick):
                rows[:] = self._index.lookup(ids)  # renumbered, in place
            created = self._insert(new_ids)
            rows[missing] = created
            if sightings is not None:  # earlier sightings count as shows
                stats.show[created] = sightings - 1
            stats.touch(created, tick)
            if out is not None:
                out[missing] = self._weights[created]

    def _make_room(self, new: int, tick: int) -> bool:
        """Evicts least recently seen rows so that ``new`` rows fit the budget;
        whether any row was evicted (the rest are renumbered)."""
        if self.max_rows is None or self._index.size + new <= self.max_rows:
            return False
        n = self._index.size
        # A sixteenth of the budget more, so that the rebuild is not paid on every pull.
        evict = n + new - self.max_rows + self.max_rows // _EVICT_FRACTION
        candidates = self._stats.least_recently_seen(n, tick, evict)
        if not candidates.size:
            return False
        evict = candidates.shape[0]
        staying = np.ones(n, dtype=bool)
        staying[candidates] = False
        self._keep_rows(staying)
        self.evicted += evict
        now = time.monotonic()
        last_time, logged = self._budget_logged
        if now - last_time >= _BUDGET_LOG_SECONDS:
            log.info(
                "table '%s': at its budget of %d rows; evicted %d least recently seen rows "
                "(%d since the last such line, %d in all)",
                self.name, self.max_rows, evict, self.evicted - logged, self.evicted,
            )
            self._budget_logged = (now, self.evicted)
        return True

    def _keep_rows(self, staying: np.ndarray) -> None:
        """Drops the rows where ``staying`` is false and renumbers the rest in
        order. Caller holds the lock."""
        ids = self._index.ids_in_row_order()
        self._stats.dropping(ids[~staying])
        kept = np.flatnonzero(staying)
        count = kept.shape[0]
        allocated = self._weights.shape[0]
        # Give memory back when the table shrank to a quarter of what it holds.
        size = max(2 * count, 1024) if allocated > 4 * max(count, 1024) else allocated
        arrays = []
        for array in self._arrays():
            out = array if size == allocated else np.zeros((size, *array.shape[1:]), array.dtype)
            out[:count] = array[kept]
            arrays.append(out)
        self._set_arrays(arrays)
        self._index.rebuild(ids[kept])
        self.renumbered += 1

    # -- lifecycle ----------------------------------------------------------

    def set_pass(self, pass_id: int) -> None:
        """Starts pass (day) ``pass_id``: rows pulled from now on were seen in it.

        Raises:
            ValueError: ``pass_id`` is before the current pass.
        """
        with self._lock:
            before = self._stats.clock.current_pass
            self._stats.clock.set_pass(pass_id, f"table '{self.name}'")
            if self._stats.clock.current_pass != before:
                self._stats.altered = True  # a later pass: the rows' unseen days move

    @property
    def current_pass(self) -> int:
        """The pass set last (0 before any ``set_pass``)."""
        return self._stats.clock.current_pass

    def shrink(self) -> tuple[int, int]:
        """Paddle's shrink: decays show and click, drops the rows the accessor
        rule selects (and pending ids unseen for as long); ``(dropped, kept)`` rows."""
        with self._lock:
            drop = self._stats.shrink_mask(self.accessor, self._index.size)
            dropped = int(drop.sum())
            if dropped:
                self._keep_rows(~drop)
            self._stats.drop_unseen_pending(self.accessor.delete_after_unseen_days)
            return dropped, self._index.size

    def add_clicks(self, ids: np.ndarray | torch.Tensor, clicks: np.ndarray) -> None:
        """Adds ``clicks`` to the click counts of the rows of distinct ``ids``
        (ids without a row are skipped: not admitted, or evicted)."""
        ids = as_u64(ids)
        clicks = np.asarray(clicks, dtype=np.float32).reshape(-1)
        if clicks.shape[0] != ids.shape[0]:
            raise ValueError(
                f"table '{self.name}': expected {ids.shape[0]} clicks (one per id), "
                f"got {clicks.shape[0]}"
            )
        with self._lock:
            self._stats.add_clicks(self._index.lookup(ids), clicks)

    def statistics(self, ids: np.ndarray | torch.Tensor) -> dict[str, np.ndarray]:
        """Per id: ``show``, ``click``, ``unseen_passes`` (-1, 0, 0 where the
        id has no row) and ``pending`` (sightings of an id waiting for admission)."""
        ids = as_u64(ids)
        with self._lock:
            out = self._stats.of_rows(self._index.lookup(ids))
            out["pending"] = self._stats.pending.counts(ids)
        return out

    def stats(self) -> dict[str, int]:
        """``rows``, ``pending`` (ids waiting for admission), ``bytes`` (every
        array and index this table holds, allocated), ``evicted`` (by the
        budget, in all), ``max_rows`` (0: none) and ``pass``."""
        with self._lock:
            nbytes = sum(a.nbytes for a in self._arrays()) + self._index.cells.nbytes
            return {
                "rows": self._index.size,
                "pending": len(self._stats.pending),
                "bytes": int(nbytes + self._stats.pending.nbytes),
                "evicted": self.evicted,
                "max_rows": self.max_rows or 0,
                "pass": self._stats.clock.current_pass,
            }

    def changed_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """The ids and row numbers of rows pulled or written since ``mark_saved``."""
        with self._lock:
            rows = np.flatnonzero(self._stats.changed[: self._index.size])
            return self._index.ids_in_row_order()[rows], rows

    def dropped_ids(self) -> np.ndarray:
        """Ids shrunk or evicted since ``mark_saved`` (empty before the first)."""
        with self._lock:
            parts = self._stats.dropped or []
            return np.concatenate(parts) if parts else np.zeros(0, dtype=_U64)

    def clear_rows(self) -> None:
        """Drops every row (a base is about to be loaded in their place); the
        settings, the pass and the ids waiting for admission stay."""
        with self._lock:
            if self._index.size:
                self._keep_rows(np.zeros(self._index.size, dtype=bool))

    def mark_saved(self) -> None:
        """Every row is saved: clears the changed flags and the dropped ids,
        and from now on records dropped ids."""
        with self._lock:
            self._stats.mark_saved(self._index.size)

    # -- by row number (a caller that looked ids up once, e.g. GEO's local
    # tables, reuses the numbers: valid while no row is dropped) -------------

    def rows(self, ids: np.ndarray | torch.Tensor, create: bool = True) -> np.ndarray:
        """Row numbers of distinct ``ids`` (-1 where absent and not created)."""
        ids = as_u64(ids)
        with self._lock:
            return self._rows_for(ids, create)

    def read_rows(self, rows: np.ndarray) -> np.ndarray:
        """A copy of the weights of existing ``rows``."""
        with self._lock:
            return self._weights[rows].astype(np.float32, copy=False)

    def take_changes(self, base: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Each of the existing ``rows``' change since ``base`` (float32, a row
        per row number: a GEO worker's rows as of its last sync), which then
        becomes their base; float32 ``[len(rows), dim]``."""
        with self._lock:
            return take_changes(self._kernel(self._weights), base, rows)

    def merge_rows(self, base: np.ndarray, rows: np.ndarray, merged: np.ndarray) -> None:
        """Takes a GEO sync's ``merged`` rows for the existing, distinct
        ``rows``: each keeps what was trained since ``base`` (``row += merged
        - base``), and ``merged`` becomes its base (optimizer state unchanged)."""
        with self._lock:
            merge_rows(self._kernel(self._weights), base, rows, merged, self._stats.records)

    def push_rows(self, rows: np.ndarray, grads: torch.Tensor | np.ndarray) -> None:
        """Applies the optimizer to existing, distinct ``rows`` with ``grads``."""
        grad = _as_f32(grads, rows.shape[0], self.dim, self.name)
        with self._lock:
            self._apply(rows, grad)

    def _apply(self, rows: np.ndarray, grad: np.ndarray) -> None:
        # Caller holds the lock; rows are distinct.
        kind, hyper = self.optimizer.kind, self.optimizer.hyper
        records = self._stats.records
        if kind in ("sgd", "adagrad"):
            # In place, without gathering rows and state into copies; the
            # loop flags each row changed.
            rows = np.ascontiguousarray(rows, dtype=np.int64)
            grad = np.ascontiguousarray(grad, dtype=np.float32)
            lr, decay = float(hyper["lr"]), float(hyper["weight_decay"])
            if kind == "sgd":
                sgd_rows(self._kernel(self._weights), rows, grad, lr, decay, records)
            else:
                eps = float(hyper["eps"])
                adagrad_rows(
                    self._kernel(self._weights), self._kernel(self._state["sum"]), rows, grad,
                    lr, eps, decay, records,
                )
            return
        self._stats.changed[rows] = 1
        weights = self._weights[rows]
        state = {key: array[rows] for key, array in self._state.items() if key != "step"}
        # Adam's step counts go up in place, atomically (Hogwild processes
        # push the same rows at once): a count copied out and written back
        # with the rows lost the steps of one process where two met.
        state["step"] = count_row_steps(self._state["step"], rows)
        self.optimizer.apply(weights, grad, state)
        self._weights[rows] = weights
        for key, value in state.items():
            if key != "step":
                self._state[key][rows] = value

    @property
    def _fixed(self) -> bool:
        """Whether every id gets a row and none is dropped but by ``shrink``."""
        return self.entry is None and self.max_rows is None

    def pull(self, ids: np.ndarray | torch.Tensor, create: bool = True) -> torch.Tensor:
        """The rows of distinct ``ids`` as a new float32 tensor [len(ids), dim].

        ``create=True`` (training) counts the pull in the rows' statistics and
        creates the rows of ids the entry admits. With ``create=False`` the
        table is left unchanged (inference). An id without a row reads as its
        initial value, or as zeros in a table with an entry (not admitted yet).
        """
        ids = as_u64(ids)
        out = np.empty((ids.shape[0], self.dim), dtype=np.float32)
        with self._lock:
            if create:
                rows = self._seen(ids, out)
            else:
                rows, _ = pull_rows(self._index, ids, self._kernel(self._weights), out, None, 0)
        present = rows >= 0
        if not present.all():
            if self.entry is None:
                out[~present] = self.init_rows(ids[~present])
            else:
                out[~present] = 0.0
        return torch.from_numpy(out)

    def push(self, ids: np.ndarray | torch.Tensor, grads: torch.Tensor) -> None:
        """Applies the optimizer to the rows of distinct ``ids`` with ``grads``.

        In a table with an entry or a budget the gradients of ids without a
        row (not admitted, or evicted since their pull) are dropped; other
        tables create the row.
        """
        ids = as_u64(ids)
        grad = _as_f32(grads, ids.shape[0], self.dim, self.name)
        with self._lock:
            rows = self._rows_for(ids, create=self._fixed)
            if not self._fixed:
                present = rows >= 0
                if not present.all():
                    rows, grad = rows[present], grad[present]
            self._apply(rows, grad)

    def add(
        self, ids: np.ndarray | torch.Tensor, deltas: torch.Tensor, scale: float = 1.0
    ) -> torch.Tensor:
        """Adds ``deltas * scale`` to the rows of distinct ``ids`` (GEO); returns
        the new rows. A GEO sync counts as a training pull of its rows; ids not
        admitted get nothing added and read as zeros.

        Raises:
            ValueError: a sum would not be finite (deltas finite but huge: a
                diverged or hostile worker); no row changed.
        """
        ids = as_u64(ids)
        delta = np.ascontiguousarray(_as_f32(deltas, ids.shape[0], self.dim, self.name))
        out = np.empty((ids.shape[0], self.dim), dtype=np.float32)
        with self._lock:
            rows = self._seen(ids)
            overflow = add_scaled_rows(
                self._kernel(self._weights), rows, delta, scale, out, self._stats.records
            )
        if overflow >= 0:
            raise ValueError(
                f"table '{self.name}': adding the delta of id {int(ids[overflow])} "
                f"(times {scale}) would make its row not finite; nothing was added"
            )
        return torch.from_numpy(out)

    # -- persistence --------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Every row and its optimizer state, as tensors (copies): ``ids``
        (int64), ``weights``, ``state.<key>`` (saves stream: ``export_rows``)."""
        with self._lock:
            n = self._index.size
            out: dict[str, Any] = {
                "name": self.name,
                "dim": self.dim,
                "optimizer": self.optimizer.kind,
                "ids": torch.from_numpy(self._index.ids_in_row_order().view(np.int64).copy()),
                "weights": torch.from_numpy(self._weights[:n].astype(np.float32)),
            }
            for key, array in self._state.items():
                out["state." + key] = torch.from_numpy(
                    np.array(self._state_values(key, array[:n]), dtype=np.float32)
                )
        return out

    def export_rows(
        self,
        begin: Callable[[dict[str, Any]], None],
        write: Callable[[dict[str, np.ndarray]], None],
        *,
        delta: bool = False,
        chunk_rows: int = 1 << 16,
    ) -> tuple[np.ndarray, bool]:
        """Streams the rows (``delta``: those changed since the last save) for
        a save, with no second copy of the table, under the lock throughout (one
        snapshot): ``begin(header)`` (``rows``, ``pass``, ``optimizer``), then
        ``write(columns)`` per chunk of at most ``chunk_rows`` rows (columns as
        in ``saved_rows``, valid during the call only); then marks the rows
        saved. Returns the ids dropped since the last save (a delta deletes
        them) and whether nothing changed since the last save or load (no row
        pulled, written or dropped, no shrink, click or new pass; False before
        the first): the rows that save holds.

        Raises:
            CheckpointError: a delta of a table neither saved nor loaded
                before (the ids dropped since are not known).
        """
        with self._lock:
            stats = self._stats
            if delta and stats.dropped is None:
                raise CheckpointError(
                    f"table '{self.name}': a delta save needs an earlier save or load of the "
                    "table (dropped ids are recorded from then on); save a base (mode 0) first",
                    path=self.name,
                )
            n = self._index.size
            unchanged = (
                stats.dropped is not None and not stats.dropped and not stats.altered
                and not stats.changed[:n].any()
            )
            ids = self._index.ids_in_row_order()
            rows = np.flatnonzero(stats.changed[:n]) if delta else None
            count = n if rows is None else rows.shape[0]
            current = stats.clock.current_pass
            begin({"rows": count, "pass": current, "optimizer": self.optimizer.kind})
            for start in range(0, count, chunk_rows):
                stop = min(start + chunk_rows, count)
                part = slice(start, stop) if rows is None else rows[start:stop]
                columns = {"ids": ids[part], "weights": _float32(self._weights[part])}
                for key, array in self._state.items():
                    columns["state." + key] = self._state_values(key, array[part])
                columns["show"] = stats.show[part]
                columns["click"] = stats.click[part]
                columns["last_seen_pass"] = current - stats.clock.unseen_passes(stats.last[part])
                write(columns)
            # Once each: an id may have been dropped, readmitted and dropped again.
            dropped = np.unique(np.concatenate(stats.dropped)) if stats.dropped else np.zeros(
                0, _U64)
            stats.mark_saved(n)
            return dropped, unchanged

    def check_state_dict(
        self, state: Any, rows_to_load: np.ndarray | None = None, *, where: str | None = None
    ) -> None:
        """Checks that ``state`` is saved rows that fit this table (``saved_rows``:
        ``rows_to_load`` as for ``load_state_dict``, ``where`` the file, for messages).

        Raises:
            CheckpointError: a key missing, a value of the wrong type or shape,
                or lengths that disagree.
        """
        check_rows(
            state, self.dim, self.optimizer, rows_to_load, where=where or f"table '{self.name}'"
        )

    def load_state_dict(
        self,
        state: Mapping[str, Any],
        rows_to_load: np.ndarray | None = None,
        *,
        where: str | None = None,
    ) -> None:
        """Applies saved rows, checked first (a refused state changes nothing):
        deletes the ``dropped`` ids, then writes the rows where ``rows_to_load`` is true
        with their optimizer state (another optimizer's is not loaded: those
        rows start fresh state) and statistics, starting the passes the table
        has not reached (``saved_rows.ticks_of_passes``)."""
        self.check_state_dict(state, rows_to_load, where=where)
        ids, columns = selected_columns(state, self.optimizer, rows_to_load)
        with self._lock:
            found = self._index.lookup(state.get("dropped", ids[:0]))
            if (found >= 0).any():
                kept = np.ones(self._index.size, dtype=bool)
                kept[found[found >= 0]] = False
                self._keep_rows(kept)
            passes = columns.pop("last_seen_pass", None)
            ticks = ticks_of_passes(
                self._stats, self._index.size, passes, state.get("pass"), self.name)
            rows = self._insert(ids)
            for key, values in columns.items():
                target = self._weights if key == "weights" else self._state.get(key[6:])
                if target is not None and key != "weights":
                    values = self._stored(key[6:], values)
                if target is not None and target.dtype == np.float16:
                    # Saturated, as a push past the largest half is (not inf,
                    # which freezes an Adagrad row for good).
                    values = np.clip(values, -_HALF_MAX, _HALF_MAX)
                (getattr(self._stats, key) if target is None else target)[rows] = values
            if ticks is not None:
                self._stats.last[rows] = ticks
            self._stats.changed[rows] = 1


def _check_storage(storage: str, optimizer: OptimizerSpec, name: str) -> str:
    if storage not in ("float32", "float16"):
        raise ValueError(
            f"table '{name}': storage must be 'float32' or 'float16', got {storage!r}"
        )
    if storage == "float16" and optimizer.kind not in ("sgd", "adagrad"):
        raise ValueError(
            f"table '{name}': storage='float16' keeps SGD and Adagrad tables, got "
            f"{optimizer.kind!r}; use storage='float32' for it"
        )
    return storage


def _float32(values: np.ndarray) -> np.ndarray:
    """Per-row float values as float32 (16-bit ones widened; others as they are)."""
    return values.astype(np.float32) if values.dtype == np.float16 else values


def _grown(array: np.ndarray, rows: int) -> np.ndarray:
    out = np.zeros((rows, *array.shape[1:]), dtype=array.dtype)
    out[: array.shape[0]] = array
    return out


def _as_f32(values: torch.Tensor | np.ndarray, n: int, dim: int, name: str) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        if values.dtype != torch.float32 or not values.is_cpu or values.requires_grad:
            values = values.detach().to("cpu", torch.float32)
        values = values.numpy()
    else:
        values = np.asarray(values, dtype=np.float32)
    if values.shape != (n, dim):
        raise ValueError(
            f"table '{name}': expected values of shape ({n}, {dim}), got {tuple(values.shape)}"
        )
    return values
