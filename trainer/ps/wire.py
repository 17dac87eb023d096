"""The parameter server's messages: a small JSON header plus raw array frames.

A message is a list of byte frames: frame 0 is a UTF-8 JSON header, every
further frame is the raw bytes of one tensor the header describes. Nothing is
ever unpickled: a receiver decodes only JSON scalars, lists, the two tags below
and tensors of the listed dtypes whose byte length matches their declared shape.

Header of a request::

    {"v": 1, "id": 7, "op": "push", "body": [...], "tensors": [["float32", [4, 8]], ...]}

and of a reply ``{"v": 1, "id": 7, "body": ...}`` or, when the handler raised,
``{"v": 1, "id": 7, "error": {"type": "ValueError", "message": "..."}}``.

In a body, ``{"$t": k}`` stands for tensor frame ``k`` and ``{"$d": [[key,
value], ...]}`` for a dict whose keys are strings or integers (a dense
parameter's index). Tuples travel as lists.

Every operation's arguments are checked against its signature (``OPS``) before
a handler sees them: a peer that sends anything else gets a ``ProtocolError``
and nothing runs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = [
    "OPS",
    "PROTOCOL_VERSION",
    "ProtocolError",
    "check_args",
    "decode",
    "encode",
]

PROTOCOL_VERSION = 1
MAX_HEADER_BYTES = 1 << 20  # a header holds names and shapes, never values
MAX_DEPTH = 6
MAX_DIMS = 4

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_DTYPE_NAMES = {dtype: name for name, dtype in _DTYPES.items()}


class ProtocolError(ValueError):
    """A message that is not one this protocol sends: what was expected and found."""


# -- encoding ----------------------------------------------------------------------


def encode(header: dict[str, Any], body: Any) -> list[bytes | memoryview]:
    """The frames of a message: ``header`` (without ``body``/``tensors``) plus ``body``.

    Raises:
        TypeError: ``body`` holds a value this protocol cannot carry.
    """
    tensors: list[torch.Tensor] = []
    message = dict(header)
    message["body"] = _encode_value(body, tensors)
    message["tensors"] = [[_DTYPE_NAMES[t.dtype], list(t.shape)] for t in tensors]
    frames: list[bytes | memoryview] = [json.dumps(message, separators=(",", ":")).encode()]
    for tensor in tensors:
        frames.append(memoryview(tensor.numpy()).cast("B") if tensor.numel() else b"")
    return frames


def _encode_value(value: Any, tensors: list[torch.Tensor]) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TypeError(f"cannot send the non-finite number {value!r}")
        return value
    if isinstance(value, torch.Tensor):
        return {"$t": _add_tensor(value, tensors)}
    if isinstance(value, np.ndarray):
        return {"$t": _add_tensor(torch.from_numpy(value), tensors)}
    if isinstance(value, (list, tuple)):
        return [_encode_value(v, tensors) for v in value]
    if isinstance(value, dict):
        pairs = []
        for key, item in value.items():
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                raise TypeError(f"dict keys must be str or int to be sent, found {key!r}")
            pairs.append([key, _encode_value(item, tensors)])
        return {"$d": pairs}
    raise TypeError(f"cannot send a {type(value).__name__} to a parameter server peer")


def _add_tensor(tensor: torch.Tensor, tensors: list[torch.Tensor]) -> int:
    tensor = tensor.detach()
    if tensor.dtype not in _DTYPE_NAMES:
        raise TypeError(
            f"cannot send a tensor of dtype {tensor.dtype}; one of {sorted(_DTYPES)} expected"
        )
    if tensor.dim() > MAX_DIMS:
        raise TypeError(f"cannot send a tensor of {tensor.dim()} dimensions (at most {MAX_DIMS})")
    tensors.append(tensor.cpu().contiguous())
    return len(tensors) - 1


# -- decoding ----------------------------------------------------------------------


def decode(frames: Sequence[Any]) -> tuple[dict[str, Any], Any]:
    """The header (without body/tensors) and the decoded body of a message.

    Raises:
        ProtocolError: the frames are not a message of this protocol.
    """
    if not frames:
        raise ProtocolError("expected a message of at least one frame, found none")
    raw = bytes(frames[0])
    if len(raw) > MAX_HEADER_BYTES:
        raise ProtocolError(
            f"expected a header of at most {MAX_HEADER_BYTES} bytes, found {len(raw)}"
        )
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ProtocolError(f"expected a JSON header, found undecodable bytes ({err})") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"expected a JSON object as header, found {type(header).__name__}")
    if header.get("v") != PROTOCOL_VERSION:
        raise ProtocolError(
            f"expected protocol version {PROTOCOL_VERSION}, found {header.get('v')!r}"
        )
    if not isinstance(header.get("id"), int) or isinstance(header.get("id"), bool):
        raise ProtocolError(f"expected an integer message id, found {header.get('id')!r}")
    specs = header.pop("tensors", [])
    if not isinstance(specs, list) or len(specs) != len(frames) - 1:
        raise ProtocolError(
            f"expected one frame per declared tensor, found {len(frames) - 1} frames for "
            f"{len(specs) if isinstance(specs, list) else specs!r} tensors"
        )
    tensors = [_decode_tensor(spec, frames[i + 1], i) for i, spec in enumerate(specs)]
    body = _decode_value(header.pop("body", None), tensors, 0)
    return header, body


def _decode_tensor(spec: Any, frame: Any, index: int) -> torch.Tensor:
    if not (isinstance(spec, list) and len(spec) == 2 and spec[0] in _DTYPES):
        raise ProtocolError(
            f"tensor {index}: expected [dtype, shape] with dtype one of {sorted(_DTYPES)}, "
            f"found {spec!r}"
        )
    dtype, shape = _DTYPES[spec[0]], spec[1]
    if not (
        isinstance(shape, list)
        and len(shape) <= MAX_DIMS
        and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    ):
        raise ProtocolError(
            f"tensor {index}: expected a shape of at most {MAX_DIMS} sizes >= 0, found {shape!r}"
        )
    data = memoryview(frame.buffer if hasattr(frame, "buffer") else frame).cast("B")
    expected = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    if data.nbytes != expected:
        raise ProtocolError(
            f"tensor {index}: expected {expected} bytes for {spec[0]}{shape}, found {data.nbytes}"
        )
    out = torch.empty(shape, dtype=dtype)
    if expected:
        out.view(-1).view(torch.uint8).numpy()[:] = np.frombuffer(data, dtype=np.uint8)
    return out


def _decode_value(value: Any, tensors: list[torch.Tensor], depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise ProtocolError(f"expected a body nested at most {MAX_DEPTH} deep")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_decode_value(v, tensors, depth + 1) for v in value]
    if isinstance(value, dict) and len(value) == 1:
        if "$t" in value:
            k = value["$t"]
            if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k < len(tensors):
                raise ProtocolError(f"expected a tensor index below {len(tensors)}, found {k!r}")
            return tensors[k]
        if "$d" in value and isinstance(value["$d"], list):
            out = {}
            for pair in value["$d"]:
                if not (isinstance(pair, list) and len(pair) == 2) or not isinstance(
                    pair[0], (str, int)
                ) or isinstance(pair[0], bool):
                    raise ProtocolError(f"expected [str or int key, value] pairs, found {pair!r}")
                out[pair[0]] = _decode_value(pair[1], tensors, depth + 1)
            return out
    raise ProtocolError(f"expected a JSON value, a tensor or a tagged dict, found {value!r:.200}")


# -- the operations' signatures -----------------------------------------------------

# A signature is a tuple of argument kinds; a kind is "int", "str", "bool",
# ("list", kind), ("tensor", dtype name or None, ndim), ("dict", key kind, value
# kind) or ("pair", kind, kind).
_IDS = ("tensor", "int64", 1)
_ROWS = ("tensor", "float32", 2)
_SPARSE = ("dict", "str", ("pair", _IDS, ("tensor", None, 2)))
_DENSE = ("dict", "int", ("tensor", None, None))
OPS: dict[str, tuple[Any, ...]] = {
    "describe": (),
    "pull_tables": (("list", "str"), _IDS, "bool"),
    "pull_step": ("int", ("list", "str"), _IDS),
    "pull_dense": (),
    "push": ("int", _SPARSE, _DENSE),
    "push_sync": ("int", _SPARSE, _DENSE),
    "geo_push": ("int", _SPARSE, _DENSE),
    "worker_done": ("int",),
    "barrier": ("int",),
    "save": ("str", "str"),
    "load": ("str",),
    "table_size": ("str",),
    "set_pass": ("int",),
    "shrink": (),
    "table_stats": (),
    "add_clicks": ("str", _IDS, ("tensor", "float32", 1)),
}


def check_args(op: Any, args: Any) -> list[Any]:
    """``args`` as ``op`` takes them (lists become tuples where a pair is expected).

    Raises:
        ProtocolError: an unknown operation, or arguments of other kinds.
    """
    if not isinstance(op, str) or op not in OPS:
        raise ProtocolError(f"expected an operation in {sorted(OPS)}, found {op!r:.80}")
    signature = OPS[op]
    if not isinstance(args, list) or len(args) != len(signature):
        raise ProtocolError(
            f"{op}: expected {len(signature)} arguments, found "
            f"{len(args) if isinstance(args, list) else type(args).__name__}"
        )
    return [_check(kind, value, f"{op} argument {i}") for i, (kind, value) in
            enumerate(zip(signature, args, strict=True))]


def _check(kind: Any, value: Any, where: str) -> Any:
    if kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind == "str":
        if isinstance(value, str):
            return value
    elif kind == "bool":
        if isinstance(value, bool):
            return value
    elif kind[0] == "list":
        if isinstance(value, list):
            return [_check(kind[1], v, where) for v in value]
    elif kind[0] == "pair":
        if isinstance(value, list) and len(value) == 2:
            return (_check(kind[1], value[0], where), _check(kind[2], value[1], where))
    elif kind[0] == "dict":
        if isinstance(value, dict):
            return {_check(kind[1], k, where): _check(kind[2], v, where) for k, v in value.items()}
    elif kind[0] == "tensor":
        _, dtype, ndim = kind
        if (
            isinstance(value, torch.Tensor)
            and (dtype is None or value.dtype == _DTYPES[dtype])
            and (ndim is None or value.dim() == ndim)
        ):
            return value
    raise ProtocolError(f"{where}: expected {_describe(kind)}, found {_found(value)}")


def _describe(kind: Any) -> str:
    if isinstance(kind, str):
        return f"a {kind}"
    if kind[0] == "tensor":
        return f"a {kind[2] or 'any'}-d {kind[1] or 'numeric'} tensor"
    return f"a {kind[0]}"


def _found(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dim()}-d {_DTYPE_NAMES.get(value.dtype, value.dtype)} tensor"
    return f"a {type(value).__name__}"
