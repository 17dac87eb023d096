"""Where iteration stands, for ``state_dict()``: the iteration-state objects.

A dataset owns one and the batcher counts into it (datafeed/iterate/batcher.py);
datafeed/iterate/state.py turns it into a plain dict and back. ``Position`` serves
``InMemoryDataset``, whose position is a number of batches; ``QueuePosition``
serves ``QueueDataset``, whose readers interleave files, so it also counts the
records handed out per reader task.
"""

from __future__ import annotations

from typing import Any

from .batcher import Piece


class Position:
    """Passes completed, and batches handed out in the current pass.

    Attributes:
        epoch: passes over the records completed (a pass completes when
            iteration ends).
        batches: batches handed out so far in the current pass.
        started: whether the current pass has begun (a shuffle or a batch since
            the last completed pass).
        resume_batches: after ``load_state_dict()``, the batches the next pass
            skips (those consumed before the restart); None otherwise.
        pass_batch_size: the batch size of the pass under way (None: none is),
            which its batches are counted in whatever the setting says since.
    """

    def __init__(self) -> None:
        self.epoch = 0
        self.batches = 0
        self.started = False
        self.resume_batches: int | None = None
        self.pass_batch_size: int | None = None

    def take_resume(self) -> int:
        """The batches the next pass skips (0 unless resuming); resumes only once."""
        start, self.resume_batches = self.resume_batches or 0, None
        return start

    def begin_pass(self, start: int, batch_size: int | None = None) -> None:
        """A pass of ``batch_size`` records a batch begins, ``start`` batches in."""
        self.batches, self.started = start, True
        self.pass_batch_size = batch_size

    def count(self, pieces: list[Piece]) -> None:
        """One batch made of ``pieces`` is handed out (counted before it is
        yielded: ``state_dict()`` may run while the consumer holds it)."""
        self.batches += 1

    def end_pass(self) -> None:
        """The pass ran to its end."""
        self.epoch += 1
        self.batches, self.started = 0, False
        self.pass_batch_size = None


class QueuePosition(Position):
    """A ``QueueDataset``'s position: also the records handed out per reader task.

    A task (a file or a byte range of one) hands on its records in order, so
    these counts say exactly which records a restarted pass skips.

    Attributes:
        tasks: this pass's reader plan, ``[file index, first byte, end byte]``
            per task.
        delivered: records handed out per task in this pass.
        resume_tasks: after ``load_state_dict()`` of an unfinished pass, the
            reader plan the next pass must have; None otherwise.
    """

    def __init__(self) -> None:
        super().__init__()
        self.tasks: list[list[Any]] = []
        self.delivered: list[int] = []
        self.resume_tasks: list[list[Any]] | None = None

    def begin_tasks(self, tasks: list[list[Any]]) -> list[int]:
        """A pass over ``tasks`` begins; returns the records to skip per task
        (those a loaded state says were handed out).

        Raises:
            ValueError: a loaded state whose reader plan is not ``tasks``.
        """
        resume, self.resume_tasks = self.resume_tasks, None
        if resume is None:
            self.tasks, self.delivered, self.batches = tasks, [0] * len(tasks), 0
            return [0] * len(tasks)
        if resume != tasks:
            raise ValueError(
                f"QueueDataset: the loaded state read the files as tasks {resume}, "
                f"this pass reads them as {tasks} (file index, first byte, end byte); "
                "resume with the thread_num and split_files setting the state was taken "
                "with (fleetfeed before split_files read large files as byte ranges under "
                "any reader: split_files=True does so)"
            )
        self.tasks = tasks
        return list(self.delivered)

    def count(self, pieces: list[Piece]) -> None:
        """One batch is handed out: its records count against their tasks."""
        for piece in pieces:
            self.delivered[piece.source] += piece.stop - piece.start
        self.batches += 1

    def end_pass(self) -> None:
        """The pass ran to its end: the next one reads every task from its start."""
        super().end_pass()
        self.delivered = [0] * len(self.delivered)
