"""Input files on any ``pyarrow.fs`` filesystem: S3, HDFS, GCS, local.

A filelist entry is a local path, or a URI that
``pyarrow.fs.FileSystem.from_uri`` accepts (``s3://bucket/key?endpoint_override=
host:port&scheme=http&region=...``, ``hdfs://namenode:port/path``, ``gs://...``,
``file:///...``, percent-decoded, on this machine only, with no query or
fragment); credentials come from the usual environment (``AWS_*``, ...).
The ``filesystem=`` setting gives the filesystem of plain paths (a
``pyarrow.fs.FileSystem`` or an fsspec filesystem); Paddle's ``fs_name`` /
``fs_ugi`` map onto an HDFS filesystem (``hdfs_filesystem``); Paddle's
``download_cmd`` (other than ``"cat"``) reads plain paths through a command
that prints the file (``DownloadCommand``).

A remote file is streamed into the pipe command's standard input by a feeder
thread (datafeed/source/process.py), never copied to local disk first; a ``.gz`` file
is streamed compressed into ``gzip -dc``. The file name never reaches a shell.

A local file name is whatever bytes the OS holds (Python's ``\\udcff`` for a
byte that is not UTF-8) and is opened as such, also by a download command;
pyarrow's filesystems take UTF-8 names only, so such a name given to one is a
``SchemaError`` that names the file, not a ``UnicodeEncodeError``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fnmatch
import functools
import os
import shlex
import shutil
import stat as stat_module
import uuid
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import pyarrow.fs as pafs

from ..config.errors import DatafeedError, SchemaError
from .process import CommandStream

__all__ = [
    "DownloadCommand",
    "as_filesystem",
    "exchange_paths",
    "exists",
    "finish_replacement",
    "hdfs_args",
    "hdfs_filesystem",
    "is_gzip",
    "is_remote",
    "is_uri",
    "list_files",
    "missing_files",
    "open_bytes",
    "open_input",
    "read_replaced",
    "remove_abandoned",
    "replace_directory",
    "stat",
    "sync_directory",
    "sync_to_disk",
    "staging_directory",
    "write_atomically",
    "write_stream_atomically",
]


def is_uri(path: str) -> bool:
    """Whether ``path`` names its filesystem (``scheme://...``)."""
    scheme = urlsplit(path).scheme
    return len(scheme) > 1 and "://" in path  # "C:\\..." is not a URI


def is_gzip(path: str) -> bool:
    """Whether ``path`` names a gzip file (``.gz``, before any URI query)."""
    return (unquote(urlsplit(path).path) if is_uri(path) else path).endswith(".gz")


def is_remote(path: str, filesystem: Any = None) -> bool:
    """Whether ``path`` is read through pyarrow.fs rather than ``open()``."""
    return filesystem is not None or is_uri(path)


@functools.lru_cache(maxsize=64)
def _from_uri_base(base: str) -> pafs.FileSystem:
    filesystem, _ = pafs.FileSystem.from_uri(base)
    return filesystem


def resolve(path: str, filesystem: Any = None) -> tuple[pafs.FileSystem, str]:
    """The filesystem of ``path`` and the path inside it.

    Filesystems are cached per scheme, host and query (one S3 client per
    endpoint, not one per file).
    """
    if is_uri(path):
        parts = urlsplit(path)
        if parts.scheme == "file":
            return pafs.LocalFileSystem(), _file_uri_path(path)
        base = f"{parts.scheme}://{parts.netloc}/" + (f"?{parts.query}" if parts.query else "")
        try:
            _, inner = pafs.FileSystem.from_uri(path)
            return _from_uri_base(base), inner
        except (OSError, ValueError, TypeError) as error:
            raise DatafeedError(
                f"cannot open filesystem of {path!r}: {_first_line(error)}"
            ) from None
    if filesystem is None:
        return pafs.LocalFileSystem(), os.path.abspath(path)
    return filesystem, path


def _file_uri_path(uri: str) -> str:
    """The local path that the ``file:`` URI ``uri`` names, percent-decoded (RFC 8089).

    A query, a fragment or another host would mean something that a local
    file cannot give: refused rather than dropped.

    Raises:
        SchemaError: a query, a fragment, a host other than ``localhost``, or
            a name that is not UTF-8 (pyarrow's local filesystem needs UTF-8).
    """
    parts = urlsplit(uri)
    for mark, part, what in (("?", parts.query, "query"), ("#", parts.fragment, "fragment")):
        if mark in uri:
            raise SchemaError(
                f"the file URI {uri!r} has a {what} ({part!r}), which names nothing in a "
                "local file; expected file:///path"
            )
    if parts.netloc.lower() not in ("", "localhost"):
        raise SchemaError(
            f"the file URI {uri!r} names the host {parts.netloc!r}; a file URI names a "
            "file of this machine: expected file:///path or file://localhost/path"
        )
    path = unquote(parts.path, errors="surrogateescape")  # %FF: the byte 0xff
    problem = _not_utf8(path)
    if problem is not None:
        raise SchemaError(
            f"the file URI {uri!r} names a file whose name is not UTF-8 ({problem}), which "
            "pyarrow's filesystems cannot open; give its plain path instead"
        )
    return path


def _not_utf8(name: str) -> str | None:
    """What in ``name`` is not UTF-8 (``byte 0xff``), or None when all of it is."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as error:
        character = name[error.start]
        code = ord(character)
        return f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
    return None


def _refuse_not_utf8(path: str, name: str) -> None:
    """Refuses a name that pyarrow's filesystems cannot hold, naming the file."""
    problem = _not_utf8(name)
    if problem is not None:
        raise SchemaError(
            f"{path!r} is not UTF-8 ({problem}), which pyarrow's filesystems cannot open; "
            "read it as a local path (no filesystem setting) or rename it"
        )


def as_filesystem(value: Any) -> pafs.FileSystem | None:
    """The ``filesystem=`` setting as a pyarrow filesystem (fsspec ones are wrapped)."""
    if value is None or isinstance(value, pafs.FileSystem):
        return value
    if hasattr(value, "open") and hasattr(value, "protocol"):  # an fsspec filesystem
        return pafs.PyFileSystem(pafs.FSSpecHandler(value))
    raise SchemaError(
        "the 'filesystem' setting must be None, a pyarrow.fs.FileSystem or an fsspec "
        f"filesystem, got {value!r}"
    )


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines() or [type(error).__name__]
    more = f" (and {len(lines) - 1} more lines)" if len(lines) > 1 else ""
    return lines[0] + more


def stat(path: str, filesystem: Any = None) -> pafs.FileInfo:
    """The file's info; ``FileNotFoundError`` when there is no file there."""
    if not is_remote(path, filesystem) and _not_utf8(path) is not None:
        return _local_stat(path)  # pyarrow cannot hold the name; the OS can
    fs, inner = resolve(path, filesystem)
    if not isinstance(fs, DownloadCommand):  # a command takes any name the OS gave
        _refuse_not_utf8(path, inner)
    info = fs.get_file_info(inner)
    if info.type != pafs.FileType.File:
        raise FileNotFoundError(f"no file at {path}")
    return info


def _local_stat(path: str) -> pafs.FileInfo:
    """``stat`` of a local file whose name is not UTF-8, from the OS (the info
    shows the name escaped: pyarrow holds names as UTF-8)."""
    try:
        result = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"no file at {path}") from None
    if not stat_module.S_ISREG(result.st_mode):
        raise FileNotFoundError(f"no file at {path}")
    shown = path.encode("utf-8", "backslashreplace").decode("utf-8")
    return pafs.FileInfo(shown, pafs.FileType.File, size=result.st_size,
                         mtime_ns=result.st_mtime_ns)


