"""Checks generator samples and writes them as MultiSlot text.

A sample is a list or tuple (or a zip) of ``(name, [values])`` pairs. Its text
is, for each slot, the number of values and then every value through
``str()``, all separated by single spaces, and a ``\\n`` at the end: byte for
byte what Paddle's ``MultiSlotDataGenerator._gen_str`` writes
(paddle_semantics.md §1.3). Names are checked but never written.

``SampleFormatter`` appends that text to a growable C buffer that its owner
drains with ``take()``. Exact ``int`` values that fit in 64 bits and exact
``float`` values are written without building a ``str``; every other value
(``bool``, big ints, numpy scalars, subclasses) goes through ``str()`` so the
text always equals ``str(value)``. ``run_generator`` is Paddle's
``run_from_stdin`` loop on top of it.
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.number cimport PyIndex_Check
from libc.math cimport isfinite
from libc.stdint cimport int32_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset, strlen

import sys


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


cdef extern from *:
    """
    /* Ryu's mulShift64: the 64x128-bit product m * mul, shifted right by j. */
    static inline uint64_t fleetfeed_mul_shift64(uint64_t m, const uint64_t* mul,
                                                 int32_t j) {
        unsigned __int128 b0 = (unsigned __int128)m * mul[0];
        unsigned __int128 b2 = (unsigned __int128)m * mul[1];
        return (uint64_t)(((b0 >> 64) + b2) >> (j - 64));
    }
    """
    # mul is a (low, high) row of POW5_SPLIT or POW5_INV_SPLIT.
    uint64_t _mul_shift "fleetfeed_mul_shift64"(
        uint64_t m, const uint64_t* mul, int32_t j
    ) noexcept nogil


class SampleError(ValueError):
    """A sample that cannot be written as MultiSlot text.

    Raised while a generator formats its output, with a message that names
    the slot, the sample and the bad value.

    Attributes:
        slot: The name of the slot at fault, or None when the fault is in the
            sample as a whole (not a list, no slots, a different slot count).
        sample: The 1-based number of the sample in this generator's output.
        value: The offending object (a value, a list of values, a slot name
            or the whole sample).
    """

    def __init__(self, message, slot=None, sample=None, value=None):
        super().__init__(message)
        self.slot = slot
        self.sample = sample
        self.value = value

    def __reduce__(self):
        # Keeps slot/sample/value (and any notes) across pickling, which the
        # default reduce of an exception with extra arguments loses.
        return (type(self), (self.args[0], self.slot, self.sample, self.value),
                self.__dict__)


# Public under its package name, which is also where pickle looks it up.
SampleError.__module__ = "generators"


cdef enum ValueKind:
    NOT_A_NUMBER = 0
    INTEGER = 1
    FLOATING = 2


# Room for one separator and the longest int64 (20 chars) or float repr (24).
cdef Py_ssize_t NUMBER_ROOM = 32
cdef Py_ssize_t INITIAL_CAPACITY = 1 << 16
cdef Py_ssize_t REPR_LIMIT = 80
cdef const char* DIGIT_PAIRS = (
    b"0001020304050607080910111213141516171819202122232425262728293031323334353637"
    b"3839404142434445464748495051525354555657585960616263646566676869707172737475"
    b"767778798081828384858687888990919293949596979899"
)

# type -> ValueKind for every value type other than exact int and float.
cdef dict _value_kinds = {}


cdef inline Py_ssize_t _write_int64(char* out, long long value) noexcept nogil:
    """Writes the decimal digits of value at out; returns how many."""
    cdef char digits[24]
    cdef char* start = digits + 24
    cdef unsigned long long magnitude
    cdef unsigned long long pair
    cdef Py_ssize_t length
    if value < 0:
        # Negating in unsigned arithmetic is defined for INT64_MIN too.
        magnitude = 0ULL - <unsigned long long>value
    else:
        magnitude = <unsigned long long>value
    while magnitude >= 100:
        pair = magnitude % 100
        magnitude //= 100
        start -= 2
        memcpy(start, DIGIT_PAIRS + 2 * pair, 2)
    if magnitude >= 10:
        start -= 2
        memcpy(start, DIGIT_PAIRS + 2 * magnitude, 2)
    else:
        start -= 1
        start[0] = <char>(c'0' + magnitude)
    if value < 0:
        start -= 1
        start[0] = c'-'
    length = digits + 24 - start
    memcpy(out, start, length)
    return length


# ---------------------------------------------------------------------------
# repr(float) without CPython's dtoa.
#
# repr(x) is the shortest decimal string that reads back as x, the closest to
# x when several are that short (David Gay's dtoa, mode 0). Ryu (Ulf Adams,
# PLDI 2018, github.com/ulfjack/ryu, d2s.c) finds the same digits with a few
# 128-bit multiplications instead of big-number arithmetic: ~30 ns instead of
# ~250 ns for the 17-digit values that normalised features have. The digits
# are then laid out as float_repr does ('r' format, Py_DTSF_ADD_DOT_0):
# positional when the decimal exponent is in [-4, 16), scientific otherwise.
# tests/test_generators.py checks it against repr() on millions of doubles.
# Non-finite values still go through PyOS_double_to_string.

cdef enum:
    DOUBLE_MANTISSA_BITS = 52
    DOUBLE_BIAS = 1023
    POW5_INV_BITCOUNT = 125
    POW5_BITCOUNT = 125
    POW5_INV_TABLE_SIZE = 342
    POW5_TABLE_SIZE = 326

# Ryu's DOUBLE_POW5_INV_SPLIT and DOUBLE_POW5_SPLIT as (low, high) words:
# 2**(bits(5**q) - 1 + 125) // 5**q + 1, and the top 125 bits of 5**i.
cdef uint64_t POW5_INV_SPLIT[POW5_INV_TABLE_SIZE][2]
cdef uint64_t POW5_SPLIT[POW5_TABLE_SIZE][2]


cdef void _fill_pow5_tables():
    # Exact big-int arithmetic at import: ~0.3 ms, and no 10 KB literal table.
    cdef Py_ssize_t index
    mask = (1 << 64) - 1
    FIVE = 5  # a Python int: 5 ** index must be exact, not a C double
    for index in range(POW5_TABLE_SIZE):
        pow5 = FIVE ** index
        shift = pow5.bit_length() - POW5_BITCOUNT
        split = pow5 >> shift if shift >= 0 else pow5 << -shift
        POW5_SPLIT[index][0] = split & mask
        POW5_SPLIT[index][1] = split >> 64
    for index in range(POW5_INV_TABLE_SIZE):
        pow5 = FIVE ** index
        split = (1 << (pow5.bit_length() - 1 + POW5_INV_BITCOUNT)) // pow5 + 1
        POW5_INV_SPLIT[index][0] = split & mask
        POW5_INV_SPLIT[index][1] = split >> 64


_fill_pow5_tables()


cdef inline int32_t _pow5_bits(int32_t e) noexcept nogil:
    # ceil(log2(5**e)), or 1 for e == 0; exact for 0 <= e <= 3528.
    return <int32_t>(((<uint32_t>e * 1217359) >> 19) + 1)


cdef inline uint32_t _log10_pow2(int32_t e) noexcept nogil:
    # floor(log10(2**e)) for 0 <= e <= 1650.
    return (<uint32_t>e * 78913) >> 18


cdef inline uint32_t _log10_pow5(int32_t e) noexcept nogil:
    # floor(log10(5**e)) for 0 <= e <= 2620.
    return (<uint32_t>e * 732923) >> 20


cdef inline bint _multiple_of_pow5(uint64_t value, uint32_t power) noexcept nogil:
    cdef uint32_t count = 0
    while value % 5 == 0:
        value //= 5
        count += 1
    return count >= power


cdef inline bint _multiple_of_pow2(uint64_t value, uint32_t power) noexcept nogil:
    return (value & ((1ULL << power) - 1)) == 0


cdef uint64_t _shortest_digits(uint64_t ieee_mantissa, uint32_t ieee_exponent,
                               int32_t* exponent10) noexcept nogil:
    """Ryu's d2d: the shortest, closest decimal ``digits * 10**exponent10``.

    A line-by-line transcription of d2d() in ryu/d2s.c (Apache-2.0), with its
    step numbers; the comments there explain the bounds.
    """
    cdef int32_t e2
    cdef uint64_t m2
    if ieee_exponent == 0:
        e2 = 1 - DOUBLE_BIAS - DOUBLE_MANTISSA_BITS - 2
        m2 = ieee_mantissa
    else:
        e2 = <int32_t>ieee_exponent - DOUBLE_BIAS - DOUBLE_MANTISSA_BITS - 2
        m2 = (1ULL << DOUBLE_MANTISSA_BITS) | ieee_mantissa
    cdef bint accept_bounds = (m2 & 1) == 0  # round-half-even reading

    # Step 2: the interval of decimals that read back as this double.
    cdef uint64_t mv = 4 * m2
    cdef uint32_t mm_shift = ieee_mantissa != 0 or ieee_exponent <= 1

    # Step 3: to a decimal power base, with 128-bit arithmetic.
    cdef uint64_t vr, vp, vm
    cdef int32_t e10, k, i, j
    cdef uint32_t q
    cdef bint vm_trailing_zeros = False
    cdef bint vr_trailing_zeros = False
    if e2 >= 0:
        q = _log10_pow2(e2) - (e2 > 3)
        e10 = <int32_t>q
        k = POW5_INV_BITCOUNT + _pow5_bits(<int32_t>q) - 1
        i = -e2 + <int32_t>q + k
        vr = _mul_shift(4 * m2, POW5_INV_SPLIT[q], i)
        vp = _mul_shift(4 * m2 + 2, POW5_INV_SPLIT[q], i)
        vm = _mul_shift(4 * m2 - 1 - mm_shift, POW5_INV_SPLIT[q], i)
        if q <= 21:
            if mv % 5 == 0:
                vr_trailing_zeros = _multiple_of_pow5(mv, q)
            elif accept_bounds:
                vm_trailing_zeros = _multiple_of_pow5(mv - 1 - mm_shift, q)
            else:
                vp -= _multiple_of_pow5(mv + 2, q)
    else:
        q = _log10_pow5(-e2) - (-e2 > 1)
        e10 = <int32_t>q + e2
        i = -e2 - <int32_t>q
        k = _pow5_bits(i) - POW5_BITCOUNT
        j = <int32_t>q - k
        vr = _mul_shift(4 * m2, POW5_SPLIT[i], j)
        vp = _mul_shift(4 * m2 + 2, POW5_SPLIT[i], j)
        vm = _mul_shift(4 * m2 - 1 - mm_shift, POW5_SPLIT[i], j)
        if q <= 1:
            vr_trailing_zeros = True
            if accept_bounds:
                vm_trailing_zeros = mm_shift == 1
            else:
                vp -= 1
        elif q < 63:
            vr_trailing_zeros = _multiple_of_pow2(mv, q)

    # Step 4: the shortest decimal in the interval.
    cdef int32_t removed = 0
    cdef uint32_t last_removed_digit = 0
    cdef bint round_up = False
    cdef uint64_t output
    if vm_trailing_zeros or vr_trailing_zeros:
        # The general case (~0.7% of doubles).
        while vp // 10 > vm // 10:
            vm_trailing_zeros &= vm % 10 == 0
            vr_trailing_zeros &= last_removed_digit == 0
            last_removed_digit = <uint32_t>(vr % 10)
            vr //= 10
            vp //= 10
            vm //= 10
            removed += 1
        if vm_trailing_zeros:
            while vm % 10 == 0:
                vr_trailing_zeros &= last_removed_digit == 0
                last_removed_digit = <uint32_t>(vr % 10)
                vr //= 10
                vp //= 10
                vm //= 10
                removed += 1
        if vr_trailing_zeros and last_removed_digit == 5 and vr % 2 == 0:
            last_removed_digit = 4  # exactly half-way: round to even
        output = vr + (
            (vr == vm and (not accept_bounds or not vm_trailing_zeros))
            or last_removed_digit >= 5
        )
    else:
        # The common case, two digits at a time first.
        if vp // 100 > vm // 100:
            round_up = vr % 100 >= 50
            vr //= 100
            vp //= 100
            vm //= 100
            removed += 2
        while vp // 10 > vm // 10:
            round_up = vr % 10 >= 5
            vr //= 10
            vp //= 10
            vm //= 10
            removed += 1
        output = vr + (vr == vm or round_up)
    exponent10[0] = e10 + removed
    return output


cdef Py_ssize_t _write_float_repr(char* out, double value) noexcept nogil:
    """Writes ``repr(value)`` of a finite double at out (24 bytes at most)."""
    cdef uint64_t bits
    memcpy(&bits, &value, 8)
    cdef uint64_t ieee_mantissa = bits & ((1ULL << DOUBLE_MANTISSA_BITS) - 1)
    cdef uint32_t ieee_exponent = <uint32_t>((bits >> DOUBLE_MANTISSA_BITS) & 0x7FF)
    cdef char* cursor = out
    cdef char digits[24]
    cdef int32_t exponent10
    cdef Py_ssize_t length, point, zeros
    cdef int32_t shown
    if bits >> 63:
        cursor[0] = c'-'
        cursor += 1
    if ieee_exponent == 0 and ieee_mantissa == 0:
        memcpy(cursor, b"0.0", 3)
        return cursor + 3 - out
    length = _write_int64(digits, <long long>_shortest_digits(
        ieee_mantissa, ieee_exponent, &exponent10))
    # value = 0.DIGITS * 10**point
    point = length + exponent10
    if -4 < point <= 16:
        if point <= 0:
            zeros = -point
            memcpy(cursor, b"0.", 2)
            cursor += 2
            memset(cursor, c'0', zeros)
            cursor += zeros
            memcpy(cursor, digits, length)
            cursor += length
        elif point >= length:
            memcpy(cursor, digits, length)
            cursor += length
            memset(cursor, c'0', point - length)
            cursor += point - length
            memcpy(cursor, b".0", 2)
            cursor += 2
        else:
            memcpy(cursor, digits, point)
            cursor += point
            cursor[0] = c'.'
            cursor += 1
            memcpy(cursor, digits + point, length - point)
            cursor += length - point
        return cursor - out
    cursor[0] = digits[0]
    cursor += 1
    if length > 1:
        cursor[0] = c'.'
        cursor += 1
        memcpy(cursor, digits + 1, length - 1)
        cursor += length - 1
    shown = <int32_t>(point - 1)
    cursor[0] = c'e'
    cursor[1] = c'-' if shown < 0 else c'+'
    cursor += 2
    if shown < 0:
        shown = -shown
    if shown < 10:
        cursor[0] = c'0'  # repr writes at least two exponent digits
        cursor += 1
    cursor += _write_int64(cursor, shown)
    return cursor - out


def float_repr(double value):
    """``repr(value)`` through the formatter's own float path (for tests)."""
    cdef char text[32]
    if not isfinite(value):
        return repr(value)
    return text[:_write_float_repr(text, value)].decode("ascii")


