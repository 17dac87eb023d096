"""Gather kernels: records picked from several chunks into new arrays.

A shuffled store keeps its chunks as loaded and an order of row numbers; its
batches are gathered from the chunks as they are built (``RowGather``), and a
contiguous copy (``gather_fixed``, ``gather_ragged``) is made only where one is
asked for. Fusing the concatenation of the chunks into the gather halves the
memory traffic, and the loops run without the GIL so that columns gather in
parallel threads.
"""

cimport cython
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcpy

cdef extern from *:
    # Arrays of per-chunk pointers (a plain C array, owned by the caller's frame).
    """
    typedef const unsigned char* fleetfeed_cbytes;
    """
    ctypedef const unsigned char* fleetfeed_cbytes

from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.pythread cimport (
    WAIT_LOCK,
    PyThread_acquire_lock,
    PyThread_allocate_lock,
    PyThread_free_lock,
    PyThread_release_lock,
    PyThread_start_new_thread,
    PyThread_type_lock,
)
from libc.stdlib cimport free, malloc

import numpy as np


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


cdef struct Table:
    # A list of chunks' arrays, as a gather reads them (owned by a RowGather).
    Py_ssize_t chunk_count
    int64_t total_rows
    int64_t* starts              # chunk_count + 1 row numbers: where each chunk begins
    fleetfeed_cbytes* values     # [column * chunk_count + chunk]
    fleetfeed_cbytes* offsets    # the same, NULL for an offset-free part
    int64_t* offset_bytes        # the same: 4, 8, or 0 (no offsets)
    int64_t* widths              # the same: values per record of an offset-free part
    int64_t* item_bytes          # per column
    int64_t* fixed_width         # per column: its width when fixed, else -1


cdef struct ColumnOut:
    # Where one column of a gather goes: arrays made (and kept) by the caller.
    unsigned char* values
    int32_t* offsets32           # a ragged column's offsets, computed before the copy
    int64_t* offsets64


cdef Py_ssize_t _locate(const Table* table, const int64_t* rows, Py_ssize_t n,
                        int64_t* chunk_of, int64_t* row_of) noexcept nogil:
    """Each row's chunk and row in it; the index of the first row out of
    range, or -1."""
    cdef Py_ssize_t i
    cdef int64_t r, lo, hi, mid
    for i in range(n):
        r = rows[i]
        if r < 0 or r >= table.total_rows:
            return i
        lo, hi = 0, table.chunk_count - 1  # the last chunk starting at or before r
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if table.starts[mid] <= r:
                lo = mid
            else:
                hi = mid - 1
        chunk_of[i] = lo
        row_of[i] = r - table.starts[lo]
    return -1


cdef inline int64_t _record_offset(const Table* table, Py_ssize_t cell,
                                   int64_t row) noexcept nogil:
    return _offset(table.offsets[cell], table.offset_bytes[cell], table.widths[cell], row)


