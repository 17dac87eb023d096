"""The MultiSlot text parser (datafeed.parse._parse through datafeed.parse.parsing).

Every parser test runs on the Cython parser and on the pure-Python oracle in
tests/helpers/reference_parser.py; property tests check that the two agree on random
and on malformed input, and that records survive text round trips fed in
pieces of random sizes.
"""

from __future__ import annotations

import itertools
import math
import struct
import threading
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import reference_parser as ref
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference_parser import Result, float32_bits

from datafeed import ParseError, Slot, SlotSchema
from datafeed.parse.parsing import ChunkParser, chunk_to_arrow, parse_bytes

CRITEO = Path(__file__).resolve().parents[2] / "examples" / "data" / "real" / "criteo_slots.txt"

SCHEMA = SlotSchema(
    [
        Slot("dense", "float32", (2,)),
        Slot("ids", "uint64"),
        Slot("signed", "int64"),
        Slot("label", "int64", (1,)),
    ]
)
GOOD = b"2 0.5 -1.25 3 1 2 3 1 -7 1 0\n"


# -- running either parser -------------------------------------------------------------


def chunk_records(chunk: Any) -> list[tuple[tuple[int, ...], ...]]:
    """A RecordChunk as the oracle's records (float32 values as bit patterns)."""
    per_slot = []
    for column in chunk.columns:
        values = column.values
        if values.dtype == np.float32:
            values = values.view(np.uint32)
        values = values.tolist()
        if column.offsets is None:
            w = column.width
            per_slot.append(
                [tuple(values[i * w : (i + 1) * w]) for i in range(chunk.rows)]
            )
        else:
            o = column.offsets.tolist()
            assert o[0] == 0 and len(o) == chunk.rows + 1
            per_slot.append([tuple(values[o[i] : o[i + 1]]) for i in range(chunk.rows)])
    return [tuple(slots) for slots in zip(*per_slot, strict=True)] if per_slot else []


def feed_in_pieces(
    parser: ChunkParser, data: bytes, cuts: list[int], take_at: set[int] | None = None
) -> list[Any]:
    """Feeds ``data`` cut at ``cuts`` as a reader does; returns the chunks taken."""
    chunks = []
    tail = b""
    bounds = [0, *sorted(cuts), len(data)]
    for piece, (a, b) in enumerate(itertools.pairwise(bounds)):
        tail += data[a:b]
        consumed = parser.feed(tail)
        assert 0 <= consumed <= len(tail)
        # Through the last line end; only a parser skipping an over-long line
        # consumes (drops) everything it is given.
        assert consumed in (0, len(tail)) or tail[consumed - 1 : consumed] == b"\n"
        tail = tail[consumed:]
        if take_at is not None and piece in take_at:
            chunks.append(parser.take_chunk())
    parser.feed_final(tail)
    chunks.append(parser.take_chunk())
    return [c for c in chunks if c is not None]


def parse_cython(
    schema: Any,
    data: bytes,
    source: str = "<bytes>",
    *,
    skip_bad_lines: bool = False,
    max_line_bytes: int = 64 * 2**20,
    cuts: list[int] | None = None,
    take_at: set[int] | None = None,
) -> Result:
    parser = ChunkParser(
        schema, source, skip_bad_lines=skip_bad_lines, max_line_bytes=max_line_bytes
    )
    chunks = feed_in_pieces(parser, data, cuts or [], take_at)
    records = [r for c in chunks for r in chunk_records(c)]
    assert parser.pending_rows == 0
    assert parser.records == len(records)
    assert parser.lines == parser.records + parser.skipped_lines
    return Result(
        records,
        parser.lines,
        parser.skipped_lines,
        parser.skipped_reasons,
        parser.bad_line_messages,
    )


def parse_reference(
    schema: Any, data: bytes, source: str = "<bytes>", **kw: Any
) -> Result:
    return ref.parse(schema, data, source, **kw)


@pytest.fixture(params=["cython", "reference"])
def parse(request: pytest.FixtureRequest) -> Callable[..., Result]:
    return parse_cython if request.param == "cython" else parse_reference


def outcome(fn: Callable[..., Result], *args: Any, **kw: Any) -> Result | ParseError:
    """What a parser makes of a text: its Result, or the ParseError it raised."""
    try:
        return fn(*args, **kw)
    except ParseError as error:
        return error


