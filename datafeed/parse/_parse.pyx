"""MultiSlot text to per-slot column buffers (the parser behind ``ChunkParser``).

A MultiSlot line holds, for each slot of the schema in order, a value count
followed by that many values: ``<n> v1 .. vn <m> w1 .. wm ...``. With Paddle's
``parse_ins_id`` / ``parse_content``, text fields (``slots.TextField``) precede
the slots as ``1 <ins_id>`` / ``1 <content>``; their bytes go to columns after
the slot columns, and a schema without them costs the loop nothing. The hot loop
(``parse_region``) is plain C: it runs without the GIL, appends values to
per-slot growable buffers and, on a bad line, stops with a status code and the
position of the failure in a ``Fail`` struct. ``Engine._error`` is the one
bridge that turns such a failure into a ``ParseError``; all message text is
built there, outside the loop.

Option handling and the public API live in ``datafeed/parse/parsing.py``.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.float cimport FLT_MAX
from libc.stdint cimport int64_t, uint64_t, uintptr_t
from libc.stdlib cimport calloc, free, malloc, strtof
from libc.string cimport memchr, memcpy

from datafeed.parse._colbuf cimport ColumnBuffer, grow, take_columns
from datafeed.parse._kinds cimport (
    KIND_FLOAT32,
    KIND_INT64,
    KIND_UINT64,
    on_float32_midpoint,
    rounds_like_strtof,
)

from datafeed.config.errors import ParseError

# A text field's kind (datafeed/config/slots.py KIND_TEXT): never seen by the slot loop.
cdef int KIND_TEXT = 3

# Status codes of the loop. The order matches REASONS below.
cdef enum:
    ST_OK = 0
    ST_NOMEM
    ST_BLANK
    ST_MISSING_SLOT
    ST_BAD_COUNT
    ST_COUNT_NONPOS
    ST_DENSE_COUNT
    ST_TOO_FEW
    ST_NOT_NUMBER
    ST_FLOAT_IN_INT
    ST_NEGATIVE
    ST_RANGE
    ST_TRAILING
    ST_TOO_LONG
    ST_TEXT_FIELD
    N_STATUS

# Keys of ``skipped_reasons``, indexed by status code.
REASONS = (
    "ok",
    "out_of_memory",
    "blank_line",
    "missing_slot",
    "bad_count",
    "count_not_positive",
    "dense_count_mismatch",
    "too_few_values",
    "not_a_number",
    "float_in_integer_slot",
    "negative_uint64",
    "out_of_range",
    "trailing_tokens",
    "line_too_long",
    "bad_text_field",
)

# Tokens kept on a ParseError (and shown in its message) are cut to this length.
cdef Py_ssize_t TOKEN_SHOWN = 64

# 10**0 .. 10**22: every one is exact in a double, which Clinger's fast path needs.
cdef double POW10[23]
POW10[:] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
]
cdef uint64_t TWO53 = 9007199254740992ULL


ctypedef ColumnBuffer SlotBuf


ctypedef struct State:
    SlotBuf* slots
    Py_ssize_t nslots       # every column: the slots, then the text fields
    Py_ssize_t nnum         # the slots (valued columns); text fields follow them
    Py_ssize_t rows         # parsed, not yet taken
    int64_t lines           # records + skipped lines, over the whole stream
    int64_t records
    int64_t skipped
    int64_t reasons[N_STATUS]
    bint skip               # on_bad_line="skip"
    bint want_message       # skip mode: return to the wrapper at the next bad line
    Py_ssize_t max_line
    Py_ssize_t ocap         # the least offsets capacity of the sparse slots


ctypedef struct Fail:
    int code
    int64_t line            # 1-based line number in the stream
    Py_ssize_t slot         # -1 when not tied to a slot
    const unsigned char* tok        # the offending token (NULL: the end of the line)
    const unsigned char* tok_end
    const unsigned char* count_tok  # ST_TOO_FEW: the slot's count token
    const unsigned char* count_end
    Py_ssize_t found        # ST_TOO_FEW: values found; ST_MISSING_SLOT: slots found
    const unsigned char* next_line  # where parsing resumes after skipping this line


# -- tokens -------------------------------------------------------------------------
# Every region handed to the loop ends with b"\n" (the wrapper guarantees it), so
# scans stop at the newline without bounds checks, and p[1] is readable whenever
# p[0] is not the newline.

cdef inline bint at_eol(const unsigned char* p) noexcept nogil:
    return p[0] == 10 or (p[0] == 13 and p[1] == 10)


cdef inline bint at_delim(const unsigned char* p) noexcept nogil:
    cdef unsigned char c = p[0]
    return c == 32 or c == 9 or c == 10 or (c == 13 and p[1] == 10)


cdef inline const unsigned char* token_end(const unsigned char* p) noexcept nogil:
    while not at_delim(p):
        p += 1
    return p


cdef bint is_int_token(const unsigned char* p, const unsigned char* e) noexcept nogil:
    """Whether [p, e) is ``[+-]?[0-9]+``."""
    if p < e and (p[0] == 43 or p[0] == 45):
        p += 1
    if p == e:
        return False
    while p < e:
        if <unsigned int>(p[0] - 48) > 9:
            return False
        p += 1
    return True


cdef bint is_special(const unsigned char* p, const unsigned char* e) noexcept nogil:
    """Whether [p, e) is ``inf``, ``infinity`` or ``nan``, in any case."""
    cdef const char* words[3]
    cdef Py_ssize_t n = e - p, i, w
    words[0] = b"inf"
    words[1] = b"infinity"
    words[2] = b"nan"
    for w in range(3):
        i = 0
        while i < n and words[w][i] != 0 and (p[i] | 32) == <unsigned char>words[w][i]:
            i += 1
        if i == n and words[w][i] == 0:
            return True
    return False


cdef bint is_float_token(const unsigned char* p, const unsigned char* e) noexcept nogil:
    """Whether [p, e) is a decimal float, ``inf``, ``infinity`` or ``nan`` (no hex)."""
    cdef Py_ssize_t digits = 0
    if p < e and (p[0] == 43 or p[0] == 45):
        p += 1
    if is_special(p, e):
        return True
    while p < e and <unsigned int>(p[0] - 48) <= 9:
        p += 1
        digits += 1
    if p < e and p[0] == 46:
        p += 1
        while p < e and <unsigned int>(p[0] - 48) <= 9:
            p += 1
            digits += 1
    if digits == 0:
        return False
    if p < e and (p[0] | 32) == 101:        # 'e' or 'E'
        p += 1
        if p < e and (p[0] == 43 or p[0] == 45):
            p += 1
        if p == e:
            return False
        while p < e and <unsigned int>(p[0] - 48) <= 9:
            p += 1
    return p == e


cdef int classify_bad_int(const unsigned char* p, const unsigned char* e,
                          int kind) noexcept nogil:
    """Why a token is not a valid value of an integer slot (cold path)."""
    if is_int_token(p, e):
        return ST_NEGATIVE if kind == KIND_UINT64 and p[0] == 45 else ST_RANGE
    if is_float_token(p, e):
        return ST_FLOAT_IN_INT
    return ST_NOT_NUMBER


cdef bint u64_overflows(const unsigned char* p, const unsigned char* e) noexcept nogil:
    """Whether the digit string [p, e) exceeds 2**64 - 1 (cold: over 19 digits)."""
    cdef const char* limit = b"18446744073709551615"
    cdef Py_ssize_t i
    while e - p > 1 and p[0] == 48:         # leading zeros
        p += 1
    if e - p != 20:
        return e - p > 20
    for i in range(20):
        if p[i] != limit[i]:
            return p[i] > limit[i]
    return False


# -- digit runs, eight bytes at a time -----------------------------------------------
# The fast paths read eight bytes at once (SWAR: SIMD within a register) where at
# least eight bytes of the region are left, so that such reads stay inside the
# caller's buffer, and the machine is little-endian (the first byte is the lowest).
# One read finds where a run of digits ends (digit_flags, then count trailing zero
# bits) and a few multiplications give its value, with no branch per digit. Where
# DATAFEED_SWAR is 0 (another compiler or byte order, or -DDATAFEED_SWAR=0 to test
# it) the same functions go one byte at a time.

cdef extern from *:
    """
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ \\
        && (defined(__GNUC__) || defined(__clang__))
    #ifndef DATAFEED_SWAR  /* -DDATAFEED_SWAR=0 tests the byte-at-a-time paths */
    #define DATAFEED_SWAR 1
    #endif
    #define datafeed_ctz64(x) __builtin_ctzll(x)
    /* Steps over one blank with a (well predicted) branch: the empty asm keeps
       the compiler from turning it into a conditional add, which would put a
       load on the chain of dependent pointers from token to token. */
    static inline const unsigned char* datafeed_skip_blank(const unsigned char* p) {
        if (p[0] == 32) {
            __asm__("" : "+r"(p));
            p++;
        }
        return p;
    }
    #else
    #define datafeed_skip_blank(p) ((p) + ((p)[0] == 32))
    #undef DATAFEED_SWAR
    #define DATAFEED_SWAR 0
    #define datafeed_ctz64(x) 0
    #endif
    """
    const bint DATAFEED_SWAR
    const Py_ssize_t PY_SSIZE_T_MAX
    int datafeed_ctz64(uint64_t x) noexcept nogil
    const unsigned char* datafeed_skip_blank(const unsigned char* p) noexcept nogil


# 10**0 .. 10**19 as integers.
cdef uint64_t POW10_U64[20]
POW10_U64[:] = [10 ** k for k in range(20)]


cdef inline uint64_t eight_digits(uint64_t w) noexcept nogil:
    """The value of 8 ASCII digits (the first in the lowest byte), or of fewer
    shifted up to the top bytes with zero bytes below."""
    w = ((w & 0x0F0F0F0F0F0F0F0FULL) * 2561) >> 8                  # pairs
    w = ((w & 0x00FF00FF00FF00FFULL) * 6553601) >> 16              # fours
    return ((w & 0x0000FFFF0000FFFFULL) * 42949672960001ULL) >> 32  # eight


cdef inline uint64_t digit_flags(uint64_t w) noexcept nogil:
    """Bit 7 of each byte of ``w`` that is not an ASCII digit, exact up to the
    lowest one: a byte below b"0" borrows in the subtraction, one above b"9"
    carries into bit 7 in the addition, and digits do neither."""
    return (((w + 0x4646464646464646ULL) | (w - 0x3030303030303030ULL))
            & 0x8080808080808080ULL)


cdef inline uint64_t low_digits(uint64_t t, Py_ssize_t b) noexcept nogil:
    """The value of the low ``b >> 3`` (1 to 8) bytes of ``t``, each 0 to 9 (``t``
    is eight digits less b"0" each; ``b`` is 8 * digits + 7): they are shifted
    up to the top bytes, zeros below, and combined as by eight_digits."""
    t = t << (71 - b)
    t = (t * 2561) >> 8
    t = ((t & 0x00FF00FF00FF00FFULL) * 6553601) >> 16
    return ((t & 0x0000FFFF0000FFFFULL) * 42949672960001ULL) >> 32


cdef const unsigned char* scan_long(const unsigned char* p, const unsigned char* end,
                                    uint64_t v, uint64_t* out) noexcept nogil:
    """scan_run for any length, going on from a value ``v`` of the digits before
    ``p``: eight bytes at a time, then one at a time."""
    cdef uint64_t w, m
    cdef unsigned int d
    cdef int b
    if DATAFEED_SWAR:
        while end - p >= 8:
            memcpy(&w, p, 8)
            m = digit_flags(w)
            if m == 0:
                v = v * 100000000 + eight_digits(w)
                p += 8
                continue
            b = datafeed_ctz64(m)           # 8 * digits + 7
            if b > 7:
                v = v * POW10_U64[b >> 3] + eight_digits(w << (71 - b))
                p += b >> 3
            out[0] = v
            return p
    d = p[0] - 48
    while d <= 9:
        v = v * 10 + d
        p += 1
        d = p[0] - 48
    out[0] = v
    return p


cdef inline const unsigned char* scan_run(const unsigned char* p,
                                          const unsigned char* end,
                                          uint64_t* out) noexcept nogil:
    """Reads the run of ASCII digits at ``p`` (possibly empty) into ``*out``,
    modulo 2**64, and returns its end. [p, end) ends with a non-digit (b"\\n").
    A run of up to 7 digits takes one 8-byte read."""
    cdef uint64_t w, m
    cdef int b
    if DATAFEED_SWAR and end - p >= 8:
        memcpy(&w, p, 8)
        m = digit_flags(w)
        if m != 0:
            b = datafeed_ctz64(m)           # 8 * digits + 7
            out[0] = eight_digits(w << (71 - b)) if b > 7 else 0
            return p + (b >> 3)
        return scan_long(p + 8, end, eight_digits(w), out)
    return scan_long(p, end, 0, out)


# -- values -------------------------------------------------------------------------
# Scanners return ST_OK and advance *pp to the delimiter after the token, or return
# nonzero and leave *pp alone. Integers are parsed by hand: no strtoull in the loop.

cdef inline int scan_u64(const unsigned char** pp, uint64_t* out) noexcept nogil:
    cdef const unsigned char* p = pp[0]
    cdef const unsigned char* start
    cdef uint64_t v = 0
    cdef unsigned int d
    if p[0] == 43:                          # '+'
        p += 1
    start = p
    d = p[0] - 48
    while d <= 9:
        v = v * 10 + d
        p += 1
        d = p[0] - 48
    if p == start or not at_delim(p):
        return 1
    # Up to 19 digits cannot overflow; past that v has wrapped, and is right
    # (modulo 2**64) exactly when the digits are within range.
    if p - start > 19 and u64_overflows(start, p):
        return 1
    pp[0] = p
    out[0] = v
    return ST_OK


cdef inline int scan_i64(const unsigned char** pp, int64_t* out) noexcept nogil:
    cdef const unsigned char* p = pp[0]
    cdef bint neg = p[0] == 45
    cdef uint64_t mag
    if neg:
        p += 1
        if p[0] == 43:
            return 1                        # scan_u64 would take "-+1" as "-1"
    if scan_u64(&p, &mag):
        return 1
    if mag > (<uint64_t>1 << 63) - (0 if neg else 1):
        return 1
    pp[0] = p
    out[0] = <int64_t>(0 - mag) if neg else <int64_t>mag
    return ST_OK


cdef inline int scan_count(const unsigned char** pp, int64_t* out) noexcept nogil:
    """A slot's value count: ``[+-]?[0-9]+``, saturating far beyond any real line."""
    cdef const unsigned char* p = pp[0]
    cdef const unsigned char* start
    cdef bint neg = p[0] == 45
    cdef int64_t v = 0
    cdef unsigned int d
    if neg or p[0] == 43:
        p += 1
    start = p
    d = p[0] - 48
    while d <= 9:
        if v < (<int64_t>1 << 56):
            v = v * 10 + d
        p += 1
        d = p[0] - 48
    if p == start or not at_delim(p):
        return 1
    pp[0] = p
    out[0] = -v if neg else v
    return ST_OK


