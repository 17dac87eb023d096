"""The worker side of the parameter server: where rows are pulled from and how a
step is pushed, per mode.

* ``RemoteStore`` (async, sync): a forward pulls its table's distinct ids from
  the servers that own them, all servers in parallel.
* ``GeoStore`` (GEO): a forward reads a local copy of the rows; ids it has not
  seen are pulled from the servers first. Training updates the local copy; every
  k steps the worker pushes each touched row's change since its last sync
  (delta) and takes the servers' merged value back.
* ``DistributedOptimizer``: what ``fleet.distributed_optimizer`` returns; its
  ``step()`` does the mode's push.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from . import server as handlers
from . import sparse
from .sparse import TableConfig
from .table import SparseTable, as_u64, shard_of
from .transport import ServerSet


def split_by_server(ids: np.ndarray, server_num: int) -> list[np.ndarray]:
    """Positions of ``ids`` owned by each server."""
    owners = shard_of(ids, server_num)
    return [np.flatnonzero(owners == s) for s in range(server_num)]


def _int64(ids: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(ids).view(np.int64))


class RemoteStore:
    """Rows pulled from the servers on every forward."""

    def __init__(self, servers: ServerSet) -> None:
        self.servers = servers

    def pull(self, config: TableConfig, ids: torch.Tensor, training: bool) -> torch.Tensor:
        u64 = as_u64(ids)
        out = torch.empty(u64.shape[0], config.dim, dtype=torch.float32)
        parts = split_by_server(u64, len(self.servers))
        futures = []
        for s, positions in enumerate(parts):
            if positions.size:
                futures.append((s, positions, self.servers.call_async(
                    s, handlers.pull_sparse, config.name, _int64(u64[positions]), training
                )))
        for s, positions, future in futures:
            out[torch.from_numpy(positions)] = self.servers.wait(s, future, "pull_sparse")
        return out


def shard_sparse(
    gradients: dict[str, tuple[np.ndarray, torch.Tensor]], server_num: int
) -> list[dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """Per-server parts of per-table (ids, values)."""
    out: list[dict[str, tuple[torch.Tensor, torch.Tensor]]] = [{} for _ in range(server_num)]
    for name, (ids, values) in gradients.items():
        for s, positions in enumerate(split_by_server(ids, server_num)):
            if positions.size:
                index = torch.from_numpy(positions)
                out[s][name] = (_int64(ids[positions]), values.index_select(0, index))
    return out


def shard_dense(values: dict[int, torch.Tensor], server_num: int) -> list[dict[int, torch.Tensor]]:
    out: list[dict[int, torch.Tensor]] = [{} for _ in range(server_num)]
    for i, value in values.items():
        out[i % server_num][i] = value
    return out


class GeoStore:
    """The worker's local copy of the rows it uses (GEO mode)."""

    def __init__(self, servers: ServerSet, make_table: Callable[[TableConfig], SparseTable]) -> None:
        self.servers = servers
        self.remote = RemoteStore(servers)
        self._make_table = make_table
        self._lock = threading.Lock()
        self.local: dict[str, SparseTable] = {}  # rows as trained here
        self.base: dict[str, SparseTable] = {}  # rows as of the last sync
        self.touched: dict[str, list[np.ndarray]] = {}

    def _tables(self, config: TableConfig) -> tuple[SparseTable, SparseTable]:
        with self._lock:
            if config.name not in self.local:
                self.local[config.name] = self._make_table(config)
                self.base[config.name] = self._make_table(config)
            return self.local[config.name], self.base[config.name]

    def pull(self, config: TableConfig, ids: torch.Tensor, training: bool) -> torch.Tensor:
        local, base = self._tables(config)
        u64 = as_u64(ids)
        missing = ~local.present(u64)
        if missing.any():
            fetched = self.remote.pull(config, _int64(u64[missing]), training)
            if not training:
                out = local.pull(u64, create=False)
                out[torch.from_numpy(np.flatnonzero(missing))] = fetched
                return out
            local.assign(u64[missing], fetched)
            base.assign(u64[missing], fetched)
        return local.pull(u64, create=False)

    def apply(self, gradients: dict[str, tuple[np.ndarray, torch.Tensor]]) -> None:
        """Trains the local rows (the table's optimizer) and notes what changed."""
        for name, (ids, grads) in gradients.items():
            self.local[name].push(ids, grads)
            self.touched.setdefault(name, []).append(ids)

    def deltas(self) -> dict[str, tuple[np.ndarray, torch.Tensor]]:
        """Per table: the rows trained since the last sync and their change."""
        out = {}
        for name, parts in self.touched.items():
            ids = np.unique(np.concatenate(parts))
            out[name] = (ids, self.local[name].pull(ids, create=False) - self.base[name].pull(ids, create=False))
        self.touched = {}
        return out

    def clear(self) -> None:
        """Forgets every local row (the next pulls fetch the servers' values)."""
        with self._lock:
            self.local.clear()
            self.base.clear()
            self.touched = {}

    def refresh(self, name: str, ids: np.ndarray, rows: torch.Tensor) -> None:
        self.local[name].assign(ids, rows)
        self.base[name].assign(ids, rows)


class DistributedOptimizer:
    """A torch optimizer whose ``step()`` also moves sparse rows (and, in PS
    mode, dense parameters) through the parameter-server runtime.

    Everything else (``param_groups``, ``state_dict()``, ``zero_grad()``,
    lr schedulers) is the wrapped optimizer's.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, step: Callable[[], None]) -> None:
        self.optimizer = optimizer
        self._step = step

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = closure() if closure is not None else None
        self._step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def minimize(self, loss: torch.Tensor) -> None:
        """Paddle's spelling: backward, step, zero_grad."""
        loss.backward()
        self.step()
        self.zero_grad()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)

    def __repr__(self) -> str:
        return f"DistributedOptimizer({self.optimizer!r})"


def dense_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer's parameters in order: their index is their name on the servers."""
    seen: set[int] = set()
    out = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


def dense_grads(params: Sequence[torch.Tensor]) -> dict[int, torch.Tensor]:
    return {i: p.grad.detach() for i, p in enumerate(params) if p.grad is not None}


def take_sparse() -> dict[str, tuple[np.ndarray, torch.Tensor]]:
    return sparse.take_gradients()
