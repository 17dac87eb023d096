"""Optimizers applied to sparse rows where they live (a server shard or a local table).

``OptimizerSpec`` is the optimizer of one sparse table: its kind (SGD, Adagrad,
Adam/AdamW) and hyper-parameters, read from the torch optimizer handed to
``fleet.distributed_optimizer`` unless the table overrides it. The update
formulas are torch's own (``torch.optim.SGD/Adagrad/Adam/AdamW``, single-tensor
path), applied to the rows of one push. Adam keeps a step count per row (lazy
Adam, as torch's ``SparseAdam`` and Paddle's ``lazy_mode``): a row's moments and
bias correction advance only when the row receives a gradient.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

_KINDS = ("sgd", "adagrad", "adam", "adamw")

# Hyper-parameters each kind understands, with torch's defaults.
_DEFAULTS: dict[str, dict[str, Any]] = {
    "sgd": {"lr": 1e-3, "weight_decay": 0.0},
    "adagrad": {"lr": 1e-2, "eps": 1e-10, "weight_decay": 0.0, "initial_accumulator_value": 0.0},
    "adam": {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0},
    "adamw": {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-2},
}

# Settings of torch optimizers that have no sparse-row equivalent here: a table
# fed from an optimizer that uses them is an error rather than a silent change.
_UNSUPPORTED_IF_SET = {
    "momentum": 0,
    "dampening": 0,
    "nesterov": False,
    "lr_decay": 0,
    "amsgrad": False,
    "maximize": False,
}


@dataclass(frozen=True)
class OptimizerSpec:
    """The optimizer of a sparse table.

    Attributes:
        kind: ``"sgd"``, ``"adagrad"``, ``"adam"`` or ``"adamw"``.
        hyper: its hyper-parameters (lr, eps, betas, weight_decay,
            initial_accumulator_value), torch's defaults filled in.
    """

    kind: str
    hyper: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(
                f"sparse optimizer must be one of {', '.join(_KINDS)}, got {self.kind!r}"
            )
        unknown = set(self.hyper) - set(_DEFAULTS[self.kind])
        if unknown:
            raise ValueError(
                f"sparse optimizer {self.kind!r} has no setting {sorted(unknown)}; "
                f"it takes {sorted(_DEFAULTS[self.kind])}"
            )
        object.__setattr__(self, "hyper", {**_DEFAULTS[self.kind], **dict(self.hyper)})

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> OptimizerSpec:
        """From a table's override, e.g. ``{"type": "adagrad", "lr": 0.05}``."""
        config = dict(config)
        if "type" not in config:
            raise ValueError(
                f"a sparse optimizer override needs a 'type' "
                f"({', '.join(_KINDS)}), got {config!r}"
            )
        kind = str(config.pop("type")).lower()
        return cls(kind, config)

    @classmethod
    def from_torch(cls, optimizer: torch.optim.Optimizer) -> OptimizerSpec:
        """The sparse counterpart of a torch optimizer (its first param group's settings).

        Raises:
            ValueError: the optimizer is not SGD/Adagrad/Adam/AdamW, or uses a
                setting (momentum, amsgrad, lr_decay, ...) sparse rows do not support.
        """
        name = type(optimizer).__name__.lower()
        if name not in _KINDS:
            raise ValueError(
                f"sparse tables support torch.optim SGD, Adagrad, Adam and AdamW; "
                f"got {type(optimizer).__name__} (give the SparseEmbedding its own "
                f"optimizer={{'type': ...}} to use another one for sparse rows)"
            )
        group = optimizer.param_groups[0] if optimizer.param_groups else optimizer.defaults
        for key, neutral in _UNSUPPORTED_IF_SET.items():
            if key in group and group[key] not in (neutral, None):
                raise ValueError(
                    f"sparse tables do not support {type(optimizer).__name__}"
                    f"({key}={group[key]!r}); use {key}={neutral!r} or give the "
                    f"SparseEmbedding its own optimizer"
                )
        hyper = {key: _plain(group[key]) for key in _DEFAULTS[name] if key in group}
        return cls(name, hyper)

    # -- state --------------------------------------------------------------

    def state_layout(self) -> dict[str, tuple[Callable[[int], tuple[int, ...]], Any]]:
        """Per-row state arrays: name -> (shape of one row given dim, dtype)."""
        if self.kind == "adagrad":
            return {"sum": (lambda dim: (dim,), np.float32)}
        if self.kind in ("adam", "adamw"):
            return {
                "exp_avg": (lambda dim: (dim,), np.float32),
                "exp_avg_sq": (lambda dim: (dim,), np.float32),
                "step": (lambda dim: (), np.float32),
            }
        return {}

    def initial_state(self, key: str) -> float:
        if key == "sum":
            return float(self.hyper["initial_accumulator_value"])
        return 0.0

    # -- update -------------------------------------------------------------

    def apply(self, weights: np.ndarray, grads: np.ndarray, state: dict[str, np.ndarray]) -> None:
        """Updates ``weights`` [n, dim] and ``state`` in place with ``grads``;
        Adam's ``state["step"]`` is each row's step number of this update,
        counted already (the table counts it in place: table.py)."""
        param = torch.from_numpy(weights)
        grad = torch.from_numpy(grads)
        h = self.hyper
        lr = float(h["lr"])
        wd = float(h["weight_decay"])
        if wd and self.kind != "adamw":
            grad = grad.add(param, alpha=wd)
        if self.kind == "sgd":
            param.add_(grad, alpha=-lr)
        elif self.kind == "adagrad":
            total = torch.from_numpy(state["sum"])
            total.addcmul_(grad, grad, value=1)
            std = total.sqrt().add_(float(h["eps"]))
            param.addcdiv_(grad, std, value=-lr)
        else:
            beta1, beta2 = (float(b) for b in h["betas"])
            if self.kind == "adamw" and wd:
                param.mul_(1 - lr * wd)
            exp_avg = torch.from_numpy(state["exp_avg"])
            exp_avg_sq = torch.from_numpy(state["exp_avg_sq"])
            step = torch.from_numpy(state["step"])
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            steps = step.double().unsqueeze(1)
            bias_correction1 = 1 - torch.pow(beta1, steps)
            bias_correction2 = 1 - torch.pow(beta2, steps)
            step_size = (lr / bias_correction1).float()
            denom = (exp_avg_sq.sqrt() / bias_correction2.sqrt().float()).add_(float(h["eps"]))
            param.sub_(exp_avg / denom * step_size)

    def describe(self) -> str:
        settings = ", ".join(f"{k}={v}" for k, v in sorted(self.hyper.items()))
        return f"{self.kind}({settings})"


def _plain(value: Any) -> Any:
    """Hyper-parameters as plain Python values (torch allows tensor lr / betas)."""
    if isinstance(value, torch.Tensor):
        return value.item()
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, float) and math.isnan(value):
        raise ValueError("a sparse optimizer hyper-parameter is NaN")
    return value
