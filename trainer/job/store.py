"""The job's rendezvous store, on the parameter servers' authenticated channel.

A process group forms through a key-value store: each rank writes its address
and reads the others'. torch's TCPStore answers anyone who reaches its port,
lists every name to them, lets them delete entries while the ranks start, and
has no quota (350 MiB written by an outsider cost its host as much memory).
``CurveStore`` is the same store over ``trainer.ps.transport``: ZeroMQ with
CURVE, key pairs derived from the job key and the attempt (``--max_restarts``),
so a peer without the key completes no handshake and holds at most a frame for
a few seconds (SECURITY.md). What even a key holder can make it hold is bounded
too: entries, their bytes, a value's size, blocked calls and the names they
wait for, and each connection's unread replies (the ``MAX_*`` figures).

The server runs in one process (rank 0, or fleetrun's torchrun agent, whose
store its ranks share); every process, the server's included, is a client.
The semantics are TCPStore's: ``get`` and ``wait`` block until the names exist
or the timeout passes, ``add`` keeps a decimal counter, ``compare_set`` sets
when the current value (empty: absent) is the expected one; a client whose
server is not up yet keeps trying for the store's timeout, as TCPStore's does.
"""

from __future__ import annotations

import atexit
import datetime
import heapq
import itertools
import re
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

# What one store holds at most, whoever writes. A group of N ranks writes a few
# entries of some hundred bytes per rank (an address, a counter), so these are
# far above any job's need and far below what would hurt its host.
MAX_ENTRIES = 1 << 16
# Names (UTF-8) and values, plus ENTRY_OVERHEAD bytes per entry for what Python
# keeps beside them (the dict slot, two objects' headers).
MAX_STORE_BYTES = 64 << 20
ENTRY_OVERHEAD = 128
MAX_NAME_BYTES = 1024
# One wire frame: a rendezvous value is an address or a counter.
MAX_VALUE_BYTES = 1 << 20
# Blocked get/wait calls held at once, the names one call may name, the bytes
# of the names all of them wait for, and the longest a call may block.
MAX_WAITERS = 4096
MAX_NAMES_PER_CALL = 64
MAX_WAITING_BYTES = 8 << 20
MAX_WAIT_S = 2 * 3600.0
# Replies queued for one connection that its peer does not read (each at most
# MAX_REPLY_BYTES): ZeroMQ drops those beyond, as it does for a peer that went away.
MAX_QUEUED_REPLIES = 16
MAX_REPLY_BYTES = 4 << 20

