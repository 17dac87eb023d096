"""Load accounting: what each file produced, the totals of a load, live counters.

Every line a reader reads is a record or a counted skip with a reason; the
``check``/``combine`` methods below verify that at the end of every load and
pass. ``LoadCounters`` is the running progress that reader threads (or the
in-process workers' collector) update and the progress display reads.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ..config.errors import AccountingError

__all__ = ["FileStats", "LoadCounters", "LoadStats", "merge_file_stats"]


def _add_reasons(total: dict[str, int], reasons: dict[str, int]) -> None:
    for reason, count in reasons.items():
        total[reason] = total.get(reason, 0) + count


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
        text = (
            f"{self.path}: {self.lines} lines = {self.records} records "
            f"+ {self.skipped_lines} skipped"
        )
        if self.skipped_reasons:
            reasons = sorted(self.skipped_reasons.items())
            text += " (" + ", ".join(f"{r} {n}" for r, n in reasons) + ")"
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
            _add_reasons(reasons, f.skipped_reasons)
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


def merge_file_stats(path: str, parts: list[FileStats]) -> FileStats:
    """One file's stats from those of its byte ranges (datafeed/source/ranges.py): the
    counts add up; the time is the longest part's, since the parts run at once."""
    if len(parts) == 1:
        return parts[0]
    reasons: dict[str, int] = {}
    for part in parts:
        _add_reasons(reasons, part.skipped_reasons)
    return FileStats(
        path=path,
        lines=sum(p.lines for p in parts),
        records=sum(p.records for p in parts),
        skipped_lines=sum(p.skipped_lines for p in parts),
        skipped_reasons=reasons,
        bytes=sum(p.bytes for p in parts),
        seconds=max((p.seconds for p in parts), default=0.0),
    )


class LoadCounters:
    """A load's running progress, shared by the threads that read files.

    ``LoadProgress.update`` (datafeed/datasets/progress.py) reads ``files_done``,
    ``lines`` and ``bytes``; writers go through ``add``/``file_done`` (or hold
    ``lock``), since several threads update them at once.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lines = 0
        self.bytes = 0
        self.files_done = 0

    def add(self, lines: int, nbytes: int) -> None:
        """Counts ``lines`` more lines and ``nbytes`` more bytes read."""
        with self.lock:
            self.lines += lines
            self.bytes += nbytes

    def file_done(self) -> None:
        """Counts one more file read to its end."""
        with self.lock:
            self.files_done += 1
