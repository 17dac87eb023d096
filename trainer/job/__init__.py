"""What a fleet job is, shared by every part of ``trainer``.

The leaf modules below the fleet API and both backends (``trainer.ps``,
``trainer.collective``), so that none of them imports the package above it:

- ``errors``: the exceptions ``trainer`` raises;
- ``role``: ``ClusterRole``, this process's place in the job;
- ``strategy``: ``DistributedStrategy``, how the job trains;
- ``bind``: the rendezvous stores that listen on the job's own address (imports
  ``torch.distributed``, so it is not imported here: ``import trainer`` stays
  free of torch).

``trainer``, ``trainer.errors``, ``trainer.role`` and ``trainer.strategy``
re-export these names; import them from there.
"""

from __future__ import annotations

from .errors import RoleError, ServerUnavailableError, TrainerError, WorkerFailedError
from .role import ClusterRole, Role
from .strategy import DistributedStrategy, parameter_server_mode

__all__ = [
    "ClusterRole",
    "DistributedStrategy",
    "Role",
    "RoleError",
    "ServerUnavailableError",
    "TrainerError",
    "WorkerFailedError",
    "parameter_server_mode",
]
