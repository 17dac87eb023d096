"""SparseEmbedding in local mode, the hash index and sparse tables, and the
sparse optimizers against torch's dense ones."""

from __future__ import annotations

import gc
import itertools
import threading
import weakref

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from datafeed import Ragged
from trainer.embedding import pending, stores
from trainer.job.role import ClusterRole
from trainer.nn import SparseEmbedding
from trainer.ps import ParameterServerRuntime, load_local
from trainer.ps.checkpoint import table_files
from trainer.ps.tables._rows import ROW_STATS_DTYPE, pull_rows
from trainer.ps.tables.optim import OptimizerSpec
from trainer.ps.tables.table import IdIndex, SparseTable, as_u64, shard_of

_names = itertools.count()


def fresh(prefix: str = "t") -> str:
    """A table name no other test uses (tables are process-wide)."""
    return f"{prefix}{next(_names)}"


@pytest.fixture(autouse=True)
def clean_local_tables():
    yield
    stores.local_store().clear()
    pending.clear_pending()


# -- the hash index ------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), unique=True, max_size=3000), st.integers(1, 5))
def test_index_matches_a_dict(ids, batches):
    index = IdIndex()
    expected: dict[int, int] = {}
    keys = np.array(ids, dtype=np.uint64)
    for part in np.array_split(keys, batches):
        new = part[index.lookup(part) < 0]
        rows = index.insert_new(new)
        expected.update(zip(new.tolist(), rows.tolist(), strict=True))
    assert index.size == len(expected)
    assert index.lookup(keys).tolist() == [expected[k] for k in keys.tolist()]
    absent = np.array([k for k in range(50) if k not in expected], dtype=np.uint64)
    assert (index.lookup(absent) == -1).all()
    assert index.ids_in_row_order().tolist() == sorted(expected, key=expected.get)


def test_index_grows_and_keeps_rows():
    index = IdIndex()
    ids = np.arange(1, 20_001, dtype=np.uint64) * np.uint64(0x10000000001)
    for part in np.array_split(ids, 7):
        index.insert_new(part)
    assert 10 * ids.size <= 9 * index.capacity  # at most 9/10 full
    assert (index.lookup(ids) == np.arange(ids.size)).all()


def test_the_all_ones_id_is_an_id_like_any_other():
    # A free slot's key is all ones: that id must still be found only where
    # it was inserted, and be absent before.
    index = IdIndex()
    top = np.array([2**64 - 1], dtype=np.uint64)
    assert index.lookup(top).tolist() == [-1]
    others = np.arange(1, 4000, dtype=np.uint64)
    index.insert_new(others)
    assert index.lookup(top).tolist() == [-1]
    assert index.insert_new(top).tolist() == [others.size]
    assert index.lookup(np.concatenate([top, others[:3]])).tolist() == [others.size, 0, 1, 2]
    assert index.ids_in_row_order()[-1] == top[0]


def test_index_memory_per_id_stays_in_its_band_as_it_grows():
    # Buckets of 5 slots in 64 bytes, at most 9/10 full, grown to 18/25 full:
    # 14.2-17.8 bytes an id at every size, never the double of a doubling.
    index = IdIndex()
    ids = np.arange(1, 2_000_001, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    size, sizes = 20_000, []
    while size <= ids.size:
        sizes.append(size)
        size = int(size * 1.1)
    done = 0
    for size in sizes:
        index.insert_new(ids[done:size])
        done = size
        per_id = index.cells.nbytes / size
        assert 64 / 5 / (9 / 10) <= per_id <= 64 / 5 / (18 / 25) + 0.1, (size, per_id)
    assert (index.lookup(ids[:done]) == np.arange(done)).all()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=300), st.lists(st.integers(0, 40), max_size=30))