cdef int strtof_token(const unsigned char* p, const unsigned char* e, bint special,
                      float* out) noexcept nogil:
    """The slow, always-right path: libc strtof on a NUL-terminated copy."""
    cdef char small[128]
    cdef char* text = small
    cdef char* stop
    cdef Py_ssize_t n = e - p
    cdef float v
    if n >= 128:
        text = <char*>malloc(n + 1)
        if text == NULL:
            return ST_NOMEM
    memcpy(text, p, n)
    text[n] = 0
    v = strtof(text, &stop)
    n = stop - text - n                     # 0 when strtof read the whole token
    if text != small:
        free(text)
    if n != 0:
        return ST_NOT_NUMBER
    if not special and (v > FLT_MAX or v < -FLT_MAX):
        return ST_RANGE                     # a finite decimal beyond float32
    out[0] = v
    return ST_OK


cdef inline int scan_f32(const unsigned char** pp, float* out) noexcept nogil:
    """A float32 equal to correctly rounded strtof, mostly without calling it.

    The digits go into a uint64 mantissa with a decimal exponent. When there
    are at most 19 digits (no overflow), the mantissa is at most 2**53 and
    |exponent| <= 22, one IEEE multiply or divide gives the correctly rounded
    double (Clinger). Rounding that double to float32 is correct unless it sits
    exactly on a float32 rounding midpoint (double rounding), which the low 29
    bits of its significand tell. Anything else goes to strtof.
    """
    cdef const unsigned char* p = pp[0]
    cdef const unsigned char* start = p
    cdef const unsigned char* first
    cdef bint neg = p[0] == 45
    cdef uint64_t mant = 0
    cdef Py_ssize_t digits, frac = 0
    cdef int exp10, e = 0
    cdef bint eneg
    cdef unsigned int d
    cdef double dv
    cdef float f
    if neg or p[0] == 43:
        p += 1
    first = p
    # One tight loop per part: leading zeros add nothing to mant, and past 19
    # digits mant may wrap, which only the digit count below has to notice.
    d = p[0] - 48
    while d <= 9:
        mant = mant * 10 + d
        p += 1
        d = p[0] - 48
    digits = p - first
    if p[0] == 46:                          # '.'
        p += 1
        first = p
        d = p[0] - 48
        while d <= 9:
            mant = mant * 10 + d
            p += 1
            d = p[0] - 48
        frac = p - first
        digits += frac
    if digits == 0:                         # inf / nan, or garbage
        p = token_end(start)
        if is_float_token(start, p):
            pp[0] = p
            return strtof_token(start, p, True, out)
        return ST_NOT_NUMBER
    if (p[0] | 32) == 101:                  # exponent
        p += 1
        eneg = p[0] == 45
        if eneg or p[0] == 43:
            p += 1
        d = p[0] - 48
        if d > 9:
            return ST_NOT_NUMBER
        while d <= 9:
            if e < 100000:                  # far beyond float range either way
                e = e * 10 + d
            p += 1
            d = p[0] - 48
        if eneg:
            e = -e
    if not at_delim(p):
        return ST_NOT_NUMBER
    pp[0] = p
    if digits <= 19:
        if mant == 0:
            out[0] = -0.0 if neg else 0.0
            return ST_OK
        exp10 = e - <int>frac
        if mant <= TWO53 and -22 <= exp10 <= 22:
            dv = <double>mant
            if exp10 < 0:
                dv = dv / POW10[-exp10]
            else:
                dv = dv * POW10[exp10]
            if rounds_like_strtof(dv):
                f = <float>dv
                out[0] = -f if neg else f
                return ST_OK
    return strtof_token(start, p, False, out)


