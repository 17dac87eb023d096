# cython: language_level=3
"""The per-step updates of sparse rows, in C (the index and pulls are in
_rows.pyx).

* ``adagrad_rows`` / ``sgd_rows``: torch's Adagrad / SGD update applied in
  place to a table's rows, without gathering rows and state into copies and
  scattering them back.
* ``pool_rows`` / ``unpool_rows``: a SparseEmbedding's pooling (each
  record's sum or mean of its ids' rows) and the rows' gradient from the
  pooled output's, without a torch op (and its autograd node) per step;
  ``push_pooled`` takes that gradient and applies SGD or Adagrad in one call.
* ``add_scaled_rows`` (a server's side of a GEO sync), ``take_changes`` and
  ``merge_rows`` (a GEO worker's local copy): each a single pass over the
  rows of a sync, where numpy's fancy indexing gathers and scatters copies.

Every function takes numpy arrays and releases the GIL for its loop.
"""

import numpy as np

from libc.math cimport sqrtf
from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport calloc, free

from trainer.ps.tables._rows cimport (
    _AHEAD,
    RowStat,
    __builtin_prefetch,
    _check_record_rows,
    _get,
    _put,
    _records,
    _row_records,
    row_t,
)

from trainer.ps.tables._rows import _record_bytes


cdef extern from "<math.h>" nogil:
    # C99's type-generic macro, on a float (libc.math's takes a long double).
    bint _float_is_finite "isfinite"(float value)


def pool_rows(const float[:, ::1] rows, const int64_t[::1] inverse, offsets, bint mean):
    """Each record's pooled row: ``out[r]`` (float32 [records, dim]) is the sum
    (``mean``: the average; 0 for a record without values) of
    ``rows[inverse[v]]`` over its values ``v`` in ``offsets[r]:offsets[r+1]``
    (int64, from 0 to ``len(inverse)``); ``offsets`` None: one value per
    record. Sums run in value order from 0, as torch's ``index_add_``.
    Returns None when the offsets decrease somewhere (the caller says where).

    Raises:
        ValueError: offsets that do not run from 0 to ``len(inverse)``.
        IndexError: a position outside ``rows``."""
    cdef Py_ssize_t dim = rows.shape[1]
    cdef Py_ssize_t records = _records_of(inverse, offsets, rows.shape[0])
    cdef const int64_t[::1] bounds = offsets if offsets is not None else inverse
    out_array = np.zeros((records, dim), dtype=np.float32)
    cdef float[:, ::1] out = out_array
    cdef Py_ssize_t r, v, j, start, stop
    cdef int64_t u
    cdef float length
    cdef bint ragged = offsets is not None, decreasing = False
    with nogil:
        for r in range(records):
            if ragged:
                start, stop = bounds[r], bounds[r + 1]
            else:
                start, stop = r, r + 1
            if stop < start:
                decreasing = True
                break
            for v in range(start, stop):
                u = inverse[v]
                for j in range(dim):
                    out[r, j] += rows[u, j]
            if mean and stop - start > 1:
                length = <float>(stop - start)
                for j in range(dim):
                    out[r, j] = out[r, j] / length
    return None if decreasing else out_array


def unpool_rows(const float[:, ::1] grad, const int64_t[::1] inverse, offsets, bint mean,
                Py_ssize_t count):
    """The gradient of the rows (float32 [count, dim]) that ``pool_rows`` pooled
    into an output whose gradient is ``grad``: row ``inverse[v]`` gets record
    ``r``'s gradient (``mean``: divided by its number of values) for each of
    its values ``v``, added in value order, as torch's autograd of the gather
    and scatter-add that ``pool_rows`` stands for."""
    cdef Py_ssize_t dim = grad.shape[1]
    cdef Py_ssize_t records = _records_of(inverse, offsets, count)
    if grad.shape[0] != records:
        raise ValueError(f"expected the gradient of {records} records, got {grad.shape[0]}")
    cdef const int64_t[::1] bounds = offsets if offsets is not None else inverse
    out_array = np.zeros((count, dim), dtype=np.float32)
    cdef float[:, ::1] out = out_array
    if count and dim:
        with nogil:
            _unpool(grad, inverse, bounds, offsets is not None, mean, records, &out[0, 0])
    return out_array


