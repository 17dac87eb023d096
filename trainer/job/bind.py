"""Rendezvous stores that listen on the job's own address, not on every interface.

``torch.distributed``'s TCPStore server binds to all interfaces (``::``)
whatever host it is given, so a single-machine job started on 127.0.0.1 would
still accept connections from the network on its rendezvous port. Here the
store's listening socket is bound first, to the address of the endpoint's host
(127.0.0.1 for a single-machine job), and handed to the store
(``master_listen_fd``). Used by:

- the ``fleetfeed-tcp://host:port`` rendezvous (registered on import): the
  collective process group (``trainer.collective``), which is also the
  workers' gloo group of a parameter-server job (``trainer.fleet``);
- ``python -m trainer.job.bind ...`` (what ``fleetrun --nproc_per_node`` runs):
  ``torch.distributed.run`` with its agent's store bound the same way.

Under torchrun (``TORCHELASTIC_USE_AGENT_STORE``) every rank is a client of the
agent's store, as with torch's own ``tcp://`` rendezvous.

A job with a key (``trainer.job.keys``) reaches the store only through
``KeyedStore``: every name lies under a prefix derived from the key and the
attempt, and every value is sealed: encrypted and authenticated with keys
derived from the job key and the attempt (``--max_restarts``), so an outsider
who reaches the port (and torch's ``list_keys`` shows it every name) can read
no value, forge none, and replay none from one attempt into the next. What it
can still do is in SECURITY.md: fill the store, or disturb torchrun's own
agent keys; TCPStore has no quota and no authentication of its own.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import hmac
import os
import socket
import sys
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlparse

import torch.distributed as dist
from torch.distributed.rendezvous import register_rendezvous_handler

from .errors import WorkerFailedError
from .keys import derive

__all__ = ["SCHEME", "KeyedStore", "bound_store", "main", "rendezvous_store"]

SCHEME = "fleetfeed-tcp"
_DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)


def _listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``'s address (not every interface), listening."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(socket.SOMAXCONN)
    except OSError as error:
        sock.close()
        raise OSError(
            error.errno,
            f"cannot listen on {host}:{port} for the job's rendezvous: {error.strerror}",
        ) from error
    return sock


def bound_store(
    host: str,
    port: int,
    world_size: int | None,
    is_master: bool,
    timeout: datetime.timedelta = _DEFAULT_TIMEOUT,
    **options: Any,
) -> dist.TCPStore:
    """A TCPStore at ``host:port``; the server (``is_master``) listens on
    ``host``'s address only. Other arguments are TCPStore's."""
    if not is_master:
        return dist.TCPStore(host, port, world_size, False, timeout, **options)
    options.pop("multi_tenant", None)  # one server per process here
    options.pop("use_libuv", None)  # master_listen_fd needs the libuv server
    sock = _listening_socket(host, port)
    return dist.TCPStore(
        host, port, world_size, True, timeout, master_listen_fd=sock.detach(), use_libuv=True
    )


_SIV_BYTES = 32


def _attempt() -> int:
    """This attempt's number under a restarting launcher (fleetrun's
    ``--max_restarts``, torchrun's), 0 the first time."""
    for name in ("FLEETFEED_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


class KeyedStore(dist.Store):
    """A store whose names only the job's key can find and whose values only it
    can read and write.

    A value is sealed as a deterministic authenticated encryption (SIV): its
    synthetic IV is HMAC-SHA256(name, value) under one derived key, and the
    bytes are XORed with an HMAC-SHA256 keystream of that IV under another.
    Equal values seal equally (``compare_set`` compares sealed bytes), which
    shows an outsider only that two entries are equal. Both keys, and the
    names' prefix, are derived from the job key and the attempt: a value from
    another attempt does not open here.

    ``add`` counters cannot be sealed (the store adds to them); their names
    are hidden like every other name.
    """

    def __init__(self, inner: dist.Store, key: str, attempt: int | None = None) -> None:
        super().__init__()
        self._inner = inner
        attempt = _attempt() if attempt is None else attempt
        self._prefix = derive(key, f"store/names/{attempt}").hex()[:32] + "/"
        self._siv_key = derive(key, f"store/siv/{attempt}")
        self._stream_key = derive(key, f"store/stream/{attempt}")

    def _name(self, key: str) -> str:
        return self._prefix + key

    def _siv(self, key: str, value: bytes) -> bytes:
        return hmac.new(self._siv_key, key.encode() + b"\0" + value, hashlib.sha256).digest()

    def _keystream(self, siv: bytes, length: int) -> bytes:
        blocks = (length + 31) // 32
        return b"".join(
            hmac.new(self._stream_key, siv + i.to_bytes(8, "big"), hashlib.sha256).digest()
            for i in range(blocks)
        )[:length]

    def _xor(self, siv: bytes, data: bytes) -> bytes:
        stream = self._keystream(siv, len(data))
        return (int.from_bytes(data, "big") ^ int.from_bytes(stream, "big")).to_bytes(
            len(data), "big"
        )

    def _sealed(self, key: str, value: bytes | str) -> bytes:
        raw = value.encode() if isinstance(value, str) else bytes(value)
        siv = self._siv(key, raw)
        return siv + self._xor(siv, raw)

    def _opened(self, key: str, sealed: bytes) -> bytes:
        siv, hidden = sealed[:_SIV_BYTES], sealed[_SIV_BYTES:]
        raw = self._xor(siv, hidden) if len(sealed) >= _SIV_BYTES else b""
        if len(sealed) < _SIV_BYTES or not hmac.compare_digest(siv, self._siv(key, raw)):
            raise WorkerFailedError(
                f"rendezvous store entry {key!r} does not carry this job's signature: written "
                "by a process without the job key (FLEETFEED_JOB_KEY differs, or an outsider), "
                "or by another attempt of the job"
            )
        return raw

    def set(self, key: str, value: bytes | str) -> None:
        """Stores ``value`` under ``key``, signed."""
        self._inner.set(self._name(key), self._sealed(key, value))

    def get(self, key: str) -> bytes:
        """The value under ``key`` (waits for it), after checking its signature."""
        return self._opened(key, self._inner.get(self._name(key)))

    def add(self, key: str, amount: int) -> int:
        """Adds ``amount`` to the counter ``key``; its new value."""
        return self._inner.add(self._name(key), amount)

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        """Sets ``key`` to ``desired`` if it holds ``expected`` (empty: absent)."""
        sealed_expected = self._sealed(key, expected) if expected else b""
        current = self._inner.compare_set(
            self._name(key), sealed_expected, self._sealed(key, desired)
        )
        return self._opened(key, current) if current else current

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        """Waits until every name in ``keys`` exists."""
        names = [self._name(k) for k in keys]
        if timeout is None:
            self._inner.wait(names)
        else:
            self._inner.wait(names, timeout)

    def check(self, keys: list[str]) -> bool:
        """Whether every name in ``keys`` exists."""
        return self._inner.check([self._name(k) for k in keys])

    def delete_key(self, key: str) -> bool:
        """Deletes ``key``; whether it existed."""
        return self._inner.delete_key(self._name(key))

    def num_keys(self) -> int:
        """The number of entries in the whole store."""
        return self._inner.num_keys()

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        """The default timeout of ``get`` and ``wait``."""
        self._inner.set_timeout(timeout)


def rendezvous_store(
    host: str, port: int, rank: int, world_size: int, timeout: datetime.timedelta,
    key: str | None,
) -> dist.Store:
    """The store of a job's rendezvous at ``host:port``: rank 0 serves it (bound to
    ``host``) unless torchrun's agent does; ``KeyedStore`` when the job has a key."""
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
    store = bound_store(host, port, world_size, rank == 0 and not agent_store, timeout)
    return store if key is None else KeyedStore(store, key)


def _handler(
    url: str, timeout: datetime.timedelta = _DEFAULT_TIMEOUT, **_kwargs: Any
) -> Iterator[Any]:
    """``fleetfeed-tcp://host:port?rank=R&world_size=N``: torch's ``tcp://``,
    with the store's server bound to ``host``."""
    parsed = urlparse(url)
    query = {key: values[-1] for key, values in parse_qs(parsed.query).items()}
    if parsed.hostname is None or parsed.port is None:
        raise ValueError(f"{SCHEME}:// rendezvous needs host:port, got {url!r}")
    if "rank" not in query or "world_size" not in query:
        raise ValueError(f"{SCHEME}:// rendezvous needs a rank and a world size, got {url!r}")
    rank, world_size = int(query["rank"]), int(query["world_size"])
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
    is_master = rank == 0 and not agent_store
    store = bound_store(parsed.hostname, parsed.port, world_size, is_master, timeout)
    yield (store, rank, world_size)
    raise RuntimeError(f"Unable to perform re-rendezvous using {SCHEME}:// method")


# RuntimeError: registered already (this module run as __main__ and imported).
with contextlib.suppress(RuntimeError):
    register_rendezvous_handler(SCHEME, _handler)


def main() -> None:
    """``torch.distributed.run`` whose agent store listens on ``--master_addr`` only."""
    from torch.distributed import run
    from torch.distributed.elastic.rendezvous import static_tcp_rendezvous

    static_tcp_rendezvous.TCPStore = bound_store  # type: ignore[assignment, misc]
    sys.argv[0] = "torchrun"
    run.main()


if __name__ == "__main__":
    main()
