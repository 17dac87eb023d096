# The decimal text of an int64, written straight into a C buffer: the
# formatter's ints and counts, and the digits of the shortest float repr
# (_shortest_float.pyx). A .pxd with no module behind it: every module that
# cimports write_int64 compiles its own inline copy, so the formatter's
# per-value call costs nothing.

from libc.string cimport memcpy


cdef extern from *:
    """
    /* "00" "01" .. "99": two digits per division by 100. */
    static const char fleetfeed_digit_pairs[201] =
        "00010203040506070809101112131415161718192021222324252627282930313233"
        "34353637383940414243444546474849505152535455565758596061626364656667"
        "6869707172737475767778798081828384858687888990919293949596979899";
    """
    const char* DIGIT_PAIRS "fleetfeed_digit_pairs"


cdef inline Py_ssize_t write_int64(char* out, long long value) noexcept nogil:
    """Writes the decimal digits of value at out (20 bytes at most); returns how many."""
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
