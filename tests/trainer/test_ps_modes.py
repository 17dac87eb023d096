"""The parameter server's training modes (``trainer.ps.modes``), in process: a
``ServerSet`` stand-in calls a ``ParameterServer`` here, so each mode's step is
checked value by value without sockets."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from support import InProcessServers
from torch import nn

from trainer import DistributedStrategy
from trainer.embedding import pending, stores
from trainer.job.errors import TrainerError
from trainer.job.role import ClusterRole, Role
from trainer.job.strategy import parameter_server_mode
from trainer.nn import SparseEmbedding
from trainer.ps import DistributedOptimizer, OptimizerSpec, ParameterServerRuntime
from trainer.ps.modes import AsyncMode, GeoMode, LocalMode, SyncMode, WorkerLink, distributed_mode
from trainer.ps.server import ParameterServer
from trainer.ps.tables.table import SparseTable


def Strategy(mode: str, k_steps: int = 0) -> SimpleNamespace:
    """The two attributes the runtime reads from a DistributedStrategy."""
    return SimpleNamespace(mode=mode, a_sync_configs={"k_steps": k_steps})


class OneRowModel(nn.Module):
    """A sparse row and a dense vector; the loss is the sum of both, so that SGD
    with lr=1 lowers every value by exactly 1 per step."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.emb = SparseEmbedding(2, name)
        self.bias = nn.Parameter(torch.zeros(2))

    def loss(self) -> torch.Tensor:
        return self.emb(torch.tensor([7])).sum() + self.bias.sum()


def connected_mode(mode, name: str, server_optimizer: bool):
    """``mode`` connected to one in-process server of ``name``'s table."""
    model = OneRowModel(name)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    spec = OptimizerSpec.from_torch(opt)
    server_bias = nn.Parameter(torch.zeros(2))
    server = ParameterServer(
        0, 1, 1, mode.name, {name: model.emb.config.make_table(spec)}, [server_bias],
        torch.optim.SGD([server_bias], lr=1.0) if server_optimizer else None,
    )
    mode.use(opt, [model.bias])
    link = WorkerLink(0, InProcessServers([server]), lambda c: c.make_table(spec))
    stores.install_store(mode.connect(link))
    return model, server, DistributedOptimizer(opt, mode.step)


def train_step(model: OneRowModel, opt: DistributedOptimizer) -> None:
    model.loss().backward()
    opt.step()
    opt.zero_grad()


@pytest.fixture
def local_store_after():
    yield
    stores.install_store(None)
    pending.clear_pending()


def test_geo_mode_sends_deltas_every_k_steps(local_store_after):
    mode = distributed_mode("geo", 3)
    assert isinstance(mode, GeoMode) and not mode.servers_run_optimizer
    model, server, opt = connected_mode(mode, "geo_modes_t", server_optimizer=False)
    initial = server.tables["geo_modes_t"].init_rows(np.array([7], dtype=np.uint64))[0]
    for _ in range(2):
        train_step(model, opt)
    # Two local steps: the worker moved, the servers saw nothing yet.
    assert model.bias.tolist() == [-2.0, -2.0]
    assert server.dense[0].tolist() == [0.0, 0.0]
    assert len(server.tables["geo_modes_t"]) == 0
    train_step(model, opt)  # the third step sends the sync
    mode.settle()
    assert server.dense[0].tolist() == [-3.0, -3.0]
    np.testing.assert_allclose(server.tables["geo_modes_t"].pull(np.array([7], dtype=np.uint64))
                               .numpy()[0], initial - 3, rtol=1e-6)
    train_step(model, opt)
    mode.flush()  # what the fourth step changed goes too
    assert server.dense[0].tolist() == [-4.0, -4.0] == model.bias.tolist()


