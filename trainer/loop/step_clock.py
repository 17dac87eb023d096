"""Seconds a thread spends in two parts of its training steps: pulling sparse
rows in forwards, and updating dense parameters in the optimizer step.

The executor splits each step's time with these (``RunSummary.timings``):
``pull`` is part of ``forward``, ``optimizer`` part of ``step``, and the rest
of ``step`` is the push of the sparse gradients (to the in-process tables, a
GEO worker's copy or the servers). Per thread, so Hogwild threads do not
share counters; two ``perf_counter`` calls per timed call.
"""

from __future__ import annotations

import threading

__all__ = ["add_optimizer", "add_pull", "thread_totals"]

_totals = threading.local()


def add_pull(seconds: float) -> None:
    """Counts ``seconds`` of a training forward's row pull for this thread."""
    _totals.pull = getattr(_totals, "pull", 0.0) + seconds


def add_optimizer(seconds: float) -> None:
    """Counts ``seconds`` of a dense optimizer update for this thread."""
    _totals.optimizer = getattr(_totals, "optimizer", 0.0) + seconds


def thread_totals() -> tuple[float, float]:
    """This thread's seconds so far: (row pulls, dense optimizer updates)."""
    return getattr(_totals, "pull", 0.0), getattr(_totals, "optimizer", 0.0)
