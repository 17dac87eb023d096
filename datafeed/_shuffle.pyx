"""Gather kernels for shuffles: records picked from several chunks into one array.

Fusing the concatenation of the chunks into the gather halves the memory traffic
of a shuffle, and the loops run without the GIL so that columns gather in
parallel threads.
"""

from libc.stdint cimport int64_t, uint32_t, uint64_t
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
    cdef fleetfeed_cbytes* table = <fleetfeed_cbytes*> PyMem_Malloc(max(k, 1) * sizeof(fleetfeed_cbytes))
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


def gather_ragged(list sources, list source_offsets, Py_ssize_t item_bytes,
                  const int64_t[::1] chunk_of, const int64_t[::1] row_of,
                  const int64_t[::1] out_offsets, unsigned char[::1] out):
    """Variable-length records: record i's values are copied to out_offsets[i]...

    ``source_offsets`` are the chunks' int64 offsets arrays viewed as uint8.
    """
    cdef Py_ssize_t n = chunk_of.shape[0]
    cdef fleetfeed_cbytes* values = _pointers(sources)
    cdef fleetfeed_cbytes* offsets
    try:
        offsets = _pointers(source_offsets)
    except BaseException:
        PyMem_Free(values)
        raise
    cdef Py_ssize_t i
    cdef int64_t start, stop
    cdef const int64_t* chunk_offsets
    cdef unsigned char* dst = &out[0] if out.shape[0] else NULL
    try:
        with nogil:
            for i in range(n):
                chunk_offsets = <const int64_t*> offsets[chunk_of[i]]
                start = chunk_offsets[row_of[i]]
                stop = chunk_offsets[row_of[i] + 1]
                if stop > start:
                    memcpy(dst + out_offsets[i] * item_bytes,
                           values[chunk_of[i]] + start * item_bytes,
                           (stop - start) * item_bytes)
    finally:
        PyMem_Free(values)
        PyMem_Free(offsets)
