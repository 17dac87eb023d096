"""One pass of ``Executor.train_from_dataset`` / ``infer_from_dataset``: the
worker threads, the loop each runs, and what it counts.

``DatasetPass`` holds what one call's threads share: the model, the optimizer,
one iterator over the dataset (taken under a lock), the counters, the printed
lines and the fetch handler. Each thread runs ``work``: a batch, the forward,
then (training) the backward and the step, one thread at a time under a lock
and in the order the batches were taken (the model is one thread's), or all at
once for Hogwild threads (trainer/loop/hogwild.py). ``timings`` split each
batch's time into the phases ``data_wait``, ``forward``, ``backward``, ``step``
and the parts ``pull``, ``optimizer``, ``push`` (trainer/loop/step_clock.py).

A parameter-server worker in async mode holds the batches to come and sends
their pulls before their forwards (trainer/embedding/ahead.py): its
``data_wait`` includes sending them.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

import torch

from ..embedding import ahead as ahead_pulls
from ..embedding import stores
from .dense_update import clear_grads, step_from_grads
from .hogwild import HogwildStep, collision_warning, sparse_gradient_reason
from .run_summary import RunSummary
from .step_clock import thread_totals

__all__ = ["DatasetPass", "debug_line", "join_context", "log_once"]

# The executor's logger: the messages are about its calls.
logger = logging.getLogger("trainer.executor")

_PHASES = ("data_wait", "forward", "backward", "step")
# Parts of them (trainer/loop/step_clock.py): the rows pulled in the forward; the
# step's dense optimizer update, and the rest of the step, the sparse push.
_PARTS = ("pull", "optimizer", "push")


class PassStopped(Exception):
    """Raised inside a worker when another worker has failed."""


class DatasetPass:
    """The state one call shares between its worker threads."""

    def __init__(
        self,
        model: Any,
        optimizer: Any,
        names: list[str],
        labels: list[str],
        print_period: int,
        debug: bool,
        fetch_handler: Any,
        train: bool,
        device: torch.device | None = None,
        distributed_model: Any = None,
    ) -> None:
        self.model = model
        # What fleet.distributed_model returned (DDP's join() is called on it).
        self.distributed_model = distributed_model
        self.device = device if device is not None and device.type != "cpu" else None
        self.optimizer = optimizer
        self.names = names
        self.labels = labels
        self.default_fetch = False  # set when fetch_list was not given
        self.print_period = print_period
        self.debug = debug
        self.fetch_handler = fetch_handler
        self.train = train
        self.next_lock = threading.Lock()  # one shared pass over the dataset
        self.step_lock = threading.Lock()  # forward+backward+step, one at a time
        # Steps go in the order the batches were taken, whichever thread holds
        # them: the model is then exactly one thread's (``_take_turn``).
        self.taken = 0  # batches taken from the iterator (under next_lock)
        self.turn = 0  # the number of the batch whose step comes next
        # The thread waiting to step batch n waits on its own event, set when
        # batch n - 1 stepped: one wake-up a step, whatever the thread count.
        self.turn_events: dict[int, threading.Event] = {}
        self.stats_lock = threading.Lock()  # counters, printing, fetch_handler
        self.stop = threading.Event()
        self.exhausted = False
        self.batches = 0
        self.records = 0
        self.loss_sum = 0.0
        self.loss_batches = 0
        self.timings = dict.fromkeys(_PHASES + _PARTS, 0.0)
        self.last_fetch: dict[str, list[float]] = {}
        self.started = time.perf_counter()
        self.hogwild: HogwildStep | None = None  # None: steps under step_lock
        # Why hogwild=True ran steps one at a time (start_hogwild), and what
        # Hogwild trainers cost this model: both reported in the RunSummary.
        self.hogwild_fallback: str | None = None
        self.hogwild_warning: str | None = None
        # Paddle's dump_fields / dump_param writer (trainer/loop/dumps.py), or None.
        self.dumper: Any = None
        self.dumps_wanted = False
        # For a FetchHandler's monitor thread: the last batch and its outputs.
        # Pulls sent ahead of their forwards, over the threads (RunSummary.pulls_ahead).
        self.pulls_ahead: dict[str, int] = {}
        self.keep_latest = False
        self.latest: tuple[Mapping[str, Any], Any] = ({}, None)

    def start_hogwild(self, optimizer: Any) -> None:
        """Makes the trainers Hogwild (``hogwild``) where ``optimizer`` allows;
        else they step one at a time and ``hogwild_fallback`` says why. Logged
        at every call, as is ``hogwild_warning`` (the model's dense tables that
        Hogwild trainers overwrite): each call may bring another optimizer or
        model, and a reason logged once would leave later calls silent."""
        try:
            self.hogwild = HogwildStep(optimizer)
            reason = sparse_gradient_reason(self.model, self.hogwild.update)
            if reason is not None:
                self.hogwild = None
                raise ValueError(reason)
        except ValueError as error:
            self.hogwild_fallback = f"{error}: training threads step one at a time"
            logger.warning(self.hogwild_fallback)
            return
        self.hogwild_warning = collision_warning(self.model, self.hogwild.params)
        if self.hogwild_warning is not None:
            logger.warning(self.hogwild_warning)

    def current_value(self, name: str) -> Any:
        """The last batch's output ``name``, else its slot ``name``, else None."""
        with self.stats_lock:
            outputs, batch = self.latest
        if name in outputs:
            return outputs[name]
        return batch[name] if isinstance(batch, Mapping) and name in batch else None

    # -- threads ---------------------------------------------------------------------

    def work_in_threads(self, iterator: Any, threads: int) -> None:
        """``work`` in ``threads`` threads; the first error of any stops them all
        and is raised here, with its traceback."""
        errors: list[BaseException] = []

        def target() -> None:
            try:
                self.work(iterator, main_thread=False)
            except PassStopped:
                pass
            except BaseException as error:  # noqa: BLE001 - re-raised in the caller
                errors.append(error)
                self.stop.set()

        workers = [
            threading.Thread(target=target, name=f"trainer-worker-{i}", daemon=True)
            for i in range(threads)
        ]
        for worker in workers:
            worker.start()
        try:
            for worker in workers:
                while worker.is_alive():
                    worker.join(0.2)  # short joins keep Ctrl-C responsive
        except BaseException:
            self.stop.set()
            for worker in workers:
                worker.join()
            raise
        if errors:
            raise errors[0]  # carries the worker's traceback

    def work(self, iterator: Any, main_thread: bool) -> None:
        """Takes batches from ``iterator`` and runs them until it ends (or
        another thread failed)."""
        context = (
            join_context(self.model, self.distributed_model)
            if self.train and main_thread else None
        )
        with torch.set_grad_enabled(self.train):  # grad mode is per thread
            if context is not None:
                with context:
                    self._loop(iterator)
            else:
                self._loop(iterator)

    def _loop(self, iterator: Any) -> None:
        ahead = self._pull_ahead()
        held: collections.deque[Any] = collections.deque()
        try:
            self._run_batches(iterator, held, ahead)
        finally:
            if ahead is not None:
                ahead.close()
                with self.stats_lock:
                    totals = self.pulls_ahead
                    totals["depth"] = max(totals.get("depth", 0), ahead.depth)
                    totals["sent"] = totals.get("sent", 0) + ahead.sent_pulls
                    totals["taken"] = totals.get("taken", 0) + ahead.taken_pulls

    def _pull_ahead(self) -> ahead_pulls.PullAhead | None:
        """This thread's pulls sent ahead, when training pulls from servers
        that take them (an async worker's ``RemoteStore``)."""
        store = stores.current_store()
        if not self.train or not hasattr(store, "send_pull") or store.pull_ahead == 0:
            return None
        return ahead_pulls.PullAhead(store, stores.distinct_of)

    def _next_batch(
        self, iterator: Any, held: collections.deque[Any],
        ahead: ahead_pulls.PullAhead | None,
    ) -> Any:
        """The next batch of this thread (None: the pass is over). With pulls
        sent ahead, the thread holds the batches to come and sends their pulls."""
        wanted = 1 if ahead is None else 1 + ahead.wanted()
        while len(held) < wanted:
            with self.next_lock:
                if self.exhausted:
                    break
                try:
                    batch = next(iterator)
                except StopIteration:
                    self.exhausted = True
                    break
                number = self.taken
                self.taken += 1
            held.append((number, batch if self.device is None else _to_device(batch, self.device)))
        if not held:
            return None
        if ahead is not None:
            for _, batch in itertools.islice(held, 1, None):
                ahead.send(batch)
        return held.popleft()

    def _run_batches(
        self, iterator: Any, held: collections.deque[Any],
        ahead: ahead_pulls.PullAhead | None,
    ) -> None:
        clock = time.perf_counter
        while True:
            if self.stop.is_set():
                raise PassStopped
            t0 = clock()
            taken = self._next_batch(iterator, held, ahead)
            if taken is None:
                return
            number, batch = taken
            waited = clock() - t0
            pulled, updated = thread_totals()
            if self.hogwild is not None:
                t1 = clock()
                with ahead.forward(batch) if ahead is not None else contextlib.nullcontext():
                    outputs = _check_outputs(self.model(batch), need_loss=True)
                t2 = clock()
                grads = self.hogwild.gradients(outputs["loss"])
                t3 = clock()
                self.hogwild.apply(grads)
                t4 = clock()
            elif self.train:
                with self.step_lock:
                    self._take_turn(number)
                    t1 = clock()
                    with ahead.forward(batch) if ahead is not None else contextlib.nullcontext():
                        outputs = _check_outputs(self.model(batch), need_loss=True)
                    t2 = clock()
                    self._zero_grad()
                    outputs["loss"].backward()
                    t3 = clock()
                    self._step()
                    t4 = clock()
                    self.turn = number + 1
                    waiting = self.turn_events.get(self.turn)
                    if waiting is not None:
                        waiting.set()
            else:
                t1 = clock()
                outputs = _check_outputs(self.model(batch), need_loss=False)
                t2 = t3 = t4 = clock()
            pulled_now, updated_now = thread_totals()
            optimizer = updated_now - updated
            parts = (pulled_now - pulled, optimizer, max(0.0, t4 - t3 - optimizer))
            self._account(batch, outputs, (waited, t2 - t1, t3 - t2, t4 - t3), parts)

    def _take_turn(self, number: int) -> None:
        """Waits (holding ``step_lock``) until batch ``number`` is the next to
        step: threads take batches in order but reach the lock in any order,
        and steps out of order would train another model than one thread's."""
        if self.turn == number:
            return
        event = self.turn_events.setdefault(number, threading.Event())
        try:
            while self.turn != number:
                if self.stop.is_set():
                    raise PassStopped
                self.step_lock.release()
                try:
                    event.wait(0.2)  # a failed thread sets stop: seen within 0.2 s
                finally:
                    self.step_lock.acquire()
        finally:
            del self.turn_events[number]

    def _zero_grad(self) -> None:
        if isinstance(self.optimizer, torch.optim.Optimizer):
            clear_grads(self.optimizer)
        else:
            self.optimizer.zero_grad(set_to_none=True)

    def _step(self) -> None:
        # A torch optimizer's update without step()'s machinery (same values).
        if isinstance(self.optimizer, torch.optim.Optimizer):
            step_from_grads(self.optimizer)
        else:
            self.optimizer.step()

    # -- accounting ------------------------------------------------------------------

    def _account(
        self, batch: Any, outputs: Mapping[str, torch.Tensor], phases: tuple[float, ...],
        parts: tuple[float, ...],
    ) -> None:
        size = _batch_size(batch)
        missing = [name for name in self.names if name not in outputs]
        if missing and self.default_fetch:  # the default ["loss"], and no loss (inference)
            missing = []
        if missing:
            raise KeyError(
                f"fetch_list names {missing} but model(batch) returned only "
                f"{sorted(outputs)}"
            )
        if self.dumper is not None:
            self.dumper.add(batch, outputs, size)
        loss = outputs.get("loss")
        loss_value = None
        if loss is not None:
            loss_value = loss.item() if loss.numel() == 1 else float(loss.detach().float().mean())
        with self.stats_lock:
            self.batches += 1
            self.records += size
            if loss_value is not None:
                self.loss_sum += loss_value
                self.loss_batches += 1
            for phase, seconds in zip(_PHASES + _PARTS, phases + parts, strict=True):
                self.timings[phase] += seconds
            printing = self.batches % self.print_period == 0
            if not (self.keep_latest or self.fetch_handler is not None or printing):
                return
            detached = {name: value.detach() for name, value in outputs.items()}
            if self.keep_latest:
                self.latest = (detached, batch)
            if self.fetch_handler is not None:
                self.fetch_handler(detached)
            if printing:
                if self.names and any(name in detached for name in self.names):
                    print(self._fetch_line(detached), flush=True)
                if self.debug:
                    line = debug_line(self, self.records, time.perf_counter() - self.started)
                    print(line, file=sys.stderr, flush=True)

    def _fetch_line(self, outputs: Mapping[str, torch.Tensor]) -> str:
        parts = [
            f"time: [{time.strftime('%Y-%m-%d %H:%M:%S')}]",
            f"batch: [{self.batches}]",
        ]
        for name, label in zip(self.names, self.labels, strict=True):
            if name not in outputs:
                continue  # the default "loss", absent in inference
            values = outputs[name].reshape(-1).tolist()
            self.last_fetch[label] = values
            parts.append(f"{label}[{len(values)}]:[{' '.join(_format(v) for v in values)}]")
        return ", ".join(parts)

    def summary(self, seconds: float, threads: int) -> RunSummary:
        """What the pass did, as the call returns it."""
        mean_loss = self.loss_sum / self.loss_batches if self.loss_batches else None
        return RunSummary(
            self.batches, self.records, mean_loss, seconds, threads,
            dict(self.timings), dict(self.last_fetch),
            hogwild_fallback=self.hogwild_fallback, hogwild_warning=self.hogwild_warning,
            pulls_ahead=dict(self.pulls_ahead) if self.pulls_ahead.get("sent") else None,
        )


