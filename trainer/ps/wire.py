"""The parameter server's messages: a small JSON header plus raw array frames.

A message is a list of byte frames: frame 0 is a UTF-8 JSON header, the
further frames are the raw bytes of the tensors the header describes, in order:
each tensor in frames of ``MAX_FRAME_BYTES`` (the last one shorter; one empty
frame for an empty tensor). Nothing is ever unpickled: a receiver decodes only
JSON scalars, lists, the two tags below and tensors of the listed dtypes whose
byte length matches their declared shape.

Header of a request::

    {"v": 2, "id": 7, "op": "push", "body": [...], "tensors": [["float32", [4, 8]], ...]}

and of a reply ``{"v": 2, "id": 7, "body": ...}`` or, when the handler raised,
``{"v": 2, "id": 7, "error": {"type": "ValueError", "message": "..."}}``.

In a body, ``{"$t": k}`` stands for tensor frame ``k`` and ``{"$d": [[key,
value], ...]}`` for a dict whose keys are strings or integers (a dense
parameter's index). Tuples travel as lists.

Every operation's arguments are checked against its signature (``OPS``) before
a handler sees them: a peer that sends anything else gets a ``ProtocolError``
and nothing runs.

Decoding is bounded before anything is allocated from a peer's numbers: a header
of at most ``MAX_HEADER_BYTES``, nested at most ``MAX_JSON_DEPTH`` deep (checked
in one linear scan before the JSON parser recurses), integers of int64's range
(checked on their digits before conversion), finite floats, shapes of at most
``MAX_DIMS`` sizes whose extent fits ``MAX_TENSOR_ELEMENTS``, and frames whose
count and sizes are exactly those the shapes declare. Whatever else goes wrong
while decoding is a ``ProtocolError`` too: ``decode`` raises nothing else.
"""

from __future__ import annotations

import json
import math
import re
import threading
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

# 2: tensors of more than MAX_FRAME_BYTES travel as several frames.
PROTOCOL_VERSION = 2
# Bytes of one frame. The transport sets ZeroMQ's frame limit from it, so it is
# also what one frame of any peer, a handshake frame of an unauthenticated one
# included, can make a receiver hold before anything looks at it.
MAX_FRAME_BYTES = 1 << 20
MAX_HEADER_BYTES = MAX_FRAME_BYTES  # a header holds names and shapes, never values
MAX_DEPTH = 6  # of a body, counting lists and tagged dicts
# Of the header's JSON text: the deepest body MAX_DEPTH allows (a tensor inside
# six tagged dicts) is 20 levels deep.
MAX_JSON_DEPTH = 24
MAX_DIMS = 4
# The product of a shape's sizes (0 counted as 1): torch's strides stay in int64.
MAX_TENSOR_ELEMENTS = 1 << 40
_INT64_MIN, _INT64_END = -(1 << 63), 1 << 63
_MAX_INT_CHARS = 20  # "-9223372036854775808"
_MAX_FLOAT_CHARS = 64

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
_ITEM_BYTES = {name: torch.empty(0, dtype=dtype).element_size() for name, dtype in _DTYPES.items()}


