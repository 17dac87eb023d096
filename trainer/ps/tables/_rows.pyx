# cython: language_level=3
"""The per-batch hot loops of sparse tables, in C.

* ``IdIndex``: open-addressing hash index, uint64 id -> 32-bit row number
  (0, 1, 2, ... in order of insertion), in buckets of one cache line holding
  five keys and their row numbers (12.8 bytes a slot, up to 7/8 full; no
  Python object per id; a probe reads one line, rarely two). It grows by
  half again, so it never holds twice the memory its ids need. One pass over
  a batch finds or adds every id (``lookup_or_insert``).
* ``unique_inverse``: a batch's distinct ids and each id's position among them,
  by hashing (O(n), first-appearance order) rather than numpy's sort.
* ``pull_rows``: a pull's lookup, the copy of each row found and (training)
  the update of its statistics, in one pass over the batch; ``pull_values``
  the same for a batch's ids as they come, made distinct in the same call.
* Per-row statistics are one 16-byte record per row (``ROW_STATS_DTYPE``:
  show, click, last-seen tick, changed-since-save flag), so that counting a
  pull writes one cache line per row rather than one in each of three
  arrays; the loops that already touch a row (``pull_rows``, the optimizer
  steps) update its record, and ``touch_rows`` does it for rows just created.
  Counts go up by atomic adds (below), as do Adam's per-row step counts
  (``count_row_steps``), exact when Hogwild processes share a table.

Rows are removed by a rebuild (``IdIndex.rebuild``), not by tombstones: a table
drops rows in bulk (``shrink``, or a budget's eviction of a sixteenth of its
rows at a time) and compacts its row arrays then anyway, since rows are
numbered densely; rebuilding the index from the kept ids costs one insert per
kept row (about 40 ms per million rows), and leaves probe chains as short as a
fresh index's, where tombstones would lengthen them until the next rebuild.

The optimizers' updates of rows and the pooling of rows are in
_row_updates.pyx; declarations both use are in _rows.pxd.

Every function takes numpy arrays and releases the GIL for its loop, so RPC
handler threads and Hogwild trainer threads run them in parallel.
"""

import numpy as np

from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset

# A slot's row number is written after its key with release order, and read
# with acquire order: Hogwild processes (trainer/loop/hogwild_processes.py) look ids
# up without a lock in an index that another process may be adding to, and
# must not see a row number before the key it belongs to. (Plain moves on x86.)
cdef extern from *:
    """
    #define FF_STORE_RELEASE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
    #define FF_LOAD_ACQUIRE(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
    """
    void FF_STORE_RELEASE_U32 "FF_STORE_RELEASE"(uint32_t* address, uint32_t value) noexcept nogil
    uint32_t FF_LOAD_ACQUIRE_U32 "FF_LOAD_ACQUIRE"(const uint32_t* address) noexcept nogil

# Per-row counts (show, click, Adam's step count) go up by atomic adds: Hogwild
# processes pull and push the same rows at once, each under a table lock of its
# own, and a plain "show += 1" (load, add, store) lost counts wherever two met
# on a row (2.97M of 32M shows of 4 rows pulled by 4 processes at once; 7-40%
# of a pass's row step counts, which were copied out and written back). An
# atomic add is exact, waits for no lock (none is left taken by a killed
# process), and costs one compare-and-swap, about 4 ns a row (a pull of 768
# ids of a 5,000-row table: 14.4 us against 11.4 us). Per-process counts summed
# after the pass would need a copy of the counts per process, merged before a
# shrink or a save, and would leave Adam's bias correction without the row's
# true step number during the pass. ``last`` and ``changed`` are set, not
# counted: relaxed atomic stores (plain moves) only keep those writes defined.
cdef extern from *:
    """
    static inline float ff_atomic_add_float(float* address, float amount) {
        float seen, sum;
        __atomic_load(address, &seen, __ATOMIC_RELAXED);
        do {
            sum = seen + amount;
        } while (!__atomic_compare_exchange(address, &seen, &sum, 1,
                                            __ATOMIC_RELAXED, __ATOMIC_RELAXED));
        return sum;
    }
    #define FF_STORE_RELAXED(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
    """
    float ff_atomic_add_float(float* address, float amount) noexcept nogil
    void FF_STORE_RELAXED_U32 "FF_STORE_RELAXED"(uint32_t* address, uint32_t value) noexcept nogil
    void FF_STORE_RELAXED_U8 "FF_STORE_RELAXED"(uint8_t* address, uint8_t value) noexcept nogil

