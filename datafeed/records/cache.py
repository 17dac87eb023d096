"""A cache of parsed records: an Arrow IPC file, memory-mapped back in.

``InMemoryDataset.save_cache(path)`` writes the records in memory, and
``init(..., cache=path)`` makes ``load_into_memory()`` use the cache when it
exists (skipping the pipe command or generator) and write it after a normal
load when it does not. ``InMemoryDataset.load_cache(path)`` loads one
explicitly.

The file is an uncompressed Arrow IPC file: any pyarrow reads it
(``pa.ipc.open_file(path).read_all()`` is ``to_arrow()`` of the saved
dataset); a sparse slot is ``list<...>``, a dense slot
``fixed_size_list<...>[width]``. Its schema metadata (key ``fleetfeed.cache``)
records, as JSON: the slot schema, every source file's absolute path, size
and mtime (taken before the load read it), the per-file load accounting, and
which sparse columns of each batch hold the same number of values in every
row (those load without offsets, as the parser hands them out).

Loading memory-maps the file copy-on-write (so the arrays are writable, as
torch wants, and pages are shared with the page cache until written) and
makes every column a numpy view of the mapping: no copy, no parse; pages are
read on first touch. A cache whose slots differ from ``use_var``, whose
sources differ from the file list, whose sources changed on disk (size or
mtime), or whose reader changed (its settings, or the code that
``datafeed.source.reader_code`` digests) is refused with
a ``CacheError`` that says what differs. Nothing in the
file is trusted: a compressed body (which pyarrow would decompress into memory
outside the mapping, leaving the views empty), nulls, buffers outside the file,
offsets out of order or out of bounds, and metadata of the wrong shape are
refused with a ``CacheError`` naming the file, before any record is used. A cache is
written to a temporary name in the same directory and renamed into place, so
a reader never sees half a file.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ..config.errors import CacheError
from ..config.slots import SlotSchema
from ..source.fs import write_atomically
from .arrow import (
    arrow_schema_of,
    batch_problem,
    chunk_from_record_batch,
    chunk_to_record_batch,
    file_problem,
)
from .columns import RecordChunk
from .stats import FileStats, LoadStats
from .store import PieceList

logger = logging.getLogger("datafeed")

METADATA_KEY = b"fleetfeed.cache"
FORMAT = "fleetfeed-cache"
VERSION = 1

#: The reader settings' entry that holds the digests of the reader's code
#: (``datafeed.source.reader_code``).
READER_CODE = "reader_code"


@dataclass(frozen=True)
class SourceFile:
    """A source file as it was when it was loaded."""

    path: str
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: str) -> SourceFile:
        st = os.stat(path)
        return cls(source_key(path), st.st_size, st.st_mtime_ns)


def source_key(path: str) -> str:
    """How a cache names a source: a URI as given, a local path made absolute."""
    return path if "://" in path else os.path.abspath(path)


def write_cache(
    path: str,
    schema: SlotSchema,
    chunks: Sequence[RecordChunk],
    sources: Sequence[SourceFile],
    per_file: Sequence[FileStats],
    reader_settings: dict[str, Any],
    shuffled: int = 0,
) -> None:
    """Writes ``chunks`` to ``path`` atomically (a temporary name, then a rename).

    Args:
        path: the cache file.
        schema: the slots of the chunks.
        chunks: the records, in order.
        sources: the files the records were loaded from, as they were then.
        per_file: the load accounting of each source (restored by ``read_cache``).
        reader_settings: the settings that made records of the files (JSON
            values: the pipe command, ...), which ``read_cache`` must be given alike.
        shuffled: the shuffles that made the order of ``chunks`` (0: as loaded).

    Raises:
        OSError: the write failed (a full disk, a file size limit, ...): the
            message names ``path``; the temporary file is removed and ``path``
            is left as it was.
    """
    arrow_schema = arrow_schema_of(schema)
    # A shuffled store's pieces are gathered as they are written: their
    # layout and count are read without gathering them twice more.
    gathered = isinstance(chunks, PieceList)
    layouts = [chunks.layout()] * len(chunks) if gathered else chunks
    widths = [
        [0 if (slot.is_dense or column.offsets is not None) else column.width
         for slot, column in zip(schema, chunk.columns, strict=True)]
        for chunk in layouts
    ]
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "slots": [str(slot) for slot in schema],
        "reader": reader_settings,
        "sources": [asdict(s) for s in sources],
        "per_file": [
            {k: v for k, v in asdict(f).items() if k != "seconds"} for f in per_file
        ],
        "uniform_widths": widths,
        "records": chunks.rows if gathered else sum(c.rows for c in chunks),
        "shuffled": int(shuffled),
    }
    arrow_schema = arrow_schema.with_metadata({METADATA_KEY: json.dumps(meta).encode()})

    def write_batches(temporary: str) -> None:
        with pa.OSFile(temporary, "wb") as sink, pa.ipc.new_file(sink, arrow_schema) as writer:
            for chunk in chunks:
                writer.write_batch(chunk_to_record_batch(schema, chunk))

    try:
        write_atomically(path, write_batches)  # readers see the old file or the new one
    except OSError as error:  # a full disk, a file size limit, a read-only directory
        detail = error.strerror or str(error)
        raise OSError(
            error.errno,
            f"could not write the cache {path}: {detail}; its temporary file was "
            f"removed and {path} was left as it was",
        ) from error


def read_cache(
    path: str,
    schema: SlotSchema,
    filelist: Sequence[str] | None,
    reader_settings: dict[str, Any],
    stat: Callable[[str], SourceFile] = SourceFile.of,
) -> tuple[list[RecordChunk], LoadStats, list[SourceFile], dict[str, str]]:
    """Loads a cache written by ``write_cache``, refusing a stale one.

    Args:
        path: the cache file.
        schema: the slots the caller declares (``use_var``); must equal the cache's.
        reader_settings: the caller's reader settings; must equal those the
            cache records.
        filelist: the files the caller means to load; when given (non-empty),
            the cache must hold exactly these, in this order.
        stat: a source's size and mtime now (remote files: through their
            filesystem).

    Returns:
        The records (numpy views of a copy-on-write memory map), the load
        accounting of the load that made the cache (with this load's time),
        the sources, the digests of the reader's code it records (empty
        for a cache of an earlier fleetfeed), and the shuffles that made the
        records' order (``write_cache``'s ``shuffled``).

    Raises:
        FileNotFoundError: no file at ``path``.
        CacheError: not a fleetfeed cache, malformed (compressed, corrupt,
            unexpected buffers or metadata), or stale (what differs is named).
    """
    started = time.perf_counter()
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size == 0:
            raise CacheError(f"cache {path} is empty: not a fleetfeed cache")
        # Copy-on-write: numpy views of it are writable (torch.from_numpy
        # warns on read-only arrays); nothing is ever written back to the file.
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)
    try:
        reader = pa.ipc.open_file(pa.py_buffer(mapped))
    except pa.ArrowInvalid as error:
        raise CacheError(f"cache {path} is not an Arrow IPC file ({error})") from None
    meta = _metadata(path, reader.schema, reader.num_record_batches)
    _check_fresh(path, meta, schema, filelist, reader_settings, stat)
    _check_columns(path, reader.schema, schema)
    problem = file_problem(pa.py_buffer(mapped))  # before any batch is decoded
    if problem is not None:
        raise CacheError(
            f"cache {path} is refused: {problem} (fleetfeed writes uncompressed Arrow IPC "
            "files); delete it and load again"
        )
    base = np.frombuffer(mapped, dtype=np.uint8)
    base_address = base.ctypes.data

    def view(buffer: pa.Buffer, dtype: np.dtype, offset: int, length: int) -> np.ndarray:
        # A writable view of the memory map (never a copy) where Arrow's own
        # views would be read-only.
        start = buffer.address - base_address + offset * dtype.itemsize
        return base[start : start + length * dtype.itemsize].view(dtype)
    chunks = []
    for index in range(reader.num_record_batches):
        # Never trust a file: offsets out of order or out of bounds would make
        # later gathers read outside the arrays.
        # Every buffer must lie in the mapping: the views below are made from
        # addresses in it.
        try:
            batch = reader.get_batch(index)
        except pa.ArrowException as error:
            raise CacheError(f"cache {path} is corrupt: record batch {index}: {error}") from None
        problem = batch_problem(batch, (base_address, size))
        if problem is not None:
            raise CacheError(f"cache {path} is corrupt: record batch {index}: {problem}")
        try:
            chunk = chunk_from_record_batch(
                schema, batch, widths=meta["uniform_widths"][index], view=view
            )
        except ValueError as error:
            raise CacheError(f"cache {path} is corrupt: {error}") from None
        chunks.append(chunk)
    rows = sum(chunk.rows for chunk in chunks)
    if rows != meta["records"]:
        raise CacheError(
            f"cache {path} is corrupt: its metadata says {meta['records']} records, its "
            f"record batches hold {rows}"
        )
    try:
        sources = [SourceFile(**s) for s in meta["sources"]]
        per_file = [FileStats(**f) for f in meta["per_file"]]
    except TypeError as error:
        raise CacheError(f"cache {path} is corrupt: malformed metadata ({error})") from None
    stats = LoadStats.combine(per_file, time.perf_counter() - started)
    shuffled = meta.get("shuffled", 0)  # a cache written before it was recorded: unknown
    return (chunks, stats, sources, dict(meta["reader"].get(READER_CODE) or {}),
            shuffled if isinstance(shuffled, int) else 0)


def _check_columns(path: str, found: pa.Schema, schema: SlotSchema) -> None:
    """The file's columns must have exactly the declared slots' names and types."""
    expected = arrow_schema_of(schema)
    got = [(f.name, str(f.type)) for f in found]
    want = [(f.name, str(f.type)) for f in expected]
    if got != want:
        raise CacheError(
            f"cache {path} does not hold the declared slots: expected columns {want}, found {got}"
        )


def _metadata(path: str, arrow_schema: pa.Schema, batches: int) -> dict[str, Any]:
    """The cache's metadata, checked to have the shape ``write_cache`` gives it."""
    raw = (arrow_schema.metadata or {}).get(METADATA_KEY)
    if raw is None:
        raise CacheError(f"cache {path} is an Arrow file but not a fleetfeed cache (no metadata)")
    try:
        meta = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:  # JSONDecodeError is a ValueError
        raise CacheError(f"cache {path} has metadata that is not JSON ({error})") from None
    if not isinstance(meta, dict):
        raise CacheError(f"cache {path} has metadata {type(meta).__name__}, expected an object")
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise CacheError(
            f"cache {path} has format {meta.get('format')!r} version {meta.get('version')!r}; "
            f"this fleetfeed reads {FORMAT!r} version {VERSION}: delete it and load again"
        )
    problem = _metadata_problem(meta, batches)
    if problem is not None:
        raise CacheError(f"cache {path} is corrupt: its metadata {problem}")
    return meta


