"""Base and delta saves of sparse tables (``trainer.ps.checkpoint.table_files``).

A base then three deltas, with shrink and budget eviction in between, reload
(onto 1 and 3 servers from 2) to tables identical in rows, optimizer state,
statistics and the absence of dropped rows; a corrupt delta is refused before
any table changes; a dense file whose save fails midway leaves the older file
and no temporary one; saving a 1M-row table stays under 1.2x the table's bytes of
peak memory growth (a subprocess); the reader and the CLI need no job.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from trainer.embedding import pending, stores
from trainer.job.errors import CheckpointError
from trainer.job.role import ClusterRole
from trainer.nn import SparseEmbedding
from trainer.ps import OptimizerSpec, ParameterServerRuntime
from trainer.ps.checkpoint import directory as checkpoint
from trainer.ps.checkpoint import table_files
from trainer.ps.tables.entries import CountFilterEntry, CtrAccessorParam
from trainer.ps.tables.table import SparseTable, as_u64, shard_of

NAME, DIM = "saves", 4
ADAGRAD = OptimizerSpec("adagrad", {"lr": 0.1})
REPO = Path(__file__).resolve().parents[2]


def make_tables(server_num: int, max_rows: int | None = None) -> list[SparseTable]:
    accessor = CtrAccessorParam(delete_after_unseen_days=1, delete_threshold=0.0)
    return [SparseTable(NAME, DIM, ADAGRAD, seed=3, accessor=accessor,
                        max_rows=max_rows) for _ in range(server_num)]


def train(tables: list[SparseTable], rng: np.random.Generator, ids: np.ndarray) -> None:
    """One batch: pulls and pushes ``ids`` on the servers that own them, with clicks."""
    ids = as_u64(np.unique(ids))
    owners = shard_of(ids, len(tables))
    for s, table in enumerate(tables):
        mine = ids[owners == s]
        table.pull(mine)
        grads = rng.normal(size=(mine.shape[0], DIM)).astype(np.float32)
        table.push(mine, grads)
        table.add_clicks(mine, (rng.random(mine.shape[0]) < 0.3).astype(np.float32))


def save(tables: list[SparseTable], dirname: Path, kind: str, after: str | None) -> str:
    """What save_persistables does with servers: every shard, then meta.json."""
    staging = checkpoint.staging_dir(str(dirname))
    for s, table in enumerate(tables):
        table_files.write_shard(table, staging, s, delta=kind == "delta")
    save_id = uuid.uuid4().hex
    meta = {"format": checkpoint.FORMAT, "kind": kind, "save_id": save_id, "after": after,
            "server_num": len(tables), "mode": "async", "tables": {NAME: {"dim": DIM}},
            "dense": []}
    checkpoint.commit(staging, str(dirname), meta)
    return save_id


def load(tables: list[SparseTable], dirname: Path) -> None:
    """What each server's load does: check every file, then apply its part."""
    meta = checkpoint.read_meta(str(dirname))
    checked = [table_files.read_tables(str(dirname), meta, {NAME: t}) for t in tables]
    for s, files in enumerate(checked):
        table_files.load_tables(files, owns=lambda ids, s=s: shard_of(ids, len(tables)) == s)


def contents(tables: list[SparseTable]) -> dict[int, tuple]:
    """Every row: weights, Adagrad sums, show, click, passes unseen; each on its owner."""
    out: dict[int, tuple] = {}
    for s, table in enumerate(tables):
        state = table.state_dict()
        ids = as_u64(state["ids"].numpy())
        assert (shard_of(ids, len(tables)) == s).all()
        stats = table.statistics(ids)
        for k, row in enumerate(ids.tolist()):
            out[row] = (state["weights"][k].tolist(), state["state.sum"][k].tolist(),
                        float(stats["show"][k]), float(stats["click"][k]),
                        int(stats["unseen_passes"][k]))
    return out


