"""Data parallelism that does not depend on the user remembering a call.

In Paddle, ``fleet.distributed_optimizer(opt).minimize(loss)`` inserts the
gradient all-reduce: a collective program that never wraps its model still
trains one model. ``CollectiveOptimizer`` does the same on ``torch.distributed``:
the gradient of every replicated parameter is averaged over the ranks by the
end of each backward (or at ``step()``, for gradients no backward made), and
wrapping an optimizer makes the models it trains rank 0's (before the first
forward: a gradient taken at another rank's start would be averaged into the
first step). As with DDP, every rank runs the same backwards between two steps.

Replicated means: not marked ``is_distributed=True``. That is Paddle's attribute
for a model-parallel shard (each rank holds a different slice of the weight), so
such a parameter is never broadcast and never averaged, here or by
``distributed_model`` (``ddp_without_shards``). Its layer's collectives give it
the gradient of the sum of the ranks' losses (``model_parallel``); training
minimises their mean, so its gradient is divided by the number of ranks as it
arrives (``scale_shard_gradients``), as the replicated ones are by averaging.

A parameter that ``DistributedDataParallel`` already synchronised needs no
second all-reduce; averaging it again would only cost the traffic, since the
average of equal gradients is that gradient. DDP synchronises only when the
forward ran through it (a script that calls the unwrapped model gets nothing
from it), so ``distributed_model`` marks each parameter with its DDP module and
counts that module's forwards; ``step()`` skips a parameter only when its
module's forward ran since the last step.
"""

from __future__ import annotations

import hashlib
import logging
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from datafeed.reorder.collectives import host_group

from ..embedding import tables
from ..job.errors import TrainerError
from .process_group import wait_for, world_size

__all__ = [
    "BUCKET_BYTES",
    "CollectiveOptimizer",
    "check_even_batches",
    "group_for",
    "ddp_without_shards",
    "distributed_model",
    "is_distributed",
    "scale_shard_gradients",
    "shard_gradients_scaled",
]

logger = logging.getLogger("trainer.collective")

# One all-reduce per bucket of gradients of one dtype, as DDP's default 25 MiB:
# few enough collectives, small enough that a bucket's copy stays cheap.
BUCKET_BYTES = 25 << 20

# On each parameter a DistributedDataParallel module made by distributed_model
# synchronises: a weak reference to that module (an attribute lives and dies
# with the parameter; a set of tensors would compare them elementwise).
_DDP_OF_PARAMETER = "_fleetfeed_ddp"
# On that module: how many forwards ran through it.
_FORWARDS = "_fleetfeed_forwards"
# On a model-parallel shard whose gradient is divided by the number of ranks.
_SCALED_SHARD = "_fleetfeed_scaled_shard"


def is_distributed(parameter: torch.Tensor) -> bool:
    """Whether ``parameter`` is a model-parallel shard (``is_distributed=True``).

    Read from the parameter's own attributes: ``torch.Tensor`` has a legacy
    method of that name, which ``getattr`` would find (and which is truthy)."""
    return vars(parameter).get("is_distributed") is True


def shard_gradients_scaled(parameter: torch.Tensor) -> bool:
    """Whether ``scale_shard_gradients`` holds ``parameter``."""
    return vars(parameter).get(_SCALED_SHARD) is True


def scale_shard_gradients(parameters: Iterable[torch.Tensor]) -> None:
    """Divides the gradient of each ``is_distributed`` shard among ``parameters``
    by the number of ranks as it arrives (once per shard, however many wrappers
    hold it), so shards and averaged replicated parameters follow one loss: the
    mean of the ranks' losses."""
    world = world_size()
    for parameter in parameters:
        if is_distributed(parameter) and parameter.requires_grad \
                and not shard_gradients_scaled(parameter):
            parameter.register_hook(lambda grad: grad / world)
            setattr(parameter, _SCALED_SHARD, True)