# One row's statistics. Aligned: 13 bytes of fields padded to 16, so that no
# record straddles two cache lines.
ROW_STATS_DTYPE = np.dtype(
    [("show", np.float32), ("click", np.float32), ("last", np.uint32), ("changed", np.uint8)],
    align=True,
)


cdef RowStat* _records(object records, uint8_t[::1] raw) except? NULL:
    """The records of ``records`` (a ROW_STATS_DTYPE array; ``raw``: its bytes,
    which the caller keeps referenced); NULL when it is empty."""
    if records.dtype != ROW_STATS_DTYPE or sizeof(RowStat) != ROW_STATS_DTYPE.itemsize:
        raise TypeError(
            f"expected per-row statistics of dtype {ROW_STATS_DTYPE}, got {records.dtype}"
        )
    if raw.shape[0] == 0:
        return NULL
    return <RowStat*>&raw[0]


def _record_bytes(records):
    if records is None:
        return np.zeros(0, dtype=np.uint8)
    if not (records.ndim == 1 and records.flags.c_contiguous):
        raise ValueError("per-row statistics must be one contiguous 1-D array")
    return records.view(np.uint8)


cdef inline uint64_t _mix64(uint64_t x) noexcept nogil:
    # splitmix64's finaliser: ids that differ in any bit land in unrelated slots.
    x ^= x >> 30
    x *= <uint64_t>0xBF58476D1CE4E5B9
    x ^= x >> 27
    x *= <uint64_t>0x94D049BB133111EB
    x ^= x >> 31
    return x


def first_not_owned(ids, uint64_t shards, uint64_t shard):
    """The position of the first of ``ids`` that server ``shard`` of
    ``shards`` does not own (``ids.shard_of``, which this must equal), or -1:
    one pass without the arrays ``shard_of`` makes (a server checks every id
    a message brings)."""
    cdef const uint64_t[::1] keys = _as_u64(ids)
    cdef Py_ssize_t i, n = keys.shape[0], found = -1
    if shards <= 1:
        return -1
    with nogil:
        for i in range(n):
            if (_mix64(keys[i] ^ <uint64_t>0x5EED) >> 33) % shards != shard:
                found = i
                break
    return found


def _as_u64(ids):
    ids = np.ascontiguousarray(ids).reshape(-1)
    if ids.dtype == np.uint64:
        return ids
    if ids.dtype == np.int64:
        return ids.view(np.uint64)
    raise TypeError(f"feature ids must be int64 or uint64, got {ids.dtype}")


