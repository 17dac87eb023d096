"""trainer: the fleet API, role makers, parameter-server and collective backends,
``Executor.train_from_dataset`` and the ``fleetrun`` launcher (see DESIGN.md).

``import trainer`` does not import torch: ``Executor`` (and the backends) load it
on first use, so ``fleetrun`` starts fast.
"""

from __future__ import annotations

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
from .job.strategy import DistributedStrategy
from .metrics import StreamingAUC, auc

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
