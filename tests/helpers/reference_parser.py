"""A slow, obviously-correct MultiSlot parser: the oracle for datafeed.parse._parse.

It reads the format straight from its definition, a line at a time, with
regular expressions for the token grammar, Python ints for range checks and
libc ``strtof`` (through ctypes) for float32 rounding. It shares no code with
the Cython parser; the tests require both to agree on the records, on the
accounting of skipped lines, and on every error (message, line, slot, token).
"""

from __future__ import annotations

import ctypes
import math
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from datafeed.config.errors import ParseError
from datafeed.config.slots import Slot, SlotSchema

INT_TOKEN = re.compile(rb"[+-]?[0-9]+")
FLOAT_TOKEN = re.compile(
    rb"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
    rb"|[+-]?(?i:inf|infinity|nan)"
)
SPECIAL_TOKEN = re.compile(rb"[+-]?(?i:inf|infinity|nan)")
SEPARATORS = re.compile(rb"[ \t]+")
TOKEN_SHOWN = 64
MAX_MESSAGES = 10

_libc = ctypes.CDLL(None)
_strtof = _libc.strtof
_strtof.restype = ctypes.c_float
_strtof.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)]


def strtof(token: bytes) -> float:
    """libc's correctly rounded decimal -> float32, as a Python float."""
    return float(_strtof(token, None))


def float32_bits(value: float) -> int:
    """The bit pattern of a float32 value (tells -0.0 from 0.0, keeps NaN signs)."""
    return int(struct.unpack("<I", struct.pack("<f", value))[0])


@dataclass
class Result:
    """What a parser made of a text.

    ``records`` holds one tuple per record with one tuple of values per slot;
    float32 values appear as their bit patterns (``float32_bits``) so that
    comparisons are exact, NaNs and signed zeros included.
    """

    records: list[tuple[tuple[int, ...], ...]] = field(default_factory=list)
    lines: int = 0
    skipped_lines: int = 0
    skipped_reasons: dict[str, int] = field(default_factory=dict)
    bad_line_messages: list[str] = field(default_factory=list)


class _Bad(Exception):
    def __init__(
        self, reason: str, slot: Slot | None, what: str, token: bytes | None
    ) -> None:
        super().__init__(what)
        self.reason, self.slot, self.what, self.token = reason, slot, what, token


def _shown(token: bytes) -> str:
    return repr(token[:TOKEN_SHOWN]) + ("..." if len(token) > TOKEN_SHOWN else "")


def _value(slot: Slot, token: bytes) -> int:
    """One value token of ``slot``, as an int (float32: its bit pattern)."""
    shown = _shown(token)
    if slot.dtype == "float32":
        if not FLOAT_TOKEN.fullmatch(token):
            raise _Bad("not_a_number", slot, f"expected a number, found {shown}", token)
        value = strtof(token)
        if math.isinf(value) and not SPECIAL_TOKEN.fullmatch(token):
            raise _Bad(
                "out_of_range",
                slot,
                "expected a number within the float32 range "
                f"(magnitude at most 3.4028235e+38), found {shown}",
                token,
            )
        return float32_bits(value)
    if INT_TOKEN.fullmatch(token):
        value = int(token)
        if slot.dtype == "uint64":
            if token.startswith(b"-"):
                raise _Bad(
                    "negative_uint64",
                    slot,
                    "expected an unsigned integer (negative value in a uint64 "
                    f"slot), found {shown}",
                    token,
                )
            if value > 2**64 - 1:
                raise _Bad(
                    "out_of_range",
                    slot,
                    "expected an integer within the uint64 range "
                    f"[0, 18446744073709551615], found {shown}",
                    token,
                )
        elif not -(2**63) <= value <= 2**63 - 1:
            raise _Bad(
                "out_of_range",
                slot,
                "expected an integer within the int64 range "
                f"[-9223372036854775808, 9223372036854775807], found {shown}",
                token,
            )
        return value
    if FLOAT_TOKEN.fullmatch(token):
        raise _Bad(
            "float_in_integer_slot",
            slot,
            f"expected an integer ({slot.dtype} slots do not take floats), "
            f"found {shown}",
            token,
        )
    expected = "an unsigned integer" if slot.dtype == "uint64" else "an integer"
    raise _Bad("not_a_number", slot, f"expected {expected}, found {shown}", token)


