"""The in-memory record store: the loaded records as column chunks, in an order.

Chunks come from the reader threads in file order, so the store's order (and
so every seeded shuffle of it) depends only on the inputs, never on thread
timing. A shuffle copies no record: it gives the store an order, one row
number per record (8 bytes each), and the rows are gathered from the chunks
when a batch is built (``PermutedRows``). ``take`` makes a contiguous copy
where one is needed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import overload

import numpy as np
import pyarrow as pa

from ..config.slots import SlotSchema
from . import _shuffle
from .arrow import arrow_schema_of, chunk_to_record_batch
from .columns import RecordChunk, SlotColumn, offsets_dtype

# Rows per gathered piece of a shuffled store that is copied whole (to Arrow,
# to a cache): pieces of about 4 MB of Criteo-sized records, not a second store.
COPY_WINDOW_ROWS = 16384

class RecordStore:
    """Records of one schema held in memory as numpy column chunks, in an order.

    Attributes:
        schema: the slots (and text fields) of the records.
        chunks: the records as they were loaded or received.
        order: None when the store's rows are the chunks' rows in chunk
            order; else an int64 array, the store's row ``i`` being the
            chunks' row ``order[i]`` (row numbers counted across the chunks).
    """

    def __init__(
        self, schema: SlotSchema, chunks: list[RecordChunk] | None = None,
        order: np.ndarray | None = None,
    ) -> None:
        self.schema = schema
        self.chunks: list[RecordChunk] = [c for c in (chunks or []) if c.rows]
        self.order: np.ndarray | None = None
        if order is not None:
            order = np.ascontiguousarray(order, dtype=np.int64)
            held = sum(c.rows for c in self.chunks)
            if len(order) != held:
                raise ValueError(f"an order of {len(order)} rows for chunks of {held} rows")
            order.flags.writeable = False  # gatherers check its rows once, then trust them
            self.order = order

    @property
    def rows(self) -> int:
        return sum(c.rows for c in self.chunks)

    @property
    def nbytes(self) -> int:
        """Bytes held by the value and offset arrays, and by the order."""
        order = 0 if self.order is None else self.order.nbytes
        return sum(c.nbytes for c in self.chunks) + order

    def extend(self, chunks: list[RecordChunk]) -> None:
        """Appends records after the store's last row."""
        before = self.rows
        self.chunks.extend(c for c in chunks if c.rows)
        if self.order is not None:
            self.order = np.concatenate([self.order, np.arange(before, self.rows)])

    def clear(self) -> None:
        self.chunks = []
        self.order = None

    def chunk_rows(self, rows: np.ndarray) -> np.ndarray:
        """The chunks' row numbers of the store's ``rows``."""
        rows = np.asarray(rows, dtype=np.int64)
        return rows if self.order is None else np.take(self.order, rows)

    def reordered(self, permutation: np.ndarray) -> RecordStore:
        """The same records, the new store's row ``i`` being this store's row
        ``permutation[i]`` (a permutation of all rows): no record is copied."""
        permutation = np.asarray(permutation, dtype=np.int64)
        if len(permutation) != self.rows:
            raise ValueError(
                f"reordered: a permutation of {len(permutation)} rows for {self.rows} records"
            )
        return RecordStore(self.schema, self.chunks, self.chunk_rows(permutation))

    def row_sources(self) -> list[RecordChunk | PermutedRows]:
        """What batches are cut from, in the store's order: the chunks
        themselves, or the one ``PermutedRows`` of a store with an order."""
        return list(self.chunks) if self.order is None else [PermutedRows(self)]

    def columns_in_order(self, indices: Sequence[int]) -> Iterator[SlotColumn]:
        """Columns ``indices`` of every record in the store's order, one at a
        time (the chunks' own when there is one chunk and no order; else new
        ones): a reader of one at a time holds one copy at most."""
        if not self.chunks:
            raise ValueError("columns_in_order of a store without records")
        sources = None  # each row's chunk and row in it, found once
        for index in indices:
            parts = [c.columns[index] for c in self.chunks]
            if self.order is None and len(parts) == 1:
                yield parts[0]
                continue
            if sources is None:
                sources = self._sources(self.chunk_rows(np.arange(self.rows)))
            yield gather_column(parts, *sources)

    def copy_pieces(self) -> Sequence[RecordChunk]:
        """The records in the store's order as chunks: the chunks themselves, or
        pieces gathered one at a time as the list is read (see ``PieceList``)."""
        if self.order is None:
            return list(self.chunks)
        return PieceList(PermutedRows(self), COPY_WINDOW_ROWS)

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

    def take(self, permutation: np.ndarray, threads: int = 2) -> RecordStore:
        """A new store of one contiguous chunk whose row ``i`` is this store's
        row ``permutation[i]``, its columns gathered on ``threads`` threads."""
        if not self.chunks:
            return RecordStore(self.schema)
        chunk_of, row_of = self._sources(self.chunk_rows(permutation))
        columns: list[SlotColumn | None] = [None] * len(self.schema)

        def gather(i: int) -> None:
            parts = [c.columns[i] for c in self.chunks]
            columns[i] = gather_column(parts, chunk_of, row_of)

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
                sources[id(picked)] = self._sources(self.chunk_rows(picked))
            chunk_of, row_of = sources[id(picked)]
            columns.append(gather_column([c.columns[i] for c in self.chunks], chunk_of, row_of))
        return RecordStore(self.schema, [RecordChunk(tuple(columns), length)])

    def permute_columns(self, indices: list[int], permutation: np.ndarray) -> RecordStore:
        """A new store where, in the slots at ``indices``, row ``i`` holds the
        values of row ``permutation[i]``; the other slots are shared, not copied
        (and the order is kept)."""
        if not self.chunks:
            return RecordStore(self.schema)
        permutation = np.asarray(permutation, dtype=np.int64)
        if self.order is not None:
            # In the chunks' numbering: the chunks' row order[i] takes the
            # values of the chunks' row order[permutation[i]].
            in_chunks = np.empty_like(self.order)
            in_chunks[self.order] = np.take(self.order, permutation)
            permutation = in_chunks
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
        return RecordStore(self.schema, chunks, self.order)

    def to_arrow(self) -> pa.Table:
        """The records in the store's order as a ``pyarrow.Table``: values
        shared, not copied, when the store has no order; else copied, since
        Arrow's record batches hold consecutive rows."""
        batches = [chunk_to_record_batch(self.schema, c) for c in self.copy_pieces()]
        return pa.Table.from_batches(batches, schema=arrow_schema_of(self.schema))


