"""The statistics a sparse table keeps per row, and its clock.

``RowStats`` holds, aligned with a ``SparseTable``'s rows, each row's show
count, click count, last-seen tick and changed-since-last-save flag (one 16-byte
record a row, ``ROW_STATS_DTYPE``: a training pull updates all four with one
write, in the C loop that copies the row out), the clock that maps ticks to
passes, the ids waiting for admission (``PendingIds``) and the ids dropped
since the last save. The table calls it under its own lock; nothing here locks.

Time: a tick is one training pull of the table (a batch, per worker); a pass
is what the script calls a day (``fleet.set_pass``). Rows remember the tick
they were last pulled at (for the budget's least-recently-seen eviction, finer
than passes), and the clock remembers the tick each pass began at (for
``shrink``'s unseen-passes rule).
"""

from __future__ import annotations

import numpy as np

from ._rows import ROW_STATS_DTYPE, IdIndex, add_clicks_rows, touch_rows

__all__ = ["PassClock", "PendingIds", "RowStats"]

# Ticks are uint32: renumbered (RowStats._renumber_ticks) before they would wrap.
_TICK_LIMIT = 0xFFFF_FF00


class PassClock:
    """Ticks (training pulls) and passes (``set_pass``) of one table."""

    def __init__(self) -> None:
        self.tick = 0
        self.current_pass = 0
        self._pass_ids = np.zeros(1, dtype=np.int64)  # passes set, in order ...
        self._pass_ticks = np.zeros(1, dtype=np.int64)  # ... and the tick each began at

    def set_pass(self, pass_id: int, where: str) -> None:
        """Starts pass ``pass_id`` (the same pass again: nothing).

        Raises:
            ValueError: ``pass_id`` is before the current pass.
        """
        if isinstance(pass_id, bool) or not isinstance(pass_id, (int, np.integer)):
            raise ValueError(f"{where}: a pass is an int, got {pass_id!r}")
        if pass_id < self.current_pass:
            raise ValueError(
                f"{where}: pass {pass_id} is before the current pass {self.current_pass}"
            )
        if pass_id > self.current_pass:
            self.current_pass = int(pass_id)
            self._pass_ids = np.append(self._pass_ids, self.current_pass)
            # Each pass begins at a tick of its own, pulled in or not: two
            # passes set with no pull between must not share their first tick,
            # or a row last seen in the first would read as seen in the second.
            self.tick += 1
            self._pass_ticks = np.append(self._pass_ticks, self.tick)

    def unseen_passes(self, ticks: np.ndarray) -> np.ndarray:
        """How many passes ago each last-seen tick was (0: in the current pass)."""
        started = np.searchsorted(self._pass_ticks, ticks.astype(np.int64), side="right") - 1
        return self.current_pass - self._pass_ids[np.maximum(started, 0)]

    def insert_earlier(self, passes: list[int]) -> np.ndarray:
        """Adds ``passes`` (each before the current pass, none known), so that
        rows loaded as last seen in one count their unseen passes from it, not
        from the next pass the clock knows (``set_pass`` moved past them before
        the load). Each begins where the next known pass began, and every tick
        from there moves up to make room. Returns the ticks where passes went
        in, one per pass, in order: a tick ``t`` of the rows becomes
        ``t + searchsorted(returned, t, side="right")`` (``shifted``)."""
        inserted = np.asarray(sorted(passes), dtype=np.int64)
        at = np.searchsorted(self._pass_ids, inserted)  # the next known pass
        where = self._pass_ticks[at]
        moved = shifted(self._pass_ticks, where)
        ids = np.concatenate([self._pass_ids, inserted])
        ticks = np.concatenate([moved, where + np.arange(inserted.shape[0])])
        order = np.argsort(ids, kind="stable")
        self._pass_ids, self._pass_ticks = ids[order], ticks[order]
        self.tick += int(inserted.shape[0])
        return where

    def known(self, pass_id: int) -> bool:
        """Whether the clock has seen pass ``pass_id`` start."""
        at = int(np.searchsorted(self._pass_ids, pass_id))
        return at < self._pass_ids.shape[0] and int(self._pass_ids[at]) == pass_id

    def first_tick_within(self, passes: int) -> int:
        """The first tick of the passes at most ``passes`` before the current one."""
        recent = np.flatnonzero(self._pass_ids >= self.current_pass - passes)
        return int(self._pass_ticks[recent[0]])

    def ticks(self) -> np.ndarray:
        """The ticks the clock holds: each pass's first, and the last."""
        return np.append(self._pass_ticks, self.tick)

    def renumber(self, in_use: np.ndarray) -> None:
        """Each tick becomes its place among ``in_use`` (sorted, holding them all)."""
        self._pass_ticks = np.searchsorted(in_use, self._pass_ticks).astype(np.int64)
        self.tick = int(np.searchsorted(in_use, self.tick))