def test_a_pull_of_values_is_their_distinct_ids_pulled(values, present):
    """``pull_values`` (one pass) gives ``unique_inverse`` then ``pull_rows``:
    the same distinct ids, positions, row numbers, rows and statistics."""
    from trainer.ps.tables._rows import pull_values, unique_inverse

    def table_of(ids):
        table = SparseTable("t", 3, OptimizerSpec("sgd"))
        table.push(torch.tensor(sorted(set(ids)), dtype=torch.int64), torch.ones(len(set(ids)), 3))
        return table

    fused, apart = table_of(present), table_of(present)
    keys = np.array(values, dtype=np.int64)
    unique, inverse, rows, out, missing = pull_values(
        fused._index, keys, fused._weights, fused._stats.records, 7
    )
    expected_unique, expected_inverse = unique_inverse(keys)
    expected_out = np.zeros((expected_unique.shape[0], 3), dtype=np.float32)
    expected_rows, expected_missing = pull_rows(
        apart._index, expected_unique, apart._weights, expected_out, apart._stats.records, 7
    )
    assert unique.tolist() == expected_unique.view(np.uint64).tolist()
    assert inverse.tolist() == expected_inverse.tolist()
    assert rows.tolist() == expected_rows.tolist() and missing == expected_missing
    found = rows >= 0
    assert np.array_equal(out[found], expected_out[found])
    assert np.array_equal(fused._stats.records, apart._stats.records)


@pytest.mark.parametrize("kind", ["sgd", "adagrad"])
@pytest.mark.parametrize("mean", [False, True])
def test_a_pooled_push_is_the_unpooled_gradient_applied(kind, mean):
    """``push_pooled`` gives bit for bit ``unpool_rows`` then ``adagrad_rows``
    / ``sgd_rows``, and drops the gradient of a row numbered -1."""
    from trainer.ps.tables._row_updates import adagrad_rows, push_pooled, sgd_rows, unpool_rows

    rng = np.random.default_rng(3)
    weights = rng.standard_normal((6, 4)).astype(np.float32)
    state = rng.random((6, 4)).astype(np.float32)
    records = np.zeros(6, dtype=ROW_STATS_DTYPE)
    positions = np.array([0, 1, 0, 2, 3, 1, 0], dtype=np.int64)
    bounds = np.array([0, 3, 3, 5, 7], dtype=np.int64)
    rows = np.array([4, 2, -1, 0], dtype=np.int64)  # position 2: not admitted
    grad = rng.standard_normal((4, 4)).astype(np.float32)
    fused_w, fused_s = weights.copy(), state.copy()
    push_pooled(fused_w, fused_s if kind == "adagrad" else None, rows, grad, positions, bounds,
                mean, 0.1, 1e-6, 0.01, records)
    per_row = unpool_rows(grad, positions, bounds, mean, 4)
    kept = rows >= 0
    if kind == "adagrad":
        adagrad_rows(weights, state, rows[kept], per_row[kept], 0.1, 1e-6, 0.01)
    else:
        sgd_rows(weights, rows[kept], per_row[kept], 0.1, 0.01)
    assert np.array_equal(fused_w, weights) and np.array_equal(fused_s, state)
    assert records["changed"].tolist() == [1, 0, 1, 0, 1, 0]
    with pytest.raises(IndexError, match="row 6 outside the table's 6 rows"):
        push_pooled(fused_w, None, np.array([6, 0, 1, 2]), grad, positions, bounds, mean,
                    0.1, 0.0, 0.0, records)
    with pytest.raises(ValueError, match="offsets must run from 0 to the number of values"):
        push_pooled(fused_w, None, rows, grad, positions, bounds[:-1], mean, 0.1, 0.0, 0.0,
                    records)


def test_sharding_is_a_stable_partition():
    ids = as_u64(torch.arange(-5000, 5000))
    owners = shard_of(ids, 3)
    assert set(owners.tolist()) == {0, 1, 2}
    counts = np.bincount(owners)
    assert counts.min() > 0.25 * ids.size
    assert (shard_of(ids, 3) == owners).all()
    assert (shard_of(ids, 1) == 0).all()


# -- tables ------------------------------------------------------------------------


def test_new_rows_are_a_function_of_seed_name_and_id():
    ids = torch.tensor([1, 2**40, -1, 7])
    a = SparseTable("emb", 6, OptimizerSpec("sgd"), seed=3).pull(ids)
    b = SparseTable("emb", 6, OptimizerSpec("adam"), seed=3).pull(ids.flip(0)).flip(0)
    assert torch.equal(a, b)
    assert a.abs().max() <= 0.01 and a.std() > 0.001
    assert not torch.equal(a, SparseTable("emb", 6, OptimizerSpec("sgd"), seed=4).pull(ids))
    assert not torch.equal(a, SparseTable("other", 6, OptimizerSpec("sgd"), seed=3).pull(ids))