# -- lines --------------------------------------------------------------------------

cdef inline int fail_at(Fail* f, Py_ssize_t slot, const unsigned char* tok,
                        int code) noexcept nogil:
    f.slot = slot
    f.tok = tok
    f.tok_end = token_end(tok) if tok != NULL else NULL
    return code


cdef int slow_value(int kind, Py_ssize_t s, Py_ssize_t i, const unsigned char* p,
                    const unsigned char** next, char* out,
                    const unsigned char* count_tok, Fail* f) noexcept nogil:
    """Value ``i`` of slot ``s`` at ``p``, where a fast path of the ``values_*``
    loops left it: skips blanks, then the general scanners, and every error.
    Sets *next to the end of the value."""
    cdef const unsigned char* tok
    cdef int rc
    while p[0] == 32 or p[0] == 9:
        p += 1
    tok = p
    if at_eol(tok):
        f.found = i
        f.count_tok = count_tok
        f.count_end = token_end(count_tok)
        return fail_at(f, s, NULL, ST_TOO_FEW)
    if kind == KIND_UINT64:
        if scan_u64(&p, &(<uint64_t*>out)[i]):
            return fail_at(f, s, tok, classify_bad_int(tok, token_end(tok), kind))
    elif kind == KIND_INT64:
        if scan_i64(&p, &(<int64_t*>out)[i]):
            return fail_at(f, s, tok, classify_bad_int(tok, token_end(tok), kind))
    else:
        rc = scan_f32(&p, &(<float*>out)[i])
        if rc:
            return fail_at(f, s, tok, rc)
    next[0] = p
    return ST_OK


