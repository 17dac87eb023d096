"""Short descriptions of values for error messages about files and peers."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["describe_value", "is_float_rows", "is_int"]


def describe_value(value: Any) -> str:
    """A short description of ``value`` for an error message: a tensor's dtype
    and shape, a bounded ``repr`` otherwise (a hand-edited file may hold huge
    values; an int's repr over 4,300 digits raises)."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return f"a {value.dtype} {type(value).__name__} of shape {list(value.shape)}"
    if is_int(value) and value.bit_length() > 128:
        return f"an int of {value.bit_length()} bits"
    if value is None or isinstance(value, (bool, int, float, str)):
        text = repr(value)
        return text if len(text) <= 80 else text[:77] + "..."
    if isinstance(value, (list, tuple)) and len(value) <= 8:
        return "[" + ", ".join(describe_value(v) for v in value) + "]"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)} items"
    return f"a {type(value).__name__}"


def is_int(value: Any) -> bool:
    """Whether ``value`` is an int (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_float_rows(value: Any, dim: int) -> bool:
    """Whether ``value`` is a 2-D float tensor of rows of ``dim``."""
    return (
        isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and value.dim() == 2
        and value.shape[1] == dim
    )
