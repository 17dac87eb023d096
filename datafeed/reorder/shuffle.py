"""Seeded shuffles of the record store.

Every shuffle takes an explicit seed (drawn from the OS and logged when the user
gives none), so any shuffle can be reproduced from the log or the state dict.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

import numpy as np

# numpy imports numpy.random on first use: 6 ms that would land on a user's
# first shuffle (and make it the slowest of a run's); here it lands on import.
from numpy.random import SeedSequence, default_rng

from ..records.store import RecordStore

logger = logging.getLogger("datafeed")


def fresh_seed() -> int:
    """A random 63-bit seed from the OS, for shuffles the user did not seed."""
    return secrets.randbits(63)


def derive_seed(base_seed: int, counter: int) -> int:
    """The seed of the ``counter``-th shuffle of a dataset seeded with ``base_seed``.

    Each successive shuffle differs, and the sequence is a function of the base seed.
    """
    state = SeedSequence([base_seed, counter]).generate_state(2, np.uint32)
    return int(state[0]) << 31 ^ int(state[1])


def permutation(rows: int, seed: int) -> np.ndarray:
    """A uniformly random permutation of ``range(rows)`` determined by ``seed``."""
    return default_rng(seed).permutation(rows)


def local_shuffle(store: RecordStore, seed: int) -> RecordStore:
    """The store's records in a random order determined by ``seed``: a new
    order of the same chunks (8 bytes per record), no record copied."""
    return store.reordered(permutation(store.rows, seed))


class ShuffleHistory:
    """The shuffles behind the order of the records in memory (for ``state_dict()``).

    Every shuffle is seeded, so the records loaded again and these shuffles
    replayed give the same order (datafeed/iterate/state.py).

    Attributes:
        counter: shuffles done so far; the next seed derived from the ``seed``
            setting depends on it, so every shuffle differs.
        last_seed: the seed of the last shuffle (None before the first).
        entries: one per shuffle since the records were loaded:
            ``("local", seed)``, ``("global", seed, world)`` or
            ``("slots", seed, [slot names])``.
        records_before: the records in memory before the first of ``entries``
            (a replay starts from them).
    """

    def __init__(self) -> None:
        self.counter = 0
        self.last_seed: int | None = None
        self.entries: list[tuple[Any, ...]] = []
        self.records_before = 0

    def derived_seed(self, base_seed: int | None) -> int | None:
        """The next shuffle's seed derived from ``base_seed`` (the ``seed``
        setting), or None without one."""
        return None if base_seed is None else derive_seed(base_seed, self.counter)

    def next_seed(self, base_seed: int | None) -> int:
        """The next shuffle's seed: derived from ``base_seed``, else fresh from the OS."""
        seed = self.derived_seed(base_seed)
        return fresh_seed() if seed is None else seed

    def note(self, entry: tuple[Any, ...], rows_before: int) -> None:
        """Records a shuffle done on ``rows_before`` records (its seed is ``entry[1]``)."""
        if not self.entries:
            self.records_before = rows_before
        self.entries.append(entry)
        self.last_seed = entry[1]

    def forget_order(self) -> None:
        """The records were released: no shuffle is behind the (empty) order any
        more (the counter goes on, so later seeds still differ)."""
        self.entries, self.records_before = [], 0