def _record(schema: SlotSchema, line: bytes) -> tuple[tuple[int, ...], ...]:
    """One line (without its line end) as a record; raises _Bad."""
    if not line.strip(b" \t"):
        raise _Bad("blank_line", None, "expected a record, found a blank line", b"")
    tokens = [t for t in SEPARATORS.split(line) if t]
    record = []
    at = 0
    for index, slot in enumerate(schema):
        if at == len(tokens):
            raise _Bad(
                "missing_slot",
                slot,
                "expected a value count, found the end of the line "
                f"(after {index} of {len(schema)} slots)",
                None,
            )
        count_token = tokens[at]
        at += 1
        shown = _shown(count_token)
        if not INT_TOKEN.fullmatch(count_token):
            raise _Bad(
                "bad_count",
                slot,
                f"expected a value count (an integer >= 1), found {shown}",
                count_token,
            )
        count = int(count_token)
        if count <= 0:
            raise _Bad(
                "count_not_positive",
                slot,
                "expected a value count >= 1 (pad empty slots in the "
                f"generator), found {shown}",
                count_token,
            )
        if slot.is_dense and count != slot.width:
            raise _Bad(
                "dense_count_mismatch",
                slot,
                f"expected a value count of {slot.width} (a dense slot of "
                f"shape {slot.shape}), found {shown}",
                count_token,
            )
        values = []
        for found in range(count):
            if at == len(tokens):
                raise _Bad(
                    "too_few_values",
                    slot,
                    f"expected {count} values, found the end of the line after {found}",
                    None,
                )
            values.append(_value(slot, tokens[at]))
            at += 1
        record.append(tuple(values))
    if at < len(tokens):
        raise _Bad(
            "trailing_tokens",
            None,
            "expected the end of the line after the last slot "
            f"{schema[len(schema) - 1].name!r}, found {_shown(tokens[at])}",
            tokens[at],
        )
    return tuple(record)


def parse(
    schema: SlotSchema | Iterable[Any],
    data: bytes,
    source: str = "<bytes>",
    *,
    skip_bad_lines: bool = False,
    max_line_bytes: int = 64 * 2**20,
) -> Result:
    """Parses a whole MultiSlot text.

    Raises:
        ParseError: at the first bad line, unless ``skip_bad_lines``.
    """
    schema = schema if isinstance(schema, SlotSchema) else SlotSchema(schema)
    result = Result()
    lines = data.split(b"\n")
    if lines[-1] == b"":  # the text ends with a line end (or is empty)
        lines.pop()
    for number, raw in enumerate(lines, start=1):
        try:
            if len(raw) > max_line_bytes:
                start = raw[: min(TOKEN_SHOWN, max_line_bytes + 1)]
                raise _Bad(
                    "line_too_long",
                    None,
                    f"expected a line of at most {max_line_bytes} bytes, "
                    f"found a longer line starting {start!r}",
                    start,
                )
            line = raw[:-1] if raw.endswith(b"\r") else raw
            record = _record(schema, line)
        except _Bad as bad:
            where = f"{source}, line {number}"
            if bad.slot is not None:
                where += f", slot {bad.slot.name!r}"
            token = None if bad.token is None else bad.token[:TOKEN_SHOWN]
            error = ParseError(
                f"{where}: {bad.what}",
                source=source,
                line=number,
                slot=None if bad.slot is None else bad.slot.name,
                token=token,
            )
            if not skip_bad_lines:
                raise error from None
            result.lines += 1
            result.skipped_lines += 1
            reasons = result.skipped_reasons
            reasons[bad.reason] = reasons.get(bad.reason, 0) + 1
            if len(result.bad_line_messages) < MAX_MESSAGES:
                result.bad_line_messages.append(str(error))
            continue
        result.lines += 1
        result.records.append(record)
    return result
