"""The parameter server's transport: ``torch.distributed.rpc`` (TensorPipe).

One static RPC group holds the job: servers are ranks ``0..S-1`` (named
``server<i>``), workers ranks ``S..S+W-1`` (``worker<i>``). The rendezvous store
listens on server 0's endpoint; every other server listens on its own endpoint
with a small accept-and-close socket, so a launcher (or a worker) can see that
each server is up. TensorPipe binds to the network interface that carries the
endpoints' address (``lo`` for 127.0.0.1), through ``TP_SOCKET_IFNAME``.

Every call a worker makes has a timeout; a call that a server does not answer
(unreachable, dead, hung) becomes ``ServerUnavailableError`` naming the
server's endpoint. Every handler on a server checks the job secret first.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import hmac
import logging
import os
import socket
import struct
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch.distributed import rpc

from ..job import bind
from ..job.errors import ServerUnavailableError, TrainerError

log = logging.getLogger(__name__)

# Seconds: how long a worker waits for a server to answer one call, and for a
# server's port to accept a connection at start-up. FLEETFEED_PS_TIMEOUT overrides.
DEFAULT_CALL_TIMEOUT = 30.0
# Seconds every process waits at start-up for the whole job to join the group.
DEFAULT_START_TIMEOUT = 300.0


def call_timeout() -> float:
    """Seconds a worker waits for one server call (``FLEETFEED_PS_TIMEOUT``)."""
    value = os.environ.get("FLEETFEED_PS_TIMEOUT")
    if value is None:
        return DEFAULT_CALL_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise TrainerError(f"FLEETFEED_PS_TIMEOUT must be a number of seconds > 0, got {value!r}")
    return seconds


def start_timeout() -> float:
    """Seconds to wait for the whole job: to join or leave the RPC group, for a
    synchronous step's slowest worker, at a barrier (``FLEETFEED_PS_START_TIMEOUT``)."""
    value = os.environ.get("FLEETFEED_PS_START_TIMEOUT")
    try:
        return float(value) if value else DEFAULT_START_TIMEOUT
    except ValueError:
        raise TrainerError(
            f"FLEETFEED_PS_START_TIMEOUT must be a number of seconds, got {value!r}"
        ) from None


def server_name(index: int) -> str:
    return f"server{index}"


def worker_name(index: int) -> str:
    return f"worker{index}"


def split_endpoint(endpoint: str) -> tuple[str, int]:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise TrainerError(f"a server endpoint must be 'host:port', got {endpoint!r}")
    return host.strip("[]"), int(port)


def interface_for(host: str) -> str | None:
    """The name of the local network interface that holds ``host``'s address."""
    try:
        address = socket.gethostbyname(host)
    except OSError:
        return None
    if address.startswith("127."):
        return "lo"
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                reply = fcntl.ioctl(probe.fileno(), siocgifaddr, array.array("B", request))
            except OSError:
                continue
            if socket.inet_ntoa(bytes(reply[20:24])) == address:
                return name
    return None


def wait_for_port(endpoint: str, timeout: float) -> None:
    """Returns once ``endpoint`` accepts a TCP connection.

    Raises:
        ServerUnavailableError: it did not within ``timeout`` seconds.
    """
    host, port = split_endpoint(endpoint)
    deadline = time.monotonic() + timeout
    last: OSError | None = None
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(2.0, timeout)):
                return
        except OSError as err:
            last = err
        if time.monotonic() >= deadline:
            raise ServerUnavailableError(
                f"parameter server {endpoint} did not accept a connection within "
                f"{timeout:g}s ({last}); is it running? (FLEETFEED_PS_TIMEOUT sets the bound)",
                endpoint=endpoint,
            )
        time.sleep(0.1)


class PresenceListener:
    """Accepts and closes connections on a server's endpoint (servers other
    than server 0, whose endpoint carries the rendezvous store)."""

    def __init__(self, endpoint: str) -> None:
        host, port = split_endpoint(endpoint)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ps-presence", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()


def init_group(
    name: str, rank: int, world_size: int, server_endpoints: Sequence[str], start_timeout: float
) -> None:
    """Joins the job's static RPC group (blocks until every process joined)."""
    host, port = split_endpoint(server_endpoints[0])
    ifname = interface_for(host)
    if ifname is not None:
        os.environ.setdefault("TP_SOCKET_IFNAME", ifname)
    options = rpc.TensorPipeRpcBackendOptions(
        init_method=f"{bind.SCHEME}://{host}:{port}",  # the store on its host only
        rpc_timeout=start_timeout,
        num_worker_threads=max(16, 2 * world_size),
    )
    with warnings.catch_warnings():
        # init_rpc exchanges device maps over a gloo group it builds itself, which
        # torch >= 2.0 reports as deprecated usage; nothing for callers to change.
        warnings.filterwarnings("ignore", message="You are using a Backend", category=UserWarning)
        rpc.init_rpc(name, rank=rank, world_size=world_size, rpc_backend_options=options)