def shifted(ticks: np.ndarray, inserted_at: np.ndarray) -> np.ndarray:
    """``ticks`` after passes went in at the ticks ``inserted_at`` (sorted):
    each moves up by the passes inserted at or before it."""
    return ticks + np.searchsorted(inserted_at, ticks, side="right").astype(ticks.dtype)


class RowStats:
    """Per-row statistics of one table (see the module's docstring)."""

    def __init__(self) -> None:
        # Fields show, click, last (tick of the last training pull), changed
        # (since mark_saved()).
        self.records = np.zeros(0, dtype=ROW_STATS_DTYPE)
        self.clock = PassClock()
        self.pending = PendingIds()
        self.dropped: list[np.ndarray] | None = None  # ids dropped since mark_saved()
        # Statistics changed since mark_saved() beyond the rows' flags (a shrink's
        # decay, clicks, a new pass): a save then holds a state of its own.
        self.altered = True

    @property
    def show(self) -> np.ndarray:
        """Each row's show count (a view into the records: writable)."""
        return self.records["show"]

    @property
    def click(self) -> np.ndarray:
        """Each row's click count (a view into the records: writable)."""
        return self.records["click"]

    @property
    def last(self) -> np.ndarray:
        """Each row's last-seen tick (a view into the records: writable)."""
        return self.records["last"]

    @property
    def changed(self) -> np.ndarray:
        """Each row's changed-since-save flag, 0 or 1 (a view: writable)."""
        return self.records["changed"]

    def arrays(self) -> list[np.ndarray]:
        """The per-row arrays, in a fixed order (``set_arrays`` takes them back)."""
        return [self.records]

    def set_arrays(self, arrays: list[np.ndarray]) -> None:
        """Replaces the per-row arrays (grown or compacted by the table)."""
        (self.records,) = arrays

    @property
    def nbytes(self) -> int:
        """Bytes of the per-row records (allocated) and of the pending ids."""
        return self.records.nbytes + self.pending.nbytes

    def next_tick(self, rows: int) -> int:
        """The tick of a new training pull (``rows``: the table's row count)."""
        if self.clock.tick >= _TICK_LIMIT:
            self._renumber_ticks(rows)
        self.clock.tick += 1
        return self.clock.tick

    def reserve_ticks(self, count: int, rows: int) -> None:
        """Renumbers the ticks (``_renumber_ticks``) unless ``count`` more fit
        below the limit (passes a load is about to start)."""
        if self.clock.tick + count >= _TICK_LIMIT:
            self._renumber_ticks(rows)

    def _renumber_ticks(self, rows: int) -> None:
        """Numbers the ticks in use (the rows', the pending ids', the clock's)
        0, 1, 2, ... in their order, before they would wrap: every comparison
        between two of them stays as it was (a row's pass, the eviction order),
        and the clock has room again however old the oldest row is. (Shifting
        them all down by the oldest gains nothing while a row last seen at the
        first pull is kept.) Holds the table's lock for a sort of its ticks,
        once in some 4e9 pulls."""
        last = self.last[:rows]
        in_use = np.unique(np.concatenate([
            last.astype(np.int64), self.pending.ticks().astype(np.int64), self.clock.ticks()]))
        last[:] = np.searchsorted(in_use, last)
        self.pending.renumber_ticks(in_use)
        self.clock.renumber(in_use)

    def start_earlier_passes(self, passes: list[int], rows: int) -> None:
        """Starts ``passes`` before the current one that the clock never saw
        (``PassClock.insert_earlier``), moving the ticks of the first ``rows``
        rows and of the pending ids to match."""
        inserted_at = self.clock.insert_earlier(passes)
        self.last[:rows] = shifted(self.last[:rows], inserted_at.astype(np.uint32))
        self.pending.move_ticks(inserted_at)

    def least_recently_seen(self, rows: int, tick: int, count: int) -> np.ndarray:
        """Up to ``count`` of the first ``rows`` rows, the least recently seen
        first, none of them seen at ``tick`` (a budget's eviction: not the
        rows the pull making room saw)."""
        last = self.last
        candidates = np.flatnonzero(last[:rows] < tick)
        if count <= 0:
            return candidates[:0]
        if count < candidates.shape[0]:
            candidates = candidates[np.argpartition(last[candidates], count - 1)[:count]]
        return candidates

    def created(self, rows: np.ndarray) -> None:
        """``rows`` are new: no show or click yet, seen now, not saved."""
        self.records[rows] = (0.0, 0.0, self.clock.tick, 1)

    def touch(self, rows: np.ndarray, tick: int) -> None:
        """A training pull of ``rows`` (-1 skipped) at ``tick``."""
        touch_rows(self.records, rows, tick)

    def add_clicks(self, rows: np.ndarray, clicks: np.ndarray) -> None:
        """Adds ``clicks`` (float32) to the click counts of ``rows`` (-1 skipped)."""
        add_clicks_rows(self.records, rows, clicks)
        self.altered = True

    def dropping(self, ids: np.ndarray) -> None:
        """``ids`` are about to be dropped (recorded once a save started the log)."""
        if self.dropped is not None and ids.size:
            self.dropped.append(ids)

    def shrink_mask(self, accessor: object, rows: int) -> np.ndarray:
        """Decays show and click of the first ``rows`` rows; which to drop.
        A decay changes every row: the next delta holds them all."""
        unseen = self.clock.unseen_passes(self.last[:rows])
        self.altered = True
        if accessor.show_click_decay_rate != 1.0:
            self.changed[:rows] = 1
        return accessor.decay_and_drop(self.show[:rows], self.click[:rows], unseen)

    def drop_unseen_pending(self, passes: int) -> int:
        """Forgets pending ids unseen for more than ``passes`` passes."""
        if not len(self.pending):
            return 0
        return self.pending.drop(self.clock.first_tick_within(passes))

    def of_rows(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """``show``, ``click`` and ``unseen_passes`` of ``rows`` (-1, 0, 0 where -1)."""
        out = {
            "show": np.full(rows.shape[0], -1, dtype=np.float32),
            "click": np.zeros(rows.shape[0], dtype=np.float32),
            "unseen_passes": np.zeros(rows.shape[0], dtype=np.int64),
        }
        present = rows >= 0
        found = rows[present]
        out["show"][present] = self.show[found]
        out["click"][present] = self.click[found]
        out["unseen_passes"][present] = self.clock.unseen_passes(self.last[found])
        return out

    def mark_saved(self, rows: int) -> None:
        """Every row is saved: clears the flags; starts (or restarts) the dropped-id log."""
        self.changed[:rows] = 0
        self.dropped = []
        self.altered = False


class PendingIds:
    """Ids seen in training but not admitted yet: each one's sighting count
    and last-seen tick (12 bytes of arrays and 16-32 of index per id), no row.

    An admitted id is only marked dead here; dead entries go at the next
    compaction (when they are half the index, or at ``drop``).
    """

    def __init__(self) -> None:
        self._index = IdIndex()
        self._count = np.zeros(0, dtype=np.float32)  # -1: admitted (dead)
        self._tick = np.zeros(0, dtype=np.uint32)
        self._dead = 0
        self._known = 0  # entries below it have initialised counts

    def __len__(self) -> int:
        return self._index.size - self._dead

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays and the index."""
        return self._count.nbytes + self._tick.nbytes + self._index.cells.nbytes

    def sight(self, ids: np.ndarray, tick: int) -> np.ndarray:
        """Counts one sighting of each of ``ids`` (distinct); returns the counts."""
        rows = self._index.lookup_or_insert(ids)
        size = self._index.size
        if size > self._count.shape[0]:
            grown = max(size, 2 * self._count.shape[0], 1024)
            self._count = np.resize(self._count, grown)
            self._tick = np.resize(self._tick, grown)
        counts = self._count[rows]
        # A new entry (or a dead one seen again after its row was evicted) starts at 0.
        new = (rows >= self._known) | (counts < 0)
        if new.any():
            self._dead -= int((counts[new] < 0).sum())
            counts[new] = 0
        counts += 1
        self._count[rows] = counts
        self._tick[rows] = tick
        self._known = size
        return counts

    def admitted(self, ids: np.ndarray) -> None:
        """``ids`` got rows: they are no longer pending."""
        rows = self._index.lookup(ids)
        rows = rows[rows >= 0]
        live = rows[self._count[rows] >= 0]
        self._count[live] = -1
        self._dead += live.shape[0]
        if self._dead > 1024 and 2 * self._dead > self._index.size:
            self._keep_entries(self._count[: self._index.size] >= 0)

    def drop(self, before_tick: np.ndarray | int, oldest: int = 0) -> int:
        """Forgets the ids last seen before ``before_tick``, and then the
        ``oldest`` least recently seen ones; returns how many live ids went."""
        size = self._index.size
        live = self._count[:size] >= 0
        staying = live & (self._tick[:size] >= before_tick)
        if oldest > 0:
            kept = np.flatnonzero(staying)
            if oldest >= kept.shape[0]:
                staying[:] = False
            else:
                order = np.argpartition(self._tick[kept], oldest - 1)[:oldest]
                staying[kept[order]] = False
        dropped = int(live.sum() - staying.sum())
        self._keep_entries(staying)
        return dropped

    def counts(self, ids: np.ndarray) -> np.ndarray:
        """The sighting count of each of ``ids`` (0: not pending)."""
        rows = self._index.lookup(ids)
        out = np.zeros(ids.shape[0], dtype=np.float32)
        present = rows >= 0
        out[present] = np.maximum(self._count[rows[present]], 0)
        return out

    def ticks(self) -> np.ndarray:
        """The last-seen tick of every live entry (for a renumbering of ticks)."""
        size = self._index.size
        return self._tick[:size][self._count[:size] >= 0]

    def move_ticks(self, inserted_at: np.ndarray) -> None:
        """Moves every tick up past passes inserted at ``inserted_at`` (``shifted``)."""
        size = self._index.size
        self._tick[:size] = shifted(self._tick[:size], inserted_at.astype(np.uint32))

    def renumber_ticks(self, in_use: np.ndarray) -> None:
        """Each tick becomes its place among ``in_use`` (sorted, holding every
        live entry's; a forgotten entry's tick matters to no one)."""
        size = self._index.size
        self._tick[:size] = np.searchsorted(in_use, self._tick[:size])

    def _keep_entries(self, staying: np.ndarray) -> None:
        """Forgets the entries where ``staying`` is false; renumbers the rest in order."""
        kept = np.flatnonzero(staying)
        ids = self._index.ids_in_row_order()[kept]
        self._count = self._count[kept].copy()
        self._tick = self._tick[kept].copy()
        self._index.rebuild(ids)
        self._known = self._index.size
        self._dead = 0