def assert_same_outcome(
    got: Result | ParseError, expected: Result | ParseError
) -> None:
    """Equal results, or errors equal in message, source, line, slot and token."""
    if isinstance(got, ParseError) and isinstance(expected, ParseError):
        assert (str(got), got.source, got.line, got.slot, got.token) == (
            str(expected),
            expected.source,
            expected.line,
            expected.slot,
            expected.token,
        )
    else:
        assert got == expected


def f32(x: float) -> int:
    return float32_bits(x)


# -- valid input -------------------------------------------------------------------------


def test_parses_every_slot_kind(parse: Callable[..., Result]) -> None:
    result = parse(SCHEMA, GOOD + b"2 1 2 1 18446744073709551615 2 5 -5 1 1\n")
    assert result.records == [
        ((f32(0.5), f32(-1.25)), (1, 2, 3), (-7,), (0,)),
        ((f32(1), f32(2)), (2**64 - 1,), (5, -5), (1,)),
    ]
    assert (result.lines, result.skipped_lines, result.skipped_reasons) == (2, 0, {})


@pytest.mark.parametrize(
    "text",
    [
        b"2 0.5 -1.25 3 1 2 3 1 -7 1 0",  # no final line end
        b"2\t0.5  -1.25 \t3 1 2 3 1 -7 1 0\n",  # tabs and runs of blanks
        b"  \t2 0.5 -1.25 3 1 2 3 1 -7 1 0 \t \n",  # leading and trailing blanks
        b"2 0.5 -1.25 3 1 2 3 1 -7 1 0\r\n",  # CRLF
        b"2 0.5 -1.25 3 1 2 3 1 -7 1 0 \r",  # CR at the very end
        b"2 +0.5 -1.25 +3 +1 02 0003 1 -7 +1 -0\n",  # signs and leading zeros
    ],
)
def test_whitespace_line_ends_and_signs(
    parse: Callable[..., Result], text: bytes
) -> None:
    result = parse(SCHEMA, text)
    assert result.records == [((f32(0.5), f32(-1.25)), (1, 2, 3), (-7,), (0,))]


def test_zero_values_are_kept(parse: Callable[..., Result]) -> None:
    # Paddle's InMemoryDataset drops zero feasigns of sparse slots; we keep them.
    result = parse(SCHEMA, b"2 0 0.0 3 0 0 0 2 0 -0 1 0\n")
    assert result.records == [((0, 0), (0, 0, 0), (0, 0), (0,))]


def test_no_lines() -> None:
    assert ref.parse(SCHEMA, b"").records == []
    chunk = parse_bytes(SCHEMA, b"")
    assert chunk.rows == 0 and len(chunk.columns) == len(SCHEMA)
    assert chunk_to_arrow(SCHEMA, chunk).num_rows == 0


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        (b"inf", 0x7F800000),
        (b"-Infinity", 0xFF800000),
        (b"INF", 0x7F800000),
        (b"nan", 0x7FC00000),
        (b"-NaN", 0xFFC00000),
        (b"-0.0", 0x80000000),
        (b"1e-50", 0),  # underflow to zero is fine
        (b"1e-40", f32(1e-40)),  # a denormal
        (b"3.4028235e38", 0x7F7FFFFF),  # FLT_MAX
        (b"3.40282356e38", 0x7F7FFFFF),  # rounds down to FLT_MAX
        (b"0.00497512437811", f32(0.00497512437811)),
        (b"1.", f32(1.0)),
        (b".5", f32(0.5)),
        (b"16777217", 0x4B800000),  # a float32 midpoint: ties to even
        (b"0.1000000000000000000000000000001", f32(0.1)),  # past 19 digits
        (b"1" + b"0" * 41 + b"e-40", f32(10.0)),  # zeros past 19 digits
    ],
)
def test_float_tokens(
    parse: Callable[..., Result], token: bytes, expected: int
) -> None:
    schema = [Slot("x", "float32")]
    assert parse(schema, b"1 " + token + b"\n").records == [((expected,),)]


def test_integer_limits(parse: Callable[..., Result]) -> None:
    schema = [Slot("i", "int64"), Slot("u", "uint64")]
    text = (
        b"2 -9223372036854775808 9223372036854775807 "
        b"2 18446744073709551615 000000000000000000000018446744073709551615\n"
    )
    assert parse(schema, text).records == [
        ((-(2**63), 2**63 - 1), (2**64 - 1, 2**64 - 1))
    ]