# One loop per slot type. Each appends ``count`` values (space already reserved).
# Its fast paths take a token that follows one blank and has the usual form
# whole, and give the value the scanner would; any other token goes, from where
# the fast path found it, to slow_value, so that what is accepted, its value and
# every error are exactly those of the scanners above.

cdef inline const unsigned char* one_u64(const unsigned char* p, uintptr_t end8,
                                         uint64_t* out) noexcept nogil:
    """The fast path for a uint64 value: after one blank, one to seven digits and
    a delimiter, in one 8-byte read. Returns the end of the value, or NULL
    (nothing written) when the value is not of that form. ``end8`` is the
    address of the region's end less 8: reading 8 bytes at ``p`` is safe when
    ``p <= end8``."""
    cdef const unsigned char* q
    cdef uint64_t w, t, m
    cdef Py_ssize_t b
    p = datafeed_skip_blank(p)
    if DATAFEED_SWAR and <uintptr_t>p <= end8:
        memcpy(&w, p, 8)
        t = w - 0x3030303030303030ULL
        m = ((w + 0x4646464646464646ULL) | t) & 0x8080808080808080ULL   # digit_flags
        if m != 0:
            b = datafeed_ctz64(m)           # 8 * digits + 7
            q = p + (b >> 3)
            if b > 7 and at_delim(q):
                out[0] = low_digits(t, b)
                return q
    return NULL


cdef inline int values_u64(SlotBuf* sb, Py_ssize_t s, int64_t count,
                           const unsigned char** pp, const unsigned char* end,
                           const unsigned char* count_tok, Fail* f) noexcept nogil:
    cdef const unsigned char* p = pp[0]
    cdef const unsigned char* q
    cdef const unsigned char* tok
    cdef uint64_t* out = (<uint64_t*>sb.data) + sb.len
    cdef uintptr_t end8 = <uintptr_t>end - 8
    cdef uint64_t v
    cdef Py_ssize_t i
    cdef int rc
    for i in range(count):
        q = one_u64(p, end8, &out[i])
        if q != NULL:
            p = q
            continue
        if p[0] == 32:
            p += 1
        tok = p
        if <unsigned int>(p[0] - 48) <= 9:            # scan_u64 without a '+'
            p = scan_run(p, end, &v)
            if at_delim(p) and (p - tok <= 19 or not u64_overflows(tok, p)):
                out[i] = v
                continue
            p = tok
        rc = slow_value(KIND_UINT64, s, i, p, &q, <char*>out, count_tok, f)
        if rc:
            return rc
        p = q
    sb.len += count
    pp[0] = p
    return ST_OK