def test_pull_without_create_leaves_the_table_unchanged():
    table = SparseTable("t", 3, OptimizerSpec("sgd", {"lr": 1.0}))
    table.push(torch.tensor([5]), torch.ones(1, 3))
    out = table.pull(torch.tensor([5, 6]), create=False)
    assert len(table) == 1
    assert torch.allclose(out[1], torch.from_numpy(table.init_rows(as_u64(torch.tensor([6]))))[0])


OPTIMIZERS = [
    (torch.optim.SGD, {"lr": 0.3}),
    (torch.optim.SGD, {"lr": 0.1, "weight_decay": 0.01}),
    (torch.optim.Adagrad, {"lr": 0.2}),
    (torch.optim.Adagrad, {"lr": 0.2, "initial_accumulator_value": 0.1, "eps": 1e-6}),
    (torch.optim.Adam, {"lr": 0.05}),
    (torch.optim.Adam, {"lr": 0.05, "betas": (0.8, 0.9), "weight_decay": 0.01}),
    (torch.optim.AdamW, {"lr": 0.05}),
]


@pytest.mark.parametrize(("cls", "hyper"), OPTIMIZERS)
def test_table_optimizer_matches_torch_dense(cls, hyper):
    """Every row touched every step: the sparse update equals torch's dense one."""
    dim, n = 5, 40
    ids = torch.randint(-(2**62), 2**62, (n,), generator=torch.Generator().manual_seed(1)).unique()
    reference = nn.Parameter(torch.zeros(ids.numel(), dim))
    dense_opt = cls([reference], **hyper)
    table = SparseTable("t", dim, OptimizerSpec.from_torch(dense_opt))
    with torch.no_grad():
        reference.copy_(table.pull(ids))
    g = torch.Generator().manual_seed(2)
    for _ in range(6):
        grad = torch.randn(ids.numel(), dim, generator=g)
        reference.grad = grad.clone()
        dense_opt.step()
        perm = torch.randperm(ids.numel(), generator=g)
        table.push(ids[perm], grad[perm])
    torch.testing.assert_close(table.pull(ids), reference.detach(), rtol=1e-5, atol=1e-6)


def test_adam_is_lazy_per_row():
    table = SparseTable("t", 2, OptimizerSpec("adam", {"lr": 0.1}))
    before = table.pull(torch.tensor([1, 2])).clone()
    for _ in range(3):
        table.push(torch.tensor([1]), torch.ones(1, 2))
    table.push(torch.tensor([2]), torch.ones(1, 2))
    after = table.pull(torch.tensor([1, 2]))
    # Row 2's first step has full bias correction: exactly lr * sign(grad).
    torch.testing.assert_close(after[1], before[1] - 0.1, rtol=0, atol=1e-6)
    state = table.state_dict()
    assert state["state.step"].tolist() == [3.0, 1.0]


def test_unsupported_optimizers_are_rejected():
    p = [nn.Parameter(torch.zeros(1))]
    with pytest.raises(ValueError, match="momentum=0.9"):
        OptimizerSpec.from_torch(torch.optim.SGD(p, lr=0.1, momentum=0.9))
    with pytest.raises(ValueError, match="RMSprop"):
        OptimizerSpec.from_torch(torch.optim.RMSprop(p))
    with pytest.raises(ValueError, match="no setting"):
        OptimizerSpec.from_config({"type": "sgd", "lr": 0.1, "betas": (0.9, 0.9)})
    with pytest.raises(ValueError, match="'type'"):
        SparseEmbedding(4, fresh(), optimizer={"lr": 0.1})


# -- the module --------------------------------------------------------------------


def test_forward_pools_ragged_records():
    emb = SparseEmbedding(3, fresh())
    mean = SparseEmbedding(3, emb.name, mode="mean")  # shares the table
    x = Ragged(torch.tensor([10, 11, 11, -3, 2**62]), torch.tensor([0, 3, 3, 5]))
    rows = emb(torch.tensor([10, 11, -3, 2**62]))
    out = emb(x)
    assert out.shape == (3, 3)
    torch.testing.assert_close(out[0], rows[0] + 2 * rows[1])
    torch.testing.assert_close(out[1], torch.zeros(3))
    torch.testing.assert_close(out[2], rows[2] + rows[3])
    torch.testing.assert_close(mean(x)[0], (rows[0] + 2 * rows[1]) / 3)
    assert emb(torch.tensor([[1, 2, 3], [4, 5, 6]])).shape == (2, 3, 3)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 4), max_size=30), st.sampled_from(["sum", "mean"]))