def test_a_base_and_three_deltas_reload_to_the_same_table(tmp_path):
    rng = np.random.default_rng(0)
    writers = make_tables(2, max_rows=300)  # 300 rows a server: the budget evicts
    universe = rng.integers(1, 2**63, 2000)
    train(writers, rng, universe[:500])
    saves = [save(writers, tmp_path / "base", "base", None)]
    dropped_total = 0
    for day in range(1, 4):
        for table in writers:
            table.set_pass(day)
        for _ in range(2):
            train(writers, rng, rng.choice(universe[: 500 + 300 * day], 150, replace=False))
        if day == 2:
            dropped_total += sum(t.shrink()[0] for t in writers)  # unseen for a pass
        dropped_total += sum(len(t.dropped_ids()) for t in writers)
        saves.append(save(writers, tmp_path / f"delta{day}", "delta", saves[-1]))
    assert dropped_total > 100 and sum(t.evicted for t in writers) > 0
    expected = contents(writers)
    delta_rows = [m["rows"] for m in table_files.summary(str(tmp_path / "delta3"))["tables"]
                  .values()]
    assert 0 < delta_rows[0] < len(expected)  # a delta holds the changed rows only
    for server_num in (2, 1, 3):
        readers = make_tables(server_num)
        for part in ("base", "delta1", "delta2", "delta3"):
            load(readers, tmp_path / part)
        assert contents(readers) == expected, f"{server_num} servers"
    # Without the deltas the dropped rows would still be there.
    readers = make_tables(1)
    load(readers, tmp_path / "base")
    assert set(contents(readers)) != set(expected)


def test_an_id_dropped_twice_between_saves_leaves_a_delta_that_loads(tmp_path):
    accessor = CtrAccessorParam(delete_after_unseen_days=0)
    writer = SparseTable(NAME, DIM, ADAGRAD, seed=3, accessor=accessor)
    ids = as_u64(np.arange(1, 11))
    writer.pull(ids)
    base = save([writer], tmp_path / "base", "base", None)
    for day in (1, 2):  # id 5 unseen: dropped, pulled again, dropped again
        writer.set_pass(day)
        writer.pull(ids[ids != 5])
        assert writer.shrink()[0] == 1
        writer.pull(ids[ids == 5])
    writer.set_pass(3)
    writer.pull(ids[ids != 5])
    writer.shrink()
    assert sorted(writer.dropped_ids().tolist()) == [5, 5, 5]
    save([writer], tmp_path / "delta", "delta", base)
    listed = pa.ipc.open_file(table_files.dropped_file(str(tmp_path / "delta"), NAME, 0))
    assert listed.read_all().column(0).to_pylist() == [5]  # once
    reader = SparseTable(NAME, DIM, ADAGRAD, seed=3, accessor=accessor)
    for part in ("base", "delta"):
        load([reader], tmp_path / part)
    assert contents([reader]) == contents([writer]) and 5 not in contents([reader])

    class OlderWriter:  # listed an id each time it was dropped
        def __init__(self, table):
            self.table = table

        def __getattr__(self, name):
            return getattr(self.table, name)

        def export_rows(self, *args, **kwargs):
            dropped, unchanged = self.table.export_rows(*args, **kwargs)
            return np.concatenate([dropped, dropped]), unchanged

    writer.pull(ids[ids == 5])
    writer.set_pass(4)
    writer.pull(ids[ids != 5])
    writer.shrink()
    staging = checkpoint.staging_dir(str(tmp_path / "older"))
    table_files.write_shard(OlderWriter(writer), staging, 0, delta=True)
    checkpoint.commit(staging, str(tmp_path / "older"), {
        "format": checkpoint.FORMAT, "kind": "delta", "save_id": uuid.uuid4().hex,
        "after": None, "server_num": 1, "mode": "async", "tables": {NAME: {"dim": DIM}},
        "dense": []})
    load([reader], tmp_path / "older")
    assert contents([reader]) == contents([writer]) and 5 not in contents([reader])


def test_a_dense_save_while_another_worker_pushes_holds_one_moment(tmp_path):
    import threading
    import time

    from trainer.ps.server import ParameterServer

    param = torch.nn.Parameter(torch.zeros(1_000_000))
    server = ParameterServer(0, 1, 2, "async", {}, [param],
                             torch.optim.Adam([param], lr=1e-3))
    stop = threading.Event()

    def pushing() -> None:  # another worker, in async mode
        while not stop.is_set():
            server.push({}, {0: torch.ones(1_000_000)})

    pusher = threading.Thread(target=pushing)
    pusher.start()
    try:
        while not server.dense_optimizer.state:  # the first push has begun
            time.sleep(0.01)
        for k in range(4):
            (tmp_path / str(k)).mkdir()
            server.save(str(tmp_path / str(k)), "base")
            saved = checkpoint.load_file(checkpoint.dense_file(str(tmp_path / str(k)), 0))
            state = saved["optimizer"]["state"][0]
            # A constant gradient of 1 moves Adam's parameter by lr a step.
            steps = round(-float(saved["params"][0][0]) / 1e-3)
            assert steps == int(state["step"]) and steps > 0, k
            assert bool((state["exp_avg"] == state["exp_avg"][0]).all()), k  # not torn
    finally:
        stop.set()
        pusher.join()


