"""The in-memory record store: the loaded records as a list of column chunks.

Chunks come from the reader threads in file order, so the store's order (and
so every seeded shuffle of it) depends only on the inputs, never on thread
timing. A shuffle gathers every column into one new contiguous chunk.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from .batch import concat_columns
from .columns import RecordChunk, SlotColumn
from .slots import SlotSchema


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

    def batch_pieces(
        self, batch_size: int, drop_last: bool, start_row: int = 0
    ) -> Iterator[list[tuple[RecordChunk, int, int]]]:
        """Row ranges making up each batch, from ``start_row`` on, in store order.

        A batch is usually one piece (a view of one chunk); a batch that straddles
        a chunk boundary has several pieces.
        """
        pieces: list[tuple[RecordChunk, int, int]] = []
        wanted = batch_size
        skip = start_row
        for chunk in self.chunks:
            if skip >= chunk.rows:
                skip -= chunk.rows
                continue
            row, skip = skip, 0
            while row < chunk.rows:
                take = min(wanted, chunk.rows - row)
                pieces.append((chunk, row, row + take))
                row += take
                wanted -= take
                if wanted == 0:
                    yield pieces
                    pieces, wanted = [], batch_size
        if pieces and not drop_last:
            yield pieces

    def take(self, permutation: np.ndarray, threads: int = 2) -> RecordStore:
        """A new store whose row ``i`` is this store's row ``permutation[i]``."""
        columns: list[SlotColumn | None] = [None] * len(self.schema)

        def gather(i: int) -> None:
            merged = concat_columns([c.columns[i] for c in self.chunks])
            columns[i] = take_column(merged, permutation)

        if self.chunks:
            # numpy's take releases the GIL: columns gather in parallel.
            with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
                list(pool.map(gather, range(len(self.schema))))
            chunk = RecordChunk(tuple(columns), len(permutation))  # type: ignore[arg-type]
            return RecordStore(self.schema, [chunk])
        return RecordStore(self.schema)

    def to_arrow(self) -> pa.Table:
        """The records as a ``pyarrow.Table``; values are shared, not copied."""
        arrow_schema = arrow_schema_of(self.schema)
        batches = [chunk_to_record_batch(self.schema, c, arrow_schema) for c in self.chunks]
        return pa.Table.from_batches(batches, schema=arrow_schema)


def take_column(column: SlotColumn, permutation: np.ndarray) -> SlotColumn:
    """Gathers records of one column in ``permutation`` order."""
    if column.offsets is None:
        w = column.width
        values = np.take(column.values.reshape(-1, w), permutation, axis=0).reshape(-1)
        return SlotColumn(values, None, w)
    offsets = column.offsets
    starts = offsets[:-1][permutation].astype(np.int64)
    lengths = (offsets[1:] - offsets[:-1])[permutation].astype(np.int64)
    new_offsets = np.zeros(len(permutation) + 1, dtype=offsets.dtype)
    np.cumsum(lengths, out=new_offsets[1:])
    # Index of every output value in the input: its record's input start plus its
    # position inside the record.
    shift = np.repeat(starts - new_offsets[:-1], lengths)
    index = np.arange(len(shift), dtype=np.int64) + shift
    return SlotColumn(np.take(column.values, index), new_offsets, 0)


def arrow_schema_of(schema: SlotSchema) -> pa.Schema:
    fields = []
    for slot in schema:
        value_type = pa.from_numpy_dtype(slot.numpy_dtype)
        if slot.is_dense:
            arrow_type = pa.list_(value_type, slot.width)
        else:
            arrow_type = pa.list_(value_type)
        fields.append(pa.field(slot.name, arrow_type, nullable=False))
    return pa.schema(fields)


def column_to_arrow(column: SlotColumn, arrow_type: pa.DataType) -> pa.Array:
    values = pa.array(column.values)  # zero-copy view of the numpy array
    if pa.types.is_fixed_size_list(arrow_type):
        return pa.FixedSizeListArray.from_arrays(values, column.width)
    offsets = column.offsets
    if offsets is None:
        # Offset-free sparse column: build the offsets Arrow needs (4 bytes/record).
        offsets = np.arange(0, (column.rows + 1) * column.width, column.width, dtype=np.int32)
    if offsets.dtype == np.int64:
        return pa.LargeListArray.from_arrays(pa.array(offsets), values).cast(arrow_type)
    return pa.ListArray.from_arrays(pa.array(offsets), values)


def chunk_to_record_batch(
    schema: SlotSchema, chunk: RecordChunk, arrow_schema: pa.Schema | None = None
) -> pa.RecordBatch:
    arrow_schema = arrow_schema or arrow_schema_of(schema)
    arrays = [
        column_to_arrow(column, field.type) for column, field in zip(chunk.columns, arrow_schema)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)
