"""The in-memory record store: the loaded records as a list of column chunks.

Chunks come from the reader threads in file order, so the store's order (and
so every seeded shuffle of it) depends only on the inputs, never on thread
timing. A shuffle gathers every column into one new contiguous chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from ..config.slots import SlotSchema
from . import _shuffle
from .arrow import arrow_schema_of, chunk_to_record_batch
from .columns import RecordChunk, SlotColumn, offsets_dtype

# Makes an output array: (shape, dtype) -> an uninitialised array (np.empty's signature).
Allocate = Callable[..., np.ndarray]


class RecordStore:
    """Records of one schema held in memory as numpy column chunks."""

    def __init__(self, schema: SlotSchema, chunks: list[RecordChunk] | None = None) -> None:
        self.schema = schema
        self.chunks: list[RecordChunk] = [c for c in (chunks or []) if c.rows]

    @property
    def rows(self) -> int:
        return sum(c.rows for c in self.chunks)

    @property
    def nbytes(self) -> int:
        """Bytes held by the value and offset arrays."""
        return sum(c.nbytes for c in self.chunks)

    def extend(self, chunks: list[RecordChunk]) -> None:
        self.chunks.extend(c for c in chunks if c.rows)

    def clear(self) -> None:
        self.chunks = []

    def _sources(self, permutation: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each output row ``i``: the chunk and the row in it that
        ``permutation[i]`` names."""
        sizes = [c.rows for c in self.chunks]
        starts = np.cumsum([0] + sizes)
        permutation = np.asarray(permutation, dtype=np.int64)
        # A row -> chunk table looked up through the permutation (17x faster
        # than a binary search of the chunk starts for 1M rows in 120 chunks).
        chunk_of_row = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
        chunk_of = np.take(chunk_of_row, permutation)
        del chunk_of_row
        return chunk_of, permutation - np.take(starts, chunk_of)

    def take(
        self, permutation: np.ndarray, threads: int = 2, allocate: Allocate = np.empty
    ) -> RecordStore:
        """A new store whose row ``i`` is this store's row ``permutation[i]``,
        its arrays made by ``allocate(shape, dtype)`` (from several threads)."""
        if not self.chunks:
            return RecordStore(self.schema)
        chunk_of, row_of = self._sources(permutation)
        columns: list[SlotColumn | None] = [None] * len(self.schema)

        def gather(i: int) -> None:
            parts = [c.columns[i] for c in self.chunks]
            columns[i] = gather_column(parts, chunk_of, row_of, allocate)

        if threads <= 1:  # small gathers (a global shuffle's rounds): no pool to start
            for i in range(len(self.schema)):
                gather(i)
        else:
            # The gather kernels release the GIL: columns gather in parallel.
            with ThreadPoolExecutor(max_workers=threads) as pool:
                list(pool.map(gather, range(len(self.schema))))
        chunk = RecordChunk(tuple(columns), len(chunk_of))  # type: ignore[arg-type]
        return RecordStore(self.schema, [chunk])

    def take_per_column(self, rows: list[np.ndarray]) -> RecordStore:
        """A new store of one chunk whose column ``i`` holds, at row ``k``, that
        column of this store's row ``rows[i][k]`` (every ``rows[i]`` has one
        length; equal arrays, by identity, are looked up once)."""
        if len(rows) != len(self.schema):
            raise ValueError(
                f"take_per_column: {len(rows)} row arrays for {len(self.schema)} columns"
            )
        length = len(rows[0]) if rows else 0
        if not self.chunks or not length:
            return self.take(np.empty(0, dtype=np.int64), threads=1)
        sources: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        columns = []
        for i, picked in enumerate(rows):
            if id(picked) not in sources:
                sources[id(picked)] = self._sources(picked)
            chunk_of, row_of = sources[id(picked)]
            columns.append(gather_column([c.columns[i] for c in self.chunks], chunk_of, row_of))
        return RecordStore(self.schema, [RecordChunk(tuple(columns), length)])

    def permute_columns(self, indices: list[int], permutation: np.ndarray) -> RecordStore:
        """A new store where, in the slots at ``indices``, row ``i`` holds the
        values of row ``permutation[i]``; the other slots are shared, not copied."""
        if not self.chunks:
            return RecordStore(self.schema)
        chunk_of, row_of = self._sources(permutation)
        gathered = {
            i: gather_column([c.columns[i] for c in self.chunks], chunk_of, row_of)
            for i in indices
        }
        chunks = []
        start = 0
        for chunk in self.chunks:
            columns = list(chunk.columns)
            for i, column in gathered.items():
                columns[i] = column.slice(start, start + chunk.rows)
            chunks.append(RecordChunk(tuple(columns), chunk.rows))
            start += chunk.rows
        return RecordStore(self.schema, chunks)

    def to_arrow(self) -> pa.Table:
        """The records as a ``pyarrow.Table``; values are shared, not copied."""
        batches = [chunk_to_record_batch(self.schema, c) for c in self.chunks]
        return pa.Table.from_batches(batches, schema=arrow_schema_of(self.schema))


def gather_column(
    parts: list[SlotColumn], chunk_of: np.ndarray, row_of: np.ndarray,
    allocate: Allocate = np.empty,
) -> SlotColumn:
    """Row ``row_of[i]`` of part ``chunk_of[i]``, for every i, as one new
    column, its arrays made by ``allocate(shape, dtype)``."""
    dtype = parts[0].values.dtype
    widths = {p.width for p in parts}
    if len(widths) == 1 and all(p.offsets is None for p in parts):
        width = parts[0].width
        values = allocate(len(chunk_of) * width, dtype)
        _shuffle.gather_fixed(
            [p.values.view(np.uint8) for p in parts],
            width * dtype.itemsize,
            chunk_of,
            row_of,
            values.view(np.uint8),
        )
        return SlotColumn(values, None, width)
    # Records' lengths in the output's order, then its offsets; the parts'
    # offsets are read as they are (int32, int64 or none), never widened.
    lengths = np.concatenate([p.lengths() for p in parts])
    starts = np.cumsum([0] + [p.rows for p in parts])
    lengths = lengths[starts[chunk_of] + row_of]
    total = int(lengths.sum())
    offsets = allocate(len(chunk_of) + 1, offsets_dtype(total))
    offsets[0] = 0
    np.cumsum(lengths, out=offsets[1:])
    values = allocate(total, dtype)
    no_offsets = np.empty(0, dtype=np.uint8)
    _shuffle.gather_ragged(
        [p.values.view(np.uint8) for p in parts],
        [no_offsets if p.offsets is None else p.offsets.view(np.uint8) for p in parts],
        np.array([0 if p.offsets is None else p.offsets.itemsize for p in parts], np.int64),
        np.array([p.width for p in parts], dtype=np.int64),
        dtype.itemsize,
        chunk_of,
        row_of,
        offsets,
        values.view(np.uint8),
    )
    return SlotColumn(values, offsets, 0)