def test_a_delta_after_a_decaying_shrink_holds_the_decayed_statistics(tmp_path):
    accessor = CtrAccessorParam(show_click_decay_rate=0.5)
    writer = SparseTable(NAME, DIM, ADAGRAD, seed=3, accessor=accessor)
    ids = as_u64(np.arange(1, 11))
    for _ in range(4):
        writer.pull(ids)
    writer.add_clicks(ids, np.ones(10, dtype=np.float32))
    base = save([writer], tmp_path / "base", "base", None)
    writer.set_pass(1)
    writer.pull(ids[:2])
    assert writer.shrink() == (0, 10)  # every row's show and click halved
    save([writer], tmp_path / "delta", "delta", base)
    reader = SparseTable(NAME, DIM, ADAGRAD, seed=3, accessor=accessor)
    for part in ("base", "delta"):
        load([reader], tmp_path / part)
    assert contents([reader]) == contents([writer])
    assert writer.statistics(ids)["click"].tolist() == [0.5] * 10


def test_passes_set_with_no_pull_between_keep_each_rows_last_pass(tmp_path):
    writer = SparseTable(NAME, DIM, ADAGRAD, seed=3)
    one, two = as_u64(np.array([1])), as_u64(np.array([2]))
    writer.set_pass(1)
    writer.pull(one)
    writer.set_pass(2)
    writer.pull(two)
    save([writer], tmp_path / "base", "base", None)
    assert writer.statistics(as_u64(np.array([1, 2])))["unseen_passes"].tolist() == [1, 0]
    # A job that starts its passes before it loads (no pull between them).
    reader = SparseTable(NAME, DIM, ADAGRAD, seed=3)
    reader.set_pass(1)
    reader.set_pass(2)
    load([reader], tmp_path / "base")
    assert contents([reader]) == contents([writer])
    save([reader], tmp_path / "again", "base", None)
    seen = [int(p) for columns in table_files.read_table(str(tmp_path / "again"), NAME)
            for p in columns["last_seen_pass"]]
    assert seen == [1, 2]


def test_a_pass_set_past_the_saved_passes_before_a_load_keeps_each_rows_last_pass(tmp_path):
    # A daily job that sets today's pass, then loads yesterday's base: the
    # saved passes it skipped start in their place, so rows still age out (they
    # counted from today, and shrink never dropped them).
    accessor = CtrAccessorParam(delete_after_unseen_days=3, delete_threshold=0.0)
    writer = SparseTable(NAME, DIM, ADAGRAD, seed=3, accessor=accessor)
    for day in (1, 5, 9):
        writer.set_pass(day)
        writer.pull(as_u64(np.arange(100 * day, 100 * day + 10)))
    save([writer], tmp_path / "base", "base", None)
    other = SparseTable(NAME, DIM, ADAGRAD, seed=3, accessor=accessor)
    other.mark_saved()  # a delta counts from a save
    other.set_pass(7)
    other.pull(as_u64(np.arange(700, 710)))
    save([other], tmp_path / "delta", "delta", None)  # rows of a pass between 5 and 9

    reader = SparseTable(NAME, DIM, ADAGRAD, seed=3, accessor=accessor,
                         entry=CountFilterEntry(2))
    reader.set_pass(3)
    reader.pull(as_u64(np.arange(30, 35)))  # seen once in pass 3: waiting
    reader.set_pass(10)
    reader.pull(as_u64(np.arange(1000, 1003)))  # seen once in pass 10: waiting
    load([reader], tmp_path / "base")
    for _ in range(2):
        reader.pull(as_u64(np.arange(2000, 2002)))  # admitted in pass 10
    load([reader], tmp_path / "delta")  # pass 7 starts among the passes known
    probe = as_u64(np.array([100, 500, 700, 900, 2000]))
    assert reader.statistics(probe)["unseen_passes"].tolist() == [9, 5, 3, 1, 0]
    assert contents([reader])[500][:4] == contents([writer])[500][:4]  # the writer is at pass 9
    # The ids waiting kept their passes: pass 3's age out, pass 10's stay.
    reader.shrink()
    reader.pull(as_u64(np.array([30, 1000])))  # admits 1000 (seen twice), not 30 (once)
    assert reader.statistics(as_u64(np.array([30, 1000])))["show"].tolist() == [-1.0, 2.0]
    save([reader], tmp_path / "again", "base", None)
    seen = sorted({int(p) for columns in table_files.read_table(str(tmp_path / "again"), NAME)
                   for p in columns["last_seen_pass"]})
    assert seen == [7, 9, 10]  # days 1 and 5 aged out (more than 3 passes unseen)


