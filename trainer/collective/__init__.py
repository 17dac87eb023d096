"""Collective training on ``torch.distributed``.

In: ``fleet.init(is_collective=True)`` under ``fleetrun --nproc_per_node=N`` or
torchrun. Out: a process group with timeouts (``process_group``); an optimizer
whose step averages the replicated parameters' gradients, and DDP that leaves
model-parallel shards alone (``data_parallel``); and the model-parallel layers
whose weights are split across the ranks (``model_parallel``), which a user's
model imports from here.
"""

from .model_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    all_gather,
    all_reduce,
    split,
)

__all__ = [
    "ColumnParallelLinear",
    "RowParallelLinear",
    "all_gather",
    "all_reduce",
    "split",
]
