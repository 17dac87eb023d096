"""XXH64 of many byte strings at once, in numpy: where merge by line id, or a
shuffle by uid, sends a record.

Paddle's global shuffle, with merge by line id on, sends each record to worker
``XXH64(ins_id, seed=0) % trainer_num`` (``DatasetImpl::GlobalShuffle``), so that
the records of one instance id meet on one worker; with shuffle by uid, to the
worker its uid (one uint64 per record, read from the uid slot) hashes to.
``ins_id_ranks`` and ``uid_ranks`` do the same here: XXH64 is fixed by its
specification (xxHash 0.8, little-endian reads), so every rank, every Python
version and Paddle itself agree on it.
Python's ``hash()`` would not do: it is salted per process for bytes.

``xxh64`` hashes ``n`` strings held as one byte buffer and ``n + 1`` offsets,
the strings of one length at a time as the rows of a byte matrix, so each
step of the algorithm is one numpy pass over all of them (about 80 ms for 1M
ids of 16 bytes, or of 1 to 6 bytes, on a 2-core machine).
"""

from __future__ import annotations

import numpy as np

from ..records.columns import SlotColumn

_MASK = (1 << 64) - 1
P1 = 0x9E3779B185EBCA87
P2 = 0xC2B2AE3D27D4EB4F
P3 = 0x165667B19E3779F9
P4 = 0x85EBCA77C2B2AE63
P5 = 0x27D4EB2F165667C5
_P1, _P2, _P3, _P4, _P5 = (np.uint64(p) for p in (P1, P2, P3, P4, P5))


def _rotl(x: np.ndarray, bits: int) -> np.ndarray:
    return (x << np.uint64(bits)) | (x >> np.uint64(64 - bits))


def _round(acc: np.ndarray, lane: np.ndarray) -> np.ndarray:
    acc = acc + lane * _P2
    return _rotl(acc, 31) * _P1


def _merge_round(acc: np.ndarray, value: np.ndarray) -> np.ndarray:
    acc = acc ^ _round(np.zeros_like(value), value)
    return acc * _P1 + _P4


def _words(block: np.ndarray, at: int, width: int) -> np.ndarray:
    """Column ``at`` of ``width`` bytes of every row of ``block``, as little-endian
    unsigned ints (uint64)."""
    part = np.ascontiguousarray(block[:, at : at + width])
    return part.view(f"<u{width}").reshape(-1).astype(np.uint64)


def xxh64(data: np.ndarray, offsets: np.ndarray, seed: int = 0) -> np.ndarray:
    """XXH64 of each ``data[offsets[i]:offsets[i + 1]]``, as uint64.

    Args:
        data: the bytes of every string, back to back (any 1-byte dtype).
        offsets: ``n + 1`` ascending offsets into ``data``.
        seed: XXH64's seed (Paddle uses 0).
    """
    data = np.asarray(data).view(np.uint8).reshape(-1)
    offsets = np.asarray(offsets, dtype=np.int64)
    starts, lengths = offsets[:-1], np.diff(offsets)
    hashes = np.empty(len(starts), dtype=np.uint64)
    if not len(starts):
        return hashes
    # The strings of one length at a time, as the rows of a byte matrix: every
    # step of the algorithm is then one numpy pass over all of them.
    by_length = np.argsort(lengths, kind="stable")
    sorted_lengths = lengths[by_length]
    edges = np.flatnonzero(np.diff(sorted_lengths)) + 1
    for rows in np.split(by_length, edges):
        length = int(lengths[rows[0]])
        first = int(starts[rows[0]])
        if len(rows) == len(starts) and first == 0 and len(data) >= length * len(rows) and (
            np.array_equal(starts, np.arange(0, length * len(rows), length))
        ):
            block = data[: length * len(rows)].reshape(len(rows), length)  # no copy
        else:
            block = data[starts[rows][:, None] + np.arange(length)]
        hashes[rows] = _hash_rows(block, seed)
    return hashes


def _hash_rows(block: np.ndarray, seed: int) -> np.ndarray:
    """XXH64 of each row of a (strings, length) byte matrix."""
    count, length = block.shape
    seed_value = np.uint64(seed & _MASK)
    with np.errstate(over="ignore"):
        at = 0
        if length >= 32:
            lanes = [
                np.full(count, seed_value + _P1 + _P2, np.uint64),
                np.full(count, seed_value + _P2, np.uint64),
                np.full(count, seed_value, np.uint64),
                np.full(count, seed_value - _P1, np.uint64),
            ]
            while at + 32 <= length:
                for index in range(4):
                    lanes[index] = _round(lanes[index], _words(block, at + 8 * index, 8))
                at += 32
            acc = (_rotl(lanes[0], 1) + _rotl(lanes[1], 7) + _rotl(lanes[2], 12)
                   + _rotl(lanes[3], 18))
            for lane in lanes:
                acc = _merge_round(acc, lane)
        else:
            acc = np.full(count, seed_value + _P5, np.uint64)
        acc += np.uint64(length)
        while at + 8 <= length:
            lane = _round(np.zeros(count, np.uint64), _words(block, at, 8))
            acc = _rotl(acc ^ lane, 27) * _P1 + _P4
            at += 8
        if at + 4 <= length:
            acc = _rotl(acc ^ (_words(block, at, 4) * _P1), 23) * _P2 + _P3
            at += 4
        while at < length:
            acc = _rotl(acc ^ (block[:, at].astype(np.uint64) * _P5), 11) * _P1
            at += 1
        acc ^= acc >> np.uint64(33)
        acc *= _P2
        acc ^= acc >> np.uint64(29)
        acc *= _P3
        acc ^= acc >> np.uint64(32)
    return acc


def ins_id_ranks(column: SlotColumn, world: int) -> np.ndarray:
    """The rank each record of an instance-id column goes to:
    ``XXH64(ins_id, 0) % world``, as Paddle's global shuffle sends it (int64)."""
    hashes = xxh64(column.values, column.offsets_or_uniform())
    return (hashes % np.uint64(world)).astype(np.int64)


def uid_problem(column: SlotColumn, rows: int) -> int:
    """The first of the ``rows`` records of a uid column that does not hold
    exactly one value, or -1."""
    if column.offsets is None:
        return -1 if column.width == 1 or rows == 0 else 0
    wrong = np.flatnonzero(np.diff(column.offsets[: rows + 1]) != 1)
    return int(wrong[0]) if len(wrong) else -1


def uid_ranks(column: SlotColumn, world: int) -> np.ndarray:
    """The rank each record of a uid column goes to: ``XXH64`` of its uid's 8
    little-endian bytes, seed 0, ``% world`` (int64); every record holds one
    uint64 (``uid_problem`` is -1)."""
    values = np.ascontiguousarray(column.values, dtype="<u8")
    offsets = np.arange(0, 8 * (len(values) + 1), 8, dtype=np.int64)
    hashes = xxh64(values.view(np.uint8), offsets)
    return (hashes % np.uint64(world)).astype(np.int64)
