"""Helpers shared by the tests: paths, the small slot schema and its files,
child-process checks, waiting on a condition, and ports reserved for a job.

Fixtures and hooks live in ``conftest.py``; everything else that several test
files use lives here and is imported as ``from support import ...`` (pytest puts
``tests/`` on ``sys.path``; scripts the tests start add it themselves).
"""

from __future__ import annotations

import contextlib
import gzip
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import TypeVar

from datafeed import Slot

__all__ = [
    "PYTHON",
    "REAL_DATA",
    "REPO",
    "SMALL_SCHEMA",
    "child_pids",
    "reserved_ports",
    "run_collective_ranks",
    "small_line",
    "small_record",
    "wait_for",
    "write_small_files",
]

REPO = Path(__file__).resolve().parents[2]
REAL_DATA = REPO / "examples" / "data" / "real"  # samples of public data sets: its README.md
PYTHON = sys.executable

# A small schema with every kind of slot: dense float, sparse uint64, sparse
# int64, dense int64 label.
SMALL_SCHEMA = [
    Slot("dense", "float32", (3,)),
    Slot("ids", "uint64"),
    Slot("signed", "int64"),
    Slot("label", "int64", (1,)),
]


def small_record(i: int) -> dict:
    """Record number ``i`` of the small schema, as plain Python values."""
    return {
        "dense": [float(i), i + 0.5, -1.25],
        "ids": [i * 10 + k for k in range(1 + i % 3)],
        "signed": [-i, i] if i % 2 else [0],
        "label": [i % 2],
    }


def small_line(i: int) -> str:
    """Record number ``i`` of the small schema as one MultiSlot text line."""
    record = small_record(i)
    parts = []
    for name in ("dense", "ids", "signed", "label"):
        values = record[name]
        parts.append(" ".join([str(len(values))] + [str(v) for v in values]))
    return " ".join(parts) + "\n"


def write_small_files(directory: Path, files: int, per_file: int, gz: bool = False) -> list[str]:
    """Files of consecutive small records: file f holds records f*per_file ... ."""
    paths = []
    for f in range(files):
        text = "".join(small_line(f * per_file + i) for i in range(per_file))
        path = directory / (f"part-{f}.txt.gz" if gz else f"part-{f}.txt")
        if gz:
            with gzip.open(path, "wt") as out:
                out.write(text)
        else:
            path.write_text(text)
        paths.append(str(path))
    return paths


def child_pids() -> list[int]:
    """Live (non-zombie) child processes of this test process."""
    me = os.getpid()
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, ppid = fields[0], int(fields[1])
        if ppid == me and state != "Z":
            children.append(int(entry))
    return children


_T = TypeVar("_T")


