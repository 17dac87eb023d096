"""``DatasetBase``: the settings, file list, readers and load accounting that
``InMemoryDataset`` (datafeed/datasets/inmemory.py) and ``QueueDataset``
(datafeed/datasets/queue_dataset.py) share, and the position of iteration each owns
(datafeed/iterate/position.py).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any, ClassVar

from ..config.errors import SchemaError
from ..config.settings import FLEETFEED_SETTINGS, PADDLE_SETTINGS, Settings
from ..config.slots import SlotSchema
from ..iterate.position import Position
from ..records.stats import LoadStats
from ..source import fs
from ..source.inprocess import InProcessPool
from ..source.ranges import plan_tasks, whole_files
from ..source.readers import DEFAULT_CHUNK_ROWS, ReaderPool, is_identity_command
from .paddle_compat import PaddleDatasetBase

logger = logging.getLogger("datafeed")


class DatasetBase(PaddleDatasetBase):
    """Settings, file list and load accounting shared by both dataset kinds.

    Paddle's ``_set_*`` setters and plain attributes come from
    ``PaddleDatasetBase`` (datafeed/datasets/paddle_compat.py)."""

    _extra_settings: ClassVar[dict[str, Any]] = {}

    def __init__(self) -> None:
        self._settings = Settings({**PADDLE_SETTINGS, **FLEETFEED_SETTINGS, **self._extra_settings})
        self._filelist: list[str] = []
        self._stats = LoadStats()
        # The position of iteration, for state_dict() (datafeed/iterate/state.py); the
        # batcher counts the batches it hands out into it.
        self._position = self._new_position()

    def _new_position(self) -> Position:
        return Position()

    @property
    def epoch(self) -> int:
        """Passes over the records completed (a pass completes when iteration ends)."""
        return self._position.epoch

    @property
    def batches_consumed(self) -> int:
        """Batches yielded so far in the current pass."""
        return self._position.batches

    # -- configuration ---------------------------------------------------------------

    def init(
        self,
        batch_size: int = 1,
        thread_num: int = 1,
        use_var: Iterable[Any] = (),
        pipe_command: str = "cat",
        input_type: int = 0,
        fs_name: str = "",
        fs_ugi: str = "",
        download_cmd: str = "cat",
        **settings: Any,
    ) -> None:
        """Sets every setting; those not given take their defaults.

        Args:
            batch_size: records per batch.
            thread_num: files read (and pipe commands run) at once.
            use_var: the slots, in the order of the MultiSlot text: ``datafeed.Slot``
                objects or Paddle-style variables.
            pipe_command: shell command run per file, the file on its stdin; its
                stdout is MultiSlot text.
            input_type: 0, one record per line; 1, one batch per line (Paddle's
                batch reader: each value of a sparse slot is a sequence of its
                own; needs ``batch_size=1``).
            fs_name, fs_ugi, download_cmd: Paddle's remote-file settings;
                ``fs_name="hdfs://namenode:port"`` (and ``fs_ugi="user,password"``)
                reads plain paths from that HDFS; a ``download_cmd`` other
                than ``"cat"`` reads them through that command, the path
                appended as one quoted argument (datafeed/source/fs.py).
            **settings: fleetfeed's settings: ``drop_last=False``, ``seed=None``,
                ``on_bad_line="raise"|"skip"``, ``progress=None`` (a bar on a
                terminal), ``max_line_bytes``, ``read_timeout=None`` (seconds
                a pipe command may write nothing before it is stopped with a
                ``ReaderError``), ``data_generator=None`` (a
                ``MultiSlotDataGenerator`` subclass or instance run in
                ``thread_num`` worker processes instead of ``pipe_command``:
                see ``datafeed.source.inprocess``), ``filesystem=None`` (a
                ``pyarrow.fs`` or fsspec filesystem for plain paths; a filelist
                entry may also be a URI such as ``s3://bucket/key?...``: see
                ``datafeed.source.fs``), ``split_files=None`` (with fewer
                files than threads, read large files as byte ranges at once,
                each by its own reader: None under ``cat`` only, True for a
                reader that treats each line on its own); and, on InMemoryDataset,
                ``cache=None`` (a cache file path: see ``load_cache``) and
                Paddle's distributed settings (``fleet_send_batch_size``, ...).

        Raises:
            TypeError: an unknown setting.
            SchemaError: a setting with a bad value.
        """
        values = {
            "batch_size": batch_size,
            "thread_num": thread_num,
            "use_var": use_var,
            "pipe_command": pipe_command,
            "input_type": input_type,
            "fs_name": fs_name,
            "fs_ugi": fs_ugi,
            "download_cmd": download_cmd,
        }
        defaults = {**FLEETFEED_SETTINGS, **self._extra_settings}
        fresh = Settings({**PADDLE_SETTINGS, **defaults})
        fresh.apply({**values, **settings}, where="init")
        self._settings = fresh

    def update_settings(self, **settings: Any) -> None:
        """Changes the given settings and keeps the others (``use_var`` is replaced)."""
        self._settings.apply(settings, where="update_settings")

    @property
    def schema(self) -> SlotSchema:
        """The slots, from ``use_var``."""
        return self._settings["use_var"]

    @property
    def _record_schema(self) -> SlotSchema:
        """The columns of a record: the slots, then the text fields read before
        them (``parse_ins_id`` / ``parse_content``, InMemoryDataset only)."""
        s = self._settings.as_dict()
        return self.schema.with_text_fields(
            s.get("parse_ins_id", False), s.get("parse_content", False)
        )

    @property
    def batch_size(self) -> int:
        """Records per batch (the ``batch_size`` setting; assignable, as in Paddle)."""
        return self._settings["batch_size"]

    @batch_size.setter
    def batch_size(self, batch_size: int) -> None:
        self.update_settings(batch_size=batch_size)

    @property
    def thread_num(self) -> int:
        """Files read at once (the ``thread_num`` setting). Assignable, as Paddle's
        plain attribute: ``dataset.thread_num = 0`` reads with one thread and makes
        ``train_from_dataset`` ask for its ``thread=``, as in Paddle."""
        return self._settings["thread_num"]

    @thread_num.setter
    def thread_num(self, thread_num: int) -> None:
        self.update_settings(thread_num=thread_num)

    @property
    def _reader_threads(self) -> int:
        """Threads that read (Paddle's thread_num <= 0 reads with one)."""
        return max(1, self._settings["thread_num"])

    # Paddle 1.x / fluid setters, kept so that older scripts run.
    def set_batch_size(self, batch_size: int) -> None:
        """Paddle 1.x's setter: ``update_settings(batch_size=...)``."""
        self.update_settings(batch_size=batch_size)

    def set_thread(self, thread_num: int) -> None:
        """Paddle 1.x's setter: ``update_settings(thread_num=...)``."""
        self.update_settings(thread_num=thread_num)

    def set_pipe_command(self, pipe_command: str) -> None:
        """Paddle 1.x's setter: ``update_settings(pipe_command=...)``."""
        self.update_settings(pipe_command=pipe_command)

    def set_use_var(self, var_list: Iterable[Any]) -> None:
        """Paddle 1.x's setter: ``update_settings(use_var=...)`` (replaces the
        slots)."""
        self.update_settings(use_var=var_list)

    def set_filelist(self, filelist: Iterable[str]) -> None:
        """Sets the input files; every one is checked before any work starts.

        Raises:
            FileNotFoundError: listing every missing path.
        """
        if isinstance(filelist, (str, bytes, os.PathLike)):
            raise TypeError(f"set_filelist() takes a list of paths, got a single path {filelist!r}")
        paths = [os.fspath(p) for p in filelist]
        missing = fs.missing_files(paths, self._filesystem())
        if missing:
            raise FileNotFoundError(
                f"{len(missing)} of {len(paths)} input files do not exist: " + ", ".join(missing)
            )
        self._filelist = paths

    def get_filelist(self) -> list[str]:
        """The input files given to ``set_filelist``."""
        return list(self._filelist)

    def stats(self) -> LoadStats:
        """What the last load (or the last pass of a QueueDataset) saw."""
        return self._stats

    # -- shared machinery ------------------------------------------------------------

    def _check_ready(self, what: str) -> None:
        if not len(self.schema):
            raise SchemaError(f"{what}: no slots declared; call init(use_var=[...]) first")
        missing = fs.missing_files(self._filelist, self._filesystem())
        if missing:
            raise FileNotFoundError(
                f"{len(missing)} of {len(self._filelist)} input files no longer exist: "
                + ", ".join(missing)
            )

    # A file split into byte ranges hands its records on in file order
    # (QueueDataset streams them as they come: its records interleave anyway).
    _ordered_ranges = True

    def _filesystem(self) -> Any:
        """The filesystem of plain paths: the ``filesystem`` setting, else
        Paddle's ``download_cmd`` when it is not ``"cat"``, else HDFS when
        Paddle's ``fs_name`` is set (datafeed/source/fs.py), else local files."""
        s = self._settings
        if s["filesystem"] is not None:
            return s["filesystem"]
        if s["download_cmd"].strip() not in ("", "cat"):
            return fs.DownloadCommand(s["download_cmd"])
        if s["fs_name"]:
            key = (s["fs_name"], s["fs_ugi"])
            if getattr(self, "_hdfs", (None, None))[0] != key:
                self._hdfs = (key, fs.hdfs_filesystem(*key))
            return self._hdfs[1]
        return None

    def _split_decision(self) -> bool:
        """Whether large files may be read as byte ranges: the ``split_files``
        setting; None: under ``cat`` only (fleetfeed's parser reads its lines
        one by one; another reader may treat lines together)."""
        s = self._settings
        if s["split_files"] is not None:
            return s["split_files"]
        return s["data_generator"] is None and is_identity_command(s["pipe_command"])

    def _split_files(self, threads: int) -> bool:
        """``_split_decision``; says once when a reader's files are read whole
        although a split would give idle threads work."""
        split = self._split_decision()
        if split or self._settings["split_files"] is not None or self._filesystem() is not None:
            return split
        told = getattr(self, "_told_whole", False)
        if not told and len(plan_tasks(self._filelist, threads)) > len(self._filelist):
            self._told_whole = True
            logger.info(
                "%d file(s) for thread_num=%d: each is read whole by one reader, as Paddle "
                "reads them; init(split_files=True) reads large files as byte ranges at once "
                "when the reader treats each line on its own", len(self._filelist), threads,
            )
        return False

    def _reader_pool(self, thread_num: int | None = None) -> ReaderPool | InProcessPool:
        s = self._settings
        threads = thread_num or self._reader_threads
        split = self._split_files(threads)
        if s["data_generator"] is not None:  # the in-process path: no pipe command
            if self._record_schema.text_fields:
                raise SchemaError(
                    "parse_ins_id / parse_content read the text of a pipe_command; with "
                    "the 'data_generator' setting, run the generator as the pipe_command "
                    "(python reader.py) instead"
                )
            remote = [p for p in self._filelist if fs.is_remote(p, self._filesystem())]
            if remote:
                raise SchemaError(
                    "the 'data_generator' setting reads local files only; use a "
                    f"pipe_command for remote files such as {remote[0]}"
                )
            return InProcessPool(
                self._filelist,
                s["data_generator"],
                self.schema,
                threads=threads,
                skip_bad_lines=s["on_bad_line"] == "skip",
                max_line_bytes=s["max_line_bytes"],
                chunk_rows=DEFAULT_CHUNK_ROWS,
                tasks=None if split else whole_files(self._filelist),
            )
        return ReaderPool(
            self._filelist,
            s["pipe_command"],
            self._record_schema,
            threads=threads,
            split=split,
            skip_bad_lines=s["on_bad_line"] == "skip",
            max_line_bytes=s["max_line_bytes"],
            chunk_rows=DEFAULT_CHUNK_ROWS,
            ordered=self._ordered_ranges,
            read_timeout=s["read_timeout"],
            filesystem=self._filesystem(),
        )

    def _log_load(self, stats: LoadStats) -> None:
        rate = stats.lines / stats.seconds if stats.seconds else 0.0
        logger.info(
            "loaded %d files: %d lines = %d records + %d skipped lines, %.1f MB in %.2f s "
            "(%.0f lines/s)",
            stats.files, stats.lines, stats.records, stats.skipped_lines,
            stats.bytes / 1e6, stats.seconds, rate,
        )
        if stats.skipped_lines:
            logger.warning(
                "skipped %d malformed lines: %s", stats.skipped_lines, stats.skipped_reasons
            )
        # Per file: at INFO where lines were skipped (those are the files to look
        # at), at DEBUG for every file; stats().per_file holds them all.
        for file_stats in stats.per_file:
            level = logging.INFO if file_stats.skipped_lines else logging.DEBUG
            if logger.isEnabledFor(level):
                logger.log(level, "  %s", file_stats.describe())
