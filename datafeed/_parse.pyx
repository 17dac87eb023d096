"""MultiSlot text to per-slot column buffers (the parser behind ``ChunkParser``).

A MultiSlot line holds, for each slot of the schema in order, a value count
followed by that many values: ``<n> v1 .. vn <m> w1 .. wm ...``. The hot loop
(``parse_region``) is plain C: it runs without the GIL, appends values to
per-slot growable buffers and, on a bad line, stops with a status code and the
position of the failure in a ``Fail`` struct. ``Engine._error`` is the one
bridge that turns such a failure into a ``ParseError``; all message text is
built there, outside the loop.

Option handling and the public API live in ``datafeed/parsing.py``.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, strtof
from libc.string cimport memchr, memcpy

from datafeed._colbuf cimport ColumnBuffer, grow, take_columns

import numpy as np

from datafeed.errors import ParseError

# Must match datafeed/slots.py.
cdef enum:
    KIND_INT64 = 0
    KIND_UINT64 = 1
    KIND_FLOAT32 = 2

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
)

# Tokens kept on a ParseError (and shown in its message) are cut to this length.
cdef Py_ssize_t TOKEN_SHOWN = 64

# 10**0 .. 10**22: every one is exact in a double, which Clinger's fast path needs.
cdef double POW10[23]
POW10[:] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
]
cdef double FLT_MIN_D = 1.1754943508222875e-38   # smallest normal float32
cdef double FLT_MAX_D = 3.4028234663852886e+38
cdef uint64_t TWO53 = 9007199254740992ULL


ctypedef ColumnBuffer SlotBuf


ctypedef struct State:
    SlotBuf* slots
    Py_ssize_t nslots
    Py_ssize_t rows         # parsed, not yet taken
    int64_t lines           # records + skipped lines, over the whole stream
    int64_t records
    int64_t skipped
    int64_t reasons[N_STATUS]
    bint skip               # on_bad_line="skip"
    bint want_message       # skip mode: return to the wrapper at the next bad line
    Py_ssize_t max_line


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
    if not special and (v > FLT_MAX_D or v < -FLT_MAX_D):
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
    cdef uint64_t bits
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
            if FLT_MIN_D <= dv <= FLT_MAX_D:    # normal float32: a 24-bit significand
                memcpy(&bits, &dv, 8)
                if (bits & 0x1FFFFFFF) != 0x10000000:
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


cdef inline int parse_values(SlotBuf* sb, Py_ssize_t s, int64_t count,
                             const unsigned char** pp, const unsigned char* count_tok,
                             Fail* f) noexcept nogil:
    """Appends ``count`` values (space already reserved) of slot ``sb``."""
    cdef const unsigned char* p = pp[0]
    cdef const unsigned char* tok
    cdef Py_ssize_t i
    cdef int kind = sb.kind
    cdef int rc
    cdef char* out = sb.data + sb.len * sb.itemsize
    for i in range(count):
        while p[0] == 32 or p[0] == 9:
            p += 1
        if at_eol(p):
            f.found = i
            f.count_tok = count_tok
            f.count_end = token_end(count_tok)
            return fail_at(f, s, NULL, ST_TOO_FEW)
        tok = p
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
    sb.len += count
    pp[0] = p
    return ST_OK


cdef inline int parse_line(State* st, const unsigned char** pp,
                           const unsigned char* end,
                           Fail* f) noexcept nogil:
    """Parses one line into the slot buffers; *pp ends on its b"\\n"."""
    cdef const unsigned char* p = pp[0]
    cdef const unsigned char* tok
    cdef SlotBuf* sb
    cdef Py_ssize_t s, room
    cdef int64_t count
    cdef int rc
    while p[0] == 32 or p[0] == 9:
        p += 1
    if at_eol(p):
        return fail_at(f, -1, p, ST_BLANK)
    for s in range(st.nslots):
        sb = &st.slots[s]
        while p[0] == 32 or p[0] == 9:
            p += 1
        if at_eol(p):
            f.found = s
            return fail_at(f, s, NULL, ST_MISSING_SLOT)
        tok = p
        if scan_count(&p, &count):
            return fail_at(f, s, tok, ST_BAD_COUNT)
        if count <= 0:
            return fail_at(f, s, tok, ST_COUNT_NONPOS)
        if sb.width and count != sb.width:
            return fail_at(f, s, tok, ST_DENSE_COUNT)
        if sb.len + count > sb.cap:
            # Each value takes two bytes at least (a separator and a digit), so a
            # lying count cannot make us reserve more than the buffer could hold.
            room = (end - p) // 2 + 1
            if room > count:
                room = count
            if sb.len + room > sb.cap:
                if grow(<void**>&sb.data, &sb.cap, sb.len + room, sb.itemsize):
                    return ST_NOMEM
        rc = parse_values(sb, s, count, &p, tok, f)
        if rc:
            return rc
        if not sb.width:
            if st.rows + 2 > sb.ocap:
                if grow(<void**>&sb.offs, &sb.ocap, st.rows + 2, sizeof(int64_t)):
                    return ST_NOMEM
            sb.offs[st.rows + 1] = sb.len
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
            sb.itemsize = 4 if sb.kind == KIND_FLOAT32 else 8
            if grow(<void**>&sb.offs, &sb.ocap, 256, sizeof(int64_t)):
                raise MemoryError()
            sb.offs[0] = 0

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
            where = f"{where}, slot {name!r}"
            dtype = slot.dtype
        if code == ST_BLANK:
            what = "expected a record, found a blank line"
            token = b""
        elif code == ST_MISSING_SLOT:
            what = (f"expected a value count, found the end of the line "
                    f"(after {f.found} of {len(self.schema)} slots)")
        elif code == ST_BAD_COUNT:
            what = f"expected a value count (an integer >= 1), found {text}"
        elif code == ST_COUNT_NONPOS:
            what = (f"expected a value count >= 1 (pad empty slots in the generator), "
                    f"found {text}")
        elif code == ST_DENSE_COUNT:
            what = (f"expected a value count of {slot.width} (a dense slot of shape "
                    f"{slot.shape}), found {text}")
        elif code == ST_TOO_FEW:
            count = int(PyBytes_FromStringAndSize(<const char*>f.count_tok,
                                                  f.count_end - f.count_tok))
            what = f"expected {count} values, found the end of the line after {f.found}"
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
        elif code == ST_TRAILING:
            what = (f"expected the end of the line after the last slot "
                    f"{self.schema[len(self.schema) - 1].name!r}, found {text}")
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
