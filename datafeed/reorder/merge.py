"""Merge by line id: the records of one instance id become one record.

Paddle's ``MergeByInsId`` (``_set_merge_by_lineid``, run by ``global_shuffle``
after the shuffle), on the records in memory. Records are grouped by instance
id (``parse_ins_id``); a group becomes one record when

- ``merge_size > 0`` and it has exactly ``merge_size`` records (with
  ``merge_size <= 0``, any number); other groups are dropped;
- no sparse slot holds a value in two of its records; a group where one does
  (a "conflict") is dropped. A value counts when it is not zero (a float when
  its magnitude is at least 1e-6), as Paddle's in-memory feed keeps only those:
  a slot padded with ``1 0`` holds no value.

The merged record takes each sparse slot from the one record of the group
where it holds values (from the first record when none does: its padding),
each dense slot from the last record where it is not all zeros (else from the
first record), and the instance id and content of the first record. The
merged records are then shuffled (a seeded permutation). Records keep their
order in memory within a group (a stable sort by id), so the outcome is a
function of the records, their order and the seed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from ..config.errors import SchemaError
from ..config.slots import INS_ID, Slot, SlotSchema
from ..records.columns import SlotColumn
from ..records.store import RecordStore

logger = logging.getLogger("datafeed")

# Paddle's in-memory feed drops float values below this magnitude.
FLOAT_ZERO = 1e-6


@dataclass(frozen=True)
class MergeCounts:
    """What a merge did, in records.

    Attributes:
        records: records before the merge.
        merged: records after it (one per surviving group).
        dropped_size: records of groups of another size than ``merge_size``.
        dropped_conflict: records of groups where a sparse slot held values
            in two records.
    """

    records: int
    merged: int
    dropped_size: int
    dropped_conflict: int


def _has_values(column: SlotColumn, slot: Slot) -> np.ndarray:
    """Per record of ``column``: whether it holds a value that is not zero."""
    values = column.values
    nonzero = np.abs(values) >= FLOAT_ZERO if slot.dtype == "float32" else values != 0
    sums = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(nonzero, out=sums[1:])
    offsets = column.offsets_or_uniform()
    return sums[offsets[1:]] > sums[offsets[:-1]]


def _ids(column: SlotColumn) -> np.ndarray:
    """The instance ids of a text column, as an array numpy can sort (bytes order)."""
    if column.offsets is None and column.width:
        # Ids of one length: a zero-copy view as fixed-width byte strings.
        return column.values.view(f"S{column.width}")
    data = column.values.tobytes()
    bounds = column.offsets_or_uniform().tolist()
    ids = np.empty(len(bounds) - 1, dtype=object)
    ids[:] = [data[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return ids


def _text(ins_id: bytes) -> str:
    return bytes(ins_id).decode("utf-8", "replace")


def check_ins_ids(schema: SlotSchema) -> None:
    """Raises ``SchemaError`` unless records of ``schema`` carry their instance ids."""
    if INS_ID not in schema.names:
        raise SchemaError(
            "merge by line id needs each record's instance id: set parse_ins_id=True "
            "(lines then start with '1 <ins_id>') and load the files again"
        )


def merge_by_ins_id(
    store: RecordStore, merge_size: int, seed: int
) -> tuple[RecordStore, MergeCounts]:
    """The records of ``store`` merged by instance id (see the module docstring).

    Args:
        store: records whose schema has the instance id (``parse_ins_id``).
        merge_size: the group size kept (> 0), or any size (<= 0).
        seed: the seed of the shuffle of the merged records.

    Raises:
        SchemaError: the records carry no instance ids.
    """
    schema = store.schema
    check_ins_ids(schema)
    rows = store.rows
    if rows == 0:
        return store, MergeCounts(0, 0, 0, 0)
    # Read a column at a time in the store's order (a copy of one column at
    # most): the records themselves are gathered once, into the merged store.
    slots = schema.slots_only
    columns = store.columns_in_order([schema.index(INS_ID), *range(len(slots))])
    ids = _ids(next(columns))
    order = np.argsort(ids, kind="stable")
    ids = ids[order]
    starts = np.flatnonzero(np.concatenate(([True], ids[1:] != ids[:-1])))
    sizes = np.diff(np.append(starts, rows))
    keep = sizes == merge_size if merge_size > 0 else np.ones(len(starts), dtype=bool)
    dropped_size = int(sizes[~keep].sum())
    if dropped_size:
        group = int(np.flatnonzero(~keep)[0])
        logger.warning(
            "merge by line id: dropped %d records in groups of another size than "
            "merge_size=%d (e.g. instance id %r, %d records)",
            dropped_size, merge_size, _text(ids[starts[group]]), int(sizes[group]),
        )
    position = np.arange(rows)
    conflict = np.zeros(len(starts), dtype=bool)
    conflict_slot = np.full(len(starts), -1)
    sources: list[np.ndarray] = []  # per slot: the sorted position of its source record
    for index, slot in enumerate(slots):
        held = _has_values(next(columns), slot)[order]
        # The last record of each group that holds values, else the group's first.
        last = np.maximum.reduceat(np.where(held, position, -1), starts)
        sources.append(np.where(last >= 0, last, starts))
        if not slot.is_dense:
            twice = np.add.reduceat(held.astype(np.int64), starts) > 1
            conflict_slot[twice & ~conflict] = index
            conflict |= twice
    dropped = keep & conflict
    dropped_conflict = int(sizes[dropped].sum())
    if dropped_conflict:
        first_group = int(np.flatnonzero(dropped)[0])
        logger.warning(
            "merge by line id: dropped %d records in groups where a sparse slot holds "
            "values in two records (e.g. instance id %r, slot %r)",
            dropped_conflict, _text(ids[starts[first_group]]),
            slots[int(conflict_slot[first_group])].name,
        )
    groups = np.flatnonzero(keep & ~conflict)
    groups = groups[np.random.default_rng(seed).permutation(len(groups))]
    firsts = order[starts[groups]]
    picks = [order[source[groups]] for source in sources]
    picks += [firsts] * len(schema.text_fields)  # the first record's id and content
    merged = store.take_per_column(picks)
    counts = MergeCounts(rows, len(groups), dropped_size, dropped_conflict)
    logger.info(
        "merge by line id: %d records -> %d merged records (%d dropped: %d by size, "
        "%d by conflict)",
        rows, counts.merged, dropped_size + dropped_conflict, dropped_size, dropped_conflict,
    )
    return merged, counts
