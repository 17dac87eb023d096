"""Pipe readers: run the pipe command on each input file and parse its output.

Each file gets its own ``bash -c "set -o pipefail; <pipe_command>"`` with the
file on its standard input (``.gz`` files go through ``gzip -dc`` first). The file
name never reaches a shell: fleetfeed opens the file itself. ``thread_num``
reader threads work on different files at once; the parser releases the GIL, so
they parse in parallel.

A command that fails is a ``ReaderError``; the first error stops every other
reader (their processes are killed) and is re-raised in the caller's thread.
With ``read_timeout``, a command silent for that long is stopped, and so is one
that closed its output but did not exit within it. Whatever a command left
running once it exited (a background child holding its output) is killed, with
or without ``read_timeout``.
The commands themselves are datafeed/source/process.py's; what a load counts is
datafeed/records/stats.py's.
"""

from __future__ import annotations

import io
import select
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..config.slots import SlotSchema
from ..parse.parsing import ChunkParser
from ..records.stats import FileStats, LoadCounters, LoadStats, merge_file_stats
from . import fs, ranges
from .process import HELD_OUTPUT_SECONDS, PipeProcess, feed_in_pieces
from .process_groups import commands_end_on_sigterm
from .ranges import ChunkSink, LimitedReader, OrderedChunks, describe, plan_tasks

# Bytes read at a time: a read stays in the core's L2 cache while the parser
# goes over it (on 1M Criteo lines with 2 threads, 256 KiB reads load 4% faster
# than 4 MiB reads; a longer line grows the buffer).
READ_BUFFER_BYTES = 256 << 10
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
# Where the system has no pidfd, a quiet command is checked for its exit this often.
EXIT_CHECK_SECONDS = 0.1


def is_identity_command(command: str) -> bool:
    """Whether the pipe command passes its input through unchanged (plain ``cat``)."""
    return command.strip() == "cat"