def exists(path: str, filesystem: Any = None) -> bool:
    """Whether ``path`` is a file (local or remote)."""
    if not is_remote(path, filesystem):
        return os.path.isfile(path)
    try:
        stat(path, filesystem)
    except FileNotFoundError:
        return False
    return True


def missing_files(paths: Sequence[str], filesystem: Any = None) -> list[str]:
    """The entries of ``paths`` that are not files."""
    return [p for p in paths if not exists(p, filesystem)]


def open_input(path: str, filesystem: Any = None) -> Any:
    """A pyarrow input stream of the raw bytes of ``path`` (no decompression).

    Raises:
        FileNotFoundError: no such file or object.
    """
    fs, inner = resolve(path, filesystem)
    if not isinstance(fs, DownloadCommand):
        _refuse_not_utf8(path, inner)
    try:
        return fs.open_input_stream(inner, compression=None)
    except FileNotFoundError:
        raise FileNotFoundError(f"no file at {path}") from None
    except OSError as error:
        if "not exist" in str(error) or "NoSuchKey" in str(error):
            raise FileNotFoundError(f"no file at {path}") from None
        raise


def open_bytes(path: str, filesystem: Any = None) -> Any:
    """The raw bytes of ``path``, unbuffered and not decompressed: a local
    file from ``open()`` (its descriptor can be a command's stdin), or the
    input stream of a remote one (``open_input``).

    Raises:
        FileNotFoundError: no such file or object.
    """
    if is_remote(path, filesystem):
        return open_input(path, filesystem)
    return open(path, "rb", buffering=0)  # noqa: SIM115 - the caller closes it


