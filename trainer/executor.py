"""``Executor.train_from_dataset`` / ``infer_from_dataset``: Paddle's training loop on torch.

A model is any callable that takes a ``datafeed.Batch`` and returns a dict of
tensors holding ``"loss"`` (and any metric to print). ``thread`` worker threads
share the one model and take batches from one shared pass over the dataset (a lock
around ``next()``), as Paddle's ``HogwildWorker`` threads share one scope.

Inference runs fully in parallel. Training threads read, parse and batch in
parallel and step one at a time: forward, backward and ``step()`` under one lock
(``thread=1`` is torch's own loop: ``backward()`` then ``optimizer.step()``).
With ``hogwild=True`` training is Hogwild, as Paddle's threads are: each thread
runs its forward, backward and update at the same time as the others (torch's
kernels release the GIL), takes its own gradients and applies them to the
shared parameters without a lock (trainer/hogwild.py), and trains the sparse
tables with the rows it pulled itself. That needs an optimizer whose update can
run so: ``SGD``, ``Adagrad``, ``Adam`` or ``AdamW``, plain or through
``fleet.distributed_optimizer`` in local mode; any other optimizer, and the
parameter-server modes (async, sync, GEO), step one at a time instead (logged
once as a warning). Hogwild is opt-in because it cost accuracy on
examples/mlp_local (see ``train_from_dataset``).

Every ``print_period`` batches it prints Paddle's line to stdout:
``time: [2024-01-01 12:00:00], batch: [100], loss[1]:[0.693]``.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from datafeed.memory import release_free_memory

from . import fleet
from .fetch_handler import FetchHandler, FetchMonitor, is_periodic
from .hogwild import HogwildStep
from .ps.dense_update import clear_grads, step_from_grads
from .ps.step_clock import thread_totals
from .run_summary import RunSummary, input_stats, log_summary

__all__ = ["Executor", "FetchHandler", "RunSummary"]

logger = logging.getLogger("trainer.executor")

_PHASES = ("data_wait", "forward", "backward", "step")
# Parts of them (trainer/ps/step_clock.py): the rows pulled in the forward; the
# step's dense optimizer update, and the rest of the step, the sparse push.
_PARTS = ("pull", "optimizer", "push")


class _Stop(Exception):
    """Raised inside a worker when another worker has failed."""


class Executor:
    """Runs a model over a dataset, as Paddle's ``Executor``.

    Args:
        place: where batches go before ``model(batch)``: a ``torch.device`` or
            its name (``"cuda"``, ``"cuda:1"``). Default: the device of the
            model's first parameter (batches stay on the CPU for a CPU model).
    """

    def __init__(self, place: Any = None) -> None:
        self.place = None if place is None else torch.device(place)

    def train_from_dataset(
        self,
        model: Callable[[Any], Mapping[str, torch.Tensor]] | None = None,
        dataset: Iterable[Any] | None = None,
        optimizer: Any = None,
        thread: int = 0,
        debug: bool = False,
        fetch_list: Sequence[Any] | None = None,
        fetch_info: Sequence[str] | None = None,
        print_period: int = 100,
        fetch_handler: Any = None,
        *,
        scope: Any = None,
        program: Any = None,
        hogwild: bool = False,
    ) -> RunSummary:
        """One pass over ``dataset``: forward, backward and optimizer step per batch.

        Args:
            model: called as ``model(batch)``; returns a dict of tensors with a
                scalar ``"loss"``. Put in training mode (``model.train()``).
            dataset: an ``InMemoryDataset``, ``QueueDataset`` or any iterable of
                batches (``init`` and ``set_filelist`` already done).
            optimizer: a ``torch.optim`` optimizer or what
                ``fleet.distributed_optimizer`` returned; None uses the one last
                given to ``fleet.distributed_optimizer``.
            thread: worker threads; 0 means the dataset's ``thread_num``.
                Threads read batches in parallel and step one at a time, unless
                ``hogwild`` (the module's docstring). A
                ``DistributedDataParallel`` model always runs one thread.
            hogwild: with ``thread`` > 1, run each thread's forward, backward
                and update at once, without a lock, as Paddle's threads do (SGD,
                Adagrad, Adam or AdamW in one process). Opt-in: on
                examples/mlp_local (a dense 100k-row EmbeddingBag, Adam) two
                Hogwild threads reached held-out AUC 0.83-0.87 against 0.89
                with one step at a time, a loss not yet explained.
            debug: also print per-phase timings and records/s (to stderr).
            fetch_list: names (or objects with a ``name``) of outputs to print
                every ``print_period`` batches; default ``["loss"]`` (in
                inference, only when the model returns a loss); ``[]`` prints
                nothing.
            fetch_info: the label printed for each ``fetch_list`` entry
                (default: the names).
            print_period: batches between two printed lines.
            fetch_handler: a ``FetchHandler`` (Paddle's): its ``handler(res_dict)``
                is called every ``period_secs`` from a monitor thread with the
                current values of its ``var_dict`` (trainer/fetch_handler.py);
                or a function, called after every batch with the model's
                outputs (detached), one call at a time: e.g. to feed a
                ``StreamingAUC``.
            scope: Paddle's scope: accepted and ignored (the model holds its
                parameters).
            program: Paddle's name for the first argument: the model.

        Returns:
            A ``RunSummary``.

        Raises:
            RuntimeError: no dataset, or no thread count anywhere.
            ValueError: mismatched ``fetch_list``/``fetch_info``, a bad
                ``print_period``, or no optimizer.
            Exception: whatever a worker thread raised, with its traceback.
        """
        if optimizer is None:
            optimizer = fleet.current().optimizer
            if optimizer is None:
                raise ValueError(
                    "train_from_dataset needs an optimizer: pass optimizer=..., or "
                    "call fleet.distributed_optimizer(optimizer) first"
                )
        del scope
        return self._run(
            model, dataset, optimizer, thread, debug, fetch_list, fetch_info,
            print_period, fetch_handler, train=True, program=program, hogwild=hogwild,
        )

    def infer_from_dataset(
        self,
        model: Callable[[Any], Mapping[str, torch.Tensor]] | None = None,
        dataset: Iterable[Any] | None = None,
        optimizer: Any = None,
        thread: int = 0,
        debug: bool = False,
        fetch_list: Sequence[Any] | None = None,
        fetch_info: Sequence[str] | None = None,
        print_period: int = 100,
        fetch_handler: Any = None,
        *,
        scope: Any = None,
        program: Any = None,
    ) -> RunSummary:
        """One pass over ``dataset`` without gradients or optimizer steps.

        The model runs in evaluation mode (``model.eval()``, restored afterwards)
        under ``torch.no_grad()``; threads run the forward in parallel. A
        ``"loss"`` output is optional. ``optimizer`` is accepted and ignored, for
        the symmetry with ``train_from_dataset`` (Paddle's signature).
        Arguments and errors are otherwise those of ``train_from_dataset``.
        """
        del optimizer, scope
        return self._run(
            model, dataset, None, thread, debug, fetch_list, fetch_info,
            print_period, fetch_handler, train=False, program=program,
        )

    # -- the loop --------------------------------------------------------------------

    def _run(
        self,
        model: Any,
        dataset: Any,
        optimizer: Any,
        thread: int,
        debug: bool,
        fetch_list: Sequence[Any] | None,
        fetch_info: Sequence[str] | None,
        print_period: int,
        fetch_handler: Any,
        train: bool,
        program: Any = None,
        hogwild: bool = False,
    ) -> RunSummary:
        if program is not None:
            if model is not None:
                raise TypeError("pass the model once: as model or as program, not both")
            model = program
        if dataset is None:
            raise RuntimeError("dataset is needed and should be initialized")
        if model is None or not callable(model):
            raise TypeError(f"model must be callable as model(batch), got {model!r}")
        if not isinstance(print_period, int) or print_period < 1:
            raise ValueError(f"print_period must be an int >= 1, got {print_period!r}")
        names = _fetch_names(fetch_list)
        labels = list(fetch_info) if fetch_info is not None else list(names)
        if len(labels) != len(names):
            raise ValueError(
                f"fetch_info must name each fetch_list entry: {len(names)} in fetch_list "
                f"({names}), {len(labels)} in fetch_info ({labels})"
            )
        threads = self._thread_count(model, dataset, thread)
        periodic = fetch_handler is not None and is_periodic(fetch_handler)
        if not (fetch_handler is None or periodic or callable(fetch_handler)):
            raise TypeError(
                "fetch_handler must be a FetchHandler (with handler, var_dict and "
                f"period_secs) or a function of the outputs, got {fetch_handler!r}"
            )
        run = _Run(
            model, optimizer, names, labels, print_period, debug,
            None if periodic else fetch_handler, train,
            self.place if self.place is not None else _model_device(model),
        )
        run.keep_latest = periodic
        if train and threads > 1 and hogwild:
            run.hogwild = _hogwild_step(optimizer)
        monitor = FetchMonitor(fetch_handler, run.current_value) if periodic else None
        run.default_fetch = fetch_list is None
        module = model if isinstance(model, torch.nn.Module) else None
        was_training = module.training if module is not None else True
        if module is not None:
            module.train(train)
        started = time.perf_counter()
        iterator = iter(dataset)
        try:
            with monitor or contextlib.nullcontext():  # stopped and joined on failure too
                if threads == 1:
                    run.work(iterator, main_thread=True)
                else:
                    run.work_in_threads(iterator, threads)
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()  # a generator's finally (QueueDataset's readers) runs now
            if module is not None and not train:
                module.train(was_training)
            # The pass's batches, activations and gradients are freed now, but
            # glibc keeps their heap pages: successive passes then creep up
            # (+34 MiB RSS over 10 passes of 375k records in benchmarks/soak.py's
            # model, flat with this trim).
            release_free_memory()
        if monitor is not None:
            monitor.raise_error()
        summary = run.summary(time.perf_counter() - started, threads)
        summary.input = input_stats(dataset)
        log_summary("train_from_dataset" if train else "infer_from_dataset", summary)
        if debug:
            print(_debug_line(run, summary.records, summary.seconds, final=True),
                  file=sys.stderr, flush=True)
        return summary

    @staticmethod
    def _thread_count(model: Any, dataset: Any, thread: int) -> int:
        if not isinstance(thread, int) or thread < 0:
            raise ValueError(f"thread must be an int >= 0, got {thread!r}")
        count = thread
        if count == 0:
            count = int(getattr(dataset, "thread_num", 1) or 0)
            if count <= 0:
                raise RuntimeError(
                    "You should set thread num first, either in Dataset or in "
                    "Executor.train_from_dataset"
                )
        if isinstance(model, torch.nn.parallel.DistributedDataParallel) and count > 1:
            if thread > 1:
                raise ValueError(
                    f"a DistributedDataParallel model trains on one thread (its "
                    f"reducer is not thread-safe), got thread={thread}"
                )
            count = 1
        return count


class _Run:
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
    ) -> None:
        self.model = model
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
        # For a FetchHandler's monitor thread: the last batch and its outputs.
        self.keep_latest = False
        self.latest: tuple[Mapping[str, Any], Any] = ({}, None)

    def current_value(self, name: str) -> Any:
        """The last batch's output ``name``, else its slot ``name``, else None."""
        with self.stats_lock:
            outputs, batch = self.latest
        if name in outputs:
            return outputs[name]
        return batch[name] if isinstance(batch, Mapping) and name in batch else None

    # -- threads ---------------------------------------------------------------------

    def work_in_threads(self, iterator: Any, threads: int) -> None:
        errors: list[BaseException] = []

        def target() -> None:
            try:
                self.work(iterator, main_thread=False)
            except _Stop:
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
        context = _join_context(self.model) if self.train and main_thread else None
        with torch.set_grad_enabled(self.train):  # grad mode is per thread
            if context is not None:
                with context:
                    self._loop(iterator)
            else:
                self._loop(iterator)

    def _loop(self, iterator: Any) -> None:
        clock = time.perf_counter
        while True:
            if self.stop.is_set():
                raise _Stop
            t0 = clock()
            with self.next_lock:
                if self.exhausted:
                    return
                try:
                    batch = next(iterator)
                except StopIteration:
                    self.exhausted = True
                    return
            if self.device is not None:
                batch = _to_device(batch, self.device)
            waited = clock() - t0
            pulled, updated = thread_totals()
            if self.hogwild is not None:
                t1 = clock()
                outputs = _check_outputs(self.model(batch), need_loss=True)
                t2 = clock()
                grads = self.hogwild.gradients(outputs["loss"])
                t3 = clock()
                self.hogwild.apply(grads)
                t4 = clock()
            elif self.train:
                with self.step_lock:
                    t1 = clock()
                    outputs = _check_outputs(self.model(batch), need_loss=True)
                    t2 = clock()
                    self._zero_grad()
                    outputs["loss"].backward()
                    t3 = clock()
                    self._step()
                    t4 = clock()
            else:
                t1 = clock()
                outputs = _check_outputs(self.model(batch), need_loss=False)
                t2 = t3 = t4 = clock()
            pulled_now, updated_now = thread_totals()
            optimizer = updated_now - updated
            parts = (pulled_now - pulled, optimizer, max(0.0, t4 - t3 - optimizer))
            self._account(batch, outputs, (waited, t2 - t1, t3 - t2, t4 - t3), parts)

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
                    line = _debug_line(self, self.records, time.perf_counter() - self.started)
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
        mean_loss = self.loss_sum / self.loss_batches if self.loss_batches else None
        return RunSummary(
            self.batches, self.records, mean_loss, seconds, threads,
            dict(self.timings), dict(self.last_fetch),
        )


# -- helpers ---------------------------------------------------------------------------


_fallback_reasons: set[str] = set()


def _hogwild_step(optimizer: Any) -> HogwildStep | None:
    """The Hogwild step for ``optimizer``; None (and a warning, once per reason)
    where its threads must step one at a time."""
    try:
        return HogwildStep(optimizer)
    except ValueError as error:
        reason = str(error)
    if reason not in _fallback_reasons:
        _fallback_reasons.add(reason)
        logger.warning("%s: training threads step one at a time", reason)
    return None


def _fetch_names(fetch_list: Sequence[Any] | None) -> list[str]:
    if fetch_list is None:
        return ["loss"]
    names = []
    for entry in fetch_list:
        name = entry if isinstance(entry, str) else getattr(entry, "name", None)
        if not isinstance(name, str):
            raise TypeError(
                f"fetch_list entries must be output names (or have a .name), got {entry!r}"
            )
        names.append(name)
    return names


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


def _debug_line(run: _Run, records: int, seconds: float, final: bool = False) -> str:
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


def _model_device(model: Any) -> torch.device | None:
    if isinstance(model, torch.nn.Module):
        for parameter in model.parameters():
            return parameter.device
    return None


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


def _join_context(model: Any) -> Any:
    """DDP's ``join()`` lets ranks with fewer batches finish without hanging the rest.

    The DDP module is ``model`` itself or, when ``model`` is a function or module
    that calls it, the one ``fleet.distributed_model`` returned.
    """
    ddp = torch.nn.parallel.DistributedDataParallel
    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return None
    if isinstance(model, ddp):
        return model.join()
    fleet_model = fleet.current().model
    if isinstance(fleet_model, ddp):
        return fleet_model.join()
    return None
