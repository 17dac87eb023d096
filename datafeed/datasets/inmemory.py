"""``InMemoryDataset``: loads every file into memory, shuffles (seeded, locally
or across the workers), and iterates batches for any number of epochs.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

import numpy as np
import pyarrow as pa

from ..config.errors import CacheError, GlobalShuffleError, SchemaError, StateError
from ..config.settings import INMEMORY_SETTINGS
from ..config.slots import INS_ID
from ..iterate import state
from ..iterate.batch import Batch
from ..iterate.batcher import (
    WINDOW_ROWS,
    Batcher,
    BatchPlan,
    chunk_ranges,
    gathered_ranges,
)
from ..records import cache, shared_records
from ..records.columns import RecordChunk
from ..records.memory import callers_objects_frozen, release_free_memory
from ..records.stats import FileStats
from ..records.store import PermutedRows, RecordStore
from ..reorder import collectives, global_shuffle, merge, shuffle
from ..source import fs, reader_code
from .dataset_base import DatasetBase
from .paddle_compat import PaddleInMemoryDataset
from .progress import LoadProgress, progress_enabled

logger = logging.getLogger("datafeed")


class InMemoryDataset(DatasetBase, PaddleInMemoryDataset):
    """Loads every file into memory; shuffles; iterates batches for any number of epochs.

    Paddle's InMemoryDataset setters (``_init_distributed_settings``,
    ``_set_*``) come from ``PaddleInMemoryDataset`` (datafeed/datasets/paddle_compat.py).

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
        # The shuffles that made the order in memory, for state_dict()
        # (datafeed/iterate/state.py); the position itself is DatasetBase's.
        self._shuffles = shuffle.ShuffleHistory()
        # What the records in memory came from, for save_cache().
        self._sources: list[cache.SourceFile] = []
        self._source_stats: list[FileStats] = []
        # The reader's settings and code as the last load ran them, for
        # save_cache() (a setting changed since did not make these records).
        self._loaded_reader: tuple[dict[str, Any], reader_code.LoadedCode] | None = None
        self._epoch_at_load = 0  # passes completed when records were last loaded
        # Shuffles the records had when a cache of them was saved (load_cache):
        # load_state_dict() replays a state's shuffles on records as loaded.
        self._cached_shuffles = 0
        # A global_shuffle() with no other worker: Paddle's shuffle count is then 0.
        self._shuffled_alone = False
        self._shared: shared_records.SharedRecords | None = None  # share_records()

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
        with callers_objects_frozen():
            self._load(self._reader_threads)

    def preload_into_memory(self, thread_num: int | None = None) -> None:
        """Starts loading in the background; ``wait_preload_done()`` finishes it."""
        self._check_no_preload("preload_into_memory")
        self._check_ready("preload_into_memory")
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                with callers_objects_frozen():
                    self._load(thread_num or self._reader_threads, show_progress=False)
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
            raise RuntimeError(
                f"{what}() called while a preload runs; call wait_preload_done() first"
            )

    def _load(self, thread_num: int, show_progress: bool = True) -> None:
        self._check_ready("load_into_memory")
        self._warn_if_appending_after_a_pass("load_into_memory")
        cache_path = self._settings["cache"]
        if cache_path is not None and os.path.exists(cache_path):
            self._read_cache(cache_path)
            return
        # Taken before reading: a file that changes during the load makes the
        # cache stale rather than silently blessed.
        sources = [self._source_now(p) for p in self._filelist]
        settings_before, code_before = self._reader_settings(), self._reader_code_now()
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
        store = self._store_of_schema("load_into_memory")
        store.extend([chunk for chunks in per_file for chunk in chunks])
        self._store = store
        self._shuffled_alone = False
        self._stats = stats
        self._sources += sources
        self._source_stats += stats.per_file
        self._epoch_at_load = self._position.epoch
        loaded = reader_code.LoadedCode.across(code_before, self._reader_code_now())
        self._loaded_reader = (settings_before, loaded)
        release_free_memory()  # the parsers' buffers, freed with their threads
        self._log_load(stats)
        if cache_path is not None and loaded.edited:
            logger.warning(
                "no cache written to %s: %s changed while the readers ran, so the records "
                "may come from either version; the next load reads the files again",
                cache_path, ", ".join(loaded.edited),
            )
        elif cache_path is not None:
            try:
                self.save_cache(cache_path)
            except OSError as error:  # a full disk: the load itself succeeded
                raise OSError(
                    error.errno,
                    f"{error.strerror or error}; the {stats.records} records loaded stay "
                    "in memory (iterate them, or free space and load again)",
                ) from error

    def _warn_if_appending_after_a_pass(self, what: str) -> None:
        """A pass loop that forgot ``release_memory()`` would train every day's
        records again, and more each day: say so (Paddle 3.0 keeps the old
        records instead, loading nothing more: wrong too, and silent)."""
        rows = self._store.rows if self._store is not None else 0
        if rows and self._position.epoch > self._epoch_at_load:
            logger.warning(
                "%s appends to the %d records in memory, which a pass already went over; "
                "call release_memory() first if this is the next pass's data", what, rows,
            )

    def _store_of_schema(self, what: str) -> RecordStore:
        """The store to add records to: the one in memory, or a new one."""
        schema = self._record_schema
        store = self._store or RecordStore(schema)
        if store.schema != schema:
            raise SchemaError(
                f"{what}: use_var (or parse_ins_id / parse_content) changed since the last "
                f"load ({store.schema!r} -> {schema!r}); call release_memory() first"
            )
        return store

    # -- the parsed-data cache (datafeed/records/cache.py) -------------------------------------

    def _reader_settings(self) -> dict[str, Any]:
        """The settings that decide which records a file gives: a cache made
        under others is stale (and so is one made before the reader's code
        changed: ``_reader_code_now``)."""
        s = self._settings.as_dict()
        generator = s.get("data_generator")
        if generator is not None:
            kind = generator if isinstance(generator, type) else type(generator)
            generator = f"{kind.__module__}.{kind.__qualname__}"
        return {
            "pipe_command": s["pipe_command"], "download_cmd": s["download_cmd"],
            "data_generator": generator, "on_bad_line": s["on_bad_line"],
            "max_line_bytes": s["max_line_bytes"],
            # A reader that treats lines together gives other records from
            # byte ranges (a cache without this entry was made splitting).
            "split_files": self._split_decision(),
        }

    def _reader_commands(self) -> list[str | None]:
        """The commands whose files are the reader's code (a generator runs
        in place of the pipe command)."""
        s = self._settings.as_dict()
        pipe = [] if s.get("data_generator") is not None else [s["pipe_command"]]
        return [*pipe, s["download_cmd"]]

    def _reader_code_now(self) -> dict[str, str]:
        return reader_code.digests(self._reader_commands(), self._settings["data_generator"])

    def _source_now(self, path: str) -> cache.SourceFile:
        """A source file's size and mtime now, local or through its filesystem."""
        filesystem = self._filesystem()
        if not fs.is_remote(path, filesystem):
            return cache.SourceFile.of(path)
        info = fs.stat(path, filesystem)
        return cache.SourceFile(path, info.size, info.mtime_ns or 0)

    def save_cache(self, path: str | os.PathLike) -> None:
        """Writes the records in memory, in their current order, to a cache file
        (a cache saved after a shuffle cannot resume a ``state_dict()``: save
        it before, as ``init(..., cache=path)`` does).

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
        settings, loaded = self._loaded_reader or (
            self._reader_settings(), reader_code.LoadedCode(self._reader_code_now())
        )
        if loaded.edited:
            raise CacheError(
                f"save_cache: {', '.join(loaded.edited)} changed while the readers ran, so "
                "the records in memory may come from either version; release_memory(), "
                "load again, then save"
            )
        reader_code.warn_unseen(self._reader_commands(), loaded, os.fspath(path))
        cache.write_cache(
            os.fspath(path), store.schema, store.copy_pieces(), self._sources,
            self._source_stats, {**settings, cache.READER_CODE: loaded.kept},
            shuffled=self._cached_shuffles + len(self._shuffles.entries),
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
        self._warn_if_appending_after_a_pass("load_cache")
        self._read_cache(path)

    def _read_cache(self, path: str | os.PathLike) -> None:
        """``load_cache`` but for the warning (``load_into_memory`` gave it)."""
        path = os.fspath(path)
        settings = self._reader_settings()
        chunks, stats, sources, recorded_code, shuffled = cache.read_cache(
            path, self._record_schema, self._filelist,
            {**settings, cache.READER_CODE: self._reader_code_now()}, stat=self._source_now,
        )
        store = self._store_of_schema("load_cache")
        store.extend(chunks)
        self._store = store
        self._shuffled_alone = False
        self._stats = stats
        self._sources += sources
        self._source_stats += stats.per_file
        self._epoch_at_load = self._position.epoch
        self._cached_shuffles += shuffled
        # A save of these records records what the cache did (not a log its
        # reader changed since, which that cache left out).
        self._loaded_reader = (settings, reader_code.LoadedCode(recorded_code))
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
            seed = self._shuffles.next_seed(self._settings["seed"])
        self._shuffles.counter += 1
        rows = store.rows
        # A new order of the same chunks: shared records stay shared.
        self._store = shuffle.local_shuffle(store, seed)
        self._shuffled_alone = False
        self._note_shuffle(("local", seed), rows)
        logger.info("local_shuffle of %d records with seed %d", rows, seed)

    def global_shuffle(
        self, fleet: Any = None, thread_num: int = 12, seed: int | None = None
    ) -> None:
        """Shuffles the records of every worker across the workers.

        Every worker must call it. Records travel as Arrow IPC buffers over the
        default ``torch.distributed`` process group (set up by
        ``fleet.init(is_collective=True)``, ``fleetrun --nproc_per_node``,
        torchrun, or ``init_process_group``), in rounds of
        ``fleet_send_batch_size`` records per destination. Afterwards the
        workers' counts differ by at most one, no record is lost or duplicated
        (checked), and the outcome is a function of the seed and the inputs
        (see ``datafeed.reorder.global_shuffle``). Without a fleet of several workers
        and without a process group of several ranks, it is ``local_shuffle``.
        With merge by line id on (``_set_merge_by_lineid``, ``merge_size > 0``),
        each record goes instead to the worker its instance id hashes to
        (``XXH64(ins_id) % workers``, as in Paddle: the counts are then not
        balanced), and each worker merges the records of one instance id, as
        in Paddle (``datafeed.reorder.merge``), with the shuffle's seed. With
        shuffle by uid on (``_set_uid_slot(slot)`` and
        ``_set_shuffle_by_uid(True)``), each record goes to the worker its uid
        (the slot's one uint64) hashes to, so each user's records meet on one
        worker, and each worker's share is shuffled with the seed.

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
        collectives.join_worker_group(fleet)
        world = collectives.distributed_world()
        workers = collectives.worker_num(fleet) if fleet is not None else world
        by_id = bool(self._settings["merge_by_lineid"])
        route_by = INS_ID if by_id else self._uid_route()
        if route_by is not None and route_by != INS_ID:  # alone too: the job would fail
            global_shuffle.check_route(self._record_schema, route_by)
        if workers <= 1 and world <= 1:
            self.local_shuffle(seed=seed)
            self._shuffled_alone = True
            if by_id:
                self._merge_by_lineid(self._shuffles.last_seed)
            return
        if world != workers:
            raise GlobalShuffleError(
                f"global_shuffle: the fleet has {workers} workers but the torch.distributed "
                f"process group has {world} ranks; global_shuffle runs among the workers "
                "(the group of a collective job, or the one fleet.worker_group() forms in a "
                "PS job)",
                rank=0,
            )
        self._check_no_preload("global_shuffle")
        store = self._store or RecordStore(self._record_schema)
        if by_id:  # before any collective: the peers would wait for this one
            merge.check_ins_ids(store.schema)
        store_rows = store.rows
        if seed is None:  # else rank 0's fresh seed, shared by global_shuffle
            seed = self._shuffles.derived_seed(self._settings["seed"])
        self._store = None  # global_shuffle consumes the store's chunks as it sends them
        try:
            self._store, seed = global_shuffle.global_shuffle(
                store,
                seed,
                send_batch_size=self._settings["fleet_send_batch_size"],
                threads=max(1, min(thread_num, 16)),
                route_by=route_by,
            )
        except BaseException:
            # A failure before the first round (a peer gone at the start,
            # different seeds) leaves the records; a later one takes them along.
            self._store = store if store.rows == store_rows and store_rows else None
            raise
        self._shuffles.counter += 1
        self._shuffled_alone = False
        if by_id:
            self._note_shuffle((state.GLOBAL_BY_INS_ID, seed, world), store_rows)
        elif route_by is not None:
            self._note_shuffle((state.GLOBAL_BY_UID, seed, world, route_by), store_rows)
        else:
            self._note_shuffle(("global", seed, world), store_rows)
        release_free_memory()
        if by_id:  # the records of each instance id are all on this worker now
            self._merge_by_lineid(seed)

    def _uid_route(self) -> str | None:
        """The uid slot a global shuffle routes by (Paddle's shuffle by uid), or None."""
        if not getattr(self, "_shuffle_by_uid", False):
            return None
        uid_slot = getattr(self, "_uid_slot", None)
        if uid_slot is None:
            raise SchemaError(
                "global_shuffle by uid (_set_shuffle_by_uid(True)) needs the uid slot: call "
                "_set_uid_slot(<slot name>) first (the slot holds one uint64 per record)"
            )
        return uid_slot

    def _merge_by_lineid(self, seed: int | None = None) -> None:
        """Merges the records of one instance id (datafeed/reorder/merge.py), as Paddle's
        global_shuffle does after shuffling when merge by line id is on."""
        store = self._require_store("merge by line id")
        if seed is None:
            seed = self._shuffles.next_seed(self._settings["seed"])
        self._shuffles.counter += 1
        rows = store.rows
        self._store, _ = merge.merge_by_ins_id(store, self._settings["merge_size"], seed)
        self._note_shuffle(("merge", seed, self._settings["merge_size"]), rows)

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
            seed = self._shuffles.next_seed(self._settings["seed"])
        self._shuffles.counter += 1
        indices = sorted({known[n] for n in names})
        self._store = store.permute_columns(indices, shuffle.permutation(store.rows, seed))
        self._note_shuffle(("slots", seed, [self.schema[i].name for i in indices]), store.rows)
        logger.info("slots_shuffle of %s over %d records with seed %d", names, store.rows, seed)

    def _note_shuffle(self, entry: tuple[Any, ...], rows_before: int) -> None:
        self._shuffles.note(entry, rows_before)
        self._position.started = True  # a shuffle begins the epoch

    @property
    def last_shuffle_seed(self) -> int | None:
        """The seed of the last shuffle (None before the first)."""
        return self._shuffles.last_seed

    @last_shuffle_seed.setter
    def last_shuffle_seed(self, seed: int | None) -> None:
        self._shuffles.last_seed = seed

    # -- the position of iteration (datafeed/iterate/state.py) ---------------------------------

    @property
    def epoch_started(self) -> bool:
        """Whether the current epoch has begun: a shuffle or a batch since the last
        completed pass. A resumable loop shuffles only when it has not::

            for epoch in range(ds.epoch, epochs):
                if not ds.epoch_started:
                    ds.local_shuffle()
                for batch in ds: ...
        """
        return self._position.started

    def state_dict(self) -> dict[str, Any]:
        """The position of iteration and the shuffles behind the order in memory.

        A plain dict of ints, strings and lists (JSON- and ``torch.save``-able).
        See ``load_state_dict``.
        """
        return state.inmemory_state(
            self._position, self._shuffles,
            records=self._store.rows if self._store is not None else 0,
            # The batches consumed are the pass's, of the size it began with.
            batch_size=self._position.pass_batch_size or self.batch_size,
            drop_last=bool(self._settings["drop_last"]), seed=self._settings["seed"],
            cached_shuffles=self._cached_shuffles,
        )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continues from a ``state_dict()`` of a dataset that loaded the same files.

        Call it after ``load_into_memory()`` (or ``load_cache()`` of a cache
        saved before any shuffle) and before any shuffle: it replays
        the recorded shuffles (global ones among the same number of workers:
        every worker must call it), so the records are in the order they had,
        and the next iteration starts after the batches already consumed.

        Raises:
            StateError: (a ``ValueError``) the state is malformed, or does not
                fit this dataset (another record count, batch size, shuffles
                already done here, or a position beyond the pass); the dataset
                is left unchanged.
        """
        state.check_inmemory_state(state_dict)
        store = self._require_store("load_state_dict")
        taken_on = state_dict.get("cached_shuffles", 0)
        if taken_on != self._cached_shuffles:
            # The state's shuffles replay on the order it was taken from.
            raise StateError(
                f"load_state_dict: the records in memory come from a cache saved after "
                f"{self._cached_shuffles} shuffle(s), the state was taken on records "
                f"{'as loaded' if not taken_on else f'of a cache saved after {taken_on}'}; "
                "save the cache before any shuffle (init(..., cache=path) does), or load "
                "the records as the state's job did"
            )
        state.check_inmemory_fit(
            state_dict, records=store.rows, shuffles_done=len(self._shuffles.entries),
            batch_size=self.batch_size, drop_last=bool(self._settings["drop_last"]),
            schema=store.schema,
        )
        if state_dict["seed"] != self._settings["seed"]:
            logger.warning(
                "load_state_dict(): the state's seed setting %r replaces this dataset's %r",
                state_dict["seed"], self._settings["seed"],
            )
            self._settings.apply({"seed": state_dict["seed"]}, where="load_state_dict")
        # Every entry was checked above: nothing is replayed from a refused state.
        for entry in state_dict["shuffles"]:
            store = self._require_store("load_state_dict")
            rows = store.rows
            if entry[0] in ("global", state.GLOBAL_BY_INS_ID, state.GLOBAL_BY_UID):
                self._store = None  # the global shuffle consumes the store as it sends it
            try:
                self._store = state.replay_shuffle(
                    store, entry, threads=self._reader_threads,
                    send_batch_size=self._settings["fleet_send_batch_size"],
                )
            except BaseException:
                # As global_shuffle: a failure before any record was sent keeps them.
                self._store = store if store.rows == rows and rows else None
                raise
        self._shuffles = state.restored_history(state_dict)
        self._position = state.restored_position(state_dict)
        logger.info(
            "load_state_dict: replayed %d shuffles; epoch %d, %d batches consumed",
            len(state_dict["shuffles"]), self._position.epoch, self._position.batches,
        )

    # -- inspection --------------------------------------------------------------------

    def release_memory(self) -> None:
        """Drops the records and gives their memory back to the operating system."""
        self._store = None
        self._shuffled_alone = False
        self._sources, self._source_stats = [], []
        self._loaded_reader = None
        self._epoch_at_load = 0
        self._cached_shuffles = 0
        self._shuffles.forget_order()
        self._position = self._new_position()
        release_free_memory()

    def get_memory_data_size(self, fleet: Any = None) -> int:
        """Records in memory; with a fleet of several workers, the sum over all of
        them (an all-reduce over the default process group: every worker must call it)."""
        local = self._store.rows if self._store is not None else 0
        workers = collectives.worker_num(fleet) if fleet is not None else 1
        if workers > 1:
            collectives.join_worker_group(fleet)
            world = collectives.distributed_world()
            if world != workers:
                raise GlobalShuffleError(
                    f"get_memory_data_size: the fleet has {workers} workers but "
                    f"the torch.distributed process group has {world} "
                    "ranks; sizes are summed among the workers' process group",
                    rank=0,
                )
            return collectives.all_reduce_count(local)
        return local

    def get_shuffle_data_size(self, fleet: Any = None) -> int:
        """Records in memory after a shuffle: ``get_memory_data_size(fleet)``, except
        0 after a ``global_shuffle()`` with no other worker, as in Paddle.

        Paddle counts the records a global shuffle delivered into its output
        channels. With no fleet it still sends every record as a client-to-client
        message to worker 0, and without a parameter-server worker client none
        arrives: its count is 0 (and its records are gone). Here that shuffle is a
        ``local_shuffle`` and the records stay: ``get_memory_data_size()`` counts
        them, and a later load or shuffle makes this count them again.
        """
        if self._shuffled_alone and fleet is None:
            return 0
        return self.get_memory_data_size(fleet)

    def integer_values(self) -> Iterator[np.ndarray]:
        """The values of every 64-bit integer slot (the feature ids), one
        read-only array per slot and chunk of the records in memory."""
        for chunk in self._require_store("reading the ids").chunks:
            for column in chunk.columns:
                if column.values.dtype.kind in "iu" and column.values.dtype.itemsize == 8:
                    yield column.values

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
        batcher, skip_rows, limit = self._begin_pass("iterating the dataset")
        store = self._require_store("iterating the dataset")
        if store.order is None:
            ranges = chunk_ranges(store.chunks, skip_rows=skip_rows)
        else:  # shuffled: windows gathered ahead, one more gatherer than cores used
            window = -(-WINDOW_ROWS // self.batch_size) * self.batch_size
            cores = min(self._reader_threads, len(os.sched_getaffinity(0)))
            ranges = gathered_ranges(PermutedRows(store), skip_rows, window, cores + 1)
        yield from batcher.batches(ranges, self._position, limit)
        self._position.end_pass()

    def batch_plan(self) -> BatchPlan:
        """Begins a pass as iterating does, as a ``BatchPlan``: its batches built
        by number (Hogwild trainer processes share the records and build their
        own); ``finish()`` ends the pass."""
        batcher, skip_rows, limit = self._begin_pass("planning a pass")
        if limit is not None:  # counts from the pass's start, resumed batches included
            limit = max(limit - self._position.batches, 0)
        sources = self._require_store("planning a pass").row_sources()
        groups = list(islice(batcher.group(chunk_ranges(sources, skip_rows=skip_rows)), limit))
        return BatchPlan(batcher, groups, self._position, sources)

    def share_records(self) -> shared_records.SharedRecords:
        """Moves the records into a memory file for trainer processes (unless there)."""
        store = self._require_store("sharing the records")
        if self._shared is None or not self._shared.holds(store):
            self._store, self._shared = shared_records.share_store(store)
        return self._shared

    def _begin_pass(self, what: str) -> tuple[Batcher, int, int | None]:
        """The pass's batcher, the rows it skips (those consumed before a
        restart) and its batch limit (``equal_batches``)."""
        store = self._require_store(what)
        batcher = Batcher(
            store.schema, self.batch_size, self._settings["drop_last"],
            self._settings["input_type"],
        )
        # After load_state_dict(), the pass continues after the batches consumed.
        start = self._position.take_resume()
        limit = self._equal_batch_count(store) if self._settings["equal_batches"] else None
        self._position.begin_pass(start, self.batch_size)
        return batcher, start * self.batch_size, limit

    def _equal_batch_count(self, store: RecordStore) -> int | None:
        """With ``equal_batches`` in a job of several ranks: the fewest batches any
        rank has this pass (an all-reduce: every rank starts its pass together)."""
        if collectives.distributed_world() <= 1:
            return None
        rows, size = store.rows, self.batch_size
        full, rest = divmod(rows, size)
        local = full + (1 if rest and not self._settings["drop_last"] else 0)
        limit = collectives.all_reduce_count(local, op="min")
        # Every batch before the limit is full: only a rank's last batch can be short.
        left_out = rows - limit * size if limit < local else 0
        log = logger.warning if left_out > size else logger.info
        log(
            "equal_batches: %d batches per rank this pass; this rank leaves out %d of "
            "its %d records",
            limit, left_out, rows,
        )
        return limit

    @property
    def equal_batches(self) -> bool:
        """Whether every rank of a job yields the same number of batches per
        pass (the ``equal_batches`` setting)."""
        return self._settings["equal_batches"]

    def __len__(self) -> int:
        """Batches per pass (on this rank; ``equal_batches`` may yield fewer)."""
        rows = self._store.rows if self._store is not None else 0
        full, rest = divmod(rows, self.batch_size)
        return full + (1 if rest and not self._settings["drop_last"] else 0)
