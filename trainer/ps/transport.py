"""The parameter server's transport: ZeroMQ over TCP, authenticated with CURVE.

Each server binds a ROUTER socket on its own endpoint (its host's address
only); each worker connects one DEALER socket to every server. Messages are
``trainer.ps.wire``'s: a JSON header and raw array frames, never pickle.

Authentication happens in ZeroMQ's CURVE handshake, before any message reaches
this code: the servers' key pair and the workers' key pair are derived from the
job key (``trainer.job.keys``), a worker must know the servers' public key to
start the handshake, and the server's ZAP handler admits only the workers'
public key. A peer without the job key completes no handshake; the server logs
it (address and reason) and never sees a byte of its payload. Traffic is
encrypted. A job without a key (loopback only, or ``FLEETFEED_INSECURE=1``)
uses ZeroMQ's NULL mechanism: any peer that reaches the port is served, but can
still only send the fixed messages of ``wire.OPS``.

Threads: each side has one I/O thread that owns its sockets (ZeroMQ sockets are
not thread-safe); other threads hand it messages through an in-process queue
socket. A server runs handlers on a thread pool; a handler that returns a
future (a synchronous round, a barrier) holds no thread while it waits.

Every call a worker makes has a timeout; a call that a server does not answer
(unreachable, dead, hung), or whose connection drops, becomes
``ServerUnavailableError`` naming the server's endpoint.

What a peer can make a server hold, and for how long (SECURITY.md has the
figures): ZeroMQ takes no frame over ``MAX_FRAME_BYTES`` (wire's frame plus
CURVE's box), handshake frames included, and drops the connection of a peer
that announces one; a connection that has not completed its handshake within
``HANDSHAKE_DEADLINE_S`` is closed; a server raises its open-file limit to the
hard limit, so that idle connections do not lock workers out. ZeroMQ offers no
cap on the number of connections (per address or unauthenticated), so these
bound each one's cost and lifetime instead. A message from an authenticated
peer that does not decode, or whose handler fails, is answered with an error
(or dropped when its id is unreadable); nothing it holds stops the server's
I/O thread. Refusals are logged at most once per 10 s, with a count.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from ..job.errors import ServerCallError, ServerUnavailableError, TrainerError
from ..job.keys import derive
from . import wire

log = logging.getLogger(__name__)

# Seconds: how long a worker waits for a server to answer one call, and for a
# server's port to accept a connection at start-up. FLEETFEED_PS_TIMEOUT overrides.
DEFAULT_CALL_TIMEOUT = 30.0
# Seconds a job waits for its slowest member: a synchronous round, a barrier,
# the other workers at stop_worker (FLEETFEED_PS_START_TIMEOUT overrides).
DEFAULT_START_TIMEOUT = 300.0
# Bytes ZeroMQ takes in one frame, before any check of ours and before the
# handshake (its frames are held whole too): a wire frame plus the 33 bytes of
# a CURVE MESSAGE command around it (RFC 26), rounded up. A peer that announces
# more is disconnected at once.
MAX_FRAME_BYTES = wire.MAX_FRAME_BYTES + 64
# Seconds a connection may take from TCP accept to a completed handshake
# (greeting, CURVE, ZAP) before the server closes it: how long an outsider's
# connection lives. Ample for a worker: the handshake is two round trips.
HANDSHAKE_DEADLINE_S = 5.0
# Characters of a handler's error message sent back (bounds the reply header).
MAX_ERROR_CHARS = 4000
_ZAP_ENDPOINT = "inproc://zeromq.zap.01"
_POLL_MS = 100
_HANDSHAKE_FAILURES = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
# What a worker's connection reports: its handshakes and its drops.
_CLIENT_EVENTS = zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | _HANDSHAKE_FAILURES
# Why a connection that never completed its handshake closed, as far as a worker can tell.
NO_HANDSHAKE = (
    "the connection closed before its handshake completed: the server holds another job "
    "key (every role must read the same one, from FLEETFEED_JOB_KEY or the file "
    "FLEETFEED_JOB_KEY_FILE names), speaks another protocol, or the "
    f"handshake's few round trips take over its {HANDSHAKE_DEADLINE_S:g} s deadline"
)


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
    """Seconds to wait for the whole job: a synchronous step's slowest worker,
    a barrier, the other workers at stop (``FLEETFEED_PS_START_TIMEOUT``)."""
    value = os.environ.get("FLEETFEED_PS_START_TIMEOUT")
    try:
        return float(value) if value else DEFAULT_START_TIMEOUT
    except ValueError:
        raise TrainerError(
            f"FLEETFEED_PS_START_TIMEOUT must be a number of seconds, got {value!r}"
        ) from None


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``host:port`` as (host, port).

    Raises:
        TrainerError: ``endpoint`` is not ``host:port``.
    """
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise TrainerError(f"a server endpoint must be 'host:port', got {endpoint!r}")
    return host.strip("[]"), int(port)


