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

``HogwildUpdate`` therefore applies one thread's gradients to the shared
parameters with the update rule of the wrapped optimizer, reading and writing
the optimizer's own state (Adagrad's sums, Adam's moments) in place and
without a lock, as Paddle's CPU threads update their shared accumulators. The
arithmetic is that of torch's single-tensor implementations, so one thread
alone gets torch's values. Supported: ``SGD`` (momentum, dampening, Nesterov,
weight decay), ``Adagrad``, ``Adam`` and ``AdamW`` (amsgrad, weight decay),
each with ``maximize``; not their ``fused`` or ``differentiable`` variants.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["SUPPORTED_OPTIMIZERS", "HogwildStep", "HogwildUpdate", "unsupported_reason"]

SUPPORTED_OPTIMIZERS = ("SGD", "Adagrad", "Adam", "AdamW")
_KINDS = {
    torch.optim.SGD: "sgd",
    torch.optim.Adagrad: "adagrad",
    torch.optim.Adam: "adam",
    torch.optim.AdamW: "adamw",
}


def unsupported_reason(optimizer: Any) -> str | None:
    """Why ``optimizer`` cannot be stepped Hogwild-style, or None when it can."""
    kind = _KINDS.get(type(optimizer))
    if kind is None:
        return (
            f"{type(optimizer).__name__} is not one of the optimizers updated "
            f"lock-free {SUPPORTED_OPTIMIZERS} (a subclass may change step())"
        )
    for index, group in enumerate(optimizer.param_groups):
        for option in ("fused", "differentiable"):
            if group.get(option):
                return f"param group {index} of {type(optimizer).__name__} sets {option}=True"
        for param in group["params"]:
            if param.is_complex() or param.is_sparse:
                return (
                    f"param group {index} of {type(optimizer).__name__} holds a "
                    f"{'complex' if param.is_complex() else 'sparse'} parameter"
                )
    return None


def _scalar_dtype() -> torch.dtype:
    # The dtype torch's optimizers give their "step" counters.
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


