"""Where a message may make a server write or read: under the checkpoint root.

A save or a load arrives as a directory name from a peer. A peer holds the job
key, but may be buggy or hostile; it must not make the server write the job
user's files elsewhere (``~/.ssh/authorized_keys``) nor read them. So a server
takes a directory name from the wire only under its checkpoint root
(``FLEETFEED_CHECKPOINT_ROOT``, else the directory the server started in), and
walks to it one component at a time with ``O_NOFOLLOW``: no symbolic link, no
directory that another user owns or may write into, can redirect it.
"""

from __future__ import annotations

import os
import stat

from ...job.errors import CheckpointError

__all__ = ["ROOT_ENV", "checkpoint_root", "confined_directory"]

ROOT_ENV = "FLEETFEED_CHECKPOINT_ROOT"

_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def checkpoint_root() -> str:
    """The directory under which this process's server saves and loads:
    ``FLEETFEED_CHECKPOINT_ROOT`` if set, else the working directory (both with
    their symbolic links resolved, once: the user chose them)."""
    return os.path.realpath(os.environ.get(ROOT_ENV) or os.getcwd())


def confined_directory(dirname: object, root: str, create: bool) -> str:
    """``dirname`` (relative to ``root``, or absolute below it) as an absolute
    path, after checking every directory from ``root`` down to it: each is a
    real directory (not a symbolic link) owned by this user and writable by no
    one else. ``create`` makes the missing ones (mode 0755).

    Raises:
        CheckpointError: ``dirname`` is not a path string, lies outside
            ``root`` or is ``root`` itself, passes through a symbolic link, a file or a directory
            another user could change, or (without ``create``) does not exist.
    """
    if not isinstance(dirname, str) or not dirname or "\0" in dirname:
        raise CheckpointError(
            f"expected a checkpoint directory name, found {dirname!r:.200}", path=repr(dirname)
        )
    full = os.path.normpath(os.path.join(root, dirname))
    if os.path.commonpath([full, root]) != root:
        raise CheckpointError(
            f"checkpoint directory {dirname!r} is outside this server's checkpoint root "
            f"{root!r}: save under it, or start the servers with {ROOT_ENV} set to a "
            "directory that holds it", path=full,
        )
    relative = os.path.relpath(full, root)
    if relative == ".":
        # The root itself is not checked (the user chose it; /tmp may be it):
        # files written there could follow a link another user planted.
        raise CheckpointError(
            f"checkpoint directory {dirname!r} is this server's checkpoint root {root!r} "
            "itself: name a directory under it", path=full,
        )
    parts = relative.split(os.sep)
    fd = os.open(root, _DIRECTORY_FLAGS & ~os.O_NOFOLLOW)
    try:
        walked = root
        for part in parts:
            walked = os.path.join(walked, part)
            child = _open_directory(fd, part, walked, create)
            os.close(fd)
            fd = child
            _check_owned_and_private(fd, walked)
    finally:
        os.close(fd)
    return full


def _open_directory(parent: int, name: str, path: str, create: bool) -> int:
    try:
        return os.open(name, _DIRECTORY_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            raise CheckpointError(
                f"checkpoint directory {path!r} does not exist", path=path
            ) from None
    except OSError as err:  # ELOOP: a symbolic link; ENOTDIR: a file
        raise CheckpointError(
            f"checkpoint directory {path!r}: expected a directory, found a symbolic link or "
            f"a file ({err.strerror})", path=path,
        ) from None
    try:
        os.mkdir(name, 0o700, dir_fd=parent)
    except FileExistsError:  # made meanwhile (another server of this job): checked after
        return _open_directory(parent, name, path, create=False)
    fd = _open_directory(parent, name, path, create=False)
    os.fchmod(fd, 0o755)  # readable by others as a save elsewhere; writable by none
    return fd


def _check_owned_and_private(fd: int, path: str) -> None:
    info = os.fstat(fd)
    if info.st_uid != os.geteuid():
        raise CheckpointError(
            f"checkpoint directory {path!r}: expected a directory owned by this user "
            f"(uid {os.geteuid()}), found one owned by uid {info.st_uid}", path=path,
        )
    # Group-writable is fine where the group is this user's own (a umask of 002
    # with a group per user); anyone else who may write could swap a component.
    group_writes = info.st_mode & stat.S_IWGRP and info.st_gid != os.getegid()
    if info.st_mode & stat.S_IWOTH or group_writes:
        raise CheckpointError(
            f"checkpoint directory {path!r}: expected a directory only its owner can write "
            f"into, found mode {stat.S_IMODE(info.st_mode):04o}: run chmod go-w on it", path=path,
        )
