"""The in-process path: the user's generator runs in worker processes, no text.

``init(..., data_generator=MyReader)`` (a ``MultiSlotDataGenerator`` subclass
or instance) replaces the pipe command: ``thread_num`` worker processes
(``multiprocess``, forked where the platform allows, so closures, lambdas and
classes defined anywhere work without pickling) each take files, open them
themselves, call ``generate_sample(line)`` for every line and append the
samples straight to slot columns (``datafeed.parse.samples.ColumnBuilder``).
Parsed chunks come back to the loading process as raw numpy buffers over a
pipe (a small header, then one message per buffer received straight into a
numpy array): no text, no per-record pickling.

The records, the errors and the accounting are the pipe path's:

* a sample the builder cannot convert exactly goes through the generator's
  own formatter and the MultiSlot parser, one sample at a time, so it gives
  the pipe path's record, ``SampleError`` or ``ParseError``;
* ``ParseError`` messages name ``<Reader> on <file>`` and the sample's line
  number in the text the generator would have written; ``on_bad_line="skip"``
  counts them as skipped lines with the parser's reasons;
* an exception in ``generate_sample`` (``SampleError`` or the user's own) is
  re-raised in the loading process as itself, with notes naming the file and
  the input line and the worker's traceback (the pipe path can only report a
  ``ReaderError`` with the generator's stderr);
* ``sys.exit()`` or ``sys.exit(0)`` in the generator ends the file's samples
  where it is called, as it ends a generator process's output; another status
  is a ``ReaderError`` naming the file and the input line, as a pipe command
  that exits with it;
* ``stats()`` counts lines (samples), records and skips per file as the pipe
  path does; ``bytes`` counts input bytes read, since there is no text.

A generator that overrides ``generate_batch`` or ``_gen_str``, or a
``MultiSlotStringDataGenerator``, runs in the workers too but through the
formatter and the parser (its text is the only definition of its records).
Input files are read as UTF-8 with ``surrogateescape`` and ``\\n`` line ends,
as a generator's ``sys.stdin`` reads them; ``.gz`` files are decompressed.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import logging
import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ..config.errors import ParseError, ReaderError, SchemaError, add_note
from ..config.slots import SlotSchema
from ..parse.parsing import ChunkParser
from ..parse.samples import ColumnBuilder, exit_status, run_samples
from ..records.columns import RecordChunk, SlotColumn
from ..records.stats import FileStats, LoadCounters, LoadStats, merge_file_stats
from . import ranges
from .ranges import ChunkSink, LimitedReader, OrderedChunks, Task, describe, plan_tasks
from .readers import DEFAULT_CHUNK_ROWS

logger = logging.getLogger("datafeed")

# How often the loading process wakes up to check for stop() and progress.
POLL_SECONDS = 0.1
# A worker that does not exit this long after its last task is killed.
JOIN_SECONDS = 5.0
# The generator's text mode writes blocks of this size into the parser.
TEXT_BLOCK_BYTES = 1 << 18


def check_generator(value: Any) -> Any:
    """Validates the ``data_generator`` setting; returns it unchanged.

    Raises:
        SchemaError: not a ``generators.DataGenerator`` subclass or instance.
    """
    if value is None:
        return None
    from generators import DataGenerator

    is_class = isinstance(value, type) and issubclass(value, DataGenerator)
    if not is_class and not isinstance(value, DataGenerator):
        raise SchemaError(
            "the 'data_generator' setting must be a generators.DataGenerator subclass "
            f"(e.g. a MultiSlotDataGenerator) or an instance of one, got {value!r}"
        )
    return value


def generator_name(generator: Any) -> str:
    """The generator's class name, for messages (``CriteoReader``)."""
    cls = generator if isinstance(generator, type) else type(generator)
    return cls.__name__


def _uses_columns(generator: Any) -> bool:
    """Whether the samples can go straight to columns (the built-in numeric format)."""
    return type(generator).writes_samples_as_given()


# -- one file, in a worker -------------------------------------------------------------


