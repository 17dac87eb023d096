"""Child processes: pipe commands and download commands, and how they end.

A command runs as ``bash -c "set -o pipefail; <command>"`` in its own process
group (datafeed/source/process_groups.py), so that stopping it also stops what it
started. The group is ended (SIGTERM, then SIGKILL after a grace period) once
its leader has exited (a background child left behind is killed, not waited
for), on an error, on a timeout and on close, and at exit or SIGTERM of the
Python process. Only the last ``STDERR_TAIL_BYTES`` of its stderr are kept
(nothing is spooled to disk); when it fails, the ``ReaderError`` names the
command, the input, the exit status or the signal's name, and the last lines of
that stderr; for a reader built on the ``generators`` package, also the input
line it failed on (noted under its traceback). Every child is waited for and
every pipe closed, on success and on error.

The input arrives already opened (datafeed/source/fs.py opens files): a local file
becomes the command's stdin as it is; any other stream is copied into the
command's stdin by a ``Feeder`` thread.

``feed_in_pieces`` is the loop that hands a buffer of command output to the
parser a piece at a time, shared by the pipe readers and the command line.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..config.errors import ReaderError
from .process_groups import (
    STDERR_TAIL_BYTES,
    STDERR_TAIL_LINES,
    StderrTail,
    end_group,
    kill_group,
    spawn,
    stderr_tail,
)

if TYPE_CHECKING:
    from ..parse.parsing import ChunkParser

__all__ = [
    "CommandStream",
    "Feeder",
    "PipeProcess",
    "STDERR_TAIL_BYTES",
    "STDERR_TAIL_LINES",
    "describe_exit",
    "exit_error",
    "feed_in_pieces",
    "start_shell",
]

# Once a command exited and its group was ended, its output must end within
# this: only a process that left the group (setsid) can still hold it open.
HELD_OUTPUT_SECONDS = 2.0
# A larger pipe means fewer, larger reads of a command's output.
PIPE_BUFFER_BYTES = 1 << 20
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
# A Feeder copies this much of its stream into the pipe at a time.
COPY_BYTES = 1 << 20
# The note a generators-package reader prints under the traceback of an error
# in its run loop (generators/_sample_checks.pyx: note_input_line).
_INPUT_LINE_NOTE = re.compile(
    r"^(in (?:the samples of|the batch that ends with) input line \d+): ", re.MULTILINE
)


# -- starting, stopping, and the end of a command -------------------------------------


def start_shell(command: str, stdin: Any, stderr: Any = subprocess.PIPE) -> subprocess.Popen:
    """Starts ``bash -c "set -o pipefail; <command>"`` with its stdout a pipe.

    It runs in its own process group (``end_group`` reaches its children), so
    a failure anywhere in a pipeline is its exit status.
    """
    return spawn(["bash", "-c", "set -o pipefail; " + command], stdin, stderr)


def describe_exit(returncode: int) -> str:
    """``exited with status 1``; for a negative status, ``was killed by signal SIGKILL``."""
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        return f"was killed by signal {signal.Signals(-returncode).name}"
    except ValueError:  # a number with no name on this system
        return f"was killed by signal {-returncode}"


def _with_stderr(message: str, tail: str) -> str:
    return message + (f"; last stderr lines:\n{tail}" if tail else " (no stderr output)")


def _failed_input_line(tail: str) -> str:
    """``, in the samples of input line 3`` when the reader's stderr ends with the
    note a ``generators`` reader adds to its error; ``""`` otherwise."""
    notes = _INPUT_LINE_NOTE.findall(tail)
    return f", {notes[-1]}" if notes else ""


def exit_error(
    command: str, path: str, returncode: int, stderr: StderrTail | None, label: str = "command"
) -> ReaderError:
    """The error of ``command`` that ended with ``returncode`` (non-zero) on ``path``.

    Its message reads ``<label> 'cmd' exited with status 1 on <path>; last
    stderr lines: ...`` (``was killed by signal SIGKILL`` for a signal), with
    ``, in the samples of input line 3`` after the path when a generators
    reader's stderr names the line it failed on.
    """
    tail = stderr_tail(stderr)
    where = f"{path}{_failed_input_line(tail)}"
    message = _with_stderr(f"{label} {command!r} {describe_exit(returncode)} on {where}", tail)
    return ReaderError(
        message, command=command, path=path, returncode=returncode, stderr_tail=tail
    )


# -- feeding a stream into a command --------------------------------------------------


class Feeder:
    """Copies a readable stream into a pipe (a command's stdin) on a thread.

    The pipe is closed at the end of the stream (the command sees EOF). A
    command that stops reading early (a write's ``BrokenPipeError``) just ends
    the copy; any other error, a read's above all (a remote stream's
    ``ArrowInvalid`` is a ``ValueError``, and must not pass for the end of the
    file), is kept in ``error`` and re-raised by ``raise_error()``, unless
    ``stop()`` ended the copy on purpose.
    """

    def __init__(self, source: Any, pipe: Any, name: str) -> None:
        self._source = source  # owned by the feeder from here on
        self._pipe = pipe
        self.error: BaseException | None = None
        self.bytes = 0
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                data = self._source.read(COPY_BYTES)
                if not data:
                    break
                try:
                    self._pipe.write(data)
                except (BrokenPipeError, ValueError):
                    return  # the command went away (or was killed): nothing to feed
                self.bytes += len(data)
        except BaseException as error:  # noqa: BLE001 - re-raised by raise_error()
            if not self._stopped:
                self.error = error
        finally:
            for closable in (self._pipe, self._source):
                with contextlib.suppress(BrokenPipeError, OSError, ValueError):
                    closable.close()

    def join(self, timeout: float | None = None) -> None:
        """Waits for the copy to end (at most ``timeout`` seconds)."""
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        """Whether the copy still runs."""
        return self._thread.is_alive()

    def stop(self) -> None:
        """Ends the copy early where the source allows it: a ``CommandStream``
        is killed, so that a read blocked on it returns."""
        self._stopped = True
        kill = getattr(self._source, "kill", None)
        if kill is not None:
            kill()

    def raise_error(self) -> None:
        """Waits for the copy; re-raises the error it hit, if any."""
        self.join()
        if self.error is not None:
            raise self.error


def _descriptor(source: Any) -> int | None:
    """The OS file descriptor of a local file; None for a stream without one
    (a pyarrow stream, a ``CommandStream``)."""
    if not isinstance(source, io.IOBase):
        return None
    try:
        return source.fileno()
    except (OSError, ValueError):  # io.UnsupportedOperation is both
        return None


# -- a pipe command on one input ------------------------------------------------------


class PipeProcess:
    """The pipe command running on one input, its stdout readable by us.

    Its end is bounded: ``leader_exited()`` ends what the command left behind
    (a background child holding its output), and ``wait(timeout)`` stops a
    command that closed its output but does not exit. Such a command is an
    error, not a success with the records it wrote: its exit status, which
    decides whether its output was complete, never came.

    Args:
        command: the pipe command.
        source: the input, already opened, owned (and closed) by the
            PipeProcess from here on: a local file (``open(path, "rb")``),
            whose descriptor is the command's stdin, or any readable stream (a
            remote file, a download), copied into the command by a ``Feeder``.
        name: the input as messages name it (a path, with its byte range).
        gunzip: the input is gzip data: it goes through ``gzip -dc`` first.
        start: with ``end``, the first byte of a local file to read.
        end: the end of the byte range (``None``: read to the end).

    Raises:
        ValueError: a byte range of a stream without a file descriptor.
    """

    def __init__(
        self,
        command: str,
        source: Any,
        *,
        name: str,
        gunzip: bool = False,
        start: int = 0,
        end: int | None = None,
    ) -> None:
        self.command = command
        self.path = name
        self._processes: list[subprocess.Popen] = []
        self._stderr: StderrTail | None = None
        self._gunzip_stderr: StderrTail | None = None
        self._feeder: Feeder | None = None
        self._exit_fd: int | None = None
        descriptor = _descriptor(source)
        # A local file is the first process's stdin itself; a stream is copied
        # into it by the feeder, which then owns (and closes) the stream.
        self._input = source if descriptor is not None else None
        self._source = None if descriptor is not None else source
        try:
            shell_command = command
            if end is not None:
                if descriptor is None:
                    raise ValueError(f"byte ranges of remote files are not supported: {name}")
                # A byte range: the command's stdin starts at `start` (the file
                # offset is shared with the child) and `head` stops it at `end`.
                os.lseek(descriptor, start, os.SEEK_SET)
                shell_command = f"head -c {end - start} | {command}"
            stdin: Any = descriptor if descriptor is not None else subprocess.PIPE
            gzip_process = None
            if gunzip:
                gzip_process = spawn(["gzip", "-dc"], stdin, subprocess.PIPE)
                self._processes.append(gzip_process)
                self._gunzip_stderr = _take_stderr(gzip_process, f"datafeed-stderr gzip {name}")
                stdin = gzip_process.stdout
            self.process = start_shell(shell_command, stdin)
            self._processes.append(self.process)
            self._stderr = _take_stderr(self.process, f"datafeed-stderr {name}")
            if gzip_process is not None:
                gzip_process.stdout.close()  # type: ignore[union-attr]  # the command owns it
            if self._source is not None:
                first = self._processes[0]
                self._feeder = Feeder(self._source, first.stdin, f"datafeed-feed {name}")
                first.stdin = None  # the feeder owns (and closes) it now
                self._source = None
            with contextlib.suppress(OSError, AttributeError):  # Linux 5.3+; else polled
                self._exit_fd = os.pidfd_open(self.process.pid)
        except BaseException:
            self.close()
            raise
        self.stdout = self.process.stdout
        try:  # Larger pipe reads mean fewer parser calls; not fatal if refused.
            pipe = self.stdout.fileno()  # type: ignore[union-attr]
            fcntl.fcntl(pipe, _F_SETPIPE_SZ, PIPE_BUFFER_BYTES)
        except OSError:
            pass

    @property
    def exit_fd(self) -> int | None:
        """A descriptor that becomes readable when the command's shell exits
        (a pidfd), for ``select.poll``; None where the system has none."""
        return self._exit_fd

    def exited(self) -> bool:
        """Whether the command's shell has exited."""
        return self.process.poll() is not None

    def leader_exited(self) -> None:
        """Ends what the exited command left running in its group (a
        background child holding its output open), so that its output ends.

        The command's own output stays readable: what it wrote is in the pipe.
        """
        end_group(self.process)

    def kill(self) -> None:
        """Stops the command and everything it started (SIGTERM now; ``close()``
        sends SIGKILL to what is left after ``STOP_GRACE_SECONDS``)."""
        if self._feeder is not None:
            self._feeder.stop()  # a download command (CommandStream) too
        for process in self._processes:
            kill_group(process)

    def wait(self, timeout: float | None = None) -> None:
        """Waits for the command, at most ``timeout`` seconds (None: for ever);
        raises ``ReaderError`` if it (or gunzip, or the copy of a stream into
        it) failed, or did not exit in time (it is then stopped)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        # The command first: a gunzip it stopped reading from ends with it.
        for process in reversed(self._processes):
            try:
                process.wait(_remaining(deadline))
            except subprocess.TimeoutExpired:
                self.kill()
                raise self._still_running_error(process, timeout) from None
            end_group(process)  # what it left behind
        if self._feeder is not None:
            # A remote read that failed half-way must not pass for the file's end.
            self._feeder.join(_remaining(deadline))
            if self._feeder.is_alive():  # blocked on a source the command no longer reads
                self._feeder.stop()
                self._feeder.join()
            error = self._feeder.error
            if isinstance(error, ReaderError):  # a download command's failure
                raise error
            if error is not None:
                raise ReaderError(
                    f"reading {self.path} failed: {error}",
                    command=self.command, path=self.path, returncode=None, stderr_tail="",
                ) from error
        if self._processes[0] is not self.process:
            gzip_process = self._processes[0]
            # gunzip killed by SIGPIPE just means the command stopped reading early.
            if gzip_process.returncode not in (0, -signal.SIGPIPE):
                raise exit_error(
                    "gzip -dc", self.path, gzip_process.returncode, self._gunzip_stderr
                )
        if self.process.returncode != 0:
            raise exit_error(self.command, self.path, self.process.returncode, self._stderr)

    def _still_running_error(self, process: subprocess.Popen, seconds: float | None) -> ReaderError:
        command = self.command if process is self.process else "gzip -dc"
        return self._error(
            f"command {command!r} closed its output but did not exit within {seconds:g} s "
            f"on {self.path} (the read_timeout setting); it was stopped"
        )

    def timeout_error(self, seconds: float) -> ReaderError:
        """The error for a command that wrote nothing for ``seconds`` (it is killed)."""
        return self._error(
            f"command {self.command!r} wrote no output for {seconds:g} s on {self.path} "
            f"(the read_timeout setting); it was stopped"
        )

    def held_output_error(self) -> ReaderError:
        """The error for a command that exited while a process it moved out of
        its process group (``setsid``) still holds its output open."""
        return self._error(
            f"command {self.command!r} exited, but a process it started outside its process "
            f"group still held its output open {HELD_OUTPUT_SECONDS:g} s later, on {self.path}; "
            f"its output was not read to the end"
        )

    def _error(self, message: str) -> ReaderError:
        self.kill()  # its stderr ends with it
        tail = stderr_tail(self._stderr)
        return ReaderError(
            _with_stderr(message, tail),
            command=self.command, path=self.path, returncode=None, stderr_tail=tail,
        )

    def close(self) -> None:
        """Ends every process's group (SIGTERM, SIGKILL after a grace period),
        reaps every process, closes every file."""
        self.kill()
        for process in self._processes:
            if process.stdout is not None:
                process.stdout.close()
            end_group(process)
        if self._feeder is not None:
            self._feeder.join()  # the kill above broke its pipe: it ends
        if self._source is not None:
            self._source.close()
        if self._input is not None:
            self._input.close()
        if self._exit_fd is not None:
            os.close(self._exit_fd)
            self._exit_fd = None


def _take_stderr(process: subprocess.Popen, name: str) -> StderrTail:
    """Hands ``process``'s stderr pipe to a ``StderrTail`` reading it."""
    pipe, process.stderr = process.stderr, None
    return StderrTail(pipe, name)


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


