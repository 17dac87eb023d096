"""Where a ``SparseEmbedding`` forward's rows come from.

The row store a forward pulls from is ``LocalStore`` (in-process tables) unless
a runtime installed another one (``install_store``: a parameter-server worker's
``RemoteStore`` or ``GeoStore``). Tables in this process (``LocalStore``, a
GEO worker's copy) pull a batch's ids as they come and push at the row numbers
their pull found (``pull_batch_values``, ``push_pulls_numbered``). For the
servers, ``distinct`` gives the distinct ids of a forward's input, shared by
the tables that take the same input. Click statistics go to the local tables
or to the sink a PS worker installed.
"""

from __future__ import annotations

import collections
import threading
import weakref
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np
import torch

from ..ps.tables.ids import unique_inverse
from ..ps.tables.optim import OptimizerSpec
from ..ps.tables.step_rows import (
    PulledRows,
    pull_distinct_numbered,
    pull_numbered,
    push_numbered,
    push_pooled_numbered,
)
from ..ps.tables.table import SparseTable, as_u64
from .pending import merge_gradients, take_pulls
from .tables import TableConfig, registered_config

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from ..ps.tables.pooling import Pooling

__all__ = [
    "BatchPull",
    "LocalStore",
    "RowStore",
    "add_clicks",
    "current_store",
    "distinct",
    "distinct_of",
    "install_click_sink",
    "install_store",
    "keep_rows",
    "kept_rows",
    "local_store",
    "pull_batch_values",
    "push_pulls_numbered",
]


# The last ids tensor made distinct, and the result. Tables that take the same
# input (wide & deep) then share one pass per batch, and one tensor of distinct
# ids, by which ``RemoteStore`` recognises tables it can pull in one round trip.
_last_distinct = threading.local()