cdef inline int values_i64(SlotBuf* sb, Py_ssize_t s, int64_t count,
                           const unsigned char** pp, const unsigned char* end,
                           const unsigned char* count_tok, Fail* f) noexcept nogil:
    cdef const unsigned char* p = pp[0]
    cdef const unsigned char* q
    cdef const unsigned char* tok
    cdef const unsigned char* first
    cdef int64_t* out = (<int64_t*>sb.data) + sb.len
    cdef uint64_t v
    cdef Py_ssize_t i
    cdef int rc
    for i in range(count):
        if p[0] == 32:
            p += 1
        tok = p
        first = p + (p[0] == 45)
        if <unsigned int>(first[0] - 48) <= 9:        # [-]digits, as scan_i64
            p = scan_run(first, end, &v)
            if at_delim(p) and p - first <= 18:       # below 10**18: in range
                out[i] = <int64_t>(0 - v) if first != tok else <int64_t>v
                continue
            p = tok
        rc = slow_value(KIND_INT64, s, i, p, &q, <char*>out, count_tok, f)
        if rc:
            return rc
        p = q
    sb.len += count
    pp[0] = p
    return ST_OK


cdef inline int values_f32(SlotBuf* sb, Py_ssize_t s, int64_t count,
                           const unsigned char** pp, const unsigned char* end,
                           const unsigned char* count_tok, Fail* f) noexcept nogil:
    """scan_f32's fast paths: ``[0-9].[0-9]{1,15}`` in one or two 8-byte reads,
    then plain decimals ``-?[0-9]+(\\.[0-9]*)?``."""
    cdef const unsigned char* p = pp[0]
    cdef const unsigned char* q
    cdef const unsigned char* first
    cdef float* out = (<float*>sb.data) + sb.len
    cdef uintptr_t end10 = <uintptr_t>end - 10     # 8-byte reads at p + 2 are safe
    cdef uint64_t ipart, fpart, mant, w, t, t2, m
    cdef Py_ssize_t i, nint, frac, b
    cdef double dv
    cdef float fl
    cdef int rc
    for i in range(count):
        if p[0] == 32:
            p += 1
        if (DATAFEED_SWAR and <uintptr_t>p <= end10 and <unsigned int>(p[0] - 48) <= 9
                and p[1] == 46):
            # One digit, '.', and the fraction's digits up to a delimiter.
            memcpy(&w, p + 2, 8)
            t = w - 0x3030303030303030ULL
            m = ((w + 0x4646464646464646ULL) | t) & 0x8080808080808080ULL
            frac = 0
            if m != 0:
                b = datafeed_ctz64(m)       # 8 * digits + 7
                if b > 7:
                    frac = b >> 3
                    fpart = low_digits(t, b)
            elif <uintptr_t>p <= end10 - 8:  # eight digits, then more
                memcpy(&w, p + 10, 8)
                t2 = w - 0x3030303030303030ULL
                m = ((w + 0x4646464646464646ULL) | t2) & 0x8080808080808080ULL
                if m != 0:
                    b = datafeed_ctz64(m)
                    frac = 8 + (b >> 3)
                    fpart = low_digits(t, 71) * POW10_U64[b >> 3]
                    if b > 7:
                        fpart += low_digits(t2, b)
            q = p + 2 + frac
            if frac and at_delim(q):
                # As scan_f32: 1 + frac <= 16 digits, exact up to 2**53; the
                # quotient lies in [1e-15, 10), well inside float32's normals.
                mant = (p[0] - 48) * POW10_U64[frac] + fpart
                if mant == 0:
                    out[i] = 0.0
                    p = q
                    continue
                if mant <= TWO53:
                    dv = <double>mant / POW10[frac]
                    if not on_float32_midpoint(dv):
                        out[i] = <float>dv
                        p = q
                        continue
        q = p + (p[0] == 45)
        if <unsigned int>(q[0] - 48) <= 9:
            first = q
            if <unsigned int>(q[1] - 48) <= 9:
                q = scan_run(q, end, &ipart)
            else:                                     # one digit, as often
                ipart = q[0] - 48
                q += 1
            nint = q - first
            frac = 0
            fpart = 0
            if q[0] == 46:                            # '.'
                q += 1
                first = q
                q = scan_run(q, end, &fpart)
                frac = q - first
            if at_delim(q) and nint + frac <= 19:
                mant = ipart * POW10_U64[frac] + fpart
                if mant == 0:
                    out[i] = -0.0 if p[0] == 45 else 0.0
                    p = q
                    continue
                if mant <= TWO53:
                    dv = <double>mant
                    if frac:
                        dv = dv / POW10[frac]
                    if rounds_like_strtof(dv):
                        fl = <float>dv
                        out[i] = -fl if p[0] == 45 else fl
                        p = q
                        continue
        rc = slow_value(KIND_FLOAT32, s, i, p, &q, <char*>out, count_tok, f)
        if rc:
            return rc
        p = q
    sb.len += count
    pp[0] = p
    return ST_OK


