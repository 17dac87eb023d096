"""Where ``SparseEmbedding`` rows come from, and where their gradients go.

Four pieces, shared by the local mode and the parameter-server runtime:

* the registry of live ``SparseEmbedding`` modules by table name: how a runtime
  learns each table's dim and settings from the model the script built
  (``table_configs``, ``model_tables``), without importing ``trainer.nn``;
* the distinct ids of a forward's input (``distinct``), shared by the tables
  that take the same input;
* the row store a forward pulls from: ``LocalStore`` (in-process tables) unless
  a runtime installed another one (``install_store``);
* the pending pulls of this thread: each training forward records the unique ids
  it pulled and the leaf tensor of their rows; the distributed optimizer's
  ``step()`` collects their gradients (``take_gradients``) and pushes them.
  Pending pulls are per thread, so Hogwild trainer threads sharing one model
  each push what they pulled.
"""

from __future__ import annotations

import collections
import logging
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from ._rows import unique_inverse
from .entries import CtrAccessorParam, EntryAttr
from .optim import OptimizerSpec
from .step_rows import (
    PulledRows,
    pull_distinct_numbered,
    pull_numbered,
    push_numbered,
    push_pooled_numbered,
)
from .table import SparseTable, as_u64

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from .pooling import Pooling

log = logging.getLogger(__name__)

DEFAULT_INIT_SCALE = 0.01


