"""Rows pulled for the batches to come, before the forwards that need them.

A parameter-server worker's training forward waits a round trip for its rows.
But the training loop holds the batches to come, and the ids they will pull
are in them: when a table's ids are a slot of the batch as it comes (the model
passes ``batch["u"]`` to its ``SparseEmbedding``), the pull for a batch
``depth`` steps ahead can be sent now, and its rows are there when its forward
asks.

Which slot feeds which table is learned from the forwards: during the forward
of a batch (``PullAhead.forward``), each training pull that was not sent ahead
reports its ids (``learn``), and the slot whose tensor *is* those ids (a dense
slot, or a ``Ragged``'s values) becomes a source of that table. A table whose
ids the model computes (concatenated slots, hashed ids) has no source and is
pulled in its forward as before. A pull sent ahead that its forward does not
take (the model skipped the table, or changed the ids in place) is dropped,
and the table's source forgotten, with a warning: the model always trains on
the rows of the ids it pulled.

Staleness: a row pulled ahead is read from the servers when its pull is sent,
up to ``depth`` steps before its forward, so it may miss the pushes of the
steps in between (async mode's arrival order already allows a worker's rows to
miss other workers' pushes). ``depth`` is set (``a_sync_configs["pull_ahead"]``)
or, by default, chosen from the measured round trip over the step's own time.
"""

from __future__ import annotations

import collections
import logging
import math
import statistics
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch

from ..job.strategy import PULL_AHEAD_MAX
from .tables import TableConfig, registered_config

__all__ = [
    "MAX_DEPTH", "AheadStore", "PendingPull", "PullAhead", "add_network_wait", "current",
]

log = logging.getLogger("trainer.embedding")

# The deepest a pull is sent ahead: the staleness bound of the automatic
# depth, and what a server keeps of a worker's pulls for their pushes.
MAX_DEPTH = PULL_AHEAD_MAX
# The depth is chosen again every this many batches, from the last SAMPLES.
_CHOOSE_EVERY = 8
_SAMPLES = 32


class PendingPull(Protocol):
    """A training pull sent to the servers, its rows not yet taken."""

    sent_at: float  # time.perf_counter() when sent
    done_at: float | None  # when its last answer came (None: not yet)

    def rows(self) -> list[torch.Tensor]:
        """The rows of each table pulled, in order, waited for."""
        ...


class AheadStore(Protocol):
    """A row store that can send a training pull now and hand its rows later."""

    pull_ahead: int | None  # the configured depth: None automatic, 0 off
    ahead_depth: int  # the depth in use (the async step bounds its pushes by it)

    def send_pull(self, configs: Sequence[TableConfig], ids: torch.Tensor) -> PendingPull:
        """Sends the training pull of distinct ``ids`` from each table of ``configs``."""
        ...


_current = threading.local()
# (slot, table) pairs whose pulls ahead went untaken, warned about once a process.
_warned: set[tuple[str, str]] = set()


def current() -> PullAhead | None:
    """The ``PullAhead`` whose forward this thread runs, if any."""
    return getattr(_current, "ahead", None)


def add_network_wait(seconds: float) -> None:
    """Counts ``seconds`` this thread waited for the servers (a pull sent
    ahead, or a push in flight): the depth is chosen from the steps' time
    without them."""
    _current.waited = getattr(_current, "waited", 0.0) + seconds


def _network_waits() -> float:
    return getattr(_current, "waited", 0.0)


class _SlotPull:
    """The pull sent for one slot of a batch: the slot's ids tensor (and its
    version then), their distinct ids, the pull of the tables reading them,
    and the tables whose rows are not taken yet."""

    __slots__ = ("ids", "inverse", "names", "pending", "unique", "version", "waiting")

    def __init__(
        self, ids: torch.Tensor, unique: torch.Tensor, inverse: torch.Tensor,
        names: list[str], pending: PendingPull,
    ) -> None:
        self.ids = ids
        self.version = ids._version
        self.unique = unique
        self.inverse = inverse
        self.names = names
        self.pending = pending
        self.waiting = set(names)


