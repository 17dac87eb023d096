"""Pipe readers: run the pipe command on each input file and parse its output.

Each file gets its own ``bash -c "set -o pipefail; <pipe_command>"`` with the
file on its standard input (``.gz`` files go through ``gzip -dc`` first). The file
name never reaches a shell: fleetfeed opens the file itself. ``thread_num``
reader threads work on different files at once; the parser releases the GIL, so
they parse in parallel.

A command that fails is a ``ReaderError``; the first error stops every other
reader (their processes are killed) and is re-raised in the caller's thread.
"""

from __future__ import annotations

import dataclasses
import fcntl
import io
import logging
import os
import select
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import fs, ranges
from .columns import RecordChunk
from .errors import AccountingError, ReaderError
from .parsing import ChunkParser
from .ranges import LimitedReader, OrderedChunks, describe, plan_tasks
from .slots import SlotSchema

logger = logging.getLogger("datafeed")

READ_BUFFER_BYTES = 4 << 20
PIPE_BUFFER_BYTES = 1 << 20
# Rows per parsed chunk. Small chunks keep the parser's column buffers in cache:
# on 1M Criteo lines with 2 threads, 64k-row chunks load 2.6 M lines/s, 8k-row
# chunks 3.1 M (0.75 -> 0.62 CPU seconds). They also bound a QueueDataset's memory.
DEFAULT_CHUNK_ROWS = 1 << 13
# When the pipe stays empty this long, the rows parsed so far are handed on
# rather than held back for a full chunk (a slow generator must not starve a
# streaming consumer).
IDLE_FLUSH_SECONDS = 0.05
# The parser is fed this much text at a time, so that chunks are cut close to
# chunk_rows whatever the size of a read.
FEED_BYTES = 256 << 10
STDERR_TAIL_LINES = 20
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


@dataclass
class FileStats:
    """What reading one file produced."""

    path: str
    lines: int = 0
    records: int = 0
    skipped_lines: int = 0
    skipped_reasons: dict[str, int] = field(default_factory=dict)
    bytes: int = 0
    seconds: float = 0.0

    def check(self) -> None:
        """Raises ``AccountingError`` unless every line read is a record or a
        skip, and every skip has a reason."""
        reasons = sum(self.skipped_reasons.values())
        if self.lines != self.records + self.skipped_lines or reasons != self.skipped_lines:
            raise AccountingError(
                f"the load of {self.path} does not add up: expected lines read = records "
                f"+ skipped lines, and skipped lines = the sum over their reasons; found "
                f"{self.lines} lines, {self.records} records, {self.skipped_lines} skipped "
                f"lines, reasons {self.skipped_reasons} (sum {reasons})"
            )

    def describe(self) -> str:
        """``path: L lines = R records + S skipped (reason n, ...)``."""
        text = f"{self.path}: {self.lines} lines = {self.records} records + {self.skipped_lines} skipped"
        if self.skipped_reasons:
            text += " (" + ", ".join(f"{r} {n}" for r, n in sorted(self.skipped_reasons.items())) + ")"
        return text


@dataclass
class LoadStats:
    """What the last load saw: every input line is a record or a counted skip.

    Attributes:
        files: files read.
        lines: lines of MultiSlot text (the pipe command's output) read.
        records: records kept.
        skipped_lines: lines skipped as malformed (``on_bad_line="skip"``).
        skipped_reasons: skipped lines per reason.
        bytes: bytes of MultiSlot text parsed.
        seconds: wall-clock time of the load.
        per_file: the same counts for each file, in filelist order; for each,
            ``lines == records + skipped_lines`` and the reasons sum to
            ``skipped_lines`` (checked at the end of every load and pass).
    """

    files: int = 0
    lines: int = 0
    records: int = 0
    skipped_lines: int = 0
    skipped_reasons: dict[str, int] = field(default_factory=dict)
    bytes: int = 0
    seconds: float = 0.0
    per_file: list[FileStats] = field(default_factory=list)

    @classmethod
    def combine(cls, per_file: list[FileStats], seconds: float) -> LoadStats:
        """The totals of ``per_file``, each checked to add up (``FileStats.check``).

        Raises:
            AccountingError: a file whose lines are not all records or skips.
        """
        reasons: dict[str, int] = {}
        for f in per_file:
            f.check()
            for reason, count in f.skipped_reasons.items():
                reasons[reason] = reasons.get(reason, 0) + count
        return cls(
            files=len(per_file),
            lines=sum(f.lines for f in per_file),
            records=sum(f.records for f in per_file),
            skipped_lines=sum(f.skipped_lines for f in per_file),
            skipped_reasons=reasons,
            bytes=sum(f.bytes for f in per_file),
            seconds=seconds,
            per_file=per_file,
        )

    def to_dict(self) -> dict:
        """The counts as a plain dict (JSON-able), per-file counts included."""
        return dataclasses.asdict(self)