def list_files(
    uri: str, pattern: str = "*", *, recursive: bool = False, filesystem: Any = None
) -> list[str]:
    """The files of a directory (or a day's folder on S3) whose name matches ``pattern``.

    Args:
        uri: a directory: a local path, or a URI such as
            ``s3://bucket/2024-05-01/?endpoint_override=...``.
        pattern: an ``fnmatch`` pattern for the file names (``part-*.gz``).
        recursive: look in subdirectories too (the pattern applies to the
            path below ``uri``).
        filesystem: the filesystem of a plain path (as the ``filesystem`` setting).

    Returns:
        Sorted entries in the form of ``uri`` (the same scheme, host and query),
        ready for ``set_filelist``.

    Raises:
        FileNotFoundError: ``uri`` is not a directory.
    """
    fs, inner = resolve(uri, filesystem)
    _refuse_not_utf8(uri, inner)
    inner = inner.rstrip("/") or "/"
    info = fs.get_file_info(inner)
    if info.type != pafs.FileType.Directory:
        raise FileNotFoundError(f"no directory at {uri}")
    selector = pafs.FileSelector(inner, recursive=recursive)
    found = []
    prefix = inner.rstrip("/") + "/"
    for entry in fs.get_file_info(selector):
        if entry.type != pafs.FileType.File:
            continue
        relative = entry.path[len(prefix):] if entry.path.startswith(prefix) else entry.base_name
        if fnmatch.fnmatchcase(relative, pattern):
            found.append(entry.path)
    found.sort()
    if not is_uri(uri):
        return found
    parts = urlsplit(uri)
    if parts.scheme == "file":  # quoted: a '%', '?' or '#' in a name stays part of it
        return [f"file://{quote(p)}" for p in found]
    query = f"?{parts.query}" if parts.query else ""
    # pyarrow's path of an S3 object is "bucket/key": the host part of the URI.
    return [f"{parts.scheme}://{p}{query}" for p in found]


def write_atomically(path: str, content: bytes | Callable[[str], object]) -> None:
    """Writes the local file ``path`` whole or not at all.

    ``content`` goes to a temporary file in the same directory (so that the
    rename cannot cross filesystems), is flushed to disk (``fsync``) and renamed
    over ``path``: a reader sees the old file or the new one, never half of
    one, and a crash after the rename does not leave a file whose data never
    reached the disk. The new file's mode is the one ``open`` gives (0o666 less
    the umask), not ``tempfile``'s private 0o600: a cache or a checkpoint that
    others read stays readable to them.

    Args:
        path: the file to write (replaced if it exists).
        content: the bytes, or a function that writes the file named by its
            argument (``torch.save``, an Arrow writer) and creates it.

    Raises:
        OSError: the write failed (a full disk, a read-only directory).
        Exception: whatever ``content`` raised, unchanged.
        On any failure the temporary file is removed and ``path`` is left as it was.
    """
    directory, name = os.path.split(os.path.abspath(path))
    # Hidden, and unique to this write: never taken for a file of the directory
    # (a checkpoint's shards, a glob), never shared with a concurrent writer.
    temporary = os.path.join(directory, f".{name}.{uuid.uuid4().hex}.tmp")
    try:
        if callable(content):
            content(temporary)
        else:
            with open(temporary, "xb") as out:
                out.write(content)
        sync_to_disk(temporary)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    sync_directory(directory)


