"""What a process is in a job: the record every role maker produces.

Role makers (trainer/job/role_maker.py) read it from the environment or from their
arguments; the fleet API and the parameter-server runtime only read this record.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Role(enum.IntEnum):
    """Paddle's role numbers."""

    WORKER = 1
    SERVER = 2
    HETER_WORKER = 3
    ALL = 4


@dataclass(frozen=True)
class ClusterRole:
    """This process's place in the job.

    Attributes:
        role: WORKER or SERVER.
        index: this worker's index (0..worker_num-1) or this server's index.
        worker_num: workers in the job.
        server_endpoints: ``host:port`` of every parameter server (PS jobs).
        worker_endpoints: ``host:port`` of every worker, where known.
        is_collective: a collective (all-reduce) job rather than a PS job.
        distributed: False for the single-process fallback (no role environment).
        job_secret: the job key shared by the job's processes (set by
            fleetrun, ``trainer.job.keys``): the PS transport's and the stores'
            keys derive from it; None when unset.
    """

    role: Role
    index: int
    worker_num: int
    server_endpoints: tuple[str, ...] = ()
    worker_endpoints: tuple[str, ...] = ()
    is_collective: bool = False
    distributed: bool = True
    # Never in a repr: fleet.init logs the role, and logs are not secret.
    job_secret: str | None = field(default=None, repr=False)

    @property
    def is_worker(self) -> bool:
        """Whether this process is a worker (trainer)."""
        return self.role == Role.WORKER

    @property
    def is_server(self) -> bool:
        """Whether this process is a parameter server."""
        return self.role == Role.SERVER

    @property
    def server_num(self) -> int:
        """The number of parameter servers (0 in a collective or local job)."""
        return len(self.server_endpoints)

    @classmethod
    def local(cls, is_collective: bool = False) -> ClusterRole:
        """The non-distributed fallback: one worker, no servers."""
        return cls(Role.WORKER, 0, 1, is_collective=is_collective, distributed=False)
