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
pulled in its forward as before. A forward takes a pull sent ahead only for
the very tensor it was sent for, unchanged since (not replaced, not changed in
place); a pull its forward does not take is dropped, and that table's source
forgotten for the pass, with a warning: the model always trains on the rows of
the ids it pulled. (The servers counted the dropped pull's shows and created
its rows when it arrived, as for any training pull.)

Staleness: a row pulled ahead is read from the servers when its pull is sent,
up to ``depth`` steps of its thread before its forward, so it may miss the
pushes of the steps in between, and those of the thread's earlier steps still
in flight then: up to ``depth`` plus ``pushes_in_flight`` of the thread's own
steps (with no pull ahead, the pushes in flight alone; async mode's arrival
order already allows a worker's rows to miss other workers' pushes). The
thread keeps up to as many pushes in flight (``thread_depth``; bounded by
``pushes_in_flight`` in trainer/ps/modes.py, since those let the dense
parameters lag). ``depth`` is set
(``a_sync_configs["pull_ahead"]``) or, by default, follows the waits measured:
every 8 batches it goes deeper while forwards and steps still wait for the
servers, back where going deeper did not cut those waits as a round trip
would (the servers are the limit then: more in flight would only queue
there), and shallower while every pull was answered a whole step before it
was needed.
"""

from __future__ import annotations

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
    "thread_depth",
]

log = logging.getLogger("trainer.embedding")

# The deepest a pull is sent ahead: the staleness bound of the automatic
# depth, and what a server keeps of a worker's pulls for their pushes.
MAX_DEPTH = PULL_AHEAD_MAX
# The automatic depth is chosen again after every this many batches.
_WINDOW = 8
# Waits under this share of a step's own time (plus a floor for timer noise)
# are not worth a deeper pipeline.
_WAIT_SHARE = 0.05
_WAIT_FLOOR = 20e-6
# A deepening helped if it cut at least this share of the waits that going
# that much deeper cuts when the round trip is the limit.
_GAIN_SHARE = 0.5
# After a deepening that did not help, the depth stays at most where it was
# for this many windows before it may try again.
_CEILING_WINDOWS = 32


class PendingPull(Protocol):
    """A training pull sent to the servers, its rows not yet taken."""

    sent_at: float  # time.perf_counter() when sent
    done_at: float | None  # when its last answer came (None: not yet)

    def rows(self) -> list[torch.Tensor]:
        """The rows of each table pulled, in order, waited for."""
        ...

    def drop(self) -> None:
        """Stops waiting for the answers (they are not needed)."""
        ...


class AheadStore(Protocol):
    """A row store that can send a training pull now and hand its rows later."""

    pull_ahead: int | None  # the configured depth: None automatic, 0 off

    def send_pull(self, configs: Sequence[TableConfig], ids: torch.Tensor) -> PendingPull:
        """Sends the training pull of distinct ``ids`` from each table of ``configs``."""
        ...


_current = threading.local()
# (slot, table) pairs whose pulls ahead went untaken, warned about once a process.
_warned: set[tuple[str, str]] = set()


def current() -> PullAhead | None:
    """The ``PullAhead`` whose forward this thread runs, if any."""
    return getattr(_current, "ahead", None)


def thread_depth() -> int:
    """How many batches ahead this thread sends its pulls now: the pushes it
    may keep in flight (1 outside a pass that sends pulls ahead)."""
    return getattr(_current, "depth", 1)


def add_network_wait(seconds: float) -> None:
    """Counts ``seconds`` this thread waited for the servers (a pull, or a
    push in flight): the automatic depth follows these waits."""
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
    trains, ``send(batch)`` for each held batch once, runs each forward
    inside ``forward(batch)``, and calls ``close()`` when the pass ends.

    Args:
        store: where the pulls go.
        distinct: ``ids -> (unique, inverse)`` as the forward's own pull makes them.

    Attributes:
        depth: batches ahead now.
        sent_pulls, taken_pulls: tables' pulls sent ahead, and those whose
            rows a forward took.
    """

    def __init__(self, store: AheadStore, distinct: Any) -> None:
        self.store = store
        self._distinct = distinct
        self.automatic = store.pull_ahead is None
        self.depth = 1 if self.automatic else int(store.pull_ahead)
        _current.depth = self.depth
        self._sources: dict[str, list[str]] = {}  # slot -> tables that read it, in order
        self._forgotten: set[tuple[str, str]] = set()  # (slot, table) not learned again
        self._sent: dict[int, dict[str, _SlotPull]] = {}  # id(batch) -> slot -> pull
        self._in_forward: dict[str, _SlotPull] | None = None
        self._forward_batch: Any = None
        self.sent_pulls = 0
        self.taken_pulls = 0
        # The automatic depth's window: each step's own time and its waits,
        # and how long before its take each pull was answered (0: waited for).
        self._own: list[float] = []
        self._waits: list[float] = []
        self._early: list[float] = []
        self._last_start: float | None = None
        self._last_waited = _network_waits()
        self._batches = 0
        self._windows = 0
        self._probe: tuple[int, float, int] | None = None  # depth before, its median wait, windows
        self._ceiling = (MAX_DEPTH, 0)  # (depth, until window)

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
            self.sent_pulls += len(names)
        self._sent[id(batch)] = sent

    def forward(self, batch: Any) -> _Forward:
        """The context of ``batch``'s forward: its pulls take what was sent."""
        return _Forward(self, batch)

    def close(self) -> None:
        """Drops the pulls of batches never trained (the pass stopped early),
        and gives the thread back its push bound of 1."""
        for sent in self._sent.values():
            for pull in sent.values():
                pull.pending.drop()
        self._sent.clear()
        _current.depth = 1

    # -- the forward's side -----------------------------------------------------------

    def take(
        self, config: TableConfig, ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """The ``(unique, inverse, rows)`` of a pull sent ahead for this very
        ``ids`` tensor, unchanged since, and this table; None: pull them now."""
        sent = self._in_forward
        if sent is None:
            return None
        slot = _slot_of(self._forward_batch, ids)
        pull = None if slot is None else sent.get(slot)
        if (
            pull is None or config.name not in pull.waiting
            or pull.ids is not ids or pull.version != ids._version
        ):
            return None  # not sent, taken already, replaced or changed in place since
        first = len(pull.waiting) == len(pull.names)
        pull.waiting.discard(config.name)
        started = time.perf_counter()
        answered = pull.pending.done_at
        rows = pull.pending.rows()
        add_network_wait(time.perf_counter() - started)
        self.taken_pulls += 1
        if first:
            self._early.append(0.0 if answered is None else max(0.0, started - answered))
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
            wait = waited - self._last_waited
            self._waits.append(wait)
            self._own.append(max(0.0, now - self._last_start - wait))
        self._last_start, self._last_waited = now, waited
        self._forward_batch = batch
        self._in_forward = self._sent.pop(id(batch), None)
        _current.ahead = self

    def _end(self, failed: bool) -> None:
        _current.ahead = None
        sent, self._in_forward, self._forward_batch = self._in_forward, None, None
        if sent is not None and not failed:
            for slot, pull in sent.items():
                if pull.waiting:
                    pull.pending.drop()
                for name in sorted(pull.waiting):
                    self._forget(slot, name)
        self._batches += 1
        if self.automatic and self._batches % _WINDOW == 0:
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
                "those rows (it pulled other ids, replaced the slot or changed it in place): "
                "its rows are pulled in the forward for the rest of this pass", name, slot,
            )

    def _choose_depth(self) -> None:
        """The depth for the next window, from this one's waits (see the top)."""
        own, waits, early = self._own, self._waits, self._early
        self._own, self._waits, self._early = [], [], []
        self._windows += 1
        if len(own) < _WINDOW // 2:
            return
        step = statistics.median(own)
        wait = statistics.fmean(waits)
        typical_wait = statistics.median(waits)
        waiting = wait > _WAIT_SHARE * step + _WAIT_FLOOR
        ceiling, until = self._ceiling
        if self._windows >= until:
            ceiling = MAX_DEPTH
        if self._probe is not None:
            before, waits_before, windows = self._probe
            if windows > 0:  # the pipeline still fills: judge the deepening later
                self._probe = (before, waits_before, windows - 1)
                return
            self._probe = None
            # Were the round trip the limit, each batch deeper would have cut
            # a step's own time off the waits. Less than half that: the
            # servers are the limit, and what is in flight only queues there.
            # Medians: one stall (a busy machine) in either window must not
            # read as a gain.
            expected = min(waits_before, (self.depth - before) * step)
            if waits_before - typical_wait < _GAIN_SHARE * expected:
                self._ceiling = (before, self._windows + _CEILING_WINDOWS)
                self._set_depth(before)
                return
        if waiting and self.depth < ceiling:
            deeper = min(ceiling, self.depth + max(1, math.ceil(wait / max(step, 1e-6))))
            # Judged once the batches sent at the old depth are trained.
            self._probe = (
                self.depth, typical_wait, math.ceil((deeper - self.depth) / _WINDOW) + 1
            )
            self._set_depth(deeper)
        elif not waiting and early and min(early) > step and self.depth > 1:
            self._set_depth(self.depth - 1)

    def _set_depth(self, depth: int) -> None:
        self.depth = depth
        _current.depth = depth


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
