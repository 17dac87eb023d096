"""Hogwild trainer processes: train_from_dataset(thread=N, hogwild=True) on an
InMemoryDataset forks N trainers sharing the parameters and the sparse tables
(trainer/loop/hogwild_processes.py, trainer/ps/tables/shared_rows.py)."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hogwild_support import CtrModel, clear_local_tables, local_optimizer
from support import child_pids
from torch import nn

from datafeed import InMemoryDataset, Slot
from trainer import Executor, TrainerProcessError
from trainer.embedding import stores
from trainer.loop import hogwild_processes
from trainer.nn import CountFilterEntry
from trainer.ps.tables import step_rows
from trainer.ps.tables.optim import OptimizerSpec
from trainer.ps.tables.shared_rows import SharedRowAdder, SharedRowsFull, share_table
from trainer.ps.tables.table import SparseTable

ID_BASE = 10**12
SLOTS = [Slot("ids", "int64"), Slot("dense", "float32", (1,)), Slot("label", "float32", (1,))]


@pytest.fixture(autouse=True)
def clean_local_tables():
    yield
    clear_local_tables()


def write_ctr_file(path: Path, records: int, seed: int, vocab: int = 200) -> list[np.ndarray]:
    """MultiSlot lines of 1-3 ids and one dense float; the label follows hidden
    per-id weights plus the dense value through a logistic. Returns each
    record's ids."""
    weights = np.random.default_rng(99).normal(0, 1.5, vocab)
    rng = np.random.default_rng(seed)
    lines, ids_of = [], []
    for _ in range(records):
        picks = rng.integers(0, vocab, rng.integers(1, 4))
        dense = rng.normal(0, 1)
        label = float(rng.random() < 1 / (1 + np.exp(-(weights[picks].sum() + 1.5 * dense))))
        ids = picks + ID_BASE
        ids_of.append(ids)
        lines.append(f"{len(ids)} {' '.join(map(str, ids))} 1 {dense:.4f} 1 {label:g}\n")
    path.write_text("".join(lines))
    return ids_of


def dataset(files: list[Path], batch_size: int = 100) -> InMemoryDataset:
    data = InMemoryDataset()
    data.init(batch_size=batch_size, thread_num=1, use_var=SLOTS, pipe_command="cat")
    data.set_filelist([str(f) for f in files])
    data.load_into_memory()
    return data


def held_out_auc(model: nn.Module, data: InMemoryDataset) -> float:
    from trainer import auc

    probs, labels = [], []
    Executor().infer_from_dataset(
        model, data, fetch_list=[], thread=1,
        fetch_handler=lambda out: (probs.append(out["prob"]), labels.append(out["label"])),
    )
    return auc(torch.cat(labels).numpy(), torch.cat(probs).numpy())


@pytest.fixture
def ctr_files(tmp_path: Path) -> tuple[list[Path], Path, list[np.ndarray]]:
    train, ids = [], []
    for part in range(2):
        path = tmp_path / f"part-{part}.txt"
        ids += write_ctr_file(path, 3000, seed=part)
        train.append(path)
    held = tmp_path / "heldout.txt"
    write_ctr_file(held, 3000, seed=7)
    return train, held, ids


def table_of(model: CtrModel) -> SparseTable:
    return stores.local_store().tables[model.emb.name]


# -- training ----------------------------------------------------------------------------


