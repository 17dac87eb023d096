"""Sparse tables: rows keyed by arbitrary 64-bit ids, with optimizer state.

A table keeps no Python object per row. ``IdIndex`` (``_rows.pyx``) is an
open-addressing hash index (linear probing) held in two numpy arrays, probed in
C for a whole batch of ids at once; rows and optimizer state live in growable
float32 arrays addressed by the row numbers the index hands out, and SGD and
Adagrad update them in place (C loops, also in ``_rows.pyx``). The same class
serves a parameter server's shard and a local (non-distributed) table.

A row that was never written holds its initial value, a pure function of the
table's seed and the id (``init_rows``), so every process and every server agrees
on it without talking to the others, and a read-only lookup (evaluation) needs
not create the row.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ..job.errors import CheckpointError
from ._rows import IdIndex, adagrad_rows, sgd_rows
from .optim import OptimizerSpec

__all__ = ["IdIndex", "SparseTable", "as_u64", "init_rows", "mix64", "shard_of", "shown"]

_U64 = np.uint64
_GOLDEN = _U64(0x9E3779B97F4A7C15)
_MIX1 = _U64(0xBF58476D1CE4E5B9)
_MIX2 = _U64(0x94D049BB133111EB)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over a uint64 array (wrapping arithmetic)."""
    x = x.astype(_U64, copy=True)
    x ^= x >> _U64(30)
    x *= _MIX1
    x ^= x >> _U64(27)
    x *= _MIX2
    x ^= x >> _U64(31)
    return x


def as_u64(ids: np.ndarray | torch.Tensor) -> np.ndarray:
    """The ids' 64 bits as a uint64 numpy array (int64 tensors carry uint64 ids)."""
    if isinstance(ids, torch.Tensor):
        ids = ids.detach().to("cpu").numpy()
    ids = np.ascontiguousarray(ids)
    if ids.dtype == np.uint64:
        return ids.reshape(-1)
    if ids.dtype != np.int64:
        raise TypeError(f"feature ids must be int64 or uint64, got {ids.dtype}")
    return ids.reshape(-1).view(_U64)


def shard_of(ids: np.ndarray, shards: int) -> np.ndarray:
    """The server (0..shards-1) that owns each id: a hash of the id mod ``shards``."""
    if shards == 1:
        return np.zeros(ids.shape[0], dtype=np.int64)
    # Shift first: the low bits of mix64 also index the servers' hash tables.
    return ((mix64(as_u64(ids) ^ _U64(0x5EED)) >> _U64(33)) % _U64(shards)).astype(np.int64)


def table_seed(name: str, seed: int) -> np.uint64:
    """A 64-bit seed for one table: the global seed mixed with the table's name."""
    base = (int(seed) & 0xFFFFFFFF) << 32 | zlib.crc32(name.encode())
    return mix64(np.array([base], dtype=_U64))[0]


