"""Ids: their 64 bits, the server that owns each one, the initial value of its
row (a pure function of the table's seed and the id), and the distinct ids of a
batch (``unique_inverse``, a hash pass in C)."""

from __future__ import annotations

import zlib

import numpy as np
import torch

from ._rows import first_not_owned, unique_inverse

__all__ = [
    "as_u64", "first_not_owned", "init_rows", "mix64", "shard_of", "table_seed", "unique_inverse",
]

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
        ids = ids.numpy() if ids.is_cpu and not ids.requires_grad else ids.detach().cpu().numpy()
    if not isinstance(ids, np.ndarray) or not ids.flags.c_contiguous:
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
