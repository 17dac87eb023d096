"""Sparse tables that live for months: per-row statistics, admission
(``CountFilterEntry``, ``ProbabilityEntry``), ``shrink`` by unseen passes and by
decayed show/click score, a row budget (``max_rows``) and ``table_stats``;
in-process, in local mode, and in real 1- and 2-server jobs (this file runs
itself as each role's script, as tests/trainer/test_ps.py does).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from support import finish_job, reserved_ports
from test_ps import auc, batches, loss_of
from torch import nn

from trainer.embedding import stores
from trainer.job.role import ClusterRole, Role
from trainer.nn import (
    CountFilterEntry,
    CtrAccessorParam,
    ProbabilityEntry,
    ShowClickEntry,
    SparseEmbedding,
)
from trainer.ps import ParameterServerRuntime, SparseTable
from trainer.ps.tables.entries import entry_from_attr
from trainer.ps.tables.optim import OptimizerSpec

REPO = Path(__file__).resolve().parents[2]
JOB_TIMEOUT = 180
SGD = OptimizerSpec("sgd", {"lr": 0.1})


def ids(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


@pytest.fixture(autouse=True)
def fresh_local_tables():
    stores.local_store().clear()
    stores.local_store().set_pass(0)
    yield
    stores.local_store().clear()
    stores.local_store().set_pass(0)


# -- admission -----------------------------------------------------------------------


def test_count_filter_admits_on_the_nth_pull_and_drops_gradients_before():
    table = SparseTable("count", 4, SGD, entry=CountFilterEntry(3))
    for pull in range(2):
        rows = table.pull(ids(7, 8), create=True)
        assert torch.equal(rows, torch.zeros(2, 4))  # not admitted: zeros
        table.push(ids(7, 8), torch.ones(2, 4))  # dropped, not stored
        assert len(table) == 0
        assert table.stats()["pending"] == 2
        assert table.statistics(ids(7))["pending"].tolist() == [pull + 1]
    admitted = table.pull(ids(7), create=True)  # third sighting of 7
    assert torch.equal(admitted, torch.from_numpy(table.init_rows(ids(7))))
    assert len(table) == 1 and table.stats()["pending"] == 1  # 8 still waits
    assert table.statistics(ids(7))["show"].tolist() == [3.0]  # earlier sightings count
    table.push(ids(7), torch.ones(1, 4))
    assert torch.allclose(table.pull(ids(7), create=False), admitted - 0.1)
    # Evaluation reads a pending id as zeros and counts nothing.
    assert torch.equal(table.pull(ids(8), create=False), torch.zeros(1, 4))
    assert table.statistics(ids(8))["pending"].tolist() == [2]


def test_count_filter_zero_and_one_admit_at_once():
    for count in (0, 1):
        table = SparseTable("c", 2, SGD, entry=CountFilterEntry(count))
        table.pull(ids(1, 2, 3), create=True)
        assert len(table) == 3 and table.stats()["pending"] == 0


def test_probability_entry_is_seeded_and_admits_about_p():
    keys = np.arange(1, 4001, dtype=np.int64) * 7919

    def admitted(seed: int) -> np.ndarray:
        table = SparseTable("p", 2, SGD, seed=seed, entry=ProbabilityEntry(0.25))
        table.pull(keys, create=True)
        return table.statistics(keys)["show"] >= 0

    first, again, other_seed = admitted(0), admitted(0), admitted(1)
    assert np.array_equal(first, again)
    assert not np.array_equal(first, other_seed)
    assert 0.22 < first.mean() < 0.28, first.mean()
    # A second sighting draws again: about p of the rest get in.
    table = SparseTable("p", 2, SGD, entry=ProbabilityEntry(0.25))
    table.pull(keys, create=True)
    before = len(table)
    table.pull(keys, create=True)
    assert 0.22 < (len(table) - before) / (len(keys) - before) < 0.28


def test_entries_check_their_arguments_and_round_trip_paddle_strings():
    for bad in (lambda: CountFilterEntry(-1), lambda: CountFilterEntry(2.0),
                lambda: ProbabilityEntry(1.0), lambda: ProbabilityEntry(0),
                lambda: ShowClickEntry("show", 3)):
        with pytest.raises(ValueError):
            bad()
    for entry in (CountFilterEntry(5), ProbabilityEntry(0.1), ShowClickEntry("show", "click")):
        assert entry_from_attr(entry._to_attr()) == entry
    assert CountFilterEntry(5)._to_attr() == "count_filter_entry:5"
    with pytest.raises(ValueError, match="count_filter_entry"):
        entry_from_attr("bogus:1")
    with pytest.raises(TypeError, match="entry must be"):
        SparseEmbedding(2, "bad_entry", entry="count_filter_entry:5")


def test_local_mode_admission_through_sparse_embedding():
    emb = SparseEmbedding(4, "life_local_count", entry=CountFilterEntry(2))
    runtime = ParameterServerRuntime(ClusterRole.local())
    # The placeholder's Linear is no module of the model: name the model.
    opt = runtime.distributed_optimizer(
        torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1), model=emb
    )
    x = torch.tensor([11, 12])
    first = emb(x)
    assert torch.equal(first, torch.zeros(2, 4))
    first.sum().backward()
    opt.step()
    second = emb(x)  # admitted now, at the initial value (the first gradient was dropped)
    table = stores.local_store().tables["life_local_count"]
    assert torch.equal(second.detach(), torch.from_numpy(table.init_rows(x.numpy())))
    assert runtime.table_stats()["life_local_count"]["rows"] == 2


# -- statistics, passes, shrink --------------------------------------------------------


def test_statistics_count_pulls_clicks_and_unseen_passes():
    emb = SparseEmbedding(2, "life_stats")
    values = torch.tensor([1, 2, 2, 3])  # records [1, 2], [2], [3]
    from datafeed import Ragged

    batch = Ragged(values, torch.tensor([0, 2, 3, 4]))
    emb(batch, click=torch.tensor([1.0, 0.0, 1.0]))
    emb(batch, click=torch.tensor([0.0, 0.0, 0.0]))
    table = stores.local_store().tables["life_stats"]
    table.set_pass(2)
    emb(torch.tensor([3]))
    stats = table.statistics(ids(1, 2, 3, 4))
    assert stats["show"].tolist() == [2, 2, 3, -1]
    assert stats["click"].tolist() == [1, 1, 1, 0]  # at most one per id per batch
    assert stats["unseen_passes"].tolist() == [2, 2, 0, 0]
    with pytest.raises(ValueError, match="one click label per record"):
        emb(batch, click=torch.tensor([1.0]))
    with pytest.raises(ValueError, match="before the current pass"):
        table.set_pass(1)


def test_a_pass_step_longer_than_rows_are_kept_is_said(caplog):
    # Unseen passes are pass-number differences: dates as pass numbers would
    # have the next shrink drop every row (20240131 -> 20240201 is 70 passes).
    from trainer.ps import lifecycle

    table = SparseTable("dates", 2, SGD, accessor=CtrAccessorParam(delete_after_unseen_days=30))
    with caplog.at_level("WARNING", logger="trainer.ps.lifecycle"):
        lifecycle.set_pass({"dates": table}, 20240130, "local")  # the first pass: nothing
        table.pull(ids(1, 2), create=True)
        lifecycle.set_pass({"dates": table}, 20240131, "local")  # one day later: nothing
        assert caplog.text == ""
        lifecycle.set_pass({"dates": table}, 20240201, "local")
    assert ("table 'dates': pass 20240201 follows pass 20240131, 70 passes later: every row "
            "not seen in this pass is now unseen for more than delete_after_unseen_days=30"
            in caplog.text)
    assert "These look like dates" in caplog.text
    assert table.shrink() == (2, 0)  # what the warning says
    caplog.clear()
    empty = SparseTable("paused", 2, SGD, accessor=CtrAccessorParam(delete_after_unseen_days=1))
    every = SparseTable("daily", 2, SGD, accessor=CtrAccessorParam(delete_after_unseen_days=0))
    every.pull(ids(1), create=True)
    with caplog.at_level("WARNING", logger="trainer.ps.lifecycle"):
        lifecycle.set_pass({"paused": empty}, 1, "local")
        lifecycle.set_pass({"paused": empty}, 5, "local")  # no row to lose: nothing said
        for day in (1, 2, 3):  # keeps rows one pass by choice: a step of 1 is no news
            lifecycle.set_pass({"daily": every}, day, "local")
    assert caplog.text == ""
    # Rows pulled (or loaded) before the first set_pass are pass 0's.
    early = SparseTable("early", 2, SGD, accessor=CtrAccessorParam())
    early.pull(ids(1), create=True)
    with caplog.at_level("WARNING", logger="trainer.ps.lifecycle"):
        lifecycle.set_pass({"early": early}, 20240130, "local")
    assert "pass 20240130 follows pass 0, 20240130 passes later" in caplog.text


def test_a_score_below_a_threshold_of_zero_is_dropped_as_by_paddle():
    # Paddle tests score < delete_threshold whatever the threshold: with a
    # negative coefficient, a row shown and never clicked scores below 0.
    table = SparseTable("neg", 2, SGD, accessor=CtrAccessorParam(nonclk_coeff=-0.1))
    table.pull(ids(1), create=True)
    assert table.shrink() == (1, 0)
    plain = SparseTable("plain", 2, SGD, accessor=CtrAccessorParam())  # scores >= 0: kept
    plain.pull(ids(1), create=True)
    assert plain.shrink() == (0, 1)


def test_shrink_by_unseen_passes_and_by_score():
    unseen = SparseTable("u", 2, SGD, accessor=CtrAccessorParam(delete_after_unseen_days=1))
    unseen.pull(ids(1, 2), create=True)
    unseen.set_pass(1)
    unseen.pull(ids(2, 3), create=True)
    unseen.set_pass(2)
    weights = unseen.pull(ids(2, 3), create=False)
    assert unseen.shrink() == (1, 2)  # 1 unseen for 2 passes > 1
    assert unseen.statistics(ids(1))["show"].tolist() == [-1]
    assert torch.equal(unseen.pull(ids(2, 3), create=False), weights)  # survivors intact
    rule = CtrAccessorParam(delete_after_unseen_days=100, delete_threshold=0.25,
                            show_click_decay_rate=0.5)
    scored = SparseTable("s", 2, SGD, accessor=rule)
    for _ in range(10):
        scored.pull(ids(10), create=True)
    scored.pull(ids(11, 12), create=True)
    scored.add_clicks(ids(12), np.array([1.0]))
    # show*0.5: 10 -> 5 (score 0.5), 11: 1 -> 0.5 (0.05), 12: 1 click (0.5)
    assert scored.shrink() == (1, 2)
    assert scored.statistics(ids(10, 11, 12))["show"].tolist() == [5.0, -1, 0.5]


def test_shrink_forgets_pending_ids_unseen_for_as_long():
    table = SparseTable("pend", 2, SGD, entry=CountFilterEntry(5),
                        accessor=CtrAccessorParam(delete_after_unseen_days=1))
    table.pull(ids(1, 2), create=True)
    table.set_pass(1)
    table.pull(ids(2), create=True)
    table.set_pass(2)
    table.shrink()
    assert table.statistics(ids(1, 2))["pending"].tolist() == [0, 2]


def test_changed_rows_and_dropped_ids_for_a_delta_save():
    table = SparseTable("delta", 2, SGD, accessor=CtrAccessorParam(delete_after_unseen_days=0))
    table.pull(ids(1, 2, 3), create=True)
    table.mark_saved()
    assert table.changed_rows()[0].size == 0
    table.push(ids(2), torch.ones(1, 2))
    assert table.changed_rows()[0].view(np.int64).tolist() == [2]
    table.set_pass(1)
    table.pull(ids(3), create=True)
    table.shrink()
    assert sorted(table.dropped_ids().view(np.int64).tolist()) == [1, 2]


# -- budget ----------------------------------------------------------------------------


def test_budget_evicts_least_recently_seen_rows():
    table = SparseTable("budget", 2, SGD, max_rows=100)
    table.pull(np.arange(100, dtype=np.int64), create=True)
    hot = np.arange(10, dtype=np.int64)
    values = table.pull(hot, create=True)
    table.pull(np.arange(1000, 1050, dtype=np.int64), create=True)
    assert len(table) <= 100
    assert torch.equal(table.pull(hot, create=False), values)  # the recent ones stayed
    assert (table.statistics(hot)["show"] == 2).all()
    assert table.stats()["evicted"] >= 50
    for start in range(2000, 12000, 500):
        table.pull(np.arange(start, start + 500, dtype=np.int64), create=True)
        assert len(table) <= 500  # a batch bigger than the budget is held whole
    table.pull(np.arange(0, 60, dtype=np.int64), create=True)
    assert len(table) <= 100


def test_ticks_renumbered_before_they_wrap_keep_each_rows_pass_and_order():
    # A tick is a training pull: a server of many workers passes 2**32 in days.
    # A row seen at the first pull and kept since pinned the old rebase (a
    # shift down by the oldest tick) at 0, and a pull then overflowed.
    from trainer.ps.tables import rowstats

    def run(near_the_limit: bool) -> tuple:
        table = SparseTable("ticks", 2, SGD, entry=CountFilterEntry(2), max_rows=8,
                            accessor=CtrAccessorParam(delete_after_unseen_days=2,
                                                      delete_threshold=0.0))
        for day, ids in ((1, [1, 2, 3]), (2, [4, 5]), (3, [6, 7])):
            table.set_pass(day)
            for _ in range(2):  # seen twice: admitted
                table.pull(np.array(ids, dtype=np.int64))
            table.pull(np.array([100 + day], dtype=np.int64))  # seen once: waiting
        if near_the_limit:
            table._stats.clock.tick = rowstats._TICK_LIMIT - 1  # days of pulls later
        table.pull(np.array([2, 8], dtype=np.int64))  # renumbers the ticks first
        table.pull(np.array([8, 9], dtype=np.int64))  # 8 admitted
        table.pull(np.array([9, 103], dtype=np.int64))  # a budget of 8: evicts the oldest
        for _ in range(300):  # past where the old rebase overflowed
            table.pull(np.array([9], dtype=np.int64))
        table.set_pass(4)
        dropped = table.shrink()
        ids = np.arange(1, 10, dtype=np.int64)
        stats = table.statistics(ids)
        return (dropped, stats["show"].tolist(), stats["unseen_passes"].tolist(),
                table.stats()["evicted"], len(table))

    renumbered = run(near_the_limit=True)
    assert renumbered == run(near_the_limit=False)
    # Rows 1 and 3 (pass 1, least recently seen) were evicted, row 2 (seen again) was not.
    assert renumbered[1][:3] == [-1.0, 3.0, -1.0]
    assert renumbered[1][8] == 302.0


def test_passes_a_load_starts_near_the_tick_limit_keep_the_rows_passes():
    # A load that starts 300 passes the clock never saw, 2 ticks below the
    # limit: the rows' ticks wrapped, and a row seen now read as 263 passes old.
    from trainer.ps.tables import rowstats

    count = 300
    ids = np.arange(10_001, 10_001 + count, dtype=np.uint64)
    saved = {"ids": ids, "optimizer": "sgd", "weights": np.zeros((count, 2), np.float32),
             "show": np.ones(count, np.float32), "click": np.zeros(count, np.float32),
             "last_seen_pass": np.arange(1, count + 1, dtype=np.int64), "pass": count}
    table = SparseTable("ticks", 2, SGD)
    table.set_pass(count + 5)
    table._stats.clock.tick = rowstats._TICK_LIMIT - 2  # days of pulls later
    table.pull(np.array([1], dtype=np.int64))  # seen in the current pass
    table.load_state_dict(saved)
    probe = np.array([1, 10_001, 10_300], dtype=np.int64)
    assert table.statistics(probe)["unseen_passes"].tolist() == [0, count + 4, 5]


class BudgetModel(nn.Module):
    def __init__(self, budget: int) -> None:
        super().__init__()
        self.emb = SparseEmbedding(8, "life_budget_emb", max_rows=budget)
        self.wide = SparseEmbedding(1, "life_budget_wide", max_rows=budget)
        self.out = nn.Linear(8, 1)

    def forward(self, x) -> torch.Tensor:
        return (self.out(torch.tanh(self.emb(x))) + self.wide(x)).squeeze(1)


def with_noise(data, rng: np.random.Generator, per_record: int = 2):
    """Each record gets ``per_record`` extra ids never seen before (no signal)."""
    from datafeed import Ragged

    out = []
    for x, y in data:
        lengths = x.offsets.diff().numpy()
        parts = np.split(x.values.numpy(), np.cumsum(lengths)[:-1])
        noise = rng.integers(1, 2**62, (len(parts), per_record))
        values = np.concatenate([np.append(p, n) for p, n in zip(parts, noise, strict=True)])
        offsets = np.concatenate([[0], np.cumsum(lengths + per_record)])
        out.append((Ragged(torch.from_numpy(values), torch.from_numpy(offsets)), y))
    return out


def test_a_budgeted_table_fed_ten_times_its_budget_stays_within_it_and_trains():
    budget = 2000  # 400 signal ids; the rest for the noise between two sightings
    torch.manual_seed(0)
    model = BudgetModel(budget)
    runtime = ParameterServerRuntime(ClusterRole.local())
    opt = runtime.distributed_optimizer(torch.optim.Adagrad(model.parameters(), lr=0.1))
    rng = np.random.default_rng(5)
    distinct = set()
    for _ in range(5):
        for x, y in with_noise(batches(0, 2000), rng):
            distinct.update(x.values.tolist())
            loss_of(model, x, y).backward()
            opt.step()
            opt.zero_grad()
            assert len(stores.local_store().tables["life_budget_emb"]) <= budget
    assert len(distinct) >= 10 * budget
    stats = runtime.table_stats()["life_budget_emb"]
    assert stats["rows"] <= budget and stats["evicted"] >= len(distinct) - budget
    # One worker's 2,000 records without a budget or noise: 0.797 (0.8 is
    # test_ps's band for two workers' 4,000); measured with the budget: 0.796.
    assert auc(model, batches(-1, 2000)) > 0.78


# -- jobs --------------------------------------------------------------------------------


class JobModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.count = SparseEmbedding(4, "job_count", entry=CountFilterEntry(3))
        self.unseen = SparseEmbedding(
            4, "job_unseen", accessor=CtrAccessorParam(delete_after_unseen_days=1)
        )
        self.score = SparseEmbedding(4, "job_score", accessor=CtrAccessorParam(
            delete_after_unseen_days=100, delete_threshold=0.25, show_click_decay_rate=0.5
        ))
        self.out = nn.Linear(4, 1)


def test_shrink_and_save_are_worker_0s_as_in_paddle(caplog, tmp_path):
    # A program ported from Paddle calls them on every worker: each call used
    # to decay the statistics again, and a second delta replaced the first.
    servers = ("127.0.0.1:1", "127.0.0.1:2")
    other = ParameterServerRuntime(
        ClusterRole(Role.WORKER, 1, 2, servers, job_secret="job-secret-0123456789"))
    with caplog.at_level("WARNING", logger="trainer.ps.runtime"):
        assert other.shrink() == {}  # no server is asked: nothing listens on these ports
        other.save_persistables(str(tmp_path / "ckpt"), mode=1)
        other.shrink()
    assert not (tmp_path / "ckpt").exists()
    said = [r.getMessage() for r in caplog.records]
    assert said == [  # once each
        "fleet.shrink() on worker 1 does nothing: worker 0 does it for the whole job, as in "
        "Paddle, where every worker calls it (call it on worker 0)",
        "fleet.save_persistables(mode=1) on worker 1 does nothing: worker 0 does it for the "
        "whole job, as in Paddle, where every worker calls it (call it on worker 0)",
    ]
    # A base is whole from any worker (the last stands): this one goes to the servers.
    with pytest.raises(Exception, match="optimizer|init_worker"):
        other.save_persistables(str(tmp_path / "ckpt"), mode=0)
    first = ParameterServerRuntime(
        ClusterRole(Role.WORKER, 0, 2, servers, job_secret="job-secret-0123456789"))
    with pytest.raises(Exception, match="init_worker|optimizer|connect"):
        first.shrink()  # worker 0 goes to the servers (none here)


def geo_job_main(config: dict) -> None:
    """A GEO job of 2 workers: worker 1 trains one step (its delta waits for
    k_steps=100), then calls fleet.shrink() as a Paddle program does on every
    worker; worker 0 then reads the servers' table."""
    from trainer.job.strategy import DistributedStrategy

    role = ClusterRole(
        Role.SERVER if config["role"] == "server" else Role.WORKER, config["index"],
        2, tuple(config["servers"]), job_secret="job-secret-0123456789",
    )
    strategy = DistributedStrategy()
    strategy.a_sync_configs = {"k_steps": 100}
    torch.manual_seed(0)
    model = nn.Module()
    model.emb = SparseEmbedding(4, "geo_gated")
    runtime = ParameterServerRuntime(role, strategy)
    opt = runtime.distributed_optimizer(torch.optim.SGD([torch.zeros(1)], lr=1.0), model)
    if role.is_server:
        runtime.init_server()
        runtime.run_server()
        return
    runtime.init_worker()
    told = Path(config["out"] + ".shrunk")
    ids = torch.arange(1000, 1010)
    if role.index == 1:
        rows = model.emb(ids)
        rows.sum().backward()  # each value's gradient 1: SGD at lr 1 moves it by -1
        opt.step()
        runtime.shrink()  # left to worker 0, after sending this worker's delta
        told.write_text(json.dumps(rows.detach().tolist()))
        # Nothing else sends the delta (the barrier below would) before worker 0 read.
        deadline = time.monotonic() + 60
        while not Path(config["out"]).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    else:
        deadline = time.monotonic() + 60
        while not told.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        model.emb.eval()  # reads the servers' rows (this worker has none)
        with torch.no_grad():
            served = model.emb(ids).tolist()
        Path(config["out"]).write_text(json.dumps(
            {"before": json.loads(told.read_text()), "served": served}))
    runtime.barrier_worker()
    runtime.stop_worker()