cdef void _unpool(const float[:, ::1] grad, const int64_t[::1] positions,
                  const int64_t[::1] bounds, bint ragged, bint mean, Py_ssize_t records,
                  float* out) noexcept nogil:
    """``unpool_rows``' loop: adds into ``out`` (row-major [rows, dim], zeroed)."""
    cdef Py_ssize_t r, v, j, start, stop, dim = grad.shape[1]
    cdef int64_t u
    cdef float length
    for r in range(records):
        if ragged:
            start, stop = bounds[r], bounds[r + 1]
        else:
            start, stop = r, r + 1
        length = <float>(stop - start)
        for v in range(start, stop):
            u = positions[v]
            if mean and stop - start > 1:
                for j in range(dim):
                    out[u * dim + j] += grad[r, j] / length
            else:
                for j in range(dim):
                    out[u * dim + j] += grad[r, j]


cdef Py_ssize_t _records_of(const int64_t[::1] inverse, offsets, Py_ssize_t count) except -1:
    """The records that ``offsets`` (None: one per value) divide ``inverse``
    into, after checking that they run from 0 to its end (values between are
    the loops' to check) and that every position is below ``count``."""
    cdef Py_ssize_t n = inverse.shape[0], v
    cdef const int64_t[::1] bounds
    cdef Py_ssize_t records = n
    if offsets is not None:
        bounds = offsets
        records = bounds.shape[0] - 1
        if records < 0 or bounds[0] != 0 or bounds[records] != n:
            raise ValueError(f"offsets must run from 0 to the number of values ({n})")
    for v in range(n):
        if inverse[v] < 0 or inverse[v] >= count:
            raise IndexError(f"position {inverse[v]} outside the {count} rows")
    return records


def adagrad_rows(row_t[:, ::1] weights, row_t[:, ::1] state_sum, int64_t[::1] rows,
                 float[:, ::1] grads, float lr, float eps, float weight_decay, records=None):
    """torch.optim.Adagrad's step (lr_decay 0) on ``weights[rows]`` in place,
    ``state_sum`` its squared-gradient sums. ``rows`` must be distinct. Given
    ``records`` (ROW_STATS_DTYPE), each row is flagged changed there."""
    if state_sum.shape[0] < weights.shape[0] or state_sum.shape[1] != weights.shape[1]:
        raise ValueError(
            f"Adagrad state of shape ({state_sum.shape[0]}, {state_sum.shape[1]}) does not "
            f"fit weights of shape ({weights.shape[0]}, {weights.shape[1]})"
        )
    _update_rows(weights, state_sum, rows, grads, lr, eps, weight_decay, records)


def sgd_rows(row_t[:, ::1] weights, int64_t[::1] rows, float[:, ::1] grads, float lr,
             float weight_decay, records=None):
    """torch.optim.SGD's step (no momentum) on ``weights[rows]`` in place.
    Given ``records`` (ROW_STATS_DTYPE), each row is flagged changed there."""
    _update_rows(weights, None, rows, grads, lr, 0.0, weight_decay, records)


cdef _update_rows(row_t[:, ::1] weights, state_sum, int64_t[::1] rows, float[:, ::1] grads,
                  float lr, float eps, float weight_decay, records):
    """``adagrad_rows`` (``state_sum`` given, its shape checked) or ``sgd_rows`` (None)."""
    cdef Py_ssize_t i, dim = weights.shape[1]
    cdef int64_t row
    cdef row_t[:, ::1] state
    cdef bint adagrad = state_sum is not None
    if adagrad:
        state = state_sum
    _check_rows(weights, rows, grads)
    raw_records = _record_bytes(records)
    cdef uint8_t[::1] raw = raw_records
    cdef RowStat* stats = NULL
    if records is not None:
        stats = _records(records, raw)
        _check_record_rows(records, rows, False)
    with nogil:
        for i in range(rows.shape[0]):
            if i + _AHEAD < rows.shape[0]:
                row = rows[i + _AHEAD]
                __builtin_prefetch(&weights[row, 0])
                if adagrad:
                    __builtin_prefetch(&state[row, 0])
                if stats != NULL:
                    __builtin_prefetch(stats + row)
            row = rows[i]
            if stats != NULL:
                stats[row].changed = 1
            if adagrad:
                _adagrad_row(&weights[row, 0], &state[row, 0], &grads[i, 0], dim, lr, eps,
                             weight_decay)
            else:
                _sgd_row(&weights[row, 0], &grads[i, 0], dim, lr, weight_decay)


