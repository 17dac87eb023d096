"""Byte ranges: splitting large files so that every reader thread has work.

With fewer files than reader threads (one large file, say), whole-file tasks
would leave threads idle. ``plan_tasks`` then cuts each uncompressed local
file of at least ``min_bytes`` into ranges that start and end at line
boundaries; each range is read on its own (its own pipe command, with the
range on its stdin). ``OrderedChunks`` hands the chunks of a file's ranges on
in file order whatever order the ranges finish in, so the records keep the
file order, and the stats of a file's ranges are summed back per file.
"""

from __future__ import annotations

import io
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import Any

from ..records.columns import RecordChunk

# Files smaller than this are never split: a pipe command's start-up (a Python
# generator imports its modules) costs more than a small range saves.
MIN_RANGE_BYTES = 4 << 20

# (file index, path, first byte, end byte or None for the end of the file)
Task = tuple[int, str, int, "int | None"]


def splittable(path: str) -> bool:
    """Only plain local files can be read from the middle."""
    return not path.endswith(".gz") and "://" not in path and os.path.isfile(path)


def line_start_at_or_after(path: str, offset: int) -> int:
    """The offset of the first line that starts at or after ``offset``."""
    if offset == 0:
        return 0
    with open(path, "rb") as file:
        file.seek(offset - 1)
        position = offset - 1
        while True:
            block = file.read(1 << 16)
            if not block:
                return position  # the end of the file
            newline = block.find(b"\n")
            if newline >= 0:
                return position + newline + 1
            position += len(block)


def whole_files(paths: Sequence[str]) -> list[Task]:
    """One task per file, read whole."""
    return [(i, p, 0, None) for i, p in enumerate(paths)]


def plan_tasks(paths: Sequence[str], threads: int, min_bytes: int = MIN_RANGE_BYTES) -> list[Task]:
    """Whole files, or, when there are fewer files than threads, byte ranges.

    Ranges of one file are listed in file order. A file gets ``threads //
    len(paths)`` ranges (at least one, and never one under ``min_bytes``).
    """
    whole = whole_files(paths)
    if not paths or len(paths) >= threads:
        return whole
    per_file = threads // len(paths)
    tasks: list[Task] = []
    for index, path in enumerate(paths):
        size = os.path.getsize(path) if splittable(path) else 0
        parts = min(per_file, size // max(min_bytes, 1))
        if parts <= 1:
            tasks.append((index, path, 0, None))
            continue
        cuts = sorted({line_start_at_or_after(path, size * k // parts) for k in range(parts)})
        cuts = [c for c in cuts if c < size] + [size]
        for start, end in pairwise(cuts):
            tasks.append((index, path, start, end))
    return tasks


def describe(task: Task) -> str:
    """The file, and the range when the task is one: ``part-0 (bytes 0-1048576)``."""
    _, path, start, end = task
    return path if end is None else f"{path} (bytes {start}-{end})"


class LimitedReader(io.RawIOBase):
    """At most ``limit`` bytes of ``raw``, from its current position."""

    def __init__(self, raw: Any, limit: int) -> None:
        self._raw = raw
        self._left = limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._left <= 0:
            return 0
        view = memoryview(buffer).cast("B")[: self._left]
        n = self._raw.readinto(view) or 0
        self._left -= n
        return n


ChunkSink = Callable[[int, RecordChunk], None]


class OrderedChunks:
    """Chunks and per-task stats as they arrive, handed on in file order.

    The tasks of one file (its byte ranges) may finish in any order; the
    chunks of a task wait until every earlier task of its file is through
    (``ordered=False`` passes them straight on, for streaming). Thread-safe.

    The sink gets the chunk's file index, or with ``by_task`` its task's
    position in ``tasks``: a task's chunks always arrive in order, so counting
    rows per task tells exactly which records were handed on (QueueDataset's
    resumable position), whether or not a file's ranges interleave.
    """

    def __init__(
        self,
        tasks: Sequence[Task],
        files: int,
        sink: ChunkSink,
        ordered: bool = True,
        by_task: bool = False,
    ) -> None:
        self.tasks = tasks
        self.sink = sink
        self.ordered = ordered
        self.by_task = by_task
        self.per_file: list[list[Any]] = [[] for _ in range(files)]
        self.order: dict[int, deque[int]] = {}
        for position, task in enumerate(tasks):
            self.order.setdefault(task[0], deque()).append(position)
        self.held: dict[int, list[RecordChunk]] = {}
        self.finished: set[int] = set()
        self.lock = threading.Lock()

    def chunk(self, position: int, chunk: RecordChunk) -> None:
        file_index = self.tasks[position][0]
        with self.lock:
            if not self.ordered or self.order[file_index][0] == position:
                self.sink(position if self.by_task else file_index, chunk)
            else:
                self.held.setdefault(position, []).append(chunk)

    def done(self, position: int, stats: Any) -> bool:
        """Records a finished task; True when it was its file's last."""
        file_index = self.tasks[position][0]
        with self.lock:
            self.per_file[file_index].append(stats)
            self.finished.add(position)
            queue = self.order[file_index]
            while queue and queue[0] in self.finished:
                queue.popleft()
                if queue:  # the next range is now first: what it sent so far goes on
                    for chunk in self.held.pop(queue[0], []):
                        self.sink(queue[0] if self.by_task else file_index, chunk)
            return not queue