cdef int grow_offsets(State* st) noexcept nogil:
    """Makes room for one more row in the offsets of every sparse slot."""
    cdef Py_ssize_t s
    cdef SlotBuf* sb
    cdef Py_ssize_t least = PY_SSIZE_T_MAX
    for s in range(st.nslots):
        sb = &st.slots[s]
        if sb.width:
            continue
        if st.rows + 2 > sb.ocap:
            if grow(<void**>&sb.offs, &sb.ocap, st.rows + 2, sizeof(int64_t)):
                return ST_NOMEM
        if sb.ocap < least:
            least = sb.ocap
    st.ocap = least
    return ST_OK


cdef int slow_count(Py_ssize_t s, const unsigned char* p, const unsigned char** next,
                    int64_t* count, Fail* f) noexcept nogil:
    """Slot ``s``'s value count at ``p`` (after its blanks), where the fast path
    left it: scan_count, and every error. Sets *next to the end of the count."""
    cdef const unsigned char* tok = p
    if at_eol(tok):
        f.found = s
        return fail_at(f, s, NULL, ST_MISSING_SLOT)
    if scan_count(&p, count):
        return fail_at(f, s, tok, ST_BAD_COUNT)
    if count[0] <= 0:
        return fail_at(f, s, tok, ST_COUNT_NONPOS)
    next[0] = p
    return ST_OK


cdef int text_fields(State* st, const unsigned char** pp, Py_ssize_t row,
                     Fail* f) noexcept nogil:
    """The text fields before the slots, each ``1 <token>``: the token's bytes
    go to the field's column (cold: only schemas with text fields call it)."""
    cdef const unsigned char* p = pp[0]
    cdef const unsigned char* tok
    cdef const unsigned char* e
    cdef SlotBuf* sb
    cdef Py_ssize_t s, n
    cdef int64_t count
    for s in range(st.nnum, st.nslots):
        sb = &st.slots[s]
        while p[0] == 32 or p[0] == 9:
            p += 1
        tok = p
        if at_eol(tok):
            return fail_at(f, s, NULL, ST_TEXT_FIELD)
        if scan_count(&p, &count) or count != 1:
            return fail_at(f, s, tok, ST_TEXT_FIELD)
        while p[0] == 32 or p[0] == 9:
            p += 1
        if at_eol(p):
            return fail_at(f, s, NULL, ST_TEXT_FIELD)
        e = token_end(p)
        n = e - p
        if sb.len + n > sb.cap:
            if grow(<void**>&sb.data, &sb.cap, sb.len + n, 1):
                return ST_NOMEM
        memcpy(sb.data + sb.len, p, n)
        sb.len += n
        sb.offs[row] = sb.len
        p = e
    pp[0] = p
    return ST_OK


cdef inline int parse_line(State* st, const unsigned char** pp,
                           const unsigned char* end,
                           Fail* f) noexcept nogil:
    """Parses one line into the slot buffers; *pp ends on its b"\\n"."""
    cdef const unsigned char* p = pp[0]
    cdef const unsigned char* q
    cdef const unsigned char* tok
    cdef uintptr_t end8 = <uintptr_t>end - 8
    cdef SlotBuf* sb
    cdef SlotBuf* slots
    cdef Py_ssize_t s, room, nslots, row, width, n
    cdef int64_t count
    cdef unsigned int d
    cdef int rc
    while p[0] == 32 or p[0] == 9:
        p += 1
    if at_eol(p):
        return fail_at(f, -1, p, ST_BLANK)
    if st.rows + 2 > st.ocap:
        if grow_offsets(st):
            return ST_NOMEM
    slots = st.slots
    nslots = st.nnum
    row = st.rows + 1
    if nslots != st.nslots:
        rc = text_fields(st, &p, row, f)
        if rc:
            return rc
    for s in range(nslots):
        sb = &slots[s]
        # The usual count: after one blank, one or two digits without a sign or
        # a leading zero. Anything else goes to slow_count.
        if p[0] == 32:
            p += 1
        tok = p
        d = p[0] - 49
        if d <= 8 and p[1] == 32:
            count = d + 1                   # one digit and a blank
            p += 1
        else:
            count = 0
            if d <= 8 and <unsigned int>(p[1] - 48) <= 9 and at_delim(p + 2):
                count = (d + 1) * 10 + (p[1] - 48)
                p += 2
            elif d <= 8 and at_delim(p + 1):
                count = d + 1
                p += 1
            else:
                while p[0] == 32 or p[0] == 9:
                    p += 1
                tok = p
                rc = slow_count(s, p, &q, &count, f)
                if rc:
                    return rc
                p = q
        width = sb.width
        n = sb.len
        if width and count != width:
            return fail_at(f, s, tok, ST_DENSE_COUNT)
        if n + count > sb.cap:
            # Each value takes two bytes at least (a separator and a digit), so a
            # lying count cannot make us reserve more than the buffer could hold.
            room = (end - p) // 2 + 1
            if room > count:
                room = count
            if n + room > sb.cap:
                if grow(<void**>&sb.data, &sb.cap, n + room, sb.itemsize):
                    return ST_NOMEM
        q = NULL
        if count == 1 and sb.kind == KIND_UINT64:   # a sparse id, the commonest slot
            q = one_u64(p, end8, (<uint64_t*>sb.data) + n)
        if q != NULL:
            p = q
            n += 1
            sb.len = n
        else:
            if sb.kind == KIND_UINT64:
                rc = values_u64(sb, s, count, &p, end, tok, f)
            elif sb.kind == KIND_FLOAT32:
                rc = values_f32(sb, s, count, &p, end, tok, f)
            else:
                rc = values_i64(sb, s, count, &p, end, tok, f)
            if rc:
                return rc
            n = sb.len
        if not width:
            sb.offs[row] = n
    while p[0] == 32 or p[0] == 9:
        p += 1
    if not at_eol(p):
        return fail_at(f, -1, p, ST_TRAILING)
    if p[0] == 13:
        p += 1
    pp[0] = p
    return ST_OK


