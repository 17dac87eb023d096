"""Tables that keep their rows as 16-bit floats (``storage="float16"``, issue 28):
half the bytes a row, the same updates computed in float32 and rounded to the
nearest half, and float32 everywhere outside the table."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainer.nn import SparseEmbedding
from trainer.ps.tables._row_updates import sgd_rows
from trainer.ps.tables._rows import IdIndex, pull_rows
from trainer.ps.tables.optim import OptimizerSpec
from trainer.ps.tables.step_rows import pull_distinct_numbered, push_pooled_numbered
from trainer.ps.tables.table import SparseTable

ADAGRAD = OptimizerSpec("adagrad", {"lr": 0.05})


def test_every_half_value_reads_back_exactly():
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16).reshape(-1, 8).copy()
    index = IdIndex()
    ids = np.arange(halves.shape[0], dtype=np.uint64)
    index.lookup_or_insert(ids)
    out = np.empty(halves.shape, dtype=np.float32)
    pull_rows(index, ids, halves.view(np.uint16), out, None, 0)
    expected = halves.astype(np.float32)
    assert np.array_equal(np.isnan(out), np.isnan(expected))
    assert np.array_equal(out[~np.isnan(out)], expected[~np.isnan(expected)])


def store(values: np.ndarray) -> np.ndarray:
    """``values`` (float32 [n, 8]) stored in a 16-bit table's rows: an SGD
    step of lr -1 from zero stores the gradient itself."""
    stored = np.zeros(values.shape, dtype=np.float16)
    sgd_rows(stored.view(np.uint16), np.arange(values.shape[0], dtype=np.int64),
             np.ascontiguousarray(values, dtype=np.float32), -1.0, 0.0)
    return stored


def test_a_float_is_stored_as_one_of_the_two_halves_around_it():
    rng = np.random.default_rng(3)
    scales = (1e-8, 3e-8, 1e-6, 6e-5, 1e-3, 1.0, 300.0, 6e4)
    values = np.concatenate([rng.standard_normal(40_000) * s for s in scales])
    values = np.resize(values.astype(np.float32), (values.size // 8) * 8).reshape(-1, 8)
    values = values[np.abs(values).max(axis=1) < 65504]
    stored = store(values).astype(np.float64)
    exact = values.astype(np.float64)
    nearest = values.astype(np.float16)
    toward = np.nextafter(nearest, np.where(exact > nearest, np.inf, -np.inf).astype(np.float16))
    assert np.all((stored == nearest) | (stored == toward.astype(np.float64)))
    # Rounded up and down both, not always to the nearest.
    assert 0.05 < np.mean(stored != nearest.astype(np.float64)) < 0.5


def test_stochastic_rounding_keeps_the_mean_of_what_is_stored():
    # 1.00007 lies between the halves 1.0 and 1.0009765625: stored 160,000
    # times, the mean must be it, within 5 standard errors of the two-point
    # rounding (its standard deviation is at most half the halves' gap).
    value = np.float32(1.00007)
    stored = store(np.full((20_000, 8), value, dtype=np.float32)).astype(np.float64)
    assert set(np.unique(stored)) <= {1.0, 1.0009765625}
    error = 5 * (0.0009765625 / 2) / np.sqrt(stored.size)
    assert abs(stored.mean() - float(value)) < error
    # Far under the smallest half (2^-24, 6e-8): stored now and then, on average right.
    tiny = store(np.full((50_000, 8), 1e-9, dtype=np.float32)).astype(np.float64)
    assert abs(tiny.mean() - 1e-9) < 5 * np.sqrt(1e-9 * 2**-24 / tiny.size)


def test_a_rare_id_with_small_gradients_trains_as_in_a_float_table():
    # Gradients of 1e-4 square to 1e-8, under half the smallest half: a half
    # sum rounded to nearest stayed 0 and each step was a whole lr (the row
    # reached -9.96 where float32's reached -1.35 after 200 steps). The table
    # keeps the sums' roots (1e-4 and up: halves to three digits).
    full, half = table_pair()
    ids = np.array([7], dtype=np.uint64)
    grad = torch.full((1, 8), 1e-4)
    for _ in range(200):
        full.push(ids, grad)
        half.push(ids, grad)
    rows_full, rows_half = full.pull(ids, create=False), half.pull(ids, create=False)
    # Measured: within 0.4-0.7% (3 runs: the rows' own random rounding); the band is 3%.
    np.testing.assert_allclose(rows_half, rows_full, rtol=0.03)
    sums = half.state_dict()["state.sum"].numpy()
    np.testing.assert_allclose(sums, 200 * 1e-8, rtol=0.03)


def test_a_sum_far_past_the_largest_half_is_kept_and_the_row_trains_on():
    _, half = table_pair()
    ids = np.array([11], dtype=np.uint64)
    half.push(ids, torch.full((1, 8), 1e3))  # a sum of 1e6: its root, 1000, is a half
    np.testing.assert_allclose(half.state_dict()["state.sum"].numpy(), 1e6, rtol=1e-3)
    before = half.pull(ids, create=False).clone()
    half.push(ids, torch.full((1, 8), 50.0))
    assert torch.all(half.pull(ids, create=False) < before)


def table_pair(optimizer: OptimizerSpec = ADAGRAD) -> tuple[SparseTable, SparseTable]:
    return (SparseTable("t", 8, optimizer, seed=5, init_scale=0.1),
            SparseTable("t", 8, optimizer, seed=5, init_scale=0.1, storage="float16"))


def test_a_half_table_trains_as_the_float_table_to_half_precision():
    full, half = table_pair()
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 1 << 40, 3000).astype(np.uint64)
    for _ in range(20):
        batch = np.unique(ids[rng.integers(0, ids.size, 500)])
        grads = torch.from_numpy(rng.standard_normal((batch.size, 8)).astype(np.float32) * 0.1)
        rows_full, rows_half = full.pull(batch), half.pull(batch)
        assert rows_half.dtype == torch.float32
        # The half table's rows are its float twin's to half precision: each
        # step rounds a row and its sum (at most 2^-10 relative, at random);
        # over these 20 Adagrad steps of lr 0.05 the rows drifted apart by at
        # most 1.8e-4 (measured, seed 0): the band is five times that.
        np.testing.assert_allclose(rows_half, rows_full, rtol=0, atol=1e-3)
        full.push(batch, grads)
        half.push(batch, grads)
    assert half._weights.dtype == np.float16 and half._state["sum"].dtype == np.float16
    held = full.stats()["bytes"], half.stats()["bytes"]
    assert held[1] < 0.75 * held[0]  # rows and sums halved; statistics and index not


def test_a_pooled_push_updates_half_rows_as_a_push_of_their_gradient():
    full, half = table_pair()
    values = np.array([3, 9, 3, 12, 9, 3], dtype=np.int64)
    offsets = np.array([0, 2, 4, 6])
    from trainer.ps.tables.pooling import Pooling

    for table in (full, half):
        unique, positions, _, pulled = pull_distinct_numbered(table, values)
        pooling = Pooling(positions, torch.from_numpy(offsets), False, unique.shape[0])
        grad = torch.tensor([[0.5] * 8, [-1.0] * 8, [2.0] * 8])
        assert push_pooled_numbered(table, grad, pooling, pulled)
    ids = np.array([3, 9, 12], dtype=np.uint64)
    np.testing.assert_allclose(half.read_rows(half.rows(ids)), full.read_rows(full.rows(ids)),
                               rtol=4e-3, atol=1e-4)


def test_saves_and_loads_of_a_half_table_carry_its_values_as_float32():
    _, half = table_pair()
    ids = np.arange(1, 200, dtype=np.uint64)
    half.push(ids, torch.full((ids.size, 8), 0.25))
    state = half.state_dict()
    assert state["weights"].dtype == torch.float32 and state["state.sum"].dtype == torch.float32
    assert np.array_equal(state["weights"].numpy(), half._weights[: ids.size].astype(np.float32))
    header: dict = {}
    chunks: list[dict] = []
    half.export_rows(header.update, lambda columns: chunks.append(
        {k: np.array(v) for k, v in columns.items()}))
    assert chunks[0]["weights"].dtype == np.float32
    saved = {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}
    saved["pass"], saved["optimizer"] = header["pass"], header["optimizer"]
    loaded = SparseTable("t", 8, ADAGRAD, seed=5, init_scale=0.1, storage="float16")
    loaded.load_state_dict(saved)
    assert np.array_equal(loaded._weights[: ids.size], half._weights[: ids.size])
    # The sums are saved as sums (the table keeps their roots): loaded back
    # to the same roots, up to one rounding of a root.
    np.testing.assert_allclose(loaded._state["sum"][: ids.size].astype(np.float32),
                               half._state["sum"][: ids.size].astype(np.float32), rtol=2e-3)
    np.testing.assert_allclose(saved["state.sum"], 0.25**2, rtol=2e-3)


def test_a_float_checkpoint_past_the_largest_half_loads_saturated():
    # "A checkpoint loads into a table of either storage": past 65504 a value
    # saturates as a push's does; it loaded as inf, and an inf Adagrad sum
    # froze its row (every step divided by it).
    ids = np.array([1, 2], dtype=np.uint64)
    saved = {"ids": ids, "optimizer": "adagrad",
             "weights": np.array([[7e4, -1e6], [1.0, 2.0]], np.float32),
             "state.sum": np.array([[5e9, 1.0], [1.0, 1.0]], np.float32)}
    half = SparseTable("t", 2, ADAGRAD, storage="float16")
    half.load_state_dict(saved)
    state = half.state_dict()
    assert state["weights"].tolist() == [[65504.0, -65504.0], [1.0, 2.0]]
    assert state["state.sum"][0, 0] == 65504.0**2  # the root saturates
    half.push(ids, torch.ones(2, 2))
    after = half.state_dict()
    assert torch.isfinite(after["state.sum"]).all() and torch.isfinite(after["weights"]).all()


def test_half_storage_is_for_sgd_and_adagrad_only():
    with pytest.raises(ValueError, match="float16.*'adam'"):
        SparseTable("t", 8, OptimizerSpec("adam", {"lr": 0.01}), storage="float16")
    with pytest.raises(ValueError, match="storage must be"):
        SparseTable("t", 8, ADAGRAD, storage="bfloat16")
    with pytest.raises(ValueError, match="float16.*'adam'"):
        SparseEmbedding(4, "half_adam", optimizer={"type": "adam"}, storage="float16")
    half = SparseTable("t", 8, ADAGRAD, storage="float16")
    with pytest.raises(ValueError, match="float16"):
        half.set_optimizer(OptimizerSpec("adam", {"lr": 0.01}))


def test_a_sparse_embedding_with_half_storage_trains_its_local_table():
    from trainer.embedding import pending, stores

    torch.manual_seed(0)
    emb = SparseEmbedding(4, "half_local", optimizer={"type": "adagrad", "lr": 0.5},
                          storage="float16")
    ids = torch.tensor([1, 2, 3, 2], dtype=torch.int64)
    target = torch.ones(4, 4)
    try:
        losses = []
        for _ in range(30):
            loss = ((emb(ids) - target) ** 2).mean()
            loss.backward()
            stores.local_store().push_pending()
            losses.append(loss.item())
        table = stores.local_store().tables["half_local"]
        assert table.storage == "float16" and table._weights.dtype == np.float16
        assert losses[-1] < 0.05 * losses[0]
    finally:
        pending.clear_pending()
        stores.local_store().tables.pop("half_local", None)
