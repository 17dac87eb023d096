"""A torch optimizer's update of dense parameters, in a few foreach ops.

``torch.optim.Adagrad.step()`` on a small model costs several times its
arithmetic: a profiler scope, hook chains, dynamo guards and, on the CPU, one
op per parameter and per formula term (the single-tensor implementation is
torch's CPU default). ``DenseUpdate`` applies the same rule to every parameter
of a group at once with ``torch._foreach_*`` ops, reading and writing the
optimizer's own state (Adagrad's sums, Adam's moments, SGD's momentum buffers)
in place, so that a later ``optimizer.step()`` or ``state_dict()`` carries on
from it. The arithmetic is that of torch's single-tensor implementations,
term by term, so the parameters come out bit for bit as ``step()``'s.

Two users:

* a Hogwild trainer thread (``trainer.loop.hogwild``) applies the gradients it took
  itself, without a lock, while other threads do the same; the step counters
  (Adam's, Adagrad's) go up by atomic adds (``_shared_counts``), so that no
  trainer's step is lost from them;
* the one-thread step of local and GEO modes (``step_from_grads``) applies the
  parameters' ``.grad``, as ``optimizer.step()`` would, unless something
  expects ``step()`` itself to run (hooks, an instance-level ``step``): then it
  calls ``step()``.

Supported: ``SGD`` (momentum, dampening, Nesterov, weight decay), ``Adagrad``,
``Adam`` and ``AdamW`` (amsgrad, weight decay), each with ``maximize``; not their
``fused`` or ``differentiable`` variants, nor complex or sparse parameters.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.optim import optimizer as torch_optimizer_module

from . import step_clock
from ._shared_counts import count_steps

__all__ = [
    "SUPPORTED_OPTIMIZERS", "DenseUpdate", "clear_grads", "step_from_grads", "unsupported_reason"
]

SUPPORTED_OPTIMIZERS = ("SGD", "Adagrad", "Adam", "AdamW")
_KINDS = {
    torch.optim.SGD: "sgd",
    torch.optim.Adagrad: "adagrad",
    torch.optim.Adam: "adam",
    torch.optim.AdamW: "adamw",
}

TensorList = list[torch.Tensor]


def unsupported_reason(optimizer: Any) -> str | None:
    """Why ``DenseUpdate`` cannot apply ``optimizer``'s rule, or None when it can."""
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