cdef int64_t _ragged_total(const Table* table, Py_ssize_t column, const int64_t* chunk_of,
                           const int64_t* row_of, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i, cell
    cdef int64_t total = 0
    for i in range(n):
        cell = column * table.chunk_count + chunk_of[i]
        total += _record_offset(table, cell, row_of[i] + 1) - _record_offset(table, cell, row_of[i])
    return total


cdef void _fill_offsets(const Table* table, Py_ssize_t column, const int64_t* chunk_of,
                        const int64_t* row_of, Py_ssize_t n, ColumnOut* out) noexcept nogil:
    cdef Py_ssize_t i, cell
    cdef int64_t at = 0
    for i in range(n + 1):
        if out.offsets32 != NULL:
            out.offsets32[i] = <int32_t> at
        else:
            out.offsets64[i] = at
        if i < n:
            cell = column * table.chunk_count + chunk_of[i]
            at += (_record_offset(table, cell, row_of[i] + 1)
                   - _record_offset(table, cell, row_of[i]))


cdef void _copy_column(const Table* table, Py_ssize_t column, const int64_t* chunk_of,
                       const int64_t* row_of, Py_ssize_t n, const ColumnOut* out) noexcept nogil:
    """Copies one column's picked records into ``out`` (a ragged column's
    offsets already filled)."""
    cdef Py_ssize_t i, cell
    cdef int64_t item = table.item_bytes[column]
    cdef int64_t width = table.fixed_width[column]
    cdef int64_t start, at
    if width >= 0:
        _gather_fixed_rows(table.values + column * table.chunk_count, width * item,
                           chunk_of, row_of, n, out.values)
        return
    for i in range(n):
        cell = column * table.chunk_count + chunk_of[i]
        start = _record_offset(table, cell, row_of[i])
        if out.offsets32 != NULL:
            at = out.offsets32[i]
            width = out.offsets32[i + 1] - at
        else:
            at = out.offsets64[i]
            width = out.offsets64[i + 1] - at
        if width > 0:
            memcpy(out.values + at * item, table.values[cell] + start * item, width * item)


cdef struct Job:
    # One thread's share of a window: columns first:last of the rows.
    const Table* table
    const int64_t* rows
    Py_ssize_t n
    Py_ssize_t first
    Py_ssize_t last
    ColumnOut* outs              # indexed by column
    int failed                   # set by the thread: no memory for its row tables


cdef struct Worker:
    Job job
    PyThread_type_lock todo      # released by the caller: a job (or the stop) is there
    PyThread_type_lock done      # released by the thread: the job is done
    PyThread_type_lock exited    # released by the thread as it ends
    int stop


cdef void _run_worker(void* argument) noexcept nogil:
    # A native thread: it never takes the GIL and touches no Python object, only
    # its Worker, the table it reads and the output arrays it fills (all kept
    # alive by the GatherAhead until the gather's result is taken).
    cdef Worker* worker = <Worker*> argument
    cdef int64_t* chunk_of
    cdef int64_t* row_of
    cdef Py_ssize_t c
    while True:
        PyThread_acquire_lock(worker.todo, WAIT_LOCK)
        if worker.stop:
            break
        chunk_of = <int64_t*> malloc(max(worker.job.n, 1) * sizeof(int64_t))
        row_of = <int64_t*> malloc(max(worker.job.n, 1) * sizeof(int64_t))
        if chunk_of == NULL or row_of == NULL:
            worker.job.failed = 1
        else:
            worker.job.failed = 0
            _locate(worker.job.table, worker.job.rows, worker.job.n, chunk_of, row_of)
            for c in range(worker.job.first, worker.job.last):
                _copy_column(worker.job.table, c, chunk_of, row_of, worker.job.n,
                             &worker.job.outs[c])
        free(chunk_of)
        free(row_of)
        PyThread_release_lock(worker.done)
    PyThread_release_lock(worker.exited)


cdef class RowGather:
    """Rows of a store's chunks picked by their row numbers, every column at once.

    Built once per list of chunks (it keeps a C table of every chunk's arrays,
    and the arrays alive), so that a batch of a shuffled store costs one call:
    ``gather(rows)`` finds each row's chunk and copies the picked records of
    every column into new arrays, without the GIL; ``GatherAhead`` does the
    same on native threads while the caller goes on.
    """

    cdef Table table
    cdef Py_ssize_t column_count
    cdef list dtypes
    cdef list arrays             # every array the table points into, kept alive

    def __cinit__(self, list chunks, Py_ssize_t column_count):
        cdef Py_ssize_t k = len(chunks)
        cdef Py_ssize_t cells = max(k * column_count, 1)
        self.table.chunk_count, self.column_count = k, column_count
        self.table.starts = <int64_t*> PyMem_Malloc((k + 1) * sizeof(int64_t))
        self.table.values = <fleetfeed_cbytes*> PyMem_Malloc(cells * sizeof(fleetfeed_cbytes))
        self.table.offsets = <fleetfeed_cbytes*> PyMem_Malloc(cells * sizeof(fleetfeed_cbytes))
        self.table.offset_bytes = <int64_t*> PyMem_Malloc(cells * sizeof(int64_t))
        self.table.widths = <int64_t*> PyMem_Malloc(cells * sizeof(int64_t))
        self.table.item_bytes = <int64_t*> PyMem_Malloc(max(column_count, 1) * sizeof(int64_t))
        self.table.fixed_width = <int64_t*> PyMem_Malloc(max(column_count, 1) * sizeof(int64_t))
        if (self.table.starts == NULL or self.table.values == NULL
                or self.table.offsets == NULL or self.table.offset_bytes == NULL
                or self.table.widths == NULL or self.table.item_bytes == NULL
                or self.table.fixed_width == NULL):
            raise MemoryError()

    def __init__(self, list chunks, Py_ssize_t column_count):
        cdef Py_ssize_t k, c, cell
        cdef Table* t = &self.table
        cdef const unsigned char[::1] view
        self.arrays = []
        self.dtypes = []
        t.starts[0] = 0
        for k in range(t.chunk_count):
            t.starts[k + 1] = t.starts[k] + <int64_t> chunks[k].rows
        t.total_rows = t.starts[t.chunk_count]
        for c in range(column_count):
            t.fixed_width[c] = -2  # not seen yet
            t.item_bytes[c] = 1
            self.dtypes.append(np.dtype(np.uint8))
            for k in range(t.chunk_count):
                column = chunks[k].columns[c]
                cell = c * t.chunk_count + k
                values = column.values.view(np.uint8)
                view = values
                self.arrays.append(values)
                t.values[cell] = &view[0] if view.shape[0] else NULL
                if k == 0:
                    self.dtypes[c] = column.values.dtype
                    t.item_bytes[c] = column.values.dtype.itemsize
                if column.offsets is None:
                    t.offsets[cell] = NULL
                    t.offset_bytes[cell] = 0
                    t.widths[cell] = column.width
                    if t.fixed_width[c] == -2 or t.fixed_width[c] == column.width:
                        t.fixed_width[c] = column.width
                    else:
                        t.fixed_width[c] = -1
                else:
                    offsets = column.offsets.view(np.uint8)
                    view = offsets
                    self.arrays.append(offsets)
                    t.offsets[cell] = &view[0]
                    t.offset_bytes[cell] = column.offsets.dtype.itemsize
                    t.widths[cell] = 0
                    t.fixed_width[c] = -1
            if t.fixed_width[c] == -2:  # no chunks
                t.fixed_width[c] = -1

    def __dealloc__(self):
        PyMem_Free(self.table.starts)
        PyMem_Free(self.table.values)
        PyMem_Free(self.table.offsets)
        PyMem_Free(self.table.offset_bytes)
        PyMem_Free(self.table.widths)
        PyMem_Free(self.table.item_bytes)
        PyMem_Free(self.table.fixed_width)

    @property
    def rows(self):
        """The rows of all the chunks together."""
        return self.table.total_rows

    @property
    def column_count(self):
        return self.column_count

    cdef list _outputs(self, const int64_t[::1] rows, Py_ssize_t first, Py_ssize_t last,
                       ColumnOut* outs):
        """The new arrays of columns ``first:last`` for ``rows`` as
        ``(values, offsets or None, width)`` triples, pointed to by ``outs``
        (a ragged column's offsets filled: that needs its records' lengths)."""
        cdef Py_ssize_t n = rows.shape[0]
        cdef Py_ssize_t c, bad
        cdef int64_t total, width
        cdef int64_t* chunk_of = NULL
        cdef int64_t* row_of = NULL
        cdef unsigned char[::1] out_values
        cdef int32_t[::1] out32
        cdef int64_t[::1] out64
        cdef list columns = []
        try:
            for c in range(first, last):
                width = self.table.fixed_width[c]
                outs[c].offsets32 = NULL
                outs[c].offsets64 = NULL
                if width >= 0:
                    values = np.empty(n * width, dtype=self.dtypes[c])
                    offsets = None
                else:
                    if chunk_of == NULL:
                        chunk_of = <int64_t*> PyMem_Malloc(max(n, 1) * sizeof(int64_t))
                        row_of = <int64_t*> PyMem_Malloc(max(n, 1) * sizeof(int64_t))
                        if chunk_of == NULL or row_of == NULL:
                            raise MemoryError()
                        with nogil:
                            bad = _locate(&self.table, &rows[0] if n else NULL, n,
                                          chunk_of, row_of)
                        _check_located(bad, rows, self.table.total_rows)
                    with nogil:
                        total = _ragged_total(&self.table, c, chunk_of, row_of, n)
                    offsets = np.empty(n + 1, dtype=np.int32 if total <= 2147483647 else np.int64)
                    if offsets.dtype.itemsize == 4:
                        out32 = offsets
                        outs[c].offsets32 = &out32[0]
                    else:
                        out64 = offsets
                        outs[c].offsets64 = &out64[0]
                    with nogil:
                        _fill_offsets(&self.table, c, chunk_of, row_of, n, &outs[c])
                    values = np.empty(total, dtype=self.dtypes[c])
                    width = 0
                out_values = values.view(np.uint8)
                outs[c].values = &out_values[0] if out_values.shape[0] else NULL
                columns.append((values, offsets, width))
        finally:
            PyMem_Free(chunk_of)
            PyMem_Free(row_of)
        return columns

    def gather(self, const int64_t[::1] rows, Py_ssize_t first_column=0,
               Py_ssize_t stop_column=-1):
        """The records at ``rows`` (row numbers across the chunks, in chunk
        order), for columns ``first_column:stop_column`` (all by default): a
        ``(values, offsets or None, width)`` triple of new arrays per column.

        A fixed-width column (every chunk without offsets, one width) comes
        back without offsets; any other with offsets starting at 0, int32
        unless the values outgrow them (the store's rule,
        ``columns.offsets_dtype``), and width 0.
        """
        cdef Py_ssize_t n = rows.shape[0]
        cdef Py_ssize_t c, bad
        cdef int64_t* chunk_of
        cdef int64_t* row_of
        cdef ColumnOut* outs
        cdef list columns
        if stop_column < 0 or stop_column > self.column_count:
            stop_column = self.column_count
        if first_column < 0 or first_column > stop_column:
            raise ValueError(
                f"columns {first_column}:{stop_column} of {self.column_count} columns"
            )
        chunk_of = <int64_t*> PyMem_Malloc(max(n, 1) * sizeof(int64_t))
        row_of = <int64_t*> PyMem_Malloc(max(n, 1) * sizeof(int64_t))
        outs = <ColumnOut*> PyMem_Malloc(max(self.column_count, 1) * sizeof(ColumnOut))
        try:
            if chunk_of == NULL or row_of == NULL or outs == NULL:
                raise MemoryError()
            with nogil:
                bad = _locate(&self.table, &rows[0] if n else NULL, n, chunk_of, row_of)
            _check_located(bad, rows, self.table.total_rows)
            columns = self._outputs(rows, first_column, stop_column, outs)
            with nogil:
                for c in range(first_column, stop_column):
                    _copy_column(&self.table, c, chunk_of, row_of, n, &outs[c])
        finally:
            PyMem_Free(chunk_of)
            PyMem_Free(row_of)
            PyMem_Free(outs)
        return columns


cdef int _check_located(Py_ssize_t bad, const int64_t[::1] rows, int64_t total) except -1:
    if bad >= 0:
        raise IndexError(f"row {rows[bad]} picked, but the chunks hold {total} rows")
    return 0


cdef Py_ssize_t _threads_running = 0  # every GatherAhead's, under the GIL


def gather_threads_running():
    """The native threads of every GatherAhead not closed yet."""
    return _threads_running


@cython.no_gc_clear  # its threads read the arrays it holds until they end
cdef class GatherAhead:
    """``RowGather.gather`` of all columns on ``threads`` native threads, each
    a share of the columns, while the caller goes on: ``submit(rows)``, then
    ``result()`` for the arrays. One gather at a time.

    The threads never take the GIL (a Python thread gathering would wait for
    it while the caller builds batches), so the gather overlaps the caller's
    work. ``close()`` (also on deallocation) waits for a gather under way and
    ends the threads.
    """

    cdef RowGather source
    cdef Py_ssize_t thread_count
    cdef Worker* workers
    cdef ColumnOut* outs
    cdef object rows             # the submitted rows and arrays, alive until result()
    cdef list columns
    cdef bint pending
    cdef bint closed

    def __cinit__(self, RowGather source not None, Py_ssize_t threads):
        global _threads_running
        cdef Py_ssize_t i, count = max(1, min(threads, max(source.column_count, 1)))
        self.source = source
        self.closed = True
        self.workers = <Worker*> PyMem_Malloc(count * sizeof(Worker))
        self.outs = <ColumnOut*> PyMem_Malloc(max(source.column_count, 1) * sizeof(ColumnOut))
        if self.workers == NULL or self.outs == NULL:
            raise MemoryError()
        self.thread_count = 0
        for i in range(count):
            self.workers[i].stop = 0
            self.workers[i].todo = PyThread_allocate_lock()
            self.workers[i].done = PyThread_allocate_lock()
            self.workers[i].exited = PyThread_allocate_lock()
            if (self.workers[i].todo == NULL or self.workers[i].done == NULL
                    or self.workers[i].exited == NULL):
                _free_locks(&self.workers[i])
                self._end()
                raise MemoryError()
            # All three start taken: each is a signal the other side gives.
            PyThread_acquire_lock(self.workers[i].todo, WAIT_LOCK)
            PyThread_acquire_lock(self.workers[i].done, WAIT_LOCK)
            PyThread_acquire_lock(self.workers[i].exited, WAIT_LOCK)
            self.workers[i].job.table = &source.table
            self.workers[i].job.outs = self.outs
            self.workers[i].job.first = source.column_count * i // count
            self.workers[i].job.last = source.column_count * (i + 1) // count
            if PyThread_start_new_thread(_run_worker, &self.workers[i]) == -1:
                _free_locks(&self.workers[i])
                self._end()
                raise RuntimeError("could not start a gather thread")
            self.thread_count = i + 1
            _threads_running += 1
        self.closed = False

    def submit(self, const int64_t[::1] rows):
        """Starts gathering ``rows`` (kept until ``result()``)."""
        cdef Py_ssize_t i, bad
        cdef Py_ssize_t n = rows.shape[0]
        if self.closed:
            raise RuntimeError("GatherAhead.submit() after close()")
        if self.pending:
            raise RuntimeError("GatherAhead.submit() before the last gather's result()")
        with nogil:  # the threads cannot raise: rows out of range are refused here
            bad = -1
            for i in range(n):
                if rows[i] < 0 or rows[i] >= self.source.table.total_rows:
                    bad = i
                    break
        _check_located(bad, rows, self.source.table.total_rows)
        self.columns = self.source._outputs(rows, 0, self.source.column_count, self.outs)
        self.rows = rows
        for i in range(self.thread_count):
            self.workers[i].job.rows = &rows[0] if n else NULL
            self.workers[i].job.n = n
            PyThread_release_lock(self.workers[i].todo)
        self.pending = True

    def result(self):
        """The arrays of the submitted rows, as ``RowGather.gather`` returns them."""
        if not self.pending:
            raise RuntimeError("GatherAhead.result() without a submit()")
        self._wait()
        columns, self.columns, self.rows = self.columns, None, None
        for i in range(self.thread_count):
            if self.workers[i].job.failed:
                raise MemoryError("a gather thread found no memory for its row tables")
        return columns

    cdef void _wait(self) noexcept:
        cdef Py_ssize_t i
        if self.pending:
            with nogil:
                for i in range(self.thread_count):
                    PyThread_acquire_lock(self.workers[i].done, WAIT_LOCK)
            self.pending = False

    def close(self):
        """Waits for a gather under way and ends the threads (idempotent)."""
        self._wait()
        self._end()

    cdef void _end(self) noexcept:
        global _threads_running
        cdef Py_ssize_t i
        _threads_running -= self.thread_count
        if self.workers != NULL:
            with nogil:
                for i in range(self.thread_count):
                    self.workers[i].stop = 1
                    PyThread_release_lock(self.workers[i].todo)
                    PyThread_acquire_lock(self.workers[i].exited, WAIT_LOCK)
            for i in range(self.thread_count):
                _free_locks(&self.workers[i])
            PyMem_Free(self.workers)
            self.workers = NULL
        PyMem_Free(self.outs)
        self.outs = NULL
        self.thread_count = 0
        self.closed = True

    def __dealloc__(self):
        self._wait()
        self._end()


cdef void _free_locks(Worker* worker) noexcept:
    if worker.todo != NULL:
        PyThread_free_lock(worker.todo)
    if worker.done != NULL:
        PyThread_free_lock(worker.done)
    if worker.exited != NULL:
        PyThread_free_lock(worker.exited)


cdef void _gather_fixed_rows(const fleetfeed_cbytes* parts, int64_t record_bytes,
                             const int64_t* chunk_of, const int64_t* row_of,
                             Py_ssize_t n, unsigned char* dst) noexcept nogil:
    # Record i of the output is record row_of[i] of part chunk_of[i].
    cdef Py_ssize_t i
    if record_bytes == 8:
        for i in range(n):
            (<uint64_t*> dst)[i] = (<const uint64_t*> parts[chunk_of[i]])[row_of[i]]
    elif record_bytes == 4:
        for i in range(n):
            (<uint32_t*> dst)[i] = (<const uint32_t*> parts[chunk_of[i]])[row_of[i]]
    elif record_bytes > 0:
        for i in range(n):
            memcpy(dst + i * record_bytes, parts[chunk_of[i]] + row_of[i] * record_bytes,
                   record_bytes)
