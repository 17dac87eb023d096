"""datafeed.reorder.hashing: XXH64 as its specification and Paddle's routing define it."""

from __future__ import annotations

import numpy as np
import pytest

from datafeed.records.columns import SlotColumn
from datafeed.reorder.hashing import ins_id_ranks, uid_problem, uid_ranks, xxh64

SENTENCE = b"Nobody inspects the spammish repetition"
# Published XXH64 values (seed 0 and seed 0x9E3779B1): empty, short, the 8-byte,
# 4-byte and 1-byte tails, one 32-byte stripe, and 8 stripes.
VECTORS = [
    (b"", 0xEF46DB3751D8E999, 0xAC75FDA2929B17EF),
    (b"a", 0xD24EC4F1A98C6E5B, None),
    (b"abc", 0x44BC2CF5AD770999, 0x1318DF30094A85FD),
    (SENTENCE, 0xFBCEA83C8A378BF1, 0x56DB22DD5B051147),
    (bytes(range(256)), 0x1FACBE8406CD904B, 0xD48195F45908996C),
]


def _pack(strings: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    data = np.frombuffer(b"".join(strings), np.uint8)
    return data, np.cumsum([0] + [len(s) for s in strings])


@pytest.mark.parametrize("seed, column", [(0, 1), (0x9E3779B1, 2)])
def test_xxh64_gives_the_published_values(seed: int, column: int) -> None:
    vectors = [v for v in VECTORS if v[column] is not None]
    data, offsets = _pack([v[0] for v in vectors])
    assert xxh64(data, offsets, seed).tolist() == [v[column] for v in vectors]
    # In any order and mixed with strings of other lengths, each alone.
    for string, *values in vectors:
        data, offsets = _pack([b"x" * 40, string, b"yz"])
        assert int(xxh64(data, offsets, seed)[1]) == values[column - 1]


def test_ins_id_ranks_of_uniform_and_ragged_columns_agree() -> None:
    ids = [b"%06d" % i for i in range(1000)]
    data, offsets = _pack(ids)
    ragged = SlotColumn(data, offsets.astype(np.int64), 0)
    uniform = SlotColumn(data, None, 6)
    hashes = xxh64(data, offsets)
    for world in (2, 3, 7):
        expected = (hashes % np.uint64(world)).astype(np.int64)
        assert np.array_equal(ins_id_ranks(ragged, world), expected)
        assert np.array_equal(ins_id_ranks(uniform, world), expected)
        assert set(expected.tolist()) == set(range(world))  # ids spread over every rank


def test_uid_ranks_hash_each_uids_eight_little_endian_bytes() -> None:
    uids = np.array([0, 1, 2**63, 2**64 - 1, 123_456_789_012], dtype=np.uint64)
    as_bytes = [int(u).to_bytes(8, "little") for u in uids.tolist()]
    data, offsets = _pack(as_bytes)
    hashes = xxh64(data, offsets)  # xxh64 itself is checked against published values above
    uniform = SlotColumn(uids, None, 1)
    ragged = SlotColumn(uids, np.arange(len(uids) + 1, dtype=np.int32), 0)
    for world in (2, 3, 7):
        expected = (hashes % np.uint64(world)).astype(np.int64).tolist()
        assert uid_ranks(uniform, world).tolist() == expected
        assert uid_ranks(ragged, world).tolist() == expected
    assert uid_problem(uniform, len(uids)) == -1
    assert uid_problem(ragged, len(uids)) == -1


@pytest.mark.parametrize(
    ("column", "rows", "first_bad"),
    [
        (SlotColumn(np.arange(5, dtype=np.uint64), np.array([0, 1, 3, 4, 5]), 0), 4, 1),
        (SlotColumn(np.arange(3, dtype=np.uint64), np.array([0, 1, 1, 2, 3]), 0), 4, 1),
        (SlotColumn(np.arange(4, dtype=np.uint64), None, 2), 2, 0),
        (SlotColumn(np.arange(0, dtype=np.uint64), None, 0), 3, 0),
        (SlotColumn(np.arange(0, dtype=np.uint64), None, 1), 0, -1),
    ],
    ids=["two uids", "no uid", "fixed width 2", "width 0", "empty"],
)
def test_a_record_without_exactly_one_uid_is_found(column, rows, first_bad) -> None:
    assert uid_problem(column, rows) == first_bad
