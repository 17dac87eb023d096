"""Role makers: where a process learns its place in the job (reference §5.3).

``PaddleCloudRoleMaker`` reads Paddle's environment variables (set by ``fleetrun``
or by a cluster scheduler) and, for collective jobs, torchrun's; with no role
environment at all it falls back to one local worker, so the same script runs on a
laptop. ``UserDefinedRoleMaker`` takes the same facts as arguments. Both produce a
``ClusterRole``; a missing or malformed variable is a ``RoleError`` that names it
and the value found (Paddle raises a bare ``ValueError`` for a few of them and
fails later, or not at all, for the rest).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from . import hosts
from .errors import RoleError
from .keys import read_job_key
from .role import ClusterRole, Role

__all__ = ["PaddleCloudRoleMaker", "RoleMakerBase", "UserDefinedRoleMaker"]


class RoleMakerBase:
    """What every role maker provides: the ``ClusterRole`` and the collective rendezvous.

    Attributes:
        is_collective: a collective (all-reduce) job rather than a PS job.
        master_endpoint: ``host:port`` of the collective rendezvous (rank 0's
            store), or None outside distributed collective jobs.
        local_rank: this process's rank on its machine (picks its GPU).
    """

    def __init__(self, is_collective: bool = False) -> None:
        if not isinstance(is_collective, bool):
            raise TypeError(
                f"is_collective must be a bool, got {is_collective!r} "
                f"({type(is_collective).__name__})"
            )
        self.is_collective = is_collective
        self.master_endpoint: str | None = None
        self.local_rank = 0
        self._role: ClusterRole | None = None

    def generate_role(self) -> ClusterRole:
        """Works the role out (once) and returns it.

        Raises:
            RoleError: the environment or the arguments are missing or malformed.
        """
        if self._role is None:
            self._role = self._make_role()
        return self._role

    def _make_role(self) -> ClusterRole:
        raise NotImplementedError

    # Paddle's (private) role-maker methods, for scripts that call them.
    def _generate_role(self) -> None:
        self.generate_role()

    def _is_worker(self) -> bool:
        return self.generate_role().is_worker

    def _is_server(self) -> bool:
        return self.generate_role().is_server

    def _is_first_worker(self) -> bool:
        role = self.generate_role()
        return role.is_worker and role.index == 0

    def _worker_index(self) -> int:
        return self.generate_role().index

    def _server_index(self) -> int:
        return self.generate_role().index

    def _worker_num(self) -> int:
        return self.generate_role().worker_num

    def _server_num(self) -> int:
        return self.generate_role().server_num

    def _get_trainer_endpoints(self) -> list[str]:
        return list(self.generate_role().worker_endpoints)

    def _get_pserver_endpoints(self) -> list[str]:
        return list(self.generate_role().server_endpoints)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.generate_role()})"


class PaddleCloudRoleMaker(RoleMakerBase):
    """The role from the environment, as Paddle's role maker of the same name.

    Parameter-server jobs (``is_collective=False``) read ``TRAINING_ROLE``
    (``TRAINER`` or ``PSERVER``), ``PADDLE_PSERVERS_IP_PORT_LIST``,
    ``PADDLE_TRAINERS_NUM``, ``PADDLE_TRAINER_ID`` (workers), ``POD_IP`` and
    ``PADDLE_PORT`` (servers) and, optionally, ``PADDLE_TRAINER_ENDPOINTS``.
    Without ``PADDLE_PSERVERS_IP_PORT_LIST`` the process runs as the single local
    worker (Paddle's non-distributed fallback).

    Collective jobs read torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``MASTER_ADDR`` and ``MASTER_PORT``, or else Paddle's ``PADDLE_TRAINER_ID``
    and ``PADDLE_TRAINER_ENDPOINTS`` (the first endpoint is the rendezvous); with
    neither, the local fallback.

    Every job reads its key (``FLEETFEED_JOB_KEY``, set by ``fleetrun``, or the
    file ``FLEETFEED_JOB_KEY_FILE`` names; ``trainer.job.keys``) into
    ``ClusterRole.job_secret``.

    A role that contradicts the launcher is a ``RoleError`` naming the fix, not
    a warning: a parameter-server role maker in one of several processes of a
    collective launch (torchrun's ``WORLD_SIZE`` > 1, or Paddle's
    ``PADDLE_TRAINER_ENDPOINTS`` of several workers), which would otherwise
    fall back to a job of its own in every process: N copies of worker 0 of
    1, each training on all the data and saving to the same place, results
    silently wrong; and a collective role maker in a process that a
    parameter-server launcher started (``TRAINING_ROLE`` or
    ``PADDLE_PSERVERS_IP_PORT_LIST`` set, no torchrun variables), whose
    servers have no collective role. Neither mix has a use that the other
    launcher or the other ``is_collective`` does not serve, and a warning would
    scroll by in N logs while the job ran.

    Args:
        is_collective: a collective job rather than a parameter-server job.
        environ: the environment to read (default ``os.environ``), for tests and
            for launchers that prepare one.
    """

    def __init__(
        self, is_collective: bool = False, *, environ: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(is_collective)
        self._env = os.environ if environ is None else environ

    def _make_role(self) -> ClusterRole:
        secret = read_job_key(self._env)
        if self.is_collective:
            return self._collective_role(secret)
        return self._ps_role(secret)

    # -- parameter server ----------------------------------------------------------

    def _ps_role(self, secret: str | None) -> ClusterRole:
        env = self._env
        servers_text = env.get("PADDLE_PSERVERS_IP_PORT_LIST")
        if not servers_text:
            if env.get("TRAINING_ROLE", "").strip() == "PSERVER":
                raise RoleError(
                    "TRAINING_ROLE is 'PSERVER' but PADDLE_PSERVERS_IP_PORT_LIST is "
                    f"{_found(servers_text)}: a server needs the list of server "
                    "endpoints"
                )
            launch = _collective_launch(env)
            if launch is not None:
                raise RoleError(
                    f"this process is {launch}, but a parameter-server role maker "
                    "(fleet.init() without is_collective=True) finds no parameter-server "
                    "roles (PADDLE_PSERVERS_IP_PORT_LIST is not set) and would run every "
                    "process as worker 0 of a job of its own: call "
                    "fleet.init(is_collective=True) for a collective job, or start a "
                    "parameter-server job with fleetrun --server_num=S --worker_num=W"
                )
            # Paddle's non-distributed fallback: one local worker.
            return ClusterRole(Role.WORKER, 0, 1, distributed=False, job_secret=secret)
        servers = _endpoints("PADDLE_PSERVERS_IP_PORT_LIST", servers_text)
        worker_num = _int_var(env, "PADDLE_TRAINERS_NUM", minimum=1)
        workers: tuple[str, ...] = ()
        if env.get("PADDLE_TRAINER_ENDPOINTS"):
            workers = _endpoints("PADDLE_TRAINER_ENDPOINTS", env["PADDLE_TRAINER_ENDPOINTS"])
            if len(workers) != worker_num:
                raise RoleError(
                    f"PADDLE_TRAINER_ENDPOINTS lists {len(workers)} endpoints but "
                    f"PADDLE_TRAINERS_NUM is {worker_num}: expected one endpoint per "
                    f"worker, found {env['PADDLE_TRAINER_ENDPOINTS']!r}"
                )
        role_text = _required(env, "TRAINING_ROLE").strip()
        if role_text == "TRAINER":
            index = _int_var(env, "PADDLE_TRAINER_ID", minimum=0)
            if index >= worker_num:
                raise RoleError(
                    f"PADDLE_TRAINER_ID must be below PADDLE_TRAINERS_NUM={worker_num}, "
                    f"found {index}"
                )
            return ClusterRole(Role.WORKER, index, worker_num, servers, workers, job_secret=secret)
        if role_text == "PSERVER":
            port = _int_var(env, "PADDLE_PORT", minimum=1, maximum=65535)
            ip = _required(env, "POD_IP").strip()
            index = _server_index(servers, ip, port)
            if index is None:
                raise RoleError(
                    f"this server's endpoint POD_IP:PADDLE_PORT = '{ip}:{port}' is not in "
                    f"PADDLE_PSERVERS_IP_PORT_LIST={servers_text!r}"
                )
            return ClusterRole(Role.SERVER, index, worker_num, servers, workers, job_secret=secret)
        raise RoleError(
            f"TRAINING_ROLE must be TRAINER or PSERVER, found {role_text!r}"
            + (" (heterogeneous training is not supported)" if role_text == "HETER_TRAINER" else "")
        )

    # -- collective ----------------------------------------------------------------

    def _collective_role(self, secret: str | None) -> ClusterRole:
        env = self._env
        if "WORLD_SIZE" in env or "RANK" in env:  # torchrun (or any env:// launcher)
            world_size = _int_var(env, "WORLD_SIZE", minimum=1)
            rank = _int_var(env, "RANK", minimum=0)
            if rank >= world_size:
                raise RoleError(f"RANK must be below WORLD_SIZE={world_size}, found {rank}")
            self.local_rank = (
                _int_var(env, "LOCAL_RANK", minimum=0) if "LOCAL_RANK" in env else rank
            )
            addr = _required(env, "MASTER_ADDR").strip()
            port = _int_var(env, "MASTER_PORT", minimum=1, maximum=65535)
            self.master_endpoint = f"{addr}:{port}"
            return ClusterRole(
                Role.WORKER, rank, world_size, is_collective=True, job_secret=secret
            )
        ps_role = env.get("TRAINING_ROLE", "").strip()
        ps_servers = env.get("PADDLE_PSERVERS_IP_PORT_LIST", "").strip()
        if ps_role or ps_servers:
            raise RoleError(
                f"this process was started as a parameter-server job's "
                f"{ps_role or 'process'} (TRAINING_ROLE={_found(env.get('TRAINING_ROLE'))}, "
                f"PADDLE_PSERVERS_IP_PORT_LIST={_found(env.get('PADDLE_PSERVERS_IP_PORT_LIST'))}: "
                "fleetrun --server_num/--worker_num or Paddle's environment), but a "
                "collective role maker (fleet.init(is_collective=True)) has no role for "
                "it: call fleet.init() for a parameter-server job, or start a collective "
                "job with fleetrun --nproc_per_node=N"
            )
        if env.get("PADDLE_TRAINER_ENDPOINTS"):  # Paddle's collective launcher
            workers = _endpoints("PADDLE_TRAINER_ENDPOINTS", env["PADDLE_TRAINER_ENDPOINTS"])
            rank = _int_var(env, "PADDLE_TRAINER_ID", minimum=0)
            if rank >= len(workers):
                raise RoleError(
                    f"PADDLE_TRAINER_ID must index PADDLE_TRAINER_ENDPOINTS "
                    f"({len(workers)} endpoints), found {rank}"
                )
            self.local_rank = rank
            self.master_endpoint = workers[0]
            return ClusterRole(
                Role.WORKER, rank, len(workers), worker_endpoints=workers,
                is_collective=True, job_secret=secret,
            )
        role = ClusterRole.local(is_collective=True)
        return ClusterRole(
            role.role, role.index, role.worker_num, is_collective=True,
            distributed=False, job_secret=secret,
        )


class UserDefinedRoleMaker(RoleMakerBase):
    """The role from arguments, as Paddle's ``UserDefinedRoleMaker``.

    Args:
        is_collective: a collective job rather than a parameter-server job.
        init_gloo: accepted for Paddle compatibility; fleetfeed needs no gloo store.
        current_id: this process's worker or server index.
        role: ``Role.WORKER`` or ``Role.SERVER`` (PS jobs).
        worker_num: workers in the job; 0 means ``len(worker_endpoints)``.
        server_endpoints: ``host:port`` of every parameter server (PS jobs).
        worker_endpoints: ``host:port`` of every worker; in a collective job the
            first one is the rendezvous.
        job_secret: the job's key (default: ``FLEETFEED_JOB_KEY`` or the file
            ``FLEETFEED_JOB_KEY_FILE`` names, ``trainer.job.keys``).

    Raises:
        RoleError: on inconsistent arguments (on ``generate_role()``).
    """

    def __init__(
        self,
        is_collective: bool = False,
        init_gloo: bool = False,
        *,
        current_id: int = 0,
        role: Role | int = Role.WORKER,
        worker_num: int = 0,
        server_endpoints: Iterable[str] = (),
        worker_endpoints: Iterable[str] = (),
        job_secret: str | None = None,
    ) -> None:
        super().__init__(is_collective)
        self._current_id = current_id
        self._role_arg = role
        self._worker_num_arg = worker_num
        self._servers = _endpoint_list("server_endpoints", server_endpoints)
        self._workers = _endpoint_list("worker_endpoints", worker_endpoints)
        self._secret = job_secret if job_secret is not None else read_job_key()

    def _make_role(self) -> ClusterRole:
        if not isinstance(self._current_id, int) or self._current_id < 0:
            raise RoleError(f"current_id must be an int >= 0, found {self._current_id!r}")
        if not isinstance(self._worker_num_arg, int) or self._worker_num_arg < 0:
            raise RoleError(f"worker_num must be an int >= 0, found {self._worker_num_arg!r}")
        worker_num = self._worker_num_arg or len(self._workers)
        if worker_num == 0:
            raise RoleError(
                "worker_num is 0 and worker_endpoints is empty: give the number of "
                "workers or their endpoints"
            )
        if self._workers and len(self._workers) != worker_num:
            raise RoleError(
                f"worker_endpoints lists {len(self._workers)} endpoints but worker_num "
                f"is {worker_num}"
            )
        if self.is_collective:
            if not self._workers:
                raise RoleError(
                    "a collective UserDefinedRoleMaker needs worker_endpoints (the "
                    "first one is the rendezvous), found none"
                )
            if self._current_id >= worker_num:
                raise RoleError(
                    f"current_id must be below the {worker_num} workers, found "
                    f"{self._current_id}"
                )
            self.master_endpoint = self._workers[0]
            self.local_rank = self._current_id
            return ClusterRole(
                Role.WORKER, self._current_id, worker_num, worker_endpoints=self._workers,
                is_collective=True, job_secret=self._secret,
            )
        try:
            role = Role(self._role_arg)
        except ValueError:
            raise RoleError(
                f"role must be Role.WORKER or Role.SERVER, found {self._role_arg!r}"
            ) from None
        if role not in (Role.WORKER, Role.SERVER):
            raise RoleError(f"role must be Role.WORKER or Role.SERVER, found {role!r}")
        if not self._servers:
            raise RoleError(
                "a parameter-server UserDefinedRoleMaker needs server_endpoints, found none"
            )
        limit = worker_num if role == Role.WORKER else len(self._servers)
        if self._current_id >= limit:
            what = "workers" if role == Role.WORKER else "server endpoints"
            raise RoleError(
                f"current_id must be below the {limit} {what}, found {self._current_id}"
            )
        return ClusterRole(
            role, self._current_id, worker_num, self._servers, self._workers,
            job_secret=self._secret,
        )


# -- parsing helpers ---------------------------------------------------------------


def _collective_launch(env: Mapping[str, str]) -> str | None:
    """What makes this process one of several in a collective launch, as text
    for an error; None when nothing does. Values that do not parse are left to
    the collective role maker, which names them."""
    try:
        world_size = int(env.get("WORLD_SIZE", "").strip())
    except ValueError:
        world_size = 0
    if world_size > 1:
        return (
            f"rank {env.get('RANK', '?')} of WORLD_SIZE={world_size} (torchrun, or fleetrun "
            "--nproc_per_node)"
        )
    workers = [e for e in env.get("PADDLE_TRAINER_ENDPOINTS", "").split(",") if e.strip()]
    if len(workers) > 1 and "PADDLE_TRAINER_ID" in env:
        return (
            f"trainer {env['PADDLE_TRAINER_ID']} of the {len(workers)} in "
            "PADDLE_TRAINER_ENDPOINTS (Paddle's collective launcher)"
        )
    return None


def _found(value: str | None) -> str:
    return "not set" if value is None else f"{value!r}"


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name)
    if value is None or not value.strip():
        raise RoleError(f"{name} must be set in the environment, found {_found(value)}")
    return value


def _int_var(
    env: Mapping[str, str], name: str, minimum: int, maximum: int | None = None
) -> int:
    text = _required(env, name)
    try:
        value = int(text.strip())
    except ValueError:
        raise RoleError(f"{name} must be an integer, found {text!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        bounds = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        raise RoleError(f"{name} must be an integer {bounds}, found {text!r}")
    return value


def _server_index(servers: tuple[str, ...], ip: str, port: int) -> int | None:
    """The index of the server at ``ip:port``: the same text (as Paddle), else
    the same port on a host that resolves to ``ip``'s address (the list may
    name the hosts where POD_IP gives the address, or the other way round)."""
    if f"{ip}:{port}" in servers:
        return servers.index(f"{ip}:{port}")
    wanted = hosts.addresses_of(ip)
    for index, endpoint in enumerate(servers):
        host, _, own_port = endpoint.rpartition(":")
        if int(own_port) == port and hosts.addresses_of(host) & wanted:
            return index
    return None


def _endpoints(name: str, text: str) -> tuple[str, ...]:
    """``"ip:port,ip:port"`` -> endpoints, each checked."""
    parts = [part.strip() for part in text.split(",")]
    return tuple(_endpoint(name, part, text) for part in parts)


def _endpoint_list(name: str, endpoints: Iterable[str]) -> tuple[str, ...]:
    if isinstance(endpoints, str):
        raise RoleError(f"{name} must be a list of 'host:port' strings, found {endpoints!r}")
    return tuple(_endpoint(name, str(e).strip(), str(e)) for e in endpoints)


def _endpoint(name: str, endpoint: str, whole: str) -> str:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise RoleError(
            f"{name} must be 'host:port' entries separated by commas, found "
            f"{endpoint!r} in {whole!r}"
        )
    return endpoint