def test_pooling_matches_embedding_bag(lengths, mode):
    """The C pooling gives embedding_bag's values, and the rows' gradients
    pushed equal embedding_bag's (empty records, one id per record, repeated
    ids)."""
    offsets = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int64)
    ids = torch.randint(0, 7, (int(offsets[-1]),))
    emb = SparseEmbedding(3, fresh(), mode=mode)
    out = emb(Ragged(ids, offsets))
    weights = torch.randn(out.shape)
    (out * weights).sum().backward()
    pushed = pending.take_gradients()
    distinct = torch.unique(ids)
    rows = stores.local_store().table(emb.config).pull(distinct, create=False)
    reference_rows = rows.clone().requires_grad_(True)
    expected = nn.functional.embedding_bag(
        torch.searchsorted(distinct, ids), reference_rows, offsets, mode=mode,
        include_last_offset=True,
    )
    (expected * weights).sum().backward()
    torch.testing.assert_close(out, expected)
    if ids.numel():
        pushed_ids, grads = pushed[emb.name]
        order = np.argsort(pushed_ids)
        np.testing.assert_array_equal(pushed_ids[order], distinct.numpy().view(np.uint64))
        torch.testing.assert_close(grads[order], reference_rows.grad)
    pending.clear_pending()


def test_the_rows_gradient_is_summed_over_repeats_in_value_order():
    """Each distinct id's gradient is its values' records' gradients added in
    value order (mean: each divided by its record's length first), bit for
    bit what the gather and scatter-add in torch give."""
    ids = torch.tensor([4, 9, 4, 4, 7, 9])
    offsets = torch.tensor([0, 3, 3, 5, 6])
    for mode in ("sum", "mean"):
        emb = SparseEmbedding(2, fresh(), mode=mode)
        out = emb(Ragged(ids, offsets))
        grad_out = torch.tensor([[0.1, 0.7], [5.0, 5.0], [1e-8, 3.0], [0.3, -0.2]])
        out.backward(grad_out)
        pushed_ids, grads = pending.take_gradients()[emb.name]
        assert pushed_ids.tolist() == [4, 9, 7]  # first appearance
        lengths = torch.tensor([3.0, 1.0, 2.0, 1.0]) if mode == "mean" else torch.ones(4)
        per_record = grad_out / lengths.unsqueeze(1)
        expected = torch.zeros(3, 2).index_add_(
            0, torch.tensor([0, 1, 0, 0, 2, 1]), per_record[torch.tensor([0, 0, 0, 2, 2, 3])]
        )
        assert torch.equal(grads, expected)
        pending.clear_pending()


def test_a_models_in_place_change_of_the_output_keeps_the_rows_gradient():
    emb = SparseEmbedding(2, fresh())
    out = emb(torch.tensor([3, 5]))
    out.mul_(2.0)  # the output is not the leaf whose gradient is the rows'
    out.sum().backward()
    _, grads = pending.take_gradients()[emb.name]
    assert torch.equal(grads, torch.full((2, 2), 2.0))


def test_offsets_known_uniform_are_checked_again_once_changed():
    emb = SparseEmbedding(2, fresh())
    ids = torch.tensor([5, 6, 7])
    offsets = torch.tensor([0, 1, 2, 3])  # one id per record: the gather alone
    rows = emb(ids)
    torch.testing.assert_close(emb(Ragged(ids, offsets)), rows)
    offsets[1] = 2  # the same tensor, now records of 2, 0 and 1 ids
    out = emb(Ragged(ids, offsets))
    torch.testing.assert_close(out, torch.stack([rows[0] + rows[1], torch.zeros(2), rows[2]]))
    with pytest.raises(ValueError, match=r"must not decrease, got \[1\] after \[2\]"):
        emb(Ragged(ids, torch.tensor([0, 2, 1, 3])))
    pending.clear_pending()


def test_tables_sharing_an_input_reuse_its_distinct_ids_until_it_changes():
    """(A PS worker pulls the tables whose distinct ids are one tensor in one
    round trip: trainer/ps/client.py.)"""
    ids = torch.tensor([5, 3, 5, 9])
    first, _ = stores.distinct(ids)
    second, _ = stores.distinct(ids)
    assert first is second  # one hash pass, one tensor of distinct ids for both pulls
    ids[0] = 7  # in place: the next pull must see the new ids
    third, inverse = stores.distinct(ids)
    assert third.tolist() == [7, 3, 5, 9] and inverse.tolist() == [0, 1, 2, 3]


