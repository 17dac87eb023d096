# Declarations shared by _rows.pyx (the index and pulls) and _row_updates.pyx
# (the optimizers' updates of rows and the pooling of rows).

from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t

# How many ids ahead a batch loop prefetches the index slot of: probes of
# random ids miss the cache, and a few in flight at once hide most of the wait.
cdef enum:
    _AHEAD = 8


cdef extern from *:
    void __builtin_prefetch(const void* address) noexcept nogil


# One row's statistics (``ROW_STATS_DTYPE``).
ctypedef struct RowStat:
    float show
    float click
    uint32_t last  # tick of the last training pull
    uint8_t changed  # since the last save


cdef RowStat* _records(object records, uint8_t[::1] raw) except? NULL
cdef _check_record_rows(records, int64_t[::1] rows, bint absent_allowed)


# How a table stores its rows and their optimizer state: float32, or 16-bit
# floats (IEEE half, held as their bits) for tables that asked for half the
# memory (``SparseTable(storage="float16")``). Kernels read and write a row's
# values through ``_get`` and ``_put``, and compute in float32.
ctypedef fused row_t:
    float
    uint16_t


cdef extern from *:
    """
    #include <string.h>
    /* IEEE half bits to float: exact. */
    static inline float ff_h2f(uint16_t h) {
        uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
        uint32_t exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu, bits;
        float out;
        if (exponent == 0) {
            /* zero, or a subnormal: mantissa * 2^-24, exact in float */
            out = (float)mantissa * 5.9604644775390625e-8f;
            memcpy(&bits, &out, 4);
            bits |= sign;
        } else if (exponent == 31) {
            bits = sign | 0x7F800000u | (mantissa << 13);
        } else {
            bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
        }
        memcpy(&out, &bits, 4);
        return out;
    }
    /* float to IEEE half bits, rounded to nearest, ties to even (as numpy). */
    static inline uint16_t ff_f2h(float value) {
        uint32_t bits, sign, magnitude, half, rest;
        memcpy(&bits, &value, 4);
        sign = (bits >> 16) & 0x8000u;
        magnitude = bits & 0x7FFFFFFFu;
        if (magnitude >= 0x7F800000u)  /* infinity, or NaN kept quiet */
            return (uint16_t)(sign | (magnitude > 0x7F800000u ? 0x7E00u : 0x7C00u));
        if (magnitude >= 0x477FF000u)  /* rounds past 65504 */
            return (uint16_t)(sign | 0x7C00u);
        if (magnitude < 0x38800000u) {  /* under 2^-14: a subnormal half, or zero */
            uint32_t exponent = magnitude >> 23, shift, mantissa;
            if (magnitude < 0x33000000u)  /* under 2^-25: rounds to zero */
                return (uint16_t)sign;
            mantissa = (magnitude & 0x7FFFFFu) | 0x800000u;
            shift = 126u - exponent;
            half = mantissa >> shift;
            rest = mantissa & ((1u << shift) - 1u);
            if (rest > (1u << (shift - 1u)) || (rest == (1u << (shift - 1u)) && (half & 1u)))
                half++;
            return (uint16_t)(sign | half);
        }
        half = (magnitude >> 13) - (112u << 10);
        rest = magnitude & 0x1FFFu;
        if (rest > 0x1000u || (rest == 0x1000u && (half & 1u)))
            half++;  /* a carry moves to the next exponent, or to infinity: as it should */
        return (uint16_t)(sign | half);
    }
    """
    float ff_h2f(uint16_t h) noexcept nogil
    uint16_t ff_f2h(float value) noexcept nogil


cdef inline float _get(const row_t* values, Py_ssize_t j) noexcept nogil:
    if row_t is float:
        return values[j]
    else:
        return ff_h2f(values[j])


cdef inline void _put(row_t* values, Py_ssize_t j, float value) noexcept nogil:
    if row_t is float:
        values[j] = value
    else:
        values[j] = ff_f2h(value)
