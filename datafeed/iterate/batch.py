"""Batches: consecutive records of the store as torch tensors.

A dense slot becomes a tensor of shape ``[size, *shape]``; a sparse slot becomes a
``Ragged(values, offsets)``. Values are views of the store's arrays (no copy)
whenever a batch lies inside one chunk: treat them as read-only, and ``clone()``
a tensor before modifying it in place.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Union

import numpy as np

from ..config.slots import CONTENT, INS_ID, SlotSchema
from ..records.columns import RecordChunk, SlotColumn, concat_rows, uniform_offsets

if TYPE_CHECKING:
    import torch


class Ragged:
    """Variable-length values per record (a sparse slot of one batch).

    Record ``i`` holds ``values[offsets[i]:offsets[i + 1]]``. ``offsets`` is an
    int64 tensor of length ``size + 1`` starting at 0, so
    ``nn.EmbeddingBag(...)(r.values, r.offsets[:-1])`` works directly. uint64 slot
    values arrive as int64 tensors holding the same bits (as in Paddle).
    """

    __slots__ = ("offsets", "values")

    def __init__(self, values: torch.Tensor, offsets: torch.Tensor) -> None:
        self.values = values
        self.offsets = offsets

    @property
    def size(self) -> int:
        """Number of records."""
        return self.offsets.shape[0] - 1

    @property
    def lengths(self) -> torch.Tensor:
        """Values per record, int64 of length ``size``."""
        return self.offsets[1:] - self.offsets[:-1]

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        """The values of record ``index``."""
        if not -self.size <= index < self.size:
            raise IndexError(f"record index {index} out of range for {self.size} records")
        index %= self.size
        return self.values[self.offsets[index] : self.offsets[index + 1]]

    def tolist(self) -> list[list]:
        """The values as one Python list per record."""
        offsets = self.offsets.tolist()
        values = self.values.tolist()
        return [values[a:b] for a, b in itertools.pairwise(offsets)]

    def __repr__(self) -> str:
        return (
            f"Ragged(size={self.size}, values={self.values.shape[0]}, "
            f"dtype={self.values.dtype})"
        )


SlotTensor = Union["torch.Tensor", Ragged]


class Batch(Mapping[str, SlotTensor]):
    """One batch: slot name -> tensor (dense slot) or ``Ragged`` (sparse slot).

    ``len(batch)`` is the number of slots; ``batch.size`` the number of records.
    ``ins_ids`` and ``contents`` are the records' instance ids and content
    fields (Paddle's ``parse_ins_id`` / ``parse_content``), one str per record,
    or None when the dataset does not read them.
    """

    __slots__ = ("_slots", "contents", "ins_ids", "size")

    def __init__(
        self,
        slots: dict[str, SlotTensor],
        size: int,
        ins_ids: list[str] | None = None,
        contents: list[str] | None = None,
    ) -> None:
        self._slots = slots
        self.size = size
        self.ins_ids = ins_ids
        self.contents = contents

    def __getitem__(self, name: str) -> SlotTensor:
        try:
            return self._slots[name]
        except KeyError:
            raise KeyError(
                f"batch has no slot {name!r}; its slots are {', '.join(self._slots)}"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._slots)

    def __len__(self) -> int:
        return len(self._slots)

    def __repr__(self) -> str:
        return f"Batch(size={self.size}, slots=[{', '.join(self._slots)}])"


def text_values(column: SlotColumn, start: int, stop: int) -> list[str]:
    """Records ``start:stop`` of a text field's column (``slots.TextField``) as str.

    The bytes are decoded as UTF-8; bytes that are not UTF-8 come back as lone
    surrogates (``errors="surrogateescape"``), so ``s.encode("utf-8",
    "surrogateescape")`` gives the bytes of the line again.
    """
    part = column.slice(start, stop)
    data = part.values.tobytes()
    bounds = part.offsets_or_uniform().tolist()
    return [data[a:b].decode("utf-8", "surrogateescape") for a, b in itertools.pairwise(bounds)]


class BatchBuilder:
    """Turns row ranges of record chunks into ``Batch`` objects for one schema.

    Args:
        schema: the records' schema, text fields (``SlotSchema.with_text_fields``)
            included.
        one_batch_per_line: Paddle's ``input_type=1``: each record is a batch of
            its own, and each value of a sparse slot is a sequence of its own
            (offsets ``0, 1, ..., n``); dense slots are as usual.
    """

    def __init__(self, schema: SlotSchema, one_batch_per_line: bool = False) -> None:
        import torch  # here, not at module level: `import datafeed` stays torch-free

        self._torch = torch
        slots = schema.slots_only
        # What from_chunk needs of each slot, read once (it runs per batch per slot).
        # uint64 ids are viewed as int64: torch has no uint64 arithmetic worth
        # using, and Paddle delivers the same bits as int64.
        self._slots = [
            (slot.name, slot.is_dense, slot.shape, slot.numpy_dtype == np.uint64)
            for slot in slots
        ]
        # Text fields follow the slots' columns.
        self._text = [(len(slots) + i, f.name) for i, f in enumerate(schema.text_fields)]
        self._one_batch_per_line = one_batch_per_line
        self._offsets_cache: dict[tuple[int, int], torch.Tensor] = {}

    def _uniform_offsets(self, size: int, width: int) -> torch.Tensor:
        # A fresh arange per slot per batch costs more than the values view itself;
        # these are shared, so callers must not modify offsets in place.
        key = (size, width)
        offsets = self._offsets_cache.get(key)
        if offsets is None:
            if len(self._offsets_cache) > 64:
                self._offsets_cache.clear()
            offsets = self._torch.from_numpy(uniform_offsets(size, width, np.dtype(np.int64)))
            self._offsets_cache[key] = offsets
        return offsets

    def from_chunk(self, chunk: RecordChunk, start: int, stop: int) -> Batch:
        """Records ``start:stop`` of one chunk, as views where the layout allows."""
        size = stop - start
        from_numpy = self._torch.from_numpy
        slots: dict[str, SlotTensor] = {}
        for (name, dense, shape, unsigned), column in zip(
            self._slots, chunk.columns, strict=False  # text fields: below
        ):
            off = column.offsets
            if off is None:
                w = column.width
                values = column.values[start * w : stop * w]
            else:
                lo, hi = int(off[start]), int(off[stop])
                values = column.values[lo:hi]
            values = from_numpy(values.view(np.int64) if unsigned else values)
            if dense:
                slots[name] = values.view(size, *shape)
            elif off is None:
                slots[name] = Ragged(values, self._uniform_offsets(size, w))
            else:
                # Rebased and widened to torch's int64 in one pass (the store
                # keeps int32 offsets: 4 bytes per record per slot less).
                offsets = np.subtract(off[start : stop + 1], lo, dtype=np.int64)
                slots[name] = Ragged(values, from_numpy(offsets))
            if self._one_batch_per_line and not dense:
                # Paddle's input_type=1: every value its own sequence.
                slots[name] = Ragged(values, self._uniform_offsets(values.shape[0], 1))
        if not self._text:
            return Batch(slots, size)
        texts = {name: text_values(chunk.columns[i], start, stop) for i, name in self._text}
        return Batch(slots, size, texts.get(INS_ID), texts.get(CONTENT))

    def from_pieces(self, pieces: list[tuple[RecordChunk, int, int]]) -> Batch:
        """A batch that spans several chunks: the pieces are copied together."""
        if len(pieces) == 1:
            return self.from_chunk(*pieces[0])
        return self.from_chunk(concat_rows(pieces), 0, sum(b - a for _, a, b in pieces))