def test_line_numbers_count_across_feeds() -> None:
    parser = ChunkParser(SCHEMA, "part-0")
    assert parser.feed(GOOD + GOOD[:5]) == len(GOOD)
    assert parser.feed(GOOD[:5]) == 0  # the caller passes the tail again...
    assert parser.feed(GOOD[:5] + GOOD[5:]) == len(GOOD)  # ...followed by more
    with pytest.raises(ParseError, match=r"^part-0, line 3, slot 'ids'") as info:
        parser.feed(b"2 1 2 1 x 1 1 1 1\n")
    assert info.value.line == 3
    assert parser.lines == parser.records == 2


# -- malformed lines ---------------------------------------------------------------------

BAD_LINES = [
    # (line, match, slot, token, reason)
    (b"\n", r"line 2: expected a record, found a blank line$", None, b"", "blank_line"),
    (
        b" \t \r\n",
        r"line 2: expected a record, found a blank line$",
        None,
        b"",
        "blank_line",
    ),
    (
        b"2 1 2 0 1 1 1\n",
        r"slot 'ids': expected a value count >= 1 .*found b'0'$",
        "ids",
        b"0",
        "count_not_positive",
    ),
    (
        b"2 1 2 -3 1 1 1\n",
        r"slot 'ids': expected a value count >= 1 .*found b'-3'$",
        "ids",
        b"-3",
        "count_not_positive",
    ),
    (
        b"2 1 2 x 1 1 1\n",
        (
            r"slot 'ids': expected a value count \(an integer >= 1\), "
            r"found b'x'$"
        ),
        "ids",
        b"x",
        "bad_count",
    ),
    (
        b"2 1 2 1.0 1 1 1 1 1\n",
        r"slot 'ids': expected a value count",
        "ids",
        b"1.0",
        "bad_count",
    ),
    (
        b"2 1 2 3 1 2\n",
        (
            r"slot 'ids': expected 3 values, found the end of the line "
            r"after 2$"
        ),
        "ids",
        None,
        "too_few_values",
    ),
    (
        b"2 1 2 1 5 1 -1\n",
        (
            r"slot 'label': expected a value count, found the end of "
            r"the line \(after 3 of 4 slots\)$"
        ),
        "label",
        None,
        "missing_slot",
    ),
    (
        b"2 1 2 1 abc 1 1 1 1\n",
        (
            r"slot 'ids': expected an unsigned integer, "
            r"found b'abc'$"
        ),
        "ids",
        b"abc",
        "not_a_number",
    ),
    (
        b"2 1 2 1 1 1 1e 1 1\n",
        r"slot 'signed': expected an integer, found b'1e'$",
        "signed",
        b"1e",
        "not_a_number",
    ),
    (
        b"2 1 x 1 1 1 1 1 1\n",
        r"slot 'dense': expected a number, found b'x'$",
        "dense",
        b"x",
        "not_a_number",
    ),
    (
        b"2 1 0x1p3 1 1 1 1 1 1\n",
        r"slot 'dense': expected a number, found b'0x1p3'$",
        "dense",
        b"0x1p3",
        "not_a_number",
    ),
    (
        b"2 1 nan(1) 1 1 1 1 1 1\n",
        r"slot 'dense': expected a number",
        "dense",
        b"nan(1)",
        "not_a_number",
    ),
    (
        b"2 1 2 1 1.5 1 1 1 1\n",
        (
            r"slot 'ids': expected an integer \(uint64 slots do not "
            r"take floats\), found b'1.5'$"
        ),
        "ids",
        b"1.5",
        "float_in_integer_slot",
    ),
    (
        b"2 1 2 1 1 1 1e3 1 1\n",
        (
            r"slot 'signed': expected an integer \(int64 slots do "
            r"not take floats\), found b'1e3'$"
        ),
        "signed",
        b"1e3",
        "float_in_integer_slot",
    ),
    (
        b"2 1 2 1 inf 1 1 1 1\n",
        r"slot 'ids': expected an integer \(uint64",
        "ids",
        b"inf",
        "float_in_integer_slot",
    ),
    (
        b"2 1 2 1 -4 1 1 1 1\n",
        (
            r"slot 'ids': expected an unsigned integer \(negative "
            r"value in a uint64 slot\), found b'-4'$"
        ),
        "ids",
        b"-4",
        "negative_uint64",
    ),
    (
        b"2 1 2 1 -0 1 1 1 1\n",
        r"negative value in a uint64 slot",
        "ids",
        b"-0",
        "negative_uint64",
    ),
    (
        b"2 1 2 1 18446744073709551616 1 1 1 1\n",
        (
            r"slot 'ids': expected an integer "
            r"within the uint64 range \[0, 18446744073709551615\], found "
            r"b'18446744073709551616'$"
        ),
        "ids",
        b"18446744073709551616",
        "out_of_range",
    ),
    (
        b"2 1 2 1 1 1 -9223372036854775809 1 1\n",
        (
            r"slot 'signed': expected an integer "
            r"within the int64 range"
        ),
        "signed",
        b"-9223372036854775809",
        "out_of_range",
    ),
    (
        b"2 1 2 1 1 1 9223372036854775808 1 1\n",
        r"within the int64 range",
        "signed",
        b"9223372036854775808",
        "out_of_range",
    ),
    (
        b"2 1 3.5e38 1 1 1 1 1 1\n",
        (
            r"slot 'dense': expected a number within the float32 "
            r"range \(magnitude at most 3.4028235e\+38\), found b'3.5e38'$"
        ),
        "dense",
        b"3.5e38",
        "out_of_range",
    ),
    (b"2 1 -1e39 1 1 1 1 1 1\n", r"float32 range", "dense", b"-1e39", "out_of_range"),
    (
        b"3 1 2 3 1 1 1 1 1 1\n",
        (
            r"slot 'dense': expected a value count of 2 \(a dense "
            r"slot of shape \(2,\)\), found b'3'$"
        ),
        "dense",
        b"3",
        "dense_count_mismatch",
    ),
    (
        b"2 1 2 1 1 1 1 2 1 1\n",
        r"slot 'label': expected a value count of 1",
        "label",
        b"2",
        "dense_count_mismatch",
    ),
    (
        b"2 1 2 1 1 1 1 1 1 7\n",
        (
            r"line 2: expected the end of the line after the last "
            r"slot 'label', found b'7'$"
        ),
        None,
        b"7",
        "trailing_tokens",
    ),
    (
        b"2 1 2 1 1\x002 1 1 1 1\n",
        (
            r"slot 'ids': expected an unsigned integer, "
            r"found b'1\\x002'$"
        ),
        "ids",
        b"1\x002",
        "not_a_number",
    ),
    (
        "2 1 2 1 1 1 1 1 \u00e9\n".encode(),
        (
            r"slot 'label': expected an integer, "
            r"found b'\\xc3\\xa9'$"
        ),
        "label",
        b"\xc3\xa9",
        "not_a_number",
    ),
    (
        b"2 1 2 1 1 1 1 1 1\r\r\n",
        r"slot 'label': expected an integer, found b'1\\r'$",
        "label",
        b"1\r",
        "not_a_number",
    ),
    (
        b"2 1 2 1 " + b"9" * 100 + b" 1 1 1 1\n",
        r"found b'9{64}'\.\.\.$",
        "ids",
        b"9" * 64,
        "out_of_range",
    ),
]