cdef int _classify(object value) except -1:
    if isinstance(value, int):
        return INTEGER  # bool included: Paddle accepts it and writes 'True'
    if isinstance(value, float):
        return FLOATING  # numpy.float64 is a float subclass
    if PyIndex_Check(value):
        return INTEGER  # numpy.integer and any other type with __index__
    # numpy.float32/float16/longdouble, recognised without importing numpy
    # (a generator process must start fast).
    for base in type(value).__mro__:
        if base.__name__ == "floating" and base.__module__ == "numpy":
            return FLOATING
    return NOT_A_NUMBER


cdef inline int _value_kind(object value) except -1:
    cdef object kind = _value_kinds.get(type(value))
    if kind is None:
        kind = _classify(value)
        _value_kinds[type(value)] = kind
    return kind


cdef str _describe(object value):
    """``repr(value)`` (shortened) and the type name, for messages."""
    cdef str text = repr(value)
    if len(text) > REPR_LIMIT:
        text = text[:REPR_LIMIT - 3] + "..."
    return f"{text} ({type(value).__name__})"


cdef object _slots_of(object sample, long long number):
    """The sample's (name, values) items as a list or tuple."""
    if type(sample) is list or type(sample) is tuple:
        return sample
    if type(sample) is zip:
        return list(sample)
    if isinstance(sample, (list, tuple)):
        return sample
    raise SampleError(
        f"sample {number} must be a list or tuple of (name, [values]) pairs, "
        f"found {_describe(sample)}",
        None, number, sample,
    )


