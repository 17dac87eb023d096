"""Layers for sparse (feature-id) inputs.

``SparseEmbedding`` is an embedding keyed by arbitrary 64-bit feature ids, with
no vocabulary size: a row is created the first time training sees its id. Its
rows are not torch parameters: they live in a table (in this process, or on the
parameter servers in a PS job, see ``trainer.ps``), and the optimizer returned
by ``fleet.distributed_optimizer`` pushes their gradients on ``step()``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from .embedding import ahead, pending, stores, tables
from .embedding.tables import DEFAULT_INIT_SCALE, TableConfig
from .loop import step_clock
from .ps.tables.entries import (
    CountFilterEntry,
    CtrAccessorParam,
    EntryAttr,
    ProbabilityEntry,
    ShowClickEntry,
)
from .ps.tables.optim import OptimizerSpec
from .ps.tables.pooling import Pooling, pool

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
        storage: ``"float32"`` (the default) or ``"float16"``: the table keeps
            its rows and Adagrad sums as 16-bit floats, half the bytes a row
            (SGD and Adagrad tables; updates computed in float32 and rounded
            at random, right on average).
            Forwards, saves and loads see float32 values.

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
        storage: str = "float32",
    ) -> None:
        super().__init__()
        if not isinstance(dim, int) or dim < 1:
            raise ValueError(f"SparseEmbedding dim must be an int >= 1, got {dim!r}")
        if not isinstance(name, str) or not name:
            raise ValueError(f"SparseEmbedding name must be a non-empty str, got {name!r}")
        if mode not in ("sum", "mean"):
            raise ValueError(f"SparseEmbedding mode must be 'sum' or 'mean', got {mode!r}")
        if storage not in ("float32", "float16"):
            raise ValueError(
                f"SparseEmbedding '{name}': storage must be 'float32' or 'float16', got "
                f"{storage!r}"
            )
        if optimizer is not None:  # fail now, not on the first push
            spec = OptimizerSpec.from_config(optimizer)
            if storage == "float16" and spec.kind not in ("sgd", "adagrad"):
                raise ValueError(
                    f"SparseEmbedding '{name}': storage='float16' keeps SGD and Adagrad "
                    f"tables, got optimizer {spec.kind!r}"
                )
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
            entry, accessor or CtrAccessorParam(), max_rows, storage,
        )
        tables.register(self, self.config)

    def extra_repr(self) -> str:
        """The dimension, table name and pooling mode, for ``repr(module)``."""
        return f"dim={self.dim}, name={self.name!r}, mode={self.mode!r}"

    def _rows(
        self, ids: torch.Tensor, clicked: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, np.ndarray, np.ndarray, bool]:
        """The distinct ids, their rows (float32 numpy), each id's position
        among them (int64 numpy), and whether this is a training pull;
        ``clicked`` (bool per id of ``ids``) adds to the rows' click counts."""
        if ids.dtype not in (torch.int64, torch.uint64):
            raise TypeError(
                f"SparseEmbedding '{self.name}' expects int64 feature ids, got {ids.dtype}"
            )
        if ids.dtype == torch.uint64:
            ids = ids.view(torch.int64)
        training = self.training and torch.is_grad_enabled()
        store = stores.current_store()
        pull_values = getattr(store, "pull_values", None) if training and ids.is_cpu else None
        if pull_values is not None:
            # Tables in this process (local, or a GEO worker's copy): the ids
            # made distinct in the pull's own pass.
            started = time.perf_counter()
            unique, rows, positions = pull_values(self.config, ids.reshape(-1))
        else:
            # Rows pulled ahead for this batch (a PS worker's training loop), or now.
            ahead_pulls = ahead.current() if training else None
            started = time.perf_counter()
            hit = None if ahead_pulls is None else ahead_pulls.take(self.config, ids)
            if hit is not None:
                unique, inverse, pulled = hit
            else:
                unique, inverse = stores.distinct(ids)
                started = time.perf_counter()
                pulled = store.pull(self.config, unique, training)
                if ahead_pulls is not None:
                    ahead.add_network_wait(time.perf_counter() - started)
                    ahead_pulls.learn(self.config, ids)
            rows = np.ascontiguousarray(pulled.detach().to("cpu", torch.float32).numpy())
            positions = inverse.numpy() if inverse.is_cpu else inverse.cpu().numpy()
        if training:
            step_clock.add_pull(time.perf_counter() - started)
            if clicked is not None:
                # One click per id per batch at most, as show counts one per batch.
                per_id = torch.zeros(unique.shape[0], dtype=torch.float32)
                per_id[torch.from_numpy(positions)[clicked.reshape(-1)]] = 1.0
                stores.add_clicks(self.config, unique, per_id)
        return unique, rows, positions, training

    def forward(self, x: Any, click: torch.Tensor | None = None) -> torch.Tensor:
        """The rows of the ids in ``x``: a ``Ragged`` gives each record's rows
        pooled (``[size, dim]``), an int64 tensor ``x.shape + (dim,)``.
        ``click``: one label per record (> 0: clicked), for the click statistics."""
        if isinstance(x, torch.Tensor):
            clicked = None
            if click is not None:
                labels = _labels(click, x.shape[0] if x.dim() else 1, self.name)
                clicked = labels.reshape(-1, *([1] * max(x.dim() - 1, 0))).expand(x.shape)
            return self._output(*self._rows(x, clicked), None, (*x.shape, self.dim))
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
        return self._output(*self._rows(values, clicked), offsets, None)

    def _output(
        self, unique: torch.Tensor, rows: np.ndarray, positions: np.ndarray, training: bool,
        offsets: torch.Tensor | None, shape: tuple[int, ...] | None,
    ) -> torch.Tensor:
        """Each value's row (``offsets`` None; viewed as ``shape``) or each
        record's rows pooled (trainer/ps/tables/pooling.py). Training: the pooled
        output is a leaf of its own, and the rows' gradient comes from its
        gradient when the optimizer pushes (``pending.take_pulls``), with no
        autograd node of the pooling."""
        pooling = Pooling(positions, offsets, self.mode == "mean", rows.shape[0])
        out = pool(rows, pooling)
        if shape is not None:
            out = out.view(shape)
        if not training:
            return out
        out.requires_grad_(True)
        pending.record(self.name, unique, out, pooling)
        # What the model gets is not the leaf itself: it may change it in place.
        return out.clone()


def _labels(click: Any, records: int, name: str) -> torch.Tensor:
    """``click`` as one bool per record (> 0: clicked)."""
    labels = torch.as_tensor(click).detach().reshape(-1)
    if labels.shape[0] != records:
        raise ValueError(
            f"SparseEmbedding '{name}': expected one click label per record ({records}), "
            f"got {labels.shape[0]}"
        )
    return labels.cpu() > 0