def test_after_a_reload_a_geo_worker_trains_on_the_servers_rows(local_store_after):
    # refresh() (every barrier_worker) and load_persistables end with
    # reloaded(): the rows the worker holds are read again from the servers.
    mode = GeoMode(5)
    model, server, opt = connected_mode(mode, "geo_reload_t", server_optimizer=False)
    table = server.tables["geo_reload_t"]
    seven = np.array([7], dtype=np.uint64)
    initial = table.init_rows(seven)[0].copy()
    for _ in range(4):
        train_step(model, opt)
    mode.flush()
    # The servers' row moves on without this worker (another worker's sync,
    # a load): a reload takes it, exactly, and nothing is left to send.
    table.add(seven, torch.full((1, 2), -10.0), 1.0)
    servers_row = table.pull(seven, create=False).numpy()[0].copy()
    np.testing.assert_allclose(servers_row, initial - 14, rtol=1e-6)
    mode.reloaded()
    stores.install_store(mode.store)
    trained_on = model.emb(torch.tensor([7]))  # a training forward's pull
    assert trained_on[0].detach().numpy().tolist() == servers_row.tolist()
    pending.clear_pending()
    mode.flush()  # nothing changed locally: the servers' row stays as it is
    assert table.pull(seven, create=False).numpy()[0].tolist() == servers_row.tolist()
    # The copy keeps only the rows trained since it was made, as a cleared
    # one would: the worker's memory and each reload stay about one pass.
    local = mode.store.local["geo_reload_t"]
    assert len(local) == 1
    mode.reloaded()  # nothing trained since the last reload: nothing kept
    assert len(mode.store.local["geo_reload_t"]) == 0


def test_a_geo_flush_leaves_the_worker_at_the_servers_dense_values_exactly(local_store_after):
    # A barrier flushes, then its refresh flushes again: the second must send
    # zeros. A merge that left rounding in the worker's values (its own plus
    # the servers' change) sent it to the servers at every barrier, so two
    # saves around one barrier held different dense values.
    mode = distributed_mode("geo", 1000)
    model, server, opt = connected_mode(mode, "geo_exact_t", server_optimizer=False)
    server.worker_num = 3  # each sync adds a third of the change: not exact in floats
    gen = torch.Generator().manual_seed(5)
    for _ in range(5):
        model.bias.grad = torch.randn(2, generator=gen) / 7
        opt.step()
        opt.zero_grad()
    mode.flush()
    assert torch.equal(model.bias.detach(), server.dense[0].detach())
    after_first = server.dense[0].detach().clone()
    mode.flush()
    assert torch.equal(server.dense[0].detach(), after_first)


_fresh = itertools.count()


