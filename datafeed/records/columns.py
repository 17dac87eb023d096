"""Column chunks: the parsed values of consecutive records, one array per slot.

This is the unit that flows from the parser to the store and the batcher. A
chunk owns plain numpy arrays; Arrow arrays and torch tensors are views of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SlotColumn:
    """The values of one slot for ``rows`` consecutive records.

    Attributes:
        values: 1-D array in the slot's dtype (int64, uint64 or float32).
        offsets: int32 or int64 array of length ``rows + 1`` starting at 0, where
            record ``i`` holds ``values[offsets[i]:offsets[i + 1]]``; ``None``
            when every record holds exactly ``width`` values (dense slots, and
            sparse slots whose records all have the same length: this saves the
            offsets' memory, 4 bytes per record per slot).
        width: values per record when ``offsets`` is None, else 0.
    """

    values: np.ndarray
    offsets: np.ndarray | None
    width: int

    @property
    def rows(self) -> int:
        if self.offsets is None:
            return len(self.values) // self.width if self.width else 0
        return len(self.offsets) - 1

    def lengths(self) -> np.ndarray:
        """Values per record, as int64."""
        if self.offsets is None:
            return np.full(self.rows, self.width, dtype=np.int64)
        return np.diff(self.offsets).astype(np.int64, copy=False)

    @property
    def nbytes(self) -> int:
        return self.values.nbytes + (0 if self.offsets is None else self.offsets.nbytes)

    def offsets_or_uniform(self) -> np.ndarray:
        """The offsets, built from ``width`` for an offset-free column (a new array)."""
        if self.offsets is None:
            return uniform_offsets(self.rows, self.width)
        return self.offsets

    def slice(self, start: int, stop: int) -> SlotColumn:
        """Records ``start:stop``: values shared; offsets rebased (a new array, same
        width as these offsets)."""
        if self.offsets is None:
            w = self.width
            return SlotColumn(self.values[start * w : stop * w], None, w)
        lo, hi = int(self.offsets[start]), int(self.offsets[stop])
        offsets = self.offsets[start : stop + 1]
        return SlotColumn(self.values[lo:hi], offsets - lo if lo else offsets, 0)


def offsets_dtype(total_values: int) -> np.dtype:
    """int32 offsets (4 bytes per record) unless the values outgrow them.

    The one rule for the width of offsets in memory: the parser, a shuffle and a
    concatenation all keep int32 below 2**31 values; Arrow sees the same arrays
    (``list``, or ``large_list`` for int64), and a batch rebases them into torch's
    int64 in the same pass (``batch.BatchBuilder``), so nothing is widened by a
    copy of its own.
    """
    return np.dtype(np.int32) if total_values <= np.iinfo(np.int32).max else np.dtype(np.int64)


def uniform_offsets(rows: int, width: int, dtype: np.dtype | None = None) -> np.ndarray:
    """``0, width, 2 * width, ... rows * width``: the offsets of records that all
    hold ``width`` values, in ``dtype`` (by default the narrowest that fits)."""
    dtype = offsets_dtype(rows * width) if dtype is None else dtype
    if width == 0:  # records with no values: every offset is 0
        return np.zeros(rows + 1, dtype=dtype)
    return np.arange(0, (rows + 1) * width, width, dtype=dtype)


def concat_columns(columns: list[SlotColumn]) -> SlotColumn:
    """Columns of one slot, one after the other, in one new column.

    Keeps the offset-free layout when every part has it with the same width.
    """
    if len(columns) == 1:
        return columns[0]
    values = np.concatenate([c.values for c in columns])
    first = columns[0]
    if first.offsets is None and all(
        c.offsets is None and c.width == first.width for c in columns
    ):
        return SlotColumn(values, None, first.width)
    lengths = np.concatenate([c.lengths() for c in columns])
    offsets = np.zeros(len(lengths) + 1, dtype=offsets_dtype(len(values)))
    np.cumsum(lengths, out=offsets[1:])
    return SlotColumn(values, offsets, 0)


@dataclass(frozen=True)
class RecordChunk:
    """Consecutive records: one ``SlotColumn`` per slot, in schema order."""

    columns: tuple[SlotColumn, ...]
    rows: int

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.columns)

    def slice(self, start: int, stop: int) -> RecordChunk:
        """Records ``start:stop`` (values shared, see ``SlotColumn.slice``)."""
        return RecordChunk(tuple(c.slice(start, stop) for c in self.columns), stop - start)


def concat_rows(pieces: list[tuple[RecordChunk, int, int]]) -> RecordChunk:
    """Row ranges ``(chunk, start, stop)`` of several chunks as one new chunk."""
    num_slots = len(pieces[0][0].columns)
    columns = tuple(
        concat_columns([chunk.columns[i].slice(a, b) for chunk, a, b in pieces])
        for i in range(num_slots)
    )
    return RecordChunk(columns, sum(b - a for _, a, b in pieces))