@pytest.mark.parametrize(("line", "match", "slot", "token", "reason"), BAD_LINES)
def test_bad_line_raises(
    parse: Callable[..., Result],
    line: bytes,
    match: str,
    slot: str | None,
    token: bytes | None,
    reason: str,
) -> None:
    with pytest.raises(ParseError, match=match) as info:
        parse(SCHEMA, GOOD + line + GOOD, "part-7")
    error = info.value
    assert str(error).startswith("part-7, line 2")
    assert (error.source, error.line, error.slot, error.token) == (
        "part-7",
        2,
        slot,
        token,
    )


@pytest.mark.parametrize(("line", "match", "slot", "token", "reason"), BAD_LINES)
def test_bad_line_skipped(
    parse: Callable[..., Result],
    line: bytes,
    match: str,
    slot: str | None,
    token: bytes | None,
    reason: str,
) -> None:
    result = parse(SCHEMA, GOOD + line + GOOD, "part-7", skip_bad_lines=True)
    good = ((f32(0.5), f32(-1.25)), (1, 2, 3), (-7,), (0,))
    assert result.records == [good, good]
    assert (result.lines, result.skipped_lines) == (3, 1)
    assert result.skipped_reasons == {reason: 1}
    assert len(result.bad_line_messages) == 1
    assert result.bad_line_messages[0].startswith("part-7, line 2")


def test_bad_line_on_a_last_line_without_line_end(parse: Callable[..., Result]) -> None:
    with pytest.raises(
        ParseError, match=r"line 2, slot 'ids': expected 3 values"
    ) as info:
        parse(SCHEMA, GOOD + b"2 1 2 3 1 2")
    assert info.value.line == 2


