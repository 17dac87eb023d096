"""``Executor.train_from_dataset`` / ``infer_from_dataset``: Paddle's training loop on torch.

A model is any callable that takes a ``datafeed.Batch`` and returns a dict of
tensors holding ``"loss"`` (and any metric to print). ``thread`` worker threads
share the one model and take batches from one shared pass over the dataset (a lock
around ``next()``), as Paddle's ``HogwildWorker`` threads share one scope.

Inference runs fully in parallel. Training threads read, parse and batch in
parallel and step one at a time: forward, backward and ``step()`` under one lock
(``thread=1`` is torch's own loop: ``backward()`` then ``optimizer.step()``).
With ``hogwild=True`` training is Hogwild, as Paddle's threads are: each trainer
runs its forward, backward and update at the same time as the others, takes its
own gradients and applies them to the shared parameters without a lock
(trainer/loop/hogwild.py), and trains the sparse tables with the rows it pulled
itself. On an ``InMemoryDataset`` the trainers are processes sharing memory
(trainer/loop/hogwild_processes.py: Python's GIL lets threads overlap only inside
torch's ops); elsewhere, and where processes cannot serve, threads. That needs
an optimizer whose update can run so: ``SGD``, ``Adagrad``, ``Adam`` or ``AdamW``, plain or through
``fleet.distributed_optimizer`` in local mode; any other optimizer, and the
parameter-server modes (async, sync, GEO), step one at a time instead (a
warning at every call, and ``RunSummary.hogwild_fallback``). Hogwild is opt-in
because it cost accuracy on examples/mlp_local (see ``train_from_dataset``):
a model with a large dense embedding table gets a warning at every call, and
``RunSummary.hogwild_warning``.

Every ``print_period`` batches it prints Paddle's line to stdout:
``time: [2024-01-01 12:00:00], batch: [100], loss[1]:[0.693]``.

Paddle's own order, ``train_from_dataset(program, dataset, scope, ...)``, runs
too (``_paddle_program``, ``_is_paddle_scope``): the program stands for the model
and the optimizer that ``fleet`` holds, as Paddle's default main program holds
the network and the ops that ``minimize`` added.

This module checks the arguments and runs the pass; the threads, the loop and
its counters are trainer/loop/train_loop.py's.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from datafeed.records.memory import release_free_memory

from . import fleet
from .fetch_handler import FetchHandler, FetchMonitor, is_periodic
from .job.errors import TrainerError
from .loop import hogwild_processes
from .loop.dumps import FieldDumper
from .loop.run_summary import RunSummary, input_stats, log_summary
from .loop.train_loop import DatasetPass, debug_line, log_once

__all__ = ["Executor", "FetchHandler", "RunSummary"]

logger = logging.getLogger("trainer.executor")

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
                scalar ``"loss"``. Put in training mode (``model.train()``; to
                keep a part in eval mode while training, such as a frozen
                BatchNorm, override the module's ``train()``, the PyTorch idiom).
            dataset: an ``InMemoryDataset``, ``QueueDataset`` or any iterable of
                batches (``init`` and ``set_filelist`` already done).
            optimizer: a ``torch.optim`` optimizer or what
                ``fleet.distributed_optimizer`` returned; None uses the one last
                given to ``fleet.distributed_optimizer``.
            thread: worker threads; 0 means the dataset's ``thread_num``.
                Threads read batches in parallel and step one at a time, unless
                ``hogwild`` (the module's docstring). A
                ``DistributedDataParallel`` model always runs one thread.
            hogwild: with ``thread`` > 1, run ``thread`` trainers whose
                forward, backward and update run at once, without a lock, as
                Paddle's threads do (SGD, Adagrad, Adam or AdamW; local mode).
                On an ``InMemoryDataset`` they are processes (this one and
                ``thread - 1`` forked ones sharing parameters, optimizer state
                and sparse tables, which wait for the next pass:
                trainer/loop/hogwild_processes.py), elsewhere
                threads, which Python's GIL lets run no faster than one on a
                small model (docs/training_speed.md); ``RunSummary.hogwild``
                says which ran. Opt-in: on examples/mlp_local (a dense
                100k-row EmbeddingBag, Adam) two Hogwild threads reached
                held-out AUC 0.83-0.87 against 0.89 with one step at a time,
                as every trainer rewrites the whole table at each step; such
                a table gets a warning (``RunSummary.hogwild_warning``).
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

        Paddle's positional order, ``(program, dataset, scope, thread, ...)``,
        is accepted rather than refused, so that a Paddle script's call runs
        unchanged once the job has given its model to
        ``fleet.distributed_model`` and its optimizer to
        ``fleet.distributed_optimizer``: a first argument that is Paddle's
        program (None, or a ``Program``: not callable, with ``global_block``)
        stands for that model, and a third that is Paddle's scope (no
        ``step()``, not callable, not a number or a string) for that optimizer.
        Nothing is guessed: without a model or an optimizer in ``fleet`` the
        call is refused with a message that shows fleetfeed's call.

        Returns:
            A ``RunSummary``.

        Raises:
            RuntimeError: no dataset, or no thread count anywhere.
            TypeError: a model that is not callable, Paddle's program with no
                model in ``fleet``, or a third argument that is neither an
                optimizer nor Paddle's scope.
            ValueError: mismatched ``fetch_list``/``fetch_info``, a bad
                ``print_period``, or no optimizer.
            Exception: whatever a worker thread raised, with its traceback; a
                Hogwild process's error as the same builtin type with a
                ``TrainerProcessError`` holding its traceback as the cause.
            TrainerProcessError: a Hogwild process ended without a result
                (killed), or failed with an error of another type.
        """
        del scope
        model = _the_model("train_from_dataset", model, program)
        call = _FLEETFEED_CALL.format("train_from_dataset")
        paddle_scope = optimizer if _is_paddle_scope(optimizer) else None
        if paddle_scope is not None:
            optimizer = None
        elif optimizer is not None and not callable(getattr(optimizer, "step", None)):
            raise TypeError(
                f"train_from_dataset's third argument must be an optimizer (with step()) or "
                f"Paddle's scope, got {_describe(optimizer)}; fleetfeed's call is {call}"
            )
        if optimizer is None:
            optimizer = fleet.current().optimizer
        if optimizer is None and paddle_scope is not None:
            raise ValueError(
                f"train_from_dataset needs an optimizer: the third argument, "
                f"{_describe(paddle_scope)}, is Paddle's scope, which stands for the optimizer "
                f"given to fleet.distributed_optimizer, and none was given; call "
                f"fleet.distributed_optimizer(optimizer) first, or {call}"
            )
        if optimizer is None:
            raise ValueError(
                f"train_from_dataset needs an optimizer: pass optimizer=..., or call "
                f"fleet.distributed_optimizer(optimizer) first ({call})"
            )
        return self._run(
            model, dataset, optimizer, thread, debug, fetch_list, fetch_info,
            print_period, fetch_handler, train=True, hogwild=hogwild,
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

        An ``nn.Module`` runs in evaluation mode (``model.eval()``; each
        submodule's own mode is restored afterwards, through ``train()``), any model under
        ``torch.no_grad()`` (a plain function's modules keep the mode they
        have); threads run the forward in parallel. Nothing trains: Paddle's
        ``infer_from_dataset`` of a training program runs its optimizer too, as
        a ``clone(for_test=True)`` program does not; this is the latter. A
        ``"loss"`` output is optional. ``optimizer`` is accepted and ignored, for
        the symmetry with ``train_from_dataset`` (Paddle's signature).
        Arguments and errors are otherwise those of ``train_from_dataset``, Paddle's
        order ``(program, dataset, scope, ...)`` included (its scope lands on the
        ignored ``optimizer``).
        """
        del optimizer, scope
        model = _the_model("infer_from_dataset", model, program)
        return self._run(
            model, dataset, None, thread, debug, fetch_list, fetch_info,
            print_period, fetch_handler, train=False,
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
        hogwild: bool = False,
    ) -> RunSummary:
        if dataset is None:
            raise RuntimeError("dataset is needed and should be initialized")
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
        run = DatasetPass(
            model, optimizer, names, labels, print_period, debug,
            None if periodic else fetch_handler, train,
            self.place if self.place is not None else _model_device(model),
            distributed_model=fleet.current().model,
        )
        run.keep_latest = periodic
        dumps = _dump_settings(model)  # checked now; the writer starts with the pass
        run.dumps_wanted = dumps is not None
        processes, process_setup = 0, None
        if train and threads > 1 and hogwild:
            run.start_hogwild(optimizer)
            if run.hogwild is not None:
                reason, process_setup = hogwild_processes.prepare(
                    run, dataset, run.hogwild, threads
                )
                if reason is None:
                    processes = threads
                else:
                    log_once(logging.INFO, f"{reason}: Hogwild threads instead of processes")
        monitor = FetchMonitor(fetch_handler, run.current_value) if periodic else None
        run.default_fetch = fetch_list is None
        module = model if isinstance(model, torch.nn.Module) else None
        # model.train() as any PyTorch loop calls it (a part kept in eval while
        # training overrides train(), the PyTorch idiom); an inference gives
        # every part back the mode it had.
        modes = (  # a part shared by two parents is listed under each
            [(m, m.training) for _, m in module.named_modules(remove_duplicate=False)]
            if module is not None else []
        )
        if module is not None:
            module.train(train)
        started = time.perf_counter()
        iterator = None
        dumper_open = False
        try:
            if train:
                _check_even_batches(dataset)
            iterator = iter(dataset) if not processes else None
            if dumps is not None:
                run.dumper = FieldDumper(*dumps)
                dumper_open = True
            with monitor or contextlib.nullcontext():  # stopped and joined on failure too
                if processes:
                    hogwild_processes.run_processes(run, dataset, processes, process_setup)
                elif threads == 1:
                    run.work(iterator, main_thread=True)
                else:
                    run.work_in_threads(iterator, threads)
        except BaseException:
            if dumper_open:  # the pass's own error is the one to raise
                dumper_open = False
                with contextlib.suppress(Exception):
                    run.dumper.close(complete=False)  # no partial dump put in place
            raise
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()  # a generator's finally (QueueDataset's readers) runs now
            if module is not None and not train:
                _restore_modes(module, modes)
            if dumper_open:
                dumper_open = False
                run.dumper.close()  # the last lines written; a writer's error raised
            # The pass's batches, activations and gradients are freed now, but
            # glibc keeps their heap pages: successive passes then creep up
            # (+34 MiB RSS over 10 passes of 375k records in benchmarks/soak.py's
            # model, flat with this trim).
            release_free_memory()
        if monitor is not None:
            monitor.raise_error()
        summary = run.summary(time.perf_counter() - started, threads)
        if run.hogwild is not None:
            summary.hogwild = "processes" if processes else "threads"
        summary.input = input_stats(dataset)
        log_summary("train_from_dataset" if train else "infer_from_dataset", summary)
        if debug:
            print(debug_line(run, summary.records, summary.seconds, final=True),
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


def _check_even_batches(dataset: Any) -> None:
    """Collective training of a dataset that knows its batch count (an
    InMemoryDataset without ``equal_batches``): every rank must hold as many
    (``check_even_batches``). A stream's count is known at its end only."""
    try:
        role = fleet.current().role
    except TrainerError:
        return  # no fleet.init(): one process
    if not (role.is_collective and role.distributed) or getattr(dataset, "equal_batches", True):
        return
    try:
        batches = len(dataset)
    except TypeError:
        return
    from .collective.data_parallel import check_even_batches

    check_even_batches(batches)


# What the errors show, with the method's name put in.
_FLEETFEED_CALL = "exe.{}(model, dataset, optimizer, thread=..., fetch_list=[...])"


def _the_model(what: str, model: Any, program: Any) -> Callable[[Any], Any]:
    """The callable to run: ``model`` (or ``program=``, Paddle's keyword), or,
    for Paddle's program in that place, the model ``fleet`` holds."""
    if program is not None:
        if model is not None:
            raise TypeError("pass the model once: as model or as program, not both")
        model = program
    if _paddle_program(model):
        held = fleet.current().model
        if held is None:
            raise TypeError(
                f"{what} got Paddle's program ({_describe(model)}) in place of the model, "
                f"and fleet holds no model for it to stand for: call "
                f"{_FLEETFEED_CALL.format(what)} with the model, or give the model to "
                f"fleet.distributed_model(model) first"
            )
        return held
    if not callable(model):
        raise TypeError(
            f"model must be callable as model(batch), got {_describe(model)}; fleetfeed's "
            f"call is {_FLEETFEED_CALL.format(what)}"
        )
    return model


def _paddle_program(value: Any) -> bool:
    """Whether ``value`` is Paddle's program argument: None (its default main
    program) or a ``Program``/``CompiledProgram`` (has ``global_block``)."""
    if value is None:
        return True
    return not callable(value) and (
        hasattr(value, "global_block") or type(value).__name__ in ("Program", "CompiledProgram")
    )


def _is_paddle_scope(value: Any) -> bool:
    """Whether ``value``, in the optimizer's place, is Paddle's scope: no
    ``step()``, not callable, not a number or a string (a thread count or a
    name there is a mistake)."""
    if value is None or callable(getattr(value, "step", None)) or callable(value):
        return False
    return not isinstance(value, (int, float, str, bytes))


def _describe(value: Any) -> str:
    """A short name for ``value`` in an error: a plain value itself, else its type."""
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        text = repr(value)
        return text if len(text) <= 40 else f"a {type(value).__name__}"
    return f"a {type(value).__name__}"


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


def _model_device(model: Any) -> torch.device | None:
    if isinstance(model, torch.nn.Module):
        for parameter in model.parameters():
            return parameter.device
    return None


def _dump_settings(model: Any) -> tuple[str, list[str], list[tuple[str, Any]], int] | None:
    """The arguments of the ``FieldDumper`` that the fleet's strategy asks for
    (``trainer_desc_configs``: Paddle's per-instance dumps), or None."""
    configs = fleet.current().strategy.trainer_desc_configs
    path, fields, params = (
        configs["dump_fields_path"], configs["dump_fields"], configs["dump_param"]
    )
    if not (fields or params):
        return None
    if not path:
        raise ValueError(
            "trainer_desc_configs names dump_fields or dump_param but no dump_fields_path: "
            "set the folder the dumps go to"
        )
    named = dict(getattr(model, "named_parameters", list)())
    missing = [name for name in params if name not in named]
    if missing:
        raise KeyError(
            f"trainer_desc_configs['dump_param'] names {missing}, which are not parameters "
            f"of the model (they are {sorted(named)})"
        )
    role = fleet.current()._role  # None before fleet.init(): one local worker
    worker = role.index if role is not None and role.is_worker else 0
    return path, fields, [(name, named[name]) for name in params], worker


def _restore_modes(module: torch.nn.Module, modes: list[tuple[torch.nn.Module, bool]]) -> None:
    """Gives each part of ``module`` the mode it had, through ``train()`` (an
    override may keep state in step with the mode: LoRA layers merge their
    weights in eval): the whole module first, then, root to leaves, each part
    whose mode still differs."""
    module.train(modes[0][1])
    for part, mode in modes[1:]:
        if part.training != mode:
            part.train(mode)