class _RangeLines:
    """The text lines of ``path`` from byte ``start`` (a line start) to ``end``."""

    def __init__(self, path: str, start: int, end: int | None) -> None:
        self.path = path
        self.start = start
        self.end = end
        self.bytes = 0
        self._reading: Iterator[str] | None = None

    def __iter__(self) -> Iterator[str]:
        self._reading = self._read()
        return self._reading

    def close(self) -> None:
        """Closes the file, and counts ``bytes``, when reading stopped early."""
        if self._reading is not None:
            self._reading.close()  # type: ignore[attr-defined]
            self._reading = None

    def _read(self) -> Iterator[str]:
        if self.path.endswith(".gz"):
            raw: io.BufferedIOBase = gzip.open(self.path, "rb")  # type: ignore[assignment]  # noqa: SIM115 - closed by the with below
        else:
            raw = open(self.path, "rb")  # noqa: SIM115 - closed by the with below
        with raw:
            if self.start:
                raw.seek(self.start)
            source: io.BufferedIOBase = raw
            if self.end is not None:
                source = io.BufferedReader(LimitedReader(raw, self.end - self.start))  # type: ignore[arg-type]
            text = io.TextIOWrapper(
                source, encoding="utf-8", errors="surrogateescape", newline="\n"
            )
            try:
                for line in text:  # noqa: UP028 - yield from would close raw before the count
                    yield line
            finally:  # also when the reader stopped early (sys.exit(0) in the generator)
                self.bytes = raw.tell() - self.start


def _renumbered(error: ParseError, source: str, parser_line: int, line: int) -> ParseError:
    """``error`` (at line ``parser_line`` of the slow parser) at ``line`` of the file."""
    message = str(error)
    prefix = f"{source}, line {parser_line}"
    if message.startswith(prefix):
        message = f"{source}, line {line}" + message[len(prefix) :]
    return ParseError(message, source=source, line=line, slot=error.slot, token=error.token)