@dataclass(frozen=True)
class TableConfig:
    """What every process must agree on about one sparse table.

    ``entry``, ``accessor`` and ``max_rows``: the table's lifecycle
    (``trainer.ps.entries``; ``max_rows`` is the whole table's budget, split
    evenly among the servers).
    """

    name: str
    dim: int
    seed: int
    init_scale: float
    optimizer: Mapping[str, Any] | None  # the table's own override, if any
    entry: EntryAttr | None = None
    accessor: CtrAccessorParam = CtrAccessorParam()
    max_rows: int | None = None

    def spec(self, default: OptimizerSpec | None) -> OptimizerSpec:
        """The table's optimizer: its override, else ``default``, else SGD(lr=0.01)."""
        if self.optimizer is not None:
            return OptimizerSpec.from_config(self.optimizer)
        if default is not None:
            return default
        return OptimizerSpec("sgd", {"lr": 0.01})

    def make_table(
        self, default: OptimizerSpec | None, shards: int = 1, lifecycle: bool = True
    ) -> SparseTable:
        """An empty table (or one of ``shards`` servers' shards) with these
        settings (``default``: see ``spec``). ``lifecycle=False``: without
        the entry and the budget (a GEO worker's local copy: the servers admit
        and evict)."""
        budget = None
        if lifecycle and self.max_rows is not None:
            budget = -(-self.max_rows // max(1, shards))
        return SparseTable(
            self.name, self.dim, self.spec(default), self.seed, self.init_scale,
            entry=self.entry if lifecycle else None, accessor=self.accessor, max_rows=budget,
        )

    def same_table(self, table: SparseTable) -> bool:
        """Whether ``table`` was made from settings equal to these (local mode)."""
        return (table.dim, table.seed, table.init_scale, table.entry, table.accessor) == (
            self.dim, self.seed, self.init_scale, self.entry, self.accessor
        ) and table.max_rows == self.max_rows

    def as_dict(self) -> dict[str, Any]:
        """The settings as plain JSON values (a checkpoint's ``meta.json``)."""
        return {
            "name": self.name,
            "dim": self.dim,
            "seed": self.seed,
            "init_scale": self.init_scale,
            "optimizer": None if self.optimizer is None else dict(self.optimizer),
            "entry": None if self.entry is None else self.entry._to_attr(),
            "accessor": self.accessor.as_dict(),
            "max_rows": self.max_rows,
        }


# -- registry ---------------------------------------------------------------

_registry_lock = threading.Lock()
_modules: dict[str, weakref.WeakSet] = {}
_configs: dict[str, TableConfig] = {}
_module_configs: weakref.WeakKeyDictionary[Any, TableConfig] = weakref.WeakKeyDictionary()


def register(module: Any, config: TableConfig) -> None:
    """Adds a live SparseEmbedding; modules sharing a name share one table.

    Raises:
        ValueError: a live module already uses the name with another dim/settings.
    """
    with _registry_lock:
        live = _modules.get(config.name)
        if live is not None and len(live) and _configs[config.name] != config:
            old = _configs[config.name]
            raise ValueError(
                f"SparseEmbedding '{config.name}' already exists with "
                f"dim={old.dim}, seed={old.seed}, init_scale={old.init_scale}, "
                f"optimizer={old.optimizer}; a module sharing its table must use the "
                f"same settings, got dim={config.dim}, seed={config.seed}, "
                f"init_scale={config.init_scale}, optimizer={config.optimizer}"
            )
        _modules.setdefault(config.name, weakref.WeakSet()).add(module)
        _configs[config.name] = config
        _module_configs[module] = config


def table_configs() -> dict[str, TableConfig]:
    """Configs of the tables of every live SparseEmbedding, by name (sorted)."""
    with _registry_lock:
        return {
            name: _configs[name] for name in sorted(_modules) if len(_modules[name])
        }


def model_tables(model: torch.nn.Module) -> dict[str, TableConfig]:
    """Configs of the tables of ``model``'s own SparseEmbedding modules, by name."""
    with _registry_lock:
        found = (_module_configs.get(module) for module in model.modules())
        return {config.name: config for config in found if config is not None}


# -- distinct ids (per thread) -----------------------------------------------

# The last ids tensor made distinct, and the result. Tables that take the same
# input (wide & deep) then share one pass per batch, and one tensor of distinct
# ids, by which ``RemoteStore`` recognises tables it can pull in one round trip.
_last_distinct = threading.local()


def distinct(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.unique(ids.reshape(-1), return_inverse=True)`` (not sorted on CPU),
    reused while ``ids`` is the same, unchanged tensor."""
    last = getattr(_last_distinct, "value", None)
    if last is not None and last[0] is ids and last[1] == ids._version:
        return last[2], last[3]
    flat = ids.reshape(-1)
    if flat.device.type == "cpu":
        # A hash pass (first-appearance order; nothing downstream needs the ids
        # sorted) instead of a sort: ~3x numpy's unique on 13k int64 ids.
        values, positions = unique_inverse(flat.numpy())
        unique = torch.from_numpy(values)
        inverse = torch.from_numpy(positions)
    else:
        unique, inverse = torch.unique(flat, return_inverse=True)
    _last_distinct.value = (ids, ids._version, unique, inverse)
    return unique, inverse


# -- stores -----------------------------------------------------------------


class RowStore(Protocol):
    """Where a forward's rows come from: ``LocalStore``, ``RemoteStore``, ``GeoStore``."""

    def pull(self, config: TableConfig, ids: torch.Tensor, training: bool) -> torch.Tensor:
        """Rows [len(ids), dim] of distinct int64 ``ids``."""
        ...


class LocalStore:
    """In-process tables (the non-distributed mode), created on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.tables: dict[str, SparseTable] = {}
        self.default_optimizer: OptimizerSpec | None = None
        self.pass_id = 0  # the pass a table created from now on starts in

    def table(self, config: TableConfig) -> SparseTable:
        """The table of ``config``, created (empty) on first use."""
        with self._lock:
            table = self.tables.get(config.name)
            # A table left by a module that no longer exists, with other settings.
            if table is not None and not config.same_table(table):
                table = None
            if table is None:
                table = config.make_table(self.default_optimizer)
                table.set_pass(self.pass_id)
                self.tables[config.name] = table
            return table

    def set_default_optimizer(self, spec: OptimizerSpec) -> None:
        """The optimizer of tables without their own: resets their state."""
        with self._lock:
            self.default_optimizer = spec
            for name, table in self.tables.items():
                config = _configs.get(name)
                if config is None or config.optimizer is None:
                    table.set_optimizer(spec)

    def set_pass(self, pass_id: int) -> None:
        """The pass of tables created from now on (``fleet.set_pass``)."""
        with self._lock:
            self.pass_id = int(pass_id)

    def pull(self, config: TableConfig, ids: torch.Tensor, training: bool) -> torch.Tensor:
        """Rows of distinct ``ids``, created when ``training``. A training
        pull keeps the row numbers it found for the push of the same ids."""
        table = self.table(config)
        if not training:
            return table.pull(ids, create=False)
        rows, pulled = pull_numbered(table, ids)
        _keep_pull(config.name, pulled)
        return rows

    def pull_values(
        self, config: TableConfig, values: torch.Tensor
    ) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
        """A training pull of a batch's ids as they come (int64, repeats
        included), as ``distinct`` then ``pull`` in one pass over the ids:
        the distinct ids (int64 tensor), their rows (float32 numpy) and each
        value's position among them (int64 numpy). Keeps the row numbers for
        the push of the distinct ids' tensor."""
        table = self.table(config)
        unique, positions, rows, pulled = pull_distinct_numbered(table, values.numpy())
        _keep_pull(config.name, pulled)
        pulled.source = torch.from_numpy(unique.view(np.int64))
        return pulled.source, rows, positions

    def push_pending(self) -> None:
        """Pushes this thread's pending sparse gradients (``take_gradients``).
        A table pulled once since the last push is pushed at its pull's row
        numbers, its rows' gradient taken from the pooled output's in the
        optimizer's own pass (``push_pooled_numbered``); the rest as ``push``."""
        items = _take_pending()
        numbered = getattr(_pulled_here, "tables", None) or {}
        pulls = collections.Counter(name for name, _, _, _ in items)
        rest = []
        for name, ids, output, pooling in items:
            pulled, table = numbered.get(name), self.tables.get(name)
            if (
                pulls[name] == 1 and pulled is not None and table is not None
                and pulled.source is ids  # this pull's own ids
                and push_pooled_numbered(table, output.grad, pooling, pulled)
            ):
                del numbered[name]
            else:
                rest.append((name, ids, output, pooling))
        if rest:
            self.push(_merged(rest))

    def push(self, gradients: dict[str, tuple[np.ndarray, torch.Tensor]]) -> None:
        """Applies each table's optimizer to its rows' gradients: at the row
        numbers of this thread's last pull when those were its ids (the ids
        are then looked up once per step), else looked up now."""
        numbered = getattr(_pulled_here, "tables", None) or {}
        for name, (ids, grads) in gradients.items():
            pulled = numbered.pop(name, None)
            if pulled is not None and pulled.matches(ids):
                push_numbered(self.tables[name], grads, pulled)
            else:
                self.tables[name].push(ids, grads)

    def clear(self) -> None:
        """Drops every table (tests; a fresh model)."""
        with self._lock:
            self.tables.clear()


# Each thread's last training pull of each local table (its row numbers).
_pulled_here = threading.local()


def _keep_pull(name: str, pulled: PulledRows) -> None:
    numbered = getattr(_pulled_here, "tables", None)
    if numbered is None:
        numbered = _pulled_here.tables = {}
    numbered[name] = pulled

_local_store = LocalStore()
_store: RowStore = _local_store


def local_store() -> LocalStore:
    """The process's in-process tables."""
    return _local_store


def install_store(store: RowStore | None) -> None:
    """Makes every SparseEmbedding pull from ``store`` (None: back to local tables)."""
    global _store
    _store = _local_store if store is None else store


def current_store() -> RowStore:
    """The store every SparseEmbedding pulls from now."""
    return _store


# Where click statistics go: the local tables unless a PS worker installed
# its sender (``install_click_sink``): name, distinct ids, clicks per id.
_click_sink: Callable[[str, np.ndarray, np.ndarray], None] | None = None


def install_click_sink(sink: Callable[[str, np.ndarray, np.ndarray], None] | None) -> None:
    """Sends ``add_clicks`` to ``sink`` (a PS worker's servers); None: local tables."""
    global _click_sink
    _click_sink = sink


def add_clicks(config: TableConfig, ids: torch.Tensor, clicks: torch.Tensor) -> None:
    """Adds ``clicks`` (float32 per distinct id) to the click counts of the
    rows of ``ids`` in ``config``'s table, wherever it lives."""
    u64 = as_u64(ids)
    values = clicks.detach().to(torch.float32).numpy()
    if _click_sink is not None:
        _click_sink(config.name, u64, values)
    else:
        _local_store.table(config).add_clicks(u64, values)


# -- pending pulls (per thread) ---------------------------------------------

_pending = threading.local()

# A forward that nobody pushes (training without the distributed optimizer)
# must not grow memory without bound.
_MAX_PENDING = 4096


def record(name: str, ids: torch.Tensor, output: torch.Tensor, pooling: Pooling) -> None:
    """Remembers a training pull: ``output`` is the leaf pooled from the rows
    of ``ids`` (``pooling``) whose ``.grad`` gives theirs."""
    items = getattr(_pending, "items", None)
    if items is None:
        items = _pending.items = []
    if len(items) >= _MAX_PENDING:
        log.warning(
            "%d SparseEmbedding pulls were never pushed: train through "
            "fleet.distributed_optimizer(...) so that step() updates sparse rows; "
            "dropping the oldest",
            len(items),
        )
        del items[: _MAX_PENDING // 2]
    items.append((name, ids, output, pooling))


def pending_rows() -> list[torch.Tensor]:
    """The output leaves of this thread's pending pulls, oldest first.

    A Hogwild trainer thread differentiates its loss with respect to them
    (``torch.autograd.grad``) and sets each one's ``.grad`` before
    ``take_gradients``: they are this thread's own leaves, unlike the dense
    parameters' shared ``.grad``.
    """
    return [output for _, _, output, _ in getattr(_pending, "items", None) or []]


def clear_pending() -> None:
    """Forgets this thread's pending pulls."""
    _pending.items = []


def take_gradients() -> dict[str, tuple[np.ndarray, torch.Tensor]]:
    """This thread's pending sparse gradients, merged per table: name ->
    (distinct uint64 ids, float32 grads [n, dim]). Pulls whose rows got no
    gradient are dropped."""
    return _merged(_take_pending())


def _take_pending() -> list[tuple[str, torch.Tensor, torch.Tensor, Pooling]]:
    """This thread's pending pulls whose output got a gradient (all are forgotten)."""
    items = getattr(_pending, "items", None) or []
    _pending.items = []
    return [item for item in items if item[2].grad is not None]


def _merged(
    items: list[tuple[str, torch.Tensor, torch.Tensor, Pooling]],
) -> dict[str, tuple[np.ndarray, torch.Tensor]]:
    per_table: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    for name, ids, output, pooling in items:
        per_table.setdefault(name, []).append((ids, pooling.rows_gradient(output.grad)))
    out: dict[str, tuple[np.ndarray, torch.Tensor]] = {}
    for name, parts in per_table.items():
        if len(parts) == 1:
            ids, grad = parts[0]
        else:
            # Several forwards of one table (modules sharing it, or several
            # forwards before a step): sum gradients of equal ids.
            all_ids = torch.cat([p[0] for p in parts])
            all_grads = torch.cat([p[1] for p in parts])
            ids, inverse = torch.unique(all_ids, return_inverse=True)
            grad = torch.zeros(ids.shape[0], all_grads.shape[1], dtype=all_grads.dtype)
            grad.index_add_(0, inverse, all_grads)
        out[name] = (as_u64(ids), grad)
    return out