@pytest.mark.distributed
def test_a_worker_that_leaves_the_shrink_to_worker_0_sends_its_updates_first(tmp_path):
    with reserved_ports(1) as ports:
        base = {"servers": [f"127.0.0.1:{ports[0]}"], "out": str(tmp_path / "rows.json"),
                "main": "geo"}
        configs = [{**base, "role": "server", "index": 0}] + [
            {**base, "role": "worker", "index": i} for i in (0, 1)]
        finish_job(launch(tmp_path, configs), JOB_TIMEOUT, tmp_path)
    rows = json.loads((tmp_path / "rows.json").read_text())
    # The servers hold worker 1's delta, scaled by 1/worker_num as GEO merges it.
    assert np.allclose(np.array(rows["served"]), np.array(rows["before"]) - 0.5, atol=1e-6)
    assert "fleet.shrink() on worker 1 does nothing" in (tmp_path / "p2.log").read_text()


def job_main(config: dict) -> None:
    """One process of a test job."""
    role = ClusterRole(
        Role.SERVER if config["role"] == "server" else Role.WORKER, config["index"],
        1, tuple(config["servers"]), job_secret="job-secret-0123456789",
    )
    torch.manual_seed(0)
    model = JobModel()
    runtime = ParameterServerRuntime(role, None)
    opt = runtime.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    if role.is_server:
        runtime.init_server()
        runtime.run_server()
        return
    runtime.init_worker()
    out: dict = {}

    def step(emb: SparseEmbedding, values: list[int], click=None) -> torch.Tensor:
        rows = emb(torch.tensor(values), click=click)
        rows.sum().backward()
        opt.step()
        opt.zero_grad()
        return rows.detach()

    keys = list(range(1, 41))
    out["count_reads"] = [step(model.count, keys).abs().sum().item() for _ in range(3)]
    out["count_stats"] = runtime.table_stats()["job_count"]
    step(model.unseen, list(range(100, 140)))
    runtime.set_pass(1)
    step(model.unseen, list(range(120, 160)))
    runtime.set_pass(2)
    for _ in range(10):
        step(model.score, list(range(200, 210)))
    step(model.score, list(range(300, 320)), click=torch.tensor([1.0] * 10 + [0.0] * 10))
    out["shrink"] = runtime.shrink()
    out["stats"] = runtime.table_stats()
    runtime.stop_worker()
    Path(config["out"]).write_text(json.dumps(out))


