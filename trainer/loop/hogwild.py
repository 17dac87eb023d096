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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..embedding import pending, stores
from .dense_update import SUPPORTED_OPTIMIZERS, DenseUpdate, unsupported_reason

__all__ = ["SUPPORTED_OPTIMIZERS", "HogwildStep", "unsupported_reason"]


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

