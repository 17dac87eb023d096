"""Hogwild trainer processes: ``train_from_dataset(thread=N, hogwild=True)`` on
an ``InMemoryDataset`` runs its N trainers as processes.

Python threads share one interpreter lock. A small model's step is many short
torch calls, and two Hogwild threads hand the lock to each other at every call:
they run no faster than one (docs/training_speed.md). Processes share what
Hogwild threads share, without that lock:

* dense parameters, buffers and the optimizer's state, moved into shared memory
  (``Tensor.share_memory_``): each process applies its own gradients to them
  without a lock (``HogwildStep``, trainer/loop/hogwild.py);
* sparse tables: rows, optimizer state, statistics and index in shared memory,
  with room for each distinct id of the dataset that the table holds no row of
  (trainer/ps/tables/shared_rows.py): a process updates rows in place, and adds the
  rows of ids that have none yet, one process at a time;
* the records: moved into a memory file (``InMemoryDataset.share_records``).
  This process plans the pass (``batch_plan``) and each process takes the next
  batch number from a shared counter and builds that batch itself.

The calling process trains as process 0; the N - 1 others are forked at its
first pass and train the passes after it too (trainer/loop/hogwild_workers.py),
as long as what they hold is what this process has: the same model, optimizer
and tables, their tensors and arrays the same shared ones, the modules' plain
attributes (numbers, strings, flags) unchanged. Otherwise they are ended and
new ones forked. Only parameters, buffers, optimizer state and sparse rows come
back: Python state that a forward changes in another process stays there, and
only process 0 prints ``print_period`` lines (with its own batch count, as
Paddle's thread 0 does). ``close_workers()`` ends the waiting processes (they
end with this process, too).

``prepare`` says why a run cannot use processes (another dataset, a device, a
fetch handler, a table with an entry or a budget, other Python threads
running, no ``fork``): the trainer then runs Hogwild threads.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import operator
import os
import sys
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from datafeed.records.shared_records import share_order
from datafeed.records.store import gather_threads_running

from ..embedding import stores, tables
from ..ps.tables.shared_rows import add_pull_ticks, pull_ticks, rows_missing, share_table, sharing
from ..ps.tables.table import IdIndex
from .hogwild import HogwildStep
from .hogwild_workers import TakenBatches, WorkerPool
from .train_loop import PassStopped

__all__ = ["ProcessPassSetup", "close_workers", "prepare", "run_processes", "worker_pids"]

# What sharing the tables' indexes may take, as a fraction of the memory
# available: an index holds 14-18 bytes per row it has room for (counted as 18).
_INDEX_MEMORY_FRACTION = 0.25
# Threads a fork may copy: tqdm's progress-bar monitor (a bar left open keeps
# it alive) holds only tqdm's lock, which the forked trainers never take.
_FORK_SAFE_THREADS = ("TMonitor",)
# Each dataset's distinct ids, with the fingerprint of the values they were
# counted from (their count, wrapping sum and xor: what a shuffle keeps).
_counted_ids: weakref.WeakKeyDictionary[Any, tuple[tuple[int, int, int], np.ndarray]] = (
    weakref.WeakKeyDictionary()
)
_SCALARS = (bool, int, float, str, type(None))
_log = logging.getLogger("trainer")
# The processes waiting for the next pass (one pool: a new one ends the old).
_pool: WorkerPool | None = None


@dataclass
class ProcessPassSetup:
    """What ``prepare`` readied for a pass in processes: the model's tables (in
    shared memory, with room for the pass), what a forked process's view of
    the model rests on (``_model_identity``), and whether the pool of the pass
    before still holds that view and trains this pass too."""

    tables: dict[str, Any]
    model_identity: tuple
    reuse_pool: bool


def prepare(
    run: Any, dataset: Any, step: HogwildStep, count: int
) -> tuple[str | None, ProcessPassSetup | None]:
    """Whether this pass can run in ``count`` Hogwild processes: ``(None,
    setup)``, or ``(why not, None)``. Moves the parameters, optimizer
    state and tables into shared memory when nothing speaks against processes
    (threads then find them there, as well)."""
    reason = _unavailable_reason(run, dataset, step)
    if reason is not None:
        return reason, None
    tables = _tables(run.model)
    for table in tables.values():
        if table.entry is not None or table.max_rows is not None:
            return f"table '{table.name}' has an entry or a row budget", None
    ids = _distinct_ids(dataset) if tables else np.zeros(0, dtype=np.uint64)
    room = {name: rows_missing(table, ids) for name, table in tables.items()}
    needed = sum(18 * (len(table) + room[name]) for name, table in tables.items())
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if needed > _INDEX_MEMORY_FRACTION * available:
        return (
            f"sharing {len(tables)} tables with room for up to {max(room.values()):,} new "
            f"ids each would take up to {needed / 2**30:.1f} GiB of index "
            f"({available / 2**30:.1f} GiB available)"
        ), None
    dense = _share_dense(run.model, step)
    for name, table in tables.items():
        share_table(table, room[name])
    model_identity = _model_identity(run, step, tables, dense)
    reuse_pool = (
        _pool is not None and _pool.count == count and _pool.model_identity == model_identity
    )
    if reuse_pool and (gone := _pool.gone()) is not None:
        _log.info("Hogwild trainer %s between passes: forking new ones", gone)
        reuse_pool = False
    return None, ProcessPassSetup(tables, model_identity, reuse_pool)


def _unavailable_reason(run: Any, dataset: Any, step: HogwildStep) -> str | None:
    if not hasattr(os, "fork") or sys.platform != "linux":
        return "Hogwild processes are forked, which this platform does not offer (Linux only)"
    if not callable(getattr(dataset, "share_records", None)):
        return f"a {type(dataset).__name__} is not an InMemoryDataset holding its records"
    if run.device is not None:
        return f"the model runs on {run.device}, not on the CPU"
    if run.fetch_handler is not None or run.keep_latest:
        return "a fetch_handler runs in the trainer's process"
    if run.dumps_wanted:
        return "dump_fields are written by the trainer's process"
    others = [
        t.name for t in threading.enumerate()
        if t is not threading.current_thread() and type(t).__name__ not in _FORK_SAFE_THREADS
    ]
    if others:
        names = ", ".join(sorted(others))
        return f"other threads are running ({names}): a fork could copy a lock one holds"
    if gather_threads_running():  # native: threading.enumerate() does not list them
        return (
            f"{gather_threads_running()} gather threads of a pass over a shuffled dataset "
            "are running: a fork could copy a lock one holds"
        )
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return "a torch.distributed process group is formed"
    optimizer = step.update.optimizer
    for group in optimizer.param_groups:
        if group.get("momentum", 0) and any(
            "momentum_buffer" not in optimizer.state.get(p, {}) for p in group["params"]
        ):
            return "SGD makes its momentum buffers at its first step, in one process"
    return None


def run_processes(run: Any, dataset: Any, count: int, setup: ProcessPassSetup) -> None:
    """Trains one pass of ``dataset`` in this process and ``count - 1`` others
    (after ``prepare`` found no reason against), adding their counters and
    timings to ``run`` (a ``DatasetPass``). The others are the pool of the
    pass before when what they hold is still what this process has; else they
    are forked now."""
    global _pool
    records = dataset.share_records()
    plan = dataset.batch_plan()
    schema = plan.batcher.schema
    if not (setup.reuse_pool and _pool is not None and _pool.schema == schema):
        close_workers()
        _pool = WorkerPool(count, run, setup.tables, schema, setup.model_identity)
    pool = _pool
    tables = setup.tables
    optimizer = run.hogwild.update.optimizer
    message = {
        "names": run.names, "labels": run.labels, "debug": run.debug,
        "default_fetch": run.default_fetch,
        "hyper": [
            {k: v for k, v in group.items() if k != "params" and _is_scalar(v)}
            for group in optimizer.param_groups
        ],
        "batcher": [plan.batcher.batch_size, plan.batcher.drop_last, plan.batcher.input_type],
        "plan": plan.pieces(),
        "records": records.layout,
        "ordered": plan.order is not None,
        "order_rows": 0 if plan.order is None else len(plan.order),
        "ticks": {name: pull_ticks(table) for name, table in tables.items()},
    }
    # A shuffled store's order, in a memory file every process maps.
    order_fd = None if plan.order is None else share_order(plan.order)
    try:
        try:
            pool.start_pass(message, records.fd, run.stop, order_fd)
        finally:
            if order_fd is not None:
                os.close(order_fd)  # the processes hold their own descriptors
        with contextlib.suppress(PassStopped), _one_torch_thread_for_the_pass():
            run.work(TakenBatches(plan, pool.counter), main_thread=False)
        results = pool.results()  # a process's failure (it stopped this loop) raised here
    except BaseException:
        close_workers(kill=True)
        raise
    for name, table in tables.items():  # this process's own pulls are counted
        add_pull_ticks(table, sum(r["ticks"][name] for r in results))
    for result in results:
        run.batches += result["batches"]
        run.records += result["records"]
        run.loss_sum += result["loss_sum"]
        run.loss_batches += result["loss_batches"]
        for phase, seconds in result["timings"].items():
            run.timings[phase] += seconds
    plan.finish()


def close_workers(kill: bool = False) -> None:
    """Ends the Hogwild trainer processes that wait for the next pass (at
    exit, and whenever what they hold is replaced); ``kill``: now."""
    global _pool
    pool, _pool = _pool, None
    if pool is not None:
        pool.close(kill)


atexit.register(close_workers)


def worker_pids() -> list[int]:
    """The process ids of the Hogwild trainer processes waiting for the next pass."""
    pool = _pool
    return [pid for pid, _ in pool.processes.values()] if pool is not None else []


@contextlib.contextmanager
def _one_torch_thread_for_the_pass() -> Iterator[None]:
    """torch's ops on one thread in this process while the other trainer
    processes run, one per core as Paddle's threads: its intra-op threads
    would spin on the cores the other trainers work on (2 trainer processes on
    2 cores with torch's default threads: 385k records/s, 703k so;
    benchmarks/bench_hogwild.py --torch-threads 0). For the pass only, unlike
    a PS job's processes (``ps.runtime.one_intra_op_thread``, for good); not
    around Hogwild threads: torch's thread count is the whole process's."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


