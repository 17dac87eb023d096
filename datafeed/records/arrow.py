"""The one codec between column chunks and Arrow.

Everything that turns records into Arrow or back goes through here: the
in-memory table (``to_arrow``), the parser's ``chunk_to_arrow``, the cache files
and global_shuffle's wire. A slot's Arrow type is fixed by its declaration:

- a dense slot is ``fixed_size_list<value>[width]``;
- a sparse slot is ``list<value>`` (int32 offsets), or ``large_list<value>``
  when a chunk's offsets are int64 (more than 2**31 values in one chunk).

A sparse column whose records all hold ``width`` values keeps no offsets in
memory (``SlotColumn.offsets is None``); Arrow needs them, so they are built at
encoding (``columns.uniform_offsets``), except on a wire that may carry such a
column as ``fixed_size_list`` (``uniform_sparse=True``), which saves 4 bytes per
record per slot. Decoding returns the offset-free layout again.

Encoding shares the values' memory (numpy -> Arrow is zero-copy); decoding
returns numpy views of the Arrow buffers, made by ``view`` (by default
read-only views; the cache passes writable views of its memory map).

Bytes from outside (a cache file, a peer's payload) are checked before any of
their memory is used as records: ``stream_batch`` and ``file_problem`` refuse
compressed bodies before decoding them, and ``batch_problem`` runs Arrow's full
validation and refuses what fleetfeed never writes (nulls, validity bitmaps,
buffers outside the bytes that were read).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable

import numpy as np
import pyarrow as pa

from ..config.slots import Slot, SlotSchema
from .columns import RecordChunk, SlotColumn

BufferView = Callable[[pa.Buffer, np.dtype, int, int], np.ndarray]


def value_type(slot: Slot) -> pa.DataType:
    """The Arrow type of one value of ``slot`` (int64, uint64 or float32)."""
    return pa.from_numpy_dtype(slot.numpy_dtype)


def arrow_type(slot: Slot) -> pa.DataType:
    """The declared Arrow type of a slot's column."""
    if slot.is_dense:
        return pa.list_(value_type(slot), slot.width)
    return pa.list_(value_type(slot))


def arrow_schema_of(schema: SlotSchema) -> pa.Schema:
    """The Arrow schema of records of ``schema``: one non-null column per slot."""
    return pa.schema([pa.field(s.name, arrow_type(s), nullable=False) for s in schema])


# -- encoding ------------------------------------------------------------------------


def column_to_arrow(column: SlotColumn, slot: Slot, *, uniform_sparse: bool = False,
                    large: bool | None = None) -> pa.Array:
    """One column as an Arrow array over the same memory (offsets built if missing).

    Args:
        uniform_sparse: an offset-free sparse column becomes ``fixed_size_list``
            of its width instead of a ``list`` (for a wire that accepts both).
        large: int64 offsets give ``large_list`` (True), are narrowed to the
            declared ``list`` (False: the records must fit), or follow the
            offsets (None: ``large_list`` exactly when they are int64).
    """
    values = pa.array(column.values, type=value_type(slot))  # zero-copy
    if slot.is_dense or (uniform_sparse and column.offsets is None):
        return pa.FixedSizeListArray.from_arrays(values, column.width)
    offsets = column.offsets_or_uniform()
    if offsets.dtype == np.int32:
        return pa.ListArray.from_arrays(pa.array(offsets), values)
    array = pa.LargeListArray.from_arrays(pa.array(offsets), values)
    return array if large in (None, True) else array.cast(arrow_type(slot))