def distributed_model(model: nn.Module, find_unused_parameters: bool = False) -> nn.Module:
    """``DistributedDataParallel(model)`` on this rank's device, leaving out the
    ``is_distributed`` shards; the model itself without a process group (the
    local fallback)."""
    if not dist.is_initialized():
        return model
    if dist.get_backend() == "nccl":
        device = torch.cuda.current_device()
        return ddp_without_shards(
            model.to(device), device_ids=[device],
            find_unused_parameters=find_unused_parameters,
        )
    return ddp_without_shards(model, find_unused_parameters=find_unused_parameters)


def ddp_without_shards(model: nn.Module, **ddp_options: Any) -> nn.Module:
    """``DistributedDataParallel(model)`` that neither broadcasts nor averages the
    parameters marked ``is_distributed``; remembers the ones it synchronises."""
    shards = [name for name, p in model.named_parameters() if is_distributed(p)]
    scale_shard_gradients(model.parameters())
    if shards:
        nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            model, shards
        )
    replicated = [p for p in model.parameters() if not is_distributed(p) and p.requires_grad]
    if not replicated:  # DDP refuses a model with nothing to synchronise
        return model
    wrapped = nn.parallel.DistributedDataParallel(model, **ddp_options)
    setattr(wrapped, _FORWARDS, 0)
    wrapped.register_forward_pre_hook(_count_forward)
    for parameter in replicated:
        setattr(parameter, _DDP_OF_PARAMETER, weakref.ref(wrapped))
    return wrapped


def _count_forward(module: nn.Module, _inputs: Any) -> None:
    setattr(module, _FORWARDS, getattr(module, _FORWARDS, 0) + 1)


def _ddp_of(parameter: torch.Tensor) -> nn.Module | None:
    """The live DDP module (of distributed_model) that synchronises ``parameter``."""
    reference = getattr(parameter, _DDP_OF_PARAMETER, None)
    return None if reference is None else reference()