def merge_file_stats(path: str, parts: list[FileStats]) -> FileStats:
    """One file's stats from those of its byte ranges (datafeed/ranges.py)."""
    if len(parts) == 1:
        return parts[0]
    reasons: dict[str, int] = {}
    for part in parts:
        for reason, count in part.skipped_reasons.items():
            reasons[reason] = reasons.get(reason, 0) + count
    return FileStats(
        path=path,
        lines=sum(p.lines for p in parts),
        records=sum(p.records for p in parts),
        skipped_lines=sum(p.skipped_lines for p in parts),
        skipped_reasons=reasons,
        bytes=sum(p.bytes for p in parts),
        seconds=max((p.seconds for p in parts), default=0.0),
    )


def is_identity_command(command: str) -> bool:
    """Whether the pipe command passes its input through unchanged (plain ``cat``)."""
    return command.strip() == "cat"


class PipeProcess:
    """The pipe command running on one input file, its stdout readable by us."""

    def __init__(
        self,
        command: str,
        path: str,
        start: int = 0,
        end: int | None = None,
        filesystem: Any = None,
    ) -> None:
        self.command = command
        self.path = path if end is None else f"{path} (bytes {start}-{end})"
        self._processes: list[subprocess.Popen] = []
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        self._gunzip_stderr: io.BufferedRandom | None = None
        # A remote file (datafeed/fs.py) is streamed into the first process's
        # stdin by a feeder thread; a local one is that stdin itself.
        remote = fs.is_remote(path, filesystem)
        self._source: Any = fs.open_input(path, filesystem) if remote else None
        self._feeder: fs.Feeder | None = None
        self._input = None if remote else open(path, "rb")  # noqa: SIM115 - closed in close()
        shell_command = command
        if end is not None:
            if self._input is None:
                raise ValueError(f"byte ranges of remote files are not supported: {path}")
            # A byte range: the command's stdin starts at `start` (the file
            # offset is shared with the child) and `head` stops it at `end`.
            os.lseek(self._input.fileno(), start, os.SEEK_SET)
            shell_command = f"head -c {end - start} | {command}"
        try:
            stdin: Any = self._input if self._input is not None else subprocess.PIPE
            gunzip = None
            if fs.is_gzip(path):
                self._gunzip_stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
                gunzip = subprocess.Popen(
                    ["gzip", "-dc"],
                    stdin=stdin,
                    stdout=subprocess.PIPE,
                    stderr=self._gunzip_stderr,
                    start_new_session=True,
                )
                self._processes.append(gunzip)
                stdin = gunzip.stdout
            self.process = subprocess.Popen(
                ["bash", "-c", "set -o pipefail; " + shell_command],
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                start_new_session=True,  # its own process group: kill() reaches children
            )
            self._processes.append(self.process)
            if gunzip is not None:
                gunzip.stdout.close()  # type: ignore[union-attr]  # the command owns it now
            if self._source is not None:
                first = self._processes[0]
                self._feeder = fs.Feeder(self._source, first.stdin, f"datafeed-feed {path}")
                first.stdin = None  # the feeder owns (and closes) it now
                self._source = None
        except BaseException:
            self.close()
            raise
        self.stdout = self.process.stdout
        try:  # Larger pipe reads mean fewer parser calls; not fatal if refused.
            fcntl.fcntl(self.stdout.fileno(), _F_SETPIPE_SZ, PIPE_BUFFER_BYTES)  # type: ignore[union-attr]
        except OSError:
            pass

    def kill(self) -> None:
        """Kills the command and everything it started."""
        if self._feeder is not None:
            self._feeder.stop()  # a download command (fs.DownloadCommand) too
        for process in self._processes:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    def wait(self) -> None:
        """Waits for the command; raises ``ReaderError`` if it (or gunzip) failed."""
        for process in self._processes:
            process.wait()
        if self._feeder is not None:
            # A remote read that failed half-way must not pass for the file's end.
            self._feeder.join()
            if self._feeder.error is not None:
                error = self._feeder.error
                if isinstance(error, ReaderError):  # a download command's failure
                    raise error
                raise ReaderError(
                    f"reading {self.path} failed: {error}",
                    command=self.command, path=self.path, returncode=None, stderr_tail="",
                ) from error
        if self._processes[0] is not self.process:
            gunzip = self._processes[0]
            # gunzip killed by SIGPIPE just means the command stopped reading early.
            if gunzip.returncode not in (0, -signal.SIGPIPE):
                raise self._error("gzip -dc", gunzip.returncode, self._gunzip_stderr)
        if self.process.returncode != 0:
            raise self._error(self.command, self.process.returncode, self._stderr)

    def timeout_error(self, seconds: float) -> ReaderError:
        """The error for a command that wrote nothing for ``seconds`` (it is killed)."""
        tail = _tail_lines(self._stderr, STDERR_TAIL_LINES)
        message = (
            f"command {self.command!r} wrote no output for {seconds:g} s on {self.path} "
            f"(the read_timeout setting); it was stopped"
        )
        message += f"; last stderr lines:\n{tail}" if tail else " (no stderr output)"
        return ReaderError(
            message, command=self.command, path=self.path, returncode=None, stderr_tail=tail
        )

    def _error(self, command: str, returncode: int, stderr_file) -> ReaderError:
        tail = _tail_lines(stderr_file, STDERR_TAIL_LINES)
        if returncode < 0:
            try:
                how = f"was killed by signal {signal.Signals(-returncode).name}"
            except ValueError:
                how = f"was killed by signal {-returncode}"
        else:
            how = f"exited with status {returncode}"
        message = f"command {command!r} {how} on {self.path}"
        message += f"; last stderr lines:\n{tail}" if tail else " (no stderr output)"
        return ReaderError(
            message, command=command, path=self.path, returncode=returncode, stderr_tail=tail
        )

    def close(self) -> None:
        """Kills what still runs, reaps every process, closes every file."""
        self.kill()
        for process in self._processes:
            if process.stdout is not None:
                process.stdout.close()
            process.wait()
        if self._feeder is not None:
            self._feeder.join()  # the kill above broke its pipe: it ends
        if self._source is not None:
            self._source.close()
        if self._input is not None:
            self._input.close()
        self._stderr.close()
        if self._gunzip_stderr is not None:
            self._gunzip_stderr.close()