class TwoTableModel(nn.Module):
    """Table ``a`` read twice per forward (sum and mean pooling of one Ragged
    input: its two pulls are pushed merged) and table ``b`` once (pushed at
    its pull's row numbers), both Adagrad, and a dense weight."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        adagrad = {"type": "adagrad", "lr": 0.5}
        self.a = SparseEmbedding(3, prefix + "_a", optimizer=adagrad)
        self.a_mean = SparseEmbedding(3, prefix + "_a", mode="mean", optimizer=adagrad)
        self.b = SparseEmbedding(3, prefix + "_b", optimizer=adagrad)
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, 9))

    def loss(self, batch) -> torch.Tensor:
        a, b = batch
        out = torch.cat([self.a(a), self.a_mean(a), self.b(b)], dim=1)
        return ((out * self.w).sum(dim=1) - 1.0).pow(2).mean()


def ragged_batches(steps: int) -> list:
    """Ragged inputs of both tables, repeats and empty records included, with
    ids new at every step beside ids seen before."""
    from datafeed import Ragged

    gen = torch.Generator().manual_seed(3)
    out = []
    for step in range(steps):
        lengths = torch.randint(0, 4, (8,), generator=gen)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        a = torch.randint(0, 6 + 3 * step, (int(offsets[-1]),), generator=gen)
        b = torch.randint(-5, 5 + step, (int(offsets[-1]),), generator=gen) * 2**40
        out.append((Ragged(a, offsets), Ragged(b, offsets)))
    return out


def test_geo_local_copy_trains_as_local_mode_and_syncs_every_change(
    local_store_after, monkeypatch
):
    """Between syncs a GEO worker's rows take the very values that local
    training gives on the same batches, and the sync sends each row's whole
    change from its initial value: the server's rows become the worker's.
    Table ``b`` (one pull a step) is pushed at its pull's row numbers, never
    through ``GeoStore.apply``; table ``a`` (two pulls a step) goes there."""
    from trainer.ps.client import GeoStore

    prefix = f"geo_vs_local_{next(_fresh)}"
    batches = ragged_batches(6)
    local_model = TwoTableModel(prefix)
    local = LocalMode()
    local_opt = torch.optim.SGD(local_model.parameters(), lr=0.1)
    local.use(local_opt, [local_model.w])
    for batch in batches:
        local_model.loss(batch).backward()
        DistributedOptimizer(local_opt, local.step).step()
        local_opt.zero_grad()
    local_tables = stores.local_store().tables

    geo_model = TwoTableModel(prefix)
    geo = distributed_mode("geo", 1000)  # no sync before flush()
    geo_opt = torch.optim.SGD(geo_model.parameters(), lr=0.1)
    spec = OptimizerSpec.from_torch(geo_opt)
    names = (f"{prefix}_a", f"{prefix}_b")
    applied: list[str] = []
    real_apply = GeoStore.apply

    def spied_apply(store, gradients):
        applied.extend(gradients)
        real_apply(store, gradients)

    monkeypatch.setattr(GeoStore, "apply", spied_apply)
    server_tables = {
        m.name: m.config.make_table(spec) for m in (geo_model.a, geo_model.b)
    }
    server = ParameterServer(0, 1, 1, "geo", server_tables, [geo_model.w.detach().clone()], None)
    geo.use(geo_opt, [geo_model.w])
    stores.install_store(geo.connect(WorkerLink(
        0, InProcessServers([server]), lambda c: c.make_table(spec, lifecycle=False)
    )))
    opt = DistributedOptimizer(geo_opt, geo.step)
    for batch in batches:
        geo_model.loss(batch).backward()
        opt.step()
        opt.zero_grad()
    assert applied == [names[0]] * len(batches)
    torch.testing.assert_close(geo_model.w, local_model.w, rtol=0, atol=0)
    for name in names:
        ids, _ = local_tables[name].changed_rows()
        ids = np.sort(ids)
        expected = local_tables[name].pull(ids, create=False)
        copy = geo.store.local[name]
        assert len(copy) == len(ids) == len(local_tables[name])
        torch.testing.assert_close(copy.pull(ids, create=False), expected, rtol=0, atol=0)
        assert len(server.tables[name]) == 0
    geo.flush()
    for name in names:
        ids = np.sort(local_tables[name].changed_rows()[0])
        torch.testing.assert_close(
            server.tables[name].pull(ids, create=False),
            local_tables[name].pull(ids, create=False), rtol=1e-6, atol=1e-7,
        )
    assert geo.store.deltas() == {}  # all sent


def test_async_mode_takes_the_servers_values_one_step_late(local_store_after):
    mode = distributed_mode("async")
    assert isinstance(mode, AsyncMode) and mode.servers_run_optimizer
    model, server, opt = connected_mode(mode, "async_modes_t", server_optimizer=True)
    train_step(model, opt)
    # The server applied the push; the worker takes its answer at the next wait.
    assert server.dense[0].tolist() == [-1.0, -1.0]
    assert model.bias.tolist() == [0.0, 0.0]
    train_step(model, opt)
    assert model.bias.tolist() == [-1.0, -1.0]
    mode.settle()
    assert model.bias.tolist() == [-2.0, -2.0] == server.dense[0].tolist()


def test_sync_mode_takes_the_rounds_values_at_once(local_store_after):
    mode = distributed_mode("sync")
    assert isinstance(mode, SyncMode)
    model, server, opt = connected_mode(mode, "sync_modes_t", server_optimizer=True)
    train_step(model, opt)
    assert model.bias.tolist() == [-1.0, -1.0] == server.dense[0].tolist()
    row = server.tables["sync_modes_t"].pull(np.array([7], dtype=np.uint64)).numpy()[0]
    initial = server.tables["sync_modes_t"].init_rows(np.array([7], dtype=np.uint64))[0]
    np.testing.assert_allclose(row, initial - 1, rtol=1e-6)


def test_modes_need_init_worker_before_a_step():
    for mode in (distributed_mode("async"), distributed_mode("sync"), distributed_mode("geo", 2)):
        with pytest.raises(TrainerError, match=r"call fleet.init_worker\(\) before training"):
            mode.step()
    with pytest.raises(TrainerError, match="strategy.mode must be one of"):
        distributed_mode("hogwild")


def test_the_runtime_picks_its_mode_once_from_the_strategy():
    role = ClusterRole(Role.WORKER, 0, 1, ("127.0.0.1:1",))
    assert isinstance(ParameterServerRuntime(role, None).training, AsyncMode)
    assert isinstance(ParameterServerRuntime(role, Strategy("SYNC")).training, SyncMode)
    geo = ParameterServerRuntime(role, Strategy("geo", 4))
    assert isinstance(geo.training, GeoMode) and geo.training.k_steps == 4
    local = ParameterServerRuntime(ClusterRole.local(), Strategy("geo", 4))
    assert isinstance(local.training, LocalMode) and local.mode == "geo"
    with pytest.raises(TrainerError, match=r"k_steps'\] >= 1, got 0"):
        ParameterServerRuntime(role, Strategy("geo", 0))



def test_parameter_server_mode_reads_strategies_and_paddle_like_objects():
    assert parameter_server_mode(None) == ("async", 0)
    strategy = DistributedStrategy()
    assert parameter_server_mode(strategy) == ("async", -1)  # k_steps as configured
    strategy.a_sync = False
    assert parameter_server_mode(strategy) == ("sync", 0)
    strategy.a_sync_configs = {"k_steps": 3}
    with pytest.raises(ValueError, match=r"a_sync=False \(sync\) cannot be combined"):
        parameter_server_mode(strategy)
    strategy.a_sync = True
    strategy.a_sync_configs = {"k_steps": 3}
    assert parameter_server_mode(strategy) == ("geo", 3)
    # Without ``mode``: Paddle's rule from a_sync and k_steps.
    assert parameter_server_mode(SimpleNamespace(a_sync=False)) == ("sync", 0)
    paddle_geo = SimpleNamespace(a_sync=True, a_sync_configs={"k_steps": 4})
    assert parameter_server_mode(paddle_geo) == ("geo", 4)
    assert parameter_server_mode(SimpleNamespace(a_sync_configs={"k_steps": "x"})) == ("async", 0)
    assert parameter_server_mode(Strategy("GEO", 2)) == ("geo", 2)
    with pytest.raises(TrainerError, match=r"strategy.mode must be one of .*got 'hogwild'"):
        parameter_server_mode(Strategy("hogwild"))
    with pytest.raises(TrainerError, match=r"GEO .*a_sync_configs\['k_steps'\] >= 1, got 0"):
        parameter_server_mode(Strategy("geo"))


def test_a_geo_sync_adds_takes_and_merges_rows_as_numpy_would():
    """The one-pass kernels of a GEO sync give numpy's values bit for bit: a
    server adds ``deltas * scale`` (an id not admitted gets nothing and reads
    as zeros), a worker takes each row's change since its base, and merges
    the servers' rows keeping what it trained since it sent."""
    from trainer.ps.tables._row_updates import add_scaled_rows, merge_rows, take_changes
    from trainer.ps.tables._rows import ROW_STATS_DTYPE

    rng = np.random.default_rng(5)
    weights = rng.standard_normal((6, 3)).astype(np.float32)
    deltas = rng.standard_normal((4, 3)).astype(np.float32)
    rows = np.array([4, -1, 0, 2], dtype=np.int64)
    records = np.zeros(6, dtype=ROW_STATS_DTYPE)
    expected = weights.copy()
    expected[[4, 0, 2]] += torch.from_numpy(deltas[[0, 2, 3]]).mul(1 / 3).numpy()
    out = np.full((4, 3), 9.0, dtype=np.float32)
    add_scaled_rows(weights, rows, deltas, 1 / 3, out, records)
    assert weights.tobytes() == expected.tobytes()
    assert out[1].tolist() == [0.0] * 3 and out[[0, 2, 3]].tobytes() == weights[[4, 0, 2]].tobytes()
    assert records["changed"].tolist() == [1, 0, 1, 0, 1, 0]

    base = rng.standard_normal((6, 3)).astype(np.float32)
    sent_rows = np.array([1, 5, 3], dtype=np.int64)
    expected_changes = weights[sent_rows] - base[sent_rows]
    changes = take_changes(weights, base, sent_rows)
    assert changes.tobytes() == expected_changes.tobytes()
    assert records["changed"].tolist() == [1, 0, 1, 0, 1, 0]  # reading changes nothing
    assert base[sent_rows].tobytes() == weights[sent_rows].tobytes()
    weights[sent_rows] += 0.25  # trained after the sync was sent
    merged = rng.standard_normal((3, 3)).astype(np.float32)
    expected = weights.copy()
    expected[sent_rows] = weights[sent_rows] + (merged - base[sent_rows])
    merge_rows(weights, base, sent_rows, merged, records)
    assert weights.tobytes() == expected.tobytes() and base[sent_rows].tobytes() == merged.tobytes()
    assert records["changed"].tolist() == [1, 1, 1, 1, 1, 1]  # a delta save takes merged rows

    with pytest.raises(IndexError, match="row 6 outside the table's 6 rows"):
        take_changes(weights, base, np.array([6], dtype=np.int64))
    with pytest.raises(IndexError, match="row -1 outside"):
        merge_rows(weights, base, np.array([-1], dtype=np.int64), merged[:1], records)
    for outside in (-2, 6):
        with pytest.raises(IndexError, match=f"row {outside} outside"):
            add_scaled_rows(weights, np.array([outside], dtype=np.int64), deltas[:1], 1.0,
                            out[:1], records)
    with pytest.raises(ValueError, match=r"expected deltas and out of shape \(1, 3\)"):
        add_scaled_rows(weights, rows[:1], deltas, 1.0, out, records)
    with pytest.raises(ValueError, match="expected merged rows of shape"):
        merge_rows(weights, base, sent_rows, merged[:2], records)