class HogwildUpdate:
    """Applies one thread's gradients to ``optimizer``'s parameters, lock-free.

    Creates the optimizer state a first ``step()`` would create (Adam's
    moments), in torch's layout, so that a later ``optimizer.step()`` (a
    ``thread=1`` pass, a checkpoint) continues from it.

    Args:
        optimizer: a ``torch.optim`` ``SGD``, ``Adagrad``, ``Adam`` or ``AdamW``.

    Raises:
        ValueError: another optimizer, or an option the update does not
            implement (``unsupported_reason`` says which).
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        reason = unsupported_reason(optimizer)
        if reason is not None:
            raise ValueError(f"cannot train Hogwild threads: {reason}")
        self.optimizer = optimizer
        self.kind = _KINDS[type(optimizer)]
        self._init_lock = threading.Lock()  # SGD's momentum buffer, made on first use
        seen: set[int] = set()
        self.params: list[torch.Tensor] = []
        self._entries: list[tuple[torch.Tensor, dict[str, Any], dict[str, Any]]] = []
        for group in optimizer.param_groups:
            for param in group["params"]:
                if id(param) in seen:
                    continue
                seen.add(id(param))
                state = optimizer.state[param]
                if self.kind in ("adam", "adamw") and len(state) == 0:
                    self._init_adam(param, group, state)
                self.params.append(param)
                self._entries.append((param, group, state))

    @staticmethod
    def _init_adam(param: torch.Tensor, group: dict[str, Any], state: dict[str, Any]) -> None:
        state["step"] = torch.tensor(0.0, dtype=_scalar_dtype())
        state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        if group.get("amsgrad"):
            state["max_exp_avg_sq"] = torch.zeros_like(
                param, memory_format=torch.preserve_format
            )

    def apply(self, grads: Sequence[torch.Tensor | None]) -> None:
        """Updates each parameter of ``params`` by its gradient (None: unused, skipped)."""
        update = getattr(self, "_" + self.kind.replace("adamw", "adam"))
        with torch.no_grad():
            for (param, group, state), grad in zip(self._entries, grads, strict=True):
                if grad is not None:
                    update(param.data, grad, group, state)

    def _sgd(
        self, param: torch.Tensor, grad: torch.Tensor, group: dict[str, Any],
        state: dict[str, Any],
    ) -> None:
        if group.get("maximize"):
            grad = -grad
        weight_decay, momentum = group["weight_decay"], group["momentum"]
        if weight_decay != 0:
            grad = grad.add(param, alpha=weight_decay)
        if momentum != 0:
            buffer, created = self._momentum_buffer(state, grad)
            if not created:
                buffer.mul_(momentum).add_(grad, alpha=1 - group["dampening"])
            grad = grad.add(buffer, alpha=momentum) if group["nesterov"] else buffer
        param.add_(grad, alpha=-_float(group["lr"]))

    def _momentum_buffer(
        self, state: dict[str, Any], grad: torch.Tensor
    ) -> tuple[torch.Tensor, bool]:
        """SGD's buffer, and whether it was just made (as torch: a copy of ``grad``)."""
        buffer = state.get("momentum_buffer")
        if buffer is not None:
            return buffer, False
        with self._init_lock:
            buffer = state.get("momentum_buffer")
            if buffer is not None:
                return buffer, False
            buffer = state["momentum_buffer"] = torch.clone(grad).detach()
            return buffer, True

    def _adagrad(
        self, param: torch.Tensor, grad: torch.Tensor, group: dict[str, Any],
        state: dict[str, Any],
    ) -> None:
        step_t, state_sum = state["step"], state["sum"]
        step_t += 1
        step = step_t.item()
        if group.get("maximize"):
            grad = -grad
        if group["weight_decay"] != 0:
            grad = grad.add(param, alpha=group["weight_decay"])
        clr = _float(group["lr"]) / (1 + (step - 1) * group["lr_decay"])
        state_sum.addcmul_(grad, grad, value=1)
        std = state_sum.sqrt().add_(group["eps"])
        param.addcdiv_(grad, std, value=-clr)

    def _adam(
        self, param: torch.Tensor, grad: torch.Tensor, group: dict[str, Any],
        state: dict[str, Any],
    ) -> None:
        beta1, beta2 = (_float(b) for b in group["betas"])
        lr, weight_decay = _float(group["lr"]), group["weight_decay"]
        step_t = state["step"]
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        if group.get("maximize"):
            grad = -grad
        step_t += 1
        if weight_decay != 0:
            if self.kind == "adamw" or group.get("decoupled_weight_decay"):
                param.mul_(1 - lr * weight_decay)
            else:
                grad = grad.add(param, alpha=weight_decay)
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad.conj(), value=1 - beta2)
        step = step_t.item()
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        step_size = lr / bias_correction1
        bias_correction2_sqrt = bias_correction2**0.5
        if group.get("amsgrad"):
            max_exp_avg_sq = state["max_exp_avg_sq"]
            torch.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)
            denom = (max_exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(group["eps"])
        else:
            denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(group["eps"])
        param.addcdiv_(exp_avg, denom, value=-step_size)


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
        self.update = HogwildUpdate(torch_optimizer)
        self.params = self.update.params

    def gradients(self, loss: torch.Tensor) -> list[torch.Tensor | None]:
        """This thread's gradients of ``loss``: the dense parameters' (None where
        unused or frozen), then its pending sparse rows' (see ``apply``)."""
        rows: list[torch.Tensor] = []
        if self.push_sparse:
            from .ps import sparse  # trainer.ps only where its runtime made the optimizer

            rows = sparse.pending_rows()
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
            from .ps import sparse

            for rows, grad in zip(sparse.pending_rows(), grads[count:], strict=True):
                rows.grad = grad
            sparse.local_store().push(sparse.take_gradients())


def _float(value: Any) -> float:
    """A hyper-parameter that may be a 0-d tensor (torch allows a tensor lr)."""
    return float(value)
