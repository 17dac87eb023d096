"""Writes generator samples as MultiSlot text, and Paddle's run loop around it.

A sample is a list or tuple (or a zip) of ``(name, [values])`` pairs. Its text
is, for each slot, the number of values and then every value through
``str()``, all separated by single spaces, and a ``\\n`` at the end: byte for
byte what Paddle's ``MultiSlotDataGenerator._gen_str`` writes
(paddle_semantics.md §1.3). Names are checked but never written.

``SampleFormatter`` appends that text to a growable C buffer that its owner
drains with ``take()``. Exact ``int`` values that fit in 64 bits and exact
``float`` values are written without building a ``str`` (ints by
_int_digits.pxd, floats by _shortest_float.pyx); every other value (``bool``,
big ints, numpy scalars, subclasses) goes through ``str()`` so the text always
equals ``str(value)``. The checks and their ``SampleError`` messages are in
_sample_checks.pyx. ``run_generator`` is Paddle's ``run_from_stdin`` loop on
top of the formatter.
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from libc.math cimport isfinite
from libc.string cimport memcpy, memset, strlen

from generators._int_digits cimport write_int64
from generators._sample_checks cimport (
    FLOATING,
    NOT_A_NUMBER,
    fail_empty_slot,
    fail_no_slots,
    fail_not_a_number,
    fail_not_a_str,
    fail_resized,
    fail_slot_name_type,
    fail_slot_names,
    fail_values_type,
    note_input_line,
    slots_of,
    unpack_pair,
    value_kind,
)
from generators._shortest_float cimport write_float_repr


cdef extern from "Python.h":
    enum:
        Py_DTSF_ADD_DOT_0
    # The function behind float.__repr__ (== float.__str__): repr(x) is
    # PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL). The caller
    # frees the result with PyMem_Free.
    char* PyOS_double_to_string(
        double value, char format_code, int precision, int flags, int* kind
    ) except NULL
    const char* PyUnicode_AsUTF8AndSize(object text, Py_ssize_t* size) except NULL


# Room for one separator and the longest int64 (20 chars) or float repr (24).
cdef Py_ssize_t NUMBER_ROOM = 32
cdef Py_ssize_t INITIAL_CAPACITY = 1 << 16


cdef class SampleFormatter:
    """Checks samples and appends their MultiSlot text to a buffer.

    The numeric formatter (the default) applies Paddle's
    ``MultiSlotDataGenerator`` checks: the first sample fixes the slot names
    and their order; every slot is a non-empty list of int or float values
    (numpy integer and floating scalars included). With ``strings=True`` it
    formats like ``MultiSlotStringDataGenerator``: values are str, written
    as they are, and an empty list is written as ``0``.

    A sample that fails a check raises ``SampleError`` and leaves the buffer
    and the slot schema as they were.

    Args:
        strings: Format string values (MultiSlotStringDataGenerator) instead
            of checked numbers.
    """

    cdef char* _buffer  # owned: PyMem_Malloc'd here, freed in __dealloc__
    cdef Py_ssize_t _size
    cdef Py_ssize_t _capacity
    cdef readonly bint strings
    cdef readonly long long samples
    cdef list _slot_names  # names of the first sample; None until it is in
    cdef Py_ssize_t _slot_count
    # Per slot: 1 once any sample held a float there (Paddle's proto_info).
    cdef unsigned char* _float_slots
    # Per slot of the sample being formatted; merged when it succeeds.
    cdef unsigned char* _sample_floats
    cdef Py_ssize_t _scratch_slots

    def __cinit__(self, *, bint strings=False):
        self._buffer = <char*>PyMem_Malloc(INITIAL_CAPACITY)
        if self._buffer == NULL:
            raise MemoryError()
        self._capacity = INITIAL_CAPACITY
        self.strings = strings

    def __dealloc__(self):
        PyMem_Free(self._buffer)
        PyMem_Free(self._float_slots)
        PyMem_Free(self._sample_floats)

    def __len__(self):
        """The number of bytes buffered and not yet taken."""
        return self._size

    @property
    def proto_info(self):
        """Paddle's ``_proto_info``: ``[(name, "uint64" | "float"), ...]``.

        None before the first sample, and always None for string samples.
        """
        if self._slot_names is None:
            return None
        return [
            (name, "float" if self._float_slots[index] else "uint64")
            for index, name in enumerate(self._slot_names)
        ]

    def append(self, sample):
        """Checks one sample and appends its line to the buffer.

        Raises:
            SampleError: The sample is not valid; nothing was appended.
        """
        self._append_sample(sample)

    def extend(self, samples):
        """Appends every sample of an iterable; returns how many there were.

        Raises:
            SampleError: A sample is not valid; the ones before it stay in.
        """
        cdef Py_ssize_t count = 0
        for sample in samples:
            self._append_sample(sample)
            count += 1
        return count

    def format(self, sample):
        """Checks one sample and returns its line, leaving the buffer alone.

        Raises:
            SampleError: The sample is not valid.
        """
        cdef Py_ssize_t start = self._size
        self._append_sample(sample)
        line = PyBytes_FromStringAndSize(self._buffer + start, self._size - start)
        self._size = start
        return line

    def append_text(self, str text):
        """Appends a line formatted elsewhere (a subclass's own ``_gen_str``).

        The text is written as UTF-8, unchecked; ``samples`` does not count it.
        """
        self._append_text(text)

    def take(self):
        """Returns the buffered text and empties the buffer."""
        data = PyBytes_FromStringAndSize(self._buffer, self._size)
        self._size = 0
        return data

    cdef int _grow(self, Py_ssize_t extra) except -1:
        cdef Py_ssize_t capacity = self._capacity * 2
        cdef char* grown
        if capacity < self._size + extra:
            capacity = self._size + extra
        grown = <char*>PyMem_Realloc(self._buffer, capacity)
        if grown == NULL:
            raise MemoryError()
        self._buffer = grown
        self._capacity = capacity
        return 0

    cdef inline int _reserve(self, Py_ssize_t extra) except -1:
        if self._size + extra > self._capacity:
            self._grow(extra)
        return 0

    cdef inline void _put_space(self) noexcept:
        # The caller has reserved the room.
        self._buffer[self._size] = c' '
        self._size += 1

    cdef int _put_utf8(self, str text) except -1:
        cdef Py_ssize_t length
        cdef const char* data = PyUnicode_AsUTF8AndSize(text, &length)
        self._reserve(length)
        memcpy(self._buffer + self._size, data, length)
        self._size += length
        return 0

    cdef int _put_double(self, double value) except -1:
        cdef char* text = PyOS_double_to_string(
            value, c'r', 0, Py_DTSF_ADD_DOT_0, NULL
        )
        cdef Py_ssize_t length = <Py_ssize_t>strlen(text)
        if self._size + length > self._capacity:
            try:
                self._grow(length)
            finally:
                PyMem_Free(text)
        memcpy(self._buffer + self._size, text, length)
        PyMem_Free(text)
        self._size += length
        return 0

    cdef int _append_text(self, str text) except -1:
        self._put_utf8(text)
        return 0

    cdef int _append_sample(self, object sample) except -1:
        cdef Py_ssize_t start = self._size
        cdef long long number = self.samples + 1
        try:
            if self.strings:
                self._put_string_sample(sample, number)
            else:
                self._put_numeric_sample(sample, number)
        except BaseException:
            self._size = start  # a failed sample leaves no partial line behind
            raise
        self.samples = number
        return 0

    cdef int _prepare_scratch(self, Py_ssize_t slot_count) except -1:
        cdef unsigned char* grown
        if slot_count > self._scratch_slots:
            grown = <unsigned char*>PyMem_Realloc(self._sample_floats, slot_count)
            if grown == NULL:
                raise MemoryError()
            self._sample_floats = grown
            self._scratch_slots = slot_count
        return 0

    cdef int _commit_schema(self, list names) except -1:
        cdef Py_ssize_t slot_count = len(names)
        self._float_slots = <unsigned char*>PyMem_Malloc(slot_count)
        if self._float_slots == NULL:
            raise MemoryError()
        memset(self._float_slots, 0, slot_count)
        self._slot_names = names
        self._slot_count = slot_count
        return 0

    cdef int _put_numeric_sample(self, object sample, long long number) except -1:
        cdef object slots = slots_of(sample, number)
        cdef Py_ssize_t slot_count = len(slots)
        cdef bint first = self._slot_names is None
        cdef list names = [] if first else None
        cdef Py_ssize_t index = 0
        cdef Py_ssize_t value_count
        cdef object item, name, values, value, value_type
        cdef tuple pair
        cdef bint saw_float
        cdef int overflow
        cdef int kind
        cdef long long as_int64
        cdef double as_double
        if slot_count == 0:
            fail_no_slots(sample, number)
        if not first and slot_count != self._slot_count:
            fail_slot_names(slots, self._slot_names, number)
        self._prepare_scratch(slot_count)
        for item in slots:
            if index == slot_count:
                fail_resized(number)
            if type(item) is tuple and len(<tuple>item) == 2:
                pair = <tuple>item
            else:
                pair = unpack_pair(item, index, number)
            name = pair[0]
            values = pair[1]
            if not isinstance(name, str):
                fail_slot_name_type(name, number)
            if first:
                names.append(name)
            elif (name is not self._slot_names[index]
                  and name != self._slot_names[index]):
                fail_slot_names(slots, self._slot_names, number)
            if not isinstance(values, list):
                fail_values_type(name, values, number, False)
            value_count = len(<list>values)
            if value_count == 0:
                fail_empty_slot(name, values, number)
            self._reserve(NUMBER_ROOM)
            if index:
                self._put_space()
            self._size += write_int64(self._buffer + self._size, value_count)
            saw_float = False
            for value in <list>values:
                self._reserve(NUMBER_ROOM)
                self._put_space()
                value_type = type(value)
                if value_type is int:
                    as_int64 = PyLong_AsLongLongAndOverflow(value, &overflow)
                    if overflow == 0:
                        self._size += write_int64(
                            self._buffer + self._size, as_int64
                        )
                    else:
                        self._put_utf8(str(value))
                elif value_type is float:
                    as_double = PyFloat_AS_DOUBLE(value)
                    if isfinite(as_double):
                        self._size += write_float_repr(
                            self._buffer + self._size, as_double
                        )
                    else:
                        self._put_double(as_double)
                    saw_float = True
                else:
                    kind = value_kind(value)
                    if kind == NOT_A_NUMBER:
                        fail_not_a_number(name, value, number)
                    saw_float = saw_float or kind == FLOATING
                    self._put_utf8(str(value))
            self._sample_floats[index] = saw_float
            index += 1
        self._reserve(1)
        self._buffer[self._size] = c'\n'
        self._size += 1
        if first:
            self._commit_schema(names)
        for index in range(slot_count):
            self._float_slots[index] |= self._sample_floats[index]
        return 0

    cdef int _put_string_sample(self, object sample, long long number) except -1:
        cdef object slots = slots_of(sample, number)
        cdef Py_ssize_t index = 0
        cdef Py_ssize_t length
        cdef const char* data
        cdef object item, name, values, value
        cdef tuple pair
        if len(slots) == 0:
            fail_no_slots(sample, number)
        for item in slots:
            if type(item) is tuple and len(<tuple>item) == 2:
                pair = <tuple>item
            else:
                pair = unpack_pair(item, index, number)
            name = pair[0]
            values = pair[1]
            if not isinstance(values, (list, tuple)):
                fail_values_type(name, values, number, True)
            self._reserve(NUMBER_ROOM)
            if index:
                self._put_space()
            self._size += write_int64(self._buffer + self._size, len(values))
            for value in values:
                if not isinstance(value, str):
                    fail_not_a_str(name, value, number)
                data = PyUnicode_AsUTF8AndSize(value, &length)
                self._reserve(length + 1)
                self._put_space()
                memcpy(self._buffer + self._size, data, length)
                self._size += length
            index += 1
        self._reserve(1)
        self._buffer[self._size] = c'\n'
        self._size += 1
        return 0


cdef inline int _emit(SampleFormatter formatter, object gen_str,
                      object sample) except -1:
    if gen_str is None:
        formatter._append_sample(sample)
    else:
        formatter._append_text(gen_str(sample))
    return 0


cdef int _emit_batch(SampleFormatter formatter, object gen_str,
                     object generate_batch, list batch) except -1:
    for sample in generate_batch(batch)():
        _emit(formatter, gen_str, sample)
    return 0


def run_generator(object lines, object generate_sample, object generate_batch,
                  Py_ssize_t batch_size, SampleFormatter formatter, object gen_str,
                  object write, Py_ssize_t block_size):
    """Paddle's ``run_from_stdin`` loop, formatting into ``formatter``.

    For every line, the samples of ``generate_sample(line)()`` that are not
    None are formatted, in batches of ``batch_size`` through
    ``generate_batch(batch)()``, or one by one when ``generate_batch`` is None
    (Paddle's default ``generate_batch`` yields the batch unchanged, so the
    text is the same). Whenever the buffer holds ``block_size`` bytes or
    more, ``write(block)`` is called with them; the rest is written at the end.

    Args:
        lines: The input lines (``sys.stdin``, or ``[None]`` for
            ``run_from_memory``).
        generate_sample: The generator's ``generate_sample``.
        generate_batch: The generator's ``generate_batch``, or None when it is
            Paddle's default.
        batch_size: How many samples make a batch for ``generate_batch``.
        formatter: Where the text goes.
        gen_str: A subclass's own ``_gen_str`` that turns a sample into a
            line, or None to let ``formatter`` check and format samples.
        write: Called with each block of bytes.
        block_size: Blocks are at least this many bytes, except the last.

    Raises:
        SampleError: A sample is not valid; a note names the input line.
        Exception: Whatever ``generate_sample`` or ``generate_batch`` raised,
            with the same note; an error of ``write`` has none.
        SystemExit: the user's code called ``sys.exit``; the samples
            formatted before it are written first.
    """
    cdef Py_ssize_t line_number = 0
    cdef list batch = []
    cdef object line = None
    cdef bint batching = generate_batch is not None
    cdef bint writing = False
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    try:
        for line in lines:
            line_number += 1
            for sample in generate_sample(line)():
                if sample is None:
                    continue
                if not batching:
                    _emit(formatter, gen_str, sample)
                else:
                    batch.append(sample)
                    if len(batch) < batch_size:
                        continue
                    _emit_batch(formatter, gen_str, generate_batch, batch)
                    batch = []
                # Checked per sample: run_from_memory has one "line" only.
                if formatter._size >= block_size:
                    writing = True
                    write(formatter.take())
                    writing = False
        if batch:
            _emit_batch(formatter, gen_str, generate_batch, batch)
    except SystemExit as error:
        # sys.exit() in the user's code: what a generator process wrote before
        # it reaches the reader (Paddle's too: the interpreter flushes at the
        # exit), so what is formatted here is written. A batch still filling
        # never went through generate_batch: it is not.
        if not writing:
            note_input_line(error, line_number, line, batching)
            if formatter._size:
                write(formatter.take())
        raise
    except Exception as error:
        # The user's own errors too: under a pipe command the traceback on
        # stderr is all the loader sees, and the note (its last line) is the
        # one place that says where in the input the reader failed.
        if not writing:
            note_input_line(error, line_number, line, batching)
        raise
    if formatter._size:
        write(formatter.take())