def start_command(
    command: str, path: str, *, start: int = 0, end: int | None = None, filesystem: Any = None
) -> PipeProcess:
    """The pipe command started on ``path``, or on its bytes ``start`` to ``end``.

    The file is opened here (datafeed/source/fs.py: local, remote, or through a
    download command) and handed to the process, which closes it.
    """
    return PipeProcess(
        command,
        fs.open_bytes(path, filesystem),
        name=describe((0, path, start, end)),
        gunzip=fs.is_gzip(path),
        start=start,
        end=end,
    )


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
        split: whether files may be split so (the dataset's ``split_files``:
            a command that treats lines together must read whole files).
        ordered: hand a split file's chunks on in file order (else as they come).
        filesystem: the filesystem of plain paths (datafeed/source/fs.py); URIs name
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
        split: bool = True,
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
            self.paths,
            threads,
            ranges.MIN_RANGE_BYTES if min_range_bytes is None else min_range_bytes,
        )
        if filesystem is not None or not split:  # another filesystem's files: whole
            self.tasks = ranges.whole_files(self.paths)
        self.ordered = ordered
        self.threads = max(1, min(threads, len(self.tasks) or 1))
        self.skip_bad_lines = skip_bad_lines
        self.max_line_bytes = max_line_bytes
        self.chunk_rows = chunk_rows
        self.read_timeout = read_timeout
        self.counters = LoadCounters()
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
        on_progress: Callable[[LoadCounters], None] | None = None,
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
        # Each reader sets its event as it really ends, and the main thread waits
        # on those rather than on Thread.join: before Python 3.13 a join that a
        # KeyboardInterrupt cuts short can leave the thread's state wrong
        # (cpython#90882: marked dead while it still runs), and Ctrl-C is exactly
        # when the load must wait for its readers to leave nothing running.
        ended = [threading.Event() for _ in range(self.threads)]
        workers = [
            threading.Thread(
                target=self._work_until_ended, args=(chunks, ended[i]),
                name=f"datafeed-reader-{i}", daemon=True,
            )
            for i in range(self.threads)
        ]
        # SIGTERM of a load in the main thread ends the commands before the process.
        with commands_end_on_sigterm():
            for worker in workers:
                worker.start()
            try:
                for event in ended:
                    while not event.wait(0.1):
                        if on_progress is not None:
                            on_progress(self.counters)
            except BaseException:  # KeyboardInterrupt included: leave nothing running
                self.stop()
                for event in ended:
                    event.wait()
                raise
        if self._error is not None:
            raise self._error
        if self._stop.is_set():
            raise RuntimeError("the load was stopped before it finished")
        per_file = zip(self.paths, chunks.per_file, strict=True)
        stats = [merge_file_stats(path, parts) for path, parts in per_file]
        return LoadStats.combine(stats, time.perf_counter() - started)

    # -- reader threads ----------------------------------------------------------

    def _work_until_ended(self, chunks: OrderedChunks, ended: threading.Event) -> None:
        try:
            self._work(chunks)
        finally:
            ended.set()

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
                self.counters.file_done()

    def _read_file(self, position: int, sink: ChunkSink) -> FileStats:
        task = self.tasks[position]
        index, path, start, end = task
        started = time.perf_counter()
        identity = is_identity_command(self.command) and not fs.is_gzip(path)
        # A byte range's lines are numbered from its start; its name says so.
        where = describe(task)
        source = where if identity else f"{self.command!r} on {where}"
        parser = ChunkParser(
            self.schema,
            source,
            skip_bad_lines=self.skip_bad_lines,
            max_line_bytes=self.max_line_bytes,
        )
        if identity:
            # `cat` would only copy the file through a pipe: read it directly.
            with fs.open_bytes(path, self.filesystem) as file:
                raw: io.RawIOBase = file
                if end is not None:
                    file.seek(start)
                    raw = LimitedReader(file, end - start)
                nbytes, tail = self._parse_stream(raw, parser, index, sink)
                self._finish(parser, tail, index, sink)
        else:
            process = start_command(
                self.command, path, start=start, end=end, filesystem=self.filesystem
            )
            with self._lock:
                self._active.add(process)
            try:
                if self._stop.is_set():  # stop() may have run before we registered
                    process.kill()
                raw = io.FileIO(process.stdout.fileno(), closefd=False)  # type: ignore[union-attr]
                nbytes, tail = self._parse_stream(raw, parser, index, sink, process=process)
                # The command closed its output: its exit status decides whether the
                # (possibly cut short) last line is data or the trace of a crash.
                process.wait(self.read_timeout)
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
        waiter = None if process is None else _OutputWaiter(process, raw.fileno())

        def hand_on_full_chunk() -> None:
            if parser.pending_rows >= self.chunk_rows:
                sink(index, parser.take_chunk())  # type: ignore[arg-type]

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
            if waiter is not None:
                if parser.pending_rows and not waiter.readable(IDLE_FLUSH_SECONDS):
                    sink(index, parser.take_chunk())  # type: ignore[arg-type]
                if not waiter.readable(self.read_timeout):
                    raise process.timeout_error(self.read_timeout)  # type: ignore[union-attr,arg-type]
            n = raw.readinto(view[end:])
            if not n:
                break
            end += n
            total += n
            start += feed_in_pieces(parser, view[start:end], FEED_BYTES, hand_on_full_chunk)
            self.counters.add(parser.lines - lines_before, n)
            lines_before = parser.lines
        tail = bytes(view[start:end])
        view.release()
        return total, tail

    def _finish(self, parser: ChunkParser, tail: bytes, index: int, sink: ChunkSink) -> None:
        if self._stop.is_set():
            return
        lines_before = parser.lines
        parser.feed_final(tail)
        self.counters.add(parser.lines - lines_before, 0)
        chunk = parser.take_chunk()
        if chunk is not None:
            sink(index, chunk)


class _OutputWaiter:
    """Waits for a command's output to become readable, and meanwhile for the
    command to exit: what it left running then is ended (so that its output
    ends), and output still held open ``HELD_OUTPUT_SECONDS`` later (by a
    process that left its group) is an error."""

    def __init__(self, process: PipeProcess, output: int) -> None:
        self._process = process
        self._output = output
        self._exit_fd = process.exit_fd
        self._leader_gone = False
        self._poller = select.poll()
        self._poller.register(output, select.POLLIN | select.POLLHUP | select.POLLERR)
        if self._exit_fd is not None:
            self._poller.register(self._exit_fd, select.POLLIN)

    def readable(self, timeout: float | None) -> bool:
        """Whether the output became readable (data or its end) within
        ``timeout`` seconds (None: for ever).

        Raises:
            ReaderError: the command exited, and its output stayed open and
                silent for ``HELD_OUTPUT_SECONDS``.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            # Checked more often than the caller asked: the end of what the exited
            # command left, or (without a pidfd) whether it exited.
            check = None
            if self._leader_gone:
                check = HELD_OUTPUT_SECONDS
            elif self._exit_fd is None:
                check = EXIT_CHECK_SECONDS
            capped = check is not None and (wait is None or check < wait)
            if capped:
                wait = check
            events = self._poller.poll(None if wait is None else wait * 1000)
            if any(fd == self._output for fd, _ in events):
                return True
            if not self._leader_gone and (events or self._process.exited()):
                self._process.leader_exited()  # its output ends with its group
                self._leader_gone = True
                if self._exit_fd is not None:
                    self._poller.unregister(self._exit_fd)
                continue
            if not capped:
                return False  # the caller's timeout passed
            if self._leader_gone:
                raise self._process.held_output_error()
