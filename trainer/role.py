"""What a process is in a job (defined in ``trainer.job.role``, below the
parameter-server package that reads it too); ``from trainer.role import ...``
keeps working."""

from __future__ import annotations

from .job.role import ClusterRole, Role

__all__ = ["ClusterRole", "Role"]
