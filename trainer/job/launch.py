"""``fleetrun``: starts a parameter-server or collective job on this machine.

Parameter-server mode (``--server_num``/``--servers``, ``--worker_num``/
``--trainer_num``/``--workers``)::

    fleetrun --server_num=1 --worker_num=2 train.py [args...]

sets each process's environment with Paddle's variable names (plus a fresh
``FLEETFEED_JOB_KEY``), writes ``<log_dir>/serverlog.N`` and
``<log_dir>/workerlog.N``, waits until every server's port accepts connections
before starting the workers, stops the servers when all workers exit 0 (exit
status 0), and stops the whole job with a non-zero status as soon as any process
fails (exits non-zero or is killed), naming it and printing the tail of its log.
A server that exits 0 is not a failure: its ``run_server()`` returns once every
worker has called ``stop_worker()``, which can be before the workers have exited.
Every child runs in its own process group and is stopped (SIGTERM, then SIGKILL)
on every path, Ctrl-C included, together with anything it started, in its group
or in a session of its own (a dataset's pipe commands): its whole process tree.
Each process gets ``OMP_NUM_THREADS=1`` unless the environment sets it (the
processes share the machine's cores).

On several hosts, every host runs the same ``fleetrun --servers ... --workers
...`` line with the same job key (``FLEETFEED_JOB_KEY`` or ``_FILE``); each
starts only the endpoints on its host (``--host``, else ``POD_IP`` when an
endpoint has it, else those on this machine's interface addresses,
``trainer.job.hosts``), with their indices in the whole job, waits only for its
own servers' ports (the workers wait, bounded, for the others'), and ends when
its own workers have (a host with servers only: when its servers return, once
every worker stopped).

With ``--max_restarts K`` a failed job is started again, whole, up to K times:
every process is stopped, then started again with the same endpoints and job
key, ``FLEETFEED_RESTART_COUNT`` (and ``TORCHELASTIC_RESTART_COUNT``) set to the
attempt's number and ``FLEETFEED_RESUME_DIR`` to the last checkpoint the first
worker completed with ``fleet.save_persistables`` (``trainer.job.restart``;
docs/restarts.md).

Collective mode (``--nproc_per_node``, ``--nnodes``, ...) starts the job through
``torch.distributed.run`` (torchrun) with a fixed rendezvous on this machine,
its store listening on ``--master_addr`` only (``trainer.job.bind``). Paddle's
``--gpus 0,1`` is one process per listed GPU, each seeing only its own, as
``cuda:0`` (``_run_collective``). The parameter-server variables of the
environment are dropped there, as torchrun's are in a parameter-server job.

Before starting anything, fleetrun refuses a script whose folder holds a
``trainer``, ``datafeed`` or ``generators`` module or package of the user's
(Fleet's quick start names its script ``trainer.py``): every process runs with
that folder first on ``sys.path``, so it would import that instead of
fleetfeed's package (``hiding_modules``); in collective mode the current folder
too, where torchrun's agent starts with ``python -m``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.machinery
import importlib.util
import os
import re
import secrets
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, NoReturn

from . import hosts, keys, restart
from .errors import CheckpointError

__all__ = ["FLEETFEED_PACKAGES", "hiding_modules", "main", "one_thread_unless_chosen"]

# fleetfeed's import packages, installed side by side (one distribution).
FLEETFEED_PACKAGES = ("datafeed", "generators", "trainer")
_PACKAGES_HOME = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
# Paddle's parameter-server variables (what fleetrun's PS mode sets): a collective
# job drops them, since a stale value would give its ranks a parameter-server role.
_PS_VARIABLES = (
    "TRAINING_ROLE", "PADDLE_PSERVERS_IP_PORT_LIST", "PADDLE_TRAINER_ENDPOINTS",
    "PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ID", "PADDLE_PORT",
)
LOG_TAIL_LINES = 20
STOP_GRACE_SECONDS = 5.0
POLL_SECONDS = 0.1
_SIGNALS_WHILE_STOPPING: list[int] = []  # signals that came while a job was being stopped


class _Interrupted(Exception):
    """SIGINT or SIGTERM reached the launcher."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass
class _Child:
    name: str  # "server 0", "worker 1"
    process: subprocess.Popen
    log_path: str
    log: IO[bytes]