def test_a_half_table_returns_the_rows_it_stored_from_a_geo_add():
    """A server table of 16-bit rows adds a GEO delta to half precision and
    answers with the rows as stored, which its next pull reads."""
    table = SparseTable("geo_half_add", 4, OptimizerSpec("adagrad", {"lr": 0.1}),
                        storage="float16")
    ids = np.array([3, 9, 27], dtype=np.uint64)
    before = table.pull(ids).numpy()
    deltas = torch.linspace(-0.5, 0.5, 12).reshape(3, 4)
    answer = table.add(ids, deltas, 0.5).numpy()
    assert answer.tobytes() == table.pull(ids, create=False).numpy().tobytes()
    np.testing.assert_allclose(answer, before + 0.5 * deltas.numpy(), rtol=2**-10, atol=2**-14)
    # Each add rounds at random: adds of a quarter of a half's last digit move
    # the row by their sum on average (to nearest, they would never move it).
    one = ids[:1]
    table.add(one, torch.from_numpy(0.01 - table.pull(one, create=False).numpy()))
    start = table.pull(one, create=False).numpy()[0].astype(np.float64)
    digit = float(np.spacing(np.float16(0.01)))  # 2^-17 in [2^-7, 2^-6)
    for _ in range(400):
        table.add(one, torch.full((1, 4), digit / 4))
    moved = (table.pull(one, create=False).numpy()[0] - start) / digit
    # 100 digits expected; each add's rounding is a coin of p=1/4, so the sum's
    # spread is sqrt(400 * 1/4 * 3/4) ~ 8.7 digits: 40 is over 4.5 of them.
    assert np.all(np.abs(moved - 100) < 40), moved
