"""Hogwild trainer threads: train_from_dataset(thread=N) with lock-free updates
(trainer/loop/hogwild.py), against torch's own optimizers and the one-thread loop."""

from __future__ import annotations

import copy
import itertools
import logging
import sys
import threading
import traceback
from collections import Counter

import numpy as np
import pytest
import torch
from hogwild_support import CtrModel, clear_local_tables, local_optimizer
from torch import nn

from datafeed import Ragged
from trainer import Executor
from trainer.embedding import pending, stores
from trainer.loop.dense_update import DenseUpdate
from trainer.loop.hogwild import SUPPORTED_OPTIMIZERS, HogwildStep


@pytest.fixture(autouse=True)
def clean_local_tables():
    yield
    clear_local_tables()


def ctr_batches(records: int, seed: int, vocab: int = 200, size: int = 50) -> list[dict]:
    """Batches of 1-3 ids per record and one dense float; the label follows
    hidden per-id weights plus the dense value through a logistic."""
    truth = np.random.default_rng(99)
    weights = truth.normal(0, 1.5, vocab)
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(records // size):
        lengths = rng.integers(1, 4, size)
        picks = rng.integers(0, vocab, lengths.sum())
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        dense = rng.normal(0, 1, size).astype(np.float32)
        logit = np.add.reduceat(weights[picks], offsets[:-1]) + 1.5 * dense
        label = (rng.random(size) < 1 / (1 + np.exp(-logit))).astype(np.float32)
        batches.append({
            "ids": Ragged(torch.from_numpy(picks + 10**12), torch.from_numpy(offsets)),
            "dense": torch.from_numpy(dense)[:, None],
            "label": torch.from_numpy(label),
        })
    return batches


def held_out_auc(model: nn.Module, batches: list[dict]) -> float:
    model.eval()
    with torch.no_grad():
        scores = torch.cat([model(b)["prob"] for b in batches]).numpy()
    model.train()
    labels = torch.cat([b["label"] for b in batches]).numpy() > 0.5
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    positives, negatives = labels.sum(), (~labels).sum()
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))


# -- the update rule ---------------------------------------------------------------------


