"""Hogwild trainer processes: ``train_from_dataset(thread=N, hogwild=True)`` on
an ``InMemoryDataset`` runs its N trainers as forked processes.

Python threads share one interpreter lock. A small model's step is many short
torch calls, and two Hogwild threads hand the lock to each other at every call:
they run no faster than one (docs/training_speed.md). Forked processes share
what Hogwild threads share, without that lock:

* dense parameters, buffers and the optimizer's state, moved into shared memory
  before the fork (``Tensor.share_memory_``): each process applies its own
  gradients to them without a lock (``HogwildStep``, trainer/hogwild.py);
* sparse tables: rows, optimizer state, statistics and index in shared memory,
  with room for each distinct id of the dataset that the table holds no row of
  (trainer/ps/shared_rows.py): a process updates rows in place, and adds the
  rows of ids that have none yet, one process at a time;
* the records: the dataset's buffers, inherited by the fork. The parent plans
  the pass (``InMemoryDataset.batch_plan``) and each process takes the next
  batch number from a shared counter and builds that batch itself.

The calling process trains as process 0 and forks N - 1 others (a fork of a
process that imported torch costs milliseconds, and their exits as much). A
thread of it collects the others' counters and timings (plain JSON: nothing is
unpickled). A process that fails sends its error; the others are stopped and
the call raises it. Only parameters, buffers, optimizer state and sparse rows
come back: Python state that a forward changes in a forked process stays
there, and only process 0 prints ``print_period`` lines (with its own batch
count, as Paddle's thread 0 does).

``prepare`` says why a run cannot use processes (another dataset, a device, a
fetch handler, a table with an entry or a budget, other Python threads
running, no ``fork``): the trainer then runs Hogwild threads.
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import functools
import json
import operator
import os
import signal
import sys
import threading
import time
import traceback
import warnings
import weakref
from multiprocessing import connection, get_context
from typing import Any

import numpy as np
import torch

from .hogwild import HogwildStep
from .job.errors import TrainerProcessError
from .ps import sparse
from .ps.shared_rows import add_pull_ticks, pull_ticks, rows_missing, share_rows, shared_array
from .ps.table import IdIndex
from .train_loop import PassStopped

__all__ = ["prepare", "run_processes"]

# What sharing the tables' indexes may take, as a fraction of the memory
# available: an index holds 32-64 bytes per row it has room for.
_INDEX_MEMORY_FRACTION = 0.25
_STOP_GRACE_SECONDS = 5.0
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
# Threads a fork may copy: tqdm's progress-bar monitor (a bar left open keeps
# it alive) holds only tqdm's lock, which the forked trainers never take.
_FORK_SAFE_THREADS = ("TMonitor",)
# Each dataset's distinct ids, with the fingerprint of the values they were
# counted from (their count, wrapping sum and xor: what a shuffle keeps).
_counted_ids: weakref.WeakKeyDictionary[Any, tuple[tuple[int, int, int], np.ndarray]] = (
    weakref.WeakKeyDictionary()
)


def prepare(run: Any, dataset: Any, step: HogwildStep) -> tuple[str | None, dict[str, int]]:
    """Whether this pass can run in Hogwild processes: ``(None, room)``,
    ``room`` the rows each table needs room for (the dataset's distinct ids it
    holds no row of); else ``(why not, {})``. Changes nothing but making the
    model's tables if they do not exist yet."""
    reason = _unavailable_reason(run, dataset, step)
    if reason is not None:
        return reason, {}
    tables = _tables(run.model)
    for table in tables.values():
        if table.entry is not None or table.max_rows is not None:
            return f"table '{table.name}' has an entry or a row budget", {}
    ids = _distinct_ids(dataset) if tables else np.zeros(0, dtype=np.uint64)
    room = {name: rows_missing(table, ids) for name, table in tables.items()}
    needed = sum(64 * (len(table) + room[name]) for name, table in tables.items())
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if needed > _INDEX_MEMORY_FRACTION * available:
        return (
            f"sharing {len(tables)} tables with room for up to {max(room.values()):,} new "
            f"ids each would take up to {needed / 2**30:.1f} GiB of index "
            f"({available / 2**30:.1f} GiB available)"
        ), {}
    return None, room


