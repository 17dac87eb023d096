"""The sparse-table lifecycle calls of the fleet API: ``fleet.set_pass``,
``fleet.shrink`` and ``fleet.table_stats`` (``docs/table_lifecycle.md``).

A mixin of ``trainer.fleet.Fleet`` (kept apart to keep that module short):
each call goes to the parameter-server runtime, which works on this process's
tables in local mode and on every server's in a PS job
(``trainer.ps.lifecycle``).
"""

from __future__ import annotations

from typing import Any

from .job.errors import TrainerError

__all__ = ["TableLifecycle"]


class TableLifecycle:
    """``set_pass``, ``shrink`` and ``table_stats`` for ``Fleet``."""

    def _get_runtime(self) -> Any:  # Fleet's
        raise NotImplementedError

    role: Any  # Fleet's

    def _table_runtime(self, what: str) -> Any:
        if self.role.is_collective and self.role.distributed:
            raise TrainerError(
                f"fleet.{what}() concerns SparseEmbedding tables, which a collective job "
                f"does not have (they live in a parameter-server job, or in local mode)"
            )
        return self._get_runtime()

    def set_pass(self, pass_id: int) -> None:
        """Starts pass (day) ``pass_id`` of every sparse table: rows pulled from
        now on were seen in it; ``shrink`` counts unseen passes from it. Passes
        only go forward; setting the current one again does nothing, so every
        worker may call it with the same number (PS mode: every server's
        tables; each server logs their rows and bytes).

        Raises:
            ValueError: ``pass_id`` is before the current pass.
        """
        self._table_runtime("set_pass").set_pass(pass_id)

    def shrink(self) -> dict[str, dict[str, int]]:
        """Paddle's ``fleet.shrink()``: every sparse table, on every server,
        decays its rows' show and click and drops the rows its
        ``CtrAccessorParam`` rule selects. Call it from one worker (each call
        decays again). Returns table name -> ``{"dropped": n, "kept": n}``."""
        return self._table_runtime("shrink").shrink()

    def table_stats(self) -> dict[str, dict[str, int]]:
        """Per sparse table, summed over the servers: ``rows``, ``pending``
        (ids waiting for admission), ``bytes`` (memory held), ``evicted`` (by
        its ``max_rows`` budget, in all), ``max_rows``, ``pass`` and
        ``servers``."""
        return self._table_runtime("table_stats").table_stats()