def _tcp(endpoint: str) -> str:
    host, port = split_endpoint(endpoint)
    address = socket.gethostbyname(host)  # ZeroMQ binds addresses, not names
    return f"tcp://{address}:{port}"


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


class _RefusalLog:
    """Warns of refused peers: the first at once, then at most one line per
    ``every`` seconds with the count since (a peer that retries in a loop, as
    ZeroMQ and TCPStore clients do, must not flood the log)."""

    def __init__(self, every: float = 10.0) -> None:
        self._every = every
        self._last = -float("inf")
        self._since = 0
        self._lock = threading.Lock()

    def warn(self, message: str, *args: Any, exc_info: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last < self._every:
                self._since += 1
                return
            since, self._since, self._last = self._since, 0, now
        if since:
            message += f" ({since} more since the last report)"
        log.warning(message, *args, exc_info=exc_info)


# -- keys ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CurveKeys:
    """The job's two CURVE key pairs (Z85 text), derived from the job key."""

    server_public: bytes
    server_secret: bytes
    worker_public: bytes
    worker_secret: bytes

    @classmethod
    def from_job_key(cls, key: str | None, use: str = "ps") -> CurveKeys | None:
        """The key pairs of a job key for one ``use`` (the parameter servers',
        ``"ps"``, or a rendezvous store's); None without a key: NULL mechanism."""
        if key is None:
            return None
        server_secret = z85.encode(derive(key, f"{use}/curve/server"))
        worker_secret = z85.encode(derive(key, f"{use}/curve/worker"))
        return cls(
            zmq.curve_public(server_secret), server_secret,
            zmq.curve_public(worker_secret), worker_secret,
        )


class _Authenticator:
    """ZeroMQ's ZAP handler for one context: admits CURVE peers that hold the
    workers' key, refuses (and logs) every other peer."""

    def __init__(
        self, context: zmq.Context, keys: CurveKeys, where: str, refusals: _RefusalLog
    ) -> None:
        self._worker_key = z85.decode(keys.worker_public)
        self._where = where
        self._refusals = refusals
        self._socket = context.socket(zmq.REP)
        self._socket.linger = 0
        self._socket.bind(_ZAP_ENDPOINT)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ps-zap", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(_POLL_MS):
                continue
            request = self._socket.recv_multipart()
            try:
                self._answer(request)
            except Exception:  # noqa: BLE001 - a dead ZAP thread would stall every handshake
                log.exception("%s: the ZAP handler failed on one request", self._where)
                if self._socket.getsockopt(zmq.EVENTS) & zmq.POLLOUT:  # REP owes a reply
                    self._socket.send_multipart([b"1.0", b"", b"500", b"ZAP failed", b"", b""])

    def _answer(self, request: list[bytes]) -> None:
        try:
            version, request_id, _domain, address, _identity, mechanism, *credentials = request
        except ValueError:
            self._socket.send_multipart([b"1.0", b"", b"500", b"bad ZAP request", b"", b""])
            return
        admitted = mechanism == b"CURVE" and credentials[:1] == [self._worker_key]
        if admitted:
            reply = [version, request_id, b"200", b"OK", b"worker", b""]
        else:
            self._refusals.warn(
                "%s refused a connection from %s: it did not prove this job's key "
                "(mechanism %s)", self._where, address.decode(errors="replace"),
                mechanism.decode(errors="replace"),
            )
            reply = [version, request_id, b"400", b"not this job's key", b"", b""]
        self._socket.send_multipart(reply)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._socket.close()


# -- server side ----------------------------------------------------------------


Handler = Callable[..., Any]


class ServerEndpoint:
    """A server's listening socket: decodes requests, runs ``handlers[op](*args)``
    on a thread pool and sends each result (or future's result) back.

    Args:
        endpoint: ``host:port`` to bind (that address only).
        keys: the job's CURVE keys, or None (NULL mechanism).
        handlers: operation name -> function (``wire.OPS`` names).
        threads: handler threads.
        name: how log lines name this server.
        ops: the operations' signatures its messages are checked against
            (``wire.OPS``, the parameter server's, unless given).
        max_queued_replies: replies held for one connection whose peer does
            not read them, beyond which ZeroMQ drops them (its default: 1000).
        worker_ops, worker_num: operations whose first argument is a worker
            index in [0, ``worker_num``): the first connection to name an index
            holds it, and another's message naming it is refused (``_claim``).
    """

    def __init__(
        self, endpoint: str, keys: CurveKeys | None, handlers: dict[str, Handler],
        threads: int, name: str, ops: dict[str, tuple[Any, ...]] | None = None,
        max_queued_replies: int | None = None, worker_ops: Collection[str] = (),
        worker_num: int = 0,
    ) -> None:
        self.endpoint = endpoint
        self.name = name
        self._handlers = handlers
        self._ops = wire.OPS if ops is None else ops
        self._worker_ops = frozenset(worker_ops)
        self._worker_num = worker_num
        self._claims: dict[int, bytes] = {}  # worker index -> its connection's routing id
        _raise_open_file_limit(name)
        self._context = zmq.Context()
        self._refusals = _RefusalLog()
        self._message_refusals = _RefusalLog()
        self._auth = (
            None if keys is None else _Authenticator(self._context, keys, name, self._refusals)
        )
        self._router = self._context.socket(zmq.ROUTER)
        self._router.linger = 2000  # the last replies (stop_worker's) still go out
        # A worker that reconnects (same routing id) takes its place again.
        self._router.router_handover = 1
        _bound_connections(self._router)
        if max_queued_replies is not None:
            self._router.sndhwm = max_queued_replies
        if keys is not None:
            self._router.curve_server = True
            self._router.curve_secretkey = keys.server_secret
            self._router.curve_publickey = keys.server_public
        self._monitor = self._router.get_monitor_socket(_HANDSHAKE_FAILURES)
        try:
            self._router.bind(_tcp(endpoint))
        except zmq.ZMQError as err:
            self._close_sockets()
            raise TrainerError(f"{name} cannot listen on {endpoint}: {err}") from None
        inbox = f"inproc://ps-replies-{id(self)}"
        self._replies = self._context.socket(zmq.PULL)
        self._replies.bind(inbox)
        self._reply_push = self._context.socket(zmq.PUSH)
        self._reply_push.connect(inbox)
        self._reply_lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="ps-call")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ps-server-io", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        for sock in (self._router, self._replies, self._monitor):
            poller.register(sock, zmq.POLLIN)
        while not self._stop.is_set():
            for sock, _ in poller.poll(_POLL_MS):
                try:
                    self._serve_one(sock)
                except Exception:  # noqa: BLE001 - the one thread that serves every worker
                    self._message_refusals.warn(
                        "%s: the I/O thread survived an unexpected error", self.name,
                        exc_info=True,
                    )

    def _serve_one(self, sock: zmq.Socket) -> None:
        if sock is self._router:
            self._receive(self._router.recv_multipart(copy=False))
        elif sock is self._replies:
            self._router.send_multipart(self._replies.recv_multipart(copy=False))
        else:
            event = recv_monitor_message(self._monitor)
            if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                # Closed before a greeting (a port probe: fleetrun's and the workers'
                # wait_for_port make them), or idle past the handshake deadline.
                log.debug("%s: a connection closed before its handshake", self.name)
                return
            self._refusals.warn(
                "%s refused a connection on %s: handshake failed (%s); a peer "
                "without this job's key, or of another protocol", self.name,
                self.endpoint, _event_name(event["event"]),
            )

    def _receive(self, frames: list[zmq.Frame]) -> None:
        routing, message = frames[0], frames[1:]
        try:
            header, body = wire.decode(message)
        except wire.ProtocolError as err:
            self._refuse(routing, message, err)
            return
        try:
            args = wire.check_args(header.get("op"), body, self._ops)
        except wire.ProtocolError as err:
            err.request_id = header["id"]
            self._refuse(routing, message, err)
            return
        if header["op"] in self._worker_ops:
            refusal = self._claim(args[0], routing.bytes)
            if refusal is not None:
                self._message_refusals.warn("%s refused a message: %s", self.name, refusal)
                self._reply(routing, header["id"], error=refusal)
                return
        try:
            self._pool.submit(self._call, routing, header["id"], header["op"], args)
        except RuntimeError as err:  # the pool is shut down: this server is closing
            self._reply(routing, header["id"], error=err)

    def _claim(self, worker: int, routing: bytes) -> ValueError | None:
        """Ties worker index ``worker`` to the connection that names it first
        (its routing id, which a worker draws at random and keeps across
        reconnects): every worker holds the job's key, so without this one
        could speak for another, stop the server with every index's
        ``worker_done``, or release a barrier the others have not reached;
        a second process given the same index is refused too. Called on the
        I/O thread only. None: ``worker`` is that connection's."""
        if not 0 <= worker < self._worker_num:
            return ValueError(
                f"{self.name}: expected a worker index in [0, {self._worker_num}), found {worker}"
            )
        owner = self._claims.setdefault(worker, routing)
        if owner == routing:
            return None
        return ValueError(
            f"{self.name}: worker {worker} is another connection's; two processes were "
            "given the same worker index (each worker needs its own), this worker "
            "connected a second time (init_worker() again, or the process restarted "
            "alone while the servers run: restart the whole job), or a peer named "
            "another worker"
        )

    def _refuse(
        self, routing: zmq.Frame, message: list[zmq.Frame], err: wire.ProtocolError
    ) -> None:
        """Logs (rate-limited) and answers a message that is not this protocol's;
        one whose id is unreadable gets no answer."""
        try:
            peer = message[0].get("Peer-Address") if message else "?"
        except zmq.ZMQError:
            peer = "?"
        self._message_refusals.warn("%s refused a message from %s: %s", self.name, peer, err)
        if err.request_id is not None:
            self._reply(routing, err.request_id, error=err)

    def _call(self, routing: zmq.Frame, request_id: int, op: str, args: list) -> None:
        try:
            result = self._handlers[op](*args)
        except Exception as err:  # noqa: BLE001 - the caller gets it as its call's error
            self._reply(routing, request_id, error=err)
            return
        if isinstance(result, concurrent.futures.Future):
            result.add_done_callback(lambda done: self._reply_future(routing, request_id, done))
        else:
            self._reply(routing, request_id, body=result)

    def _reply_future(self, routing: zmq.Frame, request_id: int, done: Any) -> None:
        try:
            error = done.exception()
        except Exception as cancelled:  # noqa: BLE001 - CancelledError: still answered
            error = cancelled
        if error is None:
            self._reply(routing, request_id, body=done.result())
        else:
            self._reply(routing, request_id, error=error)

    def _reply(
        self, routing: zmq.Frame, request_id: int, body: Any = None,
        error: BaseException | None = None,
    ) -> None:
        header: dict[str, Any] = {"v": wire.PROTOCOL_VERSION, "id": request_id}
        if error is not None:
            header["error"] = _error_fields(error)
        try:
            frames = wire.encode(header, body)
        except Exception as err:  # noqa: BLE001 - a result the wire cannot carry: say so
            frames = wire.encode({**header, "error": _error_fields(err)}, None)
        with self._reply_lock:
            if not self._stop.is_set():
                self._reply_push.send_multipart([routing, *frames])

    def close(self) -> None:
        """Stops serving: waits (briefly) for replies in flight, then closes."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        time.sleep(0.05)  # let the I/O thread forward the last replies
        with self._reply_lock:
            self._stop.set()
        self._thread.join(timeout=5)
        self._close_sockets()

    def _close_sockets(self) -> None:
        for sock in ("_reply_push", "_replies", "_monitor", "_router"):
            if hasattr(self, sock):
                getattr(self, sock).close()
        if self._auth is not None:
            self._auth.close()
        self._context.term()


def _error_fields(error: BaseException) -> dict[str, str]:
    """The ``error`` of a reply: the exception's type and message, cut."""
    try:
        message = str(error)
    except Exception:  # noqa: BLE001 - an exception whose str() fails still gets a reply
        message = "(its message could not be formatted)"
    if len(message) > MAX_ERROR_CHARS:
        message = message[:MAX_ERROR_CHARS] + f"... ({len(message)} characters)"
    return {"type": type(error).__name__, "message": message}