def test_skip_accounting_and_first_messages(parse: Callable[..., Result]) -> None:
    lines = []
    for i in range(40):
        lines.append(
            GOOD if i % 3 else b"2 1 2 1 x%d 1 1 1 1\n" % i if i % 2 else b"\n"
        )
    result = parse(SCHEMA, b"".join(lines), "f", skip_bad_lines=True)
    assert result.lines == 40 == len(result.records) + result.skipped_lines
    assert result.skipped_lines == 14
    assert result.skipped_reasons == {"blank_line": 7, "not_a_number": 7}
    assert len(result.bad_line_messages) == 10
    assert result.bad_line_messages[0] == (
        "f, line 1: expected a record, found a blank line"
    )
    assert result.bad_line_messages[1] == (
        "f, line 4, slot 'ids': expected an unsigned integer, found b'x3'"
    )


def test_a_bad_line_leaves_no_values_behind() -> None:
    # The bad line appends to 'dense' and 'ids' before failing on 'signed'.
    parser = ChunkParser(SCHEMA, "f", skip_bad_lines=True)
    parser.feed(GOOD + b"2 9 9 2 9 9 1 z 1 1\n" + GOOD)
    chunk = parser.take_chunk()
    assert chunk is not None and chunk.rows == 2
    assert chunk.columns[0].values.tolist() == [0.5, -1.25] * 2
    assert chunk.columns[1].values.tolist() == [1, 2, 3] * 2
    assert chunk.columns[1].offsets is None and chunk.columns[1].width == 3


# -- long lines ------------------------------------------------------------------------


def test_line_longer_than_limit(parse: Callable[..., Result]) -> None:
    long = b"2 1 2 1 " + b"1" * 90 + b" 1 1 1 1\n"
    with pytest.raises(
        ParseError,
        match=r"^f, line 2: expected a line of at most 64 "
        r"bytes, found a longer line starting b'2 1 2 1 1+'$",
    ) as info:
        parse(SCHEMA, GOOD + long, "f", max_line_bytes=64)
    assert (info.value.line, info.value.slot, info.value.token) == (2, None, long[:64])
    result = parse(
        SCHEMA, GOOD + long + GOOD, "f", max_line_bytes=64, skip_bad_lines=True
    )
    assert (len(result.records), result.skipped_reasons) == (2, {"line_too_long": 1})


def test_unfinished_line_longer_than_limit_fails_early() -> None:
    parser = ChunkParser(SCHEMA, "f", max_line_bytes=1000)
    assert parser.feed(b"2 1 2 " + b"1 " * 400) == 0
    with pytest.raises(
        ParseError,
        match=r"^f, line 1: expected a line of at most 1000 "
        "bytes",
    ) as info:
        parser.feed(b"2 1 2 " + b"1 " * 600)
    assert info.value.token == b"2 1 2 " + b"1 " * 29


def test_unfinished_long_line_is_skipped_whole() -> None:
    parser = ChunkParser(SCHEMA, "f", skip_bad_lines=True, max_line_bytes=100)
    data = GOOD + b"3 " + b"7 " * 10_000 + b"\n" + GOOD
    chunks = feed_in_pieces(parser, data, list(range(50, len(data), 70)))
    assert sum(c.rows for c in chunks) == 2
    assert (parser.lines, parser.skipped_lines) == (3, 1)
    assert parser.skipped_reasons == {"line_too_long": 1}
    assert parser.bad_line_messages[0].startswith(
        "f, line 2: expected a line of at most"
    )


def test_unfinished_long_last_line_is_skipped() -> None:
    parser = ChunkParser(SCHEMA, "f", skip_bad_lines=True, max_line_bytes=100)
    feed_in_pieces(parser, GOOD + b"3 " * 1000, [60, 200, 700])
    assert (parser.lines, parser.records, parser.skipped_lines) == (2, 1, 1)


# -- chunks and Arrow ------------------------------------------------------------------