def push_pooled(row_t[:, ::1] weights, state_sum, const int64_t[::1] rows,
                const float[:, ::1] grad, const int64_t[::1] positions, offsets, bint mean,
                float lr, float eps, float weight_decay, records):
    """``unpool_rows`` and ``adagrad_rows`` (``state_sum`` given) or ``sgd_rows``
    (None) in one call: the gradient of each distinct id's row, taken from the
    pooled output's ``grad`` (``positions``, ``offsets``, ``mean``: as
    ``pool_rows``), applied to ``weights[rows[u]]``; a row number -1 (an id
    not admitted) drops its gradient. ``rows`` must be distinct. Each row
    updated is flagged changed in its ROW_STATS_DTYPE ``records``."""
    cdef Py_ssize_t count = rows.shape[0], dim = weights.shape[1]
    cdef Py_ssize_t records_count = _records_of(positions, offsets, count)
    if grad.shape[0] != records_count or grad.shape[1] != dim:
        raise ValueError(
            f"expected the gradient of {records_count} records of {dim}, "
            f"got ({grad.shape[0]}, {grad.shape[1]})"
        )
    cdef row_t[:, ::1] state
    cdef bint adagrad = state_sum is not None
    if adagrad:
        state = state_sum
        if state.shape[0] < weights.shape[0] or state.shape[1] != dim:
            raise ValueError(
                f"Adagrad state of shape ({state.shape[0]}, {state.shape[1]}) does not "
                f"fit weights of shape ({weights.shape[0]}, {dim})"
            )
    raw_records = _record_bytes(records)
    cdef uint8_t[::1] raw = raw_records
    cdef RowStat* stats = _records(records, raw)
    cdef Py_ssize_t u
    cdef int64_t allocated = weights.shape[0]
    if records.shape[0] < allocated:
        raise ValueError(f"{records.shape[0]} statistics records for {allocated} rows")
    for u in range(count):
        if rows[u] < -1 or rows[u] >= allocated:
            raise IndexError(f"row {rows[u]} outside the table's {allocated} rows")
    cdef float* scratch = <float*>calloc(count * dim if count * dim else 1, sizeof(float))
    if scratch == NULL:
        raise MemoryError()
    cdef const int64_t[::1] bounds = offsets if offsets is not None else positions
    cdef int64_t row
    with nogil:
        if dim:
            _unpool(grad, positions, bounds, offsets is not None, mean, records_count, scratch)
        for u in range(count):
            row = rows[u]
            if row < 0:
                continue
            if stats != NULL:
                stats[row].changed = 1
            if adagrad:
                _adagrad_row(&weights[row, 0], &state[row, 0], scratch + u * dim, dim, lr, eps,
                             weight_decay)
            else:
                _sgd_row(&weights[row, 0], scratch + u * dim, dim, lr, weight_decay)
    free(scratch)


cdef inline void _adagrad_row(row_t* weights, row_t* state_sum, const float* grads,
                              Py_ssize_t dim, float lr, float eps,
                              float weight_decay) noexcept nogil:
    """torch.optim.Adagrad's step (lr_decay 0) on one row, in float32
    whatever the row is stored as. A 16-bit row keeps the square root of each
    sum (``SparseTable._stored``): a rare id's squared gradients (1e-8 for a
    gradient of 1e-4) lie under the smallest half, their roots do not, and the
    root is what the step divides by."""
    cdef Py_ssize_t j
    cdef float g, w, total, root
    for j in range(dim):
        g = grads[j]
        w = _get(weights, j)
        if weight_decay != 0:
            g = g + weight_decay * w
        if row_t is float:
            total = state_sum[j] + g * g
            state_sum[j] = total
            root = sqrtf(total)
        else:
            root = _get(state_sum, j)
            root = sqrtf(root * root + g * g)
            _put(state_sum, j, root)
        _put(weights, j, w - lr * (g / (root + eps)))


cdef inline void _sgd_row(row_t* weights, const float* grads, Py_ssize_t dim, float lr,
                          float weight_decay) noexcept nogil:
    """torch.optim.SGD's step (no momentum) on one row."""
    cdef Py_ssize_t j
    cdef float g, w
    for j in range(dim):
        g = grads[j]
        w = _get(weights, j)
        if weight_decay != 0:
            g = g + weight_decay * w
        _put(weights, j, w - lr * g)


cdef _check_rows(row_t[:, ::1] weights, int64_t[::1] rows, float[:, ::1] grads):
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


# -- GEO syncs -----------------------------------------------------------------------