# -- a download command's output, read like a file ------------------------------------


class CommandStream:
    """The standard output of a download command, read like a file.

    The end of the output is checked: a command that exits non-zero (or is
    killed) raises ``ReaderError`` from the read that reaches the end, so a
    failed download never passes for a short file.

    Args:
        shell_command: the command line that prints the file.
        command: the download command as messages name it (without the path).
        path: the file it prints.
    """

    def __init__(self, shell_command: str, command: str, path: str) -> None:
        self.command, self.path = command, path
        self._process = start_shell(shell_command, subprocess.DEVNULL)
        self._stderr = _take_stderr(self._process, f"datafeed-stderr download {path}")
        self._stdout = self._process.stdout
        self.closed = False

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (all when negative); ``b""`` at the end of a
        successful download.

        Raises:
            ReaderError: the command failed.
        """
        stdout: Any = self._stdout
        data = stdout.read1(size) if size >= 0 else stdout.read()
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
        """Always True: a stream to read from."""
        return True

    def _check_exit(self) -> None:
        returncode = self._process.wait()
        end_group(self._process)  # what it left behind
        if returncode != 0:
            raise exit_error(
                self.command, self.path, returncode, self._stderr, label="download command"
            )

    def kill(self) -> None:
        """Stops the command and everything it started (a blocked read returns)."""
        kill_group(self._process)

    def close(self) -> None:
        """Stops the command if it still runs, reaps it, closes its pipes."""
        if self.closed:
            return
        self.closed = True
        self.kill()
        self._stdout.close()  # type: ignore[union-attr]
        end_group(self._process)

    def __enter__(self) -> CommandStream:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- command output into the parser ---------------------------------------------------


def feed_in_pieces(
    parser: ChunkParser, view: memoryview, piece_bytes: int, after_piece: Callable[[], object]
) -> int:
    """Feeds the complete lines of ``view`` to ``parser``, ``piece_bytes`` at a
    time, calling ``after_piece()`` after each piece (to take the parsed rows).

    Small pieces keep the rows parsed between two ``after_piece`` calls close
    to a chunk's size, whatever the size of ``view``. A line longer than a
    piece is fed whole.

    Returns:
        The bytes consumed: ``view[consumed:]`` is a last line without its
        newline (for a later feed, or ``parser.feed_final``).
    """
    start, end = 0, len(view)
    while start < end:
        limit = min(end, start + piece_bytes)
        consumed = parser.feed(view[start:limit])
        if not consumed and limit < end:  # a line longer than the piece
            consumed = parser.feed(view[start:end])
            limit = end
        start += consumed
        after_piece()
        if limit == end or not consumed:
            break
    return start
