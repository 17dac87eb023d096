"""A shuffled InMemoryDataset gathers its batches: the same batches, in the same
order, as the records copied into that order would give, however the pass is
cut into gathered windows (``WINDOW_ROWS``), resumed or stopped.

The engine benchmark (benchmarks/run_engine.py) measures what this costs; here
only the values count: every slot, the instance ids and the contents.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support import SMALL_SCHEMA, small_line

from datafeed import InMemoryDataset
from datafeed.datasets import inmemory
from datafeed.records.store import RecordStore

RECORDS = 53  # 14 batches of 4, the last short


def _dataset(path: Path, **settings) -> InMemoryDataset:
    ds = InMemoryDataset()
    ds.init(use_var=SMALL_SCHEMA, **{"batch_size": 4, "seed": 7, **settings})
    ds.update_settings(parse_ins_id=True, parse_content=True)
    ds.set_filelist([str(path)])
    ds.load_into_memory()
    return ds


@pytest.fixture
def records(tmp_path: Path) -> Path:
    """Records with an instance id and a content field before their slots."""
    path = tmp_path / "part-0.txt"
    path.write_text(
        "".join(f"1 id-{i} 1 text{'x' * (i % 4)} {small_line(i)}" for i in range(RECORDS))
    )
    return path


def _batches(iterable) -> list[dict]:
    """Each batch as plain values: every slot, the ids and the contents."""
    out = []
    for batch in iterable:
        plain = {name: batch[name].tolist() for name in batch}
        plain["ins_ids"], plain["contents"] = batch.ins_ids, batch.contents
        out.append(plain)
    return out


def _copied_in_order(ds: InMemoryDataset) -> list[dict]:
    """The batches of the same records copied contiguously into the shuffled order."""
    store = ds._store
    copy = store.take(np.arange(store.rows), threads=1)
    assert copy.order is None and len(copy.chunks) == 1
    ds._store = copy
    try:
        return _batches(ds)
    finally:
        ds._store = store


@pytest.mark.parametrize("window_rows", [1, 4, 6, 1 << 20])
@pytest.mark.parametrize("thread_num", [1, 2])
def test_gathered_batches_equal_those_of_a_contiguous_copy(
    records: Path, monkeypatch: pytest.MonkeyPatch, window_rows: int, thread_num: int
) -> None:
    monkeypatch.setattr(inmemory, "WINDOW_ROWS", window_rows)
    ds = _dataset(records, thread_num=thread_num)
    ds.local_shuffle(seed=3)
    ds.local_shuffle(seed=4)  # orders compose
    first_chunk = ds._store.chunks[0]
    gathered = _batches(ds)
    assert ds._store.chunks[0] is first_chunk  # nothing was copied into the store
    assert gathered == _copied_in_order(ds)
    assert len(gathered) == 14 and sum(len(b["ins_ids"]) for b in gathered) == RECORDS
    ids = [i for b in gathered for i in b["ins_ids"]]
    assert sorted(ids) == sorted(f"id-{i}" for i in range(RECORDS)) and ids != sorted(ids)
    # A BatchPlan (Hogwild processes) gathers each batch as it is built.
    plan = ds.batch_plan()
    assert _batches(plan.build(n) for n in range(len(plan))) == gathered
    assert plan.order is ds._store.order


def test_a_resumed_pass_gathers_from_where_it_stopped(
    records: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inmemory, "WINDOW_ROWS", 12)  # 3 batches a window

    def second_epoch(stop: int | None) -> tuple[InMemoryDataset, list[dict]]:
        ds = _dataset(records)
        ds.local_shuffle(seed=5)
        _batches(ds)
        ds.local_shuffle(seed=6)
        seen = []
        for batch in ds:
            seen += _batches([batch])
            if len(seen) == stop:
                break
        return ds, seen

    _, whole = second_epoch(None)
    for stop in (1, 3, 5, 13):  # inside a window, at its end, past it, the last
        stopped, seen = second_epoch(stop)
        resumed = _dataset(records)
        resumed.load_state_dict(stopped.state_dict())  # replays both shuffles
        assert resumed.epoch == 1 and resumed.batches_consumed == stop
        assert seen + _batches(resumed) == whole


def test_a_shuffled_store_is_written_and_exported_in_its_order(
    records: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("datafeed.records.store.COPY_WINDOW_ROWS", 5)  # 11 pieces
    ds = _dataset(records)
    ds.local_shuffle(seed=9)
    table = ds.to_arrow()
    assert table.num_rows == RECORDS
    assert table.to_pylist() == RecordStore(
        ds._store.schema, ds._store.take(np.arange(RECORDS)).chunks
    ).to_arrow().to_pylist()
    cache = tmp_path / "records.arrow"
    ds.save_cache(cache)
    loaded = InMemoryDataset()
    loaded.init(use_var=SMALL_SCHEMA, batch_size=4)
    loaded.update_settings(parse_ins_id=True, parse_content=True)
    loaded.load_cache(cache)
    assert loaded.to_arrow().equals(table)
    assert _batches(loaded) == _batches(ds)
