"""Mutation fuzzing of the MultiSlot parser against the reference parser.

Valid MultiSlot text for a random schema is mutated (truncations, bit flips,
huge counts and numbers, NUL bytes, invalid UTF-8, stray whitespace and
carriage returns, very long lines, empty input) and parsed by both the Cython
parser (fed at random split points, chunks taken at random) and the slow
reference parser, in raise mode and in skip mode. Every input must give the
same records, or the same ParseError (message, line, slot, token), from both.

Run as a script it fuzzes for a bounded time and prints one JSON line of
counts; a crash shows as the process dying, a hang as the caller's timeout.
``tests/datafeed/test_reliability.py`` runs it briefly; ``benchmarks/fuzz_parser.py`` longer.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import reference_parser
from reference_parser import Result, float32_bits

from datafeed import ParseError, Slot, SlotSchema
from datafeed.parse.parsing import ChunkParser

DTYPES = ("int64", "uint64", "float32")
HUGE_TOKENS = [
    b"99999999999999999999999", b"18446744073709551616", b"-9223372036854775809",
    b"1e39", b"-1e39", b"1e-50", b"nan", b"-inf", b"0x10", b"1.5e", b"--1", b"+",
    b"4294967296", b"2147483648",
]
JUNK = [b"\x00", b"\xff\xfe", b"\xc3\x28", b"\r", b"\t", b"  ", b"\n", b"\r\n", b"\xe2\x82"]


def random_schema(rng: random.Random) -> SlotSchema:
    slots = []
    for i in range(rng.randint(1, 5)):
        dtype = rng.choice(DTYPES)
        shape = (rng.randint(1, 3),) if rng.random() < 0.4 else None
        slots.append(Slot(f"s{i}", dtype, shape))
    return SlotSchema(slots)


def random_value(rng: random.Random, dtype: str) -> bytes:
    if dtype == "float32":
        choices = [0.0, -0.0, 1.5, rng.uniform(-1e6, 1e6), rng.random() * 1e-6]
        return repr(rng.choice(choices)).encode()
    if dtype == "uint64":
        return str(rng.choice([0, 1, rng.getrandbits(64), rng.randint(0, 10**6)])).encode()
    choices = [0, -1, rng.randint(-(2**63), 2**63 - 1), rng.randint(-1000, 1000)]
    return str(rng.choice(choices)).encode()


def valid_text(rng: random.Random, schema: SlotSchema, lines: int) -> bytes:
    out = []
    for _ in range(lines):
        parts = []
        for slot in schema:
            count = slot.width or rng.randint(1, 4)
            values = [random_value(rng, slot.dtype) for _ in range(count)]
            parts.append(b" ".join([str(count).encode()] + values))
        out.append(b" ".join(parts))
    return b"\n".join(out) + (b"\n" if rng.random() < 0.8 else b"")


def mutate(rng: random.Random, data: bytes) -> bytes:
    """One to three random mutations of ``data``."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(8)
        pos = rng.randrange(len(buf) + 1)
        if kind == 0:  # truncate
            del buf[pos:]
        elif kind == 1 and buf:  # bit flip
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
        elif kind == 2:  # a huge or odd number token
            buf[pos:pos] = b" " + rng.choice(HUGE_TOKENS) + b" "
        elif kind == 3:  # junk bytes
            buf[pos:pos] = rng.choice(JUNK)
        elif kind == 4 and buf:  # delete a run
            del buf[pos : pos + rng.randint(1, 8)]
        elif kind == 5:  # a very long line (beyond a small max_line_bytes)
            buf[pos:pos] = b" 1" * rng.randint(100, 3000)
        elif kind == 6:  # empty input
            buf = bytearray()
        else:  # duplicate a slice
            j = rng.randrange(len(buf) + 1)
            buf[pos:pos] = buf[min(pos, j) : max(pos, j)][:200]
    return bytes(buf)


def parse_cython(schema: SlotSchema, data: bytes, rng: random.Random, **kw) -> Result:
    parser = ChunkParser(schema, "<fuzz>", **kw)
    records: list = []
    tail = b""
    pos = 0
    while pos < len(data):
        step = rng.randint(1, 64) if rng.random() < 0.5 else rng.randint(64, 4096)
        piece = tail + data[pos : pos + step]
        pos += step
        consumed = parser.feed(piece)
        tail = piece[consumed:]
        if rng.random() < 0.3:
            records += _rows(schema, parser.take_chunk())
    parser.feed_final(tail)
    records += _rows(schema, parser.take_chunk())
    return Result(records, parser.lines, parser.skipped_lines, dict(parser.skipped_reasons),
                  list(parser.bad_line_messages))


def _rows(schema: SlotSchema, chunk) -> list:
    if chunk is None:
        return []
    columns = []
    for slot, column in zip(schema, chunk.columns, strict=True):
        values = column.values
        if slot.dtype == "float32":
            values = [float32_bits(v) for v in values.tolist()]
        else:
            values = values.tolist()
        if column.offsets is None:
            w = column.width
            columns.append([tuple(values[i * w : (i + 1) * w]) for i in range(chunk.rows)])
        else:
            off = column.offsets.tolist()
            columns.append([tuple(values[off[i] : off[i + 1]]) for i in range(chunk.rows)])
    return [tuple(col[i] for col in columns) for i in range(chunk.rows)]


def outcome(fn, *args, **kw):
    try:
        return fn(*args, **kw)
    except ParseError as error:
        return ("ParseError", str(error), error.line, error.slot, error.token)


def fuzz(seconds: float, seed: int) -> dict:
    """Fuzzes for ``seconds``; returns counts. Raises AssertionError on a mismatch."""
    rng = random.Random(seed)
    counts = {"seed": seed, "inputs": 0, "parse_errors": 0, "records_compared": 0,
              "skipped_lines": 0, "mismatches": 0}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        schema = random_schema(rng)
        data = mutate(rng, valid_text(rng, schema, rng.randint(0, 12)))
        max_line = rng.choice([64 << 20, 256, 2048])
        for skip in (False, True):
            kw = {"skip_bad_lines": skip, "max_line_bytes": max_line}
            got = outcome(parse_cython, schema, data, random.Random(rng.random()), **kw)
            want = outcome(reference_parser.parse, schema, data, "<fuzz>", **kw)
            if got != want:
                counts["mismatches"] += 1
                raise AssertionError(
                    f"parsers disagree (seed {seed}, input #{counts['inputs']}):\n"
                    f"schema={schema!r}\nmax_line_bytes={max_line} skip={skip}\n"
                    f"data={data!r}\ncython={got!r}\nreference={want!r}"
                )
            counts["inputs"] += 1
            if isinstance(got, tuple):
                counts["parse_errors"] += 1
            else:
                counts["records_compared"] += len(got.records)
                counts["skipped_lines"] += got.skipped_lines
    return counts


if __name__ == "__main__":
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    print(json.dumps(fuzz(seconds, seed)))
