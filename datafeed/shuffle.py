"""Seeded shuffles of the record store.

Every shuffle takes an explicit seed (drawn from the OS and logged when the user
gives none), so any shuffle can be reproduced from the log or the state dict.
"""

from __future__ import annotations

import logging
import secrets

import numpy as np

from .store import RecordStore

logger = logging.getLogger("datafeed")


def fresh_seed() -> int:
    """A random 63-bit seed from the OS, for shuffles the user did not seed."""
    return secrets.randbits(63)


def derive_seed(base_seed: int, counter: int) -> int:
    """The seed of the ``counter``-th shuffle of a dataset seeded with ``base_seed``.

    Each successive shuffle differs, and the sequence is a function of the base seed.
    """
    state = np.random.SeedSequence([base_seed, counter]).generate_state(2, np.uint32)
    return int(state[0]) << 31 ^ int(state[1])


def permutation(rows: int, seed: int) -> np.ndarray:
    """A uniformly random permutation of ``range(rows)`` determined by ``seed``."""
    return np.random.default_rng(seed).permutation(rows)


def local_shuffle(store: RecordStore, seed: int, threads: int = 2) -> RecordStore:
    """The store's records in a random order determined by ``seed``."""
    return store.take(permutation(store.rows, seed), threads=threads)
