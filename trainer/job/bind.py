"""Which store a job's process group forms through.

A job of fleetfeed's forms its groups (the collective job's, the parameter-server
workers' gloo group) through ``trainer.job.store.CurveStore``: the store on the
job's authenticated channel, served by rank 0, or by fleetrun's torchrun agent
when torchrun started the ranks (``python -m trainer.job.bind ...``, what
``fleetrun --nproc_per_node`` runs: ``torch.distributed.run`` whose agent serves
a ``CurveStore`` on ``--master_addr:--master_port`` instead of a TCPStore, and
tells its ranks so in ``FLEETFEED_AGENT_STORE``).

Under another launcher's torchrun (``TORCHELASTIC_USE_AGENT_STORE`` without
``FLEETFEED_AGENT_STORE``) the ranks can only be clients of that agent's
TCPStore. There every name lies under a prefix derived from the key and the
attempt and every value is sealed (``KeyedStore``), so whoever reaches the port
reads, forges and replays no value; it can still fill or empty that store
(SECURITY.md). ``fleetrun`` runs the same scripts with the bounded store.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import os
import sys
from typing import Any

import torch.distributed as dist

from .errors import WorkerFailedError
from .keys import derive, read_job_key, require_key_or_insecure
from .store import CurveStore

__all__ = ["AGENT_STORE_ENV", "KeyedStore", "main", "rendezvous_store"]

# Set by fleetrun's torchrun agent for its ranks: its store is a CurveStore.
AGENT_STORE_ENV = "FLEETFEED_AGENT_STORE"
_CURVE = "curve"
_DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)


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
    """The store of a job's rendezvous at ``host:port``: a ``CurveStore`` that
    rank 0 serves (fleetrun's torchrun agent does, under it); under another
    launcher's torchrun agent, a client of its TCPStore, keyed (``KeyedStore``)."""
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
    if agent_store and os.environ.get(AGENT_STORE_ENV) != _CURVE:
        store = dist.TCPStore(host, port, world_size, False, timeout)
        return store if key is None else KeyedStore(store, key)
    if agent_store:
        # The agent's store lives through torchrun's restarts, with the keys of
        # its start; each restart's ranks keep to their own names, as torch's do.
        prefix = f"/worker/attempt_{_attempt()}/"
        return CurveStore(host, port, key, False, timeout, attempt=0, prefix=prefix)
    return CurveStore(host, port, key, rank == 0, timeout, _attempt())


def _agent_store(
    host: str, port: int, world_size: int | None, is_master: bool,
    timeout: datetime.timedelta = _DEFAULT_TIMEOUT, **_options: Any,
) -> dist.Store:
    """What torchrun's static rendezvous builds in place of its TCPStore."""
    key = read_job_key()
    require_key_or_insecure(key, [f"{host}:{port}"], "torchrun's agent store")
    return CurveStore(host, port, key, is_master, timeout, attempt=0)


def main() -> None:
    """``torch.distributed.run`` whose agent's store is a ``CurveStore``."""
    from torch.distributed import run
    from torch.distributed.elastic.rendezvous import static_tcp_rendezvous

    args = sys.argv[1:]
    for index, arg in enumerate(args):
        name, equals, value = arg.partition("=")
        if not equals and index + 1 < len(args):
            value = args[index + 1]
        if name == "--standalone" or (
            name.replace("_", "-") == "--rdzv-backend" and value != "static"
        ):
            raise SystemExit(
                f"trainer.job.bind: {arg} asks for a rendezvous whose TCPStore this "
                "agent cannot replace; give --master_addr and --master_port (static "
                "rendezvous), as fleetrun does"
            )
    static_tcp_rendezvous.TCPStore = _agent_store  # type: ignore[assignment, misc]
    os.environ[AGENT_STORE_ENV] = _CURVE  # the ranks inherit it
    sys.argv[0] = "torchrun"
    run.main()


if __name__ == "__main__":
    main()