def wait_for(
    condition: Callable[[], _T],
    what: str,
    timeout: float,
    interval: float = 0.05,
    details: Callable[[], object] | None = None,
) -> _T:
    """Polls ``condition`` until it returns a true value, and returns that value.

    Tests synchronise on a condition (a file written, a process gone), never on
    a fixed sleep: a sleep is too short on a loaded machine and wasted on an
    idle one.

    Args:
        condition: called every ``interval`` seconds; an exception from it
            propagates (fail fast, e.g. when a process it waits on has died).
        what: the awaited condition, for the failure message ("2 pid files").
        timeout: seconds before the test fails.
        details: called on a timeout; its result (logs, a status) is appended
            to the failure message.

    Raises:
        TimeoutError: the condition stayed false for ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = f": {details()}" if details is not None else ""
            raise TimeoutError(f"waited {timeout:g}s for {what}, in vain{extra}")
        time.sleep(interval)


@contextlib.contextmanager
def reserved_ports(count: int, host: str = "127.0.0.1") -> Iterator[list[int]]:
    """``count`` distinct ports on ``host`` that nothing else can take while the
    ``with`` block runs; the job that the block starts listens on them.

    The usual ``free_port()`` (bind port 0, read the number, close, hand the
    number over) races: between the close and the server's bind, any process
    may be given the same port, by its own ``bind(0)`` or as the local port of
    an outgoing connection. Here each port stays bound for the whole block, by
    a socket with ``SO_REUSEADDR`` that never listens. On Linux:

    - ``bind(host, 0)`` and the local port of ``connect()`` skip a port that
      has a bound socket, so no other process is given it;
    - an explicit bind to it without ``SO_REUSEADDR`` fails (``EADDRINUSE``);
    - a server that sets ``SO_REUSEADDR`` binds it and listens, and clients
      reach that listener. Every server the tests start on a given port does:
      the job's rendezvous store (``trainer.bind``), the parameter servers
      (``trainer.ps.transport``), the tests' own stand-in servers.

    Nothing listens on a reserved port until the job does, so a connection to
    it is refused: a port for "an unreachable server" too.

    A ``TCPStore`` on port 0 in the test process would also be race-free for a
    collective job, but every rank would then be a client of it, and the
    tests would no longer cover rank 0 hosting the store (as under fleetrun
    and Paddle's launcher); parameter-server endpoints are fixed ``host:port``
    strings anyway. One mechanism serves both.
    """
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, 0))
        yield [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def finish_job(procs: list, timeout: float, log_dir: Path) -> None:
    """Waits for every process of a test job (``timeout`` seconds in all), kills
    what is left, and asserts that each exited 0, showing the logs in
    ``log_dir`` (``*.log``) otherwise."""
    try:
        deadline = time.monotonic() + timeout
        for proc in procs:
            proc.wait(timeout=max(1, deadline - time.monotonic()))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    logs = {p.name: p.read_text()[-3000:] for p in log_dir.glob("*.log")}
    assert [p.returncode for p in procs] == [0] * len(procs), logs


def communicate_all(procs: list, timeout: float) -> list[str]:
    """The output of every process (``timeout`` seconds in all, piped stdout);
    kills and reaps what is left, on success and on failure."""
    deadline = time.monotonic() + timeout
    outputs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            outputs.append(out.decode(errors="replace"))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return outputs


def run_collective_ranks(
    script: Path, args: list[str], world_size: int = 2, timeout: float = 120,
    ranks: list[int] | None = None,
) -> list[tuple[int, str]]:
    """Runs ``script args`` as ``ranks`` (default all) of a ``world_size``-rank
    collective job on 127.0.0.1, with torchrun's variables (rank 0 hosts the
    rendezvous store on a reserved port); the exit status and output of each,
    after every process ended (``timeout`` seconds in all)."""
    import subprocess

    ranks = list(range(world_size)) if ranks is None else ranks
    with reserved_ports(1) as (port,):
        procs = [
            subprocess.Popen(
                [sys.executable, str(script), *args],
                env=dict(
                    os.environ, RANK=str(rank), WORLD_SIZE=str(world_size),
                    LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                    OMP_NUM_THREADS="1",
                ),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            )
            for rank in ranks
        ]
        outputs = communicate_all(procs, timeout)
    return [(proc.returncode, out) for proc, out in zip(procs, outputs, strict=True)]


class InProcessServers:
    """A ``ServerSet`` whose servers' handlers run in this process (no transport):
    a PS mode's steps against real ``ParameterServer`` objects. ``calls`` lists
    the handlers called, in order."""

    def __init__(self, servers: list) -> None:
        self.servers = list(servers)
        self.endpoints = tuple(f"in-process:{i}" for i in range(len(self.servers)))
        self.calls: list[str] = []

    def __len__(self) -> int:
        return len(self.servers)

    def call_async(self, index: int, func, *args, timeout=None) -> Future:
        from trainer.ps import server as handlers

        self.calls.append(func.__name__)
        handlers.install(self.servers[index])
        try:
            result = func(*args)
        finally:
            handlers.install(None)
        if isinstance(result, Future):  # push_sync: complete once the round is
            return result
        future: Future = Future()
        future.set_result(result)
        return future

    def wait(self, index: int, future: Future, what: str):
        return future.result(timeout=10)

    def call(self, index: int, func, *args, timeout=None):
        return self.wait(index, self.call_async(index, func, *args), func.__name__)

    def call_all(self, func, per_server_args=None, timeout=None) -> list:
        return [
            self.call(index, func, *(per_server_args[index] if per_server_args else ()))
            for index in range(len(self.servers))
        ]
