"""Hogwild training steps: each trainer thread updates the shared parameters itself.

``train_from_dataset(thread=N)`` with N > 1 runs N threads whose forward,
backward and update overlap, as Paddle's ``HogwildWorker`` threads do on one
scope. Two things stop torch's own loop (``backward()`` then
``optimizer.step()``) from doing that:

* a parameter has one ``.grad``: concurrent ``backward()`` calls would mix
  their gradients. Each thread takes its gradients with ``torch.autograd.grad``
  instead, which returns them to the caller;
* ``optimizer.step()`` updates each parameter in place, which bumps its
  autograd version counter: another thread's backward that saved the parameter
  then refuses to run. The update here writes through ``parameter.data``, a
  view of the same storage with its own counter, so a backward in flight reads
  the newest values (what Hogwild means) and does not fail. Several threads
  calling one torch optimizer's ``step()`` at once would also race on its
  per-call bookkeeping.

``DenseUpdate`` (trainer/loop/dense_update.py) therefore applies one thread's
gradients to the shared parameters with the update rule of the wrapped
optimizer, reading and writing the optimizer's own state (Adagrad's sums,
Adam's moments) in place and without a lock, as Paddle's CPU threads update
their shared accumulators. The arithmetic is that of torch's single-tensor
implementations, so one thread alone gets torch's values. Supported: ``SGD``
(momentum, dampening, Nesterov, weight decay), ``Adagrad``, ``Adam`` and
``AdamW`` (amsgrad, weight decay), each with ``maximize``; not their ``fused``
or ``differentiable`` variants.

Without a lock, two trainers' updates of one element may overwrite each
other. That is Hogwild's bet where a step writes few of a parameter's
elements, and a lost bet where every trainer rewrites a large dense embedding
table at each step: ``collision_warning`` tells the user of such a table, and
of the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..embedding import pending, stores
from .dense_update import SUPPORTED_OPTIMIZERS, DenseUpdate, unsupported_reason

__all__ = [
    "COLLIDING_TABLE_ELEMENTS", "SUPPORTED_OPTIMIZERS", "HogwildStep", "collision_warning",
    "unsupported_reason",
]

# A dense embedding table (``nn.Embedding``/``nn.EmbeddingBag``, dense
# gradients) of at least this many elements makes Hogwild trainers lose
# accuracy. Each trainer's update sweeps the whole table at every step, rows
# its batch did not hold included, and two sweeps that meet lose writes of
# one. A rarely seen row that loses its Adam second moment but keeps its first
# then steps by about lr * m / eps: after 2 Hogwild processes trained
# examples/mlp_local's table, 2,900 rows had a norm above 1 (largest value
# 326), none after one trainer. Measured on that model (nn.EmbeddingBag(buckets,
# 8), Adam lr 0.003, 75,000 records, 2 epochs), held-out AUC of 2 Hogwild
# processes minus one trainer's, mean of 4 seeds: 8,000 elements -0.0003,
# 24,000 -0.0015, 80,000 -0.0055, 240,000 -0.0061 (2 seeds), 800,024 -0.0077
# (3 seeds); the same model with the table a SparseEmbedding +0.0003 and
# -0.0008, and the small CTR model (SparseEmbedding tables, dense layers of at
# most 256 elements, benchmarks/bench_hogwild.py) -0.0004 to +0.0019 in 9 runs.
# 2**14 lies between the sizes that lost nothing and those that lost. Dense
# layers are left out: a batch's gradient reaches all their elements (none is
# rarely seen), and none was measured to lose.
COLLIDING_TABLE_ELEMENTS = 2**14


class HogwildStep:
    """What a Hogwild thread runs after its forward: its gradients, then its updates.

    Args:
        optimizer: a supported torch optimizer (dense parameters only, as its
            own ``step()``), or the ``DistributedOptimizer`` of the
            parameter-server runtime's local mode: each thread then also trains
            the in-process sparse tables with the rows it pulled itself.

    Raises:
        ValueError: another optimizer, a distributed mode (its step sends to
            servers and replaces parameters in place), or an unsupported option.
    """

    def __init__(self, optimizer: Any) -> None:
        if isinstance(optimizer, torch.optim.Optimizer):
            torch_optimizer, self.push_sparse = optimizer, False
        else:
            mode = getattr(optimizer, "mode_name", None)
            if mode is None:
                raise ValueError(
                    f"cannot train Hogwild threads: {type(optimizer).__name__} is not "
                    "a torch optimizer nor fleet.distributed_optimizer's"
                )
            if mode != "local":
                raise ValueError(
                    f"cannot train Hogwild threads: the parameter-server {mode!r} "
                    "mode's step sends to the servers and writes their values into "
                    "the parameters"
                )
            torch_optimizer, self.push_sparse = optimizer.optimizer, True
        try:
            self.update = DenseUpdate(torch_optimizer)
        except ValueError as error:
            raise ValueError(f"cannot train Hogwild threads: {error}") from None
        self.params = self.update.params

    def gradients(self, loss: torch.Tensor) -> list[torch.Tensor | None]:
        """This thread's gradients of ``loss``: the dense parameters' (None where
        unused or frozen), then its pending sparse rows' (see ``apply``)."""
        rows: list[torch.Tensor] = []
        if self.push_sparse:
            rows = pending.pending_rows()
        wanted = [p for p in self.params if p.requires_grad] + rows
        found = iter(torch.autograd.grad(loss, wanted, allow_unused=True))
        dense = [next(found) if p.requires_grad else None for p in self.params]
        return dense + list(found)

    def apply(self, grads: Sequence[torch.Tensor | None]) -> None:
        """Updates the shared dense parameters with ``gradients``' result, and
        pushes the sparse rows' gradients to the local tables."""
        count = len(self.params)
        self.update.apply(grads[:count])
        if self.push_sparse:
            for rows, grad in zip(pending.pending_rows(), grads[count:], strict=True):
                rows.grad = grad
            stores.local_store().push_pending()


