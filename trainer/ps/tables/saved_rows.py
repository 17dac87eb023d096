"""Checks of saved table rows before a table applies them.

A chunk of saved rows is a dict of numpy columns as ``SparseTable.export_rows``
hands them out and ``table_files`` reads them back: ``ids`` (uint64),
``weights`` [n, dim] float32, ``state.<key>`` (the optimizer's per-row state,
read when ``optimizer`` names the table's optimizer kind), ``show`` and
``click`` (float32), ``last_seen_pass`` (int64); optionally ``dropped`` (uint64
ids a delta deletes) and ``pass`` (the saved table's current pass).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ...job.errors import CheckpointError
from .describe import describe_value, is_int
from .optim import OptimizerSpec
from .rowstats import RowStats

__all__ = ["check_rows", "selected_columns", "ticks_of_passes"]


def check_rows(
    state: Any,
    dim: int,
    optimizer: OptimizerSpec,
    rows_to_load: np.ndarray | None = None,
    *,
    where: str,
) -> None:
    """Checks that ``state`` is saved rows of ``dim`` (see the module's
    docstring) and ``rows_to_load`` a bool per row, when given.

    Raises:
        CheckpointError: a key missing, a value of the wrong type or shape,
            or lengths that disagree; the message begins with ``where``.
    """

    def refuse(message: str) -> CheckpointError:
        return CheckpointError(f"{where}: {message}", path=where)

    def check(key: str, dtype: Any, shape: tuple[int, ...]) -> None:
        value = state.get(key)
        if not (isinstance(value, np.ndarray) and value.dtype == dtype and value.shape == shape):
            raise refuse(f"{key!r}: expected a {np.dtype(dtype).name} array of shape "
                         f"{list(shape)}, found {describe_value(value)}")

    if not isinstance(state, Mapping):
        raise refuse(f"expected a dict of the table's rows, found {type(state).__name__}")
    ids = state.get("ids")
    if not (isinstance(ids, np.ndarray) and ids.dtype == np.uint64 and ids.ndim == 1):
        raise refuse(f"'ids': expected a 1-D uint64 array, found {describe_value(ids)}")
    n = ids.shape[0]
    check("weights", np.float32, (n, dim))
    for key in ("show", "click"):
        if key in state:
            check(key, np.float32, (n,))
    if "last_seen_pass" in state:
        check("last_seen_pass", np.int64, (n,))
        if n and int(state["last_seen_pass"].min()) < 0:
            raise refuse("'last_seen_pass': expected passes >= 0, found "
                         f"{int(state['last_seen_pass'].min())}")
    if "dropped" in state:
        dropped = state["dropped"]
        if not (isinstance(dropped, np.ndarray) and dropped.dtype == np.uint64
                and dropped.ndim == 1):
            raise refuse(f"'dropped': expected a 1-D uint64 array, found {describe_value(dropped)}")
    if "pass" in state and not (is_int(state["pass"]) and state["pass"] >= 0):
        raise refuse(f"'pass': expected an int >= 0, found {describe_value(state['pass'])}")
    if rows_to_load is not None and not (
        isinstance(rows_to_load, np.ndarray) and rows_to_load.dtype == np.bool_
        and rows_to_load.shape == (n,)
    ):
        raise refuse(f"rows_to_load: expected {n} bools, one per saved row, "
                     f"found {describe_value(rows_to_load)}")
    if state.get("optimizer") == optimizer.kind:
        for key, (shape, dtype) in optimizer.state_layout().items():
            check("state." + key, dtype, (n, *shape(dim)))


def ticks_of_passes(
    stats: RowStats, rows: int, passes: np.ndarray | None, saved_pass: int | None, table: str
) -> np.ndarray | None:
    """The last-seen ticks for rows saved as last seen in ``passes`` (None
    where none given), first starting on the table's clock the passes (and
    ``saved_pass``) it never saw, each at a tick of its own: those after its
    current pass as ``set_pass`` does, those before it in their place (a
    ``set_pass`` before the load; ``rows``: the table's rows, whose ticks
    move to make room). A row's unseen passes then count from the pass it
    was saved in."""
    clock = stats.clock
    wanted = set() if passes is None else set(np.unique(passes).tolist())
    if saved_pass is not None:
        wanted.add(int(saved_pass))
    earlier = [n for n in sorted(wanted) if n < clock.current_pass and not clock.known(n)]
    stats.reserve_ticks(len(earlier) + sum(n > clock.current_pass for n in wanted), rows)
    if earlier:
        stats.start_earlier_passes(earlier, rows)
    for number in sorted(wanted):
        if number > clock.current_pass:
            clock.set_pass(number, f"table '{table}'")  # at a tick of its own
    if passes is None:
        return None
    distinct, inverse = np.unique(passes, return_inverse=True)
    current = clock.current_pass
    starts = [clock.first_tick_within(current - int(p)) for p in distinct.tolist()]
    return np.asarray(starts, dtype=np.uint32)[inverse.reshape(-1)]


def selected_columns(
    state: Mapping[str, Any], optimizer: OptimizerSpec, rows_to_load: np.ndarray | None
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The ids and the columns of checked ``state`` that a table with
    ``optimizer`` loads (``state.<key>`` only of the same optimizer kind), of
    the rows where ``rows_to_load`` is true (all when None)."""
    names = ["weights", "show", "click", "last_seen_pass"]
    if state.get("optimizer") == optimizer.kind:
        names += ["state." + key for key in optimizer.state_layout()]
    columns = {name: state[name] for name in names if name in state}
    if rows_to_load is None:
        return state["ids"], columns
    return state["ids"][rows_to_load], {
        name: value[rows_to_load] for name, value in columns.items()
    }
