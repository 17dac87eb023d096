"""The batching stage of both dataset kinds: row ranges of record chunks in,
``Batch`` objects of ``batch_size`` records out.

``InMemoryDataset`` feeds it the chunks of its store, ``QueueDataset`` the
chunks its readers stream. A batch is usually a view of one chunk; one that
straddles a chunk boundary is copied together from several pieces. A shuffled
store's rows are gathered: a pass gathers windows of them ahead on threads
(``gathered_ranges``), and a ``BatchPlan`` gathers each batch as it is built.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple, Protocol

from ..config.errors import SchemaError
from ..config.slots import SlotSchema
from ..records.columns import RecordChunk
from ..records.store import PermutedRows, chunk_of_columns
from .batch import Batch, BatchBuilder

# Rows a pass gathers at a time from a shuffled store (rounded up to whole
# batches): about 1 MB of Criteo-sized records, which stays in cache until its
# batches are built. On 1M Criteo-layout records, 2 cores, batch 512, three
# gatherers of one thread: 2048-row windows 5.3 M records/s, 4096 5.5 M, 8192
# 5.3 M; three windows gathered ahead beat one window split over two threads
# (4.2 M), whose threads idle while the batches before are built.
WINDOW_ROWS = 4096


class Piece(NamedTuple):
    """Rows ``start:stop`` of ``chunk`` (records, or a shuffled store's rows
    gathered when the batch is built); ``source`` tags where the chunk came
    from (a QueueDataset's reader task, for its position; 0 otherwise)."""

    chunk: RecordChunk | PermutedRows
    start: int
    stop: int
    source: int = 0


class Counter(Protocol):
    """What the batcher counts the batches it hands out into (datafeed/iterate/position.py)."""

    batches: int

    def count(self, pieces: list[Piece]) -> None:
        """One batch made of ``pieces`` is handed out."""


def chunk_ranges(chunks: Iterable[RecordChunk], skip_rows: int = 0) -> Iterator[Piece]:
    """Every row of ``chunks`` in order, as one piece per chunk, after the first
    ``skip_rows`` rows."""
    for chunk in chunks:
        if skip_rows >= chunk.rows:
            skip_rows -= chunk.rows
            continue
        yield Piece(chunk, skip_rows, chunk.rows)
        skip_rows = 0


def gathered_ranges(
    rows: PermutedRows, skip_rows: int, window_rows: int, gatherers: int
) -> Iterator[Piece]:
    """The rows of a shuffled store after the first ``skip_rows``, as chunks of
    ``window_rows``, gathered ahead: ``gatherers`` native threads take the
    next windows in turn, so that while the batches of one window are handed
    out, the following ``gatherers`` are gathered. The threads end with the
    generator, however it ends."""
    starts = range(skip_rows, rows.rows, max(1, window_rows))
    if not starts:
        return
    ahead = [rows.gather_ahead(1) for _ in range(max(1, min(gatherers, len(starts))))]
    try:
        for number in range(len(ahead)):
            ahead[number].submit(rows.order[starts[number] : starts[number] + window_rows])
        for number, start in enumerate(starts):
            stop = min(start + window_rows, rows.rows)
            gatherer = ahead[number % len(ahead)]
            columns = gatherer.result()
            following = number + len(ahead)
            if following < len(starts):
                gatherer.submit(rows.order[starts[following] : starts[following] + window_rows])
            yield Piece(chunk_of_columns(columns, stop - start), 0, stop - start)
    finally:
        for gatherer in ahead:
            gatherer.close()


class Batcher:
    """Cuts row ranges into batches of ``batch_size`` records of one schema.

    Args:
        schema: the slots (and text fields) of the records.
        batch_size: records per batch.
        drop_last: whether a short last batch is left out.
        input_type: Paddle's ``input_type``: 0, one record per line; 1, one
            batch per line (each value of a sparse slot is a sequence of its
            own), which needs ``batch_size`` 1 as in Paddle.

    Raises:
        SchemaError: ``input_type=1`` with a ``batch_size`` other than 1.
    """

    def __init__(
        self, schema: SlotSchema, batch_size: int, drop_last: bool, input_type: int = 0
    ) -> None:
        if input_type == 1 and batch_size != 1:
            # Paddle fails the first batch of several lines ("In batch reader, the
            # sparse tensor lod size must be 2"); here, before the pass starts.
            raise SchemaError(
                f"input_type=1 (one batch per line) needs batch_size=1, got "
                f"batch_size={batch_size}: each line is a whole batch"
            )
        self.schema = schema
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.input_type = input_type
        self._builder = BatchBuilder(schema, one_batch_per_line=input_type == 1)

    def group(self, ranges: Iterable[Piece]) -> Iterator[list[Piece]]:
        """The pieces making up each batch, in the order of ``ranges``."""
        size = self.batch_size
        pieces: list[Piece] = []
        wanted = size
        for chunk, row, stop, source in ranges:
            while row < stop:
                take = min(wanted, stop - row)
                pieces.append(Piece(chunk, row, row + take, source))
                row += take
                wanted -= take
                if wanted == 0:
                    yield pieces
                    pieces, wanted = [], size
        if pieces and not self.drop_last:
            yield pieces

    def build(self, pieces: list[Piece]) -> Batch:
        """The batch of ``pieces``: a view of one chunk, or the pieces copied
        together (a shuffled store's rows: gathered)."""
        return self._builder.from_pieces([
            (chunk.window(start, stop), 0, stop - start) if isinstance(chunk, PermutedRows)
            else (chunk, start, stop)
            for chunk, start, stop, _ in pieces
        ])

    def batches(
        self, ranges: Iterable[Piece], counter: Counter, limit: int | None = None
    ) -> Iterator[Batch]:
        """The batches of ``ranges``, each counted into ``counter`` before it is
        yielded; with ``limit``, none once ``counter.batches`` reaches it."""
        for pieces in self.group(ranges):
            if limit is not None and counter.batches >= limit:
                break
            counter.count(pieces)
            yield self.build(pieces)


class BatchPlan:
    """A pass's batches, each built on demand by its number: how a trainer
    hands batches to forked processes (trainer/loop/hogwild_processes.py), which
    build them from the records they share with the parent.

    ``finish()`` counts every batch into the dataset's position and ends the
    pass, as iterating to the end would; a pass that fails is not finished.
    """

    def __init__(
        self, batcher: Batcher, groups: list[list[Piece]], position: Counter | None,
        sources: list[RecordChunk | PermutedRows] | None = None,
    ) -> None:
        self.batcher = batcher
        self._groups = groups
        self._position = position  # None: a copy of the plan in another process
        self.sources = sources or []

    @property
    def order(self) -> Any:
        """The row order of the shuffled store the batches are gathered from
        (an int64 array, for ``attach_store``), or None."""
        permuted = [s for s in self.sources if isinstance(s, PermutedRows)]
        return permuted[0].order if permuted else None

    def pieces(self) -> list[list[tuple[int, int, int]]]:
        """Each batch's pieces as ``(index in sources, start, stop)``: the plan
        for a process that holds the same records (``of_pieces`` with its
        store's ``row_sources()``)."""
        index = {id(chunk): i for i, chunk in enumerate(self.sources)}
        return [[(index[id(p.chunk)], p.start, p.stop) for p in group] for group in self._groups]

    @classmethod
    def of_pieces(
        cls, batcher: Batcher, chunks: list[RecordChunk | PermutedRows],
        pieces: list[list[Any]],
    ) -> BatchPlan:
        """The plan that ``pieces()`` described, over this process's ``chunks``
        (it counts no position: ``finish`` is the planning process's)."""
        groups = [[Piece(chunks[c], start, stop) for c, start, stop in group] for group in pieces]
        return cls(batcher, groups, None)

    def __len__(self) -> int:
        return len(self._groups)

    def build(self, number: int) -> Batch:
        """Batch ``number`` (0-based) of the pass."""
        return self.batcher.build(self._groups[number])

    def finish(self) -> None:
        """Every batch was handed out: the pass ends."""
        if self._position is None:
            raise RuntimeError("a plan copied from another process ends there, not here")
        for pieces in self._groups:
            self._position.count(pieces)
        end_pass = getattr(self._position, "end_pass", None)
        if end_pass is not None:
            end_pass()
