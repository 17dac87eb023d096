"""Model-parallel pieces with autograd, over the process group of ``process_group``.

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

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from . import process_group
from .process_group import wait_for, world_size

__all__ = [
    "ColumnParallelLinear",
    "RowParallelLinear",
    "all_gather",
    "all_reduce",
    "copy_to_parallel",
    "split",
]


def _gather(x: torch.Tensor, dim: int) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(world_size())]
    wait_for(dist.all_gather(parts, x.contiguous(), async_op=True), "all_gather")
    return torch.cat(parts, dim=dim)


def _own_slice(x: torch.Tensor, dim: int) -> torch.Tensor:
    world = world_size()
    if x.shape[dim] % world:
        raise ValueError(
            f"rank {process_group.rank()}: dimension {dim} of size {x.shape[dim]} does not split "
            f"evenly over {world} ranks"
        )
    return x.chunk(world, dim=dim)[process_group.rank()].contiguous()


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
        wait_for(dist.all_reduce(result, async_op=True), "all_reduce")
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
        wait_for(dist.all_reduce(result, async_op=True), "all_reduce")
        return result


def copy_to_parallel(x: torch.Tensor) -> torch.Tensor:
    """``x`` unchanged; its gradient is summed over ranks (the input of a layer
    whose weight is split by output features contributes to every slice)."""
    if not dist.is_initialized() or world_size() == 1:
        return x
    return _Copy.apply(x)


def all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenates every rank's ``x`` along ``dim`` (rank order), with autograd:
    each rank gets back its own slice of the gradient."""
    if not dist.is_initialized() or world_size() == 1:
        return x
    return _AllGather.apply(x, dim % x.dim())


def split(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """This rank's slice of ``x`` along ``dim``; the gradient is all-gathered."""
    if not dist.is_initialized() or world_size() == 1:
        return x
    return _Split.apply(x, dim % x.dim())


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """The sum of ``x`` over ranks; the gradient passes through unchanged."""
    if not dist.is_initialized() or world_size() == 1:
        return x
    return _AllReduce.apply(x)


def _mark_shards(*parameters: nn.Parameter | None) -> None:
    """Marks each parameter as this rank's slice of a split weight (Paddle's
    ``is_distributed=True``): data parallelism neither broadcasts nor averages
    it (trainer/collective/data_parallel.py)."""
    for parameter in parameters:
        if parameter is not None:
            parameter.is_distributed = True


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
        world, rank = world_size(), process_group.rank()
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
        _mark_shards(self.weight, self.bias)
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
        world, rank = world_size(), process_group.rank()
        if in_features % world:
            raise ValueError(
                f"in_features={in_features} does not split evenly over {world} ranks"
            )
        generator = torch.Generator().manual_seed(seed)
        bound = 1.0 / in_features**0.5
        weight = torch.empty(out_features, in_features).uniform_(-bound, bound, generator=generator)
        part = in_features // world
        self.weight = nn.Parameter(weight[:, rank * part : (rank + 1) * part].clone())
        _mark_shards(self.weight)
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
