"""The slot schema: which slots a MultiSlot line holds, in order, and their types.

MultiSlot text carries no slot names: slots are matched to the schema purely by
position (the order of ``use_var``), as in Paddle.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import SchemaError

# Numeric codes shared with the Cython parser (datafeed/parse/_parse.pyx).
KIND_INT64 = 0
KIND_UINT64 = 1
KIND_FLOAT32 = 2
# A text field's bytes (an instance id, a content field): never a use_var slot.
KIND_TEXT = 3

_KINDS = {
    "int64": KIND_INT64,
    "uint64": KIND_UINT64,
    "float32": KIND_FLOAT32,
    "text": KIND_TEXT,
}
_NUMPY_DTYPES = {
    "int64": np.dtype(np.int64),
    "uint64": np.dtype(np.uint64),
    "float32": np.dtype(np.float32),
    "text": np.dtype(np.uint8),
}
# Spellings accepted from Paddle-style variables, numpy and torch dtypes.
_DTYPE_ALIASES = {
    "int64": "int64",
    "long": "int64",
    "uint64": "uint64",
    "float32": "float32",
    "float": "float32",
    "fp32": "float32",
}


def _normalize_dtype(dtype: Any, where: str) -> str:
    text = str(getattr(dtype, "name", dtype)).lower()
    # "paddle.int64", "torch.int64", "VarType.FP32" -> the last component.
    text = text.rsplit(".", 1)[-1]
    try:
        return _DTYPE_ALIASES[text]
    except KeyError:
        raise SchemaError(
            f"{where}: dtype must be one of 'int64', 'uint64', 'float32', got {dtype!r}"
        ) from None


@dataclass(frozen=True)
class Slot:
    """One slot of a MultiSlot record.

    Args:
        name: the slot's name, the key of its tensor in a ``Batch``.
        dtype: ``"int64"``, ``"uint64"`` or ``"float32"``.
        shape: ``None`` for a sparse slot (any positive number of values per
            record); a tuple of positive ints for a dense slot, which holds
            exactly ``prod(shape)`` values per record and is delivered as a
            tensor of shape ``[batch, *shape]``.
    """

    name: str
    dtype: str
    shape: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SchemaError(f"a slot name must be a non-empty str, got {self.name!r}")
        object.__setattr__(self, "dtype", _normalize_dtype(self.dtype, f"slot {self.name!r}"))
        if self.shape is not None:
            try:
                shape = tuple(int(d) for d in self.shape)
            except TypeError:
                shape = (int(self.shape),)  # a bare int: Slot("label", "int64", 1)
            if not shape or any(d < 1 for d in shape):
                raise SchemaError(
                    f"slot {self.name!r}: a dense shape must be positive ints, "
                    f"got {self.shape!r}"
                )
            object.__setattr__(self, "shape", shape)

    @property
    def is_dense(self) -> bool:
        """Whether the slot has a shape: exactly ``prod(shape)`` values per record."""
        return self.shape is not None

    @property
    def width(self) -> int:
        """Values per record of a dense slot; 0 for a sparse slot."""
        return math.prod(self.shape) if self.shape is not None else 0

    @property
    def kind(self) -> int:
        """The parser's code for the dtype (0 int64, 1 uint64, 2 float32)."""
        return _KINDS[self.dtype]

    @property
    def numpy_dtype(self) -> np.dtype:
        """The numpy dtype of the slot's values (uint64 for a uint64 slot)."""
        return _NUMPY_DTYPES[self.dtype]

    def __str__(self) -> str:
        shape = "" if self.shape is None else ":" + "x".join(map(str, self.shape))
        return f"{self.name}:{self.dtype}{shape}"


@dataclass(frozen=True)
class TextField(Slot):
    """A text field of each record that precedes its slots on a line.

    Paddle's ``parse_ins_id`` and ``parse_content`` lines begin with
    ``1 <ins_id>`` and ``1 <content>``. The parser keeps each such field as a
    column of its bytes after the slot columns, so that shuffles, the cache and
    global shuffle carry it with its record; a batch hands it out as a list of
    str (``Batch.ins_ids``, ``Batch.contents``), not as a slot.

    Args:
        name: the column's name (``INS_ID`` or ``CONTENT``).
        dtype: always ``"text"``.
        shape: always None.
    """

    dtype: str = "text"

    def __post_init__(self) -> None:
        if self.name not in TEXT_FIELD_LABELS:
            raise SchemaError(
                f"a text field is one of {', '.join(TEXT_FIELD_LABELS)}, got {self.name!r}"
            )
        if self.dtype != "text" or self.shape is not None:
            raise SchemaError(
                f"text field {self.name!r} has dtype 'text' and no shape, got "
                f"{self.dtype!r}, {self.shape!r}"
            )

    @property
    def label(self) -> str:
        """What the field is, for messages ("instance id", "content")."""
        return TEXT_FIELD_LABELS[self.name]


