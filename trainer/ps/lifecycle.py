"""The table lifecycle across a job: passes, shrink, statistics and clicks.

What ``fleet.set_pass``, ``fleet.shrink`` and ``fleet.table_stats`` do, on the
tables of this process (local mode, or a server's shards) and across the
servers (a worker's view). The rules themselves are each table's
(``SparseTable.set_pass``/``shrink``/``stats``, ``entries``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np
import torch

from .tables.table import SparseTable, shard_of

if TYPE_CHECKING:
    from .transport import ServerSet

__all__ = [
    "ClickSender",
    "merge_shrinks",
    "merge_stats",
    "set_pass",
    "shrink",
    "stats",
]

log = logging.getLogger(__name__)


def set_pass(tables: Mapping[str, SparseTable], pass_id: int, who: str) -> None:
    """Starts pass ``pass_id`` in every table and logs each table's statistics;
    warns where the step from the last pass alone makes every row unseen for
    longer than the table keeps one (``_warn_long_step``)."""
    for table in tables.values():
        before = table.current_pass
        table.set_pass(pass_id)
        _warn_long_step(table, before, pass_id, who)
    for name, numbers in stats(tables).items():
        log.info(
            "%s: pass %d, table '%s': %d rows, %d ids pending admission, %d bytes, "
            "%d rows evicted by its budget in all",
            who, pass_id, name, numbers["rows"], numbers["pending"], numbers["bytes"],
            numbers["evicted"],
        )


def _warn_long_step(table: SparseTable, before: int, pass_id: int, who: str) -> None:
    """Unseen passes are pass-number differences: dates as pass numbers
    (20240131, then 20240201: 70 passes) would have the next shrink drop every
    row not seen since, without a word."""
    keep, step = table.accessor.delete_after_unseen_days, pass_id - before
    # From pass 0 too (rows pulled, or loaded, before the first set_pass); a
    # step of 1 is any pass, whatever the table keeps.
    if step <= max(keep, 1) or not (len(table) or table.stats()["pending"]):
        return
    hint = ""
    if all(_looks_like_a_date(p) for p in (before, pass_id)):
        hint = (" These look like dates: a pass is counted by its number, so number the "
                "days 1, 2, ... (OnlineLoop does) instead.")
    log.warning(
        "%s: table '%s': pass %d follows pass %d, %d passes later: every row not seen "
        "in this pass is now unseen for more than delete_after_unseen_days=%d, and the "
        "next shrink drops it.%s", who, table.name, pass_id, before, step,
        keep, hint,
    )


def _looks_like_a_date(pass_id: int) -> bool:
    """Whether ``pass_id`` reads as a YYYYMMDD day (Paddle jobs name days so)."""
    year, month, day = pass_id // 10000, pass_id // 100 % 100, pass_id % 100
    return 1900 <= year <= 2999 and 1 <= month <= 12 and 1 <= day <= 31


def shrink(tables: Mapping[str, SparseTable], who: str) -> dict[str, list[int]]:
    """Shrinks every table: name -> [rows dropped, rows kept]; logged."""
    out = {}
    for name, table in sorted(tables.items()):
        dropped, kept = table.shrink()
        out[name] = [dropped, kept]
        log.info("%s: shrink of table '%s' dropped %d rows, kept %d", who, name, dropped, kept)
    return out


def stats(tables: Mapping[str, SparseTable]) -> dict[str, dict[str, int]]:
    """Each table's ``SparseTable.stats()``, by name."""
    return {name: table.stats() for name, table in sorted(tables.items())}


def merge_shrinks(per_server: list[dict[str, list[int]]]) -> dict[str, dict[str, int]]:
    """The servers' shrink results summed: name -> {"dropped", "kept"}."""
    out: dict[str, dict[str, int]] = {}
    for result in per_server:
        for name, (dropped, kept) in result.items():
            total = out.setdefault(name, {"dropped": 0, "kept": 0})
            total["dropped"] += dropped
            total["kept"] += kept
    return out


def merge_stats(per_server: list[dict[str, dict[str, int]]]) -> dict[str, dict[str, int]]:
    """The servers' table statistics summed (``pass``: the latest of them),
    with ``servers``: how many servers reported the table."""
    out: dict[str, dict[str, int]] = {}
    for result in per_server:
        for name, numbers in result.items():
            total = out.setdefault(name, {"servers": 0})
            total["servers"] += 1
            for key, value in numbers.items():
                if key == "pass":
                    total[key] = max(total.get(key, value), value)
                else:
                    total[key] = total.get(key, 0) + value
    return out


class ClickSender:
    """Sends a worker's click statistics to the servers that own the ids
    (``trainer.embedding.stores.install_click_sink``); one round trip per server, waited for."""

    def __init__(self, servers: ServerSet, add_clicks: Callable[..., None]) -> None:
        self.servers = servers
        self.add_clicks = add_clicks  # the servers' handler (server imports this module)

    def __call__(self, name: str, ids: np.ndarray, clicks: np.ndarray) -> None:
        """Adds ``clicks`` to the rows of distinct ``ids`` of table ``name``."""
        owners = shard_of(ids, len(self.servers))
        futures = []
        for s in range(len(self.servers)):
            positions = np.flatnonzero(owners == s)
            if positions.size:
                part = torch.from_numpy(np.ascontiguousarray(ids[positions]).view(np.int64))
                values = torch.from_numpy(np.ascontiguousarray(clicks[positions]))
                futures.append(
                    (s, self.servers.call_async(s, self.add_clicks, name, part, values))
                )
        for s, future in futures:
            self.servers.wait(s, future, "add_clicks")