class _FileLoader:
    """Runs the generator over one file (or byte range) into column chunks."""

    def __init__(
        self,
        generator: Any,
        schema: SlotSchema,
        task: Task,
        send: Callable[[RecordChunk], None],
        *,
        skip_bad_lines: bool,
        max_line_bytes: int,
        chunk_rows: int,
    ) -> None:
        # A class gets a fresh instance per file: a pipe command starts a fresh
        # process (and generator) per file, so per-file state starts clean.
        self.exited: SystemExit | None = None  # sys.exit in the class's __init__
        try:
            self.generator = generator() if isinstance(generator, type) else generator
        except SystemExit as error:
            self.generator, self.exited = generator, error
        self.schema = schema
        self.index, self.path, self.start, self.end = task
        self.send = send
        self.chunk_rows = chunk_rows
        # A byte range's samples are numbered from its start; its name says so.
        self.source = f"{generator_name(generator)} on {describe(task)}"
        self.parser = ChunkParser(
            schema, self.source, skip_bad_lines=skip_bad_lines, max_line_bytes=max_line_bytes
        )

    def run(self) -> FileStats:
        started = time.perf_counter()
        lines = _RangeLines(self.path, self.start, self.end)
        try:
            if self.exited is not None:  # as a process that exits before its first sample
                if exit_status(self.exited) != 0:
                    raise self.exited
                samples = 0
            elif _uses_columns(self.generator):
                samples = self._run_columns(lines)
            else:
                samples = self._run_text(lines)
        except SystemExit as error:  # a status other than 0: as the process would fail
            raise self._exit_error(error) from None
        finally:
            lines.close()
        skipped = self.parser.skipped_lines
        return FileStats(
            path=self.path,
            lines=samples,
            records=samples - skipped,
            skipped_lines=skipped,
            skipped_reasons=self.parser.skipped_reasons,
            bytes=lines.bytes,
            seconds=time.perf_counter() - started,
        )

    def _run_columns(self, lines: _RangeLines) -> int:
        from generators import SampleFormatter

        builder = ColumnBuilder(tuple(self.schema))
        formatter = SampleFormatter()
        parser = self.parser
        dummy: list[tuple[str, list[int]]] = []

        def slow(sample: Any, number: int) -> None:
            # The pipe path's treatment of one sample: the generator's checks
            # and text, then the parser. The formatter numbers samples itself,
            # so it is first brought to this one's number with valid stand-ins.
            nonlocal dummy
            while formatter.samples < number - 1:
                formatter.format(dummy)
            text = formatter.format(sample)  # SampleError as in the generator
            before = parser.lines
            try:
                parser.feed(text)
            except ParseError as error:
                raise _renumbered(error, self.source, before + 1, number) from None
            taken = parser.take_chunk()
            if taken is not None:
                builder.add_columns(taken.rows, taken.columns)
            if not dummy and formatter.proto_info is not None:
                names = [name for name, _ in formatter.proto_info]
                dummy = [(name, [0]) for name in names]
                builder.set_names(names)

        def flush() -> None:
            self._send(builder.take())

        _, samples = run_samples(
            lines, self.generator.generate_sample, builder, slow, flush,
            self.chunk_rows, self.path,
        )
        flush()
        return int(samples)

    def _run_text(self, lines: _RangeLines) -> int:
        from generators import SampleError

        parser = self.parser
        pending = bytearray()

        def write(block: bytes) -> None:
            pending.extend(block)
            consumed = parser.feed(pending)
            del pending[:consumed]
            if parser.pending_rows >= self.chunk_rows:
                self._send_parsed()

        try:
            # The text a fresh generator process would write for this file.
            self.generator.write_multislot(lines, write, block_size=TEXT_BLOCK_BYTES)
        except SampleError as error:
            add_note(error, f"in {self.source}")
            raise
        except SystemExit as error:
            # sys.exit(0) ends a generator process's output after what it
            # wrote (written above): the file's text ends there too.
            if exit_status(error) != 0:
                raise
        parser.feed_final(bytes(pending))
        self._send_parsed()
        return parser.lines

    def _exit_error(self, error: SystemExit) -> ReaderError:
        """The error of ``sys.exit`` with a non-zero status in the generator:
        a pipe command's exit with that status fails the load, so this does
        (re-raised as it is, it would end the loading process in silence)."""
        status = exit_status(error)
        name = generator_name(self.generator)
        where = "".join(f"; {note}" for note in getattr(error, "__notes__", ()))
        return ReaderError(
            f"{name} called sys.exit({error.code!r}) (exit status {status}) on "
            f"{describe((self.index, self.path, self.start, self.end))}{where}",
            command=name, path=self.path, returncode=status,
            stderr_tail="" if isinstance(error.code, int | None) else str(error.code),
        )

    def _send_parsed(self) -> None:
        chunk = self.parser.take_chunk()
        if chunk is not None:
            self.send(chunk)

    def _send(self, taken: Any) -> None:
        if taken is None:
            return
        rows, columns = taken
        self.send(RecordChunk(tuple(SlotColumn(v, o, w) for v, o, w in columns), rows))


# -- the wire between a worker and the loading process ---------------------------------


def _send_chunk(conn: Any, index: int, chunk: RecordChunk) -> None:
    """A header (shapes and dtypes), then each non-empty buffer as its own message."""
    arrays: list[np.ndarray] = []
    layout = []
    for column in chunk.columns:
        offsets = column.offsets
        layout.append(
            (
                column.values.dtype.str,
                len(column.values),
                None if offsets is None else offsets.dtype.str,
                0 if offsets is None else len(offsets),
                column.width,
            )
        )
        arrays.append(column.values)
        if offsets is not None:
            arrays.append(offsets)
    conn.send(("chunk", index, chunk.rows, layout))
    for array in arrays:
        if array.nbytes:
            conn.send_bytes(np.ascontiguousarray(array).view(np.uint8))


def _recv_array(conn: Any, dtype: str, length: int) -> np.ndarray:
    array = np.empty(length, dtype=np.dtype(dtype))
    if length:
        # Received straight into memory the array owns (writable, no extra copy).
        conn.recv_bytes_into(array.view(np.uint8))
    return array