def _metadata_problem(meta: dict[str, Any], batches: int) -> str | None:
    def is_count(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    shapes = {"slots": list, "sources": list, "per_file": list, "uniform_widths": list}
    for key, kind in shapes.items():
        if not isinstance(meta.get(key), kind):
            return f"has {key!r} = {meta.get(key)!r:.80}, expected a list"
    if not all(isinstance(s, str) for s in meta["slots"]):
        return "has slots that are not strings"
    for source in meta["sources"]:
        if not (isinstance(source, dict) and isinstance(source.get("path"), str)
                and is_count(source.get("size")) and isinstance(source.get("mtime_ns"), int)):
            return f"has a source {source!r:.120}, expected a path, a size and an mtime_ns"
    if not all(isinstance(f, dict) for f in meta["per_file"]):
        return "has per_file entries that are not objects"
    widths, slots = meta["uniform_widths"], len(meta["slots"])
    if len(widths) != batches or not all(
        isinstance(w, list) and len(w) == slots and all(is_count(x) for x in w) for w in widths
    ):
        return (
            f"has uniform_widths for {len(widths)} record batches, expected {batches} lists "
            f"of {slots} counts"
        )
    if not is_count(meta.get("records")):
        return f"has records = {meta.get('records')!r:.80}, expected a count"
    return None


def _check_fresh(
    path: str,
    meta: dict[str, Any],
    schema: SlotSchema,
    filelist: Sequence[str] | None,
    reader_settings: dict[str, Any],
    stat: Callable[[str], SourceFile],
) -> None:
    """Raises CacheError naming the first difference between the cache and now."""
    advice = f"delete {path} (or point the cache elsewhere) and load from the files"
    declared = [str(slot) for slot in schema]
    if meta["slots"] != declared:
        raise CacheError(
            f"stale cache {path}: it holds slots [{', '.join(meta['slots'])}] but use_var "
            f"declares [{', '.join(declared)}]; {advice}"
        )
    recorded_reader = meta.get("reader")
    if not isinstance(recorded_reader, dict):
        raise CacheError(
            f"stale cache {path}: it does not record the reader settings that made its "
            f"records (written by an earlier fleetfeed); {advice}"
        )
    settings = {k: v for k, v in reader_settings.items() if k != READER_CODE}
    # Before split_files, every reader's large files were read as byte ranges.
    recorded_settings = {"split_files": True, **{
        k: v for k, v in recorded_reader.items() if k != READER_CODE}}
    changed = [f"{name} {recorded_settings.get(name)!r:.200} -> {value!r:.200}"
               for name, value in settings.items() if recorded_settings.get(name) != value]
    if not changed and recorded_settings != settings:
        changed = ["other settings"]
    code_then, code_now = recorded_reader.get(READER_CODE), reader_settings.get(READER_CODE, {})
    if code_then is None:
        logger.warning(
            "cache %s does not record its reader's code (written by an earlier fleetfeed): "
            "an edit of the reader since it was made goes unseen; delete it to have one that "
            "does", path,
        )
    elif not isinstance(code_then, dict):
        changed.append(f"{READER_CODE} {code_then!r:.80}, expected an object")
    else:
        # Files present both times only: one that came or went since is a
        # command's output more often than its code.
        edited = sorted(k for k in code_then.keys() & code_now.keys()
                        if code_then[k] != code_now[k])
        if edited:
            changed.append(f"the reader's code: {', '.join(edited)} changed since")
    if changed:
        raise CacheError(
            f"stale cache {path}: its records were made with other reader settings "
            f"({'; '.join(changed)}); {advice}"
        )
    recorded = [s["path"] for s in meta["sources"]]
    if filelist:
        wanted = [source_key(p) for p in filelist]
        if wanted != recorded:
            extra = [p for p in wanted if p not in recorded]
            missing = [p for p in recorded if p not in wanted]
            detail = (
                f"files not in the cache: {', '.join(extra) or 'none'}; "
                f"cached files not in the filelist: {', '.join(missing) or 'none'}"
            )
            if not extra and not missing:
                detail = "the same files in another order"
            raise CacheError(
                f"stale cache {path}: it was made from another file list ({detail}); {advice}"
            )
    for source in meta["sources"]:
        try:
            now = stat(source["path"])
        except FileNotFoundError:
            raise CacheError(
                f"stale cache {path}: its source {source['path']} no longer exists; {advice}"
            ) from None
        if now.size != source["size"] or now.mtime_ns != source["mtime_ns"]:
            raise CacheError(
                f"stale cache {path}: source {source['path']} changed since the cache was "
                f"made (size {source['size']} -> {now.size} bytes, mtime "
                f"{_when(source['mtime_ns'])} -> {_when(now.mtime_ns)}); {advice}"
            )


def _when(mtime_ns: int) -> str:
    seconds, rest = divmod(mtime_ns, 10**9)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds)) + f".{rest:09d}"