class PullAhead:
    """One training thread's pulls sent ahead, for one pass.

    The loop asks ``wanted()`` how many batches to hold beyond the one it
    trains, ``send(batch)`` for each held batch once, and runs each forward
    inside ``forward(batch)``.

    Args:
        store: where the pulls go.
        distinct: ``ids -> (unique, inverse)`` as the forward's own pull makes them.
    """

    def __init__(self, store: AheadStore, distinct: Any) -> None:
        self.store = store
        self._distinct = distinct
        self.depth = store.pull_ahead if store.pull_ahead is not None else 1
        self.automatic = store.pull_ahead is None
        store.ahead_depth = max(store.ahead_depth, self.depth)
        self._sources: dict[str, list[str]] = {}  # slot -> tables that read it, in order
        self._forgotten: set[tuple[str, str]] = set()  # (slot, table) not learned again
        self._sent: dict[int, dict[str, _SlotPull]] = {}  # id(batch) -> slot -> pull
        self._in_forward: dict[str, _SlotPull] | None = None
        self._forward_batch: Any = None
        self._flights: collections.deque[float] = collections.deque(maxlen=_SAMPLES)
        self._steps: collections.deque[float] = collections.deque(maxlen=_SAMPLES)
        self._last_start: float | None = None
        self._last_waited = 0.0
        self._batches = 0
        self.sent_pulls = 0
        self.taken_pulls = 0

    # -- the loop's side --------------------------------------------------------------

    def wanted(self) -> int:
        """How many batches to hold beyond the one being trained."""
        return self.depth

    def send(self, batch: Any) -> None:
        """Sends the pulls of ``batch`` whose sources are known (once a batch)."""
        if id(batch) in self._sent or not self._sources or not isinstance(batch, Mapping):
            return
        sent: dict[str, _SlotPull] = {}
        for slot, names in self._sources.items():
            ids = _slot_ids(batch.get(slot))
            configs = [registered_config(name) for name in names]
            if ids is None or any(c is None for c in configs):
                continue  # not there, or a table whose module is gone: pulled as it comes
            unique, inverse = self._distinct(ids)
            pending = self.store.send_pull(configs, unique)
            sent[slot] = _SlotPull(ids, unique, inverse, list(names), pending)
            self.sent_pulls += 1
        self._sent[id(batch)] = sent

    def forward(self, batch: Any) -> _Forward:
        """The context of ``batch``'s forward: its pulls take what was sent."""
        return _Forward(self, batch)

    def close(self) -> None:
        """Drops the pulls of batches never trained (the pass stopped early)."""
        self._sent.clear()

    # -- the forward's side -----------------------------------------------------------

    def take(
        self, config: TableConfig, ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """The ``(unique, inverse, rows)`` of a pull sent ahead for these very
        ``ids`` and table, or None (pull them now)."""
        sent = self._in_forward
        if sent is None:
            return None
        slot = _slot_of(self._forward_batch, ids)
        pull = None if slot is None else sent.get(slot)
        if pull is None or config.name not in pull.waiting or pull.version != ids._version:
            return None  # not sent, taken already, or changed in place since
        first = len(pull.waiting) == len(pull.names)
        pull.waiting.discard(config.name)
        started = time.perf_counter()
        rows = pull.pending.rows()
        add_network_wait(time.perf_counter() - started)
        self.taken_pulls += 1
        done_at = pull.pending.done_at
        if first and done_at is not None:
            self._flights.append(done_at - pull.pending.sent_at)
        return pull.unique, pull.inverse, rows[pull.names.index(config.name)]

    def learn(self, config: TableConfig, ids: torch.Tensor) -> None:
        """A pull made in the forward: if ``ids`` is a slot of the batch, that
        slot becomes a source of the table."""
        slot = _slot_of(self._forward_batch, ids)
        if slot is None or (slot, config.name) in self._forgotten:
            return
        names = self._sources.setdefault(slot, [])
        if config.name not in names:
            names.append(config.name)

    def _begin(self, batch: Any) -> None:
        # A step's own time: from one forward to the next, less its waits.
        now, waited = time.perf_counter(), _network_waits()
        if self._last_start is not None:
            self._steps.append(now - self._last_start - (waited - self._last_waited))
        self._last_start, self._last_waited = now, waited
        self._forward_batch = batch
        self._in_forward = self._sent.pop(id(batch), None)
        _current.ahead = self

    def _end(self, failed: bool) -> None:
        _current.ahead = None
        sent, self._in_forward, self._forward_batch = self._in_forward, None, None
        if sent is not None and not failed:
            for slot, pull in sent.items():
                for name in sorted(pull.waiting):
                    self._forget(slot, name)
        self._batches += 1
        if self.automatic and self._batches % _CHOOSE_EVERY == 0:
            self._choose_depth()

    def _forget(self, slot: str, name: str) -> None:
        self._forgotten.add((slot, name))
        names = self._sources.get(slot, [])
        if name in names:
            names.remove(name)
            if not names:
                del self._sources[slot]
            if (slot, name) in _warned:
                return
            _warned.add((slot, name))
            log.warning(
                "table '%s' was pulled ahead from slot '%s' but its forward did not take "
                "those rows (it pulled other ids, or changed the slot in place): its rows "
                "are pulled in the forward for the rest of this pass", name, slot,
            )

    def _choose_depth(self) -> None:
        """Enough batches ahead to cover a round trip with steps of this
        thread (their own time, without their waits for the servers)."""
        if len(self._flights) < 4 or len(self._steps) < 4:
            return
        step = statistics.median(self._steps)
        # The round trip as the network gives it: a low quantile, since a busy
        # server's queue lengthens flights, and going deeper would only lengthen it.
        flights = sorted(self._flights)
        flight = flights[(len(flights) - 1) // 4]
        if step <= 0:
            return
        depth = min(MAX_DEPTH, max(1, math.ceil(flight / step)))
        if depth != self.depth:
            self.depth = depth
            self.store.ahead_depth = depth


class _Forward:
    __slots__ = ("ahead", "batch")

    def __init__(self, ahead: PullAhead, batch: Any) -> None:
        self.ahead = ahead
        self.batch = batch

    def __enter__(self) -> None:
        self.ahead._begin(self.batch)

    def __exit__(self, kind: Any, *_: Any) -> None:
        self.ahead._end(kind is not None)


def _slot_ids(value: Any) -> torch.Tensor | None:
    """The ids tensor a slot value hands a SparseEmbedding: a dense int64
    tensor, or a ``Ragged``'s values."""
    if not isinstance(value, torch.Tensor):
        values = getattr(value, "values", None)
        value = values if hasattr(value, "offsets") else None
    # A forward's uint64 ids are a view made there: never this tensor.
    return value if isinstance(value, torch.Tensor) and value.dtype == torch.int64 else None


def _slot_of(batch: Any, ids: torch.Tensor) -> str | None:
    """The slot of ``batch`` whose ids tensor is ``ids`` itself."""
    if not isinstance(batch, Mapping):
        return None
    for slot, value in batch.items():
        if value is ids or getattr(value, "values", None) is ids:
            return slot
    return None

