"""trainer: the fleet API, role makers, parameter-server and collective backends,
``Executor.train_from_dataset`` and the ``fleetrun`` launcher (see DESIGN.md).

``import trainer`` does not import torch: ``Executor`` (and the backends) load it
on first use, so ``fleetrun`` starts fast.

It fails at once, naming the file, when a module of the user's hides fleetfeed's
``datafeed`` or ``generators`` package (a script's folder comes first on
``sys.path``): every later use of that package would fail, or worse, run the
user's file. (A ``trainer.py`` that hides this package stops Python before any of
fleetfeed runs; ``fleetrun`` refuses it.)
"""

from __future__ import annotations

import importlib.util
import os
from typing import TYPE_CHECKING, Any

from . import fleet
from .fetch_handler import FetchHandler
from .job.errors import (
    RoleError,
    ServerUnavailableError,
    TrainerError,
    TrainerProcessError,
    WorkerFailedError,
)
from .job.role import ClusterRole, Role
from .job.role_maker import PaddleCloudRoleMaker, RoleMakerBase, UserDefinedRoleMaker
from .job.strategy import DistributedStrategy, StrategyFactory
from .metrics import StreamingAUC, auc


def _refuse_hidden_packages() -> None:
    """Raises ``ImportError`` when ``import datafeed`` or ``import generators``
    would load something other than the package installed beside this one."""
    home = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    for name in ("datafeed", "generators"):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):  # a module without a spec: nothing to compare
            continue
        if spec is None or spec.origin is None:  # not installed, or a namespace folder
            continue
        is_package = spec.submodule_search_locations is not None
        path = os.path.dirname(spec.origin) if is_package else spec.origin
        if os.path.realpath(path) != os.path.join(home, name):
            raise ImportError(
                f"{path} hides fleetfeed's {name} package: 'import {name}' finds it first "
                f"on sys.path (a script's own folder comes first); rename it",
                name=name, path=path,
            )


_refuse_hidden_packages()

if TYPE_CHECKING:
    from .executor import Executor, RunSummary

__all__ = [
    "ClusterRole",
    "DistributedStrategy",
    "Executor",
    "FetchHandler",
    "PaddleCloudRoleMaker",
    "Role",
    "RoleError",
    "RoleMakerBase",
    "RunSummary",
    "ServerUnavailableError",
    "StrategyFactory",
    "StreamingAUC",
    "TrainerError",
    "TrainerProcessError",
    "UserDefinedRoleMaker",
    "WorkerFailedError",
    "auc",
    "fleet",
]


def __getattr__(name: str) -> Any:
    if name in ("Executor", "RunSummary"):
        from . import executor

        return getattr(executor, name)
    raise AttributeError(f"module 'trainer' has no attribute {name!r}")