@pytest.mark.parametrize(("cls", "hyper"), [
    (torch.optim.SGD, {"lr": 0.1}),
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01}),
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True, "maximize": True}),
    (torch.optim.Adagrad, {"lr": 0.1, "lr_decay": 0.01, "weight_decay": 0.1,
                           "initial_accumulator_value": 0.1}),
    (torch.optim.Adam, {"lr": 0.01}),
    (torch.optim.Adam, {"lr": 0.01, "amsgrad": True, "weight_decay": 0.1}),
    (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}),
])
def test_one_threads_update_equals_torchs_step_bit_for_bit(cls, hyper):
    torch.manual_seed(0)
    reference = nn.Linear(5, 3)
    hogwild = copy.deepcopy(reference)
    torch_optimizer = cls(reference.parameters(), **hyper)
    optimizer = cls(hogwild.parameters(), **hyper)
    update = DenseUpdate(optimizer)
    for _ in range(4):
        x = torch.randn(8, 5)
        torch_optimizer.zero_grad()
        reference(x).pow(2).sum().backward()
        torch_optimizer.step()
        update.apply(torch.autograd.grad(hogwild(x).pow(2).sum(), update.params))
    for a, b in zip(reference.parameters(), hogwild.parameters(), strict=True):
        assert torch.equal(a, b)
        assert a.grad is not None and b.grad is None  # the thread kept its gradients
        for key, value in torch_optimizer.state[a].items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(optimizer.state[b][key]))
    # torch's own step continues from the state the update made (a thread=1 pass).
    for opt, model in ((torch_optimizer, reference), (optimizer, hogwild)):
        opt.zero_grad()
        model(torch.ones(2, 5)).sum().backward()
        opt.step()
    pairs = zip(reference.parameters(), hogwild.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


def test_other_optimizers_and_modes_are_refused_with_the_supported_ones():
    model = nn.Linear(2, 1)
    with pytest.raises(ValueError, match=r"RMSprop .*\('SGD', 'Adagrad', 'Adam', 'AdamW'\)"):
        DenseUpdate(torch.optim.RMSprop(model.parameters()))
    with pytest.raises(ValueError, match="sets differentiable=True"):
        DenseUpdate(torch.optim.SGD(model.parameters(), lr=0.1, differentiable=True))
    with pytest.raises(ValueError, match="not a torch optimizer"):
        HogwildStep(object())
    assert SUPPORTED_OPTIMIZERS == ("SGD", "Adagrad", "Adam", "AdamW")


class SparseGradientModel(nn.Module):
    """ctr_batches' model with a torch EmbeddingBag(sparse=True): sparse gradients."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.emb = nn.EmbeddingBag(200, 4, mode="sum", sparse=True)
        self.out = nn.Linear(5, 1)

    def forward(self, batch: dict) -> dict:
        ids = batch["ids"]
        pooled = self.emb(ids.values - 10**12, ids.offsets[:-1])
        logit = self.out(torch.cat([pooled, batch["dense"]], 1)).squeeze(1)
        loss = nn.functional.binary_cross_entropy_with_logits(logit, batch["label"])
        return {"loss": loss, "prob": torch.sigmoid(logit)}


# torch's Adagrad warns so on its sparse path, once a process, under any loop.
@pytest.mark.filterwarnings("ignore:Sparse invariant checks are implicitly disabled")
@pytest.mark.parametrize("cls", [torch.optim.Adagrad, torch.optim.SGD])
def test_sparse_gradients_take_torchs_own_step(cls):
    """torch applies an Embedding(sparse=True)'s sparse gradient with Adagrad or
    SGD; train_from_dataset's foreach update did not (a crash at the first step)."""
    batches = ctr_batches(500, seed=1)
    reference, trained = SparseGradientModel(), SparseGradientModel()
    optimizer = cls(reference.parameters(), lr=0.1)
    for batch in batches:
        optimizer.zero_grad()
        reference(batch)["loss"].backward()
        optimizer.step()
    summary = Executor().train_from_dataset(
        trained, batches, cls(trained.parameters(), lr=0.1), thread=1, fetch_list=[]
    )
    assert summary.batches == len(batches)
    for a, b in zip(reference.parameters(), trained.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.filterwarnings("ignore:Sparse invariant checks are implicitly disabled")
def test_hogwild_steps_sparse_gradients_one_at_a_time_unless_plain_sgd(caplog):
    with caplog.at_level(logging.WARNING, logger="trainer.executor"):
        model = SparseGradientModel()
        summary = Executor().train_from_dataset(
            model, ctr_batches(500, seed=1), torch.optim.Adagrad(model.parameters(), lr=0.1),
            thread=2, fetch_list=[], hogwild=True,
        )
    assert summary.batches == 10
    assert "'emb' (EmbeddingBag) make sparse gradients" in summary.hogwild_fallback
    assert "step one at a time" in caplog.text
    model = SparseGradientModel()
    summary = Executor().train_from_dataset(
        model, ctr_batches(500, seed=1), torch.optim.SGD(model.parameters(), lr=0.1),
        thread=2, fetch_list=[], hogwild=True,
    )
    assert summary.batches == 10 and summary.hogwild_fallback is None
    # ...whose lock-free update of a sparse gradient is torch's step, bit for bit.
    reference, hogwild = SparseGradientModel(), SparseGradientModel()
    torch_sgd = torch.optim.SGD(reference.parameters(), lr=0.1)
    update = DenseUpdate(torch.optim.SGD(hogwild.parameters(), lr=0.1))
    for batch in ctr_batches(200, seed=2):
        torch_sgd.zero_grad()
        reference(batch)["loss"].backward()
        torch_sgd.step()
        update.apply(torch.autograd.grad(hogwild(batch)["loss"], update.params))
    for a, b in zip(reference.parameters(), hogwild.parameters(), strict=True):
        assert torch.equal(a, b)


# -- train_from_dataset(thread=N) ------------------------------------------------------------


def test_thread_1_is_torchs_loop_exactly():
    batches = ctr_batches(1000, seed=1)
    results = []
    name = "thread1_vs_torch"  # new rows' values depend on the table's name: one for both
    for use_executor in (True, False):
        stores.local_store().clear()
        model = CtrModel(name=name)
        optimizer = local_optimizer(model, torch.optim.Adagrad(model.parameters(), lr=0.1))
        if use_executor:
            Executor().train_from_dataset(model, batches, optimizer, thread=1, fetch_list=[])
        else:  # the loop train_from_dataset ran before Hogwild threads existed
            for batch in batches:
                optimizer.zero_grad(set_to_none=True)
                model(batch)["loss"].backward()
                optimizer.step()
        table = stores.local_store().tables[model.emb.name]
        rows = table.pull(np.arange(200, dtype=np.uint64) + 10**12, create=False)
        results.append([p.detach().clone() for p in model.parameters()] + [rows])
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))