def test_take_chunk_layout() -> None:
    parser = ChunkParser(SCHEMA, "f")
    assert parser.take_chunk() is None
    parser.feed(GOOD + b"2 1 2 1 5 2 3 4 1 1\n")
    assert parser.pending_rows == 2
    chunk = parser.take_chunk()
    assert chunk is not None and chunk.rows == 2 and parser.pending_rows == 0
    dense, ids, signed, label = chunk.columns
    assert (
        dense.values.dtype == np.float32 and dense.offsets is None and dense.width == 2
    )
    assert ids.values.dtype == np.uint64 and ids.offsets.dtype == np.int32
    assert ids.offsets.tolist() == [0, 3, 4]
    assert signed.offsets.tolist() == [0, 1, 3]
    assert label.offsets is None and label.width == 1
    assert parser.take_chunk() is None
    parser.feed(GOOD)
    again = parser.take_chunk()
    assert again is not None and again.rows == 1 and parser.records == 3
    # Sparse slots whose records all hold one value need no offsets.
    assert again.columns[2].offsets is None and again.columns[2].width == 1


def test_chunk_to_arrow() -> None:
    chunk = parse_bytes(SCHEMA, GOOD + b"2 1 2 1 5 2 3 4 1 1\n")
    batch = chunk_to_arrow(SCHEMA, chunk)
    assert batch.schema.names == ["dense", "ids", "signed", "label"]
    assert batch.schema.field("dense").type == pa.list_(pa.float32(), 2)
    assert batch.schema.field("ids").type == pa.list_(pa.uint64())
    assert batch.schema.field("label").type == pa.list_(pa.int64(), 1)
    assert batch.to_pydict() == {
        "dense": [[0.5, -1.25], [1.0, 2.0]],
        "ids": [[1, 2, 3], [5]],
        "signed": [[-7], [3, 4]],
        "label": [[0], [1]],
    }
    # The values are shared, not copied.
    assert (
        batch.column(1).values.buffers()[1].address
        == chunk.columns[1].values.ctypes.data
    )
    uniform = parse_bytes(SCHEMA, GOOD + GOOD)
    assert uniform.columns[1].offsets is None
    assert chunk_to_arrow(SCHEMA, uniform).column(1).to_pylist() == [[1, 2, 3]] * 2


@pytest.mark.parametrize(
    "wrap",
    [
        bytes,
        bytearray,
        memoryview,
        lambda b: memoryview(b).cast("c"),
        lambda b: np.frombuffer(b, dtype=np.uint8),
    ],
)
def test_feed_accepts_bytes_like(wrap: Callable[[bytes], Any]) -> None:
    parser = ChunkParser(SCHEMA, "f")
    assert parser.feed(wrap(GOOD + GOOD[:3])) == len(GOOD)
    parser.feed_final(wrap(GOOD[:3] + GOOD[3:]))
    assert parser.records == 2


def test_zero_copy_feed_protocol() -> None:
    # What datafeed.source.readers does: feed views of one buffer, never copying the tail.
    data = (GOOD * 1000) + b"2 1 2 1 5 2 3 4 1 1"
    view = memoryview(data)
    parser = ChunkParser(SCHEMA, "f")
    start = 0
    for end in range(100, len(data) + 100, 777):
        start += parser.feed(view[start:end])
    parser.feed_final(view[start:])
    assert parser.records == 1001