cdef tuple _unpack_pair(object item, Py_ssize_t index, long long number):
    """The (name, values) of an item that is not an exact 2-tuple."""
    if isinstance(item, (list, tuple)) and len(item) == 2:
        return (item[0], item[1])
    raise SampleError(
        f"item {index + 1} of sample {number} must be a (name, [values]) pair, "
        f"found {_describe(item)}",
        None, number, item,
    )


cdef list _names_in(object slots):
    """The slot names of a sample, with '?' for items that are not pairs."""
    return [
        item[0] if isinstance(item, (list, tuple)) and len(item) == 2 else "?"
        for item in slots
    ]


cdef int _fail_no_slots(object sample, long long number) except -1:
    raise SampleError(
        f"sample {number} has no slots: expected a list of (name, [values]) pairs",
        None, number, sample,
    )


cdef int _fail_resized(long long number) except -1:
    # Only a __str__ with side effects on the sample can get here.
    raise RuntimeError(f"sample {number} changed size while it was being formatted")


cdef int _fail_values_type(object name, object values, long long number,
                           bint strings) except -1:
    cdef str expected = "a list or tuple of str" if strings else "a list"
    cdef str message = (
        f"slot {name!r} of sample {number}: values must be {expected}, "
        f"found {_describe(values)}"
    )
    if isinstance(values, tuple):
        message += (
            "; MultiSlotDataGenerator takes only lists, as Paddle's does: "
            "convert it with list(...)"
        )
    elif hasattr(values, "tolist"):
        message += "; convert it with .tolist()"
    elif isinstance(values, (int, float, str, bytes)):
        message += f"; wrap a single value in a list: [{values!r}]"
    raise SampleError(message, name, number, values)


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

    cdef int _fail_slot_names(self, object slots, long long number) except -1:
        cdef list found = _names_in(slots)
        cdef list expected = self._slot_names
        cdef object culprit = None
        cdef Py_ssize_t index
        for index in range(min(len(found), len(expected))):
            if found[index] != expected[index]:
                if isinstance(found[index], str):
                    culprit = found[index]
                break
        raise SampleError(
            f"sample {number} has slots {found!r} "
            f"but the first sample had {expected!r}",
            culprit, number, slots,
        )

    cdef int _put_numeric_sample(self, object sample, long long number) except -1:
        cdef object slots = _slots_of(sample, number)
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
            _fail_no_slots(sample, number)
        if not first and slot_count != self._slot_count:
            self._fail_slot_names(slots, number)
        self._prepare_scratch(slot_count)
        for item in slots:
            if index == slot_count:
                _fail_resized(number)
            if type(item) is tuple and len(<tuple>item) == 2:
                pair = <tuple>item
            else:
                pair = _unpack_pair(item, index, number)
            name = pair[0]
            values = pair[1]
            if not isinstance(name, str):
                raise SampleError(
                    f"slot name {_describe(name)} of sample {number} must be a str",
                    name, number, name,
                )
            if first:
                names.append(name)
            elif (name is not self._slot_names[index]
                  and name != self._slot_names[index]):
                self._fail_slot_names(slots, number)
            if not isinstance(values, list):
                _fail_values_type(name, values, number, False)
            value_count = len(<list>values)
            if value_count == 0:
                raise SampleError(
                    f"slot {name!r} of sample {number} is empty: "
                    "pad it in generate_sample",
                    name, number, values,
                )
            self._reserve(NUMBER_ROOM)
            if index:
                self._put_space()
            self._size += _write_int64(self._buffer + self._size, value_count)
            saw_float = False
            for value in <list>values:
                self._reserve(NUMBER_ROOM)
                self._put_space()
                value_type = type(value)
                if value_type is int:
                    as_int64 = PyLong_AsLongLongAndOverflow(value, &overflow)
                    if overflow == 0:
                        self._size += _write_int64(
                            self._buffer + self._size, as_int64
                        )
                    else:
                        self._put_utf8(str(value))
                elif value_type is float:
                    as_double = PyFloat_AS_DOUBLE(value)
                    if isfinite(as_double):
                        self._size += _write_float_repr(
                            self._buffer + self._size, as_double
                        )
                    else:
                        self._put_double(as_double)
                    saw_float = True
                else:
                    kind = _value_kind(value)
                    if kind == NOT_A_NUMBER:
                        raise SampleError(
                            f"slot {name!r} of sample {number}: expected an int or "
                            f"float, found {_describe(value)}",
                            name, number, value,
                        )
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
        cdef object slots = _slots_of(sample, number)
        cdef Py_ssize_t index = 0
        cdef Py_ssize_t length
        cdef const char* data
        cdef object item, name, values, value
        cdef tuple pair
        if len(slots) == 0:
            _fail_no_slots(sample, number)
        for item in slots:
            if type(item) is tuple and len(<tuple>item) == 2:
                pair = <tuple>item
            else:
                pair = _unpack_pair(item, index, number)
            name = pair[0]
            values = pair[1]
            if not isinstance(values, (list, tuple)):
                _fail_values_type(name, values, number, True)
            self._reserve(NUMBER_ROOM)
            if index:
                self._put_space()
            self._size += _write_int64(self._buffer + self._size, len(values))
            for value in values:
                if not isinstance(value, str):
                    raise SampleError(
                        f"slot {name!r} of sample {number}: expected a str, "
                        f"found {_describe(value)}",
                        name, number, value,
                    )
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


cdef void _note_input_line(object error, Py_ssize_t line_number, object line,
                           bint batching):
    if line is None:
        _add_note(error, "in the samples of generate_sample(None)")
        return
    cdef str text = repr(line)
    if len(text) > 2 * REPR_LIMIT:
        text = text[:2 * REPR_LIMIT - 3] + "..."
    where = "in the batch that ends with" if batching else "in the samples of"
    _add_note(error, f"{where} input line {line_number}: {text}")


cdef void _add_note(object error, str note):
    # BaseException.add_note is 3.11+; on 3.10 keep the note where 3.11 does.
    if sys.version_info >= (3, 11):
        error.add_note(note)
    elif isinstance(getattr(error, "__notes__", None), list):
        error.__notes__.append(note)
    else:
        error.__notes__ = [note]


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
    """
    cdef Py_ssize_t line_number = 0
    cdef list batch = []
    cdef object line = None
    cdef bint batching = generate_batch is not None
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
                    write(formatter.take())
        if batch:
            _emit_batch(formatter, gen_str, generate_batch, batch)
    except SampleError as error:
        _note_input_line(error, line_number, line, batching)
        raise
    if formatter._size:
        write(formatter.take())
