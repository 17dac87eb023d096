"""A SparseEmbedding's pooling in C: each record's sum or mean of its ids'
rows (``pool``), and the rows' gradient from the pooled output's
(``Pooling.rows_gradient``), in place of a gather and a scatter-add as torch
ops, whose autograd nodes cost more than the rest of a small model's
embedding step (benchmarks/results/small_ctr.md)."""

from __future__ import annotations

import numpy as np
import torch

from ._row_updates import pool_rows, unpool_rows

__all__ = ["Pooling", "pool"]


class Pooling:
    """How an output comes from a batch's distinct rows: ``positions``, each
    value's row among them; ``bounds``, each record's values (None: one per
    record); ``mean``: averaged, not summed (Ragged input only); ``count``:
    the rows."""

    __slots__ = ("bounds", "count", "mean", "positions")

    def __init__(
        self, positions: np.ndarray, offsets: torch.Tensor | None, mean: bool, count: int
    ) -> None:
        self.positions = positions
        self.bounds = None if offsets is None else _bounds(offsets, self.positions.shape[0])
        self.mean = mean and self.bounds is not None
        self.count = count

    def rows_gradient(self, grad: torch.Tensor) -> torch.Tensor:
        """The rows' gradient, float32 [count, dim], from the output's."""
        return torch.from_numpy(unpool_rows(
            self.output_gradient(grad), self.positions, self.bounds, self.mean, self.count
        ))

    def output_gradient(self, grad: torch.Tensor) -> np.ndarray:
        """The output's gradient as float32 numpy [records, dim]."""
        if grad.dtype != torch.float32 or not grad.is_cpu or grad.requires_grad:
            grad = grad.detach().to("cpu", torch.float32)
        records = self.positions.shape[0] if self.bounds is None else self.bounds.shape[0] - 1
        return np.ascontiguousarray(grad.numpy()).reshape(records, grad.shape[-1])


def pool(rows: np.ndarray, pooling: Pooling) -> torch.Tensor:
    """Each value's row (one per record) or each record's rows (float32
    [count, dim]) pooled: float32 [records, dim], a new tensor."""
    pooled = pool_rows(rows, pooling.positions, pooling.bounds, pooling.mean)
    if pooled is None:
        _raise_decreasing(pooling.bounds)
    return torch.from_numpy(pooled)


def _bounds(offsets: torch.Tensor, values: int) -> np.ndarray:
    """A Ragged's offsets as int64 numpy, checked to run from 0 to ``values``
    (``pool_rows`` finds offsets that decrease)."""
    bounds = offsets.numpy() if offsets.is_cpu else offsets.cpu().numpy()
    if bounds.dtype != np.int64:
        bounds = bounds.astype(np.int64)
    if bounds.ndim != 1 or bounds.shape[0] < 1 or bounds[0] != 0 or bounds[-1] != values:
        raise ValueError(
            f"a Ragged's offsets must run from 0 to the number of values ({values}), "
            f"got {bounds[:1].tolist()} ... {bounds[-1:].tolist()}"
        )
    return np.ascontiguousarray(bounds)


def _raise_decreasing(bounds: np.ndarray) -> None:
    lengths = np.diff(bounds)
    raise ValueError(
        f"a Ragged's offsets must not decrease, got {bounds[1:][lengths < 0][:1].tolist()} "
        f"after {bounds[:-1][lengths < 0][:1].tolist()}"
    )