_BYTES = ("tensor", "uint8", 1)
_NAMES = ("list", "str")
STORE_OPS: dict[str, tuple[Any, ...]] = {
    "store_set": ("str", _BYTES),
    "store_get": ("str", "int"),
    "store_multi_get": (_NAMES, "int"),
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


def _name_bytes(name: str) -> int:
    return len(name.encode("utf-8", "surrogatepass"))


def _shown(names: Sequence[str]) -> str:
    """Names for an error message: the first three, and how many more."""
    listed = ", ".join(repr(n[:80]) for n in names[:3])
    return listed + (f" and {len(names) - 3} more" if len(names) > 3 else "")


class StoreFullError(RuntimeError):
    """A call the store's bounds do not allow."""


class _Waiter:
    """A blocked get or wait: the names it waits for, those still missing."""

    __slots__ = ("cost", "deadline", "future", "missing", "names")

    def __init__(self, names: tuple[str, ...], missing: set[str], deadline: float,
                 cost: int) -> None:
        self.names, self.missing, self.deadline, self.cost = names, missing, deadline, cost
        self.future: Future = Future()


class _Entries:
    """The server's entries and blocked calls, under one lock.

    A blocked call is indexed by each name it still misses, so a write wakes
    only the calls waiting for that name, and its deadline sits in a heap that
    a reaper thread pops: neither costs more as the store fills.
    """

    def __init__(self) -> None:
        # Reentrant: a blocked call's future, completed under the lock, runs its
        # callback (a get reading its value) on the same thread.
        self._lock = threading.RLock()
        self._values: dict[str, bytes] = {}
        self._bytes = 0
        self._by_name: dict[str, set[_Waiter]] = {}
        self._deadlines: list[tuple[float, int, _Waiter]] = []
        self._order = itertools.count()
        self._waiting = 0
        self._waiting_bytes = 0
        self._closed = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name="store-reaper", daemon=True)
        self._reaper.start()

    # -- bounds ------------------------------------------------------------

    @staticmethod
    def _check_names(names: Sequence[str]) -> None:
        if len(names) > MAX_NAMES_PER_CALL:
            raise StoreFullError(
                f"expected at most {MAX_NAMES_PER_CALL} names in one call, found {len(names)}"
            )
        for name in names:
            if _name_bytes(name) > MAX_NAME_BYTES:
                raise StoreFullError(
                    f"expected a name of at most {MAX_NAME_BYTES} bytes (UTF-8), found "
                    f"{_name_bytes(name)}"
                )

    def _put(self, name: str, value: bytes) -> None:
        """Stores ``value`` (lock held) within the bounds; wakes its waiters."""
        self._check_names([name])
        if len(value) > MAX_VALUE_BYTES:
            raise StoreFullError(
                f"expected a value of at most {MAX_VALUE_BYTES} bytes, found {len(value)}"
            )
        old = self._values.get(name)
        if old is None:
            grown = _name_bytes(name) + len(value) + ENTRY_OVERHEAD
            if len(self._values) >= MAX_ENTRIES:
                raise StoreFullError(f"the store holds its maximum of {MAX_ENTRIES} entries")
        else:
            grown = len(value) - len(old)
        if self._bytes + grown > MAX_STORE_BYTES:
            raise StoreFullError(
                f"the store holds {self._bytes} bytes; {grown} more would pass its "
                f"limit of {MAX_STORE_BYTES}"
            )
        self._values[name] = value
        self._bytes += grown
        self._arrived(name)

    # -- blocked calls -----------------------------------------------------

    def _arrived(self, name: str) -> None:
        for waiter in self._by_name.pop(name, ()):
            waiter.missing.discard(name)
            if waiter.missing:
                continue
            # All there, unless one was deleted while it waited: wait for it again.
            gone = {n for n in waiter.names if n not in self._values}
            if gone:
                self._index(waiter, gone)
            else:
                self._finish(waiter, None)

    def _index(self, waiter: _Waiter, missing: set[str]) -> None:
        waiter.missing = missing
        for name in missing:
            self._by_name.setdefault(name, set()).add(waiter)

    def _finish(self, waiter: _Waiter, error: BaseException | None) -> None:
        if waiter.future.done():
            return
        for name in waiter.missing:
            waiting = self._by_name.get(name)
            if waiting is not None:
                waiting.discard(waiter)
                if not waiting:
                    del self._by_name[name]
        waiter.missing = set()
        self._waiting -= 1
        self._waiting_bytes -= waiter.cost
        if error is None:
            waiter.future.set_result(None)
        else:
            waiter.future.set_exception(error)

    def _waiter(self, names: Sequence[str], timeout_ms: int) -> Future:
        """A future done once every name exists (lock held)."""
        self._check_names(names)
        missing = {name for name in names if name not in self._values}
        cost = sum(_name_bytes(name) for name in names) + ENTRY_OVERHEAD
        seconds = min(max(timeout_ms, 0) / 1000, MAX_WAIT_S)
        waiter = _Waiter(tuple(names), set(), time.monotonic() + seconds, cost)
        if not missing:
            waiter.future.set_result(None)
            return waiter.future
        if self._waiting >= MAX_WAITERS or self._waiting_bytes + cost > MAX_WAITING_BYTES:
            raise StoreFullError(
                f"the store holds its maximum of blocked calls ({self._waiting} of "
                f"{MAX_WAITERS}, waiting for {self._waiting_bytes} bytes of names of "
                f"{MAX_WAITING_BYTES})"
            )
        self._index(waiter, missing)
        self._waiting += 1
        self._waiting_bytes += cost
        heapq.heappush(self._deadlines, (waiter.deadline, next(self._order), waiter))
        if len(self._deadlines) > 2 * self._waiting + 1024:  # finished calls pile up
            self._deadlines = [d for d in self._deadlines if not d[2].future.done()]
            heapq.heapify(self._deadlines)
        return waiter.future

    def _reap(self) -> None:
        while not self._closed.wait(_REAP_S):
            with self._lock:
                now = time.monotonic()
                while self._deadlines and self._deadlines[0][0] <= now:
                    _, _, waiter = heapq.heappop(self._deadlines)
                    missing = sorted(waiter.missing)
                    self._finish(waiter, TimeoutError(f"{_shown(missing)} not set in time"))

    # -- the operations (STORE_OPS) ----------------------------------------

    def store_set(self, name: str, value: torch.Tensor) -> None:
        with self._lock:
            self._put(name, _as_bytes(value))

    def store_multi_get(self, names: list[str], timeout_ms: int) -> Future:
        with self._lock:
            ready = self._waiter(names, timeout_ms)
        result: Future = Future()

        def read(done: Future) -> None:
            error = done.exception()
            if error is None:
                with self._lock:
                    values = [self._values.get(name) for name in names]
                gone = [name for name, value in zip(names, values, strict=True) if value is None]
                if gone:
                    error = KeyError(f"{_shown(gone)} deleted while read")
                elif sum(map(len, values)) > MAX_REPLY_BYTES:
                    error = StoreFullError(
                        f"expected values of at most {MAX_REPLY_BYTES} bytes in all for one "
                        f"call, found {sum(map(len, values))}; read them one at a time"
                    )
            if error is not None:
                result.set_exception(error)
            else:
                result.set_result([_as_tensor(value) for value in values])

        ready.add_done_callback(read)
        return result

    def store_get(self, name: str, timeout_ms: int) -> Future:
        result: Future = Future()
        values = self.store_multi_get([name], timeout_ms)
        values.add_done_callback(
            lambda done: result.set_exception(done.exception()) if done.exception()
            else result.set_result(done.result()[0])
        )
        return result

    def store_add(self, name: str, amount: int) -> int:
        with self._lock:
            current = self._values.get(name, b"0")
            try:
                total = int(current.decode("ascii")) + amount
            except (UnicodeDecodeError, ValueError):
                raise ValueError(f"{name[:80]!r} holds a value that is not a counter") from None
            if not -(1 << 63) <= total < 1 << 63:
                raise ValueError(f"{name[:80]!r}: the counter would leave int64's range")
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
        self._check_names(names)
        with self._lock:
            return all(name in self._values for name in names)

    def store_delete(self, name: str) -> bool:
        with self._lock:
            value = self._values.pop(name, None)
            if value is not None:
                self._bytes -= _name_bytes(name) + len(value) + ENTRY_OVERHEAD
            return value is not None

    def store_num_keys(self) -> int:
        with self._lock:
            return len(self._values)

    def close(self) -> None:
        """Stops the reaper; every blocked call fails."""
        self._closed.set()
        with self._lock:
            for _, _, waiter in self._deadlines:
                self._finish(waiter, ConnectionError("the rendezvous store closed"))
            self._deadlines = []
        self._reaper.join(timeout=5)


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
        timeout: how long ``get`` and ``wait`` block by default, and how long
            any call keeps trying to reach a server that is not up yet.
        attempt: the attempt (``--max_restarts``) whose keys the store uses.
        prefix: put before every name (the ranks of torchrun's restart N share
            the agent's store under ``/worker/attempt_N/``, as torch's do).
    """

    def __init__(
        self, host: str, port: int, key: str | None, is_master: bool,
        timeout: datetime.timedelta, attempt: int = 0, prefix: str = "",
    ) -> None:
        super().__init__()
        super().set_timeout(timeout)
        self.endpoint = f"{host}:{port}"
        self._address = (host, port, key, attempt, prefix)
        self._prefix = prefix
        keys = _store_keys(key, attempt)
        self._entries: _Entries | None = None
        self._server: transport.ServerEndpoint | None = None
        if is_master:
            self._entries = _Entries()
            handlers = {op: getattr(self._entries, op) for op in STORE_OPS}
            try:
                self._server = transport.ServerEndpoint(
                    self.endpoint, keys, handlers, threads=2,
                    name=f"the rendezvous store at {self.endpoint}", ops=STORE_OPS,
                    max_queued_replies=MAX_QUEUED_REPLIES,
                )
            except BaseException:
                self._entries.close()
                raise
            atexit.register(self.close)
        self._client = transport.ServerSet([self.endpoint], keys, timeout.total_seconds())
        self._closed = False

    def _call(self, op: str, *args: Any, wait_s: float = 0.0) -> Any:
        # A call waits for the server for the store's timeout, as TCPStore's
        # client keeps trying to connect; a blocked call for its own wait too.
        bound = max(wait_s, self.timeout.total_seconds()) + _SLACK_S
        try:
            return self._client.wait(0, self._client.request(0, op, *args, timeout=bound), op)
        except ServerUnavailableError as error:
            why = re.sub(r"^.*? did not answer [^:]*: ", "", str(error)).partition(" (bound")[0]
            if "no answer in time" in why:
                why = f"no answer within {bound:g}s"
            elif why == transport.NO_HANDSHAKE:
                why = "the connection closed before its handshake completed"
            hint = (
                ": the store is not serving (yet), it stopped, or this process lacks the "
                "job's key for this attempt (FLEETFEED_JOB_KEY)"
                if "no answer" in why or "dropped" in why or "handshake" in why else ""
            )
            raise dist.DistStoreError(
                f"the rendezvous store at {self.endpoint}: {op} failed ({why}){hint}"
            ) from error
        except ServerCallError as error:  # the server's handler raised
            why = str(error).partition("failed the call: ")[2] or str(error)
            if error.remote_type == "TimeoutError":
                why = why.partition("TimeoutError: ")[2] or why
                raise dist.DistStoreError(
                    f"the rendezvous store at {self.endpoint}: {op} timed out after "
                    f"{wait_s:g}s ({why})"
                ) from error
            raise dist.DistStoreError(
                f"the rendezvous store at {self.endpoint} refused {op}: {why}"
            ) from error

    def _wait_ms(self, timeout: datetime.timedelta | None) -> tuple[int, float]:
        seconds = (self.timeout if timeout is None else timeout).total_seconds()
        return int(seconds * 1000), seconds

    def _names(self, keys: Sequence[str]) -> list[str]:
        return [self._prefix + key for key in keys]

    def set(self, key: str, value: bytes | str) -> None:
        """Stores ``value`` under ``key``."""
        raw = value.encode() if isinstance(value, str) else bytes(value)
        self._call("store_set", self._prefix + key, _as_tensor(raw))

    def get(self, key: str) -> bytes:
        """The value under ``key``, once it exists (within the timeout)."""
        ms, seconds = self._wait_ms(None)
        return _as_bytes(self._call("store_get", self._prefix + key, ms, wait_s=seconds))

    def multi_get(self, keys: list[str]) -> list[bytes]:
        """The values of ``keys``, in order, once all exist (within the timeout)."""
        ms, seconds = self._wait_ms(None)
        values = self._call("store_multi_get", self._names(keys), ms, wait_s=seconds)
        return [_as_bytes(value) for value in values]

    def multi_set(self, keys: list[str], values: list[bytes | str]) -> None:
        """Stores each value under its name."""
        for key, value in zip(keys, values, strict=True):
            self.set(key, value)

    def add(self, key: str, amount: int) -> int:
        """Adds ``amount`` to the counter ``key``; its new value."""
        return int(self._call("store_add", self._prefix + key, int(amount)))

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        """Sets ``key`` to ``desired`` if it holds ``expected`` (empty: absent);
        the value it holds afterwards (TCPStore's answer)."""
        def raw(value: bytes | str) -> bytes:
            return value.encode() if isinstance(value, str) else bytes(value)

        return _as_bytes(self._call(
            "store_compare_set", self._prefix + key, _as_tensor(raw(expected)),
            _as_tensor(raw(desired)),
        ))

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        """Waits until every name in ``keys`` exists."""
        ms, seconds = self._wait_ms(timeout)
        self._call("store_wait", self._names(keys), ms, wait_s=seconds)

    def check(self, keys: list[str]) -> bool:
        """Whether every name in ``keys`` exists."""
        return bool(self._call("store_check", self._names(keys)))

    def delete_key(self, key: str) -> bool:
        """Deletes ``key``; whether it existed."""
        return bool(self._call("store_delete", self._prefix + key))

    def num_keys(self) -> int:
        """The number of entries (of every prefix)."""
        return int(self._call("store_num_keys"))

    def clone(self) -> CurveStore:
        """Another client of the same store (torch clones a group's store)."""
        host, port, key, attempt, prefix = self._address
        return CurveStore(host, port, key, False, self.timeout, attempt, prefix)

    def close(self) -> None:
        """Closes the connection and, on the server, the store: blocked calls fail."""
        if self._closed:
            return
        self._closed = True
        self._client.close()
        if self._server is not None and self._entries is not None:
            self._entries.close()
            self._server.close()
            atexit.unregister(self.close)