def _recv_chunk(conn: Any, rows: int, layout: list) -> RecordChunk:
    columns = []
    for values_dtype, values_len, offsets_dtype, offsets_len, width in layout:
        values = _recv_array(conn, values_dtype, values_len)
        offsets = None if offsets_dtype is None else _recv_array(conn, offsets_dtype, offsets_len)
        columns.append(SlotColumn(values, offsets, width))
    return RecordChunk(tuple(columns), rows)


def _portable(error: BaseException) -> BaseException:
    """``error`` if it survives pickling, else a RuntimeError with its text."""
    import pickle

    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 - any failure to pickle means: send text
        text = "".join(traceback.format_exception_only(type(error), error)).strip()
        return RuntimeError(f"the generator raised an exception that cannot be sent back: {text}")


def _worker_main(conn: Any, generator: Any, schema: SlotSchema, options: dict[str, Any]) -> None:
    """A worker process: loads the tasks it is sent until it is sent None."""
    # Ctrl-C reaches the whole process group; the loading process decides
    # what happens to the workers (it kills them), so they ignore it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    task: Task | None = None
    try:
        while True:
            task = conn.recv()
            if task is None:
                break
            index = task[0]
            loader = _FileLoader(
                generator, schema, task,
                lambda chunk, index=index: _send_chunk(conn, index, chunk), **options
            )
            conn.send(("done", index, loader.run()))
    except BaseException as error:  # noqa: BLE001 - everything goes back to the parent
        notes = list(getattr(error, "__notes__", ()))
        trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        # The parent may have gone, or the pipe broken: nothing more to do then.
        with contextlib.suppress(Exception):
            conn.send(("error", None if task is None else task[0], _portable(error), notes, trace))
    finally:
        conn.close()


# -- the pool, in the loading process ---------------------------------------------------


def _context() -> Any:
    import multiprocess

    # fork: the generator (closures, lambdas, classes defined in __main__ or a
    # function) reaches the workers without being pickled, and a worker starts
    # in milliseconds. Elsewhere multiprocess pickles it with dill.
    methods = multiprocess.get_all_start_methods()
    return multiprocess.get_context("fork" if "fork" in methods else "spawn")


class _Worker:
    """A worker process, its end of the pipe, and the task it is on."""

    def __init__(self, process: Any, conn: Any) -> None:
        self.process = process
        self.conn = conn
        self.busy = False
        self.position: int | None = None  # index into the pool's tasks