# The index's buckets: one cache line each, five keys and their row numbers.
# A row number of EMPTY marks a free slot; slots fill in probe order and are
# never freed (rows leave by a rebuild), so the first free slot a probe meets
# ends it: the key is absent.
cdef extern from *:
    """
    typedef struct {
        uint64_t keys[5];
        uint32_t rows[5];
        uint32_t unused;
    } FFBucket;
    #define FF_EMPTY 0xFFFFFFFFu
    /* The high half of a 64-bit hash times the bucket count: any count, no modulo. */
    static inline uint64_t ff_bucket_of(uint64_t hash, uint64_t buckets) {
        return (uint64_t)(((unsigned __int128)hash * buckets) >> 64);
    }
    /* The slot of `key` from bucket `b` on, or the free slot where it would
       go: its bucket in *where, its place returned. A bucket's filled slots
       come first (slots fill in order and are never freed), so the bucket's
       slots are compared all at once, without a branch per slot: a branch
       per slot mispredicts where the key lies and doubled the probe's time. */
    static inline int ff_find(FFBucket *buckets, uint64_t count, uint64_t b, uint64_t key,
                              FFBucket **where) {
        for (;;) {
            FFBucket *bucket = buckets + b;
            unsigned match = 0, empty = 0;
            /* A free slot's key is all ones (the fill): any other key matches
               filled slots only, and is found by its keys alone, the common
               case. Its row number is read (acquire) by the caller. */
            if (key != ~(uint64_t)0) {
                for (int j = 0; j < 5; j++)
                    match |= (unsigned)(bucket->keys[j] == key) << j;
                if (match) {
                    *where = bucket;
                    return __builtin_ctz(match);
                }
            }
            /* The free slots first (acquire), then the keys: a slot published
               meanwhile is read with its key, never as all ones. */
            for (int j = 0; j < 5; j++) {
                uint32_t row = __atomic_load_n(&bucket->rows[j], __ATOMIC_ACQUIRE);
                empty |= (unsigned)(row == FF_EMPTY) << j;
            }
            match = 0;
            for (int j = 0; j < 5; j++)
                match |= (unsigned)(bucket->keys[j] == key) << j;
            match &= ~empty;
            if (match | empty) {
                *where = bucket;
                return __builtin_ctz(match ? match : empty);
            }
            if (++b == count) b = 0;
        }
    }
    """
    ctypedef struct FFBucket:
        uint64_t keys[5]
        uint32_t rows[5]
    uint32_t EMPTY "FF_EMPTY"
    uint64_t ff_bucket_of(uint64_t hash, uint64_t buckets) noexcept nogil
    int ff_find(FFBucket* buckets, uint64_t count, uint64_t b, uint64_t key,
                FFBucket** where) noexcept nogil

cdef enum:
    _SLOTS = 5
    _MIN_SLOTS = 1024
    # How many ids ahead a loop prefetches their buckets: a probe compares a
    # bucket's five slots, so more probes must be in flight than _AHEAD's
    # rows to hide the misses (8: 35 M lookups/s at 10M ids, 32: 47 M).
    _INDEX_AHEAD = 32
# Row numbers fit 32 bits: a shard holds fewer than EMPTY rows.
MAX_ROWS = 0xFFFFFFFF - 1


cdef inline bint _over_load(int64_t entries, int64_t slots) noexcept:
    # At most 9/10 full. Buckets of five slots in a line keep probes short
    # that full (a probe reads one line, and rarely the next). 12.8 bytes a
    # slot is 14.2-17.8 bytes an id, with growth by a quarter (below).
    return 10 * entries > 9 * slots


