"""Unit tests of the column layer: chunks, the Arrow codec, the store and batches.

Every layout a slot column can have is exercised: dense, sparse with int32
offsets, sparse with int64 offsets (more than 2**31 values in one chunk; made
here by hand on small data, since the rule that picks int64 would need 8 GiB),
and offset-free sparse columns whose records all hold the same number of values.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from datafeed import Slot
from datafeed.config.slots import SlotSchema
from datafeed.iterate.batch import BatchBuilder
from datafeed.records.arrow import (
    arrow_schema_of,
    chunk_from_record_batch,
    chunk_to_record_batch,
    column_from_arrow,
    schema_problem,
)
from datafeed.records.columns import (
    RecordChunk,
    SlotColumn,
    concat_columns,
    concat_rows,
    offsets_dtype,
    uniform_offsets,
)
from datafeed.records.store import RecordStore

SCHEMA = SlotSchema(
    [Slot("dense", "float32", (2,)), Slot("ids", "uint64"), Slot("signed", "int64")]
)
IDS = [[1], [2, 3], [], [4, 5, 6], [2**64 - 1]]
SIGNED = [[-1], [-2], [-3], [-4], [-5]]  # all of width 1: stored offset-free


def ragged(rows: list[list[int]], dtype: str, offsets: str | None) -> SlotColumn:
    """A sparse column of ``rows`` with offsets of ``offsets`` dtype, or offset-free."""
    values = np.array([v for row in rows for v in row], dtype=dtype)
    if offsets is None:
        (width,) = {len(r) for r in rows}
        return SlotColumn(values, None, width)
    bounds = np.zeros(len(rows) + 1, dtype=offsets)
    np.cumsum([len(r) for r in rows], out=bounds[1:])
    return SlotColumn(values, bounds, 0)


def chunk(offsets: str = "int32", first: int = 0) -> RecordChunk:
    """Records ``first..first+4`` of the test data, sparse offsets of ``offsets``."""
    dense = np.arange(first * 2, first * 2 + 10, dtype=np.float32)
    return RecordChunk(
        (
            SlotColumn(dense, None, 2),
            ragged(IDS, "uint64", offsets),
            ragged([[v - first] for (v,) in SIGNED], "int64", None),
        ),
        5,
    )


def rows_of(column: SlotColumn) -> list[list]:
    bounds = column.offsets_or_uniform()
    return [column.values[bounds[i] : bounds[i + 1]].tolist() for i in range(column.rows)]


# -- chunks and columns ----------------------------------------------------------------


def test_offsets_dtype_is_int32_up_to_2_31_minus_1_values() -> None:
    assert offsets_dtype(0) == np.int32
    assert offsets_dtype(2**31 - 1) == np.int32
    assert offsets_dtype(2**31) == np.int64


def test_uniform_offsets() -> None:
    assert uniform_offsets(3, 2).tolist() == [0, 2, 4, 6]
    assert uniform_offsets(3, 2).dtype == np.int32
    assert uniform_offsets(2, 0).tolist() == [0, 0, 0]
    assert uniform_offsets(1, 2, np.dtype(np.int64)).dtype == np.int64


@pytest.mark.parametrize("offsets", ["int32", "int64"])
def test_slice_rebases_offsets_and_keeps_their_width(offsets: str) -> None:
    column = ragged(IDS, "uint64", offsets)
    part = column.slice(1, 4)
    assert rows_of(part) == IDS[1:4]
    assert part.offsets.tolist() == [0, 2, 2, 5]
    assert part.offsets.dtype == np.dtype(offsets)
    assert np.shares_memory(part.values, column.values)
    uniform = ragged(SIGNED, "int64", None).slice(2, 5)
    assert uniform.offsets is None and rows_of(uniform) == SIGNED[2:5]


def test_concat_keeps_offset_free_layout_only_when_widths_agree() -> None:
    a, b = ragged([[1], [2]], "int64", None), ragged([[3], [4]], "int64", None)
    joined = concat_columns([a, b])
    assert joined.offsets is None and rows_of(joined) == [[1], [2], [3], [4]]
    wide = ragged([[5, 6]], "int64", None)
    mixed = concat_columns([a, wide, ragged([[7], [8, 9]], "int64", "int64")])
    assert rows_of(mixed) == [[1], [2], [5, 6], [7], [8, 9]]
    assert mixed.offsets.dtype == np.int32  # narrowed: 9 values


def test_concat_rows_of_several_chunks() -> None:
    joined = concat_rows([(chunk(), 3, 5), (chunk("int64", first=10), 0, 2)])
    assert joined.rows == 4
    assert rows_of(joined.columns[1]) == IDS[3:5] + IDS[0:2]
    assert rows_of(joined.columns[2]) == [[-4], [-5], [-11], [-12]]
    assert joined.columns[0].values.tolist() == [6, 7, 8, 9, 20, 21, 22, 23]


# -- the Arrow codec -----------------------------------------------------------------


@pytest.mark.parametrize("offsets", ["int32", "int64"])
def test_codec_round_trip(offsets: str) -> None:
    original = chunk(offsets)
    batch = chunk_to_record_batch(SCHEMA, original)
    assert batch.schema == arrow_schema_of(SCHEMA)  # large offsets narrowed to list
    assert batch.column(1).to_pylist() == IDS
    assert batch.column(2).to_pylist() == SIGNED
    back = chunk_from_record_batch(SCHEMA, batch)
    for got, want in zip(back.columns, original.columns, strict=True):
        assert rows_of(got) == rows_of(want)
    assert back.columns[2].offsets is None and back.columns[2].width == 1


def test_codec_keeps_large_list_when_asked() -> None:
    batch = chunk_to_record_batch(SCHEMA, chunk("int64"), large=None)
    assert pa.types.is_large_list(batch.schema.field("ids").type)
    decoded = column_from_arrow(batch.column(1), SCHEMA[1])
    assert decoded.offsets.dtype == np.int64 and rows_of(decoded) == IDS


def test_codec_wire_form_carries_uniform_sparse_columns_without_offsets() -> None:
    batch = chunk_to_record_batch(SCHEMA, chunk(), uniform_sparse=True)
    assert batch.schema.field("signed").type == pa.list_(pa.int64(), 1)
    assert schema_problem(SCHEMA, batch.schema) is not None
    assert schema_problem(SCHEMA, batch.schema, uniform_sparse=True) is None
    back = chunk_from_record_batch(SCHEMA, batch)
    assert back.columns[2].offsets is None and rows_of(back.columns[2]) == SIGNED


def test_codec_decodes_sliced_arrays() -> None:
    batch = chunk_to_record_batch(SCHEMA, chunk()).slice(1, 3)
    back = chunk_from_record_batch(SCHEMA, batch)
    assert rows_of(back.columns[1]) == IDS[1:4]
    assert back.columns[1].offsets.tolist() == [0, 2, 2, 5]
    assert back.columns[0].values.tolist() == [2, 3, 4, 5, 6, 7]


def test_codec_checks_recorded_widths_and_offsets() -> None:
    batch = chunk_to_record_batch(SCHEMA, chunk())
    with pytest.raises(ValueError, match="'ids' is recorded as 1 values per record"):
        chunk_from_record_batch(SCHEMA, batch, widths=[2, 1, 1])
    # As a peer or a file could send it: an IPC stream whose offsets were changed.
    good = pa.record_batch([pa.array([[7, 8, 9]], pa.list_(pa.uint64()))], names=["ids"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, good.schema) as writer:
        writer.write_batch(good)
    wire = sink.getvalue().to_pybytes()
    at = wire.rindex(np.array([0, 3], np.int32).tobytes())  # the body's offsets
    patched = wire[:at] + np.array([3, 1], np.int32).tobytes() + wire[at + 8 :]
    backwards = pa.ipc.open_stream(patched).read_next_batch().column(0)
    with pytest.raises(ValueError, match="offsets run backwards"):
        column_from_arrow(backwards, SCHEMA[1])


def test_schema_problems_name_the_slot() -> None:
    assert schema_problem(SCHEMA, arrow_schema_of(SCHEMA)) is None
    other = SlotSchema([SCHEMA[0], Slot("ids", "int64"), SCHEMA[2]])
    assert "slot 'ids' of type list<item: uint64>" in schema_problem(
        other, arrow_schema_of(SCHEMA)
    )
    renamed = SlotSchema([SCHEMA[0], Slot("other", "uint64"), SCHEMA[2]])
    assert "column 'ids' where slot 'other'" in schema_problem(
        renamed, arrow_schema_of(SCHEMA)
    )
    assert schema_problem(SCHEMA, list(arrow_schema_of(SCHEMA))[:2]) == (
        "2 columns, expected 3 slots"
    )


# -- the store -----------------------------------------------------------------------


@pytest.mark.parametrize("threads", [1, 2])
def test_store_take_gathers_across_offset_widths(threads: int) -> None:
    store = RecordStore(SCHEMA, [chunk("int32"), chunk("int64", first=10)])
    expected = store.to_arrow().to_pylist()
    permutation = np.array([9, 0, 7, 2, 5, 1, 8, 3, 6, 4])
    shuffled = store.take(permutation, threads=threads)
    assert shuffled.rows == 10 and len(shuffled.chunks) == 1
    assert shuffled.to_arrow().to_pylist() == [expected[i] for i in permutation]
    ids = shuffled.chunks[0].columns[1]
    assert ids.offsets.dtype == np.int32  # the output's own width: 14 values
    assert shuffled.chunks[0].columns[2].offsets is None  # width-1 slot stays offset-free


def test_store_permute_columns_moves_only_the_named_slots() -> None:
    store = RecordStore(SCHEMA, [chunk(), chunk("int64", first=10)])
    before = store.to_arrow().to_pylist()
    permutation = np.arange(10)[::-1]
    permuted = store.permute_columns([1], permutation)
    after = permuted.to_arrow().to_pylist()
    assert [r["ids"] for r in after] == [before[i]["ids"] for i in permutation]
    assert [r["dense"] for r in after] == [r["dense"] for r in before]
    assert [c.rows for c in permuted.chunks] == [5, 5]
    assert permuted.chunks[0].columns[0] is store.chunks[0].columns[0]  # shared


def test_store_of_nothing() -> None:
    empty = RecordStore(SCHEMA)
    assert empty.rows == 0 and empty.take(np.arange(0)).rows == 0
    assert empty.to_arrow().num_rows == 0


# -- batches -------------------------------------------------------------------------


@pytest.mark.parametrize("offsets", ["int32", "int64"])
def test_batch_from_one_chunk(offsets: str) -> None:
    batch = BatchBuilder(SCHEMA).from_chunk(chunk(offsets), 1, 4)
    assert batch.size == 3
    assert batch["dense"].tolist() == [[2, 3], [4, 5], [6, 7]]
    ids = batch["ids"]
    assert str(ids.offsets.dtype) == "torch.int64"
    assert ids.offsets.tolist() == [0, 2, 2, 5]
    assert ids.tolist() == IDS[1:4]
    signed = batch["signed"]  # offset-free in the store: offsets built, int64
    assert signed.offsets.tolist() == [0, 1, 2, 3] and signed.tolist() == SIGNED[1:4]


def test_batch_delivers_uint64_bits_as_int64() -> None:
    batch = BatchBuilder(SCHEMA).from_chunk(chunk(), 4, 5)
    assert batch["ids"].values.tolist() == [-1]  # 2**64 - 1, the same bits


def test_batch_across_chunks_of_different_offset_widths() -> None:
    pieces = [(chunk("int64"), 3, 5), (chunk("int32", first=10), 0, 1)]
    batch = BatchBuilder(SCHEMA).from_pieces(pieces)
    assert batch.size == 3
    assert batch["ids"].tolist() == [[4, 5, 6], [-1], [1]]  # uint64 bits as int64
    assert batch["signed"].tolist() == [[-4], [-5], [-11]]


def test_store_take_mixes_offset_free_and_int64_offsets_parts() -> None:
    with_offsets = RecordChunk(
        (
            chunk().columns[0],
            ragged(IDS, "uint64", "int64"),
            ragged([[1], [2, 3], [], [4, 5, 6], [-7]], "int64", "int64"),
        ),
        5,
    )
    offset_free = chunk(first=10)  # its "signed" slot: offset-free, width 1
    store = RecordStore(SCHEMA, [offset_free, with_offsets])
    permutation = np.array([5, 0, 9, 1, 6])
    shuffled = store.take(permutation)
    signed = shuffled.chunks[0].columns[2]
    assert rows_of(signed) == [[1], [-11], [-7], [-12], [2, 3]]
    assert signed.offsets.dtype == np.int32
