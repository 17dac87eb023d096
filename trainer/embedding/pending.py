"""The pending pulls of each thread: what a training forward pulled, until its push.

Each training forward records the unique ids it pulled and the leaf tensor of
their pooled rows (``record``); the distributed optimizer's ``step()`` takes
them (``take_pulls``) and pushes their gradients: at the pull's row numbers for
tables in this process (``stores.push_pulls_numbered``), else merged per table
(``take_gradients``). Pending pulls are per
thread, so Hogwild trainer threads sharing one model each push what they pulled.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..ps.tables.table import as_u64

if TYPE_CHECKING:
    from ..ps.tables.pooling import Pooling

__all__ = [
    "clear_pending",
    "merge_gradients",
    "pending_rows",
    "record",
    "take_gradients",
    "take_pulls",
]

log = logging.getLogger("trainer.embedding")

_pending = threading.local()

# A forward that nobody pushes (training without the distributed optimizer)
# must not grow memory without bound.
_MAX_PENDING = 4096


def record(name: str, ids: torch.Tensor, output: torch.Tensor, pooling: Pooling) -> None:
    """Remembers a training pull: ``output`` is the leaf pooled from the rows
    of ``ids`` (``pooling``) whose ``.grad`` gives theirs."""
    items = getattr(_pending, "items", None)
    if items is None:
        items = _pending.items = []
    if len(items) >= _MAX_PENDING:
        log.warning(
            "%d SparseEmbedding pulls were never pushed: train through "
            "fleet.distributed_optimizer(...) so that step() updates sparse rows; "
            "dropping the oldest",
            len(items),
        )
        del items[: _MAX_PENDING // 2]
    items.append((name, ids, output, pooling))


def pending_rows() -> list[torch.Tensor]:
    """The output leaves of this thread's pending pulls, oldest first.

    A Hogwild trainer thread differentiates its loss with respect to them
    (``torch.autograd.grad``) and sets each one's ``.grad`` before
    ``take_gradients``: they are this thread's own leaves, unlike the dense
    parameters' shared ``.grad``.
    """
    return [output for _, _, output, _ in getattr(_pending, "items", None) or []]


def clear_pending() -> None:
    """Forgets this thread's pending pulls."""
    _pending.items = []


def take_gradients() -> dict[str, tuple[np.ndarray, torch.Tensor]]:
    """This thread's pending sparse gradients, merged per table: name ->
    (distinct uint64 ids, float32 grads [n, dim]). Pulls whose rows got no
    gradient are dropped."""
    return merge_gradients(take_pulls())


def take_pulls() -> list[tuple[str, torch.Tensor, torch.Tensor, Pooling]]:
    """This thread's pending pulls whose output got a gradient (all are forgotten)."""
    items = getattr(_pending, "items", None) or []
    _pending.items = []
    return [item for item in items if item[2].grad is not None]


def merge_gradients(
    items: list[tuple[str, torch.Tensor, torch.Tensor, Pooling]],
) -> dict[str, tuple[np.ndarray, torch.Tensor]]:
    """Pending pulls' gradients, per table: name -> (distinct uint64 ids, the
    sum of the gradients of equal ids)."""
    per_table: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    for name, ids, output, pooling in items:
        per_table.setdefault(name, []).append((ids, pooling.rows_gradient(output.grad)))
    out: dict[str, tuple[np.ndarray, torch.Tensor]] = {}
    for name, parts in per_table.items():
        if len(parts) == 1:
            ids, grad = parts[0]
        else:
            # Several forwards of one table (modules sharing it, or several
            # forwards before a step): sum gradients of equal ids.
            all_ids = torch.cat([p[0] for p in parts])
            all_grads = torch.cat([p[1] for p in parts])
            ids, inverse = torch.unique(all_ids, return_inverse=True)
            grad = torch.zeros(ids.shape[0], all_grads.shape[1], dtype=all_grads.dtype)
            grad.index_add_(0, inverse, all_grads)
        out[name] = (as_u64(ids), grad)
    return out