def _bound_connections(sock: zmq.Socket) -> None:
    """What one connection of ``sock`` may make this process hold, and for how
    long before it authenticated (the module's docstring)."""
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
    sock.setsockopt(zmq.HANDSHAKE_IVL, int(HANDSHAKE_DEADLINE_S * 1000))


def _raise_open_file_limit(name: str) -> None:
    """Raises this process's soft open-file limit to its hard one: each
    connection, idle or not, holds a descriptor until the handshake deadline,
    and a worker locked out by the usual soft limit of 1024 waits that long."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY:
            hard = 1 << 20  # Linux's usual fs.nr_open
        if soft != resource.RLIM_INFINITY and soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            log.debug("%s: open-file limit raised from %d to %d", name, soft, hard)
    except (ImportError, OSError, ValueError) as err:  # not Unix, or not allowed
        log.debug("%s: open-file limit left as it is (%s)", name, err)


def _event_name(event: int) -> str:
    for name in ("NO_DETAIL", "PROTOCOL", "AUTH"):
        if event == getattr(zmq, f"EVENT_HANDSHAKE_FAILED_{name}"):
            return name.lower().replace("_", " ")
    return str(event)


# -- worker side ----------------------------------------------------------------


class ServerSet:
    """A worker's connections to the servers: calls with timeouts, in parallel.

    ``call_async`` returns a ``concurrent.futures.Future``; ``wait`` turns a
    timeout, a dropped connection or a handler's error into this package's
    errors. Functions are named by their ``__name__`` (``server.push`` ->
    operation ``"push"``).
    """

    def __init__(self, endpoints: Sequence[str], keys: CurveKeys | None, timeout: float) -> None:
        self.endpoints = tuple(endpoints)
        self.timeout = timeout
        self._context = zmq.Context()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[int, concurrent.futures.Future]] = {}
        self._dealers = []
        self._monitors = []
        # Read and written by the I/O thread only.
        self._handshaken = [False] * len(self.endpoints)
        self._refused = [False] * len(self.endpoints)  # a handshake this side refused
        # One routing id for every server, kept across reconnects: a server ties
        # this worker's index to it (ServerEndpoint._claim). Never starts with
        # a zero byte (ZeroMQ's own ids do).
        routing_id = b"w" + secrets.token_bytes(15)
        for endpoint in self.endpoints:
            dealer = self._context.socket(zmq.DEALER)
            dealer.routing_id = routing_id
            dealer.linger = 0
            _bound_connections(dealer)
            if keys is not None:
                dealer.curve_serverkey = keys.server_public
                dealer.curve_publickey = keys.worker_public
                dealer.curve_secretkey = keys.worker_secret
            self._monitors.append(dealer.get_monitor_socket(_CLIENT_EVENTS))
            dealer.connect(_tcp(endpoint))
            self._dealers.append(dealer)
        outbox = f"inproc://ps-requests-{id(self)}"
        self._outbox = self._context.socket(zmq.PULL)
        self._outbox.bind(outbox)
        self._send = self._context.socket(zmq.PUSH)
        self._send.connect(outbox)
        self._closed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ps-client-io", daemon=True)
        self._thread.start()

    def __len__(self) -> int:
        return len(self.endpoints)

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._outbox, zmq.POLLIN)
        for sock in (*self._dealers, *self._monitors):
            poller.register(sock, zmq.POLLIN)
        kinds = {id(d): ("reply", i) for i, d in enumerate(self._dealers)}
        kinds.update({id(m): ("lost", i) for i, m in enumerate(self._monitors)})
        while not self._stop.is_set():
            for sock, _ in poller.poll(_POLL_MS):
                if sock is self._outbox:
                    self._forward(self._outbox.recv_multipart(copy=False))
                    continue
                kind, index = kinds[id(sock)]
                if kind == "reply":
                    frames = sock.recv_multipart(copy=False)
                    try:
                        self._deliver(index, frames)
                    except Exception:  # noqa: BLE001 - one reply must not stop every call
                        log.exception("parameter server %d: a reply could not be delivered", index)
                else:
                    self._connection_events(index)

    def _forward(self, message: list[zmq.Frame]) -> None:
        """Sends a request from the outbox (server index, request id, frames) to
        its server without waiting: a connection ZeroMQ gave up would block
        this thread, and with it every server's calls. A request to a server
        whose handshake this side refused, or that ZeroMQ will not queue,
        fails at once."""
        index_frame, request_frame, *frames = message
        index, request_id = int(bytes(index_frame.buffer)), int(bytes(request_frame.buffer))
        if self._refused[index]:
            self._fail_request(index, request_id, NO_HANDSHAKE)
            return
        try:
            self._dealers[index].send_multipart(frames, copy=False, flags=zmq.NOBLOCK)
        except zmq.Again:
            self._connection_events(index)  # why ZeroMQ gave the connection up, if not read yet
            why = NO_HANDSHAKE if self._refused[index] else (
                "its connection would not queue the request (closed, or full)"
            )
            self._fail_request(index, request_id, why)

    def _connection_events(self, index: int) -> None:
        """Takes every event waiting on server ``index``'s monitor (none may be
        left: ``_forward`` takes them too)."""
        while True:
            try:
                event = recv_monitor_message(self._monitors[index], zmq.NOBLOCK)["event"]
            except zmq.Again:
                return
            self._connection_event(index, event)

    def _connection_event(self, index: int, event: int) -> None:
        """Notes whether server ``index``'s connection completed its handshake,
        and fails its pending calls when a handshake fails or the connection
        drops, saying which. A handshake this side refused (a protocol or
        authentication failure) is final: ZeroMQ does not reconnect."""
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self._handshaken[index] = True
        elif event & _HANDSHAKE_FAILURES:
            self._handshaken[index] = False
            if event != zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:  # closed by the server: retried
                self._refused[index] = True
            self._fail_pending(index, NO_HANDSHAKE)
        elif event == zmq.EVENT_DISCONNECTED:
            why = "the connection dropped" if self._handshaken[index] else NO_HANDSHAKE
            self._handshaken[index] = False  # a reconnection handshakes again
            self._fail_pending(index, why)

    def _fail_request(self, index: int, request_id: int, why: str) -> None:
        with self._lock:
            entry = self._pending.pop(request_id, None)
        if entry is not None:
            future = entry[1]
            future.set_exception(
                self.unavailable(index, getattr(future, "op", "a call"), ConnectionError(why))
            )

    def _deliver(self, index: int, frames: list[zmq.Frame]) -> None:
        try:
            header, body = wire.decode(frames)
        except wire.ProtocolError as err:
            log.warning("parameter server %d sent a reply that does not decode: %s", index, err)
            if err.request_id is not None:
                with self._lock:
                    entry = self._pending.pop(err.request_id, None)
                if entry is not None and entry[0] == index:
                    entry[1].set_exception(ServerCallError(
                        f"parameter server {index} at {self.endpoints[index]} sent a reply "
                        f"that does not decode: {err}", endpoint=self.endpoints[index],
                        remote_type="ProtocolError",
                    ))
            return
        with self._lock:
            entry = self._pending.pop(header["id"], None)
        if entry is None or entry[0] != index:
            return  # a reply to a call that timed out
        future = entry[1]
        error = header.get("error")
        if error is None:
            future.set_result(body)
            return
        kind = error.get("type") if isinstance(error, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        future.set_exception(ServerCallError(
            f"parameter server {index} at {self.endpoints[index]} failed the call: "
            f"{kind}: {message}", endpoint=self.endpoints[index], remote_type=str(kind),
        ))

    def _fail_pending(self, index: int, why: str) -> None:
        with self._lock:
            lost = [rid for rid, (s, _) in self._pending.items() if s == index]
            futures = [self._pending.pop(rid)[1] for rid in lost]
        for future in futures:
            future.set_exception(self.unavailable(index, "a call", ConnectionError(why)))

    def unavailable(
        self, index: int, what: str, err: BaseException, bound: float | None = None
    ) -> ServerUnavailableError:
        """The error for server ``index`` not answering ``what``; ``bound``:
        the call's own timeout, when it waited for the whole job (the start
        timeout) rather than for one call."""
        endpoint = self.endpoints[index]
        text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        setting = "FLEETFEED_PS_TIMEOUT" if bound is None else "FLEETFEED_PS_START_TIMEOUT"
        return ServerUnavailableError(
            f"parameter server {index} at {endpoint} did not answer {what}: {text} "
            f"(bound: {self.timeout if bound is None else bound:g}s, {setting})",
            endpoint=endpoint,
        )

    def call_async(
        self, index: int, func: Callable[..., Any], *args: Any, timeout: float | None = None
    ) -> concurrent.futures.Future:
        """Sends ``func(*args)`` to server ``index``; its future result."""
        return self.request(index, func.__name__, *args, timeout=timeout)

    def request(
        self, index: int, op: str, *args: Any, timeout: float | None = None
    ) -> concurrent.futures.Future:
        """Sends operation ``op`` with ``args`` to server ``index``; its future result."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        future.bound = timeout  # None: the call timeout
        future.op = op
        request_id = next(self._ids)
        frames = wire.encode({"v": wire.PROTOCOL_VERSION, "id": request_id, "op": op}, list(args))
        with self._lock:
            if self._closed:
                raise self.unavailable(index, op, ConnectionError("this worker left the job"))
            self._pending[request_id] = (index, future)
            self._send.send_multipart([str(index).encode(), str(request_id).encode(), *frames])
        return future

    def wait(self, index: int, future: concurrent.futures.Future, what: str) -> Any:
        """The result of ``future`` (from ``call_async(index, ...)``).

        Raises:
            ServerUnavailableError: no answer within the call's timeout, or the
                connection dropped.
            ServerCallError: the server's handler raised.
        """
        deadline = getattr(future, "deadline", time.monotonic() + self.timeout)
        try:
            return future.result(timeout=max(0.0, deadline - time.monotonic()))
        except concurrent.futures.TimeoutError:
            with self._lock:
                for rid, (_, pending) in list(self._pending.items()):
                    if pending is future:
                        del self._pending[rid]
            raise self.unavailable(index, what, TimeoutError("no answer in time"),
                                   getattr(future, "bound", None)) from None

    def forget(self, future: concurrent.futures.Future) -> None:
        """Stops waiting for ``future``'s answer (from ``call_async``): a reply
        that comes later is dropped, and the call holds nothing here."""
        with self._lock:
            rid = next((r for r, (_, f) in self._pending.items() if f is future), None)
            if rid is None:
                return  # answered, or being answered now
            del self._pending[rid]
        future.cancel()

    def call(
        self, index: int, func: Callable[..., Any], *args: Any, timeout: float | None = None
    ) -> Any:
        """``func(*args)`` on server ``index``, waited for."""
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

    def close(self) -> None:
        """Closes the connections; calls still pending fail."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        self._thread.join(timeout=5)
        for index in range(len(self.endpoints)):
            self._fail_pending(index, "this worker left the job")
        for sock in (self._send, self._outbox, *self._monitors, *self._dealers):
            sock.close(linger=0)
        self._context.term()