def init_rows(ids: np.ndarray, dim: int, seed: np.uint64, scale: float) -> np.ndarray:
    """Initial rows for ``ids``: uniform in [-scale, scale), a function of (seed, id)."""
    ids = as_u64(ids)
    column = (np.arange(1, dim + 1, dtype=_U64) * _GOLDEN)[None, :]
    bits = mix64((mix64(ids ^ seed)[:, None] + column).reshape(-1)).reshape(-1, dim)
    unit = (bits >> _U64(40)).astype(np.float32) * np.float32(1.0 / (1 << 24))
    return (unit * np.float32(2 * scale) - np.float32(scale)).astype(np.float32)


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
    """

    def __init__(
        self,
        name: str,
        dim: int,
        optimizer: OptimizerSpec,
        seed: int = 0,
        init_scale: float = 0.01,
    ) -> None:
        if dim < 1:
            raise ValueError(f"table '{name}': dim must be >= 1, got {dim}")
        self.name = name
        self.dim = int(dim)
        self.optimizer = optimizer
        self.seed = int(seed)
        self.init_scale = float(init_scale)
        self._seed64 = table_seed(name, seed)
        self._index = IdIndex()
        self._lock = threading.Lock()
        self._weights = np.zeros((0, self.dim), dtype=np.float32)
        self._state: dict[str, np.ndarray] = {
            key: np.zeros((0, *shape(self.dim)), dtype=dtype)
            for key, (shape, dtype) in optimizer.state_layout().items()
        }

    def __len__(self) -> int:
        return self._index.size

    def set_optimizer(self, optimizer: OptimizerSpec) -> None:
        """Replaces the optimizer; every row's optimizer state starts afresh."""
        with self._lock:
            self.optimizer = optimizer
            allocated = self._weights.shape[0]
            self._state = {}
            for key, (shape, dtype) in optimizer.state_layout().items():
                array = np.empty((allocated, *shape(self.dim)), dtype=dtype)
                array.fill(optimizer.initial_state(key))
                self._state[key] = array

    def init_rows(self, ids: np.ndarray) -> np.ndarray:
        return init_rows(ids, self.dim, self._seed64, self.init_scale)

    # -- rows ---------------------------------------------------------------

    def _reserve(self, rows: int) -> None:
        allocated = self._weights.shape[0]
        if rows <= allocated:
            return
        new = max(rows, 2 * allocated, 1024)
        self._weights = _grown(self._weights, new)
        for key, array in self._state.items():
            self._state[key] = _grown(array, new)

    def _rows_for(self, ids: np.ndarray, create: bool) -> np.ndarray:
        """Row numbers of distinct ``ids``, creating missing rows when asked
        (else -1 where missing). Caller holds the lock."""
        if not create:
            return self._index.lookup(ids)
        before = self._index.size
        rows = self._index.lookup_or_insert(ids)
        if self._index.size > before:
            new = rows >= before
            new_rows = rows[new]
            self._reserve(self._index.size)
            self._weights[new_rows] = self.init_rows(ids[new])
            for key in self.optimizer.state_layout():
                self._state[key][new_rows] = self.optimizer.initial_state(key)
        return rows

    # -- by row number (a caller that looked ids up once, e.g. GEO's local
    # tables, reuses the numbers: rows are never removed or renumbered) -------

    def rows(self, ids: np.ndarray | torch.Tensor, create: bool = True) -> np.ndarray:
        """Row numbers of distinct ``ids`` (-1 where absent and not created)."""
        ids = as_u64(ids)
        with self._lock:
            return self._rows_for(ids, create)

    def read_rows(self, rows: np.ndarray) -> np.ndarray:
        """A copy of the weights of existing ``rows``."""
        with self._lock:
            return self._weights[rows]

    def write_rows(self, rows: np.ndarray, values: np.ndarray) -> None:
        """Overwrites the weights of existing ``rows`` (optimizer state unchanged)."""
        with self._lock:
            self._weights[rows] = values

    def push_rows(self, rows: np.ndarray, grads: torch.Tensor | np.ndarray) -> None:
        """Applies the optimizer to existing, distinct ``rows`` with ``grads``."""
        grad = _as_f32(grads, rows.shape[0], self.dim, self.name)
        with self._lock:
            self._apply(rows, grad)

    def _apply(self, rows: np.ndarray, grad: np.ndarray) -> None:
        # Caller holds the lock; rows are distinct.
        kind, hyper = self.optimizer.kind, self.optimizer.hyper
        if kind in ("sgd", "adagrad"):
            # In place, without gathering rows and state into copies.
            rows = np.ascontiguousarray(rows, dtype=np.int64)
            grad = np.ascontiguousarray(grad, dtype=np.float32)
            lr, decay = float(hyper["lr"]), float(hyper["weight_decay"])
            if kind == "sgd":
                sgd_rows(self._weights, rows, grad, lr, decay)
            else:
                eps = float(hyper["eps"])
                adagrad_rows(self._weights, self._state["sum"], rows, grad, lr, eps, decay)
            return
        weights = self._weights[rows]
        state = {key: array[rows] for key, array in self._state.items()}
        self.optimizer.apply(weights, grad, state)
        self._weights[rows] = weights
        for key, value in state.items():
            self._state[key][rows] = value

    def pull(self, ids: np.ndarray | torch.Tensor, create: bool = True) -> torch.Tensor:
        """The rows of distinct ``ids`` as a new float32 tensor [len(ids), dim].

        With ``create=False`` absent rows read as their initial value and the
        table is left unchanged (inference).
        """
        ids = as_u64(ids)
        with self._lock:
            rows = self._rows_for(ids, create)
            out = np.empty((ids.shape[0], self.dim), dtype=np.float32)
            present = rows >= 0
            out[present] = self._weights[rows[present]]
        if not present.all():
            out[~present] = self.init_rows(ids[~present])
        return torch.from_numpy(out)

    def push(self, ids: np.ndarray | torch.Tensor, grads: torch.Tensor) -> None:
        """Applies the optimizer to the rows of distinct ``ids`` with ``grads``."""
        ids = as_u64(ids)
        grad = _as_f32(grads, ids.shape[0], self.dim, self.name)
        with self._lock:
            self._apply(self._rows_for(ids, create=True), grad)

    def add(self, ids: np.ndarray | torch.Tensor, deltas: torch.Tensor) -> torch.Tensor:
        """Adds ``deltas`` to the rows of distinct ``ids`` (GEO); returns the new rows."""
        ids = as_u64(ids)
        delta = _as_f32(deltas, ids.shape[0], self.dim, self.name)
        with self._lock:
            rows = self._rows_for(ids, create=True)
            self._weights[rows] += delta
            out = self._weights[rows]
        return torch.from_numpy(out)

    # -- persistence --------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Every row and its optimizer state, as tensors (``torch.load(weights_only=True)``)."""
        with self._lock:
            n = self._index.size
            out: dict[str, Any] = {
                "name": self.name,
                "dim": self.dim,
                "optimizer": self.optimizer.kind,
                "ids": torch.from_numpy(self._index.ids_in_row_order().view(np.int64).copy()),
                "weights": torch.from_numpy(self._weights[:n].copy()),
            }
            for key, array in self._state.items():
                out["state." + key] = torch.from_numpy(array[:n].copy())
        return out

    def check_state_dict(
        self, state: Any, keep: np.ndarray | None = None, *, where: str | None = None
    ) -> None:
        """Checks that ``state`` is rows saved by ``state_dict`` that fit this
        table (its ``dim``; with the same optimizer kind, its state's shapes).

        Args:
            keep: as for ``load_state_dict``.
            where: the file it was read from, for messages.

        Raises:
            CheckpointError: a key missing, a value of the wrong type or shape,
                or lengths that disagree.
        """
        where = where or f"table '{self.name}'"

        def refuse(message: str) -> CheckpointError:
            return CheckpointError(f"{where}: {message}", path=where)

        if not isinstance(state, Mapping):
            raise refuse(f"expected a dict of the table's rows, found {type(state).__name__}")
        for key in ("dim", "ids", "weights"):
            if key not in state:
                keys = shown(sorted(map(str, state)))
                raise refuse(f"expected the key {key!r}, found keys {keys}")
        if not _is_int(state["dim"]) or state["dim"] != self.dim:
            raise refuse(
                f"'dim': expected {self.dim} (table '{self.name}'), found {shown(state['dim'])}"
            )
        ids = state["ids"]
        if not (isinstance(ids, torch.Tensor) and ids.dtype == torch.int64 and ids.dim() == 1):
            raise refuse(f"'ids': expected a 1-D int64 tensor, found {shown(ids)}")
        n = ids.shape[0]
        weights = state["weights"]
        if _is_float_rows(weights, self.dim) and weights.shape[0] != n:
            raise refuse(f"expected as many rows of 'weights' as ids ({n}), found {len(weights)}")
        if not (_is_float_rows(weights, self.dim) and weights.shape[0] == n):
            raise refuse(
                f"'weights': expected a float tensor of shape [{n}, {self.dim}], "
                f"found {shown(weights)}"
            )
        if keep is not None and not (
            isinstance(keep, np.ndarray) and keep.dtype == np.bool_ and keep.shape == (n,)
        ):
            raise refuse(f"keep: expected {n} bools, found {shown(keep)}")
        if state.get("optimizer") != self.optimizer.kind:
            return  # its optimizer state is not loaded
        for key, (shape, _dtype) in self.optimizer.state_layout().items():
            saved = state.get("state." + key)
            want = [n, *shape(self.dim)]
            if not (
                isinstance(saved, torch.Tensor)
                and saved.is_floating_point()
                and list(saved.shape) == want
            ):
                raise refuse(
                    f"'state.{key}': expected a float tensor of shape {want} "
                    f"({self.optimizer.kind}'s state of each row), found {shown(saved)}"
                )

    def load_state_dict(
        self, state: Mapping[str, Any], keep: np.ndarray | None = None, *, where: str | None = None
    ) -> None:
        """Loads rows saved by ``state_dict`` (rows of other tables' shards
        included), keeping only the rows where ``keep`` is true when given.
        Optimizer state of another optimizer kind is dropped (rows start fresh
        state). Checks all of ``state`` first (``check_state_dict``): a refused
        state adds no row."""
        self.check_state_dict(state, keep, where=where)
        ids = as_u64(state["ids"].numpy())
        weights = state["weights"].numpy()
        same_optimizer = state.get("optimizer") == self.optimizer.kind
        if keep is not None:
            ids, weights = ids[keep], weights[keep]
        with self._lock:
            rows = self._rows_for(ids, create=True)
            self._weights[rows] = weights
            if same_optimizer:
                for key in self._state:
                    saved = state["state." + key].numpy()
                    self._state[key][rows] = saved[keep] if keep is not None else saved