def test_constructor_checks() -> None:
    with pytest.raises(ValueError, match="max_line_bytes must be >= 1"):
        ChunkParser(SCHEMA, "f", max_line_bytes=0)
    with pytest.raises(TypeError, match="source must be a str"):
        ChunkParser(SCHEMA, 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one slot"):
        ChunkParser([], "f")


def test_threads_parse_in_parallel() -> None:
    data = GOOD * 20000
    results: list[int] = []

    def work() -> None:
        chunk = parse_bytes(SCHEMA, data)
        results.append(chunk.rows)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [20000] * 4


# -- real data -------------------------------------------------------------------------

CRITEO_SCHEMA = SlotSchema(
    [Slot("label", "int64", (1,)), Slot("dense_feature", "float32", (13,))]
    + [Slot(f"C{i}", "uint64") for i in range(1, 27)]
)


def criteo_multislot() -> tuple[bytes, list[tuple[tuple[int, ...], ...]]]:
    """criteo_slots.txt as MultiSlot text, and the records it should give."""
    out, expected = [], []
    for line in CRITEO.read_text().splitlines():
        fields = [t.split(":", 1) for t in line.split()]
        label = [v for k, v in fields if k == "click"]
        dense = [v for k, v in fields if k == "dense_feature"]
        ids = {k: v for k, v in fields if k not in ("click", "dense_feature")}
        parts = [f"1 {label[0]}", f"13 {' '.join(dense)}"]
        parts += [f"1 {ids[str(i)]}" for i in range(1, 27)]
        out.append(" ".join(parts) + "\n")
        expected.append(
            ((int(label[0]),), tuple(f32(float(np.float32(d))) for d in dense))
            + tuple((int(ids[str(i)]),) for i in range(1, 27))
        )
    return "".join(out).encode(), expected


def test_real_criteo_sample(parse: Callable[..., Result]) -> None:
    data, expected = criteo_multislot()
    assert len(expected) == 80
    result = parse(CRITEO_SCHEMA, data, str(CRITEO))
    assert result.records == expected
    chunk = parse_bytes(CRITEO_SCHEMA, data)
    assert all(
        c.offsets is None for c in chunk.columns
    )  # 26 single-id slots: no offsets


def test_real_criteo_sample_in_pieces() -> None:
    data, expected = criteo_multislot()
    cuts = list(range(1, len(data), 997))
    assert (
        parse_cython(CRITEO_SCHEMA, data, cuts=cuts, take_at={3, 9}).records == expected
    )


# -- properties: round trips ------------------------------------------------------------


@st.composite
def slots(draw: st.DrawFn) -> list[Slot]:
    n = draw(st.integers(1, 5))
    out = []
    for i in range(n):
        dtype = draw(st.sampled_from(["int64", "uint64", "float32"]))
        shape = draw(st.none() | st.lists(st.integers(1, 3), min_size=1, max_size=2))
        out.append(Slot(f"s{i}", dtype, None if shape is None else tuple(shape)))
    return out


def int_token(draw: st.DrawFn, value: int) -> bytes:
    text = str(abs(value)).zfill(draw(st.integers(0, 3)) + len(str(abs(value))))
    sign = "-" if value < 0 else draw(st.sampled_from(["", "", "+"]))
    return (sign + text).encode()


def float_token(draw: st.DrawFn) -> tuple[bytes, int]:
    """A float32 spelled some way, and its bit pattern."""
    special = draw(st.sampled_from([None] * 8 + ["nan", "-nan", "inf", "-Infinity"]))
    if special is not None:
        return special.encode(), f32(float(special.replace("Infinity", "inf")))
    value = np.float32(draw(st.floats(width=32, allow_nan=False)))
    style = draw(st.sampled_from(["repr", "np", "g9", "e", "f"]))
    if math.isinf(value):
        text = str(float(value))
    elif style == "repr":
        text = repr(float(value))
    elif style == "np":
        text = str(value)
    elif style == "g9":
        text = f"{float(value):.9g}"
    elif style == "e":
        text = f"{float(value):.12e}"
    else:
        text = np.format_float_positional(value)
    return text.encode(), f32(float(value))


@st.composite
def texts(
    draw: st.DrawFn,
) -> tuple[list[Slot], bytes, list[tuple[tuple[int, ...], ...]]]:
    schema = draw(slots())
    n = draw(st.integers(0, 12))
    lines, records = [], []
    for _ in range(n):
        tokens: list[bytes] = []
        record = []
        for slot in schema:
            count = slot.width or draw(st.integers(1, 4))
            tokens.append(str(count).encode())
            values = []
            for _ in range(count):
                if slot.dtype == "float32":
                    token, bits = float_token(draw)
                    values.append(bits)
                else:
                    lo, hi = (
                        (0, 2**64 - 1)
                        if slot.dtype == "uint64"
                        else (-(2**63), 2**63 - 1)
                    )
                    value = draw(st.integers(lo, hi) | st.integers(max(lo, -3), 3))
                    token = int_token(draw, value)
                    values.append(value)
                tokens.append(token)
            record.append(tuple(values))
        seps = st.sampled_from([b" ", b" ", b"\t", b"  ", b" \t "])
        line = draw(st.sampled_from([b"", b" ", b"\t "]))
        for i, token in enumerate(tokens):
            line += (draw(seps) if i else b"") + token
        line += draw(st.sampled_from([b"", b"", b" ", b"\t"]))
        lines.append(line + draw(st.sampled_from([b"\n", b"\r\n"])))
        records.append(tuple(record))
    data = b"".join(lines)
    if data and draw(st.booleans()):  # a last line without its line end
        data = data.rstrip(b"\n")
    return schema, data, records


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts(), st.data())
def test_round_trip(case: Any, data: st.DataObject) -> None:
    schema, text, records = case
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=6), label="cuts")
    take_at = set(data.draw(st.lists(st.integers(0, 6), max_size=3), label="take_at"))
    assert parse_cython(schema, text, cuts=cuts, take_at=take_at).records == records
    assert parse_reference(schema, text).records == records