# -- helpers ---------------------------------------------------------------------------


_logged_once: set[str] = set()


def log_once(level: int, message: str) -> None:
    """Logs ``message`` at ``level`` the first time it comes (why Hogwild
    trainers are threads rather than processes, which would otherwise repeat
    at every pass; ``RunSummary.hogwild`` says which ran)."""
    if message not in _logged_once:
        _logged_once.add(message)
        logger.log(level, message)


def _check_outputs(outputs: Any, need_loss: bool) -> Mapping[str, torch.Tensor]:
    if not isinstance(outputs, Mapping):
        raise TypeError(
            f"model(batch) must return a dict of tensors (with a 'loss' entry), got "
            f"{type(outputs).__name__}"
        )
    if need_loss:
        loss = outputs.get("loss")
        if not isinstance(loss, torch.Tensor):
            raise TypeError(
                "model(batch) must return a dict with a tensor under 'loss', got "
                f"keys {sorted(outputs)}"
                + ("" if loss is None else f" and loss of type {type(loss).__name__}")
            )
        if loss.numel() != 1:
            raise ValueError(
                f"the 'loss' output must be a scalar, got shape {tuple(loss.shape)}"
            )
    return outputs


def _batch_size(batch: Any) -> int:
    size = getattr(batch, "size", None)
    if isinstance(size, int):
        return size
    if isinstance(batch, Mapping) and batch:
        first = next(iter(batch.values()))
        return len(first)
    return len(batch)