# -- arguments -----------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetrun",
        description="Start a parameter-server or collective fleetfeed job on this machine.",
    )
    ps = parser.add_argument_group("parameter-server mode")
    ps.add_argument("--server_num", type=int, help="servers, on 127.0.0.1 with free ports")
    ps.add_argument("--worker_num", "--trainer_num", dest="worker_num", type=int,
                    help="workers (trainers)")
    ps.add_argument("--servers", default="", help="server endpoints 'ip:port,ip:port'")
    ps.add_argument("--workers", default="", help="worker endpoints 'ip:port,...' (or ips)")
    ps.add_argument("--host", default="",
                    help="this host's address: start the endpoints on it (default: POD_IP "
                         "if an endpoint has it, else those on this machine's addresses)")
    ps.add_argument("--start_timeout", type=float, default=60.0,
                    help="seconds to wait for the servers' ports (default 60)")
    ps.add_argument("--max_restarts", type=int, default=0,
                    help="restart the whole job up to this many times after a failure, "
                         "from its last checkpoint (default 0: a failure ends the job)")
    coll = parser.add_argument_group("collective mode (torch.distributed.run)")
    coll.add_argument("--nproc_per_node", type=int, help="processes on this machine")
    coll.add_argument("--gpus", "--selected_gpus", dest="gpus",
                      help="GPU ids '0,1' (Paddle's option): one process per GPU, each seeing "
                           "only its own as cuda:0 (CUDA_VISIBLE_DEVICES, LOCAL_RANK=0)")
    coll.add_argument("--nnodes", default="1", help="machines in the job (default 1)")
    coll.add_argument("--node_rank", type=int, default=0, help="this machine's rank")
    coll.add_argument("--master_addr", default="127.0.0.1", help="rendezvous host")
    coll.add_argument("--master_port", type=int, default=0, help="rendezvous port (0: a free one)")
    parser.add_argument("--log_dir", default="log", help="where the logs go (default log)")
    parser.add_argument("training_script", help="the script every process runs")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return parser


def _gpu_ids(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str] | None:
    """``--gpus``, checked: GPU ids, each once, as many as ``--nproc_per_node``
    when both are given, and among ``CUDA_VISIBLE_DEVICES`` when it is set (the
    ids are the machine's, as in Paddle's launcher). None without ``--gpus``."""
    if args.gpus is None:
        return None
    ids = [part.strip() for part in args.gpus.split(",")]
    if not all(re.fullmatch(r"[0-9]+", part) for part in ids):
        parser.error(f"--gpus must be GPU ids separated by commas ('0,1'), found {args.gpus!r}")
    ids = [str(int(part)) for part in ids]
    if len(set(ids)) != len(ids):
        parser.error(f"--gpus names a GPU twice: {args.gpus!r} (one process per GPU)")
    if args.nproc_per_node is not None and args.nproc_per_node != len(ids):
        parser.error(
            f"--nproc_per_node={args.nproc_per_node} and --gpus={args.gpus} ({len(ids)} GPUs) "
            "do not match: the job runs one process per GPU"
        )
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        not_visible = [gpu for gpu in ids if gpu not in {v.strip() for v in visible.split(",")}]
        if not_visible:
            parser.error(
                f"--gpus={args.gpus}: GPU {','.join(not_visible)} is not in this environment's "
                f"CUDA_VISIBLE_DEVICES={visible!r}; give GPUs among those, or unset it"
            )
    if not _torchrun_takes("--virtual-local-rank"):
        parser.error(
            "--gpus needs torchrun's --virtual-local-rank, which this torch lacks (newer "
            "releases have it): instead set CUDA_VISIBLE_DEVICES to the GPUs and give "
            "--nproc_per_node=<their count> (each rank then uses GPU number LOCAL_RANK)"
        )
    return ids