def _unavailable_reason(run: Any, dataset: Any, step: HogwildStep) -> str | None:
    if not hasattr(os, "fork") or sys.platform != "linux":
        return "Hogwild processes are forked, which this platform does not offer (Linux only)"
    if not callable(getattr(dataset, "batch_plan", None)):
        return f"a {type(dataset).__name__} is not an InMemoryDataset holding its records"
    if run.device is not None:
        return f"the model runs on {run.device}, not on the CPU"
    if run.fetch_handler is not None or run.keep_latest:
        return "a fetch_handler runs in the trainer's process"
    others = [
        t.name for t in threading.enumerate()
        if t is not threading.current_thread() and type(t).__name__ not in _FORK_SAFE_THREADS
    ]
    if others:
        names = ", ".join(sorted(others))
        return f"other threads are running ({names}): a fork could copy a lock one holds"
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return "a torch.distributed process group is formed"
    optimizer = step.update.optimizer
    for group in optimizer.param_groups:
        if group.get("momentum", 0) and any(
            "momentum_buffer" not in optimizer.state.get(p, {}) for p in group["params"]
        ):
            return "SGD makes its momentum buffers at its first step, in one process"
    return None


def run_processes(run: Any, dataset: Any, count: int, room: dict[str, int]) -> None:
    """Trains one pass of ``dataset`` in this process and ``count - 1`` forked
    ones (after ``prepare`` found no reason against), adding their counters and
    timings to ``run`` (a ``DatasetPass``); ``room``: ``prepare``'s."""
    tables = _tables(run.model)
    _share_dense(run.model, run.hogwild)
    adders = [share_rows(table, room[name]) for name, table in tables.items()]
    plan = dataset.batch_plan()
    batches = _TakenBatches(plan, shared_array((1,), np.int64), get_context("fork").Lock())
    ticks = {name: pull_ticks(table) for name, table in tables.items()}
    sys.stdout.flush()
    sys.stderr.flush()  # or the children would print what this process had buffered
    processes: dict[int, tuple[int, connection.Connection]] = {}
    server, calling = None, os.getpid()
    for adder in adders:  # every process adds rows through them (the forks too)
        adder.attach()
    try:
        for number in range(1, count):
            parent_end, child_end = get_context("fork").Pipe(duplex=True)
            with warnings.catch_warnings():
                # Python 3.12+ warns of a fork while native threads exist (torch's,
                # Arrow's pools): the children use no lock those threads hold.
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:  # the child never returns from here
                parent_end.close()
                _child(number, child_end, run, batches, tables, calling)
            child_end.close()
            processes[number] = (pid, parent_end)
        server = _Server(processes, run.stop)
        server.start()
        with contextlib.suppress(PassStopped):  # a forked process failed: raised next
            run.work(batches, main_thread=False)
        results = server.results()  # raises a process's failure
    except BaseException:
        if server is not None:
            server.close()
        _stop(processes, kill=True)
        raise
    finally:
        for adder in adders:
            adder.detach()
    _stop(processes, kill=False)
    for name, table in tables.items():  # this process's own pulls are counted
        add_pull_ticks(table, sum(r["ticks"][name] - ticks[name] for r in results))
    for result in results:
        run.batches += result["batches"]
        run.records += result["records"]
        run.loss_sum += result["loss_sum"]
        run.loss_batches += result["loss_batches"]
        for phase, seconds in result["timings"].items():
            run.timings[phase] += seconds
    plan.finish()


# -- the parent ------------------------------------------------------------------------


def _tables(model: Any) -> dict[str, Any]:
    """The local tables of ``model``'s SparseEmbeddings, made now if new."""
    configs = (
        sparse.model_tables(model) if isinstance(model, torch.nn.Module)
        else sparse.table_configs()
    )
    store = sparse.local_store()
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
        seen.lookup_or_insert(np.array(values))  # a writable copy
    ids = seen.ids_in_row_order()
    _counted_ids[dataset] = (fingerprint, ids)
    return ids


def _share_dense(model: Any, step: HogwildStep) -> None:
    """Parameters, buffers and optimizer state into shared memory (in place)."""
    step.update.init_state()
    tensors = list(step.params)
    if isinstance(model, torch.nn.Module):
        tensors += list(model.parameters()) + list(model.buffers())
    for state in step.update.optimizer.state.values():
        tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    for tensor in tensors:
        tensor.share_memory_()