def _format(value: float | bool) -> str:
    # C++ ostream's default (6 significant digits), which Paddle's PrintVar uses.
    return format(value, "g") if isinstance(value, float) else str(value)


def debug_line(run: DatasetPass, records: int, seconds: float, final: bool = False) -> str:
    batches = max(run.batches, 1)
    phases = ", ".join(
        f"{phase.replace('_', ' ')}: {run.timings[phase] / batches * 1e3:.3f} ms/batch"
        for phase in _PHASES
    )
    parts = ", ".join(
        f"{part}: {run.timings[part] / batches * 1e3:.3f}" for part in _PARTS
    )
    busy = sum(run.timings[phase] for phase in _PHASES)
    io_percent = 100.0 * run.timings["data_wait"] / busy if busy > 0 else 0.0
    rate = records / seconds if seconds > 0 else 0.0
    head = "summary" if final else f"time: [{time.strftime('%Y-%m-%d %H:%M:%S')}]"
    return (
        f"{head}, batch: [{run.batches}], {phases} ({parts}), IO percent: {io_percent:.1f}%, "
        f"{rate:.2f} records/s"
    )


def _to_device(batch: Any, device: torch.device) -> Any:
    """The batch's tensors (and ``Ragged`` values/offsets) on ``device``."""
    def move(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.to(device, non_blocking=True)
        if hasattr(value, "values") and hasattr(value, "offsets"):  # datafeed.Ragged
            return type(value)(move(value.values), move(value.offsets))
        return value

    if not isinstance(batch, Mapping):
        return batch
    moved = {name: move(value) for name, value in batch.items()}
    size = getattr(batch, "size", None)
    if isinstance(size, int) and not isinstance(batch, dict):
        batch_type: Any = type(batch)
        return batch_type(moved, size)  # datafeed.Batch(slots, size)
    return moved


def join_context(model: Any, distributed_model: Any = None) -> Any:
    """DDP's ``join()`` lets ranks with fewer batches finish without hanging the rest.

    The DDP module is ``model`` itself or, when ``model`` is a function or module
    that calls it, ``distributed_model`` (the one ``fleet.distributed_model`` returned).
    """
    ddp = torch.nn.parallel.DistributedDataParallel
    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return None
    if isinstance(model, ddp):
        return model.join()
    if isinstance(distributed_model, ddp):
        return distributed_model.join()
    return None
