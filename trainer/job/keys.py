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

Every job has a key, on loopback too: loopback is shared by every user of the
machine. A job without one refuses to start (``require_key_or_insecure``) unless
``FLEETFEED_INSECURE=1`` declares its network trusted; SECURITY.md says what
that gives up. A key file must be a regular file private to the job's user (as
ssh requires of its keys), and a key must not be trivially guessable.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
import socket
import stat
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
        RoleError: the file is not a regular file private to this user or cannot
            be read, or the key is shorter than 16 bytes or guessable.
    """
    env = os.environ if env is None else env
    key = env.get(KEY_ENV) or env.get(OLD_KEY_ENV)
    source = KEY_ENV if env.get(KEY_ENV) else OLD_KEY_ENV
    path = env.get(KEY_FILE_ENV)
    if not key and path:
        key = _read_key_file(path)
        source = f"{KEY_FILE_ENV} ({path})"
    if not key:
        return None
    _check_strength(key, source)
    return key


MAKE_A_KEY = "python -c 'import secrets; print(secrets.token_hex(32))'"


def _read_key_file(path: str) -> str:
    """The key in ``path``, which must be a regular file that only its owner,
    this user, can read or write (a FIFO or a device such as /dev/zero is
    refused before it is read)."""
    where = f"{KEY_FILE_ENV}={path!r}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as err:
        raise RoleError(f"{where}: cannot read the job key ({err})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise RoleError(f"{where}: expected a regular file, found {_file_kind(info.st_mode)}")
        if info.st_uid != os.geteuid():
            raise RoleError(
                f"{where}: expected a file owned by this user (uid {os.geteuid()}), found "
                f"one owned by uid {info.st_uid}"
            )
        if info.st_mode & 0o077:
            raise RoleError(
                f"{where}: expected a file only its owner can read (mode 0600 or 0400), found "
                f"mode {stat.S_IMODE(info.st_mode):04o}: run chmod 600 {path}"
            )
        data = os.read(fd, 4096)
    except OSError as err:
        raise RoleError(f"{where}: cannot read the job key ({err})") from None
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise RoleError(
            f"{where}: expected the key as text (e.g. made by `{MAKE_A_KEY} > {path}`), "
            "found bytes that are not UTF-8"
        ) from None


def _file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a regular file"


# A key of fewer distinct characters than this is refused: sixteen zeros, a
# repeated word. A hex key of 32 random bytes has about 16 distinct characters.
MIN_DISTINCT_CHARACTERS = 8


def _check_strength(key: str, source: str) -> None:
    if len(key.encode()) < MIN_KEY_BYTES:
        raise RoleError(
            f"{source}: expected a job key of at least {MIN_KEY_BYTES} bytes (e.g. "
            f"`{MAKE_A_KEY}`), found {len(key)}"
        )
    if len(set(key)) < MIN_DISTINCT_CHARACTERS:
        raise RoleError(
            f"{source}: expected a random job key (e.g. `{MAKE_A_KEY}`), found one of only "
            f"{len(set(key))} distinct characters"
        )


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
    """Refuses a job that has no key, unless its network is declared trusted.

    Loopback is no exception: every user of the machine reaches it. A key
    given in code (``job_secret=``) is checked as one from the environment:
    an empty or short one (``os.environ.get("KEY", "")``) would let anyone
    derive the job's keys.

    Raises:
        TrainerError: ``key`` is None and ``FLEETFEED_INSECURE`` is not set.
        RoleError: ``key`` is shorter than 16 bytes or guessable.
    """
    if key is not None:
        _check_strength(key, f"{what}: the job key given")
        return
    endpoints = list(endpoints)
    if insecure_allowed():
        log.warning(
            "%s runs without a job key (%s=1): anyone who can reach %s can read and change "
            "the model", what, INSECURE_ENV, ", ".join(endpoints),
        )
        return
    raise TrainerError(
        f"{what} has no job key: give every process of the job the same key in {KEY_ENV} "
        f"(e.g. `export {KEY_ENV}=$({MAKE_A_KEY})`) or in a file only you can read, named by "
        f"{KEY_FILE_ENV}; fleetrun makes one for the processes it starts. Without a key any "
        f"user of this machine (loopback is shared) or of the network could reach "
        f"{', '.join(endpoints)}; {INSECURE_ENV}=1 runs without one on a network you trust"
    )
