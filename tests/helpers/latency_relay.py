"""A userspace TCP relay that puts a chosen one-way delay, and optionally a
bandwidth cap, between the processes of a job on this machine.

The kernel here has no netem, so a network with latency is made in user
space: ``LatencyRelay`` listens on one loopback port per target endpoint and
forwards every connection to its target, holding each piece of data
``delay`` seconds in each direction (a round trip costs ``2 * delay`` more)
and, with ``bandwidth``, sending no faster than that many bytes per second
per direction. Bytes arrive unchanged and in order; a side that closes its
end closes the other once what it sent has been delivered.

A relay with ``delay=0`` is the baseline of a latency measurement: its own
cost (two more socket hops and a thread hand-off) then cancels out of the
ratio. Used by the latency benchmark and its tests: the workers are given the
relay's endpoints as the servers' (``PADDLE_PSERVERS_IP_PORT_LIST``), the
servers their own.

    with LatencyRelay(["127.0.0.1:6001"], delay=0.001) as relay:
        relay.endpoints  # ["127.0.0.1:<port>"]: what the workers connect to
"""

from __future__ import annotations

import collections
import contextlib
import socket
import threading
import time
from collections.abc import Sequence

READ_BYTES = 1 << 16
# How long a relayed connection waits for its target to listen.
CONNECT_SECONDS = 60.0


class _Direction:
    """One direction of one connection: a reader that stamps what arrives and
    a writer that sends it once its time has come."""

    def __init__(self, relay: LatencyRelay, source: socket.socket, target: socket.socket) -> None:
        self._relay = relay
        self._source = source
        self._target = target
        self._pending: collections.deque[tuple[float, bytes]] = collections.deque()
        self._ready = threading.Condition()
        self._ended = False  # the source closed its end: the target's closes when drained
        self.threads = [
            threading.Thread(target=self._read, name="relay-read", daemon=True),
            threading.Thread(target=self._write, name="relay-write", daemon=True),
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def _read(self) -> None:
        try:
            while True:
                data = self._source.recv(READ_BYTES)
                if not data:
                    break
                with self._ready:
                    self._pending.append((time.monotonic() + self._relay.delay, data))
                    self._ready.notify()
        except OSError:  # the relay closed the socket
            pass
        with self._ready:
            self._ended = True
            self._ready.notify()

    def _write(self) -> None:
        free_at = 0.0  # when the capped link is free to send the next piece
        try:
            while True:
                with self._ready:
                    while not self._pending and not self._ended:
                        self._ready.wait()
                    if not self._pending:
                        break
                    due, data = self._pending.popleft()
                if self._relay.bandwidth:
                    free_at = max(free_at, due) + len(data) / self._relay.bandwidth
                    due = free_at
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                self._target.sendall(data)
                self._relay.relayed_bytes += len(data)
            self._target.shutdown(socket.SHUT_WR)
        except OSError:  # the other side or the relay closed
            pass


class LatencyRelay:
    """Relays each of ``targets`` (``"host:port"``) through a loopback port of
    its own, adding ``delay`` seconds each way (see the module docstring).

    Attributes:
        endpoints: the relay's ``"127.0.0.1:port"`` for each target, in order.
        relayed_bytes: bytes delivered so far, both directions.
        connections: connections accepted so far.
    """

    def __init__(
        self, targets: Sequence[str], delay: float, bandwidth: float | None = None
    ) -> None:
        if delay < 0:
            raise ValueError(f"delay must be >= 0 seconds, got {delay}")
        if bandwidth is not None and bandwidth <= 0:
            raise ValueError(f"bandwidth must be > 0 bytes/s, got {bandwidth}")
        self.delay = delay
        self.bandwidth = bandwidth
        self.relayed_bytes = 0
        self.connections = 0
        self._targets = [_split(t) for t in targets]
        self._listeners: list[socket.socket] = []
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False
        self.endpoints: list[str] = []
        try:
            for _ in self._targets:
                listener = socket.create_server(("127.0.0.1", 0))
                self._listeners.append(listener)
                self.endpoints.append(f"127.0.0.1:{listener.getsockname()[1]}")
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> LatencyRelay:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> None:
        for listener, target in zip(self._listeners, self._targets, strict=True):
            thread = threading.Thread(
                target=self._accept, args=(listener, target), name="relay-accept", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def _accept(self, listener: socket.socket, target: tuple[str, int]) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # closed
                return
            thread = threading.Thread(
                target=self._connect, args=(client, target), name="relay-connect", daemon=True
            )
            with self._lock:
                self._threads.append(thread)
                self._sockets.append(client)
            thread.start()

    def _connect(self, client: socket.socket, target: tuple[str, int]) -> None:
        """Connects ``client`` to ``target``, retrying while the target does not
        listen yet (a process starting): the client sees a slow network, not a
        connection that drops, which a real network would have refused."""
        deadline = time.monotonic() + CONNECT_SECONDS
        while True:
            try:
                upstream = socket.create_connection(target, timeout=10)
                upstream.settimeout(None)
                break
            except OSError:
                if self._closed or time.monotonic() > deadline:
                    client.close()
                    return
                time.sleep(0.05)
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            if self._closed:
                client.close()
                upstream.close()
                return
            self.connections += 1
            self._sockets.append(upstream)
            for direction in (_Direction(self, client, upstream),
                              _Direction(self, upstream, client)):
                self._threads += direction.threads
                direction.start()

    def close(self) -> None:
        """Closes the listeners and every relayed connection; waits for the
        relay's threads (a second call does nothing)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            sockets = self._listeners + self._sockets
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=5)


def _split(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"expected an endpoint 'host:port', found {endpoint!r}")
    return host, int(port)