def sync_to_disk(path: str) -> None:
    """``fsync`` of the local file ``path``: its data reach the disk before
    anything that names it (a rename, a done file) does."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def exchange_paths(first: str, second: str) -> bool:
    """Swaps two local paths in one step (Linux's ``renameat2`` with
    ``RENAME_EXCHANGE``), so that no moment finds either missing; False,
    changing nothing, where the system or the filesystem cannot (then the
    caller renames in two steps)."""
    function = getattr(_libc(), "renameat2", None)
    if function is None:
        return False
    at_current_directory, rename_exchange = -100, 2
    done = function(at_current_directory, os.fsencode(first), at_current_directory,
                    os.fsencode(second), rename_exchange)
    if done == 0:
        return True
    error = ctypes.get_errno()
    if error in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # not offered here
        return False
    raise OSError(error, f"cannot swap {first} and {second}: {os.strerror(error)}")


@functools.cache
def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


# What replace_directory names the directory it moves aside, after ``staging``.
SET_ASIDE = ".old"


def staging_directory(target: str) -> str:
    """A new empty local directory beside ``target``, to write what then
    replaces ``target`` (``replace_directory``):
    ``.<name>.tmp-<space>.<pid>-<hex>``, whose process space (``_process_space``)
    and process id tell ``remove_abandoned`` whether its maker is gone."""
    parent, name = os.path.split(os.path.abspath(target))
    os.makedirs(parent, exist_ok=True)
    unique = uuid.uuid4().hex[:8]
    path = os.path.join(parent, f".{name}.tmp-{_process_space()}.{os.getpid()}-{unique}")
    os.makedirs(path)
    return path


@functools.cache
def _process_space() -> str:
    """Where this process's id means this process: a digest of the host name,
    this boot of its kernel and its pid namespace (containers that share a
    host name, a kernel or both still differ)."""
    import hashlib
    import socket

    parts = [socket.gethostname()]
    with contextlib.suppress(OSError), open("/proc/sys/kernel/random/boot_id") as boot:
        parts.append(boot.read().strip())
    with contextlib.suppress(OSError):
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
    text = "\n".join(parts).encode(errors="surrogateescape")
    return hashlib.sha256(text).hexdigest()[:12]


def remove_abandoned(target: str, complete_marker: str) -> list[str]:
    """Removes what processes of this process space that are gone left beside
    ``target``: the staging directories of replacements that never finished
    (a crash in a save), and, once ``target`` is whole (holds
    ``complete_marker``), an old directory that a replacement in two renames
    moved aside (``SET_ASIDE``) but did not remove. What a live process,
    another host or container, or an older fleetfeed (no process in the name)
    made is left. Returns the paths removed."""
    parent, name = os.path.split(os.path.abspath(target))
    mine = f".{name}.tmp-{_process_space()}."  # then <pid>-<hex>, and SET_ASIDE if moved aside
    whole = os.path.isfile(os.path.join(target, complete_marker))
    removed = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(parent):
            if not entry.name.startswith(mine) or not entry.is_dir(follow_symlinks=False):
                continue
            pid = entry.name[len(mine):].split("-", 1)[0]
            aside = entry.name.endswith(SET_ASIDE)
            if not (pid.isascii() and pid.isdigit()) or _alive(int(pid)) or (aside and not whole):
                continue  # in use, or for restore_interrupted to put back
            shutil.rmtree(entry.path, ignore_errors=True)
            if not os.path.lexists(entry.path):
                removed.append(entry.path)
    return removed


def _alive(pid: int) -> bool:
    """Whether process ``pid`` may exist (one of another user counts; an id
    no process can have is taken as alive: the folder is then left)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def replace_directory(staging: str, target: str) -> None:
    """Moves the complete local directory ``staging`` to ``target``, replacing
    what is there: in one step where the system swaps paths
    (``exchange_paths``), else in two renames, the old directory first moved to
    ``staging + SET_ASIDE`` (put back if the second rename fails; a process
    killed between them leaves it there). The old directory is then removed,
    and the rename synced to disk."""
    if not os.path.exists(target):
        os.replace(staging, target)
    elif exchange_paths(staging, target):  # staging now holds the old directory
        shutil.rmtree(staging, ignore_errors=True)
    else:
        old = staging + SET_ASIDE
        os.replace(target, old)
        try:
            os.replace(staging, target)
        except OSError:
            os.replace(old, target)
            raise
        shutil.rmtree(old, ignore_errors=True)
    sync_directory(os.path.dirname(os.path.abspath(target)))