def _tail_lines(file, count: int) -> str:
    if file is None:
        return ""
    file.seek(0, os.SEEK_END)
    size = file.tell()
    file.seek(max(0, size - 16384))
    text = file.read().decode("utf-8", "replace")
    return "\n".join(text.rstrip("\n").splitlines()[-count:])


class _Counters:
    """Progress shared by the reader threads (read by the progress display)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lines = 0
        self.bytes = 0
        self.files_done = 0

    def add(self, lines: int, nbytes: int) -> None:
        with self.lock:
            self.lines += lines
            self.bytes += nbytes


ChunkSink = Callable[[int, RecordChunk], None]


class ReaderPool:
    """Reads a list of files with ``threads`` reader threads.

    Args:
        paths: the input files, in order.
        command: the pipe command.
        schema: the slot schema of its output.
        threads: files read at once.
        skip_bad_lines: count and skip malformed lines instead of raising.
        max_line_bytes: longest accepted line.
        chunk_rows: rows per chunk handed to the sink.
        min_range_bytes: with fewer files than threads, files of at least
            this size are split into byte ranges read at once (default:
            ``ranges.MIN_RANGE_BYTES``).
        ordered: hand a split file's chunks on in file order (else as they come).
        filesystem: the filesystem of plain paths (datafeed/fs.py); URIs name
            their own. Remote files are read whole, streamed into the command.
    """

    def __init__(
        self,
        paths: Sequence[str],
        command: str,
        schema: SlotSchema,
        *,
        threads: int,
        skip_bad_lines: bool = False,
        max_line_bytes: int = 64 << 20,
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
        min_range_bytes: int | None = None,
        ordered: bool = True,
        read_timeout: float | None = None,
        filesystem: Any = None,
    ) -> None:
        self.paths = list(paths)
        self.filesystem = filesystem
        self.command = command
        self.schema = schema
        # Fewer files than threads: large files are read as byte ranges at once.
        self.tasks = plan_tasks(
            self.paths, threads, ranges.MIN_RANGE_BYTES if min_range_bytes is None else min_range_bytes
        )
        if filesystem is not None:  # files of another filesystem are read whole
            self.tasks = [(i, p, 0, None) for i, p in enumerate(self.paths)]
        self.ordered = ordered
        self.threads = max(1, min(threads, len(self.tasks) or 1))
        self.skip_bad_lines = skip_bad_lines
        self.max_line_bytes = max_line_bytes
        self.chunk_rows = chunk_rows
        self.read_timeout = read_timeout
        self.counters = _Counters()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._next_file = 0
        self._active: set[PipeProcess] = set()
        self._error: BaseException | None = None

    # -- control -----------------------------------------------------------------

    @property
    def stopped(self) -> bool:
        """Whether ``stop()`` was called (or a reader failed)."""
        return self._stop.is_set()

    def stop(self) -> None:
        """Stops every reader: running commands are killed, threads exit soon after."""
        self._stop.set()
        with self._lock:
            active = list(self._active)
        for process in active:
            process.kill()

    def run(
        self,
        sink: ChunkSink,
        on_progress: Callable[[_Counters], None] | None = None,
        *,
        by_task: bool = False,
    ) -> LoadStats:
        """Reads every file, handing each chunk to ``sink(file_index, chunk)``
        (``by_task``: ``sink(task_position, chunk)``, positions in ``self.tasks``).

        Blocks until done. The first error of any reader stops the others and is
        re-raised here.
        """
        started = time.perf_counter()
        chunks = OrderedChunks(self.tasks, len(self.paths), sink, self.ordered, by_task)
        workers = [
            threading.Thread(target=self._work, args=(chunks,), name=f"datafeed-reader-{i}", daemon=True)
            for i in range(self.threads)
        ]
        for worker in workers:
            worker.start()
        try:
            for worker in workers:
                while worker.is_alive():
                    worker.join(0.1)
                    if on_progress is not None:
                        on_progress(self.counters)
        except BaseException:  # KeyboardInterrupt included: leave nothing running
            self.stop()
            for worker in workers:
                worker.join()
            raise
        if self._error is not None:
            raise self._error
        if self._stop.is_set():
            raise RuntimeError("the load was stopped before it finished")
        stats = [merge_file_stats(p, parts) for p, parts in zip(self.paths, chunks.per_file)]
        return LoadStats.combine(stats, time.perf_counter() - started)

    # -- reader threads ----------------------------------------------------------

    def _work(self, chunks: OrderedChunks) -> None:
        while not self._stop.is_set():
            with self._lock:
                position = self._next_file
                self._next_file += 1
            if position >= len(self.tasks):
                return
            try:
                stats = self._read_file(
                    position, lambda _index, chunk, task=position: chunks.chunk(task, chunk)
                )
                last_of_file = chunks.done(position, stats)
            except BaseException as error:  # noqa: BLE001 - re-raised in run()
                with self._lock:
                    if self._error is None and not self._stop.is_set():
                        self._error = error
                self.stop()
                return
            if last_of_file:
                with self.counters.lock:
                    self.counters.files_done += 1

    def _read_file(self, position: int, sink: ChunkSink) -> FileStats:
        index, path, start, end = self.tasks[position]
        started = time.perf_counter()
        identity = is_identity_command(self.command) and not fs.is_gzip(path)
        # A byte range's lines are numbered from its start; its name says so.
        where = describe(self.tasks[position])
        source = where if identity else f"{self.command!r} on {where}"
        parser = ChunkParser(
            self.schema, source, skip_bad_lines=self.skip_bad_lines, max_line_bytes=self.max_line_bytes
        )
        if identity:
            # `cat` would only copy the file through a pipe: read it directly.
            remote = fs.is_remote(path, self.filesystem)
            with fs.open_input(path, self.filesystem) if remote else open(path, "rb", buffering=0) as file:
                raw: io.RawIOBase = file
                if end is not None:
                    file.seek(start)
                    raw = LimitedReader(file, end - start)
                nbytes, tail = self._parse_stream(raw, parser, index, sink)
                self._finish(parser, tail, index, sink)
        else:
            process = PipeProcess(self.command, path, start, end, filesystem=self.filesystem)
            with self._lock:
                self._active.add(process)
            try:
                if self._stop.is_set():  # stop() may have run before we registered
                    process.kill()
                raw = io.FileIO(process.stdout.fileno(), closefd=False)  # type: ignore[union-attr]
                nbytes, tail = self._parse_stream(raw, parser, index, sink, process=process)
                # The command closed its output: its exit status decides whether the
                # (possibly cut short) last line is data or the trace of a crash.
                process.wait()
                self._finish(parser, tail, index, sink)
            finally:
                with self._lock:
                    self._active.discard(process)
                process.close()
        return FileStats(
            path=path,
            lines=parser.lines,
            records=parser.records,
            skipped_lines=parser.skipped_lines,
            skipped_reasons=dict(parser.skipped_reasons),
            bytes=nbytes,
            seconds=time.perf_counter() - started,
        )

    def _parse_stream(
        self,
        raw: io.RawIOBase,
        parser: ChunkParser,
        index: int,
        sink: ChunkSink,
        process: PipeProcess | None = None,
    ) -> tuple[int, bytes]:
        """Feeds everything ``raw`` yields to the parser.

        When ``raw`` is a command's output, it is polled before each read so that
        parsed rows are handed on when the command goes quiet, and so that a
        command silent for ``read_timeout`` seconds is stopped with a
        ``ReaderError``. Returns the bytes read and the unconsumed tail (a last
        line without newline).
        """
        poller = None
        if process is not None:
            poller = select.poll()
            poller.register(raw.fileno(), select.POLLIN | select.POLLHUP | select.POLLERR)
        buffer = bytearray(READ_BUFFER_BYTES)
        view = memoryview(buffer)
        start = end = 0
        total = 0
        lines_before = 0
        while not self._stop.is_set():
            if end == len(buffer):
                if start > 0:  # move the partial line to the front
                    view[: end - start] = view[start:end]
                    end -= start
                    start = 0
                else:  # one line fills the buffer: grow it (the parser enforces the limit)
                    view.release()  # a bytearray cannot be resized while a view exists
                    buffer.extend(bytes(len(buffer)))
                    view = memoryview(buffer)
            if poller is not None:
                if parser.pending_rows and not poller.poll(IDLE_FLUSH_SECONDS * 1000):
                    sink(index, parser.take_chunk())  # type: ignore[arg-type]
                if self.read_timeout is not None and not poller.poll(self.read_timeout * 1000):
                    process.kill()  # type: ignore[union-attr]
                    raise process.timeout_error(self.read_timeout)  # type: ignore[union-attr]
            n = raw.readinto(view[end:])
            if not n:
                break
            end += n
            total += n
            start = self._feed(parser, view, start, end, index, sink)
            self.counters.add(parser.lines - lines_before, n)
            lines_before = parser.lines
        tail = bytes(view[start:end])
        view.release()
        return total, tail

    def _feed(
        self, parser: ChunkParser, view: memoryview, start: int, end: int, index: int, sink: ChunkSink
    ) -> int:
        """Parses the complete lines of ``view[start:end]``; returns the new start."""
        while start < end:
            limit = min(end, start + FEED_BYTES)
            consumed = parser.feed(view[start:limit])
            if not consumed and limit < end:
                # A line longer than the slice: give the parser all there is.
                consumed = parser.feed(view[start:end])
                limit = end
            start += consumed
            if parser.pending_rows >= self.chunk_rows:
                sink(index, parser.take_chunk())  # type: ignore[arg-type]
            if limit == end or not consumed:
                break
        return start

    def _finish(self, parser: ChunkParser, tail: bytes, index: int, sink: ChunkSink) -> None:
        if self._stop.is_set():
            return
        lines_before = parser.lines
        parser.feed_final(tail)
        self.counters.add(parser.lines - lines_before, 0)
        chunk = parser.take_chunk()
        if chunk is not None:
            sink(index, chunk)
