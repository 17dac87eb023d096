"""Collective mode on ``torch.distributed``: process group, DDP and model-parallel pieces.

gloo on CPU, NCCL when CUDA is present. Every blocking call has a timeout and an
error that names this rank (and, where torch says, the ranks that did not answer).

Model parallelism follows Megatron-LM and Paddle's ``paddle.distributed.split``:
the ranks of the group hold the *same* input and compute the *same* loss; a layer's
weight is split across them. ``all_gather`` concatenates each rank's slice in the
forward and hands each rank back its own slice of the gradient (Paddle's
``c_concat`` / ``c_split`` pair); ``split`` is the reverse; ``all_reduce`` sums
partial results forward and passes the gradient through; ``copy_to_parallel``
passes its input through and sums its gradient (Paddle's ``c_identity``). ``ColumnParallelLinear``
and ``RowParallelLinear`` are built from them.
"""

from __future__ import annotations

import atexit
import datetime
import gc
import logging
import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .job import bind, hosts
from .job.errors import WorkerFailedError
from .job.keys import require_key_or_insecure

__all__ = [
    "ColumnParallelLinear",
    "RowParallelLinear",
    "all_gather",
    "all_reduce",
    "barrier",
    "copy_to_parallel",
    "destroy",
    "distributed_model",
    "init_collective",
    "split",
]

logger = logging.getLogger("trainer.collective")

DEFAULT_TIMEOUT = 300.0
_timeout = datetime.timedelta(seconds=DEFAULT_TIMEOUT)
# The group's store, held here: a store written in Python (KeyedStore) is only
# reachable from torch's C++ side while its Python object lives.
_store: dist.Store | None = None


def init_collective(
    rank: int,
    world_size: int,
    master_endpoint: str,
    timeout: float = DEFAULT_TIMEOUT,
    local_rank: int = 0,
    backend: str | None = None,
    job_key: str | None = None,
) -> str:
    """Joins (or creates, on rank 0) the job's default process group.

    Args:
        rank, world_size: this process's rank and the number of processes.
        master_endpoint: ``host:port`` of the rendezvous store (rank 0 listens).
        timeout: seconds for the rendezvous and for every later collective.
        local_rank: the GPU this process uses (NCCL only).
        backend: ``"gloo"`` or ``"nccl"``; default NCCL when CUDA is available,
            else gloo.
        job_key: the job's key: the rendezvous store then hides and signs the
            job's entries (``trainer.job.bind.KeyedStore``). Without one, a
            group across hosts needs ``FLEETFEED_INSECURE=1``.

    Returns:
        The backend used.

    Raises:
        WorkerFailedError: the group did not form within ``timeout`` (naming
            this rank and the endpoint).
    """
    global _timeout, _store
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank % max(torch.cuda.device_count(), 1))
    if dist.is_initialized():
        dist.destroy_process_group()
    _timeout = datetime.timedelta(seconds=timeout)
    host, _, port = master_endpoint.rpartition(":")
    require_key_or_insecure(job_key, [master_endpoint], f"rank {rank}'s process group")
    # gloo listens on GLOO_SOCKET_IFNAME's address, else on whatever the hostname
    # resolves to: pin the interface this machine reaches the rendezvous through
    # (its own address on the job's network; lo for 127.x).
    if backend == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ:
        interface = hosts.interface_toward(host)
        if interface:
            os.environ["GLOO_SOCKET_IFNAME"] = interface
    try:
        # The store listens on its host only, and holds the job's entries keyed.
        store = bind.rendezvous_store(host, int(port), rank, world_size, _timeout, job_key)
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size, timeout=_timeout
        )
        _store = store
        atexit.register(_leave_at_exit)  # once per group; a no-op after destroy()
    except Exception as error:  # torch raises several types (DistStoreError, RuntimeError)
        raise WorkerFailedError(
            f"rank {rank} of {world_size}: the process group at {master_endpoint} did "
            f"not form within {timeout:g}s ({type(error).__name__}: {error})",
            rank=rank,
        ) from error
    logger.info("rank %d/%d joined the %s group at %s", rank, world_size, backend, master_endpoint)
    return backend


