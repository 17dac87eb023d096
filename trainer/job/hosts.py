"""This machine's addresses: which endpoints of a job are on this host, and the
network interface a process should use to reach its peers.

A job across machines lists every process's endpoint (``ip:port``); each host's
launcher starts the processes whose endpoint address is one of this machine's
(``is_this_host``), or whose address is the one given explicitly (``--host`` /
``POD_IP``, as Paddle's launcher does). gloo picks the interface it listens on
from ``GLOO_SOCKET_IFNAME``; ``interface_toward`` names the interface holding
the address this machine uses to reach a peer, so that gloo listens on the
job's network rather than on whatever the machine's hostname resolves to.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import ipaddress
import socket
import sys

__all__ = ["addresses_of", "interface_toward", "local_addresses", "is_this_host"]

_LOOPBACK_INTERFACE = "lo" if sys.platform.startswith("linux") else "lo0"


class _SockAddr(ctypes.Structure):
    # Linux: sa_family is a 16-bit int; the BSDs (macOS) have sa_len, sa_family bytes.
    _fields_ = [("head", ctypes.c_uint16), ("data", ctypes.c_uint8 * 26)]


class _IfAddrs(ctypes.Structure):
    pass


_IfAddrs._fields_ = [
    ("next", ctypes.POINTER(_IfAddrs)),
    ("name", ctypes.c_char_p),
    ("flags", ctypes.c_uint),
    ("addr", ctypes.POINTER(_SockAddr)),
    ("netmask", ctypes.POINTER(_SockAddr)),
    ("broadaddr", ctypes.POINTER(_SockAddr)),
    ("data", ctypes.c_void_p),
]


def _family(sockaddr: _SockAddr) -> int:
    if sys.platform.startswith("linux"):
        return sockaddr.head
    return sockaddr.head >> 8 if sys.byteorder == "little" else sockaddr.head & 0xFF


def local_addresses() -> dict[str, str]:
    """Every IPv4/IPv6 address of this machine's interfaces, with the interface
    holding it (``{"10.77.2.1": "veth0", "127.0.0.1": "lo", ...}``), from
    ``getifaddrs(3)``; empty where the C library has none."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    if not hasattr(libc, "getifaddrs"):
        return {}
    head = ctypes.POINTER(_IfAddrs)()
    if libc.getifaddrs(ctypes.byref(head)) != 0:
        return {}
    found: dict[str, str] = {}
    try:
        entry = head
        while entry:
            item = entry.contents
            entry = item.next
            if not item.addr or not item.name:
                continue
            sockaddr = item.addr.contents
            raw = bytes(sockaddr.data)
            family = _family(sockaddr)
            if family == socket.AF_INET:
                address = socket.inet_ntop(socket.AF_INET, raw[2:6])
            elif family == socket.AF_INET6:
                address = socket.inet_ntop(socket.AF_INET6, raw[6:22])
            else:
                continue
            found.setdefault(address, item.name.decode(errors="replace"))
    finally:
        libc.freeifaddrs(head)
    return found


def addresses_of(host: str) -> set[str]:
    """The addresses ``host`` (a name or an address) resolves to; empty when it
    does not resolve."""
    host = host.strip("[]")
    with contextlib.suppress(ValueError):
        return {str(ipaddress.ip_address(host))}
    try:
        return {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except OSError:
        return set()


def _is_local_address(address: str, local: dict[str, str]) -> bool:
    # Linux's lo answers for all of 127.0.0.0/8, not only the 127.0.0.1 it lists.
    return address in local or ipaddress.ip_address(address).is_loopback


def is_this_host(host: str, local: dict[str, str] | None = None) -> bool:
    """Whether ``host`` names an address of this machine (loopback included).

    Args:
        host: a name or an address, as in an endpoint.
        local: this machine's addresses (default ``local_addresses()``).
    """
    local = local_addresses() if local is None else local
    return any(_is_local_address(address, local) for address in addresses_of(host))


def interface_toward(peer: str) -> str | None:
    """The interface holding the address this machine uses to reach ``peer``
    (the peer's own interface when ``peer`` is this machine), or None where the
    route or the interface is unknown."""
    addresses = sorted(addresses_of(peer))
    if not addresses:
        return None
    address = addresses[0]
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    local = local_addresses()
    if not _is_local_address(address, local):
        try:  # a UDP "connection" sends nothing: the kernel only picks the route
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.connect((address, 9))
                address = probe.getsockname()[0]
        except OSError:
            return None
    if address in local:
        return local[address]
    return _LOOPBACK_INTERFACE if ipaddress.ip_address(address).is_loopback else None