def sparse_gradient_reason(model: Any, update: DenseUpdate) -> str | None:
    """Why the lock-free update cannot train ``model``: its embeddings with
    ``sparse=True`` make sparse gradients, which only plain SGD (no momentum,
    no weight decay) applies lock-free; None when nothing stands in the way."""
    if not isinstance(model, torch.nn.Module):
        return None
    trained = {id(p) for p in update.params if p.requires_grad}
    names = [
        f"'{name}' ({type(module).__name__})"
        for name, module in model.named_modules()
        if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag))
        and module.sparse and id(module.weight) in trained
    ]
    plain_sgd = update.kind == "sgd" and all(
        group["momentum"] == 0 and group["weight_decay"] == 0
        for group in update.optimizer.param_groups
    )
    if not names or plain_sgd:
        return None
    return (
        f"cannot train Hogwild threads: {', '.join(names)} make sparse gradients "
        f"(sparse=True), which the lock-free {type(update.optimizer).__name__} update "
        "does not take (only SGD without momentum or weight decay does); torch's own "
        "step applies them. For lock-free steps make the table a trainer.nn.SparseEmbedding"
    )


def collision_warning(model: Any, params: Sequence[torch.Tensor]) -> str | None:
    """What tells the user that Hogwild trainers will overwrite each other's
    updates of ``model``'s dense embedding tables (those of ``params``, the
    optimizer's, with at least ``COLLIDING_TABLE_ELEMENTS`` elements), and
    the fix; None when it has none (or is not a module: its tables cannot
    be told from its dense layers)."""
    if not isinstance(model, torch.nn.Module):
        return None
    trained = {id(p) for p in params if p.requires_grad}
    found = [
        f"'{name}' ({type(module).__name__} of {module.weight.shape[0]:,} x "
        f"{module.weight.shape[1]} = {module.weight.numel():,} elements)"
        for name, module in model.named_modules()
        if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag))
        and not module.sparse
        and id(module.weight) in trained
        and module.weight.numel() >= COLLIDING_TABLE_ELEMENTS
    ]
    if not found:
        return None
    return (
        f"Hogwild trainers each rewrite the whole of the dense embedding table "
        f"{', '.join(found)} at every step, so their updates overwrite each other and "
        f"cost accuracy (held-out AUC -0.008 with 2 trainers on examples/mlp_local's "
        f"100,003 x 8 table with Adam). Make it a trainer.nn.SparseEmbedding (each "
        f"step writes only the rows its batch holds), or train with hogwild=False"
    )