cdef void rollback(State* st) noexcept nogil:
    """Drops the values appended for a line that turned out bad."""
    cdef Py_ssize_t s
    cdef SlotBuf* sb
    for s in range(st.nslots):
        sb = &st.slots[s]
        sb.len = st.rows * sb.width if sb.width else sb.offs[st.rows]


cdef int parse_region(State* st, const unsigned char* p, const unsigned char* end,
                      Fail* f) noexcept nogil:
    """Parses the lines of [p, end), which ends with b"\\n".

    Returns ST_OK when every line was parsed (or counted as skipped), else the
    status of the first bad line that the wrapper must hear about: in raise mode
    any bad line; in skip mode one whose message is still wanted (already counted).
    """
    cdef const unsigned char* line
    cdef const unsigned char* nl
    cdef int rc
    while p < end:
        line = p
        rc = parse_line(st, &p, end, f)
        if rc == ST_OK:
            if p - line <= st.max_line:
                st.rows += 1
                st.records += 1
                st.lines += 1
                p += 1
                continue
            rc = ST_TOO_LONG
        rollback(st)
        if rc == ST_NOMEM:
            return rc
        nl = <const unsigned char*>memchr(line, 10, end - line)
        if nl - line > st.max_line:         # an over-long line is that, whatever else
            f.slot = -1
            f.tok = line                    # the token shown is the line's start
            f.tok_end = nl
            rc = ST_TOO_LONG
        f.code = rc
        f.line = st.lines + 1
        f.next_line = nl + 1
        if not st.skip:
            return rc
        st.lines += 1
        st.skipped += 1
        st.reasons[rc] += 1
        p = nl + 1
        if st.want_message:
            return rc
    return ST_OK


# -- the Python-facing engine ---------------------------------------------------------

