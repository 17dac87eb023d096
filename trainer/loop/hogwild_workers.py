"""The forked side of Hogwild trainer processes: a ``WorkerPool`` of processes
that train pass after pass (trainer/loop/hogwild_processes.py decides when).

A process that imported torch takes milliseconds to fork and as long to exit,
and each fresh fork copies again every page it writes: about a sixth of a
small model's pass (benchmarks/results/small_ctr.md). So the pool's processes
are forked once and wait between passes. What they train on reaches them as
it does the calling process:

* parameters, optimizer state and sparse tables live in shared memory, so a
  change the calling process makes in place between passes is theirs too
  (what it replaces, they would not see: the pool is forked anew then);
* each pass's records come as a memory file (datafeed/records/shared_records.py)
  with the pass's plan, its batches as pieces of the records;
* the optimizer's scalar hyperparameters (a learning rate schedule) come
  with each pass.

A process that fails sends its error; the others are stopped and the call
raises it. Messages are plain JSON: nothing is unpickled.
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import functools
import gc
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
import warnings
from multiprocessing import connection, get_context, reduction
from typing import Any

import numpy as np
import torch

from datafeed.iterate.batcher import Batcher, BatchPlan
from datafeed.records.shared_records import attach_order, attach_store

from ..job.errors import TrainerProcessError
from ..ps.tables.shared_rows import SharedRowAdder, pull_ticks, set_pull_ticks, shared_array
from ._shared_counts import take_number
from .train_loop import DatasetPass, PassStopped

__all__ = ["TakenBatches", "WorkerPool"]

logger = logging.getLogger("trainer")

_STOP_GRACE_SECONDS = 5.0
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


class TakenBatches:
    """The batches a process takes: the next number from the shared counter
    (an atomic add: each batch goes to one process, and no lock is left taken
    by a process killed while taking one)."""

    def __init__(self, plan: Any, counter: np.ndarray) -> None:
        self._plan, self._counter = plan, counter

    def __iter__(self) -> TakenBatches:
        return self

    def __next__(self) -> Any:
        number = take_number(self._counter)
        if number >= len(self._plan):
            raise StopIteration
        return self._plan.build(number)


class WorkerPool:
    """``count - 1`` processes forked from this one (trainer 0), waiting for
    passes. ``model_identity``: what their view of the model rests on, kept
    for the caller to compare (``hogwild_processes``)."""

    def __init__(self, count: int, run: DatasetPass, tables: dict, schema: Any,
                 model_identity: tuple) -> None:
        self.count, self.schema, self.model_identity = count, schema, model_identity
        self.adders = {name: SharedRowAdder(table) for name, table in tables.items()}
        self.counter = shared_array((1,), np.int64)  # the next batch number
        self.processes: dict[int, tuple[int, connection.Connection]] = {}
        self._collector: _ResultCollector | None = None
        self._attached = False  # this process adds rows through the adders
        sys.stdout.flush()
        sys.stderr.flush()  # or the children would print what this process had buffered
        calling = os.getpid()
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
                    _serve(number, child_end, run, tables, self, schema, calling)
                child_end.close()
                self.processes[number] = (pid, parent_end)
        except BaseException:
            self.close(kill=True)
            raise

    def gone(self) -> str | None:
        """How a process of the pool ended, if one did (None: all are alive)."""
        for number, (pid, _) in self.processes.items():
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return f"process {number} (pid {pid}) was reaped elsewhere"
            if done:
                return f"process {number} (pid {pid}) ended ({_status_text(status)})"
        return None

    def start_pass(
        self, message: dict, records_fd: int, stop: threading.Event,
        order_fd: int | None = None,
    ) -> None:
        """Sends every process the pass (``message``, the records' memory file,
        and the memory file of a shuffled store's order); a thread collects
        their results while this process trains."""
        self.counter[0] = 0
        for adder in self.adders.values():
            adder.resume()
            adder.attach()
            # A process killed while adding rows leaves their lock taken: this
            # one gives up waiting once the pass is stopped (by its failure).
            adder.waiting = functools.partial(_stop_if_set, stop)
        self._attached = True
        # Started while the processes wait: with both cores busy, a new thread
        # can wait milliseconds for one.
        self._collector = _ResultCollector(self.processes, stop)
        self._collector.start()
        body = json.dumps(message).encode()
        for pid, conn in self.processes.values():
            conn.send_bytes(body)
            reduction.send_handle(conn, records_fd, pid)
            if order_fd is not None:
                reduction.send_handle(conn, order_fd, pid)

    def results(self) -> list[dict]:
        """Each process's result of the pass, in process order (raises a
        process's failure)."""
        try:
            return self._collector.results()
        finally:
            self._collector = None
            self.end_pass()

    def end_pass(self) -> None:
        """This process adds the tables' rows itself again, at the row count
        the pass reached (only after a pass: between passes a table may have
        been shared anew, with rows of its own)."""
        if self._attached:
            self._attached = False
            for adder in self.adders.values():
                adder.detach()
                adder.waiting = None

    def close(self, kill: bool) -> None:
        """Every process ended and reaped: told to end (its pipe closed) and
        given a few seconds, or with ``kill`` (after a failure) killed now."""
        if self._collector is not None:
            self._collector.close()
            self._collector = None
        self.end_pass()  # a pass that failed before its thread started, too
        for _, conn in self.processes.values():
            conn.close()
        deadline = time.monotonic() + _STOP_GRACE_SECONDS
        for pid, _ in self.processes.values():
            while not kill and time.monotonic() < deadline:
                try:
                    if os.waitpid(pid, os.WNOHANG)[0]:
                        break
                except ChildProcessError:
                    break  # reaped already
                time.sleep(0.001)
            else:
                try:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                except (ProcessLookupError, ChildProcessError):
                    pass  # reaped already
        self.processes = {}


class _ResultCollector(threading.Thread):
    """Collects the processes' results of one pass while this process trains.
    A failure (an error sent, or a process gone without a result) stops the
    pass (``stop``: this process's trainer stops at its next batch) and is
    raised by ``results``."""

    def __init__(self, processes: dict, stop: threading.Event) -> None:
        super().__init__(name="hogwild-result-collector", daemon=True)
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
        self.join()
        if self._error is not None:
            raise self._error
        return [self._results[number] for number in sorted(self._results)]

    def close(self) -> None:
        self._closing.set()
        self.join()


def _stop_if_set(stop: threading.Event) -> None:
    if stop.is_set():
        raise PassStopped


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
            return _status_text(status)
        if time.monotonic() > deadline:
            return "still running"
        time.sleep(0.001)


def _status_text(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit status {os.WEXITSTATUS(status)}"


# -- a forked process ------------------------------------------------------------------


def _serve(number, conn, template, tables, pool, schema, parent) -> None:
    """A forked process's whole life: trains each pass it is sent and answers
    with its result, until its pipe closes (or a pass fails: it sends the
    error and ends); exits without returning to the caller's stack."""
    status = 1
    try:
        # The objects this process was forked with stay out of its collections:
        # a full one would write to every object's header, copying the pages
        # it shares with the calling process (6 ms of a first pass, measured).
        gc.freeze()
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the calling process stops us
        _die_with_parent(parent)
        torch.set_num_threads(1)  # one core per process, as Paddle's threads
        for _, other in pool.processes.values():
            other.close()  # the pipes of processes forked before: each sees its own end
        for adder in pool.adders.values():
            adder.attach()  # this process adds rows through them, always
        while True:
            try:
                message = json.loads(conn.recv_bytes())
                fd = reduction.recv_handle(conn)
                order_fd = reduction.recv_handle(conn) if message["ordered"] else None
            except EOFError:  # the pool is closed
                status = 0
                break
            try:
                result = _train_pass(message, fd, order_fd, template, tables, pool, schema)
            except BaseException as error:  # noqa: BLE001 - sent to the parent, which raises it
                report = {
                    "type": type(error).__name__, "message": str(error),
                    "traceback": "".join(traceback.format_exception(error)),
                }
                with contextlib.suppress(OSError):  # the calling process is gone
                    conn.send_bytes(b"E" + json.dumps(report).encode())
                break
            conn.send_bytes(b"D" + json.dumps(result).encode())
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status)


def _train_pass(message, fd, order_fd, template, tables, pool, schema) -> dict:
    """One pass of this process: the records mapped from ``fd`` in the order
    mapped from ``order_fd`` (None: unshuffled), the plan, the hyperparameters
    and clocks of the message; its counters and timings."""
    try:
        order = None if order_fd is None else attach_order(order_fd, message["order_rows"])
        store = attach_store(schema, fd, message["records"], order)
    finally:  # the mappings stay while the store lives (this pass)
        os.close(fd)
        if order_fd is not None:
            os.close(order_fd)
    batch_size, drop_last, input_type = message["batcher"]
    plan = BatchPlan.of_pieces(
        Batcher(schema, batch_size, drop_last, input_type), store.row_sources(),
        message["plan"],
    )
    update = template.hogwild.update
    for group, hyper in zip(update.optimizer.param_groups, message["hyper"], strict=True):
        group.update(hyper)
    for adder in pool.adders.values():
        adder.catch_up()
    for name, tick in message["ticks"].items():
        set_pull_ticks(tables[name], tick)
    run = DatasetPass(
        template.model, template.optimizer, message["names"], message["labels"],
        sys.maxsize, message["debug"], None, True,  # process 0 prints
    )
    run.hogwild, run.default_fetch = template.hogwild, message["default_fetch"]
    run.work(TakenBatches(plan, pool.counter), main_thread=False)
    return {
        "batches": run.batches, "records": run.records, "loss_sum": run.loss_sum,
        "loss_batches": run.loss_batches, "timings": run.timings,
        "ticks": {name: pull_ticks(t) - message["ticks"][name] for name, t in tables.items()},
    }


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when the process that forked it dies (Linux's
    PR_SET_PDEATHSIG), so that a killed trainer leaves no orphans."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return  # best effort: the process still ends when its pipe closes
    if os.getppid() != parent:  # it died before prctl took effect
        os._exit(1)