class _Unsaveable:
    """A value torch.save cannot pickle: the save fails after its file was begun."""

    def __reduce__(self):
        raise RuntimeError("this value cannot be saved")


def test_a_dense_save_that_fails_midway_keeps_the_older_file_and_no_temporary_file(tmp_path):
    path = checkpoint.dense_file(str(tmp_path), 0)
    checkpoint.save_file({"params": [torch.ones(3)]}, path)
    with pytest.raises(RuntimeError, match="this value cannot be saved"):
        checkpoint.save_file({"params": [torch.zeros(3)], "optimizer": _Unsaveable()}, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dense.shard0.pt"]
    assert torch.equal(checkpoint.load_file(path)["params"][0], torch.ones(3))


def test_a_corrupt_delta_is_refused_before_any_change(tmp_path):
    rng = np.random.default_rng(1)
    writers = make_tables(2)
    train(writers, rng, rng.integers(1, 2**63, 400))
    base = save(writers, tmp_path / "base", "base", None)
    for table in writers:
        table.set_pass(1)
    train(writers, rng, rng.integers(1, 2**63, 100))
    writers[0].shrink()
    save(writers, tmp_path / "delta", "delta", base)
    readers = make_tables(2)
    load(readers, tmp_path / "base")
    before = contents(readers)
    # The second shard's rows: a byte flipped in the middle of a record batch's data.
    rows = tmp_path / "delta" / f"sparse.{NAME}.shard1.arrow"
    data = bytearray(rows.read_bytes())
    data[len(data) // 2] ^= 0xFF
    rows.write_bytes(bytes(data))
    cases = {
        "flipped": None,
        "truncated": lambda p: p.write_bytes(p.read_bytes()[:200]),
        "dropped-missing": lambda p: p.with_name(f"sparse.{NAME}.shard1.dropped.arrow").unlink(),
    }
    for case, corrupt in cases.items():
        if corrupt is not None:
            save(writers, tmp_path / case, "delta", base)  # another delta, then broken
            corrupt(tmp_path / case / f"sparse.{NAME}.shard1.arrow")
        with pytest.raises(CheckpointError, match=r"shard1\.(dropped\.)?arrow"):
            load(readers, tmp_path / (case if corrupt else "delta"))
        assert contents(readers) == before, case


def test_a_wrong_column_is_named(tmp_path):
    writers = make_tables(1)
    train(writers, np.random.default_rng(2), np.arange(1, 50))
    save(writers, tmp_path / "base", "base", None)
    path = tmp_path / "base" / f"sparse.{NAME}.shard0.arrow"
    table = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
    table = table.set_column(5, "click", pa.array(np.zeros(len(table)), pa.float64()))
    with pa.OSFile(str(path), "wb") as out, pa.ipc.new_file(out, table.schema) as writer:
        writer.write_table(table)
    with pytest.raises(CheckpointError, match=r"expected the columns .*click: float not null, "
                                              r".* found .*click: double"):
        load(make_tables(1), tmp_path / "base")


def test_the_old_torch_format_is_refused_by_name(tmp_path):
    (tmp_path / "meta.json").write_text(json.dumps(
        {"format": "fleetfeed-ps/1", "server_num": 1, "tables": {}, "dense": []}))
    with pytest.raises(CheckpointError, match=r"'fleetfeed-ps/1' .* is no longer read"):
        checkpoint.read_meta(str(tmp_path))


def test_paddle_modes_and_the_delta_chain(tmp_path):
    assert [checkpoint.save_kind(m) for m in (0, 1, "base", "delta")] == [
        "base", "delta", "base", "delta"]
    with pytest.raises(ValueError, match="xbox base"):
        checkpoint.save_kind(2)
    model, runtime = local_job("chain")
    try:
        with pytest.raises(CheckpointError, match="save a base"):
            runtime.save_persistables(str(tmp_path / "d0"), mode=1)
        model["emb"](torch.tensor([[1, 2, 3]]))
        runtime.save_persistables(str(tmp_path / "b"), mode=0)
        model["emb"](torch.tensor([[4]]))
        runtime.save_persistables(str(tmp_path / "d1"), mode=1)
        model["emb"](torch.tensor([[5]]))
        runtime.save_persistables(str(tmp_path / "d2"), mode=1)
        info = table_files.summary(str(tmp_path / "d1"))
        assert info["kind"] == "delta" and info["tables"]["chain"]["rows"] == 1
        with pytest.raises(CheckpointError, match="load its base and the deltas before it"):
            runtime.load_persistables(str(tmp_path / "d1"))  # the job is at d2
        runtime.load_persistables(str(tmp_path / "b"))
        with pytest.raises(CheckpointError, match="load its base and the deltas before it"):
            runtime.load_persistables(str(tmp_path / "d2"))
        runtime.load_persistables(str(tmp_path / "d1"))
        runtime.load_persistables(str(tmp_path / "d2"))
        assert len(stores.local_store().tables["chain"]) == 5
    finally:
        stores.local_store().clear()
        pending.clear_pending()


def test_a_checkpoint_between_deltas_leaves_the_chain_whole(tmp_path):
    # The online loop's order: each pass saves its delta, then a whole
    # checkpoint to restart from. Nothing changes between the two, so the next
    # delta follows both, and serving loads the base and every delta in order.
    model, runtime = local_job("chain")

    def meta(name: str) -> dict:
        return checkpoint.read_meta(str(tmp_path / name))

    try:
        model["emb"](torch.tensor([[1, 2, 3]]))
        runtime.save_persistables(str(tmp_path / "base"), mode=0)
        for pass_id, new_id in ((1, 4), (2, 5), (3, 6)):
            model["emb"](torch.tensor([[new_id]]))
            runtime.save_persistables(str(tmp_path / f"delta-{pass_id}"), mode=1)
            runtime.save_persistables(str(tmp_path / str(pass_id)), mode=0)
            assert checkpoint.state_of(meta(str(pass_id))) == checkpoint.state_of(
                meta(f"delta-{pass_id}"))
        assert meta("delta-2")["after"] == checkpoint.state_of(meta("delta-1"))
        # Training between two saves makes the later one a state of its own,
        # and so do a shrink (it decays statistics even when it drops nothing)
        # and a new pass.
        model["emb"](torch.tensor([[7]]))
        runtime.save_persistables(str(tmp_path / "4"), mode=0)
        assert checkpoint.state_of(meta("4")) == meta("4")["save_id"] != checkpoint.state_of(
            meta("3"))
        for name, change in (("shrunk", runtime.shrink), ("next-day", lambda: runtime.set_pass(2))):
            runtime.save_persistables(str(tmp_path / f"same-{name}"), mode=0)  # nothing changed
            assert checkpoint.state_of(meta(f"same-{name}")) != meta(f"same-{name}")["save_id"]
            change()
            runtime.save_persistables(str(tmp_path / name), mode=0)
            assert checkpoint.state_of(meta(name)) == meta(name)["save_id"], name
        last = runtime_tables()
        stores.local_store().clear()
        reader = ParameterServerRuntime(ClusterRole.local(), None)
        reader.distributed_optimizer(torch.optim.Adagrad(model.parameters(), lr=0.1))
        for name in ("base", "delta-1", "delta-2", "delta-3"):
            reader.load_persistables(str(tmp_path / name))
        assert sorted(runtime_tables()["chain"]) == [1, 2, 3, 4, 5, 6]
        # A restart from a pass's checkpoint goes on with the next delta.
        stores.local_store().clear()
        reader = ParameterServerRuntime(ClusterRole.local(), None)
        reader.distributed_optimizer(torch.optim.Adagrad(model.parameters(), lr=0.1))
        reader.load_persistables(str(tmp_path / "2"))
        reader.load_persistables(str(tmp_path / "delta-3"))
        assert runtime_tables()["chain"] == {k: v for k, v in last["chain"].items() if k != 7}
    finally:
        stores.local_store().clear()
        pending.clear_pending()


def test_a_failed_save_leaves_the_state_unknown(tmp_path, monkeypatch, caplog):
    # A save that did not commit has marked its rows saved: the next save must
    # not claim the state of the save before it, nor a delta follow that one.
    model, runtime = local_job("chain")
    try:
        model["emb"](torch.tensor([[1, 2]]))
        runtime.save_persistables(str(tmp_path / "base"), mode=0)
        model["emb"](torch.tensor([[3]]))

        def refuse(*args, **kwargs):
            raise OSError("disk full")

        with monkeypatch.context() as patched:
            patched.setattr(checkpoint, "commit", refuse)
            with pytest.raises(OSError, match="disk full"):
                runtime.save_persistables(str(tmp_path / "failed"), mode=0)
        runtime._save_failed = False  # as in a worker restarted since: only the state knows
        with caplog.at_level("WARNING", logger="trainer.ps.runtime"):
            runtime.save_persistables(str(tmp_path / "after"), mode=1)
        assert "writing a base" in caplog.text
        after = checkpoint.read_meta(str(tmp_path / "after"))
        assert after["kind"] == "base" and after["after"] is None
        assert checkpoint.state_of(after) == after["save_id"]
        assert checkpoint.state_of(after) != checkpoint.state_of(
            checkpoint.read_meta(str(tmp_path / "base")))
        # Committed again: the next delta follows it.
        runtime.save_persistables(str(tmp_path / "next"), mode=1)
        assert checkpoint.read_meta(str(tmp_path / "next"))["after"] == after["save_id"]
    finally:
        stores.local_store().clear()
        pending.clear_pending()


def test_a_base_replaces_the_rows_and_a_delta_over_unknown_rows_is_not_claimed(
    tmp_path, caplog
):
    model, runtime = local_job("kept")
    try:
        model["emb"](torch.tensor([[1, 2]]))
        runtime.save_persistables(str(tmp_path / "base"), mode=0)
        saved = runtime_tables()
        model["emb"](torch.tensor([[3, 4]]))
        runtime.save_persistables(str(tmp_path / "delta"), mode=1)
        # A base loaded over rows it lacks leaves its rows only: the deltas
        # after it then describe the tables.
        runtime.load_persistables(str(tmp_path / "base"))
        assert runtime_tables() == saved
        model["emb"](torch.tensor([[5]]))
        runtime.save_persistables(str(tmp_path / "after"), mode=1)
        after = checkpoint.read_meta(str(tmp_path / "after"))
        assert after["kind"] == "delta" and after["after"] == checkpoint.read_meta(
            str(tmp_path / "base"))["save_id"]
        # A delta loaded over rows of unknown state (a fresh job that trained
        # first) does not make them the delta's: the next delta is a base.
        stores.local_store().clear()
        other = ParameterServerRuntime(ClusterRole.local(), None)
        other.distributed_optimizer(torch.optim.Adagrad(model.parameters(), lr=0.1))
        model["emb"](torch.tensor([[9]]))
        other.load_persistables(str(tmp_path / "delta"))
        with caplog.at_level("WARNING", logger="trainer.ps.runtime"):
            other.save_persistables(str(tmp_path / "next"), mode=1)
        assert "a delta was loaded over rows of unknown state); writing a base" in caplog.text
        assert checkpoint.read_meta(str(tmp_path / "next"))["kind"] == "base"
    finally:
        stores.local_store().clear()
        pending.clear_pending()


def test_every_file_of_a_checkpoint_is_on_disk_before_it_is_committed(tmp_path, monkeypatch):
    # A done file lists a checkpoint once it is committed: after a power loss
    # that checkpoint must be whole, so each of its files, meta.json and its
    # folder reach the disk before the rename that commits it, and the rename
    # reaches it with the parent folder.
    import os

    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(descriptor):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{descriptor}")))
        return real_fsync(descriptor)

    def replace(source, target, **kwargs):
        events.append(("replace", os.path.abspath(target)))
        return real_replace(source, target, **kwargs)

    from datafeed.source import fs

    real_exchange = fs.exchange_paths

    def exchange(first, second):  # a checkpoint replaced in one step
        events.append(("replace", os.path.abspath(second)))
        return real_exchange(first, second)

    model, runtime = local_job("durable")
    try:
        model["emb"](torch.tensor([[1, 2, 3]]))
        runtime.save_persistables(str(tmp_path / "base"), mode=0)
        model["emb"](torch.tensor([[4]]))
        for name, mode in (("delta", 1), ("base", 0)):  # the second replaces a checkpoint
            events.clear()
            with monkeypatch.context() as patched:
                patched.setattr(os, "fsync", fsync)
                patched.setattr(os, "replace", replace)
                patched.setattr(fs, "exchange_paths", exchange)
                runtime.save_persistables(str(tmp_path / name), mode=mode)
            target = str(tmp_path / name)
            committed = events.index(("replace", target))
            # A file written whole (write_atomically) is synced under its
            # temporary name, ".<name>.<hex>.tmp", then renamed.
            synced = {
                re.sub(r"/\.([^/]+)\.[0-9a-f]{32}\.tmp$", r"/\1", path)
                for kind, path in events[:committed] if kind == "fsync"
            }
            staging = {os.path.dirname(p) for p in synced if os.path.basename(p) == "meta.json"}
            assert len(staging) == 1, events
            files = {os.path.basename(p) for p in synced if os.path.dirname(p) in staging}
            expected = {"meta.json", "dense.shard0.pt", "sparse.durable.shard0.arrow"}
            if mode == 1:
                expected.add("sparse.durable.shard0.dropped.arrow")
            assert files == expected, events
            assert staging <= synced  # the folder's entries
            assert ("fsync", str(tmp_path)) in events[committed:]  # the rename
    finally:
        stores.local_store().clear()
        pending.clear_pending()


def test_a_save_never_deletes_what_is_not_a_checkpoint(tmp_path):
    """A save replaces its directory whole: one that holds anything but a
    checkpoint's files is refused, before any work and again at the commit,
    and left as it was."""
    model, runtime = local_job("guarded")
    try:
        model["emb"](torch.tensor([[1, 2, 3]]))
        saved = tmp_path / "ckpt"
        runtime.save_persistables(str(saved), {"dataset_state.json": b"{}"})
        own = tmp_path / "output"
        own.mkdir()
        (own / "notes.txt").write_text("mine")
        (own / "logs").mkdir()
        with pytest.raises(CheckpointError, match=r"2 entries .*'logs/', 'notes.txt'"):
            runtime.save_persistables(str(own))
        assert sorted(p.name for p in own.iterdir()) == ["logs", "notes.txt"]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "output"]  # no staging
        # Refused before anything was written: the next delta still follows the base.
        runtime.save_persistables(str(tmp_path / "delta"), mode=1)
        assert json.loads((tmp_path / "delta" / "meta.json").read_text())["kind"] == "delta"
        a_file = tmp_path / "a_file"
        a_file.write_text("mine")
        with pytest.raises(CheckpointError, match="expected a directory.*found a file"):
            runtime.save_persistables(str(a_file))
        assert a_file.read_text() == "mine"
        # A checkpoint (with the workers' positions, which fleet adds) is replaced,
        # and one with an extra file by a save that writes it again.
        runtime.save_persistables(str(saved))
        runtime.save_persistables(str(tmp_path / "extra"), {"extra.json": b"{}"})
        runtime.save_persistables(str(tmp_path / "extra"), {"extra.json": b"[]"})
        assert (tmp_path / "extra" / "extra.json").read_bytes() == b"[]"
        assert "dataset_state.json" not in {p.name for p in saved.iterdir()}
        # A file that appears while a save writes is found at the commit.
        staging = checkpoint.staging_dir(str(saved))
        (saved / "model.pt").write_bytes(b"a local save")
        with pytest.raises(CheckpointError, match="'model.pt'"):
            checkpoint.commit(staging, str(saved), {"save": "late"})
        assert (saved / "model.pt").read_bytes() == b"a local save"
        assert json.loads((saved / "meta.json").read_text())["kind"] == "base"
    finally:
        stores.local_store().clear()
        pending.clear_pending()


def local_job(table: str) -> tuple[torch.nn.ModuleDict, ParameterServerRuntime]:
    """A model with one SparseEmbedding table and its local runtime (Adagrad)."""
    model = torch.nn.ModuleDict({"emb": SparseEmbedding(DIM, table),
                                 "out": torch.nn.Linear(DIM, 1)})
    runtime = ParameterServerRuntime(ClusterRole.local(), None)
    runtime.distributed_optimizer(torch.optim.Adagrad(model.parameters(), lr=0.1))
    return model, runtime


def runtime_tables() -> dict[str, dict[int, list[float]]]:
    """The local tables' rows by id (weights as lists)."""
    out = {}
    for name, table in stores.local_store().tables.items():
        state = table.state_dict()
        out[name] = {int(i): w.tolist() for i, w in zip(state["ids"], state["weights"],
                                                        strict=True)}
    return out


def test_the_reader_and_the_cli_need_no_job(tmp_path):
    rng = np.random.default_rng(4)
    writers = make_tables(2)
    train(writers, rng, np.arange(1, 101))
    save(writers, tmp_path / "base", "base", None)
    batches = list(table_files.read_table(str(tmp_path / "base"), NAME))
    ids = np.concatenate([b["ids"] for b in batches])
    assert sorted(ids.tolist()) == sorted(as_u64(np.arange(1, 101)).tolist())
    assert all(b["weights"].shape == (len(b["ids"]), DIM) for b in batches)
    result = subprocess.run(
        [sys.executable, "-m", "trainer.ps.checkpoint.table_files", str(tmp_path / "base")],
        capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert f"{NAME}: 100 rows, dim {DIM}, optimizer adagrad, show 100" in result.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "trainer.ps.checkpoint.table_files", str(tmp_path / "nothing")],
        capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
    )
    assert bad.returncode == 1 and "meta.json is missing" in bad.stderr


