"""Rendezvous stores that listen on the job's own address, not on every interface.

``torch.distributed``'s TCPStore server binds to all interfaces (``::``)
whatever host it is given, so a single-machine job started on 127.0.0.1 would
still accept connections from the network on its rendezvous port. Here the
store's listening socket is bound first, to the address of the endpoint's host
(127.0.0.1 for a single-machine job), and handed to the store
(``master_listen_fd``). Used by:

- the ``fleetfeed-tcp://host:port`` rendezvous (registered on import): the
  collective process group (``trainer.collective``) and the parameter
  server's RPC group (``trainer.ps.transport``);
- ``python -m trainer.job.bind ...`` (what ``fleetrun --nproc_per_node`` runs):
  ``torch.distributed.run`` with its agent's store bound the same way.

Under torchrun (``TORCHELASTIC_USE_AGENT_STORE``) every rank is a client of the
agent's store, as with torch's own ``tcp://`` rendezvous.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import sys
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlparse

import torch.distributed as dist
from torch.distributed.rendezvous import register_rendezvous_handler

__all__ = ["SCHEME", "bound_store", "main"]

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