def destroy(wait_for_peers: bool = True) -> None:
    """Leaves the process group (no-op when there is none).

    Args:
        wait_for_peers: first wait (bounded by the group's timeout) until every
            rank leaves too: rank 0 hosts the rendezvous store, and a rank that
            tears it down while the others still use it makes them (or itself,
            at exit) abort.
    """
    global _store
    if not dist.is_initialized():
        return
    try:
        if wait_for_peers:
            barrier()
    finally:
        dist.destroy_process_group()
        _store = None
        # Free finished work objects and dead wrappers now: gloo objects that
        # outlive the interpreter's finalization abort the process at exit.
        gc.collect()


def _leave_at_exit() -> None:
    """A group still formed when the interpreter exits (the script never called
    ``destroy``/``stop_worker``) is destroyed first, without waiting for peers:
    left to interpreter shutdown, gloo's and the store's threads can abort the
    process ("terminate called without an active exception")."""
    if dist.is_initialized():
        try:
            destroy(wait_for_peers=False)
        except Exception as error:  # noqa: BLE001 - exiting anyway; say why, do not mask
            logger.debug("destroying the process group at exit failed: %s", error)


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _wait(work: Any, what: str) -> None:
    try:
        work.wait(_timeout)
    except Exception as error:
        raise WorkerFailedError(
            f"rank {_rank()}: {what} failed (timeout {_timeout.total_seconds():g}s): a "
            f"peer failed or stopped answering ({type(error).__name__}: {error})",
            rank=_rank(),
        ) from error


def barrier() -> None:
    """Waits for every rank; on gloo, the error names the ranks that did not arrive."""
    if not dist.is_initialized():
        return
    if dist.get_backend() == "gloo":
        try:
            dist.monitored_barrier(timeout=_timeout, wait_all_ranks=True)
        except Exception as error:
            raise WorkerFailedError(
                f"rank {_rank()}: barrier failed within {_timeout.total_seconds():g}s: "
                f"{error}",
                rank=_rank(),
            ) from error
    else:
        _wait(dist.barrier(async_op=True), "barrier")


def distributed_model(model: nn.Module, find_unused_parameters: bool = False) -> nn.Module:
    """``DistributedDataParallel(model)`` on this rank's device; the model itself
    without a process group (the local fallback)."""
    if not dist.is_initialized():
        return model
    if dist.get_backend() == "nccl":
        device = torch.cuda.current_device()
        model = model.to(device)
        return nn.parallel.DistributedDataParallel(
            model, device_ids=[device], find_unused_parameters=find_unused_parameters
        )
    return nn.parallel.DistributedDataParallel(
        model, find_unused_parameters=find_unused_parameters
    )


def all_reduce_tensor(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Reduces a copy of ``tensor`` over all ranks (no autograd): sum, max, min or mean."""
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    if op not in ops and op != "mean":
        raise ValueError(f"mode must be one of sum, mean, max, min; got {op!r}")
    result = tensor.detach().clone()
    if not dist.is_initialized():
        return result
    _wait(dist.all_reduce(result, ops.get(op, dist.ReduceOp.SUM), async_op=True), "all_reduce")
    if op == "mean":
        result = result / _world()
    return result


def all_gather_bytes(data: bytes) -> list[bytes]:
    """Every rank's ``data``, in rank order (plain bytes: nothing is unpickled)."""
    if not dist.is_initialized():
        return [data]
    size = torch.tensor([len(data)], dtype=torch.int64)
    sizes = [torch.zeros_like(size) for _ in range(_world())]
    _wait(dist.all_gather(sizes, size, async_op=True), "all_gather of sizes")
    longest = max(int(s.item()) for s in sizes)
    mine = torch.zeros(longest, dtype=torch.uint8)
    mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else mine[:0]
    parts = [torch.empty_like(mine) for _ in range(_world())]
    _wait(dist.all_gather(parts, mine, async_op=True), "all_gather of bytes")
    return [bytes(part[: int(s.item())].numpy()) for part, s in zip(parts, sizes, strict=True)]


# -- model-parallel pieces with autograd ------------------------------------------


def _gather(x: torch.Tensor, dim: int) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(_world())]
    _wait(dist.all_gather(parts, x.contiguous(), async_op=True), "all_gather")
    return torch.cat(parts, dim=dim)