class ProtocolError(ValueError):
    """A message that is not one this protocol sends: what was expected and found.

    Attributes:
        request_id: the message's id when its header could be read (an error
            reply can then name it), else None.
    """

    def __init__(self, message: str, request_id: int | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id


# -- encoding ----------------------------------------------------------------------


def encode(header: dict[str, Any], body: Any) -> list[bytes | memoryview]:
    """The frames of a message: ``header`` (without ``body``/``tensors``) plus ``body``.

    Raises:
        TypeError: ``body`` holds a value this protocol cannot carry.
        ValueError: the header would exceed ``MAX_HEADER_BYTES``.
    """
    tensors: list[torch.Tensor] = []
    message = dict(header)
    message["body"] = _encode_value(body, tensors)
    message["tensors"] = [[_DTYPE_NAMES[t.dtype], list(t.shape)] for t in tensors]
    text = json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
    if len(text) > MAX_HEADER_BYTES:
        raise ValueError(
            f"a message header of {len(text)} bytes (its names, shapes and scalars); "
            f"the protocol carries at most {MAX_HEADER_BYTES}"
        )
    frames: list[bytes | memoryview] = [text]
    for tensor in tensors:
        if not tensor.numel():
            frames.append(b"")
            continue
        data = memoryview(tensor.numpy()).cast("B")
        starts = range(0, data.nbytes, MAX_FRAME_BYTES)
        frames.extend(data[start : start + MAX_FRAME_BYTES] for start in starts)
    return frames


def _encode_value(value: Any, tensors: list[torch.Tensor]) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        if not _INT64_MIN <= value < _INT64_END:
            raise TypeError(
                f"cannot send an integer of {value.bit_length()} bits; int64's range expected"
            )
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
                raise TypeError(f"dict keys must be str or int to be sent, found {key!r:.80}")
            pairs.append([_encode_value(key, tensors), _encode_value(item, tensors)])
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
        ProtocolError: the frames are not a message of this protocol (its
            ``request_id`` set when the header was readable).
    """
    if not frames:
        raise ProtocolError("expected a message of at least one frame, found none")
    header = _decode_header(frames[0])
    request_id = header["id"]
    try:
        if header.get("v") != PROTOCOL_VERSION:
            raise ProtocolError(
                f"expected protocol version {PROTOCOL_VERSION}, found {header.get('v')!r:.40}"
            )
        tensors = _decode_tensors(header.pop("tensors", []), frames)
        body = _decode_value(header.pop("body", None), tensors, 0)
    except ProtocolError as err:
        err.request_id = request_id
        raise
    except Exception as err:  # noqa: BLE001 - a peer's message must never stop its receiver
        raise ProtocolError(
            f"message {request_id}: not decodable ({type(err).__name__}: {str(err)[:200]})",
            request_id,
        ) from err
    return header, body


def _buffer(frame: Any) -> memoryview:
    return memoryview(frame.buffer if hasattr(frame, "buffer") else frame).cast("B")


def _decode_header(frame: Any) -> dict[str, Any]:
    data = _buffer(frame)
    if data.nbytes > MAX_HEADER_BYTES:
        raise ProtocolError(
            f"expected a header of at most {MAX_HEADER_BYTES} bytes, found {data.nbytes}"
        )
    raw = data.tobytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ProtocolError(
            f"expected a UTF-8 JSON header, found undecodable bytes ({err})"
        ) from None
    _check_nesting(raw)
    try:
        header = _header_decoder().decode(text)
    except ProtocolError:
        raise
    except (ValueError, RecursionError) as err:  # JSONDecodeError is a ValueError
        raise ProtocolError(f"expected a JSON header, found undecodable text ({err})") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"expected a JSON object as header, found {type(header).__name__}")
    request_id = header.get("id")
    if not isinstance(request_id, int) or isinstance(request_id, bool):
        raise ProtocolError(f"expected an integer message id, found {request_id!r:.40}")
    return header


# A JSON escape sequence: a backslash and the character after it. Left to
# right, this pairs backslashes exactly as a JSON parser does inside strings.
_ESCAPE_SEQUENCE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"')  # once no escaped quote is left
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_OPENING = frozenset(b"[{")


def _check_nesting(raw: bytes) -> None:
    """Refuses JSON text whose brackets nest deeper than ``MAX_JSON_DEPTH``
    outside its strings: a scan in linear time, before the parser recurses.

    For text that is not JSON the depth found is at least that of the valid
    prefix the parser would recurse into before failing, so the bound holds."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:  # a usual header: done
        return
    if b"\\" in raw:
        raw = _ESCAPE_SEQUENCE.sub(b"__", raw)
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    if len(brackets) <= MAX_JSON_DEPTH:
        return
    if len(brackets) <= 256:  # a loop beats numpy's set-up
        depth = level = 0
        for code in brackets:
            level += 1 if code in _OPENING else -1
            depth = max(depth, level)
    else:
        codes = np.frombuffer(brackets, dtype=np.uint8)
        steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1)
        depth = int(np.cumsum(steps).max())
    if depth > MAX_JSON_DEPTH:
        raise ProtocolError(
            f"expected a header nested at most {MAX_JSON_DEPTH} deep, found {depth} levels"
        )


_decoders = threading.local()


def _header_decoder() -> json.JSONDecoder:
    # One per thread: a decoder's scanner keeps state between its calls.
    decoder = getattr(_decoders, "decoder", None)
    if decoder is None:
        decoder = _decoders.decoder = json.JSONDecoder(
            parse_int=_bounded_int, parse_float=_finite_float, parse_constant=_no_constant
        )
    return decoder


def _bounded_int(digits: str) -> int:
    # Checked on its text: converting 5000 digits is what the limit avoids.
    if len(digits) > _MAX_INT_CHARS:
        raise ProtocolError(
            f"expected integers in int64's range, found one of {len(digits)} characters"
        )
    value = int(digits)
    if not _INT64_MIN <= value < _INT64_END:
        raise ProtocolError(f"expected integers in int64's range, found {value}")
    return value