# -- the parent ------------------------------------------------------------------------


def _tables(model: Any) -> dict[str, Any]:
    """The local tables of ``model``'s SparseEmbeddings, made now if new."""
    configs = (
        tables.model_tables(model) if isinstance(model, torch.nn.Module)
        else tables.table_configs()
    )
    store = stores.local_store()
    return {name: store.table(config) for name, config in configs.items()}


def _distinct_ids(dataset: Any) -> np.ndarray:
    """The distinct values of the dataset's 64-bit integer slots (uint64): the
    ids a pass can add rows for, in a table that takes its ids from them.
    Counted again only when the values changed (a shuffle keeps them)."""
    parts = list(dataset.integer_values())
    fingerprint = (
        sum(p.shape[0] for p in parts),
        sum(int(p.sum(dtype=np.uint64)) for p in parts) % 2**64,
        functools.reduce(operator.xor, (int(np.bitwise_xor.reduce(p)) for p in parts), 0),
    )
    counted = _counted_ids.get(dataset)
    if counted is not None and counted[0] == fingerprint:
        return counted[1]
    seen = IdIndex()
    for values in parts:
        seen.lookup_or_insert(values)
    ids = seen.ids_in_row_order()
    _counted_ids[dataset] = (fingerprint, ids)
    return ids


