"""The job's rendezvous store, on the parameter servers' authenticated channel.

A process group forms through a key-value store: each rank writes its address
and reads the others'. torch's TCPStore answers anyone who reaches its port,
lists every name to them, lets them delete entries while the ranks start, and
has no quota (350 MiB written by an outsider cost its host as much memory).
``CurveStore`` is the same store over ``trainer.ps.transport``: ZeroMQ with
CURVE, key pairs derived from the job key and the attempt (``--max_restarts``),
so a peer without the key completes no handshake and holds at most a frame for
a few seconds (SECURITY.md), and a process of an earlier attempt cannot reach
this one's store. What even a key holder can make it hold is bounded too
(``MAX_ENTRIES``, ``MAX_STORE_BYTES``, ``MAX_WAITERS``).

The server runs in one process (rank 0, or fleetrun's torchrun agent, whose
store its ranks share); every process, the server's included, is a client.
The semantics are TCPStore's: ``get`` and ``wait`` block until the names exist
or the timeout passes, ``add`` keeps a decimal counter, ``compare_set`` sets
when the current value (empty: absent) is the expected one.
"""

from __future__ import annotations

import atexit
import datetime
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import torch
import torch.distributed as dist

from ..ps import transport
from .errors import ServerCallError, ServerUnavailableError

__all__ = ["MAX_ENTRIES", "MAX_STORE_BYTES", "MAX_WAITERS", "STORE_OPS", "CurveStore"]

# What one store holds at most, whoever writes: a group of N ranks writes a few
# entries of some hundred bytes per rank, so these are far above any job's need
# and far below what would hurt its host.
MAX_ENTRIES = 1 << 16
MAX_STORE_BYTES = 64 << 20
MAX_NAME_CHARS = 4096
# Blocked get/wait calls held at once (each is a future and a list entry).
MAX_WAITERS = 4096

_BYTES = ("tensor", "uint8", 1)
_NAMES = ("list", "str")
STORE_OPS: dict[str, tuple[Any, ...]] = {
    "store_set": ("str", _BYTES),
    "store_get": ("str", "int"),
    "store_add": ("str", "int"),
    "store_compare_set": ("str", _BYTES, _BYTES),
    "store_wait": (_NAMES, "int"),
    "store_check": (_NAMES,),
    "store_delete": ("str",),
    "store_num_keys": (),
}
# Seconds a call may take beyond its own wait, for the round trip.
_SLACK_S = 10.0
# Seconds between the server's looks for blocked calls whose time is up.
_REAP_S = 0.1


def _as_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(
        0, dtype=torch.uint8
    )


def _as_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.numpy().tobytes()


class StoreFullError(RuntimeError):
    """A write the store's bounds do not allow."""


