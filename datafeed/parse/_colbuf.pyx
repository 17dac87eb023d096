"""Growable per-slot column buffers and their hand-over to numpy arrays.

The text parser and the in-process sample builder append values into
``ColumnBuffer`` structs without the GIL; ``take_columns`` copies the pending
rows out into numpy arrays that own their memory and empties the buffers,
keeping their capacity (re-filling buffers that stay in cache is ~30% faster
than growing them to a whole file).
"""

from libc.stdint cimport int64_t
from libc.stdlib cimport realloc
from libc.string cimport memcpy

import numpy as np

cdef int64_t INT32_MAX = 2147483647


cdef int grow(void** buf, Py_ssize_t* cap, Py_ssize_t need,
              Py_ssize_t itemsize) noexcept nogil:
    """Grows ``buf`` to hold at least ``need`` items; 0 on success, -1 out of memory."""
    cdef Py_ssize_t newcap = cap[0] * 2
    cdef void* mem
    if newcap < need:
        newcap = need
    if newcap < 256:
        newcap = 256
    mem = realloc(buf[0], newcap * itemsize)
    if mem == NULL:
        return -1
    buf[0] = mem
    cap[0] = newcap
    return 0


cdef list take_columns(ColumnBuffer* buffers, Py_ssize_t count, Py_ssize_t rows,
                       list dtypes):
    """Copies out ``rows`` pending rows of ``count`` buffers and empties them.

    Returns ``[(values, offsets, width), ...]``: ``offsets`` is None for dense
    slots and for sparse slots whose rows all hold the same number ``width`` of
    values; otherwise int32 offsets (int64 past 2**31 - 1 values).
    """
    cdef Py_ssize_t s, r
    cdef int64_t k
    cdef ColumnBuffer* b
    cdef bint uniform
    cdef unsigned char[::1] out
    cdef int[::1] o32
    cdef int64_t[::1] o64
    columns = []
    for s in range(count):
        b = &buffers[s]
        values = np.empty(b.len, dtype=dtypes[s])
        if b.len:
            out = values.view(np.uint8)
            with nogil:
                memcpy(&out[0], b.data, b.len * b.itemsize)
        b.len = 0
        if b.width:
            columns.append((values, None, b.width))
            continue
        k = b.offs[1] if rows else 0
        uniform = True
        for r in range(1, rows):
            if b.offs[r + 1] - b.offs[r] != k:
                uniform = False
                break
        if uniform:
            columns.append((values, None, k))
        elif b.offs[rows] <= INT32_MAX:
            offsets = np.empty(rows + 1, dtype=np.int32)
            o32 = offsets
            with nogil:
                for r in range(rows + 1):
                    o32[r] = <int>b.offs[r]
            columns.append((values, offsets, 0))
        else:  # over 2**31 - 1 values of one slot in one chunk
            offsets = np.empty(rows + 1, dtype=np.int64)
            o64 = offsets
            with nogil:
                memcpy(&o64[0], b.offs, (rows + 1) * sizeof(int64_t))
            columns.append((values, offsets, 0))
    return columns