# -- properties: the parsers agree on anything ------------------------------------------

GARBAGE_TOKENS = [
    b"1",
    b"2",
    b"3",
    b"0",
    b"-1",
    b"+2",
    b"00",
    b"1.5",
    b"-2.5e3",
    b"1e",
    b"e1",
    b".",
    b"inf",
    b"-nan",
    b"1e39",
    b"-0",
    b"18446744073709551616",
    b"9223372036854775808",
    b"x",
    b"\x00",
    b"\xff",
    b"1\x00",
    b"\r",
    b"",
    b"\t",
    b"99999999999999999999999",
]


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.lists(st.sampled_from(GARBAGE_TOKENS), max_size=10)
        .map(b" ".join)
        .map(lambda line: line + b"\n"),
        max_size=8,
    ).map(b"".join),
    st.lists(st.integers(0, 200), max_size=4),
    st.sampled_from([5, 20, 1000]),
)
def test_parsers_agree_on_garbage(text: bytes, cuts: list[int], max_line: int) -> None:
    schema = [Slot("a", "uint64"), Slot("b", "float32", (1,)), Slot("c", "int64")]
    cuts = [c for c in cuts if c <= len(text)]
    for skip in (False, True):
        kw = {"skip_bad_lines": skip, "max_line_bytes": max_line}
        expected = outcome(parse_reference, schema, text, "g", **kw)
        got = outcome(parse_cython, schema, text, "g", cuts=cuts, **kw)
        assert_same_outcome(got, expected)


# -- properties: float32 rounding --------------------------------------------------------


def midpoint_tokens(value: float) -> list[bytes]:
    """Exact decimal spellings of the float32 midpoint above ``value``, and near it."""
    lo = np.float32(value)
    with np.errstate(over="ignore"):  # FLT_MAX has no finite neighbour above
        hi = np.nextafter(lo, np.float32(np.inf))
    if not np.isfinite(hi) or lo == 0:
        return []
    mid = (Decimal(float(lo)) + Decimal(float(hi))) / 2  # exact
    ulp = (Decimal(float(hi)) - Decimal(float(lo))) / 2**40
    return [
        str(mid).encode(),
        str(mid + ulp).encode(),
        str(mid - ulp).encode(),
        f"{mid:.17e}".encode(),
        f"{mid:.8e}".encode(),
    ]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.floats(width=32, allow_nan=False, allow_infinity=False).flatmap(
            lambda v: st.sampled_from(midpoint_tokens(v) or [repr(v).encode()])
        )
        | st.builds(
            lambda m, e, s: f"{s}{m}e{e}".encode(),
            st.integers(0, 10**25)
            .map(str)
            .map(lambda d: d[:1] + "." + d[1:] if len(d) > 1 else d),
            st.integers(-60, 45),
            st.sampled_from(["", "-"]),
        )
        | st.builds(
            lambda a, b: f"{a}.{b}".encode(),
            st.integers(0, 10**9),
            st.integers(0, 10**17),
        ),
        min_size=1,
        max_size=20,
    )
)
def test_floats_round_like_strtof(tokens: list[bytes]) -> None:
    schema = [Slot("x", "float32")]
    text = b"%d " % len(tokens) + b" ".join(tokens) + b"\n"
    expected = outcome(parse_reference, schema, text)
    got = outcome(parse_cython, schema, text)
    assert_same_outcome(got, expected)
    if isinstance(got, Result):
        assert list(got.records[0][0]) == [f32(ref.strtof(t)) for t in tokens]


def test_float32_bits_helper() -> None:
    assert f32(-0.0) == 0x80000000 and struct.pack("<I", f32(1.0)) == b"\x00\x00\x80?"


def test_a_count_of_thousands_of_digits_is_a_parse_error_with_its_line() -> None:
    # Python's int() refuses strings over 4,300 digits; the error path must not call it.
    huge = b"9" * 5000
    bad = b"1 5 " + huge + b" 1 2\n"
    with pytest.raises(ParseError) as caught:
        parse_bytes([Slot("a", "int64"), Slot("b", "int64")], b"1 5 1 7\n" + bad, "f.txt")
    message = str(caught.value)
    assert "f.txt, line 2" in message and "slot 'b'" in message
    assert "999..." in message and len(message) < 600
    chunk = parse_bytes(
        [Slot("a", "int64"), Slot("b", "int64")], b"1 5 1 7\n" + bad, "f", skip_bad_lines=True
    )
    assert chunk.rows == 1
