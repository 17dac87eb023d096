"""Generator samples straight into slot columns: the in-process path's builder.

``ColumnBuilder.add`` takes one sample of a ``MultiSlotDataGenerator``
(a list or tuple of ``(name, [values])`` pairs) and appends its values to
per-slot C buffers, with no text in between. It takes only samples whose
every value it can convert exactly as the pipe path would (the generator
writes ``str(value)``, the parser reads the token back):

* ``int`` that fits the slot's integer type; ``int`` that fits int64 in a
  float32 slot (the C conversion rounds to nearest even, as strtof does);
* ``float`` in a float32 slot, when it is a normal float32 and not on a
  float32 rounding midpoint: reading ``repr(x)`` back to float32 rounds the
  decimal, not ``x``, and the two differ only on a midpoint (see
  ``_to_f32``); 0.0 and -0.0 keep their sign.

Anything else (a sample the generator would refuse, a slot count or dense
width the schema refuses, a bool, a numpy scalar, a float in an integer
slot, ...) makes ``add`` return False with nothing appended: the caller then
runs that one sample through the generator's formatter and the parser, which
gives exactly the pipe path's record or error. ``run_samples`` is the loop.
"""

from cpython.exc cimport PyErr_Clear, PyErr_Occurred
from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.long cimport PyLong_AsLongLongAndOverflow
from libc.math cimport fabs
from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcpy

from datafeed.parse._colbuf cimport ColumnBuffer, grow, take_columns
from datafeed.parse._kinds cimport KIND_FLOAT32, KIND_INT64, KIND_UINT64, rounds_like_strtof

import numpy as np

from datafeed.config.errors import add_note


cdef extern from "Python.h":
    # Declared here without an exception clause: the caller checks
    # PyErr_Occurred itself and turns an overflow into "not fast".
    unsigned long long PyLong_AsUnsignedLongLong(object value)


ctypedef ColumnBuffer Column


cdef int _grow(void** buf, Py_ssize_t* cap, Py_ssize_t need,
               Py_ssize_t itemsize) except -1:
    if grow(buf, cap, need, itemsize):
        raise MemoryError()
    return 0


cdef inline bint _to_i64(object value, int64_t* out) noexcept:
    cdef int overflow
    cdef long long v
    if type(value) is not int:
        return False
    v = PyLong_AsLongLongAndOverflow(value, &overflow)
    if overflow:
        return False
    out[0] = v
    return True


cdef inline bint _to_u64(object value, uint64_t* out) noexcept:
    cdef int overflow
    cdef long long v
    cdef unsigned long long u
    if type(value) is not int:
        return False
    v = PyLong_AsLongLongAndOverflow(value, &overflow)
    if overflow == 0:
        if v < 0:
            return False        # the parser's "negative value" error
        out[0] = <uint64_t>v
        return True
    if overflow < 0:
        return False
    u = PyLong_AsUnsignedLongLong(value)     # 2**63 <= value: 64-bit hashed ids
    if u == <unsigned long long>-1 and PyErr_Occurred() != NULL:
        PyErr_Clear()
        return False            # beyond uint64: the parser's range error
    out[0] = u
    return True


cdef inline bint _to_f32(object value, float* out) noexcept:
    cdef double d
    cdef int overflow
    cdef long long v
    if type(value) is float:
        d = PyFloat_AS_DOUBLE(value)
        if d == 0.0:
            out[0] = <float>d   # strtof("-0.0") is -0.0 too
            return True
        # The text path reads repr(d), a decimal within half a double ulp of d,
        # and rounds that to float32. Every float32 rounding midpoint is itself
        # a double, so unless d *is* one, the decimal and d lie on the same side
        # of every midpoint and round alike. NaN, subnormals, overflow and
        # midpoints go the slow way.
        if not rounds_like_strtof(fabs(d)):
            return False
        out[0] = <float>d
        return True
    if type(value) is int:
        v = PyLong_AsLongLongAndOverflow(value, &overflow)
        if overflow:
            return False
        out[0] = <float>v       # rounds to nearest even, as strtof does on the digits
        return True
    return False


