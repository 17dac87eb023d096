"""MultiSlot text to column chunks: the Python face of the Cython parser.

A MultiSlot line holds, for each slot in schema order, a value count and that
many values (``<n> v1 .. vn``), separated by spaces or tabs; a schema with text fields
(``SlotSchema.with_text_fields``: Paddle's ``parse_ins_id`` / ``parse_content``)
reads ``1 <ins_id>`` / ``1 <content>`` before the slots. ``ChunkParser``
parses a stream fed in pieces of any size, releasing the GIL while it works,
and hands out the parsed rows as ``RecordChunk`` objects. Every line is either
a record or, with ``skip_bad_lines=True``, a counted skip; otherwise a bad line
raises ``ParseError`` naming the source, line, slot and token.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from ..config.errors import SchemaError
from ..config.slots import SlotSchema
from ..records.arrow import chunk_to_record_batch
from ..records.columns import RecordChunk, SlotColumn
from . import _parse

__all__ = ["ChunkParser", "chunk_to_arrow", "parse_bytes"]

# Skip mode keeps the full message of this many bad lines for the logs.
MAX_BAD_LINE_MESSAGES = 10
DEFAULT_MAX_LINE_BYTES = 64 * 2**20


def _as_schema(schema: SlotSchema | Iterable[Any]) -> SlotSchema:
    return schema if isinstance(schema, SlotSchema) else SlotSchema(schema)


def _byte_view(data: Any) -> Any:
    """``data`` as something the engine's ``const unsigned char[::1]`` accepts."""
    if isinstance(data, (bytes, bytearray)):
        return data
    view = memoryview(data)
    # A view of another format ('c', 'b', 'i', ...) or shape is re-read as bytes;
    # cast() itself refuses a non-contiguous view with a clear TypeError.
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


class ChunkParser:
    """Parses one stream of MultiSlot text fed in pieces.

    Args:
        schema: the slots of a line, in order.
        source: where the text comes from, for error messages (a file name,
            or the command and the file).
        skip_bad_lines: count and skip malformed lines instead of raising.
        max_line_bytes: the longest line accepted (bytes before its b"\\n");
            bounds the memory a caller spends buffering one line.

    Attributes:
        lines: lines seen so far (records plus skipped lines).
        records: records parsed so far, including those already taken.
        skipped_lines: bad lines skipped (skip mode).
        skipped_reasons: skipped lines per reason, e.g. ``{"bad_count": 2}``;
            the reasons are ``blank_line``, ``missing_slot`` (the line ends
            before a slot), ``bad_count``, ``count_not_positive``,
            ``dense_count_mismatch``, ``too_few_values``, ``not_a_number``,
            ``float_in_integer_slot``, ``negative_uint64``, ``out_of_range``,
            ``trailing_tokens``, ``line_too_long`` and ``bad_text_field`` (a
            line without its ``1 <ins_id>`` / ``1 <content>``).
        bad_line_messages: the full error messages of the first few skipped lines.
        pending_rows: rows parsed but not yet taken.

    A ChunkParser is fed by one thread at a time; separate parsers run in
    parallel on separate threads.
    """

    def __init__(
        self,
        schema: SlotSchema | Iterable[Any],
        source: str,
        *,
        skip_bad_lines: bool = False,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    ) -> None:
        self.schema = _as_schema(schema)
        if len(self.schema) == 0:
            raise SchemaError("a MultiSlot parser needs at least one slot")
        if not isinstance(source, str):
            raise TypeError(f"source must be a str, got {type(source).__name__}")
        if isinstance(max_line_bytes, bool) or not isinstance(max_line_bytes, int):
            raise TypeError(f"max_line_bytes must be an int, got {max_line_bytes!r}")
        if max_line_bytes < 1:
            raise ValueError(f"max_line_bytes must be >= 1, got {max_line_bytes}")
        self.source = source
        self.skip_bad_lines = bool(skip_bad_lines)
        self.max_line_bytes = max_line_bytes
        self._engine = _parse.Engine(
            tuple(self.schema),
            source,
            self.skip_bad_lines,
            max_line_bytes,
            MAX_BAD_LINE_MESSAGES,
        )

    def feed(self, data: Any) -> int:
        """Parses every complete line (ending in b"\\n") of ``data``.

        Args:
            data: a C-contiguous bytes-like object (bytes, bytearray, memoryview).
                Its first byte continues where the last consumed byte left off.

        Returns:
            The number of bytes consumed: through the last b"\\n", 0 when there
            is none. The caller passes the rest again, followed by more data.
            (When skipping a line longer than ``max_line_bytes``, the parser
            consumes, and drops, everything up to that line's b"\\n".)

        Raises:
            ParseError: on a malformed line (unless skipping), or when the
                unconsumed rest is already longer than ``max_line_bytes``.
        """
        consumed: int = self._engine.feed(_byte_view(data), False)
        return consumed

    def feed_final(self, data: Any) -> None:
        """Parses the end of the stream.

        Args:
            data: the remaining bytes; a non-empty remainder without a final
                b"\\n" is a last line all the same.

        Raises:
            ParseError: on a malformed line (unless skipping).
        """
        self._engine.feed(_byte_view(data), True)

    @property
    def lines(self) -> int:
        return int(self._engine.lines)

    @property
    def records(self) -> int:
        return int(self._engine.records)

    @property
    def skipped_lines(self) -> int:
        return int(self._engine.skipped_lines)

    @property
    def skipped_reasons(self) -> dict[str, int]:
        return dict(self._engine.skipped_reasons)

    @property
    def bad_line_messages(self) -> list[str]:
        return list(self._engine.bad_line_messages)

    @property
    def pending_rows(self) -> int:
        return int(self._engine.pending_rows)

    def take_chunk(self) -> RecordChunk | None:
        """The rows parsed since the last take, or None when there are none.

        The parser's buffers are emptied (their capacity is kept). A sparse
        slot whose records all hold the same number k of values comes back
        with ``offsets=None`` and ``width=k``; its offsets are int32 (int64
        only if the chunk holds over 2**31 - 1 values of that slot).
        """
        taken = self._engine.take()
        if taken is None:
            return None
        rows, columns = taken
        return RecordChunk(
            columns=tuple(SlotColumn(v, o, w) for v, o, w in columns), rows=rows
        )


