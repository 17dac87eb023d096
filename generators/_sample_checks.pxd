# What the formatter (_format.pyx) cimports from _sample_checks.pyx: the
# classification of values it has no fast path for, and every failure.

cdef enum ValueKind:
    NOT_A_NUMBER = 0
    INTEGER = 1
    FLOATING = 2

cdef int value_kind(object value) except -1
cdef object slots_of(object sample, long long number)
cdef tuple unpack_pair(object item, Py_ssize_t index, long long number)

cdef int fail_no_slots(object sample, long long number) except -1
cdef int fail_resized(long long number) except -1
cdef int fail_slot_names(object slots, list expected, long long number) except -1
cdef int fail_slot_name_type(object name, long long number) except -1
cdef int fail_values_type(object name, object values, long long number,
                          bint strings) except -1
cdef int fail_empty_slot(object name, object values, long long number) except -1
cdef int fail_not_a_number(object name, object value, long long number) except -1
cdef int fail_not_a_str(object name, object value, long long number) except -1

cdef void note_input_line(object error, Py_ssize_t line_number, object line,
                          bint batching)