# The columns of the text fields, named so that no slot name can clash.
INS_ID = "__ins_id__"
CONTENT = "__content__"
TEXT_FIELD_LABELS = {INS_ID: "instance id", CONTENT: "content"}


def slot_from_var(var: Any) -> Slot:
    """Converts a ``Slot`` or a Paddle-style variable to a ``Slot``.

    A Paddle-style variable has ``name``, ``dtype``, ``shape`` and ``lod_level``:
    ``lod_level == 0`` is a dense slot whose shape is ``shape`` without its batch
    dimension (a leading ``-1`` or ``None``); ``lod_level >= 1`` is a sparse slot.
    A sparse int64 variable is a uint64 slot, as Paddle's ``_set_use_var`` makes
    it: feature ids up to 2**64 - 1 parse, and its tensors are int64 with the
    same bits (ids >= 2**63 read as negative).
    """
    if isinstance(var, TextField):
        raise SchemaError(
            f"use_var takes slots; the text field {var.name!r} is read with the "
            "parse_ins_id / parse_content settings"
        )
    if isinstance(var, Slot):
        return var
    missing = [a for a in ("name", "dtype", "shape", "lod_level") if not hasattr(var, a)]
    if missing:
        raise SchemaError(
            f"use_var entries must be datafeed.Slot or have name, dtype, shape and "
            f"lod_level attributes; {var!r} lacks {', '.join(missing)}"
        )
    name = var.name
    if var.lod_level:
        dtype = _normalize_dtype(var.dtype, f"variable {name!r}")
        return Slot(name, "uint64" if dtype == "int64" else dtype, None)
    shape = list(var.shape or ())
    if shape and (shape[0] is None or shape[0] == -1):
        shape = shape[1:]
    if any(d is None or d < 1 for d in shape):
        raise SchemaError(
            f"variable {name!r}: a dense (lod_level=0) variable needs a fixed shape "
            f"after the batch dimension, got {list(var.shape)!r}"
        )
    return Slot(name, var.dtype, tuple(shape) if shape else (1,))


class SlotSchema(Sequence[Slot]):
    """The ordered slots of a record; names are unique."""

    def __init__(self, slots: Iterable[Any]) -> None:
        self._slots = tuple(slot_from_var(s) for s in slots)
        self.text_fields: tuple[TextField, ...] = ()
        seen: set[str] = set()
        for slot in self._slots:
            if slot.name in seen:
                raise SchemaError(f"slot name {slot.name!r} appears twice in use_var")
            seen.add(slot.name)
        self._index = {s.name: i for i, s in enumerate(self._slots)}

    def __getitem__(self, index):  # type: ignore[override]
        return self._slots[index]

    def __len__(self) -> int:
        return len(self._slots)

    def __iter__(self) -> Iterator[Slot]:
        return iter(self._slots)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SlotSchema) and self._slots == other._slots

    def __hash__(self) -> int:
        return hash(self._slots)

    def __repr__(self) -> str:
        return f"SlotSchema([{', '.join(map(str, self._slots))}])"

    def with_text_fields(self, ins_id: bool, content: bool) -> SlotSchema:
        """The schema of records that also keep their instance id and/or content.

        The text fields come after the slots (``text_fields`` lists them), so
        slot ``i`` is still column ``i``; ``self`` when neither is asked for.
        """
        fields = [name for name, wanted in ((INS_ID, ins_id), (CONTENT, content)) if wanted]
        if not fields:
            return self
        record = SlotSchema(self._slots)
        record.text_fields = tuple(TextField(name) for name in fields)
        record._slots += record.text_fields
        record._index = {s.name: i for i, s in enumerate(record._slots)}
        return record

    @property
    def slots_only(self) -> SlotSchema:
        """The schema without its text fields."""
        if not self.text_fields:
            return self
        return SlotSchema(self._slots[: len(self._slots) - len(self.text_fields)])

    @property
    def names(self) -> tuple[str, ...]:
        """The slot names, in order."""
        return tuple(s.name for s in self._slots)

    def index(self, name: str) -> int:  # type: ignore[override]
        """The position of the slot named ``name`` (``SchemaError`` if none is)."""
        try:
            return self._index[name]
        except KeyError:
            raise SchemaError(
                f"no slot named {name!r}; the slots are {', '.join(self.names)}"
            ) from None
