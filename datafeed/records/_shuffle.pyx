"""Gather kernels for shuffles: records picked from several chunks into one array.

Fusing the concatenation of the chunks into the gather halves the memory traffic
of a shuffle, and the loops run without the GIL so that columns gather in
parallel threads.
"""

from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcpy

cdef extern from *:
    # Arrays of per-chunk pointers (a plain C array, owned by the caller's frame).
    """
    typedef const unsigned char* fleetfeed_cbytes;
    """
    ctypedef const unsigned char* fleetfeed_cbytes

from cpython.mem cimport PyMem_Free, PyMem_Malloc


cdef fleetfeed_cbytes* _pointers(list arrays) except NULL:
    cdef Py_ssize_t k = len(arrays)
    cdef fleetfeed_cbytes* table = <fleetfeed_cbytes*> PyMem_Malloc(
        max(k, 1) * sizeof(fleetfeed_cbytes)
    )
    cdef const unsigned char[::1] view
    if table == NULL:
        raise MemoryError()
    for i in range(k):
        view = arrays[i]
        table[i] = &view[0] if view.shape[0] else NULL
    return table


def gather_fixed(list sources, Py_ssize_t record_bytes,
                 const int64_t[::1] chunk_of, const int64_t[::1] row_of,
                 unsigned char[::1] out):
    """out[i] = record row_of[i] of chunk chunk_of[i], records being record_bytes wide.

    ``sources`` are the chunks' value arrays viewed as uint8; they must stay alive
    for the call (the caller holds them).
    """
    cdef Py_ssize_t n = chunk_of.shape[0]
    if out.shape[0] != n * record_bytes:
        raise ValueError(f"output holds {out.shape[0]} bytes, expected {n * record_bytes}")
    cdef fleetfeed_cbytes* table = _pointers(sources)
    cdef Py_ssize_t i
    cdef unsigned char* dst = &out[0] if n else NULL
    try:
        with nogil:
            if record_bytes == 8:
                for i in range(n):
                    (<uint64_t*> dst)[i] = (<const uint64_t*> table[chunk_of[i]])[row_of[i]]
            elif record_bytes == 4:
                for i in range(n):
                    (<uint32_t*> dst)[i] = (<const uint32_t*> table[chunk_of[i]])[row_of[i]]
            else:
                for i in range(n):
                    memcpy(dst + i * record_bytes,
                           table[chunk_of[i]] + row_of[i] * record_bytes, record_bytes)
    finally:
        PyMem_Free(table)


cdef inline int64_t _offset(const unsigned char* offsets, int64_t offset_bytes,
                            int64_t width, int64_t row) noexcept nogil:
    # Record ``row``'s first value: int32 or int64 offsets, or ``row * width``
    # for an offset-free part (no offsets are widened or built to gather).
    if offset_bytes == 4:
        return (<const int32_t*> offsets)[row]
    if offset_bytes == 8:
        return (<const int64_t*> offsets)[row]
    return row * width


def gather_ragged(list sources, list source_offsets, const int64_t[::1] offset_bytes,
                  const int64_t[::1] widths, Py_ssize_t item_bytes,
                  const int64_t[::1] chunk_of, const int64_t[::1] row_of,
                  out_offsets, unsigned char[::1] out):
    """Variable-length records: record i's values are copied to out_offsets[i]...

    Part k's offsets are ``source_offsets[k]`` viewed as uint8, of
    ``offset_bytes[k]`` (4 or 8) bytes each; or, when ``offset_bytes[k]`` is 0,
    it has none and every record holds ``widths[k]`` values. ``out_offsets`` is
    the output's int32 or int64 offsets array.
    """
    cdef Py_ssize_t n = chunk_of.shape[0]
    cdef Py_ssize_t k = len(sources)
    if len(source_offsets) != k or offset_bytes.shape[0] != k or widths.shape[0] != k:
        raise ValueError(f"{k} parts, but offsets/widths for "
                         f"{len(source_offsets)}/{offset_bytes.shape[0]}/{widths.shape[0]}")
    cdef const int32_t[::1] out32
    cdef const int64_t[::1] out64
    cdef bint narrow = out_offsets.dtype.itemsize == 4
    if narrow:
        out32 = out_offsets
    else:
        out64 = out_offsets
    if (out32.shape[0] if narrow else out64.shape[0]) < n:
        raise ValueError(f"{n} records to gather but only offsets for fewer")
    cdef fleetfeed_cbytes* values = _pointers(sources)
    cdef fleetfeed_cbytes* offsets
    try:
        offsets = _pointers(source_offsets)
    except BaseException:
        PyMem_Free(values)
        raise
    cdef Py_ssize_t i
    cdef int64_t part, row, start, stop, at
    cdef unsigned char* dst = &out[0] if out.shape[0] else NULL
    try:
        with nogil:
            for i in range(n):
                part = chunk_of[i]
                row = row_of[i]
                start = _offset(offsets[part], offset_bytes[part], widths[part], row)
                stop = _offset(offsets[part], offset_bytes[part], widths[part], row + 1)
                at = out32[i] if narrow else out64[i]
                if stop > start:
                    memcpy(dst + at * item_bytes, values[part] + start * item_bytes,
                           (stop - start) * item_bytes)
    finally:
        PyMem_Free(values)
        PyMem_Free(offsets)