cdef class Engine:
    """Parser state for one stream: slot buffers, counters, the skip policy.

    Not thread-safe: one thread feeds one Engine (different Engines run in
    parallel, since the loop releases the GIL).
    """

    cdef State st
    cdef tuple schema
    cdef list _dtypes
    cdef str source
    cdef list messages
    cdef Py_ssize_t max_messages
    cdef bint discarding        # skip mode: dropping the rest of an over-long line
    cdef bint busy

    def __cinit__(self, tuple schema, str source, bint skip_bad_lines,
                  Py_ssize_t max_line_bytes, Py_ssize_t max_messages):
        cdef Py_ssize_t s
        cdef SlotBuf* sb
        self.schema = schema
        self._dtypes = [slot.numpy_dtype for slot in schema]
        self.source = source
        self.messages = []
        self.max_messages = max_messages
        self.st.nslots = len(schema)
        # Text fields come last (SlotSchema.with_text_fields).
        self.st.nnum = self.st.nslots - sum(slot.kind == KIND_TEXT for slot in schema)
        self.st.skip = skip_bad_lines
        self.st.want_message = skip_bad_lines and max_messages > 0
        self.st.max_line = max_line_bytes
        self.st.slots = <SlotBuf*>calloc(max(self.st.nslots, 1), sizeof(SlotBuf))
        if self.st.slots == NULL:
            raise MemoryError()
        for s in range(self.st.nslots):
            sb = &self.st.slots[s]
            sb.kind = schema[s].kind
            sb.width = schema[s].width
            sb.itemsize = 4 if sb.kind == KIND_FLOAT32 else 1 if sb.kind == KIND_TEXT else 8
            if grow(<void**>&sb.offs, &sb.ocap, 256, sizeof(int64_t)):
                raise MemoryError()
            sb.offs[0] = 0
        grow_offsets(&self.st)              # sets st.ocap; nothing to grow yet

    def __dealloc__(self):
        cdef Py_ssize_t s
        if self.st.slots != NULL:
            for s in range(self.st.nslots):
                free(self.st.slots[s].data)
                free(self.st.slots[s].offs)
            free(self.st.slots)

    @property
    def lines(self):
        return self.st.lines

    @property
    def records(self):
        return self.st.records

    @property
    def skipped_lines(self):
        return self.st.skipped

    @property
    def pending_rows(self):
        return self.st.rows

    @property
    def skipped_reasons(self):
        return {REASONS[i]: self.st.reasons[i]
                for i in range(N_STATUS) if self.st.reasons[i]}

    @property
    def bad_line_messages(self):
        return list(self.messages)

    def feed(self, const unsigned char[::1] data not None, bint final=False):
        """Parses the complete lines of ``data`` (all of it if ``final``).

        Returns the number of bytes consumed.
        """
        cdef Py_ssize_t n = data.shape[0], pos = 0, stop, tail
        cdef const unsigned char* base
        cdef const unsigned char* nl
        cdef bytes last
        cdef Fail f
        if self.busy:
            raise RuntimeError("a ChunkParser was fed from two threads at once")
        if n == 0:
            if final:
                self.discarding = False
            return 0
        self.busy = True
        try:
            base = &data[0]
            if self.discarding:
                nl = <const unsigned char*>memchr(base, 10, n)
                if nl == NULL:
                    self.discarding = not final
                    return n
                pos = nl - base + 1
                self.discarding = False
            stop = n
            while stop > pos and base[stop - 1] != 10:
                stop -= 1
            self._run(base + pos, base + stop)
            tail = n - stop
            if tail == 0:
                return n
            if final:
                # The last line has no b"\n": parse a copy that has one.
                last = PyBytes_FromStringAndSize(<const char*>base + stop, tail) + b"\n"
                self._run(<const unsigned char*>PyBytes_AS_STRING(last),
                          <const unsigned char*>PyBytes_AS_STRING(last) + tail + 1)
                return n
            if tail <= self.st.max_line:
                return stop
            # The line being read is already too long: fail now, before the caller
            # buffers any more of it.
            f.code = ST_TOO_LONG
            f.line = self.st.lines + 1
            f.slot = -1
            f.tok = base + stop
            f.tok_end = base + n
            error = self._error(&f)
            if not self.st.skip:
                raise error
            self.st.lines += 1
            self.st.skipped += 1
            self.st.reasons[ST_TOO_LONG] += 1
            self._keep_message(error)
            self.discarding = True
            return n
        finally:
            self.busy = False

    cdef _run(self, const unsigned char* p, const unsigned char* end):
        cdef Fail f
        cdef int rc
        while True:
            with nogil:
                rc = parse_region(&self.st, p, end, &f)
            if rc == ST_OK:
                return
            if rc == ST_NOMEM:
                raise MemoryError("out of memory while parsing MultiSlot text")
            error = self._error(&f)
            if not self.st.skip:
                raise error
            self._keep_message(error)       # the loop has counted the line
            p = f.next_line

    cdef _keep_message(self, error):
        if len(self.messages) < self.max_messages:
            self.messages.append(str(error))
        self.st.want_message = len(self.messages) < self.max_messages

    cdef _error(self, const Fail* f):
        """The bridge: a failure of the loop as a ParseError (not raised)."""
        cdef int code = f.code
        cdef Py_ssize_t shown
        token = None
        text = ""
        if f.tok != NULL:
            shown = min(f.tok_end - f.tok, TOKEN_SHOWN)
            if code == ST_TOO_LONG:
                # The start of an over-long line, cut so that a stream that has
                # only seen max_line + 1 bytes of it shows the same.
                shown = min(shown, self.st.max_line + 1)
            token = PyBytes_FromStringAndSize(<const char*>f.tok, shown)
            text = repr(token) + ("..." if f.tok_end - f.tok > shown else "")
        where = f"{self.source}, line {f.line}"
        name = None
        if f.slot >= 0:
            slot = self.schema[f.slot]
            name = slot.name
            if slot.kind == KIND_TEXT:
                where = f"{where}, {slot.label}"
            else:
                where = f"{where}, slot {name!r}"
            dtype = slot.dtype
        if code == ST_BLANK:
            what = "expected a record, found a blank line"
            token = b""
        elif code == ST_MISSING_SLOT:
            what = (f"expected a value count, found the end of the line "
                    f"(after {f.found} of {self.st.nnum} slots)")
        elif code == ST_BAD_COUNT:
            what = f"expected a value count (an integer >= 1), found {text}"
        elif code == ST_COUNT_NONPOS:
            what = (f"expected a value count >= 1 (pad empty slots in the generator), "
                    f"found {text}")
        elif code == ST_DENSE_COUNT:
            what = (f"expected a value count of {slot.width} (a dense slot of shape "
                    f"{slot.shape}), found {text}")
        elif code == ST_TOO_FEW:
            # The count's value ("+2" and "02" read 2), but a count of thousands
            # of digits must not reach int() (Python refuses over 4,300 digits):
            # one of over 19 characters is shown as written, cut like any token.
            shown = min(f.count_end - f.count_tok, TOKEN_SHOWN)
            count_text = PyBytes_FromStringAndSize(<const char*>f.count_tok, shown).decode(
                "ascii", "replace")
            if f.count_end - f.count_tok <= 19:
                count_text = str(int(count_text))
            elif f.count_end - f.count_tok > shown:
                count_text += "..."
            what = (f"expected {count_text} values, found the end of the line "
                    f"after {f.found}")
        elif code == ST_NOT_NUMBER:
            expected = {"int64": "an integer", "uint64": "an unsigned integer"}.get(
                dtype, "a number")
            what = f"expected {expected}, found {text}"
        elif code == ST_FLOAT_IN_INT:
            what = (f"expected an integer ({dtype} slots do not take floats), "
                    f"found {text}")
        elif code == ST_NEGATIVE:
            what = ("expected an unsigned integer (negative value in a uint64 slot), "
                    f"found {text}")
        elif code == ST_RANGE:
            what = {
                "int64": "expected an integer within the int64 range "
                         "[-9223372036854775808, 9223372036854775807]",
                "uint64": "expected an integer within the uint64 range "
                          "[0, 18446744073709551615]",
                "float32": "expected a number within the float32 range "
                           "(magnitude at most 3.4028235e+38)",
            }[dtype] + f", found {text}"
        elif code == ST_TEXT_FIELD:
            found = text if token is not None else "the end of the line"
            field = "ins_id" if slot.label == "instance id" else "content"
            what = (f"expected the {slot.label} as '1 <{field}>' before the slots "
                    f"(parse_{field}=True), found {found}")
        elif code == ST_TRAILING:
            what = (f"expected the end of the line after the last slot "
                    f"{self.schema[self.st.nnum - 1].name!r}, found {text}")
        else:  # ST_TOO_LONG
            what = (f"expected a line of at most {self.st.max_line} bytes, "
                    f"found a longer line starting {token!r}")
        return ParseError(f"{where}: {what}", source=self.source, line=f.line,
                          slot=name, token=token)

    def take(self):
        """Copies out the rows parsed since the last take and empties the buffers.

        Returns ``(rows, [(values, offsets, width), ...])`` in schema order, or
        None when no rows are pending. ``offsets`` is None for dense slots and
        for sparse slots whose records all hold the same number of values.
        """
        cdef Py_ssize_t rows = self.st.rows
        if rows == 0:
            return None
        columns = take_columns(self.st.slots, self.st.nslots, rows, self._dtypes)
        self.st.rows = 0
        return rows, columns
