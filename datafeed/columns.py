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


@dataclass(frozen=True)
class RecordChunk:
    """Consecutive records: one ``SlotColumn`` per slot, in schema order."""

    columns: tuple[SlotColumn, ...]
    rows: int

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.columns)
