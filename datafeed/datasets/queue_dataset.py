"""``QueueDataset``: streams the files batch by batch with bounded memory.

The readers hand their chunks to the batcher through a bounded queue; each pass
runs the pipe commands anew. Its position (datafeed/iterate/position.py) counts the
records handed out per reader task, so a restarted pass skips exactly those.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator
from typing import Any

from ..iterate import state
from ..iterate.batch import Batch
from ..iterate.batcher import Batcher, Piece
from ..iterate.position import QueuePosition
from ..records.columns import RecordChunk
from .dataset_base import DatasetBase

logger = logging.getLogger("datafeed")

QUEUE_STATE_VERSION = state.QUEUE_VERSION


class QueueDataset(DatasetBase):
    """Streams the files batch by batch with bounded memory; no shuffling.

    Each pass over the dataset (``for batch in ds``) runs the pipe commands anew.
    Records from different files interleave in the order the readers produce them.
    """

    queue_chunks = 4  # chunks buffered between the readers and the consumer
    _ordered_ranges = False

    _position: QueuePosition

    def _new_position(self) -> QueuePosition:
        return QueuePosition()

    def state_dict(self) -> dict[str, Any]:
        """The position of iteration: the epoch and, within an unfinished pass,
        the records already handed out per reader task (file or byte range).

        A plain dict of ints, strings and lists. See ``load_state_dict``.
        """
        return state.queue_state(
            self._position,
            filelist=self._filelist,
            batch_size=self.batch_size,
            drop_last=bool(self._settings["drop_last"]),
        )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continues from a ``state_dict()`` of a QueueDataset over the same files.

        The next pass skips the records the interrupted one had already handed
        out, task by task: it yields exactly the records not yet seen in that
        epoch, each file's in file order. With ``thread_num=1`` the order is
        that of an uninterrupted pass; with more readers, files interleave as
        they do in any pass.

        Raises:
            ValueError: the state does not fit this dataset (another file list,
                batch size, or a reader plan that another ``thread_num`` changed).
        """
        self._position = state.restored_queue_position(
            state_dict,
            filelist=self._filelist,
            batch_size=self.batch_size,
            drop_last=bool(self._settings["drop_last"]),
        )
        logger.info(
            "QueueDataset.load_state_dict: epoch %d, resuming after %d batches (%d records)",
            self._position.epoch, self._position.batches, sum(self._position.delivered),
        )

    def local_shuffle(self, *args: Any, **kwargs: Any) -> None:
        """Not supported: a QueueDataset streams (``NotImplementedError``, as in
        Paddle)."""
        raise NotImplementedError(
            "QueueDataset does not support local shuffle, "
            "please use InMemoryDataset for local_shuffle"
        )

    def global_shuffle(self, *args: Any, **kwargs: Any) -> None:
        """Not supported: a QueueDataset streams (``NotImplementedError``, as in
        Paddle)."""
        raise NotImplementedError(
            "QueueDataset does not support global shuffle, "
            "please use InMemoryDataset for global_shuffle"
        )

    def __iter__(self) -> Iterator[Batch]:
        self._check_ready("iterating the dataset")
        batcher = Batcher(
            self.schema, self.batch_size, self._settings["drop_last"], self._settings["input_type"]
        )
        pool = self._reader_pool()
        chunks: queue.Queue = queue.Queue(maxsize=max(self.queue_chunks, pool.threads + 1))
        done = object()
        outcome: dict[str, Any] = {}

        position = self._position
        # Records to skip per task: those a loaded state says were handed out.
        skip = position.begin_tasks([[t[0], t[2], t[3]] for t in pool.tasks])

        def sink(task: int, chunk: RecordChunk) -> None:
            while not pool.stopped:
                try:
                    chunks.put((task, chunk), timeout=0.1)
                    return
                except queue.Full:
                    continue

        def produce() -> None:
            try:
                outcome["stats"] = pool.run(sink, by_task=True)
            except BaseException as error:  # noqa: BLE001 - re-raised in the consumer
                outcome["error"] = error
            while True:  # the consumer may have stopped reading: don't block forever
                try:
                    chunks.put(done, timeout=0.1)
                    return
                except queue.Full:
                    if pool.stopped:
                        return

        producer = threading.Thread(target=produce, name="datafeed-queue", daemon=True)
        producer.start()

        def ranges() -> Iterator[Piece]:
            while True:
                item = chunks.get()
                if item is done:
                    break
                task, chunk = item
                row = min(skip[task], chunk.rows)  # handed out before a restart
                skip[task] -= row
                if row < chunk.rows:
                    yield Piece(chunk, row, chunk.rows, task)
            # Before the batcher's last, short batch: a failed pass yields no tail.
            if "error" in outcome:
                raise outcome["error"]
            if any(skip):
                raise ValueError(
                    f"QueueDataset: the loaded state says {sum(position.delivered)} records "
                    f"were handed out, but the files now hold {sum(skip)} fewer in "
                    "the tasks it names; were the files changed?"
                )

        try:
            yield from batcher.batches(ranges(), position)
            position.end_pass()
            self._stats = outcome["stats"]
            self._log_load(self._stats)
        finally:
            pool.stop()
            while producer.is_alive():
                try:  # unblock a producer waiting on a full queue
                    chunks.get_nowait()
                except queue.Empty:
                    producer.join(0.05)
            producer.join()
