"""The job key: the one secret every process of a job shares, and what is derived from it.

``fleetrun`` generates a fresh key per job and hands it to its children in
``FLEETFEED_JOB_KEY``. A job started by another launcher (Paddle's variables, a
Kubernetes operator) gives it through ``FLEETFEED_JOB_KEY`` or a file named by
``FLEETFEED_JOB_KEY_FILE`` (the older name ``FLEETFEED_JOB_SECRET`` is read too).

The key itself never travels. Each use derives its own key from it with
HMAC-SHA256 under a label (``derive``): the parameter server's CURVE key pairs
(``trainer.ps.transport``) and the rendezvous store's names and signatures
(``trainer.job.bind``). A peer proves it holds the job key by completing a
handshake only those derived keys can complete.

A job without a key runs only where every endpoint is on this machine's
loopback, unless ``FLEETFEED_INSECURE=1`` says that its network is trusted
(``require_key_or_insecure``); SECURITY.md says what that gives up.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
import socket
from collections.abc import Iterable, Mapping

from .errors import RoleError, TrainerError

__all__ = [
    "INSECURE_ENV",
    "KEY_ENV",
    "KEY_FILE_ENV",
    "derive",
    "is_loopback",
    "read_job_key",
    "require_key_or_insecure",
]

log = logging.getLogger(__name__)

KEY_ENV = "FLEETFEED_JOB_KEY"
KEY_FILE_ENV = "FLEETFEED_JOB_KEY_FILE"
OLD_KEY_ENV = "FLEETFEED_JOB_SECRET"
INSECURE_ENV = "FLEETFEED_INSECURE"
MIN_KEY_BYTES = 16


def read_job_key(env: Mapping[str, str] | None = None) -> str | None:
    """The job key from ``FLEETFEED_JOB_KEY`` (or ``FLEETFEED_JOB_SECRET``) or
    the file ``FLEETFEED_JOB_KEY_FILE`` names; None when none is set.

    Raises:
        RoleError: the file cannot be read, or the key is shorter than 16 bytes.
    """
    env = os.environ if env is None else env
    key = env.get(KEY_ENV) or env.get(OLD_KEY_ENV)
    source = KEY_ENV if env.get(KEY_ENV) else OLD_KEY_ENV
    path = env.get(KEY_FILE_ENV)
    if not key and path:
        try:
            with open(path, encoding="utf-8") as file:
                key = file.read(4096).strip()
        except (OSError, UnicodeDecodeError) as err:
            raise RoleError(f"{KEY_FILE_ENV}={path!r}: cannot read the job key ({err})") from None
        source = f"{KEY_FILE_ENV} ({path})"
    if not key:
        return None
    if len(key.encode()) < MIN_KEY_BYTES:
        raise RoleError(
            f"{source}: expected a job key of at least {MIN_KEY_BYTES} bytes (e.g. "
            f"`python -c 'import secrets; print(secrets.token_hex(32))'`), found {len(key)}"
        )
    return key


def derive(key: str, label: str) -> bytes:
    """32 bytes derived from the job key for one use (HMAC-SHA256 under ``label``)."""
    return hmac.new(key.encode(), f"fleetfeed/{label}".encode(), hashlib.sha256).digest()


def is_loopback(host: str) -> bool:
    """Whether ``host`` names a loopback address (127.0.0.0/8, ::1, localhost)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        return all(ipaddress.ip_address(info[4][0]).is_loopback
                   for info in socket.getaddrinfo(host, None))
    except OSError:
        return False


def insecure_allowed(env: Mapping[str, str] | None = None) -> bool:
    """Whether the user declared the network trusted (``FLEETFEED_INSECURE=1``)."""
    env = os.environ if env is None else env
    return env.get(INSECURE_ENV, "").strip().lower() in ("1", "true", "yes")


def require_key_or_insecure(key: str | None, endpoints: Iterable[str], what: str) -> None:
    """Refuses a job that has no key and reaches beyond loopback, unless insecure.

    Raises:
        TrainerError: ``key`` is None, some endpoint is not a loopback address and
            ``FLEETFEED_INSECURE`` is not set.
    """
    if key is not None:
        return
    remote = [ep for ep in endpoints if not is_loopback(ep.rpartition(":")[0])]
    if not remote:
        log.warning(
            "%s has no job key (%s): any process on this machine can connect to it", what, KEY_ENV
        )
        return
    if insecure_allowed():
        log.warning(
            "%s runs without a job key across hosts (%s=1): anyone who can reach %s can "
            "read and change the model", what, INSECURE_ENV, ", ".join(remote),
        )
        return
    raise TrainerError(
        f"{what} spans hosts ({', '.join(remote)}) but has no job key: give every process "
        f"the same key in {KEY_ENV} or a file named by {KEY_FILE_ENV} (fleetrun passes its "
        f"own to the processes it starts), or set {INSECURE_ENV}=1 on a trusted network"
    )