def _own_slice(x: torch.Tensor, dim: int) -> torch.Tensor:
    world = _world()
    if x.shape[dim] % world:
        raise ValueError(
            f"rank {_rank()}: dimension {dim} of size {x.shape[dim]} does not split "
            f"evenly over {world} ranks"
        )
    return x.chunk(world, dim=dim)[_rank()].contiguous()


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int) -> torch.Tensor:
        ctx.dim = dim
        return _gather(x, dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _own_slice(grad, ctx.dim), None


class _Split(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int) -> torch.Tensor:
        ctx.dim = dim
        return _own_slice(x, dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _gather(grad, ctx.dim), None


class _AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        result = x.clone()
        _wait(dist.all_reduce(result, async_op=True), "all_reduce")
        return result

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


class _Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        result = grad.clone()
        _wait(dist.all_reduce(result, async_op=True), "all_reduce")
        return result


def copy_to_parallel(x: torch.Tensor) -> torch.Tensor:
    """``x`` unchanged; its gradient is summed over ranks (the input of a layer
    whose weight is split by output features contributes to every slice)."""
    if not dist.is_initialized() or _world() == 1:
        return x
    return _Copy.apply(x)


def all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenates every rank's ``x`` along ``dim`` (rank order), with autograd:
    each rank gets back its own slice of the gradient."""
    if not dist.is_initialized() or _world() == 1:
        return x
    return _AllGather.apply(x, dim % x.dim())


def split(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """This rank's slice of ``x`` along ``dim``; the gradient is all-gathered."""
    if not dist.is_initialized() or _world() == 1:
        return x
    return _Split.apply(x, dim % x.dim())


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """The sum of ``x`` over ranks; the gradient passes through unchanged."""
    if not dist.is_initialized() or _world() == 1:
        return x
    return _AllReduce.apply(x)


class ColumnParallelLinear(nn.Module):
    """``nn.Linear(in_features, out_features)`` with the output features split
    across ranks (Paddle's ``split(..., axis=1)``).

    Args:
        gather_output: all-gather the slices so every rank sees the full output;
            False leaves each rank with its slice (to feed a ``RowParallelLinear``).
        seed: initialises the *full* weight identically on every rank, then keeps
            this rank's rows, so the layer equals one ``nn.Linear`` made with the
            same seed.
    """

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True,
        gather_output: bool = True, seed: int = 0,
    ) -> None:
        super().__init__()
        world, rank = _world(), _rank()
        if out_features % world:
            raise ValueError(
                f"out_features={out_features} does not split evenly over {world} ranks"
            )
        full = nn.Linear(in_features, out_features, bias=bias)
        with torch.no_grad():
            generator = torch.Generator().manual_seed(seed)
            bound = 1.0 / in_features**0.5
            full.weight.uniform_(-bound, bound, generator=generator)
            if bias:
                full.bias.uniform_(-bound, bound, generator=generator)
        part = out_features // world
        self.weight = nn.Parameter(full.weight[rank * part : (rank + 1) * part].clone())
        self.bias = (
            nn.Parameter(full.bias[rank * part : (rank + 1) * part].clone()) if bias else None
        )
        self.gather_output = gather_output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = nn.functional.linear(copy_to_parallel(x), self.weight, self.bias)
        return all_gather(out, dim=-1) if self.gather_output else out


class RowParallelLinear(nn.Module):
    """``nn.Linear(in_features, out_features)`` with the input features split
    across ranks (Paddle's ``split(..., axis=0)``): partial products are summed
    with an all-reduce.

    Args:
        input_is_parallel: the input is already this rank's slice (the output of
            a ``ColumnParallelLinear(gather_output=False)``); otherwise it is split.
        seed: as for ``ColumnParallelLinear``.
    """

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True,
        input_is_parallel: bool = False, seed: int = 0,
    ) -> None:
        super().__init__()
        world, rank = _world(), _rank()
        if in_features % world:
            raise ValueError(
                f"in_features={in_features} does not split evenly over {world} ranks"
            )
        generator = torch.Generator().manual_seed(seed)
        bound = 1.0 / in_features**0.5
        weight = torch.empty(out_features, in_features).uniform_(-bound, bound, generator=generator)
        part = in_features // world
        self.weight = nn.Parameter(weight[:, rank * part : (rank + 1) * part].clone())
        # The bias is added once, after the sum, and is the same on every rank.
        self.bias = (
            nn.Parameter(torch.empty(out_features).uniform_(-bound, bound, generator=generator))
            if bias else None
        )
        self.input_is_parallel = input_is_parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = split(x, dim=-1)
        out = all_reduce(nn.functional.linear(x, self.weight))
        return out + self.bias if self.bias is not None else out