def shutdown_group(graceful: bool = False, timeout: float = 30.0) -> None:
    """Leaves the RPC group. ``graceful``: first wait (up to ``timeout``) for
    every process to get here, so nobody sees its peers' pipes close; otherwise
    (or when that fails) leave at once, since peers may be gone."""
    if graceful:
        try:
            rpc.shutdown(graceful=True, timeout=timeout)
            return
        except Exception as err:  # noqa: BLE001 - fall back to a local shutdown
            log.warning("graceful rpc shutdown failed (%s); leaving without it", err)
    try:
        rpc.shutdown(graceful=False)
    except Exception as err:  # noqa: BLE001 - a failed shutdown must not mask the cause
        log.debug("rpc.shutdown failed: %s", err)


@contextlib.contextmanager
def leaving_group_after() -> Iterator[None]:
    """Runs the block, then leaves the RPC group: gracefully (every process waits
    for the others, up to ``start_timeout()``) when the block succeeded, at once
    when it raised (its peers may be gone)."""
    try:
        yield
    except BaseException:
        shutdown_group()
        raise
    shutdown_group(graceful=True, timeout=start_timeout())


# -- secret -----------------------------------------------------------------

_server_secret: str | None = None


def set_server_secret(secret: str | None) -> None:
    global _server_secret
    _server_secret = secret


def check_secret(secret: str | None) -> None:
    """Rejects a call that does not carry this job's secret (when the job has one)."""
    if _server_secret is None:
        return
    if secret is None or not hmac.compare_digest(str(secret), _server_secret):
        raise PermissionError(
            "parameter server rejected a call without this job's secret "
            "(FLEETFEED_JOB_SECRET differs: a process of another job?)"
        )


# -- calls ------------------------------------------------------------------


def _is_remote_exception(err: BaseException) -> bool:
    # A handler's own exception comes back with the server's traceback in its
    # message; a transport failure (timeout, reset, closed pipe) does not.
    return "Traceback (most recent call last)" in str(err)


class ServerSet:
    """A worker's view of the servers: parallel calls with timeouts."""

    def __init__(self, endpoints: Sequence[str], secret: str | None, timeout: float) -> None:
        self.endpoints = tuple(endpoints)
        self.secret = secret
        self.timeout = timeout

    def __len__(self) -> int:
        return len(self.endpoints)

    def unavailable(self, index: int, what: str, err: BaseException) -> ServerUnavailableError:
        endpoint = self.endpoints[index]
        return ServerUnavailableError(
            f"parameter server {index} at {endpoint} did not answer {what}: "
            f"{str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__} "
            f"(bound: {self.timeout:g}s, FLEETFEED_PS_TIMEOUT)",
            endpoint=endpoint,
        )

    def call_async(
        self, index: int, func: Callable[..., Any], *args: Any, timeout: float | None = None
    ) -> Any:
        try:
            return rpc.rpc_async(
                server_name(index),
                func,
                args=(self.secret, *args),
                timeout=self.timeout if timeout is None else timeout,
            )
        except RuntimeError as err:
            raise self.unavailable(index, func.__name__, err) from err

    def wait(self, index: int, future: Any, what: str) -> Any:
        try:
            return future.wait()
        except RuntimeError as err:
            if _is_remote_exception(err):
                raise
            raise self.unavailable(index, what, err) from err

    def call(
        self, index: int, func: Callable[..., Any], *args: Any, timeout: float | None = None
    ) -> Any:
        return self.wait(index, self.call_async(index, func, *args, timeout=timeout), func.__name__)

    def call_all(
        self, func: Callable[..., Any], per_server_args: Sequence[tuple] | None = None,
        timeout: float | None = None,
    ) -> list[Any]:
        """Calls ``func`` on every server in parallel; results in server order."""
        futures = []
        for index in range(len(self.endpoints)):
            args = () if per_server_args is None else per_server_args[index]
            futures.append(self.call_async(index, func, *args, timeout=timeout))
        return [self.wait(i, f, func.__name__) for i, f in enumerate(futures)]