def _buckets(tensors: list[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
    """``tensors`` in runs of one dtype and device of at most BUCKET_BYTES each
    (a larger tensor is a bucket of its own)."""
    groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault((tensor.dtype, tensor.device), []).append(tensor)
    for group in groups.values():
        bucket: list[torch.Tensor] = []
        size = 0
        for tensor in group:
            nbytes = tensor.numel() * tensor.element_size()
            if bucket and size + nbytes > BUCKET_BYTES:
                yield bucket
                bucket, size = [], 0
            bucket.append(tensor)
            size += nbytes
        if bucket:
            yield bucket


def _collective_in_buckets(
    tensors: list[torch.Tensor], start: Callable[[torch.Tensor], Any], what: str
) -> None:
    """Runs ``start(flat)`` (an asynchronous collective) on each bucket of
    ``tensors`` flattened, all buckets in flight at once, then copies the
    results back into the tensors."""
    pending = []
    for bucket in _buckets(tensors):
        flat = torch.cat([t.reshape(-1) for t in bucket])
        pending.append((bucket, flat, start(flat)))
    for bucket, flat, work in pending:
        wait_for(work, what)
        offset = 0
        for tensor in bucket:
            count = tensor.numel()
            tensor.copy_(flat[offset : offset + count].view_as(tensor))
            offset += count


class _Bucket:
    """Parameters whose gradients are all-reduced together, and where that stands."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.params = params
        self.ready: set[int] = set()  # id() of the parameters whose gradient is in
        self.flat: torch.Tensor | None = None  # the gradients in flight
        self.work: Any = None
        self.stale = False  # a gradient changed after the bucket left

    def launch(self) -> None:
        """Starts the asynchronous all-reduce of the gradients (zeros for a
        parameter without one on this rank)."""
        self.flat = torch.cat([
            (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
            for p in self.params
        ])
        self.work = dist.all_reduce(self.flat, async_op=True, group=group_for(self.flat))


# On each parameter averaged while the backward runs: a weak reference to its
# _OverlappedAverage.
_AVERAGER = "_fleetfeed_averager"


def _gradient_in(parameter: torch.Tensor) -> None:
    reference = getattr(parameter, _AVERAGER, None)
    averager = None if reference is None else reference()
    if averager is not None:
        averager.gradient_in(parameter)


class _OverlappedAverage:
    """Averages gradients while the backward runs, as DDP does: a hook on each
    parameter notes its gradient; a bucket whose gradients are all in starts its
    all-reduce at once, if every bucket before it has started (every rank must
    start them in one order). ``finish()``, at the end of the backward, starts
    the rest, agrees with the other ranks on which gradients exist and which
    buckets went stale, redoes those, and writes each mean into ``.grad``.

    At the end of the backward, not at the step: what runs between the two
    (gradient clipping, a GradScaler's unscale) must see the means, as in
    Paddle, whose all-reduce follows each gradient's op. Written at the step,
    the means replaced the clipped gradients. A second backward before the
    step (gradient accumulation) adds its gradients to the means and averages
    again: the means of the sums, as the mean is linear.
    """

    def __init__(self, params: list[torch.Tensor]) -> None:
        # Backward meets the last layers first: buckets in reverse order.
        order = list(reversed(params))
        self.buckets = [_Bucket(bucket) for bucket in _buckets(order)]
        self.params = [p for bucket in self.buckets for p in bucket.params]
        self.bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self.started = 0  # buckets[:started] are in flight
        self.pending = False  # gradients came in that finish() has not averaged
        self.finishes = 0  # finish() calls since the last step
        # The backward (autograd graph task) whose end will call finish(): a
        # backward that raised never ends, and must not keep the next one's.
        self._queued_task = -1
        for p in params:
            # The newest optimizer over a parameter owns it: the hooks of an
            # earlier one stay on the tensor but stand down (a collective that
            # only this rank started would hang the job).
            if not hasattr(p, _AVERAGER):
                p.register_post_accumulate_grad_hook(_gradient_in)
            setattr(p, _AVERAGER, weakref.ref(self))

    def gradient_in(self, parameter: torch.Tensor) -> None:
        self.pending = True
        task = torch._C._current_graph_task_id()
        if task != self._queued_task:
            self._queued_task = task
            # Runs when this backward is over (DDP's own way to finish its buckets).
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
        bucket = self.bucket_of[id(parameter)]
        if bucket.work is not None:
            bucket.stale = True
            return
        bucket.ready.add(id(parameter))
        while self.started < len(self.buckets):
            next_bucket = self.buckets[self.started]
            if len(next_bucket.ready) < len(next_bucket.params):
                break
            next_bucket.launch()
            self.started += 1

    def _backward_done(self) -> None:
        self._queued_task = -1
        self.finish(world_size())

    def finish(self, world: int, at_step: bool = False) -> None:
        """Averages the gradients. Every rank calls it in step: at the end of
        each backward, and (``at_step``) at a step after none, or after one
        whose end never came (it raised)."""
        self.pending = False
        # Which call this is since the step, and where: the same on every rank,
        # else their collectives pair off (a rank that skipped a backward).
        place = 2 * self.finishes + int(at_step)
        self.finishes += 1
        for bucket in self.buckets[self.started:]:
            bucket.launch()
        self.started = len(self.buckets)
        # One small all-reduce: how many ranks hold each gradient, whether any
        # rank's bucket went stale, and the places. It follows the buckets on
        # every rank.
        facts = torch.tensor(
            [float(p.grad is not None) for p in self.params]
            + [float(b.stale) for b in self.buckets] + [place, place * place],
            dtype=torch.float64,
        )
        wait_for(dist.all_reduce(facts, async_op=True, group=group_for(facts)),
                 "all-reduce of the gradients' presence")
        total, squares = facts[-2].item(), facts[-1].item()
        if squares * world != total * total:  # equal only when every place is
            which = "step" if at_step else f"backward {self.finishes}"
            self._abandon()  # the buckets paired off: their sums are no one's
            raise TrainerError(
                f"rank {dist.get_rank()}: the ranks ran different backwards since the last "
                f"step (this rank's is its {which}): "
                "every rank must run the same backwards between two steps, as under DDP "
                "(a rank with nothing to learn from a batch calls (loss * 0).backward())"
            )
        holders, stale = facts[: len(self.params)], facts[len(self.params):-2]
        index = 0
        with torch.no_grad():
            for bucket, went_stale in zip(self.buckets, stale.tolist(), strict=True):
                wait_for(bucket.work, "all-reduce of the gradients")
                if went_stale:
                    bucket.launch()  # the gradients as they are now
                    wait_for(bucket.work, "all-reduce of the accumulated gradients")
                assert bucket.flat is not None  # launched above
                bucket.flat.div_(world)
                offset = 0
                for p in bucket.params:
                    count = p.numel()
                    if holders[index] == 0:  # no rank has one: as without averaging
                        p.grad = None
                    elif p.grad is None:
                        p.grad = bucket.flat[offset : offset + count].view_as(p).clone()
                    else:
                        p.grad.copy_(bucket.flat[offset : offset + count].view_as(p))
                    offset += count
                    index += 1
                bucket.ready.clear()
                bucket.flat, bucket.work, bucket.stale = None, None, False
        self.started = 0

    def _abandon(self) -> None:
        """Waits for the buckets in flight (every rank launched as many) and
        forgets them: a caught error must not leave their sums for the next
        step to copy into ``.grad``."""
        for bucket in self.buckets:
            if bucket.work is not None:
                wait_for(bucket.work, "all-reduce of the gradients")
            bucket.ready.clear()
            bucket.flat, bucket.work, bucket.stale = None, None, False
        # Every rank is here together: they count again from this point.
        self.started, self.finishes, self.pending = 0, 0, False


def group_for(tensor: torch.Tensor) -> Any:
    """The group that carries ``tensor``: the default one, or in an NCCL job
    (which carries GPU tensors only) a gloo group of every rank for a CPU
    tensor (``host_group``; made by the first such call, on every rank)."""
    if tensor.is_cuda or dist.get_backend() != "nccl":
        return None
    return host_group(dist, None)


def _gathered(mine: torch.Tensor, what: str) -> list[torch.Tensor]:
    """Every rank's ``mine`` (a small tensor of one shape on every rank), in rank order."""
    everyone = [torch.zeros_like(mine) for _ in range(world_size())]
    wait_for(dist.all_gather(everyone, mine, async_op=True, group=group_for(mine)), what)
    return everyone


def check_even_batches(batches: int) -> None:
    """Refuses a collective training pass whose ranks hold different numbers
    of batches (one all-gather, before any step). A rank out of batches stops
    stepping while the others go on: under DDP's join its optimizer misses
    their steps (momentum or Adam then differ between the ranks for good),
    and without DDP its next collective meets another rank's gradients.

    Raises:
        TrainerError: the counts differ, naming each rank's.
    """
    if not dist.is_initialized() or world_size() <= 1:
        return
    counts = _gathered(torch.tensor([batches]), "all_gather of the batch counts")
    found = [int(c.item()) for c in counts]
    if len(set(found)) > 1:
        per_rank = ", ".join(f"rank {r}: {c}" for r, c in enumerate(found))
        raise TrainerError(
            f"rank {dist.get_rank()}: the ranks hold different numbers of batches this pass "
            f"({per_rank}); in collective training a rank out of batches stops stepping "
            "while the others go on, and their models part. Set "
            "dataset.update_settings(equal_batches=True): every rank then trains the "
            "fewest batches any rank has (the records left out are logged)"
        )


def _check_same_tensors(tensors: list[torch.Tensor]) -> None:
    """Refuses to broadcast into tensors that differ from rank 0's (their
    count, shapes or dtypes: a module alive on one rank only): the bytes
    would land in the wrong tensors. One all-gather of a digest."""
    digest = hashlib.sha256(
        repr([(tuple(t.shape), str(t.dtype)) for t in tensors]).encode()
    ).digest()[:8]
    everyone = _gathered(
        torch.tensor([len(tensors), int.from_bytes(digest, "little", signed=True)]),
        "all_gather of the parameters' shapes",
    )
    if any(not torch.equal(other, everyone[0]) for other in everyone):
        counts = ", ".join(f"rank {r}: {int(t[0])}" for r, t in enumerate(everyone))
        raise TrainerError(
            f"rank {dist.get_rank()}: the ranks' models differ in their parameters and "
            f"buffers (counts {counts}, or their shapes and dtypes): every rank must build "
            "the same model before fleet.distributed_optimizer"
        )


def _models_in_order(params: list[torch.Tensor], model: nn.Module | None) -> list[nn.Module]:
    """The models an optimizer over ``params`` trains (those holding them,
    found among the garbage collector's objects, and ``model``), in the order
    of their parameters in the optimizer: the same on every rank."""
    found = {id(m): m for m in tables.models_holding(params)} if params else {}
    if model is not None:
        found.setdefault(id(model), model)
    position = {id(p): i for i, p in enumerate(params)}

    def place(held: nn.Module) -> list[int]:  # ties (a shared part) broken by the rest
        return sorted(position[id(p)] for p in held.parameters() if id(p) in position)

    return sorted(found.values(), key=place)


def _refuse_sparse_tables(models: list[nn.Module]) -> None:
    """Refuses an optimizer over ``models`` when they hold SparseEmbedding
    tables: their rows live in a parameter-server job's tables (or local
    mode's), and nothing in a collective job pushes their gradients, so they
    would never train, without a word. Paddle's sparse embedding is
    parameter-server only too. Another live table (an embedding kept beside
    the dense network) is warned of.

    Raises:
        TrainerError: the models hold SparseEmbedding modules.
    """
    live = tables.table_configs()
    if not live:
        return
    names = sorted({name for held in models for name in tables.model_tables(held)})
    if not names:
        logger.warning(
            "SparseEmbedding tables %s are alive in a collective job: nothing here trains "
            "their rows (a parameter-server job does)", sorted(live),
        )
        return
    raise TrainerError(
        f"fleet.distributed_optimizer in a collective job: the model holds "
        f"SparseEmbedding tables {names}, which only a parameter-server job (or a "
        "local one) trains; here their rows would never change. Start the job with "
        "parameter servers (fleetrun --server_num=N --worker_num=M), or use "
        "torch.nn.Embedding / EmbeddingBag in a collective job"
    )


class CollectiveOptimizer:
    """A torch optimizer whose ``step()`` first averages the gradients of the
    replicated parameters over every rank, as Paddle's collective
    ``distributed_optimizer`` does (``model``: the model it trains, beside the
    modules holding its parameters). Made, it gives every replicated parameter
    rank 0's value: the ranks start from one state.

    The gradients of parameters outside a ``distributed_model`` are all-reduced
    in buckets while the backward runs, their means in ``.grad`` when it ends
    (``_OverlappedAverage``): every rank must run the same backwards between
    two steps, as under DDP; a step after none (gradients set by hand, or by
    ``torch.autograd.grad``) averages them then. Those of a
    ``distributed_model`` whose forward did not run through DDP are averaged at
    the step. Everything else (``param_groups``, ``state_dict()``,
    ``zero_grad()``, lr schedulers) is the wrapped optimizer's.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, model: Any = None) -> None:
        self.optimizer = optimizer
        # Each DDP module's forward count at the last step (by id(module)).
        self._forwards_at_last_step: dict[int, int] = {}
        self._overlapped: _OverlappedAverage | None = None
        models = _models_in_order(
            list(self._parameters()), model if isinstance(model, nn.Module) else None
        )
        _refuse_sparse_tables(models)
        if dist.is_initialized() and world_size() > 1:
            scale_shard_gradients(self._parameters())
            self._start_equal(models)
            self._average_outside_ddp()

    def _average_outside_ddp(self) -> None:
        """Averages, while the backward runs, the gradients of the replicated
        parameters that no ``distributed_model`` synchronises."""
        outside_ddp = [p for p in self._replicated() if p.requires_grad and _ddp_of(p) is None]
        self._overlapped = _OverlappedAverage(outside_ddp) if outside_ddp else None

    def _parameters(self) -> Iterable[torch.Tensor]:
        for group in self.optimizer.param_groups:
            yield from group["params"]

    def _replicated(self) -> list[torch.Tensor]:
        return [p for p in self._parameters() if not is_distributed(p)]

    def _start_equal(self, models: list[nn.Module]) -> None:
        """Every replicated parameter takes rank 0's value: ranks that
        initialised their models differently still train one model. So do the
        rest of the models holding them, as Paddle's startup program
        broadcasts every parameter: frozen layers (an optimizer given only the
        trainable parameters) and buffers (a BatchNorm's statistics), which
        would otherwise make each rank's replica another function."""
        params = [p for p in self._replicated() if _ddp_of(p) is None]  # DDP broadcast its own
        tensors = {id(p): p for p in params}
        for model in models:
            for _, tensor in (*model.named_parameters(), *model.named_buffers()):
                if not is_distributed(tensor) and _ddp_of(tensor) is None:
                    tensors.setdefault(id(tensor), tensor)
        ordered = list(tensors.values())
        _check_same_tensors(ordered)
        # As bytes where it can: a broadcast copies bits, and gloo has no
        # int16, uint32 or float8 of its own.
        views = [t.detach().reshape(-1).view(torch.uint8) if t.is_contiguous() else t
                 for t in ordered]
        with torch.no_grad():
            _collective_in_buckets(
                views,
                lambda flat: dist.broadcast(flat, src=0, async_op=True, group=group_for(flat)),
                "broadcast of the replicated parameters and buffers from rank 0",
            )

    def average_gradients(self) -> None:
        """Replaces each replicated parameter's gradient by its mean over the
        ranks (a rank without one contributes zeros; a parameter no rank has a
        gradient for keeps none)."""
        world = world_size()
        if self._overlapped is not None:
            # Once per step on every rank at least: averaged at the end of each
            # backward, or here when no backward made the gradients.
            if self._overlapped.pending or not self._overlapped.finishes:
                self._overlapped.finish(world, at_step=True)
            self._overlapped.finishes = 0
            # Paddle's programs wrap the optimizer first, the model after: from
            # the next step DDP alone averages what it synchronises.
            if any(_ddp_of(p) is not None for p in self._overlapped.params):
                self._average_outside_ddp()
        synchronized = self._ddp_forwarded_since_last_step()
        behind_ddp = [
            p for p in self._replicated()
            if p.requires_grad
            and (module := _ddp_of(p)) is not None and id(module) not in synchronized
        ]
        if not behind_ddp:
            return
        grads = []
        for p in behind_ddp:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        with torch.no_grad():
            _collective_in_buckets(
                grads,
                lambda flat: dist.all_reduce(flat, async_op=True, group=group_for(flat)),
                "all-reduce of the gradients",
            )
            for grad in grads:
                grad.div_(world)

    def _ddp_forwarded_since_last_step(self) -> set[int]:
        """The ids of the DDP modules whose forward ran since the last step (so
        their parameters' gradients are averaged already)."""
        modules = {id(m): m for m in map(_ddp_of, self._replicated()) if m is not None}
        ran = set()
        for key, module in modules.items():
            count = getattr(module, _FORWARDS, 0)
            if count != self._forwards_at_last_step.get(key):
                ran.add(key)
            self._forwards_at_last_step[key] = count
        return ran

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Averages the gradients, then the wrapped optimizer's step."""
        loss = closure() if closure is not None else None
        if dist.is_initialized() and world_size() > 1:
            self.average_gradients()
        self.optimizer.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def clear_grad(self) -> None:
        """Paddle's spelling of ``zero_grad``."""
        self.optimizer.zero_grad()

    def minimize(self, loss: torch.Tensor) -> None:
        """Paddle's spelling: backward, then the averaged step, then zero_grad."""
        loss.backward()
        self.step()
        self.zero_grad()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)

    def __repr__(self) -> str:
        return f"CollectiveOptimizer({self.optimizer!r})"