def chunk_to_record_batch(schema: SlotSchema, chunk: RecordChunk, *,
                          uniform_sparse: bool = False, large: bool | None = False,
                          ) -> pa.RecordBatch:
    """A chunk as a record batch, one column per slot, sharing the values' memory.

    With the defaults the batch has exactly ``arrow_schema_of(schema)``; see
    ``column_to_arrow`` for ``uniform_sparse`` and ``large``.
    """
    if len(chunk.columns) != len(schema):
        raise ValueError(
            f"the chunk has {len(chunk.columns)} columns but the schema {len(schema)} slots"
        )
    arrays = [
        column_to_arrow(column, slot, uniform_sparse=uniform_sparse, large=large)
        for slot, column in zip(schema, chunk.columns, strict=True)
    ]
    fields = [pa.field(s.name, a.type, nullable=False) for s, a in zip(schema, arrays, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


# -- checking what came in -------------------------------------------------------------


def schema_problem(schema: SlotSchema, found: pa.Schema | Iterable[pa.Field], *,
                   uniform_sparse: bool = False) -> str | None:
    """What is wrong with the slot columns of ``found``, or None.

    Each slot's column must have its name and value type; a dense slot must be
    ``fixed_size_list`` of its width; a sparse slot ``list`` (or, with
    ``uniform_sparse``, ``fixed_size_list`` of any width). Columns after the
    slots are the caller's to check.
    """
    fields = list(found)
    if len(fields) < len(schema):
        return f"{len(fields)} columns, expected {len(schema)} slots"
    for slot, field in zip(schema, fields, strict=False):  # columns past the slots: not ours
        kind = field.type
        if field.name != slot.name:
            return f"column {field.name!r} where slot {slot.name!r} was expected"
        if pa.types.is_fixed_size_list(kind):
            ok = kind.value_type == value_type(slot) and (
                kind.list_size == slot.width if slot.is_dense
                else uniform_sparse and kind.list_size > 0
            )
        else:
            ok = (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and (
                not slot.is_dense and kind.value_type == value_type(slot)
            )
        if not ok:
            return f"slot {slot.name!r} of type {kind}, expected {slot!r}"
    return None


# Field numbers of Arrow's IPC flatbuffers (format/Message.fbs): Message.header,
# and RecordBatch.compression (present only when the body is compressed).
_MESSAGE_HEADER = 2
_RECORD_BATCH_COMPRESSION = 3


def _flatbuffer_field(data: bytes, table: int, index: int) -> int | None:
    """Where field ``index`` of the flatbuffer table at ``table`` lies, or None if absent."""
    vtable = table - struct.unpack_from("<i", data, table)[0]
    vtable_size = struct.unpack_from("<H", data, vtable)[0]
    entry = 4 + 2 * index
    if entry + 2 > vtable_size:
        return None
    offset = struct.unpack_from("<H", data, vtable + entry)[0]
    return table + offset if offset else None


def is_compressed(message: pa.ipc.Message) -> bool:
    """Whether a record batch message says its body is compressed (zstd, lz4).

    Read from the message's header alone: decoding a compressed body would
    allocate and fill as many bytes as the writer claims, before any check.
    """
    data = message.metadata.to_pybytes()  # verified by Arrow when it read the message
    try:
        header = _flatbuffer_field(data, struct.unpack_from("<I", data, 0)[0], _MESSAGE_HEADER)
        if header is None:
            return False
        header += struct.unpack_from("<I", data, header)[0]
        return _flatbuffer_field(data, header, _RECORD_BATCH_COMPRESSION) is not None
    except struct.error:
        raise ValueError("a message header that cannot be read") from None


def batch_problem(batch: pa.RecordBatch, memory: tuple[int, int] | None = None) -> str | None:
    """What is wrong with a record batch read from outside, or None.

    Arrow's full validation (offsets in order and within the values, lengths,
    null counts), then what fleetfeed never writes: nulls, validity bitmaps,
    and, given ``memory`` (address and size of the bytes the batch was read
    from), buffers elsewhere, as a compressed body decodes into.
    """
    try:
        batch.validate(full=True)
    except (pa.ArrowException, OSError) as error:
        return f"Arrow's validation failed: {error}"
    start, size = memory if memory is not None else (0, 0)
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        arrays = [column] if pa.types.is_primitive(column.type) else [column, column.values]
        for array in arrays:
            if array.null_count or array.buffers()[0] is not None:
                return f"column {name!r} has a validity bitmap (fleetfeed writes no nulls)"
            for buffer in array.buffers()[1:]:
                if memory is not None and buffer is not None and buffer.size and not (
                    start <= buffer.address and buffer.address + buffer.size <= start + size
                ):
                    return (
                        f"column {name!r} has a buffer outside the bytes read (a "
                        "compressed body?); expected uncompressed Arrow IPC"
                    )
    return None


def _memory_of(data: np.ndarray | pa.Buffer) -> tuple[int, int]:
    if isinstance(data, np.ndarray):
        return data.ctypes.data, data.nbytes
    return data.address, data.size


def stream_batch(data: np.ndarray | pa.Buffer,
                 schema_check: Callable[[pa.Schema], str | None]) -> pa.RecordBatch:
    """The one record batch of the Arrow IPC stream ``data``, checked before use.

    The stream must hold a schema that ``schema_check`` accepts (it returns
    what is wrong, or None), one uncompressed record batch that passes
    ``batch_problem``, and nothing more, not even bytes after its end.
    Memory is shared with ``data``.

    Raises:
        ValueError: what was expected and what was found.
    """
    buffer = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    source = pa.BufferReader(buffer)
    try:
        reader = pa.ipc.MessageReader.open_stream(source)
        messages = []
        for _ in range(3):  # a schema, one record batch, the end
            messages.append(reader.read_next_message())
    except StopIteration:
        pass
    except (pa.ArrowException, OSError) as error:
        raise ValueError(f"not a readable Arrow IPC stream ({error})") from None
    kinds = [m.type for m in messages]
    if kinds != ["schema", "record batch"]:
        raise ValueError(
            f"messages {kinds}, expected a schema and one record batch (then the end)"
        )
    if source.tell() != buffer.size:  # a size announced larger than the stream
        raise ValueError(
            f"{buffer.size - source.tell()} bytes after the end of the stream, expected none"
        )
    # Arrow reports a malformed message as ArrowInvalid or as OSError (a length
    # that runs past the bytes read): both are the bytes' fault, not ours.
    try:
        arrow_schema = pa.ipc.read_schema(messages[0])
    except (pa.ArrowException, OSError) as error:
        raise ValueError(f"an unreadable schema ({error})") from None
    problem = schema_check(arrow_schema)
    if problem is not None:
        raise ValueError(problem)
    if is_compressed(messages[1]):
        raise ValueError("a compressed record batch, expected uncompressed Arrow IPC")
    try:
        batch = pa.ipc.read_record_batch(messages[1], arrow_schema)
    except (pa.ArrowException, OSError) as error:
        raise ValueError(f"an unreadable record batch ({error})") from None
    problem = batch_problem(batch, _memory_of(data))
    if problem is not None:
        raise ValueError(problem)
    return batch


def file_problem(data: pa.Buffer) -> str | None:
    """What is wrong with the messages of the Arrow IPC file ``data``, or None.

    Its record batches must be uncompressed, and it must hold no dictionaries;
    read from the message headers only, before any batch is decoded.
    """
    magic = b"ARROW1\0\0"
    if data.size < len(magic) or data.slice(0, len(magic)).to_pybytes() != magic:
        return "no Arrow IPC file signature"
    try:
        reader = pa.ipc.MessageReader.open_stream(pa.BufferReader(data.slice(len(magic))))
        for number, message in enumerate(reader):
            if message.type not in ("schema", "record batch"):
                return f"message {number} is a {message.type}, expected record batches"
            if message.type == "record batch" and is_compressed(message):
                return (
                    f"message {number} is a compressed record batch, expected "
                    "uncompressed Arrow IPC"
                )
    except (pa.ArrowException, OSError) as error:
        return f"unreadable messages ({error})"
    return None


# -- decoding ------------------------------------------------------------------------


def readonly_view(buffer: pa.Buffer, dtype: np.dtype, offset: int, length: int) -> np.ndarray:
    """``length`` items of ``dtype`` from item ``offset`` of an Arrow buffer (no copy)."""
    return np.frombuffer(buffer, dtype=dtype, count=length, offset=offset * dtype.itemsize)


def column_from_arrow(array: pa.Array, slot: Slot, *, width: int | None = None,
                      view: BufferView = readonly_view) -> SlotColumn:
    """A column of ``array`` (checked by ``schema_problem``) as numpy views of it.

    Args:
        width: what the writer recorded of a sparse column's layout: ``None``
            finds out (records that all hold the same number of values lose
            their offsets, as the parser makes them); a number says every
            record holds that many values (checked: ``ValueError`` if not);
            0 keeps the offsets.
        view: makes the numpy views of the Arrow buffers.
    """
    dtype = slot.numpy_dtype
    rows = len(array)
    if rows == 0:  # (an empty array may come without buffers)
        width = slot.width if slot.is_dense else 0
        return SlotColumn(np.empty(0, dtype), None if width else np.zeros(1, np.int32), width)
    child = array.values
    child_buffer = child.buffers()[1]
    if pa.types.is_fixed_size_list(array.type):
        size = array.type.list_size
        start = array.offset * size + child.offset
        return SlotColumn(view(child_buffer, dtype, start, rows * size), None, size)
    offsets_dtype = np.dtype(np.int64 if pa.types.is_large_list(array.type) else np.int32)
    offsets = view(array.buffers()[1], offsets_dtype, array.offset, rows + 1)
    first, last = int(offsets[0]), int(offsets[-1])
    if last < first:
        raise ValueError(f"slot {slot.name!r}: its offsets run backwards ({first} .. {last})")
    values = view(child_buffer, dtype, child.offset + first, last - first)
    if width is None:
        lengths = np.diff(offsets)
        width = int(lengths[0]) if rows and (lengths == lengths[0]).all() else 0
    elif width and rows and not bool((np.diff(offsets) == width).all()):
        raise ValueError(
            f"slot {slot.name!r} is recorded as {width} values per record, but its "
            "offsets disagree"
        )
    if width:  # every record holds `width` values: no offsets, as from the parser
        return SlotColumn(values, None, width)
    return SlotColumn(values, offsets - first if first else offsets, 0)


def chunk_from_record_batch(schema: SlotSchema, batch: pa.RecordBatch, *,
                            widths: list[int] | None = None,
                            view: BufferView = readonly_view) -> RecordChunk:
    """The slot columns of ``batch`` (checked by ``schema_problem``) as a chunk.

    ``widths``: per slot, the ``width`` argument of ``column_from_arrow``.
    """
    columns = tuple(
        column_from_arrow(batch.column(i), slot, view=view,
                          width=None if widths is None else widths[i])
        for i, slot in enumerate(schema)
    )
    return RecordChunk(columns, batch.num_rows)


__all__ = [
    "arrow_schema_of", "arrow_type", "batch_problem", "chunk_from_record_batch",
    "chunk_to_record_batch", "column_from_arrow", "column_to_arrow", "file_problem",
    "is_compressed", "readonly_view", "schema_problem", "stream_batch", "value_type",
]