def test_a_local_training_pull_makes_the_ids_distinct_itself():
    emb = SparseEmbedding(2, fresh())
    ids = torch.tensor([5, 3, 5, 9])
    x = Ragged(ids, torch.tensor([0, 2, 4]))
    first = emb(x)
    ids[0] = 7
    second = emb(x)
    assert pending._pending.items[-1][1].tolist() == [7, 3, 5, 9]
    rows = stores.local_store().table(emb.config).pull(torch.tensor([5, 3, 7, 9]), create=False)
    torch.testing.assert_close(first, torch.stack([rows[0] + rows[1], rows[0] + rows[3]]))
    torch.testing.assert_close(second, torch.stack([rows[2] + rows[1], rows[0] + rows[3]]))
    pending.clear_pending()


def test_shared_name_needs_the_same_settings():
    emb = SparseEmbedding(3, fresh())
    with pytest.raises(ValueError, match="same settings"):
        SparseEmbedding(4, emb.name)


def test_eval_mode_creates_no_rows():
    emb = SparseEmbedding(2, fresh())
    emb.eval()
    emb(torch.tensor([1, 2, 3]))
    assert len(stores.local_store().tables[emb.name]) == 0
    emb.train()
    emb(torch.tensor([1, 2, 3]))
    assert len(stores.local_store().tables[emb.name]) == 3


class TinyModel(nn.Module):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.emb = SparseEmbedding(4, prefix + "emb")
        self.wide = SparseEmbedding(1, prefix + "wide", optimizer={"type": "adagrad", "lr": 0.1})
        self.out = nn.Linear(4, 1)

    def forward(self, x: Ragged) -> torch.Tensor:
        return (self.out(self.emb(x)) + self.wide(x)).squeeze(1)