def test_processes_train_to_the_auc_of_one_thread_and_share_everything(ctr_files):
    train_files, held_files, ids = ctr_files
    results = {}
    for threads in (1, 2):
        model = CtrModel()
        optimizer = local_optimizer(model, torch.optim.Adagrad(model.parameters(), lr=0.1))
        train, held = dataset(train_files), dataset([held_files])
        before = [p.detach().clone() for p in model.parameters()]
        records, workers = 0, []
        for epoch in range(2):
            train.local_shuffle(seed=epoch)
            summary = Executor().train_from_dataset(
                model, train, optimizer, thread=threads, hogwild=True, fetch_list=[]
            )
            records += summary.records
            workers.append(child_pids())
        assert summary.hogwild == ("processes" if threads > 1 else None)
        # One process forked at the first pass waits for the next and trains it.
        assert workers == ([[], []] if threads == 1 else [workers[0]] * 2)
        assert threads == 1 or len(workers[0]) == 1
        assert records == 2 * len(ids)
        # The processes' updates reached this process's parameters and tables.
        assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
        table = table_of(model)
        assert len(table) == len(np.unique(np.concatenate(ids)))
        results[threads] = (held_out_auc(model, held), table.statistics(np.unique(
            np.concatenate(ids)).astype(np.uint64))["show"])
    assert results[1][0] > 0.8, results
    assert abs(results[2][0] - results[1][0]) < 0.01, results
    # Each row was shown once per batch holding it, in both: the processes'
    # counts are atomic adds, none lost where two meet on a row.
    shows_1, shows_2 = results[1][1], results[2][1]
    assert shows_2.tolist() == shows_1.tolist()
    hogwild_processes.close_workers()
    assert child_pids() == []


def test_every_pulled_row_is_pushed_once_in_some_process(ctr_files, monkeypatch):
    """Counts in shared memory: ids pulled in training and ids pushed, per process."""
    from trainer.ps.tables.shared_rows import shared_array

    train_files, _, ids = ctr_files
    counts = shared_array((4,), np.int64)  # pulled, pushed, bad gradients, batches
    lock = multiprocessing.get_context("fork").Lock()
    # A training pull counts its distinct ids, a push applies the optimizer (_apply).
    pull, apply = step_rows.pull_distinct_numbered, SparseTable._apply

    def counted_pull(table, values):
        pulled = pull(table, values)
        with lock:
            counts[0] += len(pulled[0])
        return pulled

    def counted_apply(self, rows, grads):
        with lock:
            counts[1] += len(rows)
            counts[2] += int(not np.isfinite(grads).all())
        apply(self, rows, grads)

    monkeypatch.setattr(stores, "pull_distinct_numbered", counted_pull)
    monkeypatch.setattr(SparseTable, "_apply", counted_apply)
    model = CtrModel()
    optimizer = local_optimizer(model, torch.optim.Adam(model.parameters(), lr=0.01))
    train = dataset(train_files)
    summary = Executor().train_from_dataset(
        model, train, optimizer, thread=3, hogwild=True, fetch_list=[]
    )
    assert summary.hogwild == "processes"
    assert summary.batches == len(train) == 60
    per_batch = sum(
        len(np.unique(np.concatenate(ids[start:start + 100])))
        for start in range(0, len(ids), 100)
    )
    assert counts[0] == per_batch  # every batch pulled its distinct ids once
    assert counts[1] == counts[0]
    assert counts[2] == 0
    assert summary.timings["pull"] > 0 and summary.timings["optimizer"] > 0


@pytest.mark.parametrize("where", ["forked", "calling"])
def test_a_failing_process_stops_every_process_with_its_error(ctr_files, where):
    calls = itertools.count()
    calling = os.getpid()

    class Failing(CtrModel):
        def forward(self, batch):
            # Each process counts its own forwards, of 1,500 batches in all: a
            # process that the others outrun on a busy machine still gets 3.
            if next(calls) == 2 and (os.getpid() == calling) == (where == "calling"):
                raise ValueError("batch 2 is broken")
            return super().forward(batch)

    model = Failing()
    optimizer = local_optimizer(model, torch.optim.Adagrad(model.parameters(), lr=0.1))
    train = dataset(ctr_files[0], batch_size=4)
    with pytest.raises(ValueError, match="batch 2 is broken") as raised:
        Executor().train_from_dataset(model, train, optimizer, thread=2, hogwild=True,
                                      fetch_list=[])
    if where == "forked":  # the process's traceback comes as the cause
        cause = raised.value.__cause__
        assert isinstance(cause, TrainerProcessError) and cause.process == 1
        assert "in forward" in str(cause) and "batch 2 is broken" in str(cause)
    assert child_pids() == []
    assert not [t for t in threading.enumerate() if t.name == "hogwild-result-collector"]
    # The pass did not end: the dataset's epoch is unchanged.
    assert train.state_dict()["epoch"] == 0


