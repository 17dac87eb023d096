"""``RunSummary``: what one ``Executor.train_from_dataset`` / ``infer_from_dataset``
call did, and the INFO line that reports it (trainer/executor.py runs the pass).

This module does not import torch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from datafeed.datasets.dataset_base import DatasetBase

__all__ = ["RunSummary", "input_stats", "log_summary"]

logger = logging.getLogger("trainer.executor")


@dataclass
class RunSummary:
    """What one ``train_from_dataset`` / ``infer_from_dataset`` call did.

    Attributes:
        batches: batches processed (over all threads).
        records: records in those batches.
        mean_loss: mean of the per-batch ``"loss"`` values (None when the model
            returned no loss, in inference).
        seconds: wall-clock time of the call.
        threads: worker threads used.
        timings: seconds spent in each phase, summed over threads: ``data_wait``,
            ``forward``, ``backward``, ``step`` (optimizer step / push); and
            parts of them: ``pull`` (sparse rows pulled in the forwards),
            ``optimizer`` (the dense update in the steps) and ``push`` (the
            rest of the steps: sparse gradients to the tables or servers).
        last_fetch: the values of each ``fetch_list`` entry, by ``fetch_info``
            name, in the last batch printed (every ``print_period`` batches;
            empty when the pass had fewer).
        input: the dataset's ``stats()`` at the end of the pass (a
            ``datafeed.LoadStats``: for a QueueDataset, the lines, records and
            skipped lines of this pass, per file; for an InMemoryDataset, those
            of its last load), or None for a plain iterable.
        hogwild: how Hogwild trainers ran (``hogwild=True``, ``thread`` > 1):
            ``"processes"`` (forked, trainer/loop/hogwild_processes.py) or
            ``"threads"``; None otherwise.
        hogwild_fallback: why the trainers stepped one at a time although
            ``hogwild=True`` asked for Hogwild (an optimizer the lock-free
            update does not implement, a parameter-server mode); None otherwise.
            Logged as a warning at every call.
        hogwild_warning: what Hogwild trainers cost this model, and the fix:
            its dense embedding tables that every trainer rewrites whole at
            each step, overwriting the others' updates
            (``trainer.loop.hogwild.collision_warning``); None otherwise.
            Logged as a warning at every call.
        pulls_ahead: a parameter-server worker's pulls sent ahead of their
            forwards (trainer/embedding/ahead.py): ``depth`` (the most batches
            ahead a thread ended the pass at), ``sent`` (pulls sent ahead) and
            ``taken`` (tables' rows a forward took from them); None when the
            pass sent none (local training, GEO, sync, ``pull_ahead=0``).
    """

    batches: int
    records: int
    mean_loss: float | None
    seconds: float
    threads: int
    timings: dict[str, float] = field(default_factory=dict)
    last_fetch: dict[str, list[float]] = field(default_factory=dict)
    input: Any = None
    hogwild: str | None = None
    hogwild_fallback: str | None = None
    hogwild_warning: str | None = None
    pulls_ahead: dict[str, int] | None = None

    @property
    def records_per_second(self) -> float:
        """Records per second of wall-clock time (0.0 for a pass of no time)."""
        return self.records / self.seconds if self.seconds > 0 else 0.0


def input_stats(dataset: Any) -> Any:
    """A dataset's load accounting (``stats()``, whose errors are raised), or
    None for another iterable: its ``stats``, if it has one, may mean
    anything, take arguments or fail."""
    if isinstance(dataset, DatasetBase):
        return dataset.stats()
    return None


def log_summary(what: str, summary: RunSummary) -> None:
    """One INFO line: what the pass delivered and what its input held."""
    line = (
        f"{what}: {summary.batches} batches, {summary.records} records "
        f"in {summary.seconds:.2f} s"
    )
    stats = summary.input
    if stats is not None and hasattr(stats, "per_file"):
        line += (
            f"; input: {stats.files} files, {stats.lines} lines = {stats.records} records "
            f"+ {stats.skipped_lines} skipped lines"
        )
        if stats.skipped_reasons:
            reasons = sorted(stats.skipped_reasons.items())
            line += " (" + ", ".join(f"{r} {n}" for r, n in reasons) + ")"
    logger.info(line)