class _Entries:
    """The server's entries and blocked readers, under one lock."""

    def __init__(self) -> None:
        # Reentrant: a waiter's future, completed under the lock, runs its
        # callback (a blocked get reading its value) on the same thread.
        self._lock = threading.RLock()
        self._values: dict[str, bytes] = {}
        self._bytes = 0
        self._waiters: list[tuple[float, frozenset[str], Future]] = []
        # Blocked calls whose time is up are answered with a timeout by this
        # thread (at most _REAP_S late), not left to the caller's own deadline.
        self._closed = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name="store-reaper", daemon=True)
        self._reaper.start()

    def _reap(self) -> None:
        while not self._closed.wait(_REAP_S):
            with self._lock:
                if self._waiters:
                    self._wake()

    def _check_name(self, name: str) -> None:
        if len(name) > MAX_NAME_CHARS:
            raise StoreFullError(
                f"expected a name of at most {MAX_NAME_CHARS} characters, found {len(name)}"
            )

    def _put(self, name: str, value: bytes) -> None:
        """Stores ``value`` (lock held) within the bounds; wakes its waiters."""
        self._check_name(name)
        old = self._values.get(name)
        grown = len(value) - (len(old) if old is not None else -len(name))
        if old is None and len(self._values) >= MAX_ENTRIES:
            raise StoreFullError(f"the store holds its maximum of {MAX_ENTRIES} entries")
        if self._bytes + grown > MAX_STORE_BYTES:
            raise StoreFullError(
                f"the store holds {self._bytes} bytes; {grown} more would pass its "
                f"limit of {MAX_STORE_BYTES}"
            )
        self._values[name] = value
        self._bytes += grown
        self._wake()

    def _wake(self) -> None:
        now = time.monotonic()
        keep = []
        for deadline, names, future in self._waiters:
            if names.issubset(self._values.keys()):
                future.set_result(None)
            elif deadline < now:
                future.set_exception(TimeoutError("names not set in time"))
            else:
                keep.append((deadline, names, future))
        self._waiters = keep

    def _waiter(self, names: Sequence[str], timeout_ms: int) -> Future:
        """A future done once every name exists (lock held)."""
        for name in names:
            self._check_name(name)
        future: Future = Future()
        if all(name in self._values for name in names):
            future.set_result(None)
            return future
        if len(self._waiters) >= MAX_WAITERS:
            self._wake()  # drops the expired ones
        if len(self._waiters) >= MAX_WAITERS:
            raise StoreFullError(f"the store holds its maximum of {MAX_WAITERS} blocked calls")
        deadline = time.monotonic() + max(0, min(timeout_ms, 1 << 40)) / 1000
        self._waiters.append((deadline, frozenset(names), future))
        return future

    # -- the operations (STORE_OPS) ----------------------------------------

    def store_set(self, name: str, value: torch.Tensor) -> None:
        with self._lock:
            self._put(name, _as_bytes(value))

    def store_get(self, name: str, timeout_ms: int) -> Future:
        with self._lock:
            ready = self._waiter([name], timeout_ms)
        result: Future = Future()

        def _read(done: Future) -> None:
            if done.exception() is not None:
                result.set_exception(done.exception())
                return
            with self._lock:
                value = self._values.get(name)
            if value is None:  # deleted in between
                result.set_exception(KeyError(f"{name!r} was deleted while read"))
            else:
                result.set_result(_as_tensor(value))

        ready.add_done_callback(_read)
        return result

    def store_add(self, name: str, amount: int) -> int:
        with self._lock:
            current = self._values.get(name, b"0")
            try:
                total = int(current.decode("ascii")) + amount
            except (UnicodeDecodeError, ValueError):
                raise ValueError(f"{name!r} holds a value that is not a counter") from None
            if not -(1 << 63) <= total < 1 << 63:
                raise ValueError(f"{name!r}: the counter would leave int64's range")
            self._put(name, str(total).encode())
            return total

    def store_compare_set(self, name: str, expected: torch.Tensor, desired: torch.Tensor):
        expected_bytes, desired_bytes = _as_bytes(expected), _as_bytes(desired)
        with self._lock:
            current = self._values.get(name)
            if current is None and expected_bytes:
                return expected  # TCPStore's answer: absent, not as expected
            if current is None or current == expected_bytes:
                self._put(name, desired_bytes)
                return desired
            return _as_tensor(current)

    def store_wait(self, names: list[str], timeout_ms: int) -> Future:
        with self._lock:
            return self._waiter(names, timeout_ms)

    def store_check(self, names: list[str]) -> bool:
        with self._lock:
            return all(name in self._values for name in names)

    def store_delete(self, name: str) -> bool:
        with self._lock:
            value = self._values.pop(name, None)
            if value is not None:
                self._bytes -= len(name) + len(value)
            return value is not None

    def store_num_keys(self) -> int:
        with self._lock:
            return len(self._values)

    def fail_waiters(self) -> None:
        self._closed.set()
        with self._lock:
            for _, _, future in self._waiters:
                future.set_exception(ConnectionError("the rendezvous store closed"))
            self._waiters = []


def _store_keys(key: str | None, attempt: int) -> transport.CurveKeys | None:
    return transport.CurveKeys.from_job_key(key, f"store/{attempt}")


