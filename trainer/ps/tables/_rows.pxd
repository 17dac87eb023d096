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
cdef RowStat* _row_records(records, int64_t[::1] rows, bint absent_allowed) except? NULL


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
    #include <stdint.h>
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
    /* Each thread's random bits (xorshift64), for stochastic rounding. */
    static __thread uint64_t ff_random_state = 0;
    static inline uint64_t ff_random64(void) {
        uint64_t x = ff_random_state;
        if (x == 0)
            x = ((uint64_t)(uintptr_t)&ff_random_state * 0x9E3779B97F4A7C15ull) | 1u;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ff_random_state = x;
        return x;
    }
    /* float to IEEE half bits, rounded up or down at random, up with the
       probability of the float's distance from the half below: the stored
       value is the float's on average, so that updates smaller than half a
       half's last digit (a rare id's small gradients, squared into an Adagrad
       sum) still count. Past the largest half it saturates (65504), not to
       infinity: an infinite Adagrad sum would stop its row for good. */
    static inline uint16_t ff_f2h_stochastic(float value) {
        uint32_t bits, sign, magnitude, half;
        memcpy(&bits, &value, 4);
        sign = (bits >> 16) & 0x8000u;
        magnitude = bits & 0x7FFFFFFFu;
        if (magnitude > 0x7F800000u)  /* NaN */
            return (uint16_t)(sign | 0x7E00u);
        if (magnitude >= 0x477FE000u)  /* 65504 or more, infinity included */
            return (uint16_t)(sign | 0x7BFFu);
        if (magnitude < 0x38800000u) {  /* under 2^-14: a subnormal half, or zero */
            uint32_t exponent = magnitude >> 23, shift;
            uint64_t mantissa;
            if (exponent == 0)  /* a float subnormal: far under a half's least */
                return (uint16_t)sign;
            mantissa = (magnitude & 0x7FFFFFu) | 0x800000u;
            shift = 126u - exponent;  /* 14 and up */
            if (shift >= 40u)  /* under 2^-40 of a half's least: none */
                return (uint16_t)sign;
            half = (uint32_t)((mantissa + (ff_random64() & ((1ull << shift) - 1u))) >> shift);
            return (uint16_t)(sign | half);
        }
        half = ((magnitude + (uint32_t)(ff_random64() & 0x1FFFu)) >> 13) - (112u << 10);
        if (half > 0x7BFFu)
            half = 0x7BFFu;
        return (uint16_t)(sign | half);
    }
    """
    float ff_h2f(uint16_t h) noexcept nogil
    uint16_t ff_f2h_stochastic(float value) noexcept nogil


cdef inline float _get(const row_t* values, Py_ssize_t j) noexcept nogil:
    if row_t is float:
        return values[j]
    else:
        return ff_h2f(values[j])


cdef inline void _put(row_t* values, Py_ssize_t j, float value) noexcept nogil:
    # 16-bit rows round at random (ff_f2h_stochastic): to nearest, a small
    # update, or a rare id's small squared gradient added to its Adagrad sum,
    # would be lost every time.
    if row_t is float:
        values[j] = value
    else:
        values[j] = ff_f2h_stochastic(value)
