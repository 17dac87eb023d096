"""``repr(float)`` written into a C buffer, without CPython's dtoa.

``repr(x)`` is the shortest decimal string that reads back as ``x``, the
closest to ``x`` when several are that short (David Gay's dtoa, mode 0). Ryu
(Ulf Adams, PLDI 2018, github.com/ulfjack/ryu, d2s.c) finds the same digits
with a few 128-bit multiplications instead of big-number arithmetic: ~30 ns
instead of ~250 ns for the 17-digit values that normalised features have. The
digits are then laid out as CPython's float_repr does ('r' format, Py_DTSF_ADD_DOT_0):
positional when the decimal exponent is in [-4, 16), scientific otherwise.
tests/test_generators.py checks it against repr() on millions of doubles.

``write_float_repr`` is the C entry point (cimported by the formatter through
_shortest_float.pxd); ``float_repr`` exposes it to Python for the tests.
Non-finite values are the caller's: the formatter sends them to
PyOS_double_to_string.
"""

from libc.math cimport isfinite
from libc.stdint cimport int32_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset

from generators._int_digits cimport write_int64


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


cdef Py_ssize_t write_float_repr(char* out, double value) noexcept nogil:
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
    length = write_int64(digits, <long long>_shortest_digits(
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
    cursor += write_int64(cursor, shown)
    return cursor - out


def float_repr(double value):
    """``repr(value)`` through the formatter's own float path (for tests)."""
    cdef char text[32]
    if not isfinite(value):
        return repr(value)
    return text[:write_float_repr(text, value)].decode("ascii")