MEMORY_SCRIPT = textwrap.dedent("""
    import json, sys, uuid
    import numpy as np
    from trainer.ps import OptimizerSpec
    from trainer.ps.checkpoint import directory as checkpoint
    from trainer.ps.checkpoint import table_files
    from trainer.ps.tables.table import SparseTable

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024

    table = SparseTable("big", 8, OptimizerSpec("adagrad", {"lr": 0.1}))
    ids = np.arange(1, 1_000_001, dtype=np.int64)
    for start in range(0, ids.shape[0], 200_000):
        table.pull(ids[start:start + 200_000])
    table_bytes = table.stats()["bytes"]
    # A small save first: the code a first save loads (pyarrow's IPC writer,
    # its allocator) is not a cost of the table's size.
    warm = SparseTable("warm", 8, OptimizerSpec("adagrad", {"lr": 0.1}))
    warm.pull(ids[:1000])
    table_files.write_shard(warm, checkpoint.staging_dir(sys.argv[1] + ".warm"), 0, delta=False)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS: the peak of the save alone
    before = status("VmRSS")
    staging = checkpoint.staging_dir(sys.argv[1])
    table_files.write_shard(table, staging, 0, delta=False)
    meta = {"format": checkpoint.FORMAT, "kind": "base", "save_id": uuid.uuid4().hex,
            "after": None, "server_num": 1, "mode": "local",
            "tables": {"big": {"dim": 8}}, "dense": []}
    checkpoint.commit(staging, sys.argv[1], meta)
    growth = status("VmHWM") - before
    print(json.dumps({"table": table_bytes, "growth": growth, "rows": len(table)}))
""")


@pytest.mark.slow
def test_saving_a_million_rows_keeps_memory_under_one_fifth_more(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", MEMORY_SCRIPT, str(tmp_path / "big")],
        capture_output=True, text=True, cwd=REPO, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["rows"] == 1_000_000
    # Peak memory while saving grows by under a fifth of the table (a copy would be 1x).
    assert figures["growth"] < 0.2 * figures["table"], figures
    assert table_files.summary(str(tmp_path / "big"))["tables"]["big"]["rows"] == 1_000_000
