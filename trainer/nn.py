"""Layers for sparse (feature-id) inputs.

``SparseEmbedding`` is an embedding keyed by arbitrary 64-bit feature ids, with
no vocabulary size: a row is created the first time training sees its id. Its
rows are not torch parameters: they live in a table (in this process, or on the
parameter servers in a PS job, see ``trainer.ps``), and the optimizer returned
by ``fleet.distributed_optimizer`` pushes their gradients on ``step()``.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from .ps import sparse, step_clock
from .ps.entries import (
    CountFilterEntry,
    CtrAccessorParam,
    EntryAttr,
    ProbabilityEntry,
    ShowClickEntry,
)
from .ps.optim import OptimizerSpec
from .ps.sparse import DEFAULT_INIT_SCALE, TableConfig

__all__ = [
    "CountFilterEntry",
    "CtrAccessorParam",
    "ProbabilityEntry",
    "ShowClickEntry",
    "SparseEmbedding",
]


class SparseEmbedding(nn.Module):
    """Embedding rows keyed by 64-bit ids (uint64 bits carried in int64 tensors).

    Args:
        dim: width of a row.
        name: the table's name. Modules with the same name share one table
            (like a shared ``param_attr`` name in Paddle); the name keys the
            table on the servers and in checkpoints.
        mode: pooling of a ``Ragged`` input's values per record, ``"sum"`` or
            ``"mean"`` (an empty record pools to zeros).
        optimizer: this table's own optimizer, e.g. ``{"type": "adagrad",
            "lr": 0.05}`` (types: sgd, adagrad, adam, adamw); by default the
            table uses the torch optimizer given to ``fleet.distributed_optimizer``.
        init_scale: a new row is uniform in ``[-init_scale, init_scale)``.
        seed: with the table name and the id, determines a new row's values, so
            every process and server agrees on them.
        entry: the admission rule: ``CountFilterEntry(n)``,
            ``ProbabilityEntry(p)`` or ``ShowClickEntry(show, click)``; None:
            every id gets a row at its first training pull. Until admitted an
            id reads as zeros and its gradients are dropped.
        accessor: when ``fleet.shrink()`` drops rows (``CtrAccessorParam``:
            unseen for more than ``delete_after_unseen_days`` passes, or a
            decayed show/click score under ``delete_threshold``).
        max_rows: the table's row budget (all servers together): past it the
            least recently seen rows are evicted. None: no bound.

    Input: a ``datafeed.Ragged`` (a sparse slot of a batch) -> ``[size, dim]``,
    pooled per record; or an int64 tensor of ids -> ``ids.shape + (dim,)``.

    In training mode (``module.train()`` and grad enabled) a forward creates the
    rows it has not seen and records them so that the distributed optimizer's
    ``step()`` pushes their gradients. In eval mode unseen ids read as their
    initial values and nothing is created.

    ``forward(x, click=labels)`` (a training forward, one label per record of
    ``x``) also counts, per id, the batches in which a clicked record held it
    (the rows' click statistics; see ``docs/table_lifecycle.md``).
    """

    def __init__(
        self,
        dim: int,
        name: str,
        mode: str = "sum",
        *,
        optimizer: Mapping[str, Any] | None = None,
        init_scale: float = DEFAULT_INIT_SCALE,
        seed: int = 0,
        entry: EntryAttr | None = None,
        accessor: CtrAccessorParam | None = None,
        max_rows: int | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(dim, int) or dim < 1:
            raise ValueError(f"SparseEmbedding dim must be an int >= 1, got {dim!r}")
        if not isinstance(name, str) or not name:
            raise ValueError(f"SparseEmbedding name must be a non-empty str, got {name!r}")
        if mode not in ("sum", "mean"):
            raise ValueError(f"SparseEmbedding mode must be 'sum' or 'mean', got {mode!r}")
        if optimizer is not None:  # fail now, not on the first push
            OptimizerSpec.from_config(optimizer)
        if entry is not None and not isinstance(entry, EntryAttr):
            raise TypeError(
                f"SparseEmbedding '{name}': entry must be a CountFilterEntry, ProbabilityEntry "
                f"or ShowClickEntry, got {type(entry).__name__}"
            )
        if accessor is not None and not isinstance(accessor, CtrAccessorParam):
            raise TypeError(
                f"SparseEmbedding '{name}': accessor must be a CtrAccessorParam, got "
                f"{type(accessor).__name__}"
            )
        if max_rows is not None and (
            not isinstance(max_rows, int) or isinstance(max_rows, bool) or max_rows < 1
        ):
            raise ValueError(
                f"SparseEmbedding '{name}': max_rows must be None or an int >= 1, got {max_rows!r}"
            )
        self.dim = dim
        self.name = name
        self.mode = mode
        self.config = TableConfig(
            name, dim, int(seed), float(init_scale),
            None if optimizer is None else dict(optimizer),
            entry, accessor or CtrAccessorParam(), max_rows,
        )
        sparse.register(self, self.config)

    def extra_repr(self) -> str:
        """The dimension, table name and pooling mode, for ``repr(module)``."""
        return f"dim={self.dim}, name={self.name!r}, mode={self.mode!r}"

    def _rows(
        self, ids: torch.Tensor, clicked: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of the distinct ids and each id's position among them;
        ``clicked`` (bool per id of ``ids``) adds to the rows' click counts."""
        if ids.dtype not in (torch.int64, torch.uint64):
            raise TypeError(
                f"SparseEmbedding '{self.name}' expects int64 feature ids, got {ids.dtype}"
            )
        if ids.dtype == torch.uint64:
            ids = ids.view(torch.int64)
        unique, inverse = sparse.distinct(ids)
        training = self.training and torch.is_grad_enabled()
        started = time.perf_counter()
        rows = sparse.current_store().pull(self.config, unique, training)
        if training:
            step_clock.add_pull(time.perf_counter() - started)
            rows.requires_grad_(True)
            sparse.record(self.name, unique, rows)
            if clicked is not None:
                # One click per id per batch at most, as show counts one per batch.
                per_id = torch.zeros(unique.shape[0], dtype=torch.float32)
                per_id[inverse.reshape(-1)[clicked.reshape(-1)]] = 1.0
                sparse.add_clicks(self.config, unique, per_id)
        return rows, inverse

    def forward(self, x: Any, click: torch.Tensor | None = None) -> torch.Tensor:
        """The rows of the ids in ``x``: a ``Ragged`` gives each record's rows
        pooled (``[size, dim]``), an int64 tensor ``x.shape + (dim,)``.
        ``click``: one label per record (> 0: clicked), for the click statistics."""
        if isinstance(x, torch.Tensor):
            clicked = None
            if click is not None:
                labels = _labels(click, x.shape[0] if x.dim() else 1, self.name)
                clicked = labels.reshape(-1, *([1] * max(x.dim() - 1, 0))).expand(x.shape)
            rows, inverse = self._rows(x, clicked)
            return rows.index_select(0, inverse).view(*x.shape, self.dim)
        values, offsets = getattr(x, "values", None), getattr(x, "offsets", None)
        if not isinstance(values, torch.Tensor) or not isinstance(offsets, torch.Tensor):
            raise TypeError(
                f"SparseEmbedding '{self.name}' expects a Ragged (values, offsets) or "
                f"an int64 tensor, got {type(x).__name__}"
            )
        clicked = None
        if click is not None:
            lengths = offsets.to(torch.int64).diff()
            labels = _labels(click, lengths.shape[0], self.name)
            clicked = torch.repeat_interleave(labels, lengths, output_size=values.shape[0])
        rows, inverse = self._rows(values, clicked)
        return _pool(rows, inverse, offsets.to(torch.int64), self.mode)


def _labels(click: Any, records: int, name: str) -> torch.Tensor:
    """``click`` as one bool per record (> 0: clicked)."""
    labels = torch.as_tensor(click).detach().reshape(-1)
    if labels.shape[0] != records:
        raise ValueError(
            f"SparseEmbedding '{name}': expected one click label per record ({records}), "
            f"got {labels.shape[0]}"
        )
    return labels.cpu() > 0


def _pool(
    rows: torch.Tensor, inverse: torch.Tensor, offsets: torch.Tensor, mode: str
) -> torch.Tensor:
    """Per record, the sum (or mean) of ``rows[inverse[offsets[i]:offsets[i+1]]]``.

    What ``F.embedding_bag`` computes, as a gather and a scatter-add, whose
    backward on CPU is several times cheaper than embedding_bag's (which sorts
    the indices); a slot with one id per record (Criteo's) is the gather alone.
    """
    size = offsets.shape[0] - 1
    n = inverse.shape[0]
    # The checks and the record of each value in numpy: as torch ops (.item()
    # syncs, an arange, a repeat_interleave) they cost a tenth of a GEO step
    # (measured, wide&deep batch 512).
    bounds = offsets.numpy() if offsets.is_cpu else offsets.cpu().numpy()
    if size < 0 or bounds[0] != 0 or bounds[-1] != n:
        raise ValueError(
            f"a Ragged's offsets must run from 0 to the number of values ({n}), "
            f"got {bounds[:1].tolist()} ... {bounds[-1:].tolist()}"
        )
    if n == size and _one_per_record(offsets, bounds):
        return rows.index_select(0, inverse)
    lengths = np.diff(bounds)
    if (lengths < 0).any():
        raise ValueError(
            f"a Ragged's offsets must not decrease, got {bounds[1:][lengths < 0][:1].tolist()} "
            f"after {bounds[:-1][lengths < 0][:1].tolist()}"
        )
    bag = torch.from_numpy(np.repeat(np.arange(size), lengths))
    out = rows.new_zeros(size, rows.shape[1]).index_add_(0, bag, rows.index_select(0, inverse))
    if mode == "mean":
        out = out / torch.from_numpy(lengths).clamp(min=1).unsqueeze(1).to(out.dtype)
    return out


# Offsets tensors found to be 0, 1, ..., size, by id, with the version they
# had then: a batcher hands out the same offsets tensor for every batch of a
# slot with one value per record, so the check runs once per tensor, not per
# batch. (Tensors compare elementwise, so no WeakKeyDictionary.)
_uniform_offsets: dict[int, tuple[weakref.ref, int]] = {}
_uniform_lock = threading.Lock()
_UNIFORM_KEPT = 256


def _one_per_record(offsets: torch.Tensor, bounds: np.ndarray) -> bool:
    version = offsets._version
    known = _uniform_offsets.get(id(offsets))
    if known is not None and known[0]() is offsets and known[1] == version:
        return True
    if not (np.diff(bounds) == 1).all():
        return False
    with _uniform_lock:
        if len(_uniform_offsets) >= _UNIFORM_KEPT:
            _uniform_offsets.clear()
        _uniform_offsets[id(offsets)] = (weakref.ref(offsets), version)
    return True
