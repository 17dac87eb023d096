"""Counters that Hogwild trainers share are exact: every training pull of a row
counted in its show, every click added, every optimizer step (dense, and a
sparse row's) and every batch counted, whichever trainer (forked process or
thread) made it and however the trainers overlap (trainer/ps/tables/_rows.pyx,
trainer/loop/_shared_counts.pyx)."""

from __future__ import annotations

import multiprocessing
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from hogwild_support import CtrModel, clear_local_tables, local_optimizer
from torch import nn

from datafeed import InMemoryDataset, Slot
from trainer import Executor
from trainer.embedding import stores
from trainer.loop._shared_counts import count_steps
from trainer.loop.dense_update import DenseUpdate
from trainer.ps.tables import step_rows
from trainer.ps.tables._rows import (
    ROW_STATS_DTYPE,
    IdIndex,
    add_clicks_rows,
    pull_rows,
    pull_values,
    touch_rows,
)
from trainer.ps.tables.optim import OptimizerSpec
from trainer.ps.tables.shared_rows import share_table, shared_array
from trainer.ps.tables.table import SparseTable

ID_BASE = 10**12
# Rounds of each trainer's loop: enough that trainers running at once meet on
# the same rows (a plain "+= 1" lost counts in every run of these tests).
ROUNDS = 3000
KINDS = ["processes", "threads"]
TRAINERS = [2, 4]


@pytest.fixture(autouse=True)
def clean_local_tables():
    yield
    clear_local_tables()