def shown(value: Any) -> str:
    """A short description of ``value`` for an error message: a tensor's dtype
    and shape, a bounded ``repr`` otherwise (a hand-edited file may hold huge
    values; an int's repr over 4,300 digits raises)."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return f"a {value.dtype} {type(value).__name__} of shape {list(value.shape)}"
    if _is_int(value) and value.bit_length() > 128:
        return f"an int of {value.bit_length()} bits"
    if value is None or isinstance(value, (bool, int, float, str)):
        text = repr(value)
        return text if len(text) <= 80 else text[:77] + "..."
    if isinstance(value, (list, tuple)) and len(value) <= 8:
        return "[" + ", ".join(shown(v) for v in value) + "]"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)} items"
    return f"a {type(value).__name__}"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_float_rows(value: Any, dim: int) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and value.dim() == 2
        and value.shape[1] == dim
    )


def _grown(array: np.ndarray, rows: int) -> np.ndarray:
    out = np.zeros((rows, *array.shape[1:]), dtype=array.dtype)
    out[: array.shape[0]] = array
    return out


def _as_f32(values: torch.Tensor | np.ndarray, n: int, dim: int, name: str) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().to("cpu", torch.float32).numpy()
    values = np.asarray(values, dtype=np.float32)
    if values.shape != (n, dim):
        raise ValueError(
            f"table '{name}': expected values of shape ({n}, {dim}), got {tuple(values.shape)}"
        )
    return values