class InProcessPool:
    """Loads files with a generator in ``threads`` worker processes.

    The same interface as ``readers.ReaderPool``: ``run(sink, on_progress)``
    hands every chunk to ``sink(file_index, chunk)`` (chunks of one file in
    order) and returns the ``LoadStats``; ``stop()`` ends a load from another
    thread.

    Args:
        paths: the input files, in order.
        generator: a ``MultiSlotDataGenerator`` subclass or instance.
        schema: the slots.
        threads: worker processes.
        skip_bad_lines: count and skip samples the schema refuses.
        max_line_bytes: longest accepted line of a slow-path sample's text.
        chunk_rows: rows per chunk.
        tasks: the units of work (file index, path, start, end); by default
            one per file, or byte ranges of large files when there are fewer
            files than threads (``ranges.plan_tasks``). A file's ranges are
            listed in order.
    """

    def __init__(
        self,
        paths: Sequence[str],
        generator: Any,
        schema: SlotSchema,
        *,
        threads: int,
        skip_bad_lines: bool = False,
        max_line_bytes: int = 64 << 20,
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
        tasks: Sequence[Task] | None = None,
    ) -> None:
        self.paths = list(paths)
        self.generator = check_generator(generator)
        self.schema = schema
        # Fewer files than workers: large files are read as byte ranges at once.
        self.tasks: list[Task] = (
            list(tasks) if tasks is not None
            else plan_tasks(self.paths, threads, ranges.MIN_RANGE_BYTES)
        )
        self.threads = max(1, min(threads, len(self.tasks) or 1))
        self.options = {
            "skip_bad_lines": skip_bad_lines,
            "max_line_bytes": max_line_bytes,
            "chunk_rows": chunk_rows,
        }
        self.counters = LoadCounters()
        self._stop = threading.Event()

    @property
    def stopped(self) -> bool:
        """Whether ``stop()`` was called (or a reader failed)."""
        return self._stop.is_set()

    def stop(self) -> None:
        """Ends the load: ``run`` kills the workers and returns within a poll."""
        self._stop.set()

    def run(
        self,
        sink: ChunkSink,
        on_progress: Callable[[LoadCounters], None] | None = None,
        *,
        by_task: bool = False,
    ) -> LoadStats:
        """Loads every task; blocks until done. ``by_task``: as ``ReaderPool.run``.

        Raises:
            SampleError, ParseError or the generator's own exception: the
                first failure of any worker (the others are killed).
            ReaderError: a worker process died without a word.
        """
        started = time.perf_counter()
        state = OrderedChunks(self.tasks, len(self.paths), sink, by_task=by_task)
        todo: deque[int] = deque(range(len(self.tasks)))
        workers: list[_Worker] = []
        context = _context()
        try:
            for _ in range(self.threads):
                parent_conn, child_conn = context.Pipe(duplex=True)
                process = context.Process(
                    target=_worker_main,
                    args=(child_conn, self.generator, self.schema, self.options),
                    name="datafeed-generator",
                    daemon=True,
                )
                process.start()
                child_conn.close()  # the worker holds its end
                workers.append(_Worker(process, parent_conn))
            from multiprocess.connection import wait

            def hand_out(worker: _Worker) -> None:
                worker.position = todo.popleft() if todo else None
                worker.busy = worker.position is not None
                worker.conn.send(None if worker.position is None else self.tasks[worker.position])

            for worker in workers:
                hand_out(worker)
            by_conn = {w.conn: w for w in workers}
            while any(w.busy for w in workers):
                if self._stop.is_set():
                    raise RuntimeError("the load was stopped before it finished")
                for conn in wait([w.conn for w in workers if w.busy], POLL_SECONDS):
                    worker = by_conn[conn]
                    self._handle(worker, state)
                    if not worker.busy:
                        hand_out(worker)
                if on_progress is not None:
                    on_progress(self.counters)
        finally:
            _shut_down(workers)
        if self._stop.is_set():
            raise RuntimeError("the load was stopped before it finished")
        per_file = zip(self.paths, state.per_file, strict=True)
        stats = [merge_file_stats(path, parts) for path, parts in per_file]
        return LoadStats.combine(stats, time.perf_counter() - started)

    def _handle(self, worker: _Worker, state: OrderedChunks) -> None:
        """Receives one message of ``worker``: a chunk, the end of a task, or its error."""
        position = worker.position
        path = self.tasks[position][1] if position is not None else "?"
        try:
            message = worker.conn.recv()
        except EOFError:
            worker.process.join(JOIN_SECONDS)
            code = worker.process.exitcode
            name = generator_name(self.generator)
            raise ReaderError(
                f"a generator worker process died (exit code {code}) while {name} "
                f"was reading {path}",
                command=name, path=path, returncode=code, stderr_tail="",
            ) from None
        kind = message[0]
        if kind == "chunk":
            chunk = _recv_chunk(worker.conn, message[2], message[3])
            self.counters.add(chunk.rows, 0)
            state.chunk(position, chunk)  # type: ignore[arg-type]
        elif kind == "done":
            stats: FileStats = message[2]
            self.counters.add(0, stats.bytes)
            worker.busy = False
            if state.done(position, stats):  # type: ignore[arg-type]
                self.counters.file_done()
        else:  # "error"
            _, _, error, notes, trace = message
            for note in notes:
                if note not in getattr(error, "__notes__", ()):
                    add_note(error, note)
            add_note(error, f"traceback in the generator worker process:\n{trace.rstrip()}")
            raise error


def _shut_down(workers: list[_Worker]) -> None:
    """Stops and reaps every worker: politely when idle, by SIGKILL otherwise."""
    for worker in workers:
        if worker.busy and worker.process.is_alive():
            worker.process.kill()
    for worker in workers:
        worker.process.join(JOIN_SECONDS)
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join()
        worker.conn.close()
        worker.process.close()