def run_job(tmp_path: Path, servers: int) -> dict:
    with reserved_ports(servers) as ports:
        eps = [f"127.0.0.1:{p}" for p in ports]
        base = {"servers": eps, "out": str(tmp_path / "result.json")}
        configs = [{**base, "role": "server", "index": i} for i in range(servers)]
        configs.append({**base, "role": "worker", "index": 0})
        finish_job(launch(tmp_path, configs), JOB_TIMEOUT, tmp_path)
    return json.loads((tmp_path / "result.json").read_text())


def launch(tmp_path: Path, configs: list[dict]) -> list[subprocess.Popen]:
    """One process of this file per config, its output in ``p<n>.log``."""
    procs = []
    for n, config in enumerate(configs):
        with open(tmp_path / f"p{n}.log", "w") as log:
            procs.append(subprocess.Popen(
                [sys.executable, __file__, json.dumps(config)], stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(
                    [str(REPO), os.environ.get("PYTHONPATH", "")]
                )},
            ))
    return procs


@pytest.mark.distributed
@pytest.mark.parametrize("servers", [1, 2])
def test_admission_shrink_and_stats_across_servers(tmp_path, servers):
    out = run_job(tmp_path, servers)
    reads = out["count_reads"]
    assert reads[0] == 0 and reads[1] == 0 and reads[2] > 0  # admitted at the third pull
    assert out["count_stats"]["rows"] == 40 and out["count_stats"]["servers"] == servers
    # 100..119 unseen for 2 passes > 1: dropped; 120..159 kept.
    assert out["shrink"]["job_unseen"] == {"dropped": 20, "kept": 40}
    # 200..209 (10 shows) and the clicked 300..309 stay; the unclicked 310..319 go.
    assert out["shrink"]["job_score"] == {"dropped": 10, "kept": 20}
    stats = out["stats"]
    assert stats["job_unseen"]["rows"] == 40 and stats["job_score"]["rows"] == 20
    assert stats["job_unseen"]["pass"] == 2 and stats["job_count"]["bytes"] > 0


if __name__ == "__main__":
    given = json.loads(sys.argv[1])
    (geo_job_main if given.get("main") == "geo" else job_main)(given)
