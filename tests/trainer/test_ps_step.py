"""A PS step routes each id to its server once and each server looks it up
once (issue 14): the push reuses the pull's split and row numbers, and no
sparse gradient is lost on the way (also when rows are renumbered between a
pull and its push)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support import InProcessServers
from torch import nn

from trainer.embedding import pending, stores
from trainer.nn import SparseEmbedding
from trainer.ps import DistributedOptimizer, OptimizerSpec, client
from trainer.ps.modes import AsyncMode, WorkerLink
from trainer.ps.server import ParameterServer
from trainer.ps.tables import table as table_module
from trainer.ps.tables.step_rows import pull_numbered, push_numbered
from trainer.ps.tables.table import SparseTable

SERVERS = 2


class TwoTables(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = SparseEmbedding(3, "step_t_a")
        self.b = SparseEmbedding(3, "step_t_b")
        self.bias = nn.Parameter(torch.zeros(1))

    def loss(self, ids: torch.Tensor) -> torch.Tensor:
        # Each row's gradient is the count of its id in the batch: a known value.
        return self.a(ids).sum() + self.b(ids + 1000).sum() + self.bias.sum()


@pytest.fixture
def job():
    model = TwoTables()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    spec = OptimizerSpec.from_torch(opt)
    servers = [
        ParameterServer(
            s, SERVERS, 1, "async",
            {name: model.__getattr__(attr).config.make_table(spec, shards=SERVERS)
             for attr, name in (("a", "step_t_a"), ("b", "step_t_b"))},
            [bias], torch.optim.SGD([bias], lr=1.0),
        )
        for s, bias in enumerate(nn.Parameter(torch.zeros(1)) for _ in range(SERVERS))
    ]
    mode = AsyncMode()
    mode.use(opt, [model.bias])
    link = WorkerLink(0, InProcessServers(servers), lambda c: c.make_table(spec))
    stores.install_store(mode.connect(link))
    yield model, servers, mode, DistributedOptimizer(opt, mode.step)
    stores.install_store(None)
    pending.clear_pending()


def step(model: TwoTables, opt: DistributedOptimizer, ids: torch.Tensor) -> None:
    model.loss(ids).backward()
    opt.step()
    opt.zero_grad()


def test_a_step_routes_each_id_once_and_each_server_looks_it_up_once(job, monkeypatch):
    model, servers, mode, opt = job
    routed: list[int] = []
    real_split = client.split_by_server
    monkeypatch.setattr(client, "split_by_server",
                        lambda ids, n: routed.append(ids.shape[0]) or real_split(ids, n))
    probed: list[int] = []
    real_pull_rows = table_module.pull_rows
    monkeypatch.setattr(table_module, "pull_rows",
                        lambda index, ids, *rest: probed.append(ids.shape[0])
                        or real_pull_rows(index, ids, *rest))
    real_rows_for = SparseTable._rows_for
    monkeypatch.setattr(SparseTable, "_rows_for",
                        lambda self, ids, create: probed.append(ids.shape[0])
                        or real_rows_for(self, ids, create))
    ids = torch.tensor([5, 9, 5, 12, 40, 77, 9, 3])
    distinct = len(set(ids.tolist()))
    for _ in range(3):
        routed.clear()
        probed.clear()
        step(model, opt, ids)
        # One split per table's pull, none for the push.
        assert routed == [distinct, distinct]
        # Each table's distinct ids probed once over all servers: by the pull.
        assert sum(probed) == 2 * distinct
    mode.settle()


def test_every_pulled_gradient_is_pushed_once(job):
    model, servers, mode, opt = job
    rng = np.random.default_rng(0)
    counts: dict[int, int] = {}
    initial = {}
    for _ in range(20):
        ids = torch.from_numpy(rng.integers(1, 60, size=16))
        for i in ids.tolist():
            counts[i] = counts.get(i, 0) + 1
        step(model, opt, ids)
    mode.settle()
    for name, offset in (("step_t_a", 0), ("step_t_b", 1000)):
        for i, count in counts.items():
            key = np.array([i + offset], dtype=np.uint64)
            owner = servers[int(table_module.shard_of(key, SERVERS)[0])].tables[name]
            initial[i] = owner.init_rows(key)[0]
            got = owner.pull(key, create=False).numpy()[0]
            # SGD, lr 1: each occurrence of the id lowered every value by 1.
            np.testing.assert_allclose(got, initial[i] - count, rtol=1e-5, atol=1e-5)


def test_a_push_after_rows_were_renumbered_updates_the_right_rows():
    spec = OptimizerSpec("sgd", {"lr": 1.0})
    table = SparseTable("step_t_budget", 2, spec, max_rows=64)
    mine = np.array([3, 4, 5], dtype=np.uint64)
    rows, pulled = pull_numbered(table, mine)
    # Another worker's pulls evict rows (least recently seen first) and renumber.
    for start in range(100, 400, 40):
        table.pull(np.arange(start, start + 40, dtype=np.uint64))
    table.pull(mine)  # mine are recent again, so kept; their numbers changed
    assert table.renumbered > 0
    other = np.arange(360, 400, dtype=np.uint64)
    others_before = table.pull(other, create=False).numpy()
    push_numbered(table, torch.ones(3, 2), pulled)
    np.testing.assert_allclose(table.pull(mine, create=False).numpy(), rows.numpy() - 1)
    np.testing.assert_array_equal(table.pull(other, create=False).numpy(), others_before)


def test_the_server_reuses_a_pull_overtaken_by_the_next_one():
    spec = OptimizerSpec("sgd", {"lr": 1.0})
    server = ParameterServer(0, 1, 1, "async", {"t": SparseTable("t", 2, spec)}, [], None)
    first, second = torch.tensor([1, 2]), torch.tensor([7, 8, 9])
    before = server.pull_step(0, ["t"], first)[0]
    server.pull_step(0, ["t"], second)  # the next step's pull came first
    server.push({"t": (first, torch.ones(2, 2))}, {}, worker=0)
    np.testing.assert_allclose(server.tables["t"].pull(first, create=False), before - 1)
    assert server._pulled_rows(0, "t", second.numpy().view(np.uint64)) is not None


def test_a_push_matched_to_an_unpushed_pull_of_an_id_admitted_since_is_applied():
    # A pull never pushed (a forward that failed after it, a pull sent ahead
    # and dropped) stays remembered; the server matches a later push of the
    # same ids to it. Its id was not admitted then, and is now.
    from trainer.ps.tables.entries import CountFilterEntry

    spec = OptimizerSpec("sgd", {"lr": 1.0})
    table = SparseTable("t", 2, spec, entry=CountFilterEntry(2))
    server = ParameterServer(0, 1, 1, "async", {"t": table}, [], None)
    ids = torch.tensor([7])
    assert server.pull_step(0, ["t"], ids)[0].tolist() == [[0.0, 0.0]]  # not admitted
    trained_on = server.pull_step(0, ["t"], ids)[0]  # admitted: the forward's row
    assert trained_on.abs().sum() > 0
    server.push({"t": (ids, torch.full((1, 2), 3.0))}, {}, worker=0)
    np.testing.assert_allclose(table.pull(ids.numpy().view(np.uint64), create=False),
                               trained_on - 3)
