"""Input files on any ``pyarrow.fs`` filesystem: S3, HDFS, GCS, local.

A filelist entry is a local path, or a URI that
``pyarrow.fs.FileSystem.from_uri`` accepts (``s3://bucket/key?endpoint_override=
host:port&scheme=http&region=...``, ``hdfs://namenode:port/path``, ``gs://...``,
``file:///...``); credentials come from the usual environment (``AWS_*``, ...).
The ``filesystem=`` setting gives the filesystem of plain paths (a
``pyarrow.fs.FileSystem`` or an fsspec filesystem); Paddle's ``fs_name`` /
``fs_ugi`` map onto an HDFS filesystem (``hdfs_filesystem``); Paddle's
``download_cmd`` (other than ``"cat"``) reads plain paths through a command
that prints the file (``DownloadCommand``).

A remote file is streamed into the pipe command's standard input by a feeder
thread, never copied to local disk first; a ``.gz`` file is streamed
compressed into ``gzip -dc``. The file name never reaches a shell.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import shlex
import signal
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import pyarrow.fs as pafs

from .errors import DatafeedError, ReaderError, SchemaError

__all__ = [
    "DownloadCommand",
    "Feeder",
    "as_filesystem",
    "exists",
    "hdfs_args",
    "hdfs_filesystem",
    "is_gzip",
    "is_remote",
    "is_uri",
    "list_files",
    "missing_files",
    "open_input",
    "stat",
]

FEED_BYTES = 1 << 20


def is_uri(path: str) -> bool:
    """Whether ``path`` names its filesystem (``scheme://...``)."""
    scheme = urlsplit(path).scheme
    return len(scheme) > 1 and "://" in path  # "C:\\..." is not a URI


def is_gzip(path: str) -> bool:
    """Whether ``path`` names a gzip file (``.gz``, before any URI query)."""
    return (urlsplit(path).path if is_uri(path) else path).endswith(".gz")


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
            return pafs.LocalFileSystem(), parts.path
        base = f"{parts.scheme}://{parts.netloc}/" + (f"?{parts.query}" if parts.query else "")
        try:
            _, inner = pafs.FileSystem.from_uri(path)
            return _from_uri_base(base), inner
        except (OSError, ValueError, TypeError) as error:
            raise DatafeedError(f"cannot open filesystem of {path!r}: {_first_line(error)}") from None
    if filesystem is None:
        return pafs.LocalFileSystem(), os.path.abspath(path)
    return filesystem, path


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
    fs, inner = resolve(path, filesystem)
    info = fs.get_file_info(inner)
    if info.type != pafs.FileType.File:
        raise FileNotFoundError(f"no file at {path}")
    return info


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
    try:
        return fs.open_input_stream(inner, compression=None)
    except FileNotFoundError:
        raise FileNotFoundError(f"no file at {path}") from None
    except OSError as error:
        if "not exist" in str(error) or "NoSuchKey" in str(error):
            raise FileNotFoundError(f"no file at {path}") from None
        raise


class Feeder:
    """Copies a remote input stream into a pipe (a command's stdin) on a thread.

    The pipe is closed at the end of the stream (the command sees EOF). A
    command that stops reading early (``BrokenPipeError``) just ends the copy;
    any other error is kept and re-raised by ``join()``.
    """

    def __init__(self, source: Any, pipe: Any, name: str) -> None:
        self._source = source  # owned by the feeder from here on
        self._pipe = pipe
        self.error: BaseException | None = None
        self.bytes = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                data = self._source.read(FEED_BYTES)
                if not data:
                    break
                self._pipe.write(data)
                self.bytes += len(data)
        except (BrokenPipeError, ValueError):
            pass  # the command went away (or was killed): nothing more to feed
        except BaseException as error:  # noqa: BLE001 - re-raised by join()
            self.error = error
        finally:
            for closable in (self._pipe, self._source):
                try:
                    closable.close()
                except (BrokenPipeError, OSError, ValueError):
                    pass

    def join(self) -> None:
        """Waits for the copy to end."""
        self._thread.join()

    def stop(self) -> None:
        """Ends the copy early where the source allows it: a ``DownloadCommand``
        stream is killed, so that a read blocked on it returns."""
        kill = getattr(self._source, "kill", None)
        if kill is not None:
            kill()

    def raise_error(self) -> None:
        """Waits for the copy; re-raises the error it hit, if any."""
        self.join()
        if self.error is not None:
            raise self.error


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
    if parts.scheme == "file":
        return [f"file://{p}" for p in found]
    query = f"?{parts.query}" if parts.query else ""
    # pyarrow's path of an S3 object is "bucket/key": the host part of the URI.
    return [f"{parts.scheme}://{p}{query}" for p in found]


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


STDERR_TAIL_LINES = 20


class DownloadCommand:
    """Paddle's ``download_cmd``: plain paths read through a shell command that
    prints the file's bytes, the path appended as one shell-quoted argument
    (``hadoop fs -cat`` becomes ``hadoop fs -cat '/user/x/part-0'``).

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
        """The shell command that prints ``path``: the path is one quoted word."""
        return f"{self.command} {shlex.quote(path)}"

    def get_file_info(self, path: str) -> pafs.FileInfo:
        """Every path is taken to be a file (there is nothing to ask)."""
        return pafs.FileInfo(path, pafs.FileType.File)

    def open_input_stream(self, path: str, compression: Any = None) -> CommandStream:
        """The command's standard output, as a readable stream."""
        return CommandStream(self.shell_command(path), self.command, path)


class CommandStream:
    """The standard output of a download command, read like a file.

    The end of the output is checked: a command that exits non-zero (or is
    killed) raises ``ReaderError`` from the read that reaches the end, so a
    failed download never passes for a short file.
    """

    def __init__(self, shell_command: str, command: str, path: str) -> None:
        self.command, self.path = command, path
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        self._process = subprocess.Popen(
            ["bash", "-c", "set -o pipefail; " + shell_command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            start_new_session=True,  # its own process group: kill() reaches children
        )
        self._stdout = self._process.stdout
        self.closed = False

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (all when negative); ``b""`` at the end of a
        successful download.

        Raises:
            ReaderError: the command failed.
        """
        data = self._stdout.read1(size) if size >= 0 else self._stdout.read()  # type: ignore[union-attr]
        if not data:
            self._check_exit()
        return data

    def readinto(self, buffer: Any) -> int:
        """Reads into ``buffer``; 0 at the end of a successful download."""
        n = self._stdout.readinto1(buffer)  # type: ignore[union-attr]
        if not n:
            self._check_exit()
        return n

    def readable(self) -> bool:
        return True

    def _check_exit(self) -> None:
        returncode = self._process.wait()
        if returncode == 0:
            return
        self._stderr.seek(0, os.SEEK_END)
        self._stderr.seek(max(0, self._stderr.tell() - 16384))
        lines = self._stderr.read().decode("utf-8", "replace").rstrip("\n").splitlines()
        tail = "\n".join(lines[-STDERR_TAIL_LINES:])
        if returncode < 0:
            how = f"was killed by signal {-returncode}"
        else:
            how = f"exited with status {returncode}"
        message = f"download command {self.command!r} {how} on {self.path}"
        message += f"; last stderr lines:\n{tail}" if tail else " (no stderr output)"
        raise ReaderError(
            message, command=self.command, path=self.path, returncode=returncode, stderr_tail=tail
        )

    def kill(self) -> None:
        """Kills the command and everything it started (a blocked read returns)."""
        if self._process.poll() is None:
            try:
                os.killpg(self._process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def close(self) -> None:
        """Kills the command if it still runs, reaps it, closes its pipes."""
        if self.closed:
            return
        self.closed = True
        self.kill()
        self._stdout.close()  # type: ignore[union-attr]
        self._process.wait()
        self._stderr.close()

    def __enter__(self) -> CommandStream:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