class _Server(threading.Thread):
    """Collects the forked processes' results while this process trains. A
    failure (an error sent, or a process gone without a result) stops the pass
    (``stop``: this process's trainer stops at its next batch) and is raised
    by ``results``."""

    def __init__(self, processes: dict, stop: threading.Event) -> None:
        super().__init__(name="hogwild-process-server", daemon=True)
        self._processes, self._stop_pass = processes, stop
        self._closing = threading.Event()
        self._results: dict[int, dict] = {}
        self._error: BaseException | None = None

    def run(self) -> None:
        owner = {conn: number for number, (_, conn) in self._processes.items()}
        waiting = list(owner)
        try:
            while waiting and not self._closing.is_set():
                for conn in connection.wait(waiting, timeout=0.1):
                    if self._answer(owner[conn], conn):
                        waiting.remove(conn)
        except BaseException as error:  # noqa: BLE001 - raised by results()
            self._error = error
            self._stop_pass.set()

    def _answer(self, number: int, conn: connection.Connection) -> bool:
        """One message of process ``number``; whether it was its last."""
        try:
            message = conn.recv_bytes()
        except EOFError:
            pid = self._processes[number][0]
            raise TrainerProcessError(
                f"Hogwild trainer process {number} (pid {pid}) ended without a result "
                f"({_exit_status(pid)})", process=number,
            ) from None
        kind, body = message[:1], message[1:]
        if kind == b"D":
            self._results[number] = json.loads(body)
            return True
        raise _failure(number, json.loads(body))

    def results(self) -> list[dict]:
        """Each process's result, in process order, once all have sent theirs."""
        self.join()
        if self._error is not None:
            raise self._error
        return [self._results[number] for number in sorted(self._results)]

    def close(self) -> None:
        self._closing.set()
        self.join()


def _failure(number: int, error: dict) -> BaseException:
    cause = TrainerProcessError(
        f"Hogwild trainer process {number} failed:\n{error['traceback']}", process=number
    )
    kind = getattr(builtins, error["type"], None)
    if isinstance(kind, type) and issubclass(kind, Exception):
        try:
            raised = kind(error["message"])
        except Exception:  # noqa: BLE001 - a builtin with other arguments
            return cause
        raised.__cause__ = cause
        return raised
    return cause


def _exit_status(pid: int) -> str:
    """How process ``pid`` ended (it closed its pipe: it is ending), reaping it."""
    deadline = time.monotonic() + 1.0
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return "already reaped"
        if done:
            break
        if time.monotonic() > deadline:
            return "still running"
        time.sleep(0.001)
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit status {os.WEXITSTATUS(status)}"


def _stop(processes: dict[int, tuple[int, connection.Connection]], kill: bool) -> None:
    """Every process ended and reaped, its pipe closed: processes that sent
    their results exit by themselves (killed if they have not within a few
    seconds); with ``kill`` (after a failure, or Ctrl-C) they are killed now."""
    deadline = time.monotonic() + _STOP_GRACE_SECONDS
    for pid, conn in processes.values():
        conn.close()
        while not kill and time.monotonic() < deadline:
            try:
                if os.waitpid(pid, os.WNOHANG)[0]:
                    break
            except ChildProcessError:
                break  # reaped already (by _exit_status)
            time.sleep(0.001)
        else:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass  # reaped already (by _exit_status)


# -- a child ---------------------------------------------------------------------------


def _child(number, conn, run, batches, tables, parent) -> None:
    """A forked process's whole life: trains its share of the pass, sends its
    result or its error, and exits without returning to the caller's stack."""
    status = 1
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the calling process stops us
        _die_with_parent(parent)
        torch.set_num_threads(1)  # one core per process, as Paddle's threads
        run.print_period = sys.maxsize  # process 0 prints
        run.started = time.perf_counter()
        run.work(batches, main_thread=False)
        result = {
            "batches": run.batches, "records": run.records, "loss_sum": run.loss_sum,
            "loss_batches": run.loss_batches, "timings": run.timings,
            "ticks": {name: pull_ticks(table) for name, table in tables.items()},
        }
        conn.send_bytes(b"D" + json.dumps(result).encode())
        status = 0
    except BaseException as error:  # noqa: BLE001 - sent to the parent, which raises it
        report = {
            "type": type(error).__name__, "message": str(error),
            "traceback": "".join(traceback.format_exception(error)),
        }
        with contextlib.suppress(OSError):  # the calling process is gone
            conn.send_bytes(b"E" + json.dumps(report).encode())
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status)


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when the process that forked it dies (Linux's
    PR_SET_PDEATHSIG), so that a killed trainer leaves no orphans."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return  # best effort: the process still ends with the pass
    if os.getppid() != parent:  # it died before prctl took effect
        os._exit(1)


class _TakenBatches:
    """The batches a process takes: the next number from the shared counter."""

    def __init__(self, plan: Any, counter: np.ndarray, lock: Any) -> None:
        self._plan, self._counter, self._lock = plan, counter, lock

    def __iter__(self) -> _TakenBatches:
        return self

    def __next__(self) -> Any:
        with self._lock:
            number = int(self._counter[0])
            self._counter[0] = number + 1
        if number >= len(self._plan):
            raise StopIteration
        return self._plan.build(number)