def _share_dense(model: Any, step: HogwildStep) -> list[torch.Tensor]:
    """Parameters, buffers and optimizer state moved into shared memory (in
    place, unless there already); the tensors."""
    step.update.init_state()
    tensors = list(step.params)
    if isinstance(model, torch.nn.Module):
        tensors += list(model.parameters()) + list(model.buffers())
    for state in step.update.optimizer.state.values():
        tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    for tensor in tensors:
        tensor.share_memory_()
    return tensors


def _model_identity(
    run: Any, step: HogwildStep, tables: dict, dense: list[torch.Tensor]
) -> tuple:
    """What a forked process's copy of the model rests on. Equal from one pass
    to the next while the pool's processes can train it: the same model and
    optimizer; the same shared tensors and tables; the same param groups but
    for their numbers and strings (each pass brings those: a learning rate
    schedule); the same modules, with the same plain attributes."""
    modules = list(run.model.modules()) if isinstance(run.model, torch.nn.Module) else []
    return (
        id(run.model), id(run.optimizer), id(step.update.optimizer),
        tuple((t.data_ptr(), tuple(t.shape), t.dtype) for t in dense),
        tuple(
            (tuple(id(p) for p in group["params"]),
             repr({k: v for k, v in group.items() if k != "params" and not _is_scalar(v)}))
            for group in step.update.optimizer.param_groups
        ),
        tuple((name, sharing(table)) for name, table in tables.items()),
        tuple(
            (id(m), sorted((k, v) for k, v in vars(m).items()
                           if not k.startswith("_") and _is_scalar(v)))
            for m in modules
        ),
    )


def _is_scalar(value: Any) -> bool:
    return isinstance(value, _SCALARS)