def _torchrun_takes(option: str) -> bool:
    """Whether the installed ``torch.distributed.run`` has ``option``, read from its
    source: fleetrun does not import torch (seconds), and which release first had
    an option is not recorded anywhere it could check."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return False
    path = os.path.join(spec.submodule_search_locations[0], "distributed", "run.py")
    try:
        with open(path, encoding="utf-8") as source:
            return f'"{option}"' in source.read()
    except OSError:
        return False


def hiding_modules(folder: str) -> list[tuple[str, str]]:
    """The modules in ``folder`` that a process with that folder first on
    ``sys.path`` (a script's own folder; the current one under ``python -m``)
    would import in place of fleetfeed's packages.

    Returns:
        ``(package, path)`` for each: a module (``trainer.py``, or compiled) or a
        package folder (with an ``__init__``), unless it is fleetfeed's own. A
        folder without ``__init__`` hides nothing: a package later on the path
        comes before a namespace portion.
    """
    found = []
    for name in FLEETFEED_PACKAGES:
        spec = importlib.machinery.PathFinder.find_spec(name, [folder])
        if spec is None or spec.origin is None:
            continue
        is_package = spec.submodule_search_locations is not None
        path = os.path.dirname(spec.origin) if is_package else spec.origin
        if os.path.realpath(path) != os.path.join(_PACKAGES_HOME, name):
            found.append((name, path))
    return found


def _refuse_hiding_modules(script: str, collective: bool) -> None:
    """Stops fleetrun, before it starts anything, when the job's processes would
    import one of the user's modules in place of fleetfeed's (``hiding_modules``)."""
    folders = {os.path.dirname(os.path.abspath(script)): "the script's folder"}
    if collective:
        # torchrun's agent starts as ``python -m``, with the current folder first.
        folders.setdefault(os.getcwd(), "the current folder (fleetrun starts torchrun with -m)")
    problems = [
        f"fleetrun: {path} hides fleetfeed's {name} package: the job's processes run with "
        f"{what}, {folder}, first on sys.path, so 'import {name}' there would load it "
        f"instead; rename it"
        + (" (train.py, say)" if os.path.basename(path) == "trainer.py" else "")
        for folder, what in folders.items()
        for name, path in hiding_modules(folder)
    ]
    if problems:
        raise SystemExit("\n".join(problems))


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _endpoints(parser: argparse.ArgumentParser, option: str, text: str) -> list[str]:
    endpoints = []
    for item in (part.strip() for part in text.split(",") if part.strip()):
        host, sep, port = item.rpartition(":")
        if not sep and not hosts.is_this_host(item):
            parser.error(
                f"{option}: {item!r} is not on this machine: give its port ('ip:port'), the "
                "same on every host's fleetrun"
            )
        elif not sep:  # an ip alone: a free port on it
            endpoints.append(f"{item}:{_free_port(item)}")
        elif host and port.isdigit() and 0 < int(port) < 65536:
            endpoints.append(item)
        else:
            parser.error(f"{option} must be 'ip:port' entries separated by commas, found {item!r}")
    return endpoints


def _ps_endpoints(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[list[str], list[str]]:
    servers = _endpoints(parser, "--servers", args.servers)
    if args.server_num is not None:
        if args.server_num < 1:
            parser.error(f"--server_num must be >= 1, got {args.server_num}")
        if servers and len(servers) != args.server_num:
            parser.error(
                f"--server_num={args.server_num} and --servers ({len(servers)} endpoints) "
                "do not match"
            )
        if not servers:
            servers = [f"127.0.0.1:{_free_port()}" for _ in range(args.server_num)]
    if not servers:
        parser.error("a parameter-server job needs --server_num or --servers")
    workers = _endpoints(parser, "--workers", args.workers)
    if args.worker_num is not None:
        if args.worker_num < 1:
            parser.error(f"--worker_num must be >= 1, got {args.worker_num}")
        if workers and len(workers) != args.worker_num:
            parser.error(
                f"--worker_num={args.worker_num} and --workers ({len(workers)} endpoints) "
                "do not match"
            )
        if not workers:
            workers = [f"127.0.0.1:{_free_port()}" for _ in range(args.worker_num)]
    if not workers:
        parser.error("a parameter-server job needs --worker_num or --workers")
    args.host = _pick_host(parser, args.host, servers + workers)
    return servers, workers


def _host_of(endpoint: str) -> str:
    return endpoint.rpartition(":")[0]


def _pick_host(parser: argparse.ArgumentParser, host: str, endpoints: list[str]) -> str:
    """This host's address as the job names it: ``--host``, else ``POD_IP`` when
    an endpoint is on it (Paddle's launchers set it), else "" (the endpoints on
    any of this machine's addresses). Some endpoint must be on this host."""
    pod_ip = os.environ.get("POD_IP", "").strip()
    if not host and pod_ip and any(_same_host(_host_of(e), pod_ip) for e in endpoints):
        host = pod_ip
    if host and not any(_same_host(_host_of(e), host) for e in endpoints):
        parser.error(f"--host {host}: none of the endpoints {','.join(endpoints)} is on it")
    if not host and not any(hosts.is_this_host(_host_of(e)) for e in endpoints):
        parser.error(
            f"none of the endpoints {','.join(endpoints)} is on this machine (its addresses: "
            f"{', '.join(sorted(hosts.local_addresses()))}): give this host's with --host"
        )
    return host


def _same_host(a: str, b: str) -> bool:
    return a == b or bool(hosts.addresses_of(a) & hosts.addresses_of(b))


def _on_this_host(args: argparse.Namespace, endpoints: list[str]) -> list[int]:
    """The indices of the endpoints this fleetrun starts: those on ``--host`` (or
    ``POD_IP``, ``_pick_host``), else those on this machine's addresses."""
    if args.host:
        return [i for i, e in enumerate(endpoints) if _same_host(_host_of(e), args.host)]
    local = hosts.local_addresses()
    return [i for i, e in enumerate(endpoints) if hosts.is_this_host(_host_of(e), local)]


# -- process management --------------------------------------------------------------


def _base_env() -> dict[str, str]:
    env = dict(os.environ)
    for proxy in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        env.pop(proxy, None)  # Paddle's launcher drops them too: they break local RPC
    return env


def _start(name: str, command: list[str], env: dict[str, str], log_path: str) -> _Child:
    attempt = env.get(restart.RESTART_COUNT_ENV, "0")
    # A restart appends: the log of the attempt that failed is what explains it.
    # Never through a symbolic link (_private_log_dir checked the folder).
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    flags |= os.O_TRUNC if attempt == "0" else os.O_APPEND
    try:
        log = os.fdopen(os.open(log_path, flags, 0o644), "wb")  # closed in _stop_all
    except OSError as error:
        raise SystemExit(f"fleetrun: cannot write {name}'s log {log_path}: {error.strerror} "
                         "(a symbolic link there is not followed)") from None
    if attempt != "0":
        log.write(f"fleetrun: restart {attempt}: {name} starts again\n".encode())
        log.flush()
    try:
        process = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
    except BaseException:
        log.close()
        raise
    return _Child(name, process, log_path, log)


def _groups_below(processes: Sequence[subprocess.Popen]) -> set[int]:
    """The process groups of ``processes`` (each leads its own) and of every
    process below the live ones, from /proc: a command a child started in a
    session of its own (a dataset's pipe command) is not in the child's group,
    and once the child is dead it is no longer below it either."""
    # datafeed (and pyarrow) only when a job stops: fleetrun starts light.
    from datafeed.source.process_groups import process_table

    table = process_table()
    below: dict[int, list[int]] = {}
    for pid, entry in table.items():
        below.setdefault(entry.parent, []).append(pid)
    groups = {process.pid for process in processes}
    pending = [process.pid for process in processes if process.poll() is None]
    while pending:
        for pid in below.get(pending.pop(), ()):
            groups.add(table[pid].group)
            pending.append(pid)
    groups.discard(os.getpgrp())  # never fleetrun's own
    return groups


def _signal_groups(groups: set[int], signum: int) -> None:
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signum)


def _stop_trees(processes: Sequence[subprocess.Popen], grace: float) -> None:
    """SIGTERM the process groups of ``processes`` and of everything they
    started, SIGKILL them once the processes ended or after ``grace`` seconds;
    reaps ``processes``. The groups are found before anything dies (an orphan
    is no longer below its parent) and again before the SIGKILL (what a child
    started meanwhile)."""
    groups = _groups_below(processes)
    _signal_groups(groups, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(max(deadline - time.monotonic(), 0.01))
    groups |= _groups_below(processes)
    _signal_groups(groups, signal.SIGKILL)  # also what the children left behind
    for process in processes:
        process.wait()


def _stop_all(children: Sequence[_Child]) -> None:
    """Stops every child's whole process tree (``_stop_trees``): SIGTERM, then
    SIGKILL what is left after a grace period."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        # A second Ctrl-C must not cut this short; it is acted on afterwards.
        signal.signal(signum, _note_signal_while_stopping)
    try:
        _stop_trees([child.process for child in children], STOP_GRACE_SECONDS)
    finally:
        for child in children:
            child.log.close()


def _note_signal_while_stopping(signum: int, _frame: object) -> None:
    _SIGNALS_WHILE_STOPPING.append(signum)


def _raise_signal_received_while_stopping() -> None:
    """Before a restart: puts back the handlers ``_stop_all`` replaced, and
    raises ``_Interrupted`` for a SIGINT/SIGTERM that came while stopping."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _raise_interrupted)
    if _SIGNALS_WHILE_STOPPING:
        raise _Interrupted(_SIGNALS_WHILE_STOPPING.pop())


def _tail(path: str, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with open(path, "rb") as log:
            text = log.read().decode("utf-8", "replace")
    except OSError as error:
        return f"(could not read {path}: {error})"
    return "\n".join(text.splitlines()[-lines:])


def _fail(child: _Child, what: str) -> None:
    print(
        f"fleetrun: {child.name} (pid {child.process.pid}) {what}; stopping the job. "
        f"Last lines of {child.log_path}:\n{_tail(child.log_path)}",
        file=sys.stderr, flush=True,
    )


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


def _port_open(endpoint: str) -> bool:
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False


def _remote_endpoints(endpoints: Sequence[str]) -> str | None:
    """The endpoints not on this machine's loopback, as text (None: all are)."""
    remote = [ep for ep in endpoints if not keys.is_loopback(ep.rpartition(":")[0])]
    return f"endpoints {', '.join(remote)}" if remote else None


def _job_key(other_hosts: str | None) -> str:
    """The key this job's processes share: the user's (``FLEETFEED_JOB_KEY`` or
    ``FLEETFEED_JOB_KEY_FILE``), else a fresh one when every endpoint is on this
    machine. A job across hosts needs the same key on every host's fleetrun, so
    one fleetrun cannot make it up alone ("": none, ``FLEETFEED_INSECURE=1``).

    Args:
        other_hosts: what puts the job on other hosts (for the error), or None.
    """
    key = keys.read_job_key()
    if key is not None:
        return key
    if other_hosts and keys.insecure_allowed():
        return ""  # no key: each host's fleetrun would make up a different one
    if other_hosts:
        raise SystemExit(
            f"fleetrun: {other_hosts} reaches other hosts: give every host's "
            f"fleetrun the same job key in {keys.KEY_ENV} or a file named by "
            f"{keys.KEY_FILE_ENV} (or set {keys.INSECURE_ENV}=1 on a trusted network)"
        )
    return secrets.token_hex(32)


def _private_log_dir(path: str) -> None:
    """Makes the log folder, and refuses one that another user owns or may
    write into: there they could put a link where a log goes (and the job
    would write its log over the file it names) or the restart record
    (``restart.RECORD_FILE``) that names the checkpoint a restart loads."""
    os.makedirs(path, exist_ok=True)
    info = os.stat(path)
    others_write = info.st_mode & stat.S_IWOTH or (
        info.st_mode & stat.S_IWGRP and info.st_gid != os.getegid()
    )
    if info.st_uid != os.geteuid() or others_write:
        raise SystemExit(
            f"fleetrun: --log_dir {path} is owned by uid {info.st_uid} with mode "
            f"{stat.S_IMODE(info.st_mode):04o}; expected a folder of this user (uid "
            f"{os.geteuid()}) that no other user may write into (the restart record that "
            "names the checkpoint to load is kept there)"
        )


def _run_ps(args: argparse.Namespace, servers: list[str], workers: list[str]) -> int:
    _private_log_dir(args.log_dir)
    command = [sys.executable, "-u", args.training_script, *args.training_script_args]
    common = _base_env()
    common.update(
        PADDLE_PSERVERS_IP_PORT_LIST=",".join(servers),
        PADDLE_TRAINER_ENDPOINTS=",".join(workers),
        PADDLE_TRAINERS_NUM=str(len(workers)),
        FLEETFEED_JOB_KEY=_job_key(_remote_endpoints(servers + workers)),
    )
    for name in ("PADDLE_TRAINER_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        common.pop(name, None)  # not this job's: a stale value would confuse a role maker
    # Every server and worker shares this machine's cores: torch's (and numpy's
    # BLAS) default of one intra-op thread per core in each process makes them
    # contend. One thread each unless the user chose: 10-20x the records/s of
    # examples/wide_and_deep_ps (1 server + 2 workers, 2 cores, with its own
    # set_num_threads(1) taken out: 2-6k records/s per worker without, 17-133k
    # with). torchrun does the same for several processes per node.
    one_thread_unless_chosen(common)
    others = [
        endpoints[i] for endpoints in (servers, workers)
        for i in sorted(set(range(len(endpoints))) - set(_on_this_host(args, endpoints)))
    ]
    if args.max_restarts and others:
        # Two fleetruns on one machine (--host on loopback aliases) count too:
        # each could restart only its own processes.
        raise SystemExit(
            f"fleetrun: --max_restarts restarts the processes this fleetrun started; "
            f"{', '.join(others)} belong to another fleetrun, whose processes it cannot "
            "restart (restarts are for jobs that one fleetrun starts whole)"
        )
    record = os.path.abspath(os.path.join(args.log_dir, restart.RECORD_FILE))
    with contextlib.suppress(FileNotFoundError):
        os.remove(record)  # an earlier job's: never resume from it
    resume = None
    for attempt in range(args.max_restarts + 1):
        env = dict(common, **restart.attempt_env(attempt, args.max_restarts, record, resume))
        status = _run_ps_attempt(args, servers, workers, command, env)
        if status == 0 or attempt == args.max_restarts:
            return status
        _raise_signal_received_while_stopping()
        try:
            last = restart.read_record(record)
        except CheckpointError as error:
            print(f"fleetrun: not restarting: {error}", file=sys.stderr, flush=True)
            return status
        resume = last["checkpoint"] if last else None
        origin = (f"from the checkpoint {resume}" if resume else
                  "with no checkpoint recorded (from the beginning, or from the job's own "
                  "commit log such as an online job's donefile.txt)")
        print(
            f"fleetrun: restart {attempt + 1} of {args.max_restarts}: starting every process "
            f"again, {origin}",
            file=sys.stderr, flush=True,
        )
    return status


def one_thread_unless_chosen(env: dict[str, str]) -> None:
    """Sets ``OMP_NUM_THREADS=1`` in ``env`` unless it holds a non-empty value
    (an empty one means torch's default pool, a thread per core, as unset does)."""
    if not env.get("OMP_NUM_THREADS", "").strip():
        env["OMP_NUM_THREADS"] = "1"


def _run_ps_attempt(
    args: argparse.Namespace, servers: list[str], workers: list[str], command: list[str],
    common: dict[str, str],
) -> int:
    """Runs every process of the job once; returns the job's status after
    stopping every one of them."""
    own_servers, own_workers = _on_this_host(args, servers), _on_this_host(args, workers)
    children: list[_Child] = []
    try:
        for index in own_servers:
            ip, _, port = servers[index].rpartition(":")
            env = dict(common, TRAINING_ROLE="PSERVER", POD_IP=ip, PADDLE_PORT=port)
            log_path = os.path.join(args.log_dir, f"serverlog.{index}")
            children.append(_start(f"server {index}", command, env, log_path))
        mine = [servers[index] for index in own_servers]
        print(f"fleetrun: started {len(mine)} servers at {','.join(mine)}", flush=True)

        # Only this host's servers: the workers wait (bounded) for the others'.
        deadline = time.monotonic() + args.start_timeout
        waiting = list(zip(mine, children, strict=True))
        while waiting:
            for child in children:
                if child.process.poll() is not None:
                    _fail(child, _describe_exit(child.process.returncode) + " while starting")
                    return child.process.returncode or 1
            waiting = [(e, c) for e, c in waiting if not _port_open(e)]
            if waiting and time.monotonic() > deadline:
                endpoint, child = waiting[0]
                _fail(child, f"did not listen on {endpoint} within {args.start_timeout:g}s")
                return 1
            if waiting:
                time.sleep(POLL_SECONDS)

        for index in own_workers:
            ip, _, port = workers[index].rpartition(":")
            env = dict(common, TRAINING_ROLE="TRAINER", PADDLE_TRAINER_ID=str(index),
                       POD_IP=ip, PADDLE_PORT=port)
            log_path = os.path.join(args.log_dir, f"workerlog.{index}")
            children.append(_start(f"worker {index}", command, env, log_path))
        print(f"fleetrun: started {len(own_workers)} workers; logs in {args.log_dir}/", flush=True)

        worker_children = children[len(own_servers):]
        # A host with servers only: its servers end the job, once every worker
        # (on the other hosts) has called stop_worker().
        finishers = worker_children or children
        while True:
            for child in children:
                returncode = child.process.poll()
                if returncode is None:
                    continue
                if returncode == 0:
                    # A worker that is done, or a server whose run_server()
                    # returned because every worker called stop_worker().
                    continue
                what = _describe_exit(returncode)
                if child not in worker_children:
                    what += " before the workers finished"
                _fail(child, what)
                return returncode if 0 < returncode < 256 else 1
            if all(child.process.poll() == 0 for child in finishers):
                print("fleetrun: all workers exited, stopping the servers", flush=True)
                return 0
            time.sleep(POLL_SECONDS)
    finally:
        _stop_all(children)


def _run_collective(args: argparse.Namespace, gpus: list[str] | None) -> int:
    """Starts the job through torchrun; with ``gpus``, torchrun's
    ``--virtual-local-rank`` gives rank i only ``gpus[i]`` as ``cuda:0``
    (``CUDA_VISIBLE_DEVICES``, ``LOCAL_RANK=0``): a rank cannot touch another's
    GPU, and a script that picks ``cuda:LOCAL_RANK`` finds its own."""
    if args.nproc_per_node < 1:
        raise SystemExit(f"fleetrun: --nproc_per_node must be >= 1, got {args.nproc_per_node}")
    if str(args.nnodes) != "1" and not args.master_port:
        raise SystemExit(
            f"fleetrun: --nnodes={args.nnodes} needs --master_port, the same on every host "
            f"(a free port is only known on {args.master_addr})"
        )
    port = args.master_port or _free_port(args.master_addr)
    command = [
        # torch.distributed.run, with its store listening on --master_addr only
        sys.executable, "-m", "trainer.job.bind",
        f"--nproc_per_node={args.nproc_per_node}",
        f"--nnodes={args.nnodes}",
        f"--node_rank={args.node_rank}",
        f"--master_addr={args.master_addr}",
        f"--master_port={port}",
        *(["--virtual-local-rank"] if gpus is not None else []),
        args.training_script, *args.training_script_args,
    ]
    env = _base_env()
    for name in _PS_VARIABLES:
        env.pop(name, None)  # not this job's: they would give a rank a parameter-server role
    if gpus is not None:  # torchrun hands rank i the i-th of these
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun warns and sets it otherwise
    # The ranks form their group through a store only it opens (trainer.job.store).
    several_hosts = str(args.nnodes) != "1" or not keys.is_loopback(args.master_addr)
    env[keys.KEY_ENV] = _job_key(f"--master_addr {args.master_addr}" if several_hosts else None)
    process = subprocess.Popen(command, env=env, start_new_session=True)
    try:
        return process.wait()
    finally:
        if process.poll() is None:
            _stop_trees([process], STOP_GRACE_SECONDS * 2)  # its ranks' commands too


def _raise_interrupted(signum: int, _frame: object) -> NoReturn:
    raise _Interrupted(signum)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``fleetrun`` console script. Returns the job's exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    ps_mode = any(
        value for value in (args.server_num, args.worker_num, args.servers, args.workers)
    )
    if args.max_restarts < 0:
        parser.error(f"--max_restarts must be >= 0, got {args.max_restarts}")
    if args.max_restarts and not ps_mode:
        parser.error(
            "--max_restarts is for parameter-server jobs; a collective job restarts with "
            "torchrun's own --max-restarts"
        )
    collective = args.nproc_per_node is not None or args.gpus is not None
    if ps_mode and collective:
        parser.error("give either parameter-server options or --nproc_per_node/--gpus, not both")
    if not ps_mode and not collective:
        parser.error(
            "give --server_num/--worker_num (parameter-server job) or --nproc_per_node "
            "or --gpus (collective job)"
        )
    gpus = _gpu_ids(parser, args)
    if gpus is not None:
        args.nproc_per_node = len(gpus)
    _refuse_hiding_modules(args.training_script, collective)
    _SIGNALS_WHILE_STOPPING.clear()
    previous = {
        signum: signal.signal(signum, _raise_interrupted)
        for signum in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        if ps_mode:
            servers, workers = _ps_endpoints(parser, args)
            status = _run_ps(args, servers, workers)
        else:
            status = _run_collective(args, gpus)
    except _Interrupted as interrupted:
        print(f"fleetrun: {interrupted}, stopped every process", file=sys.stderr, flush=True)
        status = 128 + interrupted.signum
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return status


if __name__ == "__main__":
    sys.exit(main())