class CurveStore(dist.Store):
    """A client of the job's store at ``host:port`` (and its server, with
    ``is_master``). A ``torch.distributed.Store``: pass it to
    ``init_process_group(store=...)``.

    Args:
        host, port: where the server listens (its host's address only).
        key: the job key; None only on a network declared trusted
            (``FLEETFEED_INSECURE=1``), where any peer is served.
        is_master: whether this process serves the store.
        timeout: how long ``get`` and ``wait`` block by default.
        attempt: the job's attempt (``--max_restarts``); its keys differ.
    """

    def __init__(
        self, host: str, port: int, key: str | None, is_master: bool,
        timeout: datetime.timedelta, attempt: int = 0,
    ) -> None:
        super().__init__()
        super().set_timeout(timeout)
        self.endpoint = f"{host}:{port}"
        keys = _store_keys(key, attempt)
        self._entries: _Entries | None = None
        self._server: transport.ServerEndpoint | None = None
        if is_master:
            self._entries = _Entries()
            handlers = {op: getattr(self._entries, op) for op in STORE_OPS}
            self._server = transport.ServerEndpoint(
                self.endpoint, keys, handlers, threads=2,
                name=f"the rendezvous store at {self.endpoint}", ops=STORE_OPS,
            )
            atexit.register(self.close)
        self._client = transport.ServerSet([self.endpoint], keys, timeout.total_seconds())
        self._closed = False

    def _call(self, op: str, *args: Any, wait_s: float = 0.0) -> Any:
        try:
            return self._client.wait(
                0, self._client.request(0, op, *args, timeout=wait_s + _SLACK_S), op
            )
        except ServerUnavailableError as error:
            raise dist.DistStoreError(
                f"the rendezvous store at {self.endpoint} did not answer {op} within "
                f"{wait_s + _SLACK_S:g}s: it is not serving (yet), it stopped, or this "
                "process lacks the job's key for this attempt (FLEETFEED_JOB_KEY)"
            ) from error
        except ServerCallError as error:  # the server's handler raised
            why = str(error).partition("failed the call: ")[2] or str(error)
            if error.remote_type == "TimeoutError":
                raise dist.DistStoreError(
                    f"the rendezvous store at {self.endpoint}: {op} timed out after "
                    f"{wait_s:g}s ({args[0]!r} not set)"
                ) from error
            raise dist.DistStoreError(
                f"the rendezvous store at {self.endpoint} refused {op}: {why}"
            ) from error

    def _wait_ms(self, timeout: datetime.timedelta | None) -> tuple[int, float]:
        seconds = (self.timeout if timeout is None else timeout).total_seconds()
        return int(seconds * 1000), seconds

    def set(self, key: str, value: bytes | str) -> None:
        """Stores ``value`` under ``key``."""
        raw = value.encode() if isinstance(value, str) else bytes(value)
        self._call("store_set", key, _as_tensor(raw))

    def get(self, key: str) -> bytes:
        """The value under ``key``, once it exists (within the timeout)."""
        ms, seconds = self._wait_ms(None)
        return _as_bytes(self._call("store_get", key, ms, wait_s=seconds))

    def add(self, key: str, amount: int) -> int:
        """Adds ``amount`` to the counter ``key``; its new value."""
        return int(self._call("store_add", key, int(amount)))

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        """Sets ``key`` to ``desired`` if it holds ``expected`` (empty: absent);
        the value it holds afterwards (TCPStore's answer)."""
        def raw(value: bytes | str) -> bytes:
            return value.encode() if isinstance(value, str) else bytes(value)

        return _as_bytes(self._call(
            "store_compare_set", key, _as_tensor(raw(expected)), _as_tensor(raw(desired))
        ))

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        """Waits until every name in ``keys`` exists."""
        ms, seconds = self._wait_ms(timeout)
        self._call("store_wait", list(keys), ms, wait_s=seconds)

    def check(self, keys: list[str]) -> bool:
        """Whether every name in ``keys`` exists."""
        return bool(self._call("store_check", list(keys)))

    def delete_key(self, key: str) -> bool:
        """Deletes ``key``; whether it existed."""
        return bool(self._call("store_delete", key))

    def num_keys(self) -> int:
        """The number of entries."""
        return int(self._call("store_num_keys"))

    def multi_get(self, keys: list[str]) -> list[bytes]:
        """The values of ``keys``, in order (each waited for)."""
        return [self.get(key) for key in keys]

    def multi_set(self, keys: list[str], values: list[bytes | str]) -> None:
        """Stores each value under its name."""
        for key, value in zip(keys, values, strict=True):
            self.set(key, value)

    def close(self) -> None:
        """Closes the connection and, on the server, the store: blocked calls fail."""
        if self._closed:
            return
        self._closed = True
        self._client.close()
        if self._server is not None and self._entries is not None:
            self._entries.fail_waiters()
            self._server.close()
            atexit.unregister(self.close)