def add_scaled_rows(row_t[:, ::1] weights, int64_t[::1] rows,
                    const float[:, ::1] deltas, float scale, float[:, ::1] out, records):
    """A GEO sync on a server: ``weights[rows[i]] += deltas[i] * scale`` and
    the row as stored after it into ``out[i]``; a row number -1 (an id not
    admitted) adds nothing and reads as zeros. ``rows`` must be distinct.
    Each row changed is flagged in its ROW_STATS_DTYPE ``records``. Returns
    -1, or, changing nothing, the first ``i`` whose sum would not be finite
    (finite deltas can overflow float32)."""
    cdef Py_ssize_t i, j, n = rows.shape[0], dim = weights.shape[1]
    cdef Py_ssize_t overflow = -1
    cdef int64_t row
    if deltas.shape[0] != n or deltas.shape[1] != dim or out.shape[0] != n or out.shape[1] != dim:
        raise ValueError(
            f"expected deltas and out of shape ({n}, {dim}), got ({deltas.shape[0]}, "
            f"{deltas.shape[1]}) and ({out.shape[0]}, {out.shape[1]})"
        )
    for i in range(n):
        if rows[i] >= weights.shape[0]:
            raise IndexError(f"row {rows[i]} outside the table's {weights.shape[0]} rows")
    cdef RowStat* stats = _row_records(records, rows, True)
    with nogil:
        for i in range(n):  # every sum checked before any row changes
            row = rows[i]
            if row >= 0:
                for j in range(dim):
                    if not _float_is_finite(_get(&weights[row, 0], j) + deltas[i, j] * scale):
                        overflow = i
                        break
            if overflow >= 0:
                break
    if overflow >= 0:
        return overflow
    with nogil:
        for i in range(n):
            row = rows[i]
            if row < 0:
                for j in range(dim):
                    out[i, j] = 0
                continue
            stats[row].changed = 1
            for j in range(dim):
                # float32 product, then sum: the arithmetic of torch's
                # ``deltas * scale`` added by numpy, which this pass replaces
                _put(&weights[row, 0], j, _get(&weights[row, 0], j) + deltas[i, j] * scale)
                out[i, j] = _get(&weights[row, 0], j)
    return -1


def take_changes(row_t[:, ::1] weights, float[:, ::1] base, const int64_t[::1] rows):
    """A GEO worker's sync: each row's change since ``base`` (float32
    ``[len(rows), dim]``), which then becomes the row's base."""
    cdef Py_ssize_t i, j, n = rows.shape[0], dim = weights.shape[1]
    cdef int64_t row
    _check_base(weights, base, rows, n)
    changes_array = np.empty((n, dim), dtype=np.float32)
    cdef float[:, ::1] changes = changes_array
    cdef float value
    with nogil:
        for i in range(n):
            row = rows[i]
            for j in range(dim):
                value = _get(&weights[row, 0], j)
                changes[i, j] = value - base[row, j]
                base[row, j] = value
    return changes_array


def merge_rows(row_t[:, ::1] weights, float[:, ::1] base, int64_t[::1] rows,
               const float[:, ::1] merged, records):
    """A GEO worker takes the servers' merged rows back: each row keeps what
    training changed since its base was sent (``weights[r] += merged[i] -
    base[r]``), and ``merged[i]`` becomes its base. ``rows`` must be
    distinct; each is flagged changed in its ROW_STATS_DTYPE ``records``."""
    cdef Py_ssize_t i, j, n = rows.shape[0], dim = weights.shape[1]
    cdef int64_t row
    _check_base(weights, base, rows, n)
    if merged.shape[0] != n or merged.shape[1] != dim:
        raise ValueError(
            f"expected merged rows of shape ({n}, {dim}), got ({merged.shape[0]}, "
            f"{merged.shape[1]})"
        )
    cdef RowStat* stats = _row_records(records, rows, False)
    with nogil:
        for i in range(n):
            row = rows[i]
            stats[row].changed = 1
            for j in range(dim):
                _put(&weights[row, 0], j, _get(&weights[row, 0], j) + (merged[i, j] - base[row, j]))
                base[row, j] = merged[i, j]


cdef _check_base(row_t[:, ::1] weights, float[:, ::1] base, const int64_t[::1] rows,
                 Py_ssize_t n):
    """Every row of ``rows`` is one of ``weights`` and of ``base`` (same width)."""
    if base.shape[1] != weights.shape[1]:
        raise ValueError(
            f"expected a base of {weights.shape[1]} values a row, got {base.shape[1]}"
        )
    cdef Py_ssize_t i
    cdef int64_t allocated = min(weights.shape[0], base.shape[0])
    for i in range(n):
        if rows[i] < 0 or rows[i] >= allocated:
            raise IndexError(f"row {rows[i]} outside the table's {allocated} rows")
