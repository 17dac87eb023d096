"""The user-facing datasets: ``InMemoryDataset``, ``QueueDataset``, ``DatasetFactory``.

They keep Paddle's method names and meanings (see DESIGN.md for where fleetfeed
differs on purpose: errors instead of silent loss, seeded shuffles, strict settings).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

import pyarrow as pa

from . import cache, fs, shuffle
from .batch import Batch, BatchBuilder, concat_rows
from .columns import RecordChunk
from .errors import CacheError, SchemaError
from .inprocess import InProcessPool
from .memory import release_free_memory
from .progress import LoadProgress, progress_enabled
from .readers import DEFAULT_CHUNK_ROWS, FileStats, LoadStats, ReaderPool
from .settings import FLEETFEED_SETTINGS, INMEMORY_SETTINGS, PADDLE_SETTINGS, Settings
from .slots import SlotSchema
from .store import RecordStore

logger = logging.getLogger("datafeed")


class DatasetBase:
    """Settings, file list and load accounting shared by both dataset kinds."""

    _extra_settings: ClassVar[dict[str, Any]] = {}

    def __init__(self) -> None:
        self._settings = Settings({**PADDLE_SETTINGS, **FLEETFEED_SETTINGS, **self._extra_settings})
        self._filelist: list[str] = []
        self._stats = LoadStats()
        # The position of iteration, for state_dict(): passes completed, and
        # batches yielded in the current pass.
        self._epoch = 0
        self._batches = 0

    @property
    def epoch(self) -> int:
        """Passes over the records completed (a pass completes when iteration ends)."""
        return self._epoch

    @property
    def batches_consumed(self) -> int:
        """Batches yielded so far in the current pass."""
        return self._batches

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
            input_type: 0 (one record per line), the only supported value.
            fs_name, fs_ugi, download_cmd: Paddle's remote-file settings;
                ``fs_name="hdfs://namenode:port"`` (and ``fs_ugi="user,password"``)
                reads plain paths from that HDFS; a ``download_cmd`` other
                than ``"cat"`` reads them through that command, the path
                appended as one quoted argument (datafeed/fs.py).
            **settings: fleetfeed's settings: ``drop_last=False``, ``seed=None``,
                ``on_bad_line="raise"|"skip"``, ``progress=None`` (a bar on a
                terminal), ``max_line_bytes``, ``read_timeout=None`` (seconds
                a pipe command may write nothing before it is stopped with a
                ``ReaderError``), ``data_generator=None`` (a
                ``MultiSlotDataGenerator`` subclass or instance run in
                ``thread_num`` worker processes instead of ``pipe_command``:
                see ``datafeed.inprocess``), ``filesystem=None`` (a
                ``pyarrow.fs`` or fsspec filesystem for plain paths; a filelist
                entry may also be a URI such as ``s3://bucket/key?...``: see
                ``datafeed.fs``); and, on InMemoryDataset,
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
    def batch_size(self) -> int:
        """Records per batch (the ``batch_size`` setting)."""
        return self._settings["batch_size"]

    @property
    def thread_num(self) -> int:
        """Files read at once (the ``thread_num`` setting)."""
        return self._settings["thread_num"]

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
        Paddle's ``fs_name`` is set (datafeed/fs.py), else local files."""
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

    def _reader_pool(self, thread_num: int | None = None) -> ReaderPool | InProcessPool:
        s = self._settings
        if s["data_generator"] is not None:  # the in-process path: no pipe command
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
                threads=thread_num or s["thread_num"],
                skip_bad_lines=s["on_bad_line"] == "skip",
                max_line_bytes=s["max_line_bytes"],
                chunk_rows=DEFAULT_CHUNK_ROWS,
            )
        return ReaderPool(
            self._filelist,
            s["pipe_command"],
            self.schema,
            threads=thread_num or s["thread_num"],
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
            logger.warning("skipped %d malformed lines: %s", stats.skipped_lines, stats.skipped_reasons)
        # Per file: at INFO where lines were skipped (those are the files to look
        # at), at DEBUG for every file; stats().per_file holds them all.
        for file_stats in stats.per_file:
            level = logging.INFO if file_stats.skipped_lines else logging.DEBUG
            if logger.isEnabledFor(level):
                logger.log(level, "  %s", file_stats.describe())


class InMemoryDataset(DatasetBase):
    """Loads every file into memory; shuffles; iterates batches for any number of epochs.

    Example:
        >>> ds = InMemoryDataset()
        >>> ds.init(batch_size=512, thread_num=2, use_var=slots, pipe_command="python reader.py")
        >>> ds.set_filelist(files)
        >>> ds.load_into_memory()
        >>> ds.local_shuffle(seed=7)
        >>> for batch in ds: ...
    """

    _extra_settings = INMEMORY_SETTINGS

    def __init__(self) -> None:
        super().__init__()
        self._store: RecordStore | None = None
        self._preload: tuple[threading.Thread, dict[str, Any]] | None = None
        self._shuffles = 0
        self.last_shuffle_seed: int | None = None
        # The shuffles that made the order in memory, for state_dict()
        # (datafeed/state.py); the position itself is DatasetBase's.
        self._history: list[tuple[Any, ...]] = []
        self._records_before_shuffles = 0
        self._epoch_started = False
        self._resume_batches: int | None = None
        # What the records in memory came from, for save_cache().
        self._sources: list[cache.SourceFile] = []
        self._source_stats: list[FileStats] = []

    # -- loading -----------------------------------------------------------------------

    def load_into_memory(self, is_shuffle: bool = False) -> None:
        """Runs the pipe command on every file and keeps the records in memory.

        Records are appended to those already loaded. A failed load (a
        ``ReaderError`` or ``ParseError``) leaves the dataset as it was. With
        the ``cache`` setting, a cache that cannot be written (a full disk) is
        an ``OSError`` naming it, raised once the records are in memory (they
        stay there); no partial cache file is left.

        Args:
            is_shuffle: accepted for Paddle compatibility; shuffle with
                ``local_shuffle`` / ``global_shuffle``.
        """
        self._check_no_preload("load_into_memory")
        self._load(self._settings["thread_num"])

    def preload_into_memory(self, thread_num: int | None = None) -> None:
        """Starts loading in the background; ``wait_preload_done()`` finishes it."""
        self._check_no_preload("preload_into_memory")
        self._check_ready("preload_into_memory")
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                self._load(thread_num or self._settings["thread_num"], show_progress=False)
            except BaseException as error:  # noqa: BLE001 - re-raised in wait_preload_done
                outcome["error"] = error

        thread = threading.Thread(target=run, name="datafeed-preload", daemon=True)
        self._preload = (thread, outcome)
        thread.start()

    def wait_preload_done(self) -> None:
        """Waits for ``preload_into_memory``; raises the error the load hit, if any."""
        if self._preload is None:
            raise RuntimeError("wait_preload_done() called without preload_into_memory()")
        thread, outcome = self._preload
        thread.join()
        self._preload = None
        if "error" in outcome:
            raise outcome["error"]

    def _check_no_preload(self, what: str) -> None:
        if self._preload is not None:
            raise RuntimeError(f"{what}() called while a preload runs; call wait_preload_done() first")

    def _load(self, thread_num: int, show_progress: bool = True) -> None:
        self._check_ready("load_into_memory")
        cache_path = self._settings["cache"]
        if cache_path is not None and os.path.exists(cache_path):
            self.load_cache(cache_path)
            return
        # Taken before reading: a file that changes during the load makes the
        # cache stale rather than silently blessed.
        sources = [self._source_now(p) for p in self._filelist]
        if cache_path is not None and any(s.size is None for s in sources):
            raise CacheError(
                f"the cache setting ({cache_path}) needs each file's size and mtime to tell "
                "a stale cache, and files read through download_cmd have none; drop "
                "cache= or read the files through a pyarrow.fs filesystem"
            )
        pool = self._reader_pool(thread_num)
        per_file: list[list[RecordChunk]] = [[] for _ in self._filelist]

        def keep(file_index: int, chunk: RecordChunk) -> None:
            per_file[file_index].append(chunk)  # one thread per file: no lock needed

        progress = LoadProgress(
            len(self._filelist),
            show_progress and progress_enabled(self._settings["progress"]),
        )
        try:
            stats = pool.run(keep, on_progress=progress.update)
        finally:
            progress.close()
        # Commit only now: a failed load above leaves the dataset unchanged.
        store = self._store or RecordStore(self.schema)
        if store.schema != self.schema:
            raise SchemaError(
                f"load_into_memory: use_var changed since the last load "
                f"({store.schema!r} -> {self.schema!r}); call release_memory() first"
            )
        store.extend([chunk for chunks in per_file for chunk in chunks])
        self._store = store
        self._stats = stats
        self._sources += sources
        self._source_stats += stats.per_file
        release_free_memory()  # the parsers' buffers, freed with their threads
        self._log_load(stats)
        if cache_path is not None:
            try:
                self.save_cache(cache_path)
            except OSError as error:  # a full disk: the load itself succeeded
                raise OSError(
                    error.errno,
                    f"{error.strerror or error}; the {stats.records} records loaded stay "
                    "in memory (iterate them, or free space and load again)",
                ) from error

    # -- the parsed-data cache (datafeed/cache.py) -------------------------------------

    def _source_now(self, path: str) -> cache.SourceFile:
        """A source file's size and mtime now, local or through its filesystem."""
        filesystem = self._filesystem()
        if not fs.is_remote(path, filesystem):
            return cache.SourceFile.of(path)
        info = fs.stat(path, filesystem)
        return cache.SourceFile(path, info.size, info.mtime_ns or 0)

    def save_cache(self, path: str | os.PathLike) -> None:
        """Writes the records in memory, in their current order, to a cache file.

        The cache records the slots and the size and mtime of every file the
        records were loaded from (as they were when loaded). It is written to a
        temporary name and renamed into place.

        Raises:
            RuntimeError: no records in memory.
            CacheError: a source's size is unknown (files read through
                ``download_cmd``), so the cache could never be checked for
                staleness.
        """
        store = self._require_store("save_cache")
        unknown = [s.path for s in self._sources if s.size is None]
        if unknown:
            raise CacheError(
                f"save_cache: the size and mtime of {unknown[0]} (and {len(unknown) - 1} more) "
                "are unknown (read through download_cmd), so a cache of them could never "
                "be checked for staleness; use a pyarrow.fs filesystem or local files"
            )
        cache.write_cache(
            os.fspath(path), self.schema, store.chunks, self._sources, self._source_stats
        )
        logger.info("saved %d records to cache %s", store.rows, os.fspath(path))

    def load_cache(self, path: str | os.PathLike) -> None:
        """Loads records from a cache written by ``save_cache``, skipping the readers.

        The records are appended to those in memory, as ``load_into_memory``
        does; ``stats()`` reports the accounting of the load that made the
        cache. With ``init(..., cache=path)``, ``load_into_memory()`` calls this
        when the file exists (and writes it after loading when it does not).

        Raises:
            FileNotFoundError: no cache at ``path``.
            CacheError: not a cache, or stale: its slots differ from
                ``use_var``, its files from the file list (when one is set),
                or a source file changed size or mtime since.
        """
        if not len(self.schema):
            raise SchemaError("load_cache: no slots declared; call init(use_var=[...]) first")
        path = os.fspath(path)
        chunks, stats, sources = cache.read_cache(
            path, self.schema, self._filelist, stat=self._source_now
        )
        store = self._store or RecordStore(self.schema)
        if store.schema != self.schema:
            raise SchemaError(
                f"load_cache: use_var changed since the last load "
                f"({store.schema!r} -> {self.schema!r}); call release_memory() first"
            )
        store.extend(chunks)
        self._store = store
        self._stats = stats
        self._sources += sources
        self._source_stats += stats.per_file
        logger.info("loaded %d records from cache %s in %.3f s", stats.records, path, stats.seconds)

    # -- shuffling ---------------------------------------------------------------------

    def local_shuffle(self, seed: int | None = None) -> None:
        """Shuffles the records in memory.

        Args:
            seed: the shuffle's seed; the same seed on the same records gives the
                same order. Without one, each call shuffles anew with a seed derived
                from the ``seed`` setting (or drawn from the OS when that is None);
                the seed used is logged and kept in ``last_shuffle_seed``.
        """
        store = self._require_store("local_shuffle")
        if seed is None:
            base = self._settings["seed"]
            seed = shuffle.fresh_seed() if base is None else shuffle.derive_seed(base, self._shuffles)
        self._shuffles += 1
        rows = store.rows
        self._store = shuffle.local_shuffle(store, seed, threads=self._settings["thread_num"])
        self._note_shuffle(("local", seed), rows)
        del store
        release_free_memory()  # the unshuffled chunks
        self.last_shuffle_seed = seed
        logger.info("local_shuffle of %d records with seed %d", rows, seed)

    def global_shuffle(self, fleet: Any = None, thread_num: int = 12, seed: int | None = None) -> None:
        """Shuffles the records of every worker across the workers.

        Every worker must call it. Records travel as Arrow IPC buffers over the
        default ``torch.distributed`` process group (set up by
        ``fleet.init(is_collective=True)``, ``fleetrun --nproc_per_node``,
        torchrun, or ``init_process_group``), in rounds of
        ``fleet_send_batch_size`` records per destination. Afterwards the
        workers' counts differ by at most one, no record is lost or duplicated
        (checked), and the outcome is a function of the seed and the inputs
        (see ``datafeed.global_shuffle``). Without a fleet of several workers
        and without a process group of several ranks, it is ``local_shuffle``.

        Args:
            fleet: ``trainer.fleet`` (or any object with ``worker_num()``), or None.
            thread_num: threads for the local gathers.
            seed: the same seed on every worker, or None on every worker (then a
                seed derived from the ``seed`` setting, or rank 0's fresh one, is
                used); the seed used is logged and kept in ``last_shuffle_seed``.

        Raises:
            GlobalShuffleError: a peer died or stalled (within the process
                group's timeout), seeds differ, or records did not add up. A
                failure once records were sent leaves this worker with none
                (load again); a failure before keeps them.
        """
        from . import global_shuffle as gs

        _join_worker_group(fleet)
        world = gs.distributed_world()
        workers = _worker_num(fleet) if fleet is not None else world
        if workers <= 1 and world <= 1:
            self.local_shuffle(seed=seed)
            return
        if world != workers:
            raise gs.GlobalShuffleError(
                f"global_shuffle: the fleet has {workers} workers but the torch.distributed "
                f"process group has {world} ranks; global_shuffle runs among the workers "
                "(the group of a collective job, or the one fleet.worker_group() forms in a "
                "PS job)",
                rank=0,
            )
        self._check_no_preload("global_shuffle")
        store = self._store or RecordStore(self.schema)
        store_rows = store.rows
        if seed is None and self._settings["seed"] is not None:
            seed = shuffle.derive_seed(self._settings["seed"], self._shuffles)
        self._store = None  # global_shuffle consumes the store's chunks as it sends them
        try:
            self._store, seed = gs.global_shuffle(
                store,
                seed,
                send_batch_size=self._settings["fleet_send_batch_size"],
                threads=max(1, min(thread_num, 16)),
            )
        except BaseException:
            # A failure before the first round (a peer gone at the start,
            # different seeds) leaves the records; a later one takes them along.
            self._store = store if store.rows == store_rows and store_rows else None
            raise
        self._shuffles += 1
        self.last_shuffle_seed = seed
        self._note_shuffle(("global", seed, world), store_rows)
        release_free_memory()

    def slots_shuffle(self, slots: Iterable[str], seed: int | None = None) -> None:
        """Replaces the named slots' values with those of other, random records.

        For feature-importance evaluation (Paddle's ``slots_shuffle``): a model
        evaluated on the result shows how much it relies on those slots. One
        seeded permutation moves all the named slots together (a record gets
        all of them from the same other record); the other slots stay. Unlike
        Paddle, it needs no ``fea_eval`` setting (a Paddle script's
        ``fea_eval=True`` is accepted), draws from every record rather than a
        ``candidate_size`` reservoir, and works on every slot type.

        Args:
            slots: slot names.
            seed: the permutation's seed; default derived from the ``seed``
                setting (or drawn from the OS), logged and kept in the state.

        Raises:
            SchemaError: a name that is not a slot.
        """
        store = self._require_store("slots_shuffle")
        names = [slots] if isinstance(slots, str) else list(slots)
        known = {slot.name: i for i, slot in enumerate(self.schema)}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise SchemaError(
                f"slots_shuffle: no slot named {', '.join(map(repr, unknown))}; the slots "
                f"are {', '.join(known)}"
            )
        if seed is None:
            base = self._settings["seed"]
            seed = shuffle.fresh_seed() if base is None else shuffle.derive_seed(base, self._shuffles)
        self._shuffles += 1
        indices = sorted({known[n] for n in names})
        self._store = store.permute_columns(indices, shuffle.permutation(store.rows, seed))
        self.last_shuffle_seed = seed
        self._note_shuffle(("slots", seed, [self.schema[i].name for i in indices]), store.rows)
        logger.info("slots_shuffle of %s over %d records with seed %d", names, store.rows, seed)

    def _note_shuffle(self, entry: tuple[Any, ...], rows_before: int) -> None:
        if not self._history:
            self._records_before_shuffles = rows_before
        self._history.append(entry)
        self._epoch_started = True

    # -- the position of iteration (datafeed/state.py) ---------------------------------

    @property
    def epoch_started(self) -> bool:
        """Whether the current epoch has begun: a shuffle or a batch since the last
        completed pass. A resumable loop shuffles only when it has not::

            for epoch in range(ds.epoch, epochs):
                if not ds.epoch_started:
                    ds.local_shuffle()
                for batch in ds: ...
        """
        return self._epoch_started

    def state_dict(self) -> dict[str, Any]:
        """The position of iteration and the shuffles behind the order in memory.

        A plain dict of ints, strings and lists (JSON- and ``torch.save``-able).
        See ``load_state_dict``.
        """
        from . import state

        return state.dataset_state(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continues from a ``state_dict()`` of a dataset that loaded the same files.

        Call it after ``load_into_memory()`` and before any shuffle: it replays
        the recorded shuffles (global ones among the same number of workers:
        every worker must call it), so the records are in the order they had,
        and the next iteration starts after the batches already consumed.

        Raises:
            ValueError: the state does not fit this dataset (another record
                count, batch size, or shuffles already done here).
        """
        from . import state

        state.load_dataset_state(self, state_dict)

    # -- inspection --------------------------------------------------------------------

    def release_memory(self) -> None:
        """Drops the records and gives their memory back to the operating system."""
        self._store = None
        self._sources, self._source_stats = [], []
        self._history, self._records_before_shuffles = [], 0
        self._epoch, self._batches, self._epoch_started = 0, 0, False
        self._resume_batches = None
        release_free_memory()

    def get_memory_data_size(self, fleet: Any = None) -> int:
        """Records in memory; with a fleet of several workers, the sum over all of
        them (an all-reduce over the default process group: every worker must call it)."""
        local = self._store.rows if self._store is not None else 0
        if fleet is not None and _worker_num(fleet) > 1:
            from . import global_shuffle as gs

            _join_worker_group(fleet)
            if gs.distributed_world() != _worker_num(fleet):
                raise gs.GlobalShuffleError(
                    f"get_memory_data_size: the fleet has {_worker_num(fleet)} workers but "
                    f"the torch.distributed process group has {gs.distributed_world()} "
                    "ranks; sizes are summed among the workers' process group",
                    rank=0,
                )
            return gs.all_reduce_count(local)
        return local

    def get_shuffle_data_size(self, fleet: Any = None) -> int:
        """Records in memory after a shuffle (Paddle's name for the same count)."""
        return self.get_memory_data_size(fleet)

    @property
    def nbytes(self) -> int:
        """Bytes held by the records in memory (values and offsets)."""
        return self._store.nbytes if self._store is not None else 0

    def to_arrow(self) -> pa.Table:
        """The records in memory, in their current order, as a ``pyarrow.Table``."""
        return self._require_store("to_arrow").to_arrow()

    def _require_store(self, what: str) -> RecordStore:
        if self._store is None:
            raise RuntimeError(f"{what}(): no records in memory; call load_into_memory() first")
        return self._store

    # -- iteration ---------------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        """One pass over the records in memory, ``batch_size`` records per batch."""
        store = self._require_store("iterating the dataset")
        builder = BatchBuilder(self.schema)
        # After load_state_dict(), the pass continues after the batches consumed.
        start, self._resume_batches = self._resume_batches or 0, None
        limit = self._equal_batch_count(store) if self._settings["equal_batches"] else None
        self._batches, self._epoch_started = start, True
        for pieces in store.batch_pieces(
            self.batch_size, self._settings["drop_last"], start_row=start * self.batch_size
        ):
            if limit is not None and self._batches >= limit:
                break
            self._batches += 1
            yield builder.from_pieces(pieces)
        self._epoch += 1
        self._batches, self._epoch_started = 0, False

    def _equal_batch_count(self, store: RecordStore) -> int | None:
        """With ``equal_batches`` in a job of several ranks: the fewest batches any
        rank has this pass (an all-reduce: every rank starts its pass together)."""
        from . import global_shuffle as gs

        if gs.distributed_world() <= 1:
            return None
        rows, size = store.rows, self.batch_size
        full, rest = divmod(rows, size)
        local = full + (1 if rest and not self._settings["drop_last"] else 0)
        limit = gs.all_reduce_count(local, op="min")
        # Every batch before the limit is full: only a rank's last batch can be short.
        left_out = rows - limit * size if limit < local else 0
        log = logger.warning if left_out > size else logger.info
        log(
            "equal_batches: %d batches per rank this pass; this rank leaves out %d of "
            "its %d records",
            limit, left_out, rows,
        )
        return limit

    def __len__(self) -> int:
        """Batches per pass (on this rank; ``equal_batches`` may yield fewer)."""
        rows = self._store.rows if self._store is not None else 0
        full, rest = divmod(rows, self.batch_size)
        return full + (1 if rest and not self._settings["drop_last"] else 0)


class QueueDataset(DatasetBase):
    """Streams the files batch by batch with bounded memory; no shuffling.

    Each pass over the dataset (``for batch in ds``) runs the pipe commands anew.
    Records from different files interleave in the order the readers produce them.
    """

    queue_chunks = 4  # chunks buffered between the readers and the consumer
    _ordered_ranges = False

    def __init__(self) -> None:
        super().__init__()
        # Per reader task (a file or a byte range of one), the records handed
        # out in this pass: a task's records always arrive in order, so those
        # counts say exactly which records a restarted pass skips.
        self._delivered: list[int] = []
        self._tasks: list[list[Any]] = []
        self._resume: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        """The position of iteration: the epoch and, within an unfinished pass,
        the records already handed out per reader task (file or byte range).

        A plain dict of ints, strings and lists. See ``load_state_dict``.
        """
        return {
            "version": QUEUE_STATE_VERSION,
            "kind": "QueueDataset",
            "epoch": self._epoch,
            "batches_consumed": self._batches,
            "batch_size": self.batch_size,
            "drop_last": bool(self._settings["drop_last"]),
            "filelist": list(self._filelist),
            "tasks": [list(t) for t in self._tasks],
            "delivered": list(self._delivered),
        }

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
        if not isinstance(state_dict, dict) or state_dict.get("kind") != "QueueDataset":
            raise ValueError(
                "QueueDataset.load_state_dict() takes a QueueDataset.state_dict(), got "
                f"{type(state_dict).__name__} {str(state_dict)[:80]!r}"
            )
        if state_dict.get("version") != QUEUE_STATE_VERSION:
            raise ValueError(
                f"QueueDataset.load_state_dict(): state version {state_dict.get('version')!r}, "
                f"expected {QUEUE_STATE_VERSION}"
            )
        here = {
            "filelist": list(self._filelist),
            "batch_size": self.batch_size,
            "drop_last": bool(self._settings["drop_last"]),
        }
        for key, value in here.items():
            if state_dict[key] != value:
                raise ValueError(
                    f"QueueDataset.load_state_dict(): the state was taken with {key}="
                    f"{state_dict[key]!r}, this dataset has {key}={value!r}"
                )
        self._epoch = int(state_dict["epoch"])
        self._batches = int(state_dict["batches_consumed"])
        self._tasks = [list(t) for t in state_dict["tasks"]]
        self._delivered = [int(n) for n in state_dict["delivered"]]
        self._resume = state_dict if any(self._delivered) else None
        logger.info(
            "QueueDataset.load_state_dict: epoch %d, resuming after %d batches (%d records)",
            self._epoch, self._batches, sum(self._delivered),
        )

    def _plan(self, pool: ReaderPool | InProcessPool) -> list[int]:
        """This pass's records to skip per task: those a loaded state says were
        handed out (its reader plan must be this pass's)."""
        tasks = [[t[0], t[2], t[3]] for t in pool.tasks]
        resume, self._resume = self._resume, None
        if resume is None:
            self._tasks, self._delivered, self._batches = tasks, [0] * len(tasks), 0
            return [0] * len(tasks)
        if resume["tasks"] != tasks:
            raise ValueError(
                f"QueueDataset: the loaded state read the files as tasks {resume['tasks']}, "
                f"this pass reads them as {tasks} (file index, first byte, end byte); "
                "resume with the thread_num the state was taken with"
            )
        self._tasks = tasks
        return list(self._delivered)

    def local_shuffle(self, *args: Any, **kwargs: Any) -> None:
        """Not supported: a QueueDataset streams (``NotImplementedError``, as in
        Paddle)."""
        raise NotImplementedError(
            "QueueDataset does not support local shuffle, please use InMemoryDataset for local_shuffle"
        )

    def global_shuffle(self, *args: Any, **kwargs: Any) -> None:
        """Not supported: a QueueDataset streams (``NotImplementedError``, as in
        Paddle)."""
        raise NotImplementedError(
            "QueueDataset does not support global shuffle, please use InMemoryDataset for global_shuffle"
        )

    def __iter__(self) -> Iterator[Batch]:
        self._check_ready("iterating the dataset")
        pool = self._reader_pool()
        chunks: queue.Queue = queue.Queue(maxsize=max(self.queue_chunks, pool.threads + 1))
        done = object()
        outcome: dict[str, Any] = {}

        skip = self._plan(pool)

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
        builder = BatchBuilder(self.schema)
        batch_size, drop_last = self.batch_size, self._settings["drop_last"]
        pending: list[tuple[RecordChunk, int, int]] = []
        pending_tasks: list[int] = []
        pending_rows = 0

        def delivered() -> None:  # counted before the batch is yielded: state_dict
            for task, (_, start, stop) in zip(pending_tasks, pending):  # may run meanwhile
                self._delivered[task] += stop - start
            self._batches += 1

        try:
            while True:
                item = chunks.get()
                if item is done:
                    break
                task, chunk = item
                row = min(skip[task], chunk.rows)  # handed out before a restart
                skip[task] -= row
                while row < chunk.rows:
                    take = min(batch_size - pending_rows, chunk.rows - row)
                    pending.append((chunk, row, row + take))
                    pending_tasks.append(task)
                    pending_rows += take
                    row += take
                    if pending_rows == batch_size:
                        delivered()
                        batch = builder.from_pieces(pending)
                        pending, pending_tasks, pending_rows = [], [], 0
                        yield batch
            if "error" in outcome:
                raise outcome["error"]
            if any(skip):
                raise ValueError(
                    f"QueueDataset: the loaded state says {sum(self._delivered)} records "
                    f"were handed out, but the files now hold {sum(skip)} fewer in "
                    "the tasks it names; were the files changed?"
                )
            if pending_rows and not drop_last:
                delivered()
                yield builder.from_chunk(concat_rows(pending), 0, pending_rows)
            self._epoch += 1
            self._batches, self._delivered = 0, [0] * len(self._delivered)
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


class DatasetFactory:
    """Paddle's factory: ``DatasetFactory().create_dataset("InMemoryDataset")``."""

    _classes: ClassVar[dict[str, type[DatasetBase]]] = {
        "InMemoryDataset": InMemoryDataset,
        "QueueDataset": QueueDataset,
    }

    def create_dataset(self, datafeed_class: str = "QueueDataset") -> DatasetBase:
        """A new ``InMemoryDataset`` or ``QueueDataset``, by class name (``ValueError``
        for another)."""
        try:
            return self._classes[datafeed_class]()
        except KeyError:
            raise ValueError(
                f"datafeed class {datafeed_class!r} does not exist; "
                f"choose one of {', '.join(sorted(self._classes))}"
            ) from None


QUEUE_STATE_VERSION = 1


def _join_worker_group(fleet: Any) -> None:
    """Lets ``trainer.fleet`` form the workers' process group where it has none yet
    (a PS job); any other fleet-like object is used as it is."""
    join = getattr(fleet, "worker_group", None)
    if callable(join):
        join()


def _worker_num(fleet: Any) -> int:
    worker_num = getattr(fleet, "worker_num", None)
    return int(worker_num()) if callable(worker_num) else 1