class DenseUpdate:
    """Applies gradients to ``optimizer``'s parameters with its update rule.

    Creates the optimizer state a first ``step()`` would create (Adam's
    moments), in torch's layout. Reads ``param_groups`` and ``state`` at each
    ``apply``, so a ``load_state_dict`` or a changed lr takes effect as with
    ``step()``.

    Args:
        optimizer: a ``torch.optim`` ``SGD``, ``Adagrad``, ``Adam`` or ``AdamW``.

    Raises:
        ValueError: another optimizer, or an option the update does not
            implement (``unsupported_reason`` says which).
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        reason = unsupported_reason(optimizer)
        if reason is not None:
            raise ValueError(f"cannot update lock-free: {reason}")
        self.optimizer = optimizer
        self.kind = _KINDS[type(optimizer)]
        self._rule = getattr(self, "_" + self.kind.replace("adamw", "adam"))
        self._init_lock = threading.Lock()  # state made on first use, once
        seen: set[int] = set()
        self.params: TensorList = []
        for group in optimizer.param_groups:
            for param in group["params"]:
                if id(param) not in seen:
                    seen.add(id(param))
                    self.params.append(param)

    def init_state(self) -> None:
        """Makes the state a first update makes (Adam's moments) now, so that
        it exists before the parameters are shared (Hogwild processes)."""
        if self.kind in ("adam", "adamw"):
            with self._init_lock:
                for group in self.optimizer.param_groups:
                    for param in group["params"]:
                        if len(self.optimizer.state[param]) == 0:
                            _init_adam(param, group, self.optimizer.state[param])

    def apply(self, grads: Sequence[torch.Tensor | None]) -> None:
        """Updates each parameter of ``params`` by its gradient (None: unused, skipped)."""
        if len(grads) != len(self.params):
            raise ValueError(
                f"expected one gradient (or None) per parameter ({len(self.params)}), "
                f"got {len(grads)}"
            )
        by_param = {id(p): g for p, g in zip(self.params, grads, strict=True)}
        self._apply(lambda param: by_param.pop(id(param), None))

    def apply_grads(self) -> None:
        """Updates each parameter of the optimizer's groups by its ``.grad``,
        as ``optimizer.step()`` (parameters without one are skipped)."""
        self._apply(lambda param: param.grad)

    def _apply(self, grad_of: Callable[[torch.Tensor], torch.Tensor | None]) -> None:
        started = time.perf_counter()
        self._apply_rule(grad_of)
        step_clock.add_optimizer(time.perf_counter() - started)

    def _apply_rule(self, grad_of: Callable[[torch.Tensor], torch.Tensor | None]) -> None:
        state = self.optimizer.state
        with torch.no_grad():
            for group in self.optimizer.param_groups:
                params: TensorList = []
                group_grads: TensorList = []
                states: list[dict[str, Any]] = []
                for param in group["params"]:
                    grad = grad_of(param)
                    if grad is not None:
                        params.append(param.data)
                        group_grads.append(grad)
                        states.append(state[param])
                if params:
                    self._rule(params, group_grads, group, states)

    # -- the rules ----------------------------------------------------------------------

    def _sgd(
        self, params: TensorList, grads: TensorList, group: dict[str, Any],
        states: list[dict[str, Any]],
    ) -> None:
        if group.get("maximize"):
            grads = torch._foreach_neg(grads)
        weight_decay, momentum = group["weight_decay"], group["momentum"]
        if weight_decay != 0:
            grads = torch._foreach_add(grads, params, alpha=weight_decay)
        if momentum != 0:
            buffers = self._momentum_buffers(states, grads)
            old = [(b, g) for b, g, made in buffers if not made]
            if old:
                kept = [b for b, _ in old]
                torch._foreach_mul_(kept, momentum)
                torch._foreach_add_(kept, [g for _, g in old], alpha=1 - group["dampening"])
            all_buffers = [b for b, _, _ in buffers]
            if group["nesterov"]:
                grads = torch._foreach_add(grads, all_buffers, alpha=momentum)
            else:
                grads = all_buffers
        torch._foreach_add_(params, grads, alpha=-_float(group["lr"]))

    def _momentum_buffers(
        self, states: list[dict[str, Any]], grads: TensorList
    ) -> list[tuple[torch.Tensor, torch.Tensor, bool]]:
        """Each parameter's momentum buffer, its gradient, and whether the
        buffer was just made (as torch: a copy of the gradient)."""
        out = []
        for state, grad in zip(states, grads, strict=True):
            buffer = state.get("momentum_buffer")
            if buffer is not None:
                out.append((buffer, grad, False))
                continue
            with self._init_lock:
                buffer = state.get("momentum_buffer")
                made = buffer is None
                if made:
                    buffer = state["momentum_buffer"] = torch.clone(grad).detach()
            out.append((buffer, grad, made))
        return out

    def _adagrad(
        self, params: TensorList, grads: TensorList, group: dict[str, Any],
        states: list[dict[str, Any]],
    ) -> None:
        counts = count_steps([s["step"] for s in states])
        sums = [s["sum"] for s in states]
        if group.get("maximize"):
            grads = torch._foreach_neg(grads)
        if group["weight_decay"] != 0:
            grads = torch._foreach_add(grads, params, alpha=group["weight_decay"])
        lr, lr_decay = _float(group["lr"]), group["lr_decay"]
        torch._foreach_addcmul_(sums, grads, grads, value=1)
        std = torch._foreach_sqrt(sums)
        torch._foreach_add_(std, group["eps"])
        if lr_decay == 0:
            torch._foreach_addcdiv_(params, grads, std, value=-(lr / 1))
        else:
            scales = [-(lr / (1 + (n - 1) * lr_decay)) for n in counts]
            torch._foreach_addcdiv_(params, grads, std, scales)

    def _adam(
        self, params: TensorList, grads: TensorList, group: dict[str, Any],
        states: list[dict[str, Any]],
    ) -> None:
        # Made under the lock: a thread that finds a state not yet whole waits
        # for the thread making it.
        whole = 4 if group.get("amsgrad") else 3
        if any(len(s) < whole for s in states):
            with self._init_lock:
                for param, state in zip(params, states, strict=True):
                    if len(state) == 0:
                        _init_adam(param, group, state)
        beta1, beta2 = (_float(b) for b in group["betas"])
        lr, weight_decay = _float(group["lr"]), group["weight_decay"]
        exp_avgs = [s["exp_avg"] for s in states]
        exp_avg_sqs = [s["exp_avg_sq"] for s in states]
        if group.get("maximize"):
            grads = torch._foreach_neg(grads)
        # This trainer's step numbers: its bias correction uses the count its
        # own add made, as one trainer's would (others may add meanwhile).
        counts = count_steps([s["step"] for s in states])
        if weight_decay != 0:
            if self.kind == "adamw" or group.get("decoupled_weight_decay"):
                torch._foreach_mul_(params, 1 - lr * weight_decay)
            else:
                grads = torch._foreach_add(grads, params, alpha=weight_decay)
        torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
        step_sizes = [-(lr / (1 - beta1**n)) for n in counts]
        bias_correction2_sqrt = [(1 - beta2**n) ** 0.5 for n in counts]
        if group.get("amsgrad"):
            maxima = [s["max_exp_avg_sq"] for s in states]
            torch._foreach_maximum_(maxima, exp_avg_sqs)
            denom = torch._foreach_sqrt(maxima)
        else:
            denom = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_div_(denom, bias_correction2_sqrt)
        torch._foreach_add_(denom, group["eps"])
        torch._foreach_addcdiv_(params, exp_avgs, denom, step_sizes)


def _init_adam(param: torch.Tensor, group: dict[str, Any], state: dict[str, Any]) -> None:
    """The state torch's Adam makes at a parameter's first step, added to
    ``state`` in one ``update`` (Hogwild threads read it without the lock once
    it is whole: with one key at a time, a thread read "step" and then failed
    on a missing "exp_avg")."""
    made = {
        "step": torch.tensor(0.0, dtype=_scalar_dtype()),
        "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
        "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
    }
    if group.get("amsgrad"):
        made["max_exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
    state.update(made)


def _float(value: Any) -> float:
    """A hyper-parameter that may be a 0-d tensor (torch allows a tensor lr)."""
    return float(value)


# -- optimizer.step() without its machinery ---------------------------------------------

_updates: weakref.WeakKeyDictionary[torch.optim.Optimizer, tuple[int, DenseUpdate | None]] = (
    weakref.WeakKeyDictionary()
)
_updates_lock = threading.Lock()


def step_from_grads(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.step()``: the same values, in foreach ops when ``DenseUpdate``
    supports the optimizer, no gradient is sparse, and nothing else expects
    ``step()`` to run (step hooks, an instance-level ``step`` other than an lr
    scheduler's counter); else ``optimizer.step()`` itself."""
    update = _update_for(optimizer)
    if update is None or any(p.grad is not None and p.grad.is_sparse for p in update.params):
        # sparse gradients (nn.Embedding(sparse=True)): torch's own rule for them
        started = time.perf_counter()
        optimizer.step()
        step_clock.add_optimizer(time.perf_counter() - started)
        return
    update.apply_grads()
    if "step" in vars(optimizer):  # an lr scheduler's wrapper: it only notes the call
        optimizer._opt_called = True  # type: ignore[attr-defined]


def _update_for(optimizer: torch.optim.Optimizer) -> DenseUpdate | None:
    if (
        optimizer._optimizer_step_pre_hooks
        or optimizer._optimizer_step_post_hooks
        or torch_optimizer_module._global_optimizer_pre_hooks
        or torch_optimizer_module._global_optimizer_post_hooks
    ):
        return None
    patched = vars(optimizer).get("step")
    if patched is not None and not getattr(patched, "_wrapped_by_lr_sched", False):
        return None
    groups = len(optimizer.param_groups)
    cached = _updates.get(optimizer)
    if cached is not None and cached[0] == groups:
        return cached[1]
    with _updates_lock:
        update = DenseUpdate(optimizer) if unsupported_reason(optimizer) is None else None
        _updates[optimizer] = (groups, update)
    return update


def clear_grads(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.zero_grad(set_to_none=True)``: the gradients set to None
    directly where that is all it would do (its profiler scope and dynamo
    guard cost more than the assignments on a small model)."""
    own = type(optimizer).zero_grad is not torch.optim.Optimizer.zero_grad
    if own or "zero_grad" in vars(optimizer):
        optimizer.zero_grad(set_to_none=True)
        return
    for group in optimizer.param_groups:
        for param in group["params"]:
            param.grad = None
