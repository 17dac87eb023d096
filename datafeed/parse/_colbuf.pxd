# Growable per-slot column buffers, shared by the text parser (_parse.pyx) and
# the in-process sample builder (_samples.pyx).

from libc.stdint cimport int64_t


ctypedef struct ColumnBuffer:
    char* data              # the values, itemsize bytes each; owned by the builder
    Py_ssize_t len          # values committed, plus those of the record being added
    Py_ssize_t cap
    int64_t* offs           # sparse slots: rows + 1 committed offsets, offs[0] == 0
    Py_ssize_t ocap
    int kind
    Py_ssize_t width        # dense slots: values per record; 0 for a sparse slot
    Py_ssize_t itemsize


cdef int grow(void** buf, Py_ssize_t* cap, Py_ssize_t need,
              Py_ssize_t itemsize) noexcept nogil

cdef list take_columns(ColumnBuffer* buffers, Py_ssize_t count, Py_ssize_t rows,
                       list dtypes)