def gather_threads_running() -> int:
    """The native threads of passes over shuffled stores running now (in no
    ``threading.enumerate()``): a process about to fork checks them."""
    return _shuffle.gather_threads_running()


class PermutedRows:
    """A store's rows in its order, gathered from its chunks on demand: the
    source that a shuffled store's batches are cut from.

    Attributes:
        rows: the rows of the store.
    """

    def __init__(self, store: RecordStore) -> None:
        if store.order is None:
            raise ValueError("PermutedRows of a store without an order: use its chunks")
        self.rows = len(store.order)
        self._order = store.order
        self._gather = _shuffle.RowGather(store.chunks, len(store.schema))

    @property
    def order(self) -> np.ndarray:
        """The store's order: its row ``i`` is the chunks' row ``order[i]``."""
        return self._order

    def window(self, start: int, stop: int) -> RecordChunk:
        """Rows ``start:stop`` as a new chunk, gathered without the GIL."""
        return chunk_of_columns(self._gather.gather(self._order[start:stop]), stop - start)

    def gather_ahead(self, threads: int) -> _shuffle.GatherAhead:
        """A gatherer of these rows on ``threads`` native threads: its
        ``submit(order[start:stop])`` starts one, its ``result()`` gives the
        rows' ``(values, offsets or None, width)`` per column (for
        ``chunk_of_columns``); ``close()`` it."""
        return _shuffle.GatherAhead(self._gather, threads)


def chunk_of_columns(
    columns: list[tuple[np.ndarray, np.ndarray | None, int]], rows: int
) -> RecordChunk:
    """A chunk of ``rows`` records from the ``(values, offsets or None,
    width)`` triples a gather gives."""
    return RecordChunk(
        tuple(SlotColumn(values, offsets, width) for values, offsets, width in columns), rows
    )


class PieceList(Sequence[RecordChunk]):
    """The rows of ``PermutedRows`` as consecutive chunks of ``window_rows``,
    each gathered when it is read (and not kept): a cache written from it
    holds one piece at a time (an Arrow table made of it holds them all)."""

    def __init__(self, rows: PermutedRows, window_rows: int) -> None:
        self._rows = rows
        self._window = max(1, window_rows)

    @property
    def rows(self) -> int:
        """The rows of all the pieces."""
        return self._rows.rows

    def layout(self) -> RecordChunk:
        """A chunk of no rows laid out as every piece is (which columns have
        offsets, and the widths of the others)."""
        return self._rows.window(0, 0)

    def __len__(self) -> int:
        return -(-self._rows.rows // self._window)

    @overload
    def __getitem__(self, index: int) -> RecordChunk: ...
    @overload
    def __getitem__(self, index: slice) -> list[RecordChunk]: ...
    def __getitem__(self, index: int | slice) -> RecordChunk | list[RecordChunk]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError(f"piece {index} of {len(self)}")
        start = (index % len(self)) * self._window
        return self._rows.window(start, min(start + self._window, self._rows.rows))


def gather_column(parts: list[SlotColumn], chunk_of: np.ndarray, row_of: np.ndarray) -> SlotColumn:
    """Row ``row_of[i]`` of part ``chunk_of[i]``, for every i, as one new
    column."""
    dtype = parts[0].values.dtype
    widths = {p.width for p in parts}
    if len(widths) == 1 and all(p.offsets is None for p in parts):
        width = parts[0].width
        values = np.empty(len(chunk_of) * width, dtype)
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
    offsets = np.empty(len(chunk_of) + 1, offsets_dtype(total))
    offsets[0] = 0
    np.cumsum(lengths, out=offsets[1:])
    values = np.empty(total, dtype)
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