def synthetic(n: int, seed: int, vocab: int = 300) -> list[tuple[Ragged, torch.Tensor]]:
    """Batches of 50 records of 1-4 ids with a label from hidden per-id weights."""
    rng = np.random.default_rng(1234)
    keys = rng.integers(-(2**63), 2**63 - 1, vocab, dtype=np.int64)
    weights = rng.normal(0, 1.5, vocab)
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(n // 50):
        lengths = rng.integers(1, 5, 50)
        picks = rng.integers(0, vocab, lengths.sum())
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        logit = np.add.reduceat(weights[picks], offsets[:-1])
        label = (rng.random(50) < 1 / (1 + np.exp(-logit))).astype(np.float32)
        ids = Ragged(torch.from_numpy(keys[picks]), torch.from_numpy(offsets))
        batches.append((ids, torch.from_numpy(label)))
    return batches


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    pos = labels > 0.5
    return float((ranks[pos].sum() - pos.sum() * (pos.sum() + 1) / 2) / (pos.sum() * (~pos).sum()))


def evaluate(model: nn.Module, batches) -> float:
    model.eval()
    with torch.no_grad():
        scores = torch.cat([model(x) for x, _ in batches]).numpy()
    model.train()
    return auc(scores, torch.cat([y for _, y in batches]).numpy())


def test_local_runtime_trains_saves_and_loads(tmp_path):
    torch.manual_seed(0)
    prefix = fresh("local")
    model = TinyModel(prefix)
    runtime = ParameterServerRuntime(ClusterRole.local(), None)
    opt = runtime.distributed_optimizer(torch.optim.Adam(model.parameters(), lr=0.05))
    runtime.init_worker()  # a no-op in local mode
    train, test = synthetic(3000, seed=1), synthetic(1000, seed=2)
    before = evaluate(model, test)
    for _ in range(2):
        for x, y in train:
            loss = nn.functional.binary_cross_entropy_with_logits(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
    after = evaluate(model, test)
    assert after > 0.8 > before + 0.1
    tables = stores.local_store().tables
    assert tables[prefix + "emb"].optimizer.kind == "adam"
    assert tables[prefix + "wide"].optimizer.describe().startswith("adagrad(")

    runtime.save_persistables(str(tmp_path / "ckpt"))
    runtime.save_persistables(str(tmp_path / "ckpt"))  # overwrite in place
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "dense.shard0.pt",
        "meta.json",
        f"sparse.{prefix}emb.shard0.arrow",
        f"sparse.{prefix}wide.shard0.arrow",
    ]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no staging left
    saved = next(table_files.read_table(str(tmp_path / "ckpt"), prefix + "emb"))
    assert saved["weights"].shape == (len(tables[prefix + "emb"]), 4)

    stores.local_store().clear()
    fresh_model = TinyModel(prefix)
    assert evaluate(fresh_model, test) < 0.7
    load_local(fresh_model, str(tmp_path / "ckpt"))
    assert evaluate(fresh_model, test) == pytest.approx(after, abs=1e-9)


class WideModel(nn.Module):
    """Sparse rows and a bias only: torch's autograd rejects dense weights that
    another thread's step changed in place between forward and backward."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.wide = SparseEmbedding(1, prefix + "wide")
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, x: Ragged) -> torch.Tensor:
        return self.wide(x).squeeze(1) + self.bias


def test_hogwild_threads_push_their_own_pulls():
    model = WideModel(fresh("hog"))
    runtime = ParameterServerRuntime(ClusterRole.local(), None)
    opt = runtime.distributed_optimizer(torch.optim.Adagrad(model.parameters(), lr=0.1))
    batches = synthetic(3000, seed=3)
    errors = []

    def train(part):
        try:
            for x, y in part:
                nn.functional.binary_cross_entropy_with_logits(model(x), y).backward()
                opt.step()
                # Zeroed, not set to None: the other thread's torch optimizer
                # may be between its "grad is not None" check and its use of it.
                opt.zero_grad(set_to_none=False)
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=train, args=(batches[i::2],)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert evaluate(model, synthetic(1000, seed=4)) > 0.75


def test_geo_store_refuses_a_local_copy_that_could_drop_rows():
    """A GEO worker's copy keeps base, ids and touched aligned with its row
    numbers: a table that admits or evicts (entry, max_rows) cannot be one."""
    from trainer.embedding.tables import TableConfig
    from trainer.ps.client import GeoStore

    config = TableConfig(fresh("geo"), 2, 0, 0.01, None, max_rows=10)
    spec = OptimizerSpec("sgd", {"lr": 1.0})
    store = GeoStore(None, lambda c: c.make_table(spec))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"admits and evicts nothing .*max_rows 10"):
        store.pull(config, torch.tensor([1, 2]), training=True)
    lifecycle_free = GeoStore(None, lambda c: c.make_table(spec, lifecycle=False))  # type: ignore[arg-type]
    assert lifecycle_free.pull(config, torch.tensor([1, 2]), training=True).shape == (2, 2)


def test_a_kept_pull_does_not_keep_a_dropped_table_alive():
    """The row numbers a training pull keeps for its push refer to their table
    weakly: a table dropped before the push is freed."""
    emb = SparseEmbedding(2, fresh())
    emb(torch.tensor([1, 2]))  # a training pull, its row numbers kept
    table = weakref.ref(stores.local_store().tables[emb.name])
    del stores.local_store().tables[emb.name]
    pending.clear_pending()
    gc.collect()
    assert table() is None


def test_geo_store_trains_locally_and_merges_keeping_local_progress():
    """GEO between syncs: new rows start from their initial value without a
    server; deltas() sends each touched row's change and makes the sent value
    the base; merge() takes the servers' value while keeping the training done
    since the sync was sent."""
    from trainer.embedding.tables import TableConfig
    from trainer.ps.client import GeoStore

    config = TableConfig(fresh("geo"), 2, 0, 0.01, None)
    spec = OptimizerSpec("sgd", {"lr": 1.0})
    store = GeoStore(None, lambda c: c.make_table(spec))  # type: ignore[arg-type]
    ids = torch.tensor([4, -8])
    initial = store.pull(config, ids, training=True)
    torch.testing.assert_close(initial, config.make_table(spec).pull(ids, create=False))
    grads = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    store.apply({config.name: (as_u64(ids), grads)})
    sent_ids, delta = store.deltas()[config.name]
    order = [list(as_u64(ids)).index(i) for i in sent_ids]
    assert sorted(order) == [0, 1]
    torch.testing.assert_close(delta, -grads[order])  # SGD, lr 1
    store.pull(config, ids, training=True)
    store.apply({config.name: (as_u64(ids), grads)})  # trained after the sync was sent
    merged = torch.full((2, 2), 10.0)
    store.merge(config.name, sent_ids, merged)
    after = store.pull(config, torch.from_numpy(sent_ids.view(np.int64)), training=False)
    torch.testing.assert_close(after, merged - grads[order])
    assert store.deltas()[config.name][1].abs().sum() > 0  # the later training is the next delta