cdef class ColumnBuilder:
    """Appends samples to per-slot buffers and hands them out as columns.

    Args:
        schema: the slots (``datafeed.Slot`` objects), in ``use_var`` order.

    The slot names a sample must carry are set by ``set_names`` (the first
    sample's names, which the generator makes every later sample repeat);
    until then ``add`` takes nothing. Not thread-safe: one builder per file.
    """

    cdef Column* cols
    cdef Py_ssize_t ncols
    cdef Py_ssize_t nrows
    cdef tuple schema
    cdef list _dtypes
    cdef list names

    def __cinit__(self, tuple schema):
        cdef Py_ssize_t s
        cdef Column* c
        self.schema = schema
        self._dtypes = [slot.numpy_dtype for slot in schema]
        self.ncols = len(schema)
        self.cols = <Column*>realloc(NULL, max(self.ncols, 1) * sizeof(Column))
        if self.cols == NULL:
            raise MemoryError()
        for s in range(self.ncols):
            c = &self.cols[s]
            c.data = NULL
            c.len = c.cap = 0
            c.offs = NULL
            c.ocap = 0
            c.kind = schema[s].kind
            c.width = schema[s].width
            c.itemsize = 4 if c.kind == KIND_FLOAT32 else 8
        for s in range(self.ncols):
            c = &self.cols[s]
            _grow(<void**>&c.offs, &c.ocap, 256, sizeof(int64_t))
            c.offs[0] = 0

    def __dealloc__(self):
        cdef Py_ssize_t s
        if self.cols != NULL:
            for s in range(self.ncols):
                free(self.cols[s].data)
                free(self.cols[s].offs)
            free(self.cols)

    @property
    def rows(self):
        """Rows appended and not yet taken."""
        return self.nrows

    def set_names(self, names):
        """Sets the slot names every sample must carry, in order.

        Names of another count than the schema's slots are ignored: no sample
        can then be added here (each one is a parse error on the slow path).
        """
        names = list(names)
        if len(names) == self.ncols and all(type(n) is str for n in names):
            self.names = names

    cdef void _rollback(self) noexcept:
        cdef Py_ssize_t s
        cdef Column* c
        for s in range(self.ncols):
            c = &self.cols[s]
            c.len = self.nrows * c.width if c.width else c.offs[self.nrows]

    cdef int _reserve_row(self) except -1:
        cdef Py_ssize_t s
        cdef Column* c
        for s in range(self.ncols):
            c = &self.cols[s]
            if not c.width and self.nrows + 2 > c.ocap:
                _grow(<void**>&c.offs, &c.ocap, self.nrows + 2, sizeof(int64_t))
        return 0

    cpdef bint add(self, object sample) except -1:
        """Appends one sample; False (nothing appended) when it needs the slow path."""
        if self.names is None:
            return False
        if type(sample) is not list and type(sample) is not tuple:
            return False
        if len(sample) != self.ncols:
            return False
        self._reserve_row()
        if not self._fill(sample):
            self._rollback()
            return False
        self.nrows += 1
        return True

    cdef bint _fill(self, object sample) except -1:
        cdef Py_ssize_t s, i, n
        cdef Column* c
        cdef object item, name, values
        cdef list vals
        cdef str expected
        cdef bint ok
        for s in range(self.ncols):
            c = &self.cols[s]
            item = sample[s]
            if type(item) is not tuple or len(<tuple>item) != 2:
                return False
            name = (<tuple>item)[0]
            values = (<tuple>item)[1]
            expected = <str>self.names[s]
            if type(name) is not str:
                return False
            if name is not expected and <str>name != expected:
                return False
            if type(values) is not list:
                return False
            vals = <list>values
            n = len(vals)
            if n == 0 or (c.width and n != c.width):
                return False
            if c.len + n > c.cap:
                _grow(<void**>&c.data, &c.cap, c.len + n, c.itemsize)
            ok = True
            if c.kind == KIND_UINT64:
                for i in range(n):
                    if not _to_u64(vals[i], &(<uint64_t*>c.data)[c.len + i]):
                        ok = False
                        break
            elif c.kind == KIND_INT64:
                for i in range(n):
                    if not _to_i64(vals[i], &(<int64_t*>c.data)[c.len + i]):
                        ok = False
                        break
            else:
                for i in range(n):
                    if not _to_f32(vals[i], &(<float*>c.data)[c.len + i]):
                        ok = False
                        break
            if not ok:
                return False
            c.len += n
            if not c.width:
                c.offs[self.nrows + 1] = c.len
        return True

    def add_columns(self, Py_ssize_t rows, columns):
        """Appends ``rows`` parsed rows: ``columns`` as ``ChunkParser`` gives them.

        Args:
            rows: the number of rows.
            columns: per slot, an object with ``values`` (a numpy array of the
                slot's dtype), ``offsets`` (int32/int64 array, or None) and
                ``width`` (values per row when ``offsets`` is None).
        """
        cdef Py_ssize_t s, r, n, width
        cdef Column* c
        cdef const unsigned char[::1] raw
        cdef const int64_t[::1] o64
        cdef int64_t base
        if len(columns) != self.ncols:
            raise ValueError(f"expected {self.ncols} columns, got {len(columns)}")
        for s in range(self.ncols):
            c = &self.cols[s]
            column = columns[s]
            values = np.ascontiguousarray(column.values, dtype=self.schema[s].numpy_dtype)
            n = values.shape[0]
            if c.len + n > c.cap:
                _grow(<void**>&c.data, &c.cap, c.len + n, c.itemsize)
            if n:
                raw = values.view(np.uint8)
                memcpy(c.data + c.len * c.itemsize, &raw[0], n * c.itemsize)
            if not c.width:
                if self.nrows + rows + 1 > c.ocap:
                    _grow(<void**>&c.offs, &c.ocap, self.nrows + rows + 1, sizeof(int64_t))
                base = c.offs[self.nrows]
                if column.offsets is None:
                    width = column.width
                    for r in range(rows):
                        c.offs[self.nrows + 1 + r] = base + (r + 1) * width
                else:
                    o64 = np.ascontiguousarray(column.offsets, dtype=np.int64)
                    for r in range(rows):
                        c.offs[self.nrows + 1 + r] = base + o64[r + 1]
            c.len += n
        self.nrows += rows

    def take(self):
        """Copies out the rows added since the last take and empties the buffers.

        Returns ``(rows, [(values, offsets, width), ...])`` in schema order, or
        None when no rows are pending: the layout of the parser's ``take``
        (``offsets`` None for dense slots and for sparse slots whose rows all
        hold the same number of values; int32 unless that would overflow).
        """
        cdef Py_ssize_t rows = self.nrows
        if rows == 0:
            return None
        columns = take_columns(self.cols, self.ncols, rows, self._dtypes)
        self.nrows = 0
        return rows, columns


