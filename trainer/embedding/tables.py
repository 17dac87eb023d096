"""The registry of live ``SparseEmbedding`` modules, by table name.

How a runtime learns each table's dim and settings from the model the script
built (``models_holding`` the optimizer's parameters, then their
``model_tables``), without importing ``trainer.nn``: every module registers its
``TableConfig`` when it is made, and modules sharing a name share one table.
"""

from __future__ import annotations

import gc
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..ps.tables.entries import CtrAccessorParam, EntryAttr
from ..ps.tables.optim import OptimizerSpec
from ..ps.tables.table import SparseTable

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

__all__ = [
    "DEFAULT_INIT_SCALE",
    "TableConfig",
    "model_tables",
    "models_holding",
    "register",
    "registered_config",
    "table_configs",
]

DEFAULT_INIT_SCALE = 0.01


@dataclass(frozen=True)
class TableConfig:
    """What every process must agree on about one sparse table.

    ``entry``, ``accessor`` and ``max_rows``: the table's lifecycle
    (``trainer.ps.tables.entries``; ``max_rows`` is the whole table's budget, split
    evenly among the servers). ``storage``: how the table (on the servers, or
    in this process) keeps its rows (``SparseTable``'s ``storage``); a GEO
    worker's local copy is float32 whatever it says.
    """

    name: str
    dim: int
    seed: int
    init_scale: float
    optimizer: Mapping[str, Any] | None  # the table's own override, if any
    entry: EntryAttr | None = None
    accessor: CtrAccessorParam = CtrAccessorParam()
    max_rows: int | None = None
    storage: str = "float32"

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
            storage=self.storage if lifecycle else "float32",
        )

    def same_table(self, table: SparseTable) -> bool:
        """Whether ``table`` was made from settings equal to these (local mode)."""
        return (table.dim, table.seed, table.init_scale, table.entry, table.accessor) == (
            self.dim, self.seed, self.init_scale, self.entry, self.accessor
        ) and table.max_rows == self.max_rows and table.storage == self.storage

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
    """Configs of the tables of every live SparseEmbedding, by name (sorted).

    Process-wide: another model still alive (or not yet collected) adds its
    tables. A runtime takes its model's own (``model_tables``); only a Hogwild
    run whose model is no ``torch.nn.Module`` falls back to this.
    """
    with _registry_lock:
        return {
            name: _configs[name] for name in sorted(_modules) if len(_modules[name])
        }


def model_tables(model: torch.nn.Module) -> dict[str, TableConfig]:
    """Configs of the tables of ``model``'s own SparseEmbedding modules, by name."""
    with _registry_lock:
        found = (_module_configs.get(module) for module in model.modules())
        return {config.name: config for config in found if config is not None}


def models_holding(params: Iterable[torch.Tensor]) -> list[torch.nn.Module]:
    """The outermost live modules that hold any of ``params``, themselves or
    in a submodule: the models an optimizer over ``params`` trains (a module
    that holds the model, e.g. a ModuleDict of models, is then the model).
    Empty when no module holds any of them.

    A torch module does not know its parents, and a fleet script hands the
    runtime its optimizer only (Paddle's ``distributed_optimizer(optimizer)``),
    so the modules are found among the objects the garbage collector tracks:
    one pass over them per call.
    """
    wanted = {id(p) for p in params}
    holders: list[torch.nn.Module] = []
    parents: dict[int, list[torch.nn.Module]] = {}
    for obj in gc.get_objects():
        # type(), not isinstance(): no ``__class__`` lookup on arbitrary objects.
        if not issubclass(type(obj), torch.nn.Module):
            continue
        try:
            if any(id(p) in wanted for p in obj.parameters(recurse=False)):
                holders.append(obj)
            for child in obj.children():
                parents.setdefault(id(child), []).append(obj)
        except AttributeError:  # a module whose ``nn.Module.__init__`` has not run
            continue
    outermost: dict[int, torch.nn.Module] = {}
    seen: set[int] = set()
    to_visit = holders
    while to_visit:
        module = to_visit.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        above = parents.get(id(module))
        if above:
            to_visit.extend(above)
        else:
            outermost[id(module)] = module
    return list(outermost.values())


def registered_config(name: str) -> TableConfig | None:
    """The config last registered under ``name``, None if none was."""
    with _registry_lock:
        return _configs.get(name)