def sync_directory(directory: str) -> None:
    """``fsync`` of a local directory: its entries (a rename into it, a new
    file) reach the disk. A filesystem that cannot sync a directory keeps the
    entries in place all the same: not a failure."""
    with contextlib.suppress(OSError):
        sync_to_disk(directory)


def write_stream_atomically(path: str, write: Callable[[Any], object]) -> None:
    """Writes ``path``, local or a URI, whole or not at all: ``write`` gets a
    binary output stream to a hidden temporary file beside ``path``.

    A local file (or ``file://``) is renamed over ``path`` (``write_atomically``).
    Elsewhere a filesystem's move over an existing file is not always one step:
    pyarrow's HDFS move deletes ``path`` and then renames, so a crash in between
    would leave neither file. So a replacement goes through a successor,
    ``.<name>.next`` beside ``path``, renamed only once complete: a crash leaves
    ``path`` (the old content) or the successor (the new), which
    ``read_replaced`` then reads and the next write (or ``finish_replacement``)
    puts in place. One process writes ``path`` at a time.

    Raises:
        OSError: the write or a rename failed.
        Exception: whatever ``write`` raised, unchanged.
        On any failure the temporary file is removed; ``path`` reads as it did,
        or, when the last move failed, possibly as the new content.
    """
    filesystem, target = _where_replaced(path)
    if filesystem is None:
        def to_file(temporary: str) -> None:
            with open(temporary, "xb") as out:
                write(out)

        write_atomically(target, to_file)
        return
    successor = _successor(target)
    replacing = _finish_replacement(filesystem, target, successor)
    folder, slash, name = target.rpartition("/")
    temporary = f"{folder}{slash}.{name}.{uuid.uuid4().hex}.tmp"
    try:
        with filesystem.open_output_stream(temporary, compression=None) as out:
            write(out)
        if not replacing:
            filesystem.move(temporary, target)  # nothing to replace: one rename
            return
        if _is_file(filesystem, successor):  # left by a crash before the last move: stale
            filesystem.delete_file(successor)
        filesystem.move(temporary, successor)
    except BaseException:
        with contextlib.suppress(Exception):
            filesystem.delete_file(temporary)
        raise
    filesystem.move(successor, target)


def finish_replacement(path: str) -> None:
    """Puts in place the complete new content of ``path`` that a crash inside
    ``write_stream_atomically`` left beside it, so that readers other than
    ``read_replaced`` (a serving side, ``hdfs dfs -cat``) find the file. The
    one writer of ``path`` calls it; nothing to do for a local file."""
    filesystem, target = _where_replaced(path)
    if filesystem is not None:
        _finish_replacement(filesystem, target, _successor(target))


def read_replaced(path: str) -> bytes | None:
    """The content of ``path``, a file that ``write_stream_atomically``
    replaces: its successor's when a crash interrupted a replacement; None
    when there is neither."""
    filesystem, target = _where_replaced(path)
    if filesystem is None:
        try:
            with open(target, "rb") as local:
                return local.read()
        except FileNotFoundError:
            return None
    # The target again last: a replacement may complete between the first two reads.
    for candidate in (target, _successor(target), target):
        try:
            with filesystem.open_input_stream(candidate, compression=None) as stream:
                return stream.read()
        except FileNotFoundError:
            continue
        except OSError as error:
            if "not exist" not in str(error) and "NoSuchKey" not in str(error):
                raise
    return None


def _where_replaced(path: str) -> tuple[pafs.FileSystem | None, str]:
    """The filesystem of ``path`` and the path inside it; None for this
    machine's files, which one rename replaces."""
    if not is_uri(path):
        return None, path
    filesystem, target = resolve(path)
    return (None if isinstance(filesystem, pafs.LocalFileSystem) else filesystem), target


def _successor(target: str) -> str:
    folder, slash, name = target.rpartition("/")
    return f"{folder}{slash}.{name}.next"


