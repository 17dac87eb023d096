# cython: language_level=3
"""The per-batch hot loops of sparse tables, in C.

* ``IdIndex``: open-addressing hash index (linear probing, load <= 1/2),
  uint64 id -> row number (0, 1, 2, ... in order of insertion), keys and row
  numbers in two numpy arrays (no Python object per id). One pass over a
  batch finds or adds every id (``lookup_or_insert``); the vectorised numpy
  version it replaces needed several passes and a sort per probe round.
* ``unique_inverse``: a batch's distinct ids and each id's position among them,
  by hashing (O(n), first-appearance order) rather than numpy's sort.
* ``adagrad_rows`` / ``sgd_rows``: torch's Adagrad / SGD update applied in
  place to a table's rows, without gathering rows and state into copies and
  scattering them back.
* ``touch_rows``: a training pull's per-row statistics (show count, last-seen
  tick, changed-since-save flag) in one pass.

Rows are removed by a rebuild (``IdIndex.rebuild``), not by tombstones: a table
drops rows in bulk (``shrink``, or a budget's eviction of a sixteenth of its
rows at a time) and compacts its row arrays then anyway, since rows are
numbered densely; rebuilding the index from the kept ids costs one insert per
kept row (about 40 ms per million rows), and leaves probe chains as short as a
fresh index's, where tombstones would lengthen them until the next rebuild.

Every function takes numpy arrays and releases the GIL for its loop, so RPC
handler threads and Hogwild trainer threads run them in parallel.
"""

import numpy as np

from libc.math cimport sqrtf
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t

_MIN_CAPACITY = 1024


cdef inline uint64_t _mix64(uint64_t x) noexcept nogil:
    # splitmix64's finaliser: ids that differ in any bit land in unrelated slots.
    x ^= x >> 30
    x *= <uint64_t>0xBF58476D1CE4E5B9
    x ^= x >> 27
    x *= <uint64_t>0x94D049BB133111EB
    x ^= x >> 31
    return x


def _as_u64(ids):
    ids = np.ascontiguousarray(ids).reshape(-1)
    if ids.dtype == np.uint64:
        return ids
    if ids.dtype == np.int64:
        return ids.view(np.uint64)
    raise TypeError(f"feature ids must be int64 or uint64, got {ids.dtype}")


cdef class IdIndex:
    """uint64 id -> row number (0, 1, 2, ... in order of insertion).

    Not thread-safe by itself: a ``SparseTable`` holds its lock around every call.
    """

    cdef object _keys_array
    cdef object _rows_array
    cdef uint64_t[::1] _keys
    cdef int64_t[::1] _rows  # -1: empty slot
    cdef readonly int64_t size

    def __init__(self, capacity=_MIN_CAPACITY):
        capacity = max(_MIN_CAPACITY, 1 << (int(capacity) - 1).bit_length())
        self._allocate(capacity)
        self.size = 0

    cdef _allocate(self, int64_t capacity):
        self._keys_array = np.zeros(capacity, dtype=np.uint64)
        self._rows_array = np.full(capacity, -1, dtype=np.int64)
        self._keys = self._keys_array
        self._rows = self._rows_array

    @property
    def capacity(self):
        return self._keys.shape[0]

    cdef inline int64_t _slot(self, uint64_t key) noexcept nogil:
        """The slot holding ``key``, or the empty slot where it would go."""
        cdef uint64_t mask = <uint64_t>(self._keys.shape[0] - 1)
        cdef uint64_t pos = _mix64(key) & mask
        while self._rows[pos] >= 0 and self._keys[pos] != key:
            pos = (pos + 1) & mask
        return <int64_t>pos

    def lookup(self, ids):
        """Row number of each id, -1 where the id is absent."""
        cdef uint64_t[::1] keys = _as_u64(ids)
        out = np.empty(keys.shape[0], dtype=np.int64)
        cdef int64_t[::1] rows = out
        cdef Py_ssize_t i
        with nogil:
            for i in range(keys.shape[0]):
                rows[i] = self._rows[self._slot(keys[i])]
        return out

    def lookup_or_insert(self, ids):
        """Row number of each id, adding absent ids (new rows numbered from
        ``size`` in order of first appearance; a repeated id gets one row)."""
        cdef uint64_t[::1] keys = _as_u64(ids)
        cdef Py_ssize_t n = keys.shape[0]
        if 2 * (self.size + n) > self.capacity:
            self._grow(self.size + n)
        out = np.empty(n, dtype=np.int64)
        cdef int64_t[::1] rows = out
        cdef Py_ssize_t i
        cdef int64_t slot
        with nogil:
            for i in range(n):
                slot = self._slot(keys[i])
                if self._rows[slot] < 0:
                    self._keys[slot] = keys[i]
                    self._rows[slot] = self.size
                    self.size += 1
                rows[i] = self._rows[slot]
        return out

    def insert_new(self, ids):
        """Adds ids known to be absent; returns their row numbers."""
        return self.lookup_or_insert(ids)

    def rebuild(self, ids):
        """Replaces the index by one of ``ids`` (distinct), numbered 0, 1, 2,
        ... in their order: how a table drops rows and renumbers the rest."""
        ids = _as_u64(ids)
        capacity = _MIN_CAPACITY
        while 2 * ids.shape[0] > capacity:
            capacity *= 2
        self._allocate(capacity)
        self.size = 0
        if ids.shape[0]:
            self.lookup_or_insert(ids)

    def _grow(self, int64_t needed):
        cdef int64_t capacity = self.capacity
        while 2 * needed > capacity:
            capacity *= 2
        ids = self.ids_in_row_order()
        self._allocate(capacity)
        self.size = 0
        if ids.shape[0]:
            self.lookup_or_insert(ids)

    def ids_in_row_order(self):
        """Every id, in row-number order (uint64)."""
        out = np.empty(self.size, dtype=np.uint64)
        cdef uint64_t[::1] ids = out
        cdef Py_ssize_t pos
        with nogil:
            for pos in range(self._rows.shape[0]):
                if self._rows[pos] >= 0:
                    ids[self._rows[pos]] = self._keys[pos]
        return out