def test_threads_run_their_forwards_at_the_same_time(caplog):
    meeting = threading.Barrier(2, timeout=20)
    met: dict[int, int] = {}  # thread id: its place at the barrier

    class Meeting(CtrModel):
        def forward(self, batch):
            # Each thread's first forward waits for the other's. Keyed by thread,
            # not by len(met): the thread the barrier lets go first used to see
            # len(met) == 1 at its second batch when the other had not yet been
            # scheduled to record its own meeting, wait at the barrier again,
            # alone, and break it (8 of 300 runs beside two busy loops).
            me = threading.get_ident()
            if me not in met:
                try:
                    met[me] = meeting.wait()
                except threading.BrokenBarrierError as broken:
                    # Say where every thread was, should the other never come.
                    stacks = "".join(
                        f"\n-- thread {ident}:\n" + "".join(traceback.format_stack(frame))
                        for ident, frame in sys._current_frames().items()
                    )
                    message = f"the other trainer never met this one:{stacks}"
                    raise AssertionError(message) from broken
            return super().forward(batch)

    model = Meeting()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with caplog.at_level(logging.WARNING, logger="trainer.executor"):
        summary = Executor().train_from_dataset(
            model, ctr_batches(500, seed=1), optimizer, thread=2, fetch_list=[], hogwild=True
        )
    assert sorted(met.values()) == [0, 1]  # under one step lock the barrier would break
    assert summary.batches == 10 and summary.threads == 2
    assert not caplog.records


def test_unsupported_optimizer_steps_one_at_a_time_with_a_warning(caplog):
    model = CtrModel()
    optimizer = torch.optim.RMSprop(model.parameters(), lr=0.01)
    with caplog.at_level(logging.WARNING, logger="trainer.executor"):
        summary = Executor().train_from_dataset(
            model, ctr_batches(500, seed=1), optimizer, thread=2, fetch_list=[], hogwild=True
        )
    assert summary.batches == 10
    assert "RMSprop is not one of the optimizers updated lock-free" in caplog.text
    assert "step one at a time" in caplog.text


def test_hogwild_threads_train_to_the_same_auc_band():
    train, test = ctr_batches(6000, seed=1, size=100), ctr_batches(3000, seed=2)
    aucs = {}
    for threads in (1, 2):
        stores.local_store().clear()
        model = CtrModel()
        optimizer = local_optimizer(model, torch.optim.Adagrad(model.parameters(), lr=0.1))
        for _ in range(2):
            Executor().train_from_dataset(model, train, optimizer, thread=threads, hogwild=True,
                                          fetch_list=[])
        aucs[threads] = held_out_auc(model, test)
    # Measured gaps are below 0.003; the band leaves room for thread interleavings.
    assert aucs[1] > 0.85, aucs
    assert abs(aucs[2] - aucs[1]) < 0.01, aucs


def test_no_sparse_update_is_lost(monkeypatch):
    """Each batch's distinct ids are pushed once each, whichever thread ran it."""
    batches = ctr_batches(6000, seed=5, vocab=50)
    expected: Counter = Counter()
    for batch in batches:
        expected.update(np.unique(batch["ids"].values.numpy()).tolist())
    model = CtrModel()
    optimizer = local_optimizer(model, torch.optim.Adam(model.parameters(), lr=0.01))
    store = stores.local_store()
    pushed: Counter = Counter()
    counting = threading.Lock()
    push = store.push

    def counted_push(gradients):
        for ids, grads in gradients.values():
            assert grads.shape == (len(ids), 4) and torch.isfinite(grads).all()
            with counting:
                pushed.update(ids.view(np.int64).tolist())
        push(gradients)

    monkeypatch.setattr(store, "push", counted_push)
    summary = Executor().train_from_dataset(model, batches, optimizer, thread=3, hogwild=True,
                                            fetch_list=[])
    assert summary.batches == len(batches)
    assert pushed == expected
    assert pending.pending_rows() == []


def test_a_failing_thread_stops_every_thread_with_its_error():
    calls = itertools.count()
    seen_after_failure = []
    failed = threading.Event()

    class Failing(CtrModel):
        def forward(self, batch):
            if next(calls) == 7:
                failed.set()
                raise RuntimeError("batch 7 is broken")
            if failed.is_set():
                seen_after_failure.append(1)
            return super().forward(batch)

    model = Failing()
    optimizer = local_optimizer(model, torch.optim.Adagrad(model.parameters(), lr=0.1))
    batches = ctr_batches(20000, seed=1)
    with pytest.raises(RuntimeError, match="batch 7 is broken"):
        Executor().train_from_dataset(
            model, batches, optimizer, thread=3, fetch_list=[], hogwild=True
        )
    # Every thread stops at its next batch: at most one forward each after the failure.
    assert len(seen_after_failure) <= 2
    assert not [t for t in threading.enumerate() if t.name.startswith("trainer-worker")]


@pytest.mark.parametrize("threads", [1, 2])
def test_step_timings_split_into_pull_optimizer_and_push(threads):
    model = CtrModel(seed=4)
    optimizer = local_optimizer(model, torch.optim.Adagrad(model.parameters(), lr=0.1))
    summary = Executor().train_from_dataset(
        model, ctr_batches(2000, seed=4), optimizer, thread=threads, fetch_list=[],
        hogwild=threads > 1,
    )
    timings = summary.timings
    assert 0 < timings["pull"] < timings["forward"]
    assert timings["optimizer"] > 0 and timings["push"] > 0
    assert timings["optimizer"] + timings["push"] == pytest.approx(timings["step"], rel=1e-6)
