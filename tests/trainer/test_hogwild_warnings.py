"""What train_from_dataset(hogwild=True) tells the user at every call: a
model whose dense embedding table Hogwild trainers would overwrite
(``RunSummary.hogwild_warning``), and steps one at a time where Hogwild cannot
run (``RunSummary.hogwild_fallback``)."""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hogwild_support import clear_local_tables, local_optimizer
from support import REPO
from torch import nn

from datafeed import InMemoryDataset, Ragged
from trainer import Executor
from trainer.loop import hogwild_processes
from trainer.loop.hogwild import COLLIDING_TABLE_ELEMENTS, collision_warning
from trainer.nn import SparseEmbedding


@pytest.fixture(autouse=True)
def clean_local_tables():
    yield
    clear_local_tables()
    hogwild_processes.close_workers()


def mlp_local_example():
    """examples/mlp_local/train.py as a module (its CtrMlp, SLOTS and
    CATEGORICAL), leaving sys.path as it was (it adds the example's folders)."""
    path = REPO / "examples" / "mlp_local" / "train.py"
    saved = list(sys.path)
    try:
        spec = importlib.util.spec_from_file_location("mlp_local_train", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved
    return module


class SmallCtr(nn.Module):
    """benchmarks/bench_small_ctr.py's small CTR model: a dense slot of 4 and
    three SparseEmbedding tables of dim 4 into a 16-16-1 MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.u = SparseEmbedding(4, "small_u")
        self.i = SparseEmbedding(4, "small_i")
        self.c = SparseEmbedding(4, "small_c")
        self.mlp = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, batch):
        x = torch.cat(
            [batch["dense"], self.u(batch["u"]), self.i(batch["i"]), self.c(batch["c"])], dim=1
        )
        logit = self.mlp(x).squeeze(1)
        loss = nn.functional.binary_cross_entropy_with_logits(logit, batch["label"])
        return {"loss": loss}


def one_id_each(size: int, vocab: int, rng: np.random.Generator) -> Ragged:
    return Ragged(torch.from_numpy(rng.integers(0, vocab, size)), torch.arange(size + 1))


def small_ctr_batches(count: int = 4, size: int = 64) -> list[dict]:
    rng = np.random.default_rng(0)
    return [
        {
            "dense": torch.randn(size, 4),
            "u": one_id_each(size, 3000, rng),
            "i": one_id_each(size, 5000, rng),
            "c": one_id_each(size, 50, rng),
            "label": torch.from_numpy((rng.random(size) < 0.3).astype(np.float32)),
        }
        for _ in range(count)
    ]


def write_mlp_local_records(path: Path, example, records: int = 256) -> None:
    """MultiSlot lines of the example's slots: 13 dense floats, one id per
    categorical slot, the label."""
    rng = np.random.default_rng(1)
    lines = []
    for _ in range(records):
        dense = " ".join(f"{v:.3f}" for v in rng.random(13))
        ids = " ".join(f"1 {v}" for v in rng.integers(0, 2**40, len(example.CATEGORICAL)))
        lines.append(f"13 {dense} {ids} 1 {int(rng.random() < 0.3)}\n")
    path.write_text("".join(lines))


def train_twice(model, source, optimizer, caplog, hogwild: bool = True) -> list:
    """Two calls of train_from_dataset(thread=2): each one's summary and
    the warnings it logged."""
    calls = []
    for _ in range(2):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="trainer.executor"):
            summary = Executor().train_from_dataset(
                model, source, optimizer, thread=2, hogwild=hogwild, fetch_list=[]
            )
        calls.append((summary, [r.getMessage() for r in caplog.records]))
    return calls


# -- the dense table warning -------------------------------------------------------------


@pytest.mark.parametrize("kind", ["processes", "threads"])
def test_mlp_locals_dense_table_is_warned_of_at_every_call(tmp_path, caplog, kind):
    example = mlp_local_example()
    path = tmp_path / "part-0.txt"
    write_mlp_local_records(path, example)
    data = InMemoryDataset()
    data.init(batch_size=64, thread_num=1, use_var=example.SLOTS, pipe_command="cat")
    data.set_filelist([str(path)])
    data.load_into_memory()
    # Hogwild trainers are processes on an InMemoryDataset, threads on a list.
    source = data if kind == "processes" else list(data)
    model = example.CtrMlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.003)
    for summary, warnings in train_twice(model, source, optimizer, caplog):
        assert summary.hogwild == kind and summary.batches == 4
        warning = summary.hogwild_warning
        assert warning is not None
        assert "'embedding' (EmbeddingBag of 100,003 x 8 = 800,024 elements)" in warning
        assert "trainer.nn.SparseEmbedding" in warning and "hogwild=False" in warning
        assert warnings == [warning]  # logged once in each call, and nothing else
        assert summary.hogwild_fallback is None
    # One step at a time overwrites nothing: no warning.
    (summary, warnings), _ = train_twice(model, source, optimizer, caplog, hogwild=False)
    assert summary.hogwild is None and summary.hogwild_warning is None and warnings == []


def test_the_small_ctr_model_gets_no_warning(caplog):
    model = SmallCtr()
    optimizer = local_optimizer(model, torch.optim.Adagrad(model.parameters(), lr=0.1))
    for summary, warnings in train_twice(model, small_ctr_batches(), optimizer, caplog):
        assert summary.hogwild == "threads" and summary.batches == 4
        assert summary.hogwild_warning is None and summary.hogwild_fallback is None
        assert warnings == []


def test_which_tables_collide():
    """Dense embedding tables of COLLIDING_TABLE_ELEMENTS elements or more that
    the optimizer trains; not sparse-gradient ones, frozen ones, dense layers."""
    limit = COLLIDING_TABLE_ELEMENTS
    rows = limit // 8

    def found(module: nn.Module, params=None) -> str | None:
        return collision_warning(module, list(module.parameters()) if params is None else params)

    assert "'' (Embedding of 2,048 x 8 = 16,384 elements)" in found(nn.Embedding(rows, 8))
    assert found(nn.Embedding(rows - 1, 8)) is None
    two = nn.ModuleDict({"a": nn.EmbeddingBag(rows, 8), "b": nn.Embedding(10 * rows, 8)})
    assert "'a' (EmbeddingBag of 2,048 x 8" in found(two)
    assert "'b' (Embedding of 20,480 x 8 = 163,840 elements)" in found(two)
    assert found(nn.EmbeddingBag(10 * rows, 8, sparse=True)) is None  # writes its rows only
    frozen = nn.Embedding(10 * rows, 8)
    frozen.weight.requires_grad_(False)
    assert found(frozen) is None
    assert found(nn.Embedding(10 * rows, 8), params=[]) is None  # not the optimizer's
    assert found(nn.Linear(1000, 1000)) is None  # every element has a gradient
    assert collision_warning(lambda batch: batch, []) is None  # a function: no tables to see


# -- steps one at a time -------------------------------------------------------------------


class Logistic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(1, 1)

    def forward(self, batch):
        logit = self.linear(batch["dense"]).squeeze(1)
        return {"loss": nn.functional.binary_cross_entropy_with_logits(logit, batch["label"])}


class AsyncModeOptimizer:
    """What a parameter-server mode's distributed optimizer shows Hogwild: a
    mode other than local (its step writes the servers' values)."""

    mode_name = "async"

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        self.optimizer.step()


@pytest.mark.parametrize(("make_optimizer", "reason"), [
    (lambda model: torch.optim.RMSprop(model.parameters(), lr=0.01),
     "RMSprop is not one of the optimizers updated lock-free"),
    (lambda model: AsyncModeOptimizer(torch.optim.SGD(model.parameters(), lr=0.1)),
     "the parameter-server 'async' mode's step sends to the servers"),
])
def test_every_call_that_steps_one_at_a_time_says_why(caplog, make_optimizer, reason):
    model = Logistic()
    optimizer = make_optimizer(model)
    batches = [{"dense": torch.randn(50, 1), "label": torch.ones(50)} for _ in range(4)]
    for summary, warnings in train_twice(model, batches, optimizer, caplog):
        assert summary.hogwild is None and summary.batches == 4
        fallback = summary.hogwild_fallback
        assert fallback is not None and reason in fallback
        assert fallback.endswith("training threads step one at a time")
        assert warnings == [fallback]
        assert summary.hogwild_warning is None
