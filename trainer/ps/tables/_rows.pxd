# Declarations shared by _rows.pyx (the index and pulls) and _row_updates.pyx
# (the optimizers' updates of rows and the pooling of rows).

from libc.stdint cimport int64_t, uint8_t, uint32_t

# How many ids ahead a batch loop prefetches the index slot of: probes of
# random ids miss the cache, and a few in flight at once hide most of the wait.
cdef enum:
    _AHEAD = 8


cdef extern from *:
    void __builtin_prefetch(const void* address) noexcept nogil


# One row's statistics (``ROW_STATS_DTYPE``).
ctypedef struct RowStat:
    float show
    float click
    uint32_t last  # tick of the last training pull
    uint8_t changed  # since the last save


cdef RowStat* _records(object records, uint8_t[::1] raw) except? NULL
cdef _check_record_rows(records, int64_t[::1] rows, bint absent_allowed)