cdef _note_input_line(object error, str where, Py_ssize_t line_number, object line):
    cdef str text = repr(line)
    if len(text) > 160:
        text = text[:157] + "..."
    add_note(error, f"in the samples of input line {line_number} of {where}: {text}")


def run_samples(object lines, object generate_sample, ColumnBuilder builder,
                object slow, object flush, Py_ssize_t chunk_rows, str where):
    """Paddle's ``run_from_stdin`` loop, into ``builder`` instead of text.

    Every sample of ``generate_sample(line)()`` that is not None is numbered
    (1-based, as the generator numbers its output lines) and added to
    ``builder``; a sample the builder declines goes to ``slow(sample,
    number)``. ``flush()`` is called whenever ``chunk_rows`` rows are pending.

    Returns:
        ``(input lines, samples)``; ``sys.exit(0)`` in ``generate_sample``
        ends them where it is called, as it ends a generator process's output.

    Raises:
        Whatever ``generate_sample`` or ``slow`` raises, with a note naming
        the input line and ``where`` (the file); a ``SystemExit`` of another
        status too.
    """
    cdef Py_ssize_t line_number = 0
    cdef long long number = 0
    cdef object line = None
    try:
        for line in lines:
            line_number += 1
            for sample in generate_sample(line)():
                if sample is None:
                    continue
                number += 1
                if not builder.add(sample):
                    slow(sample, number)
                if builder.nrows >= chunk_rows:
                    flush()
    except SystemExit as error:
        # A generator process that calls sys.exit(0) ends its output there,
        # after the samples it wrote: the file's samples end here too.
        if exit_status(error) == 0:
            return line_number, number
        _note_input_line(error, where, line_number, line)
        raise
    except Exception as error:
        _note_input_line(error, where, line_number, line)
        raise
    return line_number, number


def exit_status(error):
    """The exit status of a process that ends with ``error`` (a ``SystemExit``),
    as its parent sees it: ``sys.exit()`` 0, ``sys.exit(n)`` n's low 8 bits
    (256 is 0, -1 is 255), any other value (a message) 1."""
    code = error.code
    if code is None:
        return 0
    if isinstance(code, int):
        return int(code) & 0xFF
    return 1