def distinct(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.unique(ids.reshape(-1), return_inverse=True)`` (not sorted on CPU),
    reused while ``ids`` is the same, unchanged tensor."""
    last = getattr(_last_distinct, "value", None)
    if last is not None and last[0] is ids and last[1] == ids._version:
        return last[2], last[3]
    unique, inverse = distinct_of(ids)
    _last_distinct.value = (ids, ids._version, unique, inverse)
    return unique, inverse


def distinct_of(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``distinct`` without its memory of the last call (pulls sent ahead
    make the ids of batches to come distinct between a forward's pulls)."""
    flat = ids.reshape(-1)
    if flat.device.type == "cpu":
        # A hash pass (first-appearance order; nothing downstream needs the ids
        # sorted) instead of a sort: ~3x numpy's unique on 13k int64 ids.
        values, positions = unique_inverse(flat.numpy())
        unique = torch.from_numpy(values)
        inverse = torch.from_numpy(positions)
    else:
        unique, inverse = torch.unique(flat, return_inverse=True)
    return unique, inverse


class RowStore(Protocol):
    """Where a forward's rows come from: ``LocalStore``, ``RemoteStore``, ``GeoStore``.

    A store whose tables are in this process (``LocalStore``, ``GeoStore``) also
    has ``pull_values(config, values)``: a training pull of a batch's ids as
    they come, made distinct in the pull's own pass (``pull_batch_values``),
    which ``SparseEmbedding`` prefers.
    """

    def pull(self, config: TableConfig, ids: torch.Tensor, training: bool) -> torch.Tensor:
        """Rows [len(ids), dim] of distinct int64 ``ids``."""
        ...


class LocalStore:
    """In-process tables (the non-distributed mode), created on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.tables: dict[str, SparseTable] = {}
        self.default_optimizer: OptimizerSpec | None = None
        self.pass_id = 0  # the pass a table created from now on starts in

    def table(self, config: TableConfig) -> SparseTable:
        """The table of ``config``, created (empty) on first use."""
        with self._lock:
            table = self.tables.get(config.name)
            # A table left by a module that no longer exists, with other settings.
            if table is not None and not config.same_table(table):
                table = None
            if table is None:
                table = config.make_table(self.default_optimizer)
                table.set_pass(self.pass_id)
                self.tables[config.name] = table
            return table

    def set_default_optimizer(self, spec: OptimizerSpec) -> None:
        """The optimizer of tables without their own: resets their state."""
        with self._lock:
            self.default_optimizer = spec
            for name, table in self.tables.items():
                config = registered_config(name)
                if config is None or config.optimizer is None:
                    table.set_optimizer(spec)

    def set_pass(self, pass_id: int) -> None:
        """The pass of tables created from now on (``fleet.set_pass``)."""
        with self._lock:
            self.pass_id = int(pass_id)

    def pull(self, config: TableConfig, ids: torch.Tensor, training: bool) -> torch.Tensor:
        """Rows of distinct ``ids``, created when ``training``. A training
        pull keeps the row numbers it found for the push of the same ids."""
        table = self.table(config)
        if not training:
            return table.pull(ids, create=False)
        rows, pulled = pull_numbered(table, ids)
        _keep_pull(table, pulled)
        return rows

    def pull_values(
        self, config: TableConfig, values: torch.Tensor
    ) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
        """A training pull of a batch's ids as they come (int64, repeats
        included), as ``distinct`` then ``pull`` in one pass over the ids:
        the distinct ids (int64 tensor), their rows (float32 numpy) and each
        value's position among them (int64 numpy). Keeps the row numbers for
        the push of the distinct ids' tensor."""
        pulled = pull_batch_values(self.table(config), values)
        return pulled.source, pulled.values, pulled.positions

    def push_pending(self) -> None:
        """Pushes this thread's pending sparse gradients (``take_gradients``):
        ``push_pulls_numbered``, the rest as ``push``."""
        _, rest = push_pulls_numbered(self.tables)
        if rest:
            self.push(merge_gradients(rest))

    def push(self, gradients: dict[str, tuple[np.ndarray, torch.Tensor]]) -> None:
        """Applies each table's optimizer to its rows' gradients: at the row
        numbers of this thread's last pull when those were its ids (the ids
        are then looked up once per step), else looked up now."""
        for name, (ids, grads) in gradients.items():
            table = self.tables[name]
            pulled = _take_kept_pull(table)
            if pulled is not None and pulled.matches(ids):
                push_numbered(table, grads, pulled)
            else:
                table.push(ids, grads)

    def clear(self) -> None:
        """Drops every table and starts again at pass 0 (tests; a fresh model)."""
        with self._lock:
            self.tables.clear()
            self.pass_id = 0


# Each thread's last training pull of each in-process table: table name ->
# (a weak reference to the table, the pull with its row numbers). A push uses a
# kept pull only for the very table it came from (a GEO worker's copy and a
# local table may share a name); a table dropped meanwhile is not kept alive.
_pulled_here = threading.local()


class BatchPull(NamedTuple):
    """``pull_batch_values``' result: the distinct ids (int64 tensor, the
    pull's ``source``), their rows (float32 numpy), each value's position
    among them (int64 numpy) and the pull (its row numbers)."""

    source: torch.Tensor
    values: np.ndarray
    positions: np.ndarray
    pulled: PulledRows


def pull_batch_values(table: SparseTable, values: torch.Tensor) -> BatchPull:
    """A training pull from an in-process ``table`` of a batch's ids as they come
    (int64, repeats included), made distinct in the same pass over them
    (``pull_distinct_numbered``). The row numbers are kept, as this thread's
    last pull of ``table``, for ``push_pulls_numbered``."""
    unique, positions, rows, pulled = pull_distinct_numbered(table, values.numpy())
    _keep_pull(table, pulled)
    pulled.source = torch.from_numpy(unique.view(np.int64))
    return BatchPull(pulled.source, rows, positions, pulled)


