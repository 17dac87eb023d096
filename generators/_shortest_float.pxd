# The C entry point of _shortest_float.pyx, cimported by the formatter.

cdef Py_ssize_t write_float_repr(char* out, double value) noexcept nogil