def _finite_float(text: str) -> float:
    value = float(text) if len(text) <= _MAX_FLOAT_CHARS else math.inf
    if not math.isfinite(value):
        raise ProtocolError(
            f"expected a finite number of at most {_MAX_FLOAT_CHARS} characters, "
            f"found {text[:_MAX_FLOAT_CHARS]!r}"
        )
    return value


def _no_constant(name: str) -> Any:
    raise ProtocolError(f"expected finite numbers, found {name}")


def _decode_tensors(specs: Any, frames: Sequence[Any]) -> list[torch.Tensor]:
    if not isinstance(specs, list):
        raise ProtocolError(f"expected a list of tensor specs, found {type(specs).__name__}")
    layouts = [_tensor_layout(spec, index) for index, spec in enumerate(specs)]
    expected = sum(frame_count for *_, frame_count in layouts)
    if len(frames) - 1 != expected:
        raise ProtocolError(
            f"expected {expected} tensor frames for the {len(specs)} declared tensors "
            f"(each in frames of {MAX_FRAME_BYTES} bytes), found {len(frames) - 1}"
        )
    # Every frame's size is checked before any tensor is allocated.
    pieces, at = [], 1
    for index, (name, shape, nbytes, frame_count) in enumerate(layouts):
        data = [_buffer(frame) for frame in frames[at : at + frame_count]]
        at += frame_count
        sizes = [piece.nbytes for piece in data]
        if sum(sizes) != nbytes or any(size != MAX_FRAME_BYTES for size in sizes[:-1]):
            shown = sizes if len(sizes) <= 4 else [*sizes[:3], "...", sizes[-1]]
            raise ProtocolError(
                f"tensor {index}: expected {nbytes} bytes for {name}{shape} in {frame_count} "
                f"frame(s) of {MAX_FRAME_BYTES} bytes (the last shorter), found frames of "
                f"{shown} bytes"
            )
        pieces.append(data)
    tensors = []
    for (name, shape, _, _), data in zip(layouts, pieces, strict=True):
        out = torch.empty(shape, dtype=_DTYPES[name])
        if out.numel():
            flat = out.view(-1).view(torch.uint8).numpy()
            start = 0
            for piece in data:
                flat[start : start + piece.nbytes] = np.frombuffer(piece, dtype=np.uint8)
                start += piece.nbytes
        tensors.append(out)
    return tensors


def _tensor_layout(spec: Any, index: int) -> tuple[str, list[int], int, int]:
    """A declared tensor's dtype name, shape, byte count and frame count."""
    if not (
        isinstance(spec, list) and len(spec) == 2 and isinstance(spec[0], str)
        and spec[0] in _DTYPES
    ):
        raise ProtocolError(
            f"tensor {index}: expected [dtype, shape] with dtype one of {sorted(_DTYPES)}, "
            f"found {spec!r:.200}"
        )
    name, shape = spec
    if not (
        isinstance(shape, list)
        and len(shape) <= MAX_DIMS
        and all(type(size) is int and size >= 0 for size in shape)
    ):
        raise ProtocolError(
            f"tensor {index}: expected a shape of at most {MAX_DIMS} sizes >= 0, "
            f"found {shape!r:.200}"
        )
    if math.prod(max(size, 1) for size in shape) > MAX_TENSOR_ELEMENTS:
        raise ProtocolError(
            f"tensor {index}: expected a shape whose sizes multiply to at most "
            f"{MAX_TENSOR_ELEMENTS} (zeros counted as ones), found {shape}"
        )
    nbytes = math.prod(shape) * _ITEM_BYTES[name]
    return name, shape, nbytes, max(1, -(-nbytes // MAX_FRAME_BYTES))


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
    "commit_save": ("str", "str"),
    "load": ("str",),
    "table_size": ("str",),
    "set_pass": ("int",),
    "shrink": (),
    "table_stats": (),
    "add_clicks": ("str", _IDS, ("tensor", "float32", 1)),
}


def check_args(
    op: Any, args: Any, ops: dict[str, tuple[Any, ...]] | None = None
) -> list[Any]:
    """``args`` as ``op`` takes them (lists become tuples where a pair is expected),
    ``op`` one of ``ops`` (the parameter server's ``OPS`` unless given).

    Raises:
        ProtocolError: an unknown operation, or arguments of other kinds.
    """
    ops = OPS if ops is None else ops
    if not isinstance(op, str) or op not in ops:
        raise ProtocolError(f"expected an operation in {sorted(ops)}, found {op!r:.80}")
    signature = ops[op]
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
