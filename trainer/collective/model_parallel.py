"""Model-parallel pieces with autograd, over the process group of ``process_group``.

Each collective's backward is its exact adjoint, so one rule covers every way a
model splits its work. Whatever each rank computes, the ranks' backwards
together give the gradient of the *sum* of their losses with respect to every
rank's tensors:

- ``all_gather`` concatenates every rank's tensor; its backward sums the
  gradients of the concatenation over the ranks and hands each rank its own
  slice (a reduce-scatter: Paddle's ``c_allgather`` gradient);
- ``split`` keeps this rank's slice; its backward puts the gradient back in
  that slice, zeros elsewhere;
- ``all_reduce`` sums over the ranks; its backward sums the gradients too.

Training minimises the *mean* of the ranks' losses, as data parallelism does:
the replicated parameters' gradients are averaged over the ranks, and each
shard's gradient is divided by the number of ranks (``data_parallel``: by
``fleet.distributed_optimizer`` or ``fleet.distributed_model``, which every
collective program calls). The two ways of using model parallelism then train
the model they mean without further care:

- Paddle's model-parallel AlexNet: every rank has its own batch; a layer
  all-gathers its input over the ranks, applies its slice of the weight, and
  all-gathers the output slices (``all_gather(x, dim=0)`` then
  ``all_gather(out, dim=1)``). The gradients equal one process's on the
  concatenated batch.
- Megatron-LM and ``paddle.distributed.split`` (``ColumnParallelLinear``,
  ``RowParallelLinear``): every rank has the *same* input; the gradients equal
  one process's on that input.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from . import process_group
from .data_parallel import shard_gradients_scaled
from .process_group import wait_for, world_size

__all__ = [
    "ColumnParallelLinear",
    "RowParallelLinear",
    "all_gather",
    "all_reduce",
    "split",
]


def _gather(x: torch.Tensor, dim: int) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(world_size())]
    wait_for(dist.all_gather(parts, x.contiguous(), async_op=True), "all_gather")
    return torch.cat(parts, dim=dim)


def _sum_over_ranks(x: torch.Tensor) -> torch.Tensor:
    result = x.clone()
    wait_for(dist.all_reduce(result, async_op=True), "all_reduce")
    return result


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
        # A reduce-scatter; gloo has none, and an all-reduce of the whole
        # gradient costs one extra copy at the sizes model parallelism splits.
        return _own_slice(_sum_over_ranks(grad), ctx.dim), None


class _Split(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int) -> torch.Tensor:
        ctx.dim, ctx.shape = dim, x.shape
        return _own_slice(x, dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        full = grad.new_zeros(ctx.shape)
        full.chunk(world_size(), dim=ctx.dim)[process_group.rank()].copy_(grad)
        return full, None


class _AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return _sum_over_ranks(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return _sum_over_ranks(grad)


def all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenates every rank's ``x`` along ``dim`` (rank order), with autograd:
    each rank gets back its own slice of the gradient summed over the ranks."""
    if not dist.is_initialized() or world_size() == 1:
        return x
    return _AllGather.apply(x, dim % x.dim())


def split(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """This rank's slice of ``x`` along ``dim``; the gradient lands in that slice."""
    if not dist.is_initialized() or world_size() == 1:
        return x
    return _Split.apply(x, dim % x.dim())


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """The sum of ``x`` over ranks; the gradient is summed over the ranks too."""
    if not dist.is_initialized() or world_size() == 1:
        return x
    return _AllReduce.apply(x)


def _warn_if_unsynchronized(layer: nn.Module) -> None:
    """Warns once per layer that trains while nothing averages the gradients:
    its shard's gradient would be the sum over the ranks, and the replicated
    parameters before it would drift apart."""
    if (
        layer.training and torch.is_grad_enabled() and dist.is_initialized()
        and world_size() > 1 and not shard_gradients_scaled(layer.weight)
        and not getattr(layer, "_warned_unsynchronized", False)
    ):
        layer._warned_unsynchronized = True
        warnings.warn(
            f"rank {process_group.rank()}: {type(layer).__name__} is training but no "
            "fleet.distributed_optimizer or fleet.distributed_model holds its parameters: "
            "the ranks' gradients are not averaged, so they train different models. Wrap "
            "the optimizer with fleet.distributed_optimizer(optimizer) before the first step.",
            RuntimeWarning, stacklevel=3,
        )


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
        _warn_if_unsynchronized(self)
        out = nn.functional.linear(x, self.weight, self.bias)
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
        _warn_if_unsynchronized(self)
        if not self.input_is_parallel:
            x = split(x, dim=-1)
        out = all_reduce(nn.functional.linear(x, self.weight))
        return out + self.bias if self.bias is not None else out