cdef inline int64_t _buckets_for(int64_t entries) noexcept:
    """Buckets that hold ``entries`` at 18/25 full: grown to that when past
    9/10, the index takes a quarter more memory, never twice its memory."""
    cdef int64_t slots = max(<int64_t>_MIN_SLOTS, (entries * 25 + 17) // 18)
    return (slots + _SLOTS - 1) // _SLOTS


cdef inline uint64_t _bucket_of(uint64_t key, uint64_t buckets) noexcept nogil:
    return ff_bucket_of(_mix64(key), buckets)


cdef class IdIndex:
    """uint64 id -> row number (0, 1, 2, ... in order of insertion).

    Not thread-safe by itself: a ``SparseTable`` holds its lock around every call.
    """

    # Buckets of _SLOTS (key, row number) slots, 64 bytes each (FFBucket).
    cdef object _cells_array
    cdef FFBucket* _buckets
    cdef uint64_t _count
    cdef readonly int64_t size

    def __init__(self, capacity=_MIN_SLOTS):
        self._allocate(_buckets_for(max(int(capacity), 1) * 18 // 25))
        self.size = 0

    cdef _allocate(self, int64_t buckets, allocate=None):
        # allocate(shape, dtype): where the cells live (default: numpy's heap).
        # Filled with ones: every row number EMPTY. A bucket starts on a cache
        # line (numpy aligns to 16 bytes only: a bucket across two lines
        # would cost two misses a probe, a third slower at 10M ids).
        raw = (allocate or np.empty)(((buckets + 1) * 8,), np.int64)
        skip = (-raw.__array_interface__["data"][0] % 64) // 8
        cells = raw[skip:skip + buckets * 8].reshape(buckets, 8)
        cells.fill(-1)
        cdef int64_t[:, ::1] view = cells
        self._cells_array = cells
        self._buckets = <FFBucket*>&view[0, 0]
        self._count = <uint64_t>buckets

    @property
    def capacity(self):
        """Slots (ids it holds before it grows: 9/10 of them)."""
        return <int64_t>self._count * _SLOTS

    @property
    def cells(self):
        """The buckets' array (read it only): where the index lives."""
        return self._cells_array

    cdef inline int _find(self, uint64_t key, FFBucket** where) noexcept nogil:
        """The slot holding ``key``, or the free slot where it would go:
        its bucket (``where``) and its place in the bucket."""
        return ff_find(self._buckets, self._count, _bucket_of(key, self._count), key, where)

    cdef inline int64_t _row(self, uint64_t key) noexcept nogil:
        """The row number of ``key``, -1 where absent."""
        cdef FFBucket* bucket
        cdef int j = self._find(key, &bucket)
        cdef uint32_t row = FF_LOAD_ACQUIRE_U32(&bucket.rows[j])
        return -1 if row == EMPTY else <int64_t>row

    cdef inline void _prefetch(self, uint64_t key) noexcept nogil:
        # The next bucket too: a probe that overflows its bucket reads it.
        cdef FFBucket* bucket = self._buckets + _bucket_of(key, self._count)
        __builtin_prefetch(bucket)
        __builtin_prefetch(bucket + 1)

    def lookup(self, ids):
        """Row number of each id, -1 where the id is absent."""
        cdef const uint64_t[::1] keys = _as_u64(ids)
        out = np.empty(keys.shape[0], dtype=np.int64)
        cdef int64_t[::1] rows = out
        cdef Py_ssize_t i, n = keys.shape[0]
        with nogil:
            for i in range(n):
                if i + _INDEX_AHEAD < n:
                    self._prefetch(keys[i + _INDEX_AHEAD])
                rows[i] = self._row(keys[i])
        return out

    def lookup_or_insert(self, ids):
        """Row number of each id, adding absent ids (new rows numbered from
        ``size`` in order of first appearance; a repeated id gets one row)."""
        cdef const uint64_t[::1] keys = _as_u64(ids)
        cdef Py_ssize_t n = keys.shape[0]
        if self.size + n > MAX_ROWS:
            raise OverflowError(
                f"a table shard holds at most {MAX_ROWS} rows: {self.size} and {n} more "
                "do not fit (spread the table over more servers)"
            )
        if _over_load(self.size + n, self.capacity):
            self._grow(self.size + n)
        out = np.empty(n, dtype=np.int64)
        cdef int64_t[::1] rows = out
        cdef Py_ssize_t i
        cdef int j
        cdef FFBucket* bucket
        with nogil:
            for i in range(n):
                if i + _INDEX_AHEAD < n:
                    self._prefetch(keys[i + _INDEX_AHEAD])
                j = self._find(keys[i], &bucket)
                if bucket.rows[j] == EMPTY:
                    # The key first, then its row number (release): a reader
                    # that sees the number sees the key.
                    bucket.keys[j] = keys[i]
                    FF_STORE_RELEASE_U32(&bucket.rows[j], <uint32_t>self.size)
                    self.size += 1
                rows[i] = bucket.rows[j]
        return out

    def insert_new(self, ids):
        """Adds ids known to be absent; returns their row numbers."""
        return self.lookup_or_insert(ids)

    def rebuild(self, ids):
        """Replaces the index by one of ``ids`` (distinct), numbered 0, 1, 2,
        ... in their order: how a table drops rows and renumbers the rest."""
        ids = _as_u64(ids)
        self._allocate(_buckets_for(ids.shape[0]))
        self.size = 0
        if ids.shape[0]:
            self.lookup_or_insert(ids)

    def set_size(self, int64_t size):
        """Sets the row count: for an index whose shared cells another process
        added to (Hogwild processes, trainer/ps/tables/shared_rows.py)."""
        self.size = size

    def fits(self, int64_t rows):
        """Whether ``rows`` ids fit without the index growing (moving its cells)."""
        return not _over_load(rows, self.capacity)

    def _grow(self, int64_t needed, allocate=None):
        """Room for ``needed`` ids: the cells reallocated (by ``allocate(shape,
        dtype)``, when given, even if they fit) and the ids added back."""
        if not _over_load(needed, self.capacity) and allocate is None:
            return
        buckets = _buckets_for(needed)
        if not _over_load(needed, self.capacity):
            buckets = max(buckets, <int64_t>self._count)
        ids = self.ids_in_row_order()
        self._allocate(buckets, allocate)
        self.size = 0
        if ids.shape[0]:
            self.lookup_or_insert(ids)

    def ids_in_row_order(self):
        """Every id, in row-number order (uint64)."""
        out = np.empty(self.size, dtype=np.uint64)
        cdef uint64_t[::1] ids = out
        cdef uint64_t b
        cdef int j
        cdef FFBucket* bucket
        with nogil:
            for b in range(self._count):
                bucket = self._buckets + b
                for j in range(_SLOTS):
                    if bucket.rows[j] != EMPTY:
                        ids[bucket.rows[j]] = bucket.keys[j]
        return out


def unique_inverse(ids):
    """``(unique, inverse)`` of an int64/uint64 array: its distinct values in
    order of first appearance (same dtype) and each value's position among them,
    so that ``unique[inverse]`` equals ``ids``."""
    array = np.ascontiguousarray(ids).reshape(-1)
    cdef const uint64_t[::1] keys = _as_u64(array)
    cdef Py_ssize_t n = keys.shape[0]
    cdef int64_t capacity = 16
    while capacity < 2 * n:
        capacity *= 2
    slots_array = np.empty(capacity, dtype=np.int64)
    cdef int64_t[::1] slots = slots_array
    unique_array = np.empty(n, dtype=np.uint64)
    cdef uint64_t[::1] unique = unique_array
    inverse_array = np.empty(n, dtype=np.int64)
    cdef int64_t[::1] inverse = inverse_array
    cdef Py_ssize_t count
    with nogil:
        count = _distinct(&keys[0] if n else NULL, n, &slots[0], capacity - 1,
                          &unique[0] if n else NULL, &inverse[0] if n else NULL)
    return unique_array[:count].view(array.dtype), inverse_array


def pull_rows(IdIndex index, ids, row_t[:, ::1] weights, out, records, uint32_t tick):
    """One pull's pass over distinct ``ids``: each id's row number (-1 where
    absent), a copy of each row found into ``out`` (float32 [len(ids), dim];
    None: no copy) and, given ``records`` (the table's ROW_STATS_DTYPE
    statistics; None: an inference pull, nothing counted), a training pull
    counted in the record of each row found: show + 1, last-seen tick
    ``tick``, flagged changed. Returns ``(rows, missing)``, ``missing`` the
    number of ids without a row (their ``out`` rows are left as they were)."""
    cdef const uint64_t[::1] keys = _as_u64(ids)
    cdef Py_ssize_t n = keys.shape[0]
    cdef float[:, ::1] copy_to
    cdef bint copy = out is not None
    if copy:
        copy_to = out
        if copy_to.shape[0] != n or copy_to.shape[1] != weights.shape[1]:
            raise ValueError(
                f"pull_rows: expected an output of shape ({n}, {weights.shape[1]}), "
                f"got ({copy_to.shape[0]}, {copy_to.shape[1]})"
            )
    raw_records = _record_bytes(records)
    cdef uint8_t[::1] raw = raw_records
    cdef RowStat* stats = _pulled_records(index, weights.shape[0], records, raw)
    found_array = np.empty(n, dtype=np.int64)
    cdef int64_t[::1] found = found_array
    cdef Py_ssize_t missing
    with nogil:
        missing = _pull(index, &keys[0] if n else NULL, n, weights,
                        &copy_to[0, 0] if copy and n else NULL, stats, tick,
                        &found[0] if n else NULL)
    return found_array, missing


def pull_values(IdIndex index, values, row_t[:, ::1] weights, records, uint32_t tick):
    """A training pull of a batch's ids as they come, repeats included:
    ``unique_inverse`` and ``pull_rows`` in one call. Returns ``(unique,
    inverse, rows, out, missing)``: the distinct ids (uint64, in order of
    first appearance), each value's position among them, each distinct id's
    row number (-1 where absent), its row (float32 [len(unique), dim]; rows
    of absent ids are left unset) and the number of absent ids."""
    cdef const uint64_t[::1] keys = _as_u64(values)
    cdef Py_ssize_t n = keys.shape[0], dim = weights.shape[1]
    raw_records = _record_bytes(records)
    cdef uint8_t[::1] raw = raw_records
    cdef RowStat* stats = _pulled_records(index, weights.shape[0], records, raw)
    cdef int64_t capacity = 16
    while capacity < 2 * n:
        capacity *= 2
    cdef int64_t* slots = <int64_t*>malloc(capacity * sizeof(int64_t))
    if slots == NULL:
        raise MemoryError()
    unique_array = np.empty(n, dtype=np.uint64)
    inverse_array = np.empty(n, dtype=np.int64)
    found_array = np.empty(n, dtype=np.int64)
    cdef uint64_t[::1] unique = unique_array
    cdef int64_t[::1] inverse = inverse_array
    cdef int64_t[::1] found = found_array
    cdef Py_ssize_t count
    try:
        with nogil:
            count = _distinct(&keys[0] if n else NULL, n, slots, capacity - 1,
                              &unique[0] if n else NULL, &inverse[0] if n else NULL)
    finally:
        free(slots)
    out_array = np.empty((count, dim), dtype=np.float32)
    cdef float[:, ::1] out = out_array
    cdef Py_ssize_t missing
    with nogil:
        missing = _pull(index, &unique[0] if n else NULL, count, weights,
                        &out[0, 0] if count else NULL, stats, tick, &found[0] if n else NULL)
    return unique_array[:count], inverse_array, found_array[:count], out_array, missing


cdef RowStat* _pulled_records(IdIndex index, int64_t allocated, records,
                              uint8_t[::1] raw) except? NULL:
    """The statistics records a pull counts in (NULL: none), checked against
    the table's ``allocated`` rows."""
    cdef RowStat* stats = _records(records, raw) if records is not None else NULL
    if records is not None and records.shape[0] < allocated:
        raise ValueError(
            f"pull_rows: {records.shape[0]} statistics records for {allocated} rows"
        )
    if index.size > allocated:
        raise ValueError(f"pull_rows: the index has {index.size} rows, the table {allocated}")
    return stats


cdef Py_ssize_t _distinct(const uint64_t* keys, Py_ssize_t n, int64_t* slots, uint64_t mask,
                          uint64_t* unique, int64_t* inverse) noexcept nogil:
    """``unique_inverse``'s loop: ``slots`` (mask + 1 of them, a power of two
    at least twice ``n``) is its scratch hash table. Returns the distinct count."""
    cdef Py_ssize_t i, count = 0
    cdef uint64_t pos
    memset(slots, 0xFF, (mask + 1) * sizeof(int64_t))  # every slot -1: empty
    for i in range(n):
        pos = _mix64(keys[i]) & mask
        while slots[pos] >= 0 and unique[slots[pos]] != keys[i]:
            pos = (pos + 1) & mask
        if slots[pos] < 0:
            slots[pos] = count
            unique[count] = keys[i]
            count += 1
        inverse[i] = slots[pos]
    return count


cdef Py_ssize_t _pull(IdIndex index, const uint64_t* keys, Py_ssize_t n, row_t[:, ::1] weights,
                      float* copy_to, RowStat* stats, uint32_t tick,
                      int64_t* found) noexcept nogil:
    """``pull_rows``' loops: row numbers into ``found``, rows found copied to
    ``copy_to`` (row-major [n, dim]; NULL: none), counted in ``stats`` (NULL:
    not counted). Returns the number of absent ids."""
    cdef Py_ssize_t i, j, dim = weights.shape[1]
    cdef int64_t row
    cdef Py_ssize_t missing = 0
    # Two passes, so that the second knows the rows ahead and prefetches them
    # (each row and record is a cache miss of its own).
    for i in range(n):
        if i + _INDEX_AHEAD < n:
            index._prefetch(keys[i + _INDEX_AHEAD])
        row = index._row(keys[i])
        found[i] = row
        if row < 0:
            missing += 1
    if copy_to != NULL or stats != NULL:
        for i in range(n):
            if i + _AHEAD < n and found[i + _AHEAD] >= 0:
                row = found[i + _AHEAD]
                if copy_to != NULL:
                    __builtin_prefetch(&weights[row, 0])
                if stats != NULL:
                    __builtin_prefetch(stats + row)
            row = found[i]
            if row < 0:
                continue
            if copy_to != NULL:
                if row_t is float:
                    memcpy(copy_to + i * dim, &weights[row, 0], dim * sizeof(float))
                else:
                    for j in range(dim):
                        copy_to[i * dim + j] = _get(&weights[row, 0], j)
            if stats != NULL:
                _count_pull(stats + row, tick)
    return missing


cdef inline void _count_pull(RowStat* record, uint32_t tick) noexcept nogil:
    """A training pull counted in a row's record (atomically: see the top)."""
    ff_atomic_add_float(&record.show, 1.0)
    FF_STORE_RELAXED_U32(&record.last, tick)
    FF_STORE_RELAXED_U8(&record.changed, 1)


def touch_rows(records, int64_t[::1] rows, uint32_t tick):
    """A training pull of ``rows`` (-1: absent, skipped) counted in their
    ROW_STATS_DTYPE ``records``: show + 1, last-seen tick ``tick``, flagged
    changed since the last save."""
    cdef RowStat* stats = _row_records(records, rows, True)
    cdef Py_ssize_t i
    with nogil:
        for i in range(rows.shape[0]):
            if rows[i] >= 0:
                _count_pull(stats + rows[i], tick)


def add_clicks_rows(records, int64_t[::1] rows, float[::1] clicks):
    """Adds ``clicks[i]`` to the click count of row ``rows[i]`` (-1: skipped)
    and flags it changed."""
    if clicks.shape[0] != rows.shape[0]:
        raise ValueError(f"expected {rows.shape[0]} clicks (one per row), got {clicks.shape[0]}")
    cdef RowStat* stats = _row_records(records, rows, True)
    cdef Py_ssize_t i
    with nogil:
        for i in range(rows.shape[0]):
            if rows[i] >= 0:
                ff_atomic_add_float(&stats[rows[i]].click, clicks[i])
                FF_STORE_RELAXED_U8(&stats[rows[i]].changed, 1)


def count_row_steps(float[::1] steps, int64_t[::1] rows):
    """Adds 1 to the step count of each of ``rows`` in ``steps`` (a table's
    per-row Adam step counts, float32), in place and atomically (see the
    top: Hogwild processes push the same rows at once); returns the count
    each add made, the step number of this update of each row (float32)."""
    cdef Py_ssize_t i, n = rows.shape[0]
    for i in range(n):
        if rows[i] < 0 or rows[i] >= steps.shape[0]:
            raise IndexError(f"row {rows[i]} outside the table's {steps.shape[0]} step counts")
    out_array = np.empty(n, dtype=np.float32)
    cdef float[::1] out = out_array
    with nogil:
        for i in range(n):
            out[i] = ff_atomic_add_float(&steps[rows[i]], 1.0)
    return out_array


cdef _check_record_rows(records, int64_t[::1] rows, bint absent_allowed):
    cdef Py_ssize_t i
    cdef int64_t allocated = records.shape[0]
    cdef int64_t lowest = -1 if absent_allowed else 0
    for i in range(rows.shape[0]):
        if rows[i] < lowest or rows[i] >= allocated:
            raise IndexError(f"row {rows[i]} outside the table's {allocated} rows of statistics")


cdef RowStat* _row_records(records, int64_t[::1] rows, bint absent_allowed) except? NULL:
    """The ROW_STATS_DTYPE ``records`` a kernel counts ``rows`` in (NULL when
    empty), its dtype and every row checked (-1 too, with ``absent_allowed``).
    The pointer is into ``records``' own memory: valid while the caller holds it."""
    raw_records = _record_bytes(records)
    cdef RowStat* stats = _records(records, raw_records)
    _check_record_rows(records, rows, absent_allowed)
    return stats