def _empty_chunk(schema: SlotSchema) -> RecordChunk:
    return RecordChunk(
        columns=tuple(
            SlotColumn(
                np.empty(0, dtype=s.numpy_dtype),
                None if s.is_dense else np.zeros(1, dtype=np.int32),
                s.width,
            )
            for s in schema
        ),
        rows=0,
    )


def parse_bytes(
    schema: SlotSchema | Iterable[Any],
    data: bytes,
    source: str = "<bytes>",
    *,
    skip_bad_lines: bool = False,
) -> RecordChunk:
    """Parses a whole MultiSlot text at once (for tests and tools).

    Lines of any length are accepted (``data`` is in memory already).

    Returns:
        Every record of ``data``; a chunk with 0 rows when it has no lines.

    Raises:
        ParseError: on the first malformed line, unless ``skip_bad_lines``.
    """
    schema = _as_schema(schema)
    parser = ChunkParser(
        schema, source, skip_bad_lines=skip_bad_lines, max_line_bytes=max(len(data), 1)
    )
    view = _byte_view(data)
    consumed = parser.feed(view)
    parser.feed_final(memoryview(view)[consumed:])
    chunk = parser.take_chunk()
    return chunk if chunk is not None else _empty_chunk(schema)


def chunk_to_arrow(
    schema: SlotSchema | Iterable[Any], chunk: RecordChunk
) -> pa.RecordBatch:
    """A chunk as an Arrow record batch, sharing the values' memory.

    A sparse slot becomes ``list<value type>`` (int32 offsets; ``large_list``
    when the chunk's offsets are int64); a dense slot ``fixed_size_list<value
    type>[width]``. Columns are named after the slots (``datafeed.records.arrow``).
    """
    return chunk_to_record_batch(_as_schema(schema), chunk, large=None)
