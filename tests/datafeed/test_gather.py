"""A store with an order: a shuffle copies no record, and rows are gathered.

``RecordStore.reordered`` composes orders over the same chunks; ``RowGather``
and ``GatherAhead`` (native threads) gather picked rows of every column;
``gathered_ranges`` drives a pass. Every layout a column can have is here:
dense, sparse with int32 and int64 offsets, and offset-free sparse columns.
No torch: these run on every Python the package supports (``make smoke-oldest``).
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from test_columns import SCHEMA, chunk, rows_of

from datafeed.iterate.batcher import gathered_ranges
from datafeed.records._shuffle import GatherAhead, RowGather
from datafeed.records.store import PermutedRows, PieceList, RecordStore, gather_threads_running


def two_chunk_store() -> RecordStore:
    """10 records in chunks of every layout: int32, then int64 offsets."""
    return RecordStore(SCHEMA, [chunk("int32"), chunk("int64", first=10)])


def test_reordered_store_shares_its_chunks_and_composes_orders() -> None:
    store = two_chunk_store()
    expected = store.to_arrow().to_pylist()
    first = np.array([9, 0, 7, 2, 5, 1, 8, 3, 6, 4])
    second = np.array([1, 0, 3, 2, 5, 4, 7, 6, 9, 8])
    shuffled = store.reordered(first).reordered(second)
    assert all(a is b for a, b in zip(shuffled.chunks, store.chunks, strict=True))
    assert shuffled.order.tolist() == first[second].tolist()
    assert shuffled.to_arrow().to_pylist() == [expected[i] for i in first[second]]
    assert shuffled.nbytes == store.nbytes + 10 * 8  # the order: 8 bytes a record
    # take, permute_columns and take_per_column count in the store's order
    assert shuffled.take(np.array([0, 9])).to_arrow().to_pylist() == [
        expected[first[second][0]], expected[first[second][9]]
    ]
    permuted = shuffled.permute_columns([1], np.arange(10)[::-1])
    rows = permuted.to_arrow().to_pylist()
    in_order = shuffled.to_arrow().to_pylist()
    assert [r["ids"] for r in rows] == [r["ids"] for r in in_order[::-1]]
    assert [r["dense"] for r in rows] == [r["dense"] for r in in_order]
    assert permuted.order is shuffled.order
    picks = [np.array([3, 4]), np.array([4, 3]), np.array([3, 4])]
    mixed = shuffled.take_per_column(picks).to_arrow().to_pylist()
    assert [r["ids"] for r in mixed] == [in_order[4]["ids"], in_order[3]["ids"]]
    assert [r["dense"] for r in mixed] == [in_order[3]["dense"], in_order[4]["dense"]]


def test_records_appended_after_a_shuffle_follow_the_shuffled_ones() -> None:
    store = RecordStore(SCHEMA, [chunk("int32")]).reordered(np.array([4, 3, 2, 1, 0]))
    store.extend([chunk("int64", first=10)])
    rows = store.to_arrow().to_pylist()
    assert store.order.tolist() == [4, 3, 2, 1, 0, 5, 6, 7, 8, 9]
    assert [r["signed"] for r in rows] == [[-5], [-4], [-3], [-2], [-1]] + [
        [-11], [-12], [-13], [-14], [-15]
    ]


def test_an_order_must_cover_every_row() -> None:
    with pytest.raises(ValueError, match="an order of 3 rows for chunks of 10 rows"):
        RecordStore(SCHEMA, two_chunk_store().chunks, np.arange(3))
    with pytest.raises(ValueError, match="a permutation of 4 rows for 10 records"):
        two_chunk_store().reordered(np.arange(4))


def test_copy_pieces_gather_a_window_at_a_time() -> None:
    store = two_chunk_store().reordered(np.arange(10)[::-1])
    pieces = PieceList(PermutedRows(store), 4)
    assert len(pieces) == 3 and [p.rows for p in pieces] == [4, 4, 2]
    assert pieces[-1].rows == 2 and [p.rows for p in pieces[1:]] == [4, 2]
    with pytest.raises(IndexError):
        pieces[3]
    # the unshuffled store's pieces are its chunks, as they are
    assert two_chunk_store().copy_pieces()[0].rows == 5


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_row_gather_and_gather_ahead_equal_a_contiguous_take(threads: int) -> None:
    store = two_chunk_store()
    rows = np.array([9, 0, 7, 2, 5, 5, 8, 3], dtype=np.int64)  # a row twice: allowed
    expected = store.take(rows).chunks[0].columns
    gather = RowGather(store.chunks, len(SCHEMA))
    ahead = GatherAhead(gather, threads)
    try:
        for _ in range(2):  # the threads serve one gather after another
            ahead.submit(rows)
            for got in (gather.gather(rows), ahead.result()):
                for (values, offsets, width), want in zip(got, expected, strict=True):
                    assert values.tolist() == want.values.tolist()
                    assert (offsets is None) == (want.offsets is None)
                    if offsets is not None:
                        assert offsets.tolist() == want.offsets.tolist()
                        assert offsets.dtype == np.int32 and width == 0
                    else:
                        assert width == want.width
    finally:
        ahead.close()
    ahead.close()  # twice: nothing more to end
    with pytest.raises(RuntimeError, match="after close"):
        ahead.submit(rows)


def test_row_gather_refuses_rows_it_does_not_hold() -> None:
    gather = RowGather(two_chunk_store().chunks, len(SCHEMA))
    with pytest.raises(IndexError, match="row 10 picked, but the chunks hold 10 rows"):
        gather.gather(np.array([0, 10], dtype=np.int64))
    ahead = GatherAhead(gather, 2)
    with pytest.raises(IndexError, match="row -1 picked"):
        ahead.submit(np.array([-1], dtype=np.int64))
    with pytest.raises(RuntimeError, match="without a submit"):
        ahead.result()
    ahead.submit(np.array([1], dtype=np.int64))
    with pytest.raises(RuntimeError, match="before the last gather's result"):
        ahead.submit(np.array([1], dtype=np.int64))
    del ahead  # a gather under way: waited for, and the threads ended


def native_threads() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def gone(threads: set[str]) -> bool:
    """Whether every one of ``threads`` has left this process (an ended native
    thread leaves /proc a moment after it signalled its end; waits up to 5 s).
    Threads are named, not counted: one an earlier test started may come or
    go meanwhile."""
    deadline = time.monotonic() + 5
    while threads & native_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    return not threads & native_threads()


def test_gathered_ranges_end_their_threads_however_the_pass_ends() -> None:
    store = two_chunk_store().reordered(np.arange(10)[::-1])
    before, running = native_threads(), gather_threads_running()
    ranges = gathered_ranges(PermutedRows(store), 2, 3, gatherers=2)
    first = next(ranges)
    started = native_threads() - before
    assert gather_threads_running() == running + 2 and len(started) >= 2
    # rows 9, 8, ... skipping 2: rows 7, 6, 5, the second chunk's records 2, 1, 0
    assert first.chunk.rows == 3 and rows_of(first.chunk.columns[2]) == [[-13], [-12], [-11]]
    ranges.close()  # the consumer stopped early
    assert gather_threads_running() == running and gone(started)
    before = native_threads()
    remaining = gathered_ranges(PermutedRows(store), 2, 3, gatherers=2)
    pieces = [next(remaining)]
    started = native_threads() - before
    pieces += list(remaining)  # the pass ran to its end
    assert [p.stop for p in pieces] == [3, 3, 2]
    # the two gatherers took the windows in turn, and they come back in order
    signed = [v for p in pieces for v in rows_of(p.chunk.columns[2])]
    assert signed == [[-13], [-12], [-11], [-5], [-4], [-3], [-2], [-1]]
    assert len(started) >= 2 and gather_threads_running() == running and gone(started)


def test_gather_refuses_columns_it_does_not_hold_and_a_missing_source() -> None:
    gather = RowGather(two_chunk_store().chunks, len(SCHEMA))
    with pytest.raises(ValueError, match="columns -1:3 of 3 columns"):
        gather.gather(np.array([0], dtype=np.int64), -1)
    with pytest.raises(TypeError):
        GatherAhead(None, 2)


def test_an_order_is_read_only_and_the_running_gather_threads_are_counted() -> None:
    store = two_chunk_store().reordered(np.arange(10)[::-1])
    with pytest.raises(ValueError, match="read-only"):
        store.order[0] = 3
    before = gather_threads_running()  # another test's pass may not be collected yet
    ranges = gathered_ranges(PermutedRows(store), 0, 4, gatherers=2)
    next(ranges)
    assert gather_threads_running() == before + 2  # a fork now would copy their locks
    ranges.close()
    assert gather_threads_running() == before


def test_a_cache_of_a_shuffled_store_gathers_each_piece_once(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datafeed.records import store as store_module
    from datafeed.records.cache import write_cache

    shuffled = two_chunk_store().reordered(np.arange(10)[::-1])
    monkeypatch.setattr(store_module, "COPY_WINDOW_ROWS", 3)
    gathered = []
    window = PermutedRows.window

    def counted(self, start: int, stop: int):
        gathered.append(stop - start)
        return window(self, start, stop)

    monkeypatch.setattr(PermutedRows, "window", counted)
    write_cache(str(tmp_path / "records.arrow"), SCHEMA, shuffled.copy_pieces(), [], [], {})
    assert gathered == [0, 3, 3, 3, 1]  # the layout (no rows), then each piece once
