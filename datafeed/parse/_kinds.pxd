# Slot value kinds and the float32 rounding rule, shared by the MultiSlot
# parser (_parse.pyx) and the in-process sample builder (_samples.pyx), which
# must agree on both to give the same records. A .pxd with no module behind
# it: cimporting it compiles these definitions into the cimporting module, so
# the parser's loop calls nothing it did not call before.

from libc.float cimport FLT_MAX, FLT_MIN
from libc.stdint cimport uint64_t
from libc.string cimport memcpy


# A slot's value type, as ColumnBuffer.kind holds it. Must match KIND_* in
# datafeed/config/slots.py.
cdef enum:
    KIND_INT64 = 0
    KIND_UINT64 = 1
    KIND_FLOAT32 = 2


cdef inline bint on_float32_midpoint(double value) noexcept nogil:
    """Whether ``value`` lies exactly halfway between two float32s of its binade.

    True when the low 29 bits of its 53-bit significand (those a float32 drops)
    are 1 followed by zeros. Meaningful for float32 normals only.
    """
    cdef uint64_t bits
    memcpy(&bits, &value, 8)
    return (bits & 0x1FFFFFFF) == 0x10000000


cdef inline bint rounds_like_strtof(double magnitude) noexcept nogil:
    """Whether ``<float>magnitude`` is what strtof gives for the decimals near it.

    ``magnitude`` is a non-negative double that is the correctly rounded value
    of some decimal (the parser's Clinger fast path, or ``repr(x)`` read back).
    Rounding it to float32 gives strtof's float32 of that decimal when it is a
    normal float32 (a full 24-bit significand; subnormals and overflow are left
    to strtof) and not exactly on a float32 rounding midpoint: only there can
    the double and the decimal round differently (double rounding). NaN gives
    False.
    """
    return FLT_MIN <= magnitude <= FLT_MAX and not on_float32_midpoint(magnitude)