def run_at_once(kind: str, trainers: int, work: Callable[[int], None]) -> None:
    """``work(number)`` in ``trainers`` forked processes or threads (numbered
    from 0), started together."""
    if kind == "threads":
        barrier = threading.Barrier(trainers, timeout=60)
        errors: list[BaseException] = []

        def target(number: int) -> None:
            try:
                barrier.wait()
                work(number)
            except BaseException as error:  # noqa: BLE001 - raised below
                errors.append(error)

        threads = [threading.Thread(target=target, args=(n,)) for n in range(trainers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not errors, errors
        assert not any(thread.is_alive() for thread in threads)
        return
    context = multiprocessing.get_context("fork")
    process_barrier = context.Barrier(trainers, timeout=60)

    def process_target(number: int) -> None:
        process_barrier.wait()
        work(number)

    processes = [context.Process(target=process_target, args=(n,)) for n in range(trainers)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
    assert [process.exitcode for process in processes] == [0] * trainers


# -- the kernels ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("trainers", TRAINERS)
def test_row_statistics_kernels_run_at_once_count_every_pull_and_click(kind, trainers):
    """The kernels without a table's lock (as Hogwild processes run them: each
    has a lock of its own), on statistics in shared memory. Each call counts
    in the same few records again and again, so that the trainers meet on
    them (a plain "+= 1" lost about a tenth of the counts here)."""
    rows, repeats, rounds = 4, 500, 1000
    ids = np.arange(rows, dtype=np.uint64) + np.uint64(ID_BASE)
    index = IdIndex()
    index.lookup_or_insert(ids)
    weights = shared_array((rows, 2), np.float32)
    records = shared_array((rows,), ROW_STATS_DTYPE)
    repeated_ids = np.tile(ids, repeats)
    repeated_rows = np.tile(np.arange(rows, dtype=np.int64), repeats)
    halves = np.full(rows * repeats, 0.5, dtype=np.float32)

    def work(_: int) -> None:
        for tick in range(1, rounds + 1):
            pull_rows(index, repeated_ids, weights, None, records, tick)
            pull_values(index, repeated_ids, weights, records, tick)  # one show per distinct id
            touch_rows(records, repeated_rows, tick)
            add_clicks_rows(records, repeated_rows, halves)

    run_at_once(kind, trainers, work)
    assert records["show"].tolist() == [trainers * rounds * (2.0 * repeats + 1)] * rows
    assert records["click"].tolist() == [trainers * rounds * repeats * 0.5] * rows
    assert records["changed"].tolist() == [1] * rows
    assert records["last"].tolist() == [rounds] * rows


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("trainers", TRAINERS)
def test_row_step_counts_added_at_once_are_all_counted(kind, trainers):
    """A table's per-row Adam step counts, as its pushes count them."""
    from trainer.ps.tables._rows import count_row_steps

    rows, repeats, rounds = 4, 500, 300
    steps = shared_array((rows,), np.float32)
    repeated_rows = np.tile(np.arange(rows, dtype=np.int64), repeats)

    def work(_: int) -> None:
        for _ in range(rounds):
            count_row_steps(steps, repeated_rows)

    run_at_once(kind, trainers, work)
    assert steps.tolist() == [float(trainers * rounds * repeats)] * rows
    made = count_row_steps(steps, np.array([2, 0], dtype=np.int64))
    assert made.dtype == np.float32 and made.tolist() == [trainers * rounds * repeats + 1.0] * 2
    with pytest.raises(IndexError, match="row 4 outside the table's 4 step counts"):
        count_row_steps(steps, np.array([4], dtype=np.int64))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("trainers", TRAINERS)
def test_a_shared_tables_shows_and_clicks_count_every_trainers_pulls(kind, trainers):
    table = SparseTable("counted", 2, OptimizerSpec("sgd"))
    ids = np.arange(32, dtype=np.uint64) + np.uint64(ID_BASE)
    table.pull(ids)  # the rows made, each shown once
    share_table(table, 0)
    ones = np.ones(len(ids), dtype=np.float32)

    def work(_: int) -> None:
        for _ in range(ROUNDS // 2):
            table.pull(ids)
            step_rows.pull_distinct_numbered(table, ids)  # a SparseEmbedding's pull
            table.add_clicks(ids, ones)

    run_at_once(kind, trainers, work)
    statistics = table.statistics(ids)
    assert statistics["show"].tolist() == [1.0 + trainers * ROUNDS] * len(ids)
    assert statistics["click"].tolist() == [trainers * ROUNDS / 2] * len(ids)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("trainers", TRAINERS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_each_step_number_is_made_by_one_add(kind, trainers, dtype):
    """``count_steps`` on one counter again and again in each trainer: every
    number from 1 up comes out once, to the trainer whose add made it (its
    update's bias correction uses it)."""
    step = torch.zeros((), dtype=dtype).share_memory_()
    per_call, rounds = 100, 200
    made = shared_array((trainers, rounds, per_call), np.float64)

    def work(number: int) -> None:
        for round_ in range(rounds):
            made[number, round_] = count_steps([step] * per_call)

    run_at_once(kind, trainers, work)
    total = trainers * rounds * per_call
    assert float(step) == total
    assert sorted(made.ravel().tolist()) == list(range(1, total + 1))


def test_a_step_counter_torch_does_not_make_is_refused():
    with pytest.raises(TypeError, match=r"0-d float32 or float64 tensor\), got a torch.int64"):
        count_steps([torch.zeros((), dtype=torch.int64)])
    with pytest.raises(TypeError, match=r"got a torch.float32 tensor of shape \(2,\)"):
        count_steps([torch.zeros(2)])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("trainers", TRAINERS)
@pytest.mark.parametrize("optimizer_class", [torch.optim.Adam, torch.optim.AdamW,
                                             torch.optim.Adagrad])
def test_optimizer_steps_applied_at_once_are_all_counted(kind, trainers, optimizer_class):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    optimizer = optimizer_class(model.parameters(), lr=0.001)
    update = DenseUpdate(optimizer)
    update.init_state()  # as before a fork of Hogwild processes: then shared
    for tensor in list(model.parameters()) + [
        value for state in optimizer.state.values() for value in state.values()
    ]:
        tensor.share_memory_()
    grads = [torch.full_like(p, 0.01) for p in update.params]

    def work(_: int) -> None:
        for _ in range(ROUNDS):
            update.apply(grads)

    run_at_once(kind, trainers, work)
    steps = [float(state["step"]) for state in optimizer.state.values()]
    assert steps == [trainers * ROUNDS] * len(update.params)


# -- train_from_dataset -----------------------------------------------------------------------


SLOTS = [Slot("ids", "int64"), Slot("dense", "float32", (1,)), Slot("label", "float32", (1,))]
BATCH = 20


def write_records(path: Path, records: int, vocab: int = 30) -> list[np.ndarray]:
    """MultiSlot lines of 1-3 ids of a small vocabulary (every batch pulls most
    rows, so trainers meet on them) and a dense float; each record's ids."""
    rng = np.random.default_rng(3)
    lines, ids_of = [], []
    for _ in range(records):
        ids = rng.integers(0, vocab, rng.integers(1, 4)) + ID_BASE
        dense = rng.normal(0, 1)
        label = float(rng.random() < 1 / (1 + np.exp(-dense)))
        ids_of.append(ids)
        lines.append(f"{len(ids)} {' '.join(map(str, ids))} 1 {dense:.4f} 1 {label:g}\n")
    path.write_text("".join(lines))
    return ids_of


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("trainers", TRAINERS)
def test_a_hogwild_pass_counts_each_pull_as_a_show_and_each_batch_as_a_step(
    tmp_path, kind, trainers
):
    ids_of = write_records(tmp_path / "part-0.txt", 4000)
    data = InMemoryDataset()
    data.init(batch_size=BATCH, thread_num=1, use_var=SLOTS, pipe_command="cat")
    data.set_filelist([str(tmp_path / "part-0.txt")])
    data.load_into_memory()
    # Hogwild trainers are processes on an InMemoryDataset, threads on a list.
    source = data if kind == "processes" else list(data)
    model = CtrModel()
    optimizer = local_optimizer(model, torch.optim.Adam(model.parameters(), lr=0.01))
    summary = Executor().train_from_dataset(
        model, source, optimizer, thread=trainers, hogwild=True, fetch_list=[]
    )
    assert summary.hogwild == kind
    batches = len(ids_of) // BATCH
    assert summary.batches == batches
    # Each id is shown once in every batch that holds it (the batches are the
    # records in file order, BATCH at a time).
    shown: Counter = Counter()
    for start in range(0, len(ids_of), BATCH):
        shown.update(np.unique(np.concatenate(ids_of[start:start + BATCH])).tolist())
    distinct = np.array(sorted(shown), dtype=np.uint64)
    table = stores.local_store().tables[model.emb.name]
    assert table.statistics(distinct)["show"].tolist() == [float(shown[i]) for i in sorted(shown)]
    # The table's Adam counts a row's steps (pushed once in each batch that
    # pulled it); the dense Adam, every batch's step.
    saved = table.state_dict()
    row_steps = dict(zip(saved["ids"].tolist(), saved["state.step"].tolist(), strict=True))
    assert row_steps == {int(i): float(shown[i]) for i in shown}
    steps = [float(state["step"]) for state in optimizer.optimizer.state.values()]
    assert steps == [float(batches)] * len(list(model.mlp.parameters()))
