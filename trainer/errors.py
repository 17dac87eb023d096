"""Exceptions raised by the trainer (defined in ``trainer.job.errors``, below the
parameter-server package that raises them too); ``from trainer.errors import ...``
keeps working."""

from __future__ import annotations

from .job.errors import (
    CheckpointError,
    RoleError,
    ServerCallError,
    ServerUnavailableError,
    TrainerError,
    TrainerProcessError,
    WorkerFailedError,
)

__all__ = [
    "CheckpointError",
    "RoleError",
    "ServerCallError",
    "ServerUnavailableError",
    "TrainerError",
    "TrainerProcessError",
    "WorkerFailedError",
]