def _is_file(filesystem: pafs.FileSystem, inner: str) -> bool:
    return filesystem.get_file_info(inner).type == pafs.FileType.File


def _finish_replacement(filesystem: pafs.FileSystem, target: str, successor: str) -> bool:
    """Puts in place a successor that a crash left without its target; whether
    ``target`` is now a file."""
    if _is_file(filesystem, target):
        return True
    if not _is_file(filesystem, successor):
        return False
    filesystem.move(successor, target)
    return True


def hdfs_args(fs_name: str, fs_ugi: str = "") -> dict[str, Any]:
    """The ``HadoopFileSystem`` arguments of Paddle's ``fs_name`` and ``fs_ugi``.

    ``fs_name`` is ``hdfs://host:port`` (or ``afs://``, Baidu's HDFS); ``fs_ugi``
    is ``"user,password"`` (the password is not used by libhdfs).
    """
    parts = urlsplit(fs_name if "://" in fs_name else f"hdfs://{fs_name}")
    if parts.scheme not in ("hdfs", "afs", "viewfs") or not parts.hostname:
        raise SchemaError(
            f"the 'fs_name' setting must look like 'hdfs://namenode:port', got {fs_name!r}"
        )
    args: dict[str, Any] = {"host": parts.hostname, "port": parts.port or 8020}
    user = fs_ugi.split(",", 1)[0].strip()
    if user:
        args["user"] = user
    return args


def hdfs_filesystem(fs_name: str, fs_ugi: str = "") -> pafs.FileSystem:
    """The HDFS filesystem of Paddle's settings; a clear error without libhdfs.

    Raises:
        DatafeedError: libhdfs or a JVM is not installed (or the connection failed).
    """
    args = hdfs_args(fs_name, fs_ugi)
    try:
        return pafs.HadoopFileSystem(**args)
    except OSError as error:
        raise DatafeedError(
            f"cannot connect to HDFS {fs_name!r} (fs_name): pyarrow needs libhdfs and "
            "a JVM (set JAVA_HOME, HADOOP_HOME and ARROW_LIBHDFS_DIR, and CLASSPATH to "
            f"`hadoop classpath --glob`); the error was: {_first_line(error)}"
        ) from None


class DownloadCommand:
    """Paddle's ``download_cmd``: plain paths read through a shell command that
    prints the file's bytes, the path appended after ``--`` as one shell-quoted
    argument (``hadoop fs -cat`` becomes ``hadoop fs -cat -- '/user/x/part-0'``),
    so that a path starting with ``-`` is never taken for an option. The path
    ``-`` (standard input, for most commands) is refused.

    It stands where a filesystem does (``get_file_info``, ``open_input_stream``),
    so every reader streams its output as it streams a remote file. Files
    cannot be checked before reading: every path counts as a file of unknown
    size, and a command that fails on one is a ``ReaderError`` naming the
    command, the path, the exit status and the end of its stderr.
    """

    def __init__(self, command: str) -> None:
        self.command = command

    def __repr__(self) -> str:
        return f"DownloadCommand({self.command!r})"

    def shell_command(self, path: str) -> str:
        """The shell command that prints ``path``: ``--``, then the path as one quoted word.

        Raises:
            SchemaError: the path is ``-`` or empty.
        """
        self._check_path(path)
        return f"{self.command} -- {shlex.quote(path)}"

    def _check_path(self, path: str) -> None:
        if path in ("-", ""):
            raise SchemaError(
                f"download_cmd {self.command!r}: the input path {path!r} names no file (the "
                "command would read its own standard input); expected a file's path"
            )

    def get_file_info(self, path: str) -> pafs.FileInfo:
        """Every path is taken to be a file (there is nothing to ask), but ``-``.

        Raises:
            SchemaError: the path is ``-`` or empty.
        """
        self._check_path(path)
        # pyarrow holds a name as UTF-8: a byte that is not (\udcff) is shown
        # escaped in the info; the command itself gets the name's own bytes.
        shown = path.encode("utf-8", "backslashreplace").decode("utf-8")
        return pafs.FileInfo(shown, pafs.FileType.File)

    def open_input_stream(self, path: str, compression: Any = None) -> CommandStream:
        """The command's standard output, as a readable stream."""
        return CommandStream(self.shell_command(path), self.command, path)
