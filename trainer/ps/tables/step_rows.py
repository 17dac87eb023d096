"""A server's training pull remembers the row numbers it found, and the push
of the same ids' gradients reuses them: each id is looked up in the table's
index once per step, not once for the pull and again for the push.

Row numbers stay valid until the table renumbers its rows (a shrink, an
eviction for the budget, a load that drops ids): ``SparseTable.renumbered``
counts those, and a push whose pull came before one looks its ids up again.
"""

from __future__ import annotations

import numpy as np
import torch

from ._row_updates import push_pooled
from ._rows import pull_values
from .pooling import Pooling
from .table import SparseTable, as_u64

__all__ = [
    "PulledRows", "pull_distinct_numbered", "pull_numbered", "push_numbered",
    "push_pooled_numbered",
]


class PulledRows:
    """The ids of one training pull of a table, the row numbers it found (-1:
    not admitted) and the table's renumbering count then; ``source``: the
    tensor of the ids that the caller handed on (None: not kept)."""

    __slots__ = ("ids", "rows", "source", "stamp")

    def __init__(self, ids: np.ndarray, rows: np.ndarray, stamp: int) -> None:
        self.ids = ids
        self.rows = rows
        self.stamp = stamp
        self.source: torch.Tensor | None = None

    def matches(self, ids: np.ndarray) -> bool:
        """Whether ``ids`` are the pulled ids, in the same order."""
        if ids.shape != self.ids.shape:
            return False
        # A local push gets a view of the pull's own ids: compared by address.
        same = ids.__array_interface__["data"][0] == self.ids.__array_interface__["data"][0]
        return same or np.array_equal(ids, self.ids)


def pull_numbered(table: SparseTable, ids: np.ndarray | torch.Tensor) -> tuple[
    torch.Tensor, PulledRows
]:
    """``table.pull(ids, create=True)``, and the row numbers it used."""
    ids = as_u64(ids)
    out = np.empty((ids.shape[0], table.dim), dtype=np.float32)
    with table._lock:
        rows = table._seen(ids, out)
        stamp = table.renumbered
    _fill_absent(table, ids, rows, out)
    return torch.from_numpy(out), PulledRows(ids, rows, stamp)


def pull_distinct_numbered(table: SparseTable, values: np.ndarray) -> tuple[
    np.ndarray, np.ndarray, np.ndarray, PulledRows
]:
    """``pull_numbered`` of a batch's ids as they come, repeats included, made
    distinct in the same pass over them: ``(unique, inverse, rows,
    pulled)``, the distinct ids (uint64, in order of first appearance), each
    value's position among them, their rows (float32) and row numbers."""
    with table._lock:
        stats = table._stats
        tick = stats.next_tick(table._index.size)
        unique, inverse, rows, out, missing = pull_values(
            table._index, values, table._kernel(table._weights), stats.records, tick
        )
        if missing:
            table._add_missing(unique, rows, out, tick)
        stamp = table.renumbered
    if missing:
        _fill_absent(table, unique, rows, out)
    return unique, inverse, out, PulledRows(unique, rows, stamp)


def _fill_absent(table: SparseTable, ids: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
    """The rows of ids left without one (-1) read as SparseTable.pull's: the
    initial value, or zeros while not admitted."""
    absent = rows < 0
    if absent.any():
        out[absent] = table.init_rows(ids[absent]) if table.entry is None else 0.0


def _rows_now(table: SparseTable, pulled: PulledRows) -> np.ndarray:
    """The row numbers a push of ``pulled``'s ids applies to: the pull's (all
    looked up again if the table renumbered its rows since), and those of ids
    it found without a row (not admitted) looked up again: a pull's ids may
    have been admitted since, and a server matches a push to the oldest
    remembered pull of the same ids, which may be one never pushed (a forward
    that failed, a pull sent ahead and dropped). Caller holds the lock."""
    if pulled.stamp != table.renumbered:
        return table._rows_for(pulled.ids, create=table._fixed)
    rows = pulled.rows
    absent = rows < 0
    if absent.any():
        rows = rows.copy()
        rows[absent] = table._rows_for(pulled.ids[absent], create=False)
    return rows


def push_numbered(table: SparseTable, grads: torch.Tensor, pulled: PulledRows) -> None:
    """``table.push(pulled.ids, grads)`` at the row numbers of the pull
    (``_rows_now``). Gradients of ids without a row now (not admitted,
    evicted) are dropped; an id admitted after its pull takes its gradient,
    as Paddle's push updates what exists when it arrives."""
    grad = grads.detach().to(torch.float32).numpy()
    if grad.shape != (pulled.ids.shape[0], table.dim):
        raise ValueError(
            f"table '{table.name}': expected gradients of shape "
            f"({pulled.ids.shape[0]}, {table.dim}), got {tuple(grad.shape)}"
        )
    with table._lock:
        rows = _rows_now(table, pulled)
        present = rows >= 0
        if not present.all():
            rows, grad = rows[present], grad[present]
        table._apply(rows, grad)


def push_pooled_numbered(
    table: SparseTable, grad: torch.Tensor, pooling: Pooling, pulled: PulledRows
) -> bool:
    """``push_numbered`` of the rows' gradient that ``pooling`` takes from its
    output's ``grad``, in the optimizer's own pass (``push_pooled``: no
    gradient per row is made); False (nothing pushed) for a table whose
    optimizer is not SGD or Adagrad."""
    kind, hyper = table.optimizer.kind, table.optimizer.hyper
    if kind not in ("sgd", "adagrad"):
        return False
    out = pooling.output_gradient(grad)
    adagrad = kind == "adagrad"
    with table._lock:
        rows = _rows_now(table, pulled)
        push_pooled(
            table._kernel(table._weights),
            table._kernel(table._state["sum"]) if adagrad else None, rows, out,
            pooling.positions, pooling.bounds, pooling.mean, float(hyper["lr"]),
            float(hyper["eps"]) if adagrad else 0.0, float(hyper["weight_decay"]),
            table._stats.records,
        )
    return True