def unique_inverse(ids):
    """``(unique, inverse)`` of an int64/uint64 array: its distinct values in
    order of first appearance (same dtype) and each value's position among them,
    so that ``unique[inverse]`` equals ``ids``."""
    array = np.ascontiguousarray(ids).reshape(-1)
    cdef uint64_t[::1] keys = _as_u64(array)
    cdef Py_ssize_t n = keys.shape[0]
    cdef int64_t capacity = 16
    while capacity < 2 * n:
        capacity *= 2
    slots_array = np.full(capacity, -1, dtype=np.int64)  # -> position in unique
    cdef int64_t[::1] slots = slots_array
    unique_array = np.empty(n, dtype=np.uint64)
    cdef uint64_t[::1] unique = unique_array
    inverse_array = np.empty(n, dtype=np.int64)
    cdef int64_t[::1] inverse = inverse_array
    cdef uint64_t mask = <uint64_t>(capacity - 1)
    cdef uint64_t pos
    cdef int64_t count = 0
    cdef Py_ssize_t i
    with nogil:
        for i in range(n):
            pos = _mix64(keys[i]) & mask
            while slots[pos] >= 0 and unique[slots[pos]] != keys[i]:
                pos = (pos + 1) & mask
            if slots[pos] < 0:
                slots[pos] = count
                unique[count] = keys[i]
                count += 1
            inverse[i] = slots[pos]
    return unique_array[:count].view(array.dtype), inverse_array


def adagrad_rows(float[:, ::1] weights, float[:, ::1] state_sum, int64_t[::1] rows,
                 float[:, ::1] grads, float lr, float eps, float weight_decay):
    """torch.optim.Adagrad's step (lr_decay 0) on ``weights[rows]`` in place,
    ``state_sum`` its squared-gradient sums. ``rows`` must be distinct."""
    cdef Py_ssize_t i, j, dim = weights.shape[1]
    cdef int64_t row
    cdef float g
    _check_rows(weights, rows, grads)
    if state_sum.shape[0] < weights.shape[0] or state_sum.shape[1] != dim:
        raise ValueError(
            f"Adagrad state of shape ({state_sum.shape[0]}, {state_sum.shape[1]}) does not "
            f"fit weights of shape ({weights.shape[0]}, {dim})"
        )
    with nogil:
        for i in range(rows.shape[0]):
            row = rows[i]
            for j in range(dim):
                g = grads[i, j]
                if weight_decay != 0:
                    g = g + weight_decay * weights[row, j]
                state_sum[row, j] += g * g
                weights[row, j] -= lr * (g / (sqrtf(state_sum[row, j]) + eps))


def sgd_rows(float[:, ::1] weights, int64_t[::1] rows, float[:, ::1] grads, float lr,
             float weight_decay):
    """torch.optim.SGD's step (no momentum) on ``weights[rows]`` in place."""
    cdef Py_ssize_t i, j, dim = weights.shape[1]
    cdef int64_t row
    cdef float g
    _check_rows(weights, rows, grads)
    with nogil:
        for i in range(rows.shape[0]):
            row = rows[i]
            for j in range(dim):
                g = grads[i, j]
                if weight_decay != 0:
                    g = g + weight_decay * weights[row, j]
                weights[row, j] -= lr * g


def touch_rows(float[::1] show, uint32_t[::1] last_tick, uint8_t[::1] changed,
               int64_t[::1] rows, uint32_t tick):
    """A training pull of ``rows`` (-1: absent, skipped): each row's show count
    goes up by one, its last-seen tick becomes ``tick`` and it is flagged
    changed since the last save."""
    cdef Py_ssize_t i
    cdef int64_t row
    cdef int64_t allocated = show.shape[0]
    if last_tick.shape[0] < allocated or changed.shape[0] < allocated:
        raise ValueError("touch_rows: the statistics arrays differ in length")
    for i in range(rows.shape[0]):
        if rows[i] >= allocated:
            raise IndexError(f"row {rows[i]} outside the table's {allocated} rows")
    with nogil:
        for i in range(rows.shape[0]):
            row = rows[i]
            if row >= 0:
                show[row] += 1
                last_tick[row] = tick
                changed[row] = 1


cdef _check_rows(float[:, ::1] weights, int64_t[::1] rows, float[:, ::1] grads):
    if grads.shape[0] != rows.shape[0] or grads.shape[1] != weights.shape[1]:
        raise ValueError(
            f"expected gradients of shape ({rows.shape[0]}, {weights.shape[1]}), "
            f"got ({grads.shape[0]}, {grads.shape[1]})"
        )
    cdef Py_ssize_t i
    cdef int64_t allocated = weights.shape[0]
    for i in range(rows.shape[0]):
        if rows[i] < 0 or rows[i] >= allocated:
            raise IndexError(f"row {rows[i]} outside the table's {allocated} rows")