def push_pulls_numbered(
    tables: Mapping[str, SparseTable],
) -> tuple[dict[str, PulledRows], list[tuple[str, torch.Tensor, torch.Tensor, Pooling]]]:
    """Takes this thread's pending pulls (``take_pulls``) and pushes those
    that can go at their pull's row numbers: a table of ``tables`` pulled
    once since the last push, by ``pull_batch_values``, whose rows' gradient
    is taken from the pooled output's in the optimizer's own pass
    (``push_pooled_numbered``). Returns the pulls so pushed, by table, and
    the pending pulls left for the caller to push."""
    items = take_pulls()
    pulls = collections.Counter(name for name, _, _, _ in items)
    pushed: dict[str, PulledRows] = {}
    rest = []
    for name, ids, output, pooling in items:
        table = tables.get(name)
        pulled = None if table is None or pulls[name] != 1 else _kept_pull(table)
        if (
            pulled is not None
            and pulled.source is ids  # this pull's own ids
            and push_pooled_numbered(table, output.grad, pooling, pulled)
        ):
            pushed[name] = _take_kept_pull(table)
        else:
            rest.append((name, ids, output, pooling))
    return pushed, rest


def _keep_pull(table: SparseTable, pulled: PulledRows) -> None:
    kept = getattr(_pulled_here, "tables", None)
    if kept is None:
        kept = _pulled_here.tables = {}
    kept[table.name] = (weakref.ref(table), pulled)


def _kept_pull(table: SparseTable) -> PulledRows | None:
    """This thread's last training pull of ``table`` (None: none kept)."""
    kept = getattr(_pulled_here, "tables", None)
    found = None if kept is None else kept.get(table.name)
    return found[1] if found is not None and found[0]() is table else None


def _take_kept_pull(table: SparseTable) -> PulledRows | None:
    """``_kept_pull``, forgotten."""
    pulled = _kept_pull(table)
    if pulled is not None:
        del _pulled_here.tables[table.name]
    return pulled


def keep_rows(table: SparseTable, ids: np.ndarray, rows: np.ndarray) -> None:
    """Keeps ``rows``, the row numbers just found in ``table`` for the distinct
    uint64 ``ids`` of a training pull, as this thread's last pull of it
    (``kept_rows``)."""
    _keep_pull(table, PulledRows(ids, rows, table.renumbered))


def kept_rows(table: SparseTable, ids: np.ndarray) -> np.ndarray | None:
    """The row numbers that this thread's last training pull of ``table``
    found for ``ids`` (the pull then forgotten), when it pulled these very
    ids and the table has not renumbered its rows since; else None."""
    pulled = _take_kept_pull(table)
    if pulled is None or pulled.stamp != table.renumbered or not pulled.matches(ids):
        return None
    return pulled.rows

_local_store = LocalStore()
_store: RowStore = _local_store


def local_store() -> LocalStore:
    """The process's in-process tables."""
    return _local_store


def install_store(store: RowStore | None) -> None:
    """Makes every SparseEmbedding pull from ``store`` (None: back to local tables)."""
    global _store
    _store = _local_store if store is None else store


def current_store() -> RowStore:
    """The store every SparseEmbedding pulls from now."""
    return _store


# Where click statistics go: the local tables unless a PS worker installed
# its sender (``install_click_sink``): name, distinct ids, clicks per id.
_click_sink: Callable[[str, np.ndarray, np.ndarray], None] | None = None


def install_click_sink(sink: Callable[[str, np.ndarray, np.ndarray], None] | None) -> None:
    """Sends ``add_clicks`` to ``sink`` (a PS worker's servers); None: local tables."""
    global _click_sink
    _click_sink = sink


def add_clicks(config: TableConfig, ids: torch.Tensor, clicks: torch.Tensor) -> None:
    """Adds ``clicks`` (float32 per distinct id) to the click counts of the
    rows of ``ids`` in ``config``'s table, wherever it lives."""
    u64 = as_u64(ids)
    values = clicks.detach().to(torch.float32).numpy()
    if _click_sink is not None:
        _click_sink(config.name, u64, values)
    else:
        _local_store.table(config).add_clicks(u64, values)