def test_a_killed_process_is_reported_and_the_others_are_stopped(ctr_files):
    calls = itertools.count()
    calling = os.getpid()

    class Dying(CtrModel):
        def forward(self, batch):
            if next(calls) == 1 and os.getpid() != calling:
                os.kill(os.getpid(), signal.SIGKILL)
            return super().forward(batch)

    model = Dying()
    optimizer = local_optimizer(model, torch.optim.Adagrad(model.parameters(), lr=0.1))
    train = dataset(ctr_files[0], batch_size=4)  # 1,500 batches: each process gets 2
    with pytest.raises(TrainerProcessError, match=r"process [12] \(pid \d+\) ended without a "
                                                  r"result \(killed by SIGKILL\)"):
        Executor().train_from_dataset(model, train, optimizer, thread=3, hogwild=True,
                                      fetch_list=[])
    assert child_pids() == []


def test_a_process_killed_while_adding_rows_does_not_hang_the_pass(ctr_files):
    """It dies holding the lock of the rows: this process, meeting new ids
    later, gives up waiting for it once the pass is stopped, and raises."""
    calling = os.getpid()

    class DyingHoldingTheLock(CtrModel):
        def forward(self, batch):
            if os.getpid() != calling:
                stores.local_store().tables[self.emb.name]._add_rows._lock.acquire()
                os.kill(os.getpid(), signal.SIGKILL)
            return super().forward(batch)

    def hung(signum, frame):
        raise TimeoutError("the pass hung on the lock of a dead process")

    model = DyingHoldingTheLock()
    optimizer = local_optimizer(model, torch.optim.Adagrad(model.parameters(), lr=0.1))
    train = dataset(ctr_files[0], batch_size=4)  # 1,500 batches: ids stay new for a while
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        with pytest.raises(TrainerProcessError, match=r"without a result \(killed by SIGKILL\)"):
            Executor().train_from_dataset(model, train, optimizer, thread=2, hogwild=True,
                                          fetch_list=[])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert child_pids() == []


def test_processes_print_paddles_lines_from_process_0(ctr_files, capfd):
    model = CtrModel()
    optimizer = local_optimizer(model, torch.optim.Adagrad(model.parameters(), lr=0.1))
    summary = Executor().train_from_dataset(
        model, dataset(ctr_files[0], batch_size=4), optimizer, thread=2, hogwild=True,
        fetch_list=["loss"], print_period=20,
    )
    assert summary.hogwild == "processes"
    lines = [line for line in capfd.readouterr().out.splitlines() if line.startswith("time:")]
    # Process 0's batches 20, 40, ... of its own count (of 1,500 in all).
    numbers = [int(line.split("batch: [")[1].split("]")[0]) for line in lines]
    assert numbers == list(range(20, 20 * len(numbers) + 1, 20)) and 1 <= len(numbers) <= 75
    assert all("loss[1]:[" in line for line in lines)
    assert summary.last_fetch["loss"] and summary.batches == 1500
    assert summary.mean_loss is not None and 0.1 < summary.mean_loss < 1.0


