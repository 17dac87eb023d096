"""Slot specs: a compact text form of a slot schema, for the command line and configs.

A spec is either compact text, entries separated by commas::

    dense:float32:13,C1..C26:uint64,label:int64:1

or the path of a slots file holding one slot per line, ``name dtype [shape]``
(``#`` starts a comment; a line may also be a compact entry). Each entry is
``name:dtype[:shape]``: no shape means a sparse slot (any number of values per
record), a shape (``13``, or ``4x8`` for a 2-D slot) a dense one. A name
``C1..C26`` (or ``C1..26``) stands for the 26 slots ``C1``, ..., ``C26``; a
spec declares at most ``MAX_SLOTS`` slots, checked before a range is expanded.
``str(slot)`` of every ``Slot`` is a valid entry, so ``format_slots`` and
``parse_slots`` round-trip.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from .errors import SchemaError
from .slots import Slot, SlotSchema

__all__ = ["MAX_SLOTS", "format_slots", "parse_slots"]

_RANGE = re.compile(r"^(?P<prefix>.*?)(?P<start>\d+)\.\.(?:(?P=prefix))?(?P<end>\d+)$")
# Slots one spec may declare: far beyond a real schema (Criteo's spec has 28),
# and a bound on what a typo such as C1..C100000000 would allocate (its 10**8
# slots took 3.6 GB before anything was checked).
MAX_SLOTS = 100_000


def _expand_name(name: str, where: str, declared: int) -> list[str]:
    """The names ``name`` stands for; ``declared``: the slots before it."""
    if ".." not in name:
        if declared >= MAX_SLOTS:
            raise SchemaError(
                f"{where}: the slot {name!r} makes {declared + 1} in all; a spec declares "
                f"at most {MAX_SLOTS} slots"
            )
        return [name]
    match = _RANGE.match(name)
    if match is None:
        raise SchemaError(
            f"{where}: a name range must look like 'C1..C26' or 'C1..26', got {name!r}"
        )
    start, end = int(match["start"]), int(match["end"])
    if end < start:
        raise SchemaError(f"{where}: the range {name!r} ends before it starts")
    count = end - start + 1
    if declared + count > MAX_SLOTS:
        raise SchemaError(
            f"{where}: the range {name!r} stands for {count} slots, which makes "
            f"{declared + count} in all; a spec declares at most {MAX_SLOTS} slots"
        )
    return [f"{match['prefix']}{i}" for i in range(start, end + 1)]


def _parse_shape(text: str, where: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(d) for d in text.lower().split("x"))
    except ValueError:
        raise SchemaError(
            f"{where}: a shape must be positive ints joined by 'x' (e.g. 13 or 4x8), "
            f"got {text!r}"
        ) from None
    if any(d < 1 for d in shape):
        raise SchemaError(f"{where}: a shape must be positive, got {text!r}")
    return shape


def _parse_entry(fields: list[str], where: str, declared: int) -> list[Slot]:
    if len(fields) not in (2, 3) or not all(fields):
        raise SchemaError(
            f"{where}: expected name:dtype[:shape] (or 'name dtype [shape]' in a "
            f"slots file), got {':'.join(fields)!r}"
        )
    shape = _parse_shape(fields[2], where) if len(fields) == 3 else None
    try:
        names = _expand_name(fields[0], where, declared)
        return [Slot(name, fields[1], shape) for name in names]
    except SchemaError as error:
        if str(error).startswith(where):
            raise
        raise SchemaError(f"{where}: {error}") from None


def _parse_file(path: str) -> list[Slot]:
    slots: list[Slot] = []
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, start=1):
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            where = f"{path}, line {number}"
            for entry in text.split(","):
                entry = entry.strip()
                if entry:
                    fields = entry.split(":") if ":" in entry else entry.split()
                    slots += _parse_entry(fields, where, len(slots))
    return slots


def parse_slots(spec: str | os.PathLike) -> list[Slot]:
    """Parses a slot spec (compact text or a slots file) into ``Slot`` objects.

    Args:
        spec: compact text such as ``"dense:float32:13,C1..C26:uint64,label:int64:1"``,
            or the path of an existing slots file (one ``name dtype [shape]`` per line).

    Returns:
        The slots in order, ready for ``init(use_var=...)``.

    Raises:
        SchemaError: a malformed entry (named, with where it is), an unknown
            dtype, a bad shape, a name that appears twice, or more than
            ``MAX_SLOTS`` slots.
    """
    text = os.fspath(spec)
    if os.path.isfile(text):
        slots = _parse_file(text)
        where = text
    else:
        slots = []
        for number, entry in enumerate(text.split(","), start=1):
            entry = entry.strip()
            if not entry:
                continue
            slots += _parse_entry(
                entry.split(":"), f"slot spec entry {number} ({entry!r})", len(slots)
            )
        where = "the slot spec"
    if not slots:
        raise SchemaError(f"{where} declares no slots (got {text!r})")
    try:
        SlotSchema(slots)  # checks that names are unique
    except SchemaError as error:
        raise SchemaError(f"{where}: {error}") from None
    return slots


def format_slots(slots: Iterable[Slot]) -> str:
    """The compact spec of ``slots`` (ranges are not folded back)."""
    return ",".join(str(slot) for slot in SlotSchema(slots))