def test_a_dense_model_with_adam_trains_in_processes(ctr_files):
    """No sparse table, and optimizer state that torch makes at the first step
    (Adam's moments): made before the fork, so the processes share it."""

    class Dense(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.linear = nn.Linear(1, 1)

        def forward(self, batch):
            logit = self.linear(batch["dense"]).squeeze(1)
            label = batch["label"].squeeze(1)
            return {"loss": nn.functional.binary_cross_entropy_with_logits(logit, label)}

    model = Dense()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    train = dataset(ctr_files[0])
    losses = []
    for _ in range(3):
        summary = Executor().train_from_dataset(model, train, optimizer, thread=2,
                                                hogwild=True, fetch_list=[])
        assert summary.hogwild == "processes" and summary.batches == 60
        losses.append(summary.mean_loss)
    assert losses[2] < losses[0] - 0.01, losses
    steps = [float(state["step"]) for state in optimizer.state.values()]
    # Both processes counted their steps in the shared state, every one of them.
    assert steps == [180.0] * len(steps)


def test_trainers_run_torchs_ops_on_one_thread_each(ctr_files):
    """One core per trainer: torch's intra-op threads are 1 in every trainer
    process during the pass, and what they were afterwards; Hogwild threads
    leave the setting alone."""
    from trainer.ps.tables.shared_rows import shared_array

    most = shared_array((2,), np.int64)  # the most intra-op threads seen: here, elsewhere
    calling = os.getpid()

    class Counting(CtrModel):
        def forward(self, batch):
            here = int(os.getpid() != calling)
            most[here] = max(int(most[here]), torch.get_num_threads())
            return super().forward(batch)

    model = Counting()
    optimizer = local_optimizer(model, torch.optim.Adagrad(model.parameters(), lr=0.1))
    train = dataset(ctr_files[0])
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        summary = Executor().train_from_dataset(
            model, train, optimizer, thread=2, hogwild=True, fetch_list=[]
        )
        assert summary.hogwild == "processes" and list(most) == [1, 1]
        assert torch.get_num_threads() == 2
        most[:] = 0
        summary = Executor().train_from_dataset(
            model, (batch for batch in train), optimizer, thread=2, hogwild=True, fetch_list=[]
        )
        assert summary.hogwild == "threads" and list(most) == [2, 0]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


# -- processes that wait between passes --------------------------------------------------


def test_each_pass_gives_the_waiting_processes_its_records_and_learning_rate(
    ctr_files, monkeypatch
):
    """The processes forked at the first pass train the next ones: on the
    records in their order after a shuffle (each batch pulls the distinct ids
    of its records as they are now) and with the learning rate set since."""
    from trainer.ps.tables.shared_rows import shared_array

    train_files, _, _ = ctr_files
    pulled = shared_array((1,), np.int64)
    lock = multiprocessing.get_context("fork").Lock()
    pull = step_rows.pull_distinct_numbered  # a training pull

    def counted_pull(table, values):
        found = pull(table, values)
        with lock:
            pulled[0] += len(found[0])
        return found

    monkeypatch.setattr(stores, "pull_distinct_numbered", counted_pull)
    model = CtrModel()
    dense = torch.optim.Adagrad(model.parameters(), lr=0.1)
    optimizer = local_optimizer(model, dense)
    train = dataset(train_files)
    Executor().train_from_dataset(model, train, optimizer, thread=3, hogwild=True, fetch_list=[])
    workers = child_pids()
    assert len(workers) == 2 and sorted(hogwild_processes.worker_pids()) == sorted(workers)
    for seed in (5, 6):
        train.local_shuffle(seed=seed)
        in_order = train.to_arrow().column("ids").to_pylist()
        expected = sum(
            len(set(itertools.chain.from_iterable(in_order[start:start + 100])))
            for start in range(0, len(in_order), 100)
        )
        pulled[0] = 0
        Executor().train_from_dataset(
            model, train, optimizer, thread=3, hogwild=True, fetch_list=[]
        )
        assert pulled[0] == expected
    for group in dense.param_groups:
        group["lr"] = 0.0
    before = [p.detach().clone() for p in model.parameters()]
    summary = Executor().train_from_dataset(
        model, train, optimizer, thread=3, hogwild=True, fetch_list=[]
    )
    assert summary.hogwild == "processes" and summary.batches == 60
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert child_pids() == workers  # the same processes, all along


def test_processes_are_forked_anew_when_what_they_hold_changes(ctr_files):
    class Scaled(CtrModel):
        scale = 1.0

        def forward(self, batch):
            out = super().forward(batch)
            logit = self.mlp(torch.cat([self.emb(batch["ids"]), batch["dense"]], 1)).squeeze(1)
            loss = nn.functional.binary_cross_entropy_with_logits(self.scale * logit,
                                                                  out["label"])
            return {**out, "loss": loss}

    model = Scaled()
    optimizer = local_optimizer(model, torch.optim.Adagrad(model.parameters(), lr=0.1))
    train = dataset(ctr_files[0], batch_size=20)
    Executor().train_from_dataset(model, train, optimizer, thread=2, hogwild=True, fetch_list=[])
    first = child_pids()
    model.scale = 0.0  # every process's loss is now log(2), if it sees the change
    summary = Executor().train_from_dataset(
        model, train, optimizer, thread=2, hogwild=True, fetch_list=["loss"]
    )
    assert summary.mean_loss == pytest.approx(np.log(2), abs=1e-6)
    second = child_pids()
    assert len(second) == 1 and second != first
    optimizer = local_optimizer(model, torch.optim.Adagrad(model.parameters(), lr=0.1))
    Executor().train_from_dataset(model, train, optimizer, thread=2, hogwild=True, fetch_list=[])
    third = child_pids()
    assert len(third) == 1 and third != second


def test_a_process_that_died_between_passes_is_replaced(ctr_files, caplog):
    model = CtrModel()
    optimizer = local_optimizer(model, torch.optim.Adagrad(model.parameters(), lr=0.1))
    train = dataset(ctr_files[0])
    Executor().train_from_dataset(model, train, optimizer, thread=2, hogwild=True, fetch_list=[])
    (worker,) = child_pids()
    os.kill(worker, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while worker in child_pids() and time.monotonic() < deadline:
        time.sleep(0.01)
    with caplog.at_level("INFO", logger="trainer"):
        summary = Executor().train_from_dataset(
            model, train, optimizer, thread=2, hogwild=True, fetch_list=[]
        )
    assert summary.hogwild == "processes" and summary.batches == 60
    assert f"pid {worker}) ended (killed by SIGKILL)" in caplog.text
    assert len(child_pids()) == 1 and child_pids() != [worker]


def test_shared_records_are_the_records_and_follow_their_changes(ctr_files):
    from datafeed.records.shared_records import attach_store

    train = dataset(ctr_files[0][:1], batch_size=7)
    records = train.to_arrow()
    shared = train.share_records()
    assert train.to_arrow().equals(records)
    assert train.share_records() is shared  # nothing changed: nothing copied
    copy = attach_store(train.schema, os.dup(shared.fd), shared.layout)
    assert copy.to_arrow().equals(records)
    alone = dataset(ctr_files[0][:1], batch_size=7)
    alone.local_shuffle(seed=3)
    train.local_shuffle(seed=3)  # a new order of the shared chunks: nothing copied
    assert train._shared is shared and shared.holds(train._store)
    assert train.share_records() is shared  # nothing to copy at the next pass
    assert train.to_arrow().equals(alone.to_arrow())
    order = train._store.order
    copy = attach_store(train.schema, os.dup(shared.fd), shared.layout, order)
    assert copy.to_arrow().equals(alone.to_arrow())
    train.set_filelist([str(ctr_files[0][1])])
    train.load_into_memory()  # appended to the shared store
    assert train.share_records() is not shared
    assert train.to_arrow().num_rows == 6000


def test_a_slot_without_values_is_shared_as_itself(ctr_files):
    """An empty array takes no bytes of the memory file, yet keeps a place of
    its own in the layout (a store whose ids are all empty, shuffled)."""
    from datafeed.records.columns import RecordChunk, SlotColumn
    from datafeed.records.shared_records import attach_store, share_store
    from datafeed.records.store import RecordStore

    schema = dataset(ctr_files[0][:1]).schema
    columns = (
        SlotColumn(np.zeros(0, np.int64), np.zeros(4, np.int64), 0),  # ids: none in 3 records
        SlotColumn(np.arange(3, dtype=np.float32), None, 1),
        SlotColumn(np.ones(3, dtype=np.float32), None, 1),
    )
    store = RecordStore(schema, [RecordChunk(columns, 3)])
    for shared, handle in (share_store(store), share_store(store.reordered([2, 0, 1]))):
        copy = attach_store(schema, os.dup(handle.fd), handle.layout, shared.order)
        assert copy.to_arrow().equals(shared.to_arrow())
        assert copy.to_arrow().column("ids").to_pylist() == [[], [], []]
        ids = copy.chunks[0].columns[0]
        assert ids.values.shape == (0,) and ids.offsets.tolist() == [0, 0, 0, 0]


# -- where threads run instead -----------------------------------------------------------


def test_threads_serve_what_processes_cannot(ctr_files, caplog):
    model = CtrModel(entry=CountFilterEntry(2))
    optimizer = local_optimizer(model, torch.optim.Adagrad(model.parameters(), lr=0.1))
    with caplog.at_level("INFO", logger="trainer.executor"):
        summary = Executor().train_from_dataset(
            model, dataset(ctr_files[0]), optimizer, thread=2, hogwild=True, fetch_list=[]
        )
    assert summary.hogwild == "threads"
    assert "has an entry or a row budget: Hogwild threads instead of processes" in caplog.text

    def plain_hogwild_pass():
        """A model and dataset that processes serve: what else runs decides."""
        plain = CtrModel()
        return Executor().train_from_dataset(
            plain, dataset(ctr_files[0]),
            local_optimizer(plain, torch.optim.Adagrad(plain.parameters(), lr=0.1)),
            thread=2, hogwild=True, fetch_list=[],
        )

    # tqdm's monitor thread (a progress bar left open) does not count.
    from tqdm import tqdm

    with open(os.devnull, "w") as quiet, tqdm(total=1, file=quiet, mininterval=0.01):
        summary = plain_hogwild_pass()
    assert summary.hogwild == "processes"

    stop = threading.Event()
    other = threading.Thread(target=stop.wait, name="someone-elses")
    other.start()
    try:
        summary = plain_hogwild_pass()
    finally:
        stop.set()
        other.join()
    assert summary.hogwild == "threads"

    # A pass over a shuffled dataset under way: its native gather threads count.
    paused = dataset(ctr_files[0])
    paused.local_shuffle(seed=1)
    batches = iter(paused)
    next(batches)
    try:
        with caplog.at_level("INFO", logger="trainer.executor"):
            summary = plain_hogwild_pass()
    finally:
        batches.close()
    assert summary.hogwild == "threads"
    assert "gather threads of a pass over a shuffled dataset are running" in caplog.text


# -- shared tables -----------------------------------------------------------------------


def test_rows_added_by_the_shared_adder_equal_rows_made_by_a_pull():
    spec = OptimizerSpec.from_config({"type": "adagrad", "lr": 0.1})
    ids = np.arange(1, 41, dtype=np.uint64) * 7919
    plain, shared = SparseTable("t", 3, spec, seed=5), SparseTable("t", 3, spec, seed=5)
    plain.pull(ids[:10])
    shared.pull(ids[:10])
    share_table(shared, extra_rows=30)
    adder = SharedRowAdder(shared)
    adder.attach()
    shared.pull(ids[5:])  # its new rows through the adder
    with pytest.raises(SharedRowsFull, match=r"table 't': 41 rows needed, room was made for 40"):
        shared.pull(np.array([1], dtype=np.uint64))
    adder.detach()
    assert len(shared) == 40
    assert torch.equal(plain.pull(ids), shared.pull(ids))  # made in the same order
    shared.pull(np.array([1], dtype=np.uint64))  # grows as any table once detached
    assert len(shared) == 41


def test_a_process_waiting_for_rows_a_dead_process_was_adding_can_give_up():
    """A process killed while adding rows never releases their lock: the
    others wait, asking ``waiting`` (the calling process: was the pass stopped?)."""
    spec = OptimizerSpec.from_config({"type": "sgd", "lr": 0.1})
    table = SparseTable("w", 2, spec)
    share_table(table, extra_rows=10)
    adder = SharedRowAdder(table)
    adder.attach()
    adder._lock.acquire()  # taken by a process that died
    asked = []

    def waiting():
        asked.append(True)
        if len(asked) == 3:
            raise RuntimeError("the pass was stopped")

    adder.waiting = waiting
    try:
        with pytest.raises(RuntimeError, match="the pass was stopped"):
            table.pull(np.array([5], dtype=np.uint64))
        assert len(asked) == 3 and len(table) == 0
    finally:
        adder._lock.release()
        adder.detach()
    table.pull(np.array([5], dtype=np.uint64))
    assert len(table) == 1


def test_a_pass_after_a_shrink_shares_the_rebuilt_index(ctr_files):
    """A shrink rebuilds the index in private memory (the rows stay where they
    were): the next pass must share it again, or rows one process adds would
    be invisible to the others."""
    train_files, _, ids = ctr_files
    model = CtrModel()
    optimizer = local_optimizer(model, torch.optim.Adagrad(model.parameters(), lr=0.1))
    train = dataset(train_files)
    distinct = np.unique(np.concatenate(ids)).astype(np.uint64)
    Executor().train_from_dataset(model, train, optimizer, thread=2, hogwild=True, fetch_list=[])
    table = table_of(model)
    assert len(table) == len(distinct)
    table.set_pass(1000)  # every row unseen for longer than the accessor keeps them
    assert table.shrink() == (len(distinct), 0)
    summary = Executor().train_from_dataset(
        model, train, optimizer, thread=2, hogwild=True, fetch_list=[]
    )
    assert summary.hogwild == "processes"
    assert len(table) == len(distinct)
    assert (table.statistics(distinct)["show"] > 0).all()  # every row made again, once


def test_new_ids_of_a_reloaded_dataset_get_room(ctr_files, tmp_path):
    """The dataset's distinct ids are counted again when its values change
    (not after a shuffle): a reload with new ids makes room for them."""
    train_files, _, ids = ctr_files
    model = CtrModel()
    optimizer = local_optimizer(model, torch.optim.Adagrad(model.parameters(), lr=0.1))
    train = dataset(train_files[:1])
    first = np.unique(np.concatenate(ids[:3000]))
    for seed in range(2):
        train.local_shuffle(seed=seed)
        Executor().train_from_dataset(model, train, optimizer, thread=2, hogwild=True,
                                      fetch_list=[])
    assert len(table_of(model)) == len(first)
    wider = tmp_path / "wider.txt"
    more = write_ctr_file(wider, 3000, seed=3, vocab=400)  # ids 200-399 are new
    train.set_filelist([str(wider)])
    train.load_into_memory()
    summary = Executor().train_from_dataset(model, train, optimizer, thread=2, hogwild=True,
                                            fetch_list=[])
    assert summary.hogwild == "processes"
    assert len(table_of(model)) == len(np.union1d(first, np.concatenate(more)))


def test_a_table_with_an_entry_is_not_shared():
    spec = OptimizerSpec.from_config({"type": "sgd", "lr": 0.1})
    table = SparseTable("e", 2, spec, entry=CountFilterEntry(3))
    with pytest.raises(ValueError, match="table 'e' has an entry or a row budget"):
        share_table(table, 10)
