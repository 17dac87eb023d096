"""Sparse table files of a checkpoint: Arrow IPC, readable without a running job.

A checkpoint (``trainer.ps.checkpoint``; format ``fleetfeed-ps/2`` in its
``meta.json``) holds, per table and per server that wrote it::

    sparse.<table>.shard<i>.arrow           the rows (base: all; delta: changed)
    sparse.<table>.shard<i>.dropped.arrow   delta only: ids dropped since the last save

Each is an Arrow IPC file (``pyarrow.ipc.open_file``) of record batches of at
most ``CHUNK_ROWS`` rows. The rows file's columns (``TABLE_FORMAT_VERSION`` 1):

=================  ===================================  =============================
column             type                                 what
=================  ===================================  =============================
id                 uint64                               the row's id (hashed, ps/ids)
weights            fixed_size_list<float32>[dim]        the row
state.<key>        fixed_size_list<float32>[dim] or     the optimizer's state of the
                   float32 (one per row)                row: Adagrad ``sum``; Adam
                                                        ``exp_avg``, ``exp_avg_sq``,
                                                        ``step``; none for SGD
show, click        float32                              the row's statistics
last_seen_pass     int64                                the pass it was last pulled in
=================  ===================================  =============================

The dropped file has the one column ``id``. Both carry schema metadata (UTF-8):
``fleetfeed.table_format`` ("1"), ``table``, ``dim``, ``optimizer`` (its kind),
``kind`` (``base`` or ``delta``), ``pass`` (the table's pass when saved),
``shard`` and ``content`` (``rows`` or ``dropped``).

A save streams each table: the table hands out slices of its own arrays under
its lock (``SparseTable.export_rows``) and each becomes one record batch, so a
save holds no second copy of the table. A load opens every file (memory
mapped), checks its schema and metadata and fully validates every batch
(``RecordBatch.validate(full=True)``, no nulls, distinct ids in a batch of rows, the
CRC-32 of its values that each batch carries in its custom metadata, since Arrow
keeps no checksum) before any table changes; then deletes the dropped ids and writes the rows.

``python -m trainer.ps.checkpoint.table_files DIR`` prints each table's rows, dim and
statistics; ``read_table(DIR, name)`` yields its rows as numpy columns.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from datafeed.records.arrow import file_problem
from datafeed.source.fs import sync_to_disk

from ...job.errors import CheckpointError
from ..tables.describe import describe_value
from ..tables.optim import OptimizerSpec
from . import directory as checkpoint

__all__ = [
    "CHUNK_ROWS",
    "TABLE_FORMAT_VERSION",
    "batch_crc32",
    "ShardFile",
    "dropped_file",
    "main",
    "open_shard",
    "read_table",
    "read_tables",
    "rows_file",
    "summary",
    "write_shard",
]

TABLE_FORMAT_VERSION = "1"
# The widest row a table file may declare: far above any embedding (Paddle's
# reach 512), far below what would overflow a schema's list sizes.
MAX_DIM = 1 << 20
CHUNK_ROWS = 1 << 14  # rows per Arrow batch: a save holds a few batches at a time
_META_KEYS = ("fleetfeed.table_format", "table", "dim", "optimizer", "kind", "pass", "shard",
              "content")
_STAT_FIELDS = [("show", pa.float32()), ("click", pa.float32()),
                ("last_seen_pass", pa.int64())]


def rows_file(dirname: str, table: str, shard: int) -> str:
    """The path of server ``shard``'s rows of ``table``."""
    return os.path.join(dirname, f"sparse.{table}.shard{shard}.arrow")


def dropped_file(dirname: str, table: str, shard: int) -> str:
    """The path of server ``shard``'s ids of ``table`` dropped since the last save."""
    return os.path.join(dirname, f"sparse.{table}.shard{shard}.dropped.arrow")


def _state_widths(optimizer: str, dim: int) -> dict[str, int]:
    """Each per-row optimizer state column's width (0: one float per row)."""
    try:
        spec = OptimizerSpec(optimizer, {})
    except ValueError:  # not a kind this version knows: no state columns expected
        return {}
    return {key: (shape(dim) or (0,))[0] for key, (shape, _) in spec.state_layout().items()}


def _rows_schema(dim: int, optimizer: str, metadata: Mapping[str, str]) -> pa.Schema:
    fields = [pa.field("id", pa.uint64(), nullable=False),
              pa.field("weights", pa.list_(pa.float32(), dim), nullable=False)]
    for key, width in _state_widths(optimizer, dim).items():
        kind = pa.list_(pa.float32(), width) if width else pa.float32()
        fields.append(pa.field("state." + key, kind, nullable=False))
    fields += [pa.field(name, kind, nullable=False) for name, kind in _STAT_FIELDS]
    return pa.schema(fields, metadata=dict(metadata))


def _dropped_schema(metadata: Mapping[str, str]) -> pa.Schema:
    return pa.schema([pa.field("id", pa.uint64(), nullable=False)], metadata=dict(metadata))


def _column(values: np.ndarray, kind: pa.DataType) -> pa.Array:
    """An Arrow array over ``values`` (no copy for a contiguous slice)."""
    flat = pa.array(np.ascontiguousarray(values).reshape(-1), type=pa.float32()) if isinstance(
        kind, pa.FixedSizeListType) else None
    if flat is not None:
        return pa.FixedSizeListArray.from_arrays(flat, kind.list_size)
    return pa.array(values, type=kind)


# -- writing ------------------------------------------------------------------------


def write_shard(table: Any, dirname: str, shard: int, *, delta: bool,
                chunk_rows: int = CHUNK_ROWS) -> bool:
    """Writes ``table`` (a ``SparseTable``, server ``shard``'s part) into
    ``dirname``: its rows file, and for a ``delta`` only the rows changed since
    the last save plus the dropped-ids file. Marks the rows saved. Returns
    whether the table had not changed since its last save or load."""
    kind = "delta" if delta else "base"
    path = rows_file(dirname, table.name, shard)
    metadata = {"fleetfeed.table_format": TABLE_FORMAT_VERSION, "table": table.name,
                "dim": str(table.dim), "kind": kind, "shard": str(shard), "content": "rows"}
    sink = pa.OSFile(path, "wb")
    opened: list[Any] = []  # the writer and its schema, once the header is known

    def begin(header: dict[str, Any]) -> None:
        metadata.update(optimizer=header["optimizer"], **{"pass": str(header["pass"])})
        schema = _rows_schema(table.dim, header["optimizer"], metadata)
        opened.extend([pa.ipc.new_file(sink, schema), schema])

    def write(columns: dict[str, np.ndarray]) -> None:
        schema = opened[1]
        arrays = [_column(columns["ids" if f.name == "id" else f.name], f.type) for f in schema]
        _write_batch(opened[0], pa.RecordBatch.from_arrays(arrays, schema=schema))

    try:
        dropped, unchanged = table.export_rows(begin, write, delta=delta, chunk_rows=chunk_rows)
        opened[0].close()
    finally:
        sink.close()
    sync_to_disk(path)  # on disk before the checkpoint that holds it is committed
    if delta:
        metadata["content"] = "dropped"
        schema = _dropped_schema(metadata)
        path = dropped_file(dirname, table.name, shard)
        with pa.OSFile(path, "wb") as out, pa.ipc.new_file(out, schema) as writer:
            for start in range(0, dropped.shape[0], chunk_rows):
                part = pa.array(dropped[start:start + chunk_rows], type=pa.uint64())
                _write_batch(writer, pa.RecordBatch.from_arrays([part], schema=schema))
        sync_to_disk(path)
    return unchanged


def _write_batch(writer: Any, batch: pa.RecordBatch) -> None:
    writer.write_batch(batch, custom_metadata={"crc32": str(batch_crc32(batch))})


def batch_crc32(batch: pa.RecordBatch) -> int:
    """A CRC-32 of the values of every column (Arrow itself keeps no checksum)."""
    crc = 0
    for column in batch.columns:
        values = column.flatten() if isinstance(column.type, pa.FixedSizeListType) else column
        crc = zlib.crc32(memoryview(np.ascontiguousarray(values.to_numpy())).cast("B"), crc)
    return crc


# -- reading ------------------------------------------------------------------------


@dataclass
class ShardFile:
    """One checked table file: its path, metadata and open reader."""

    path: str
    table: str
    dim: int
    optimizer: str
    kind: str
    pass_id: int
    content: str
    reader: pa.ipc.RecordBatchFileReader

    @property
    def rows(self) -> int:
        """Rows (or dropped ids) in the file."""
        return sum(self.reader.get_batch(i).num_rows for i in range(self.reader.num_record_batches))

    def batches(self) -> Iterator[dict[str, Any]]:
        """Each record batch as numpy columns (``saved_rows``' names; ``ids``
        writable copies, the rest views of the mapped file), with ``pass`` and
        ``optimizer``; a dropped file's as ``dropped`` ids."""
        for i in range(self.reader.num_record_batches):
            batch = self.reader.get_batch(i)
            ids = batch.column(0).to_numpy().copy()
            if self.content == "dropped":
                yield {"ids": ids[:0], "weights": np.zeros((0, self.dim), np.float32),
                       "dropped": ids}
                continue
            out: dict[str, Any] = {"ids": ids, "pass": self.pass_id, "optimizer": self.optimizer}
            for name, column in zip(batch.schema.names[1:], batch.columns[1:], strict=True):
                if isinstance(column.type, pa.FixedSizeListType):
                    out[name] = column.flatten().to_numpy().reshape(-1, column.type.list_size)
                else:
                    out[name] = column.to_numpy()
            yield out


def open_shard(path: str, *, table: str | None = None, dim: int | None = None) -> ShardFile:
    """Opens and checks the table file at ``path``: its schema and metadata
    (of ``table`` and ``dim`` where given) and every record batch, fully.

    Raises:
        CheckpointError: not an Arrow IPC file, another schema or metadata,
            an invalid batch, nulls, or an id twice in a batch.
    """

    def refuse(message: str) -> CheckpointError:
        return CheckpointError(f"{path}: {message}", path=path)

    try:
        return _open_checked(path, table, dim, refuse)
    except CheckpointError:
        raise
    except (OSError, UnicodeError, OverflowError, ValueError, pa.ArrowException) as error:
        raise refuse(f"expected a table file of this format, found {type(error).__name__}: "
                     f"{checkpoint.first_line(error)}") from None


def _open_checked(path: str, table: str | None, dim: int | None, refuse: Any) -> ShardFile:
    data = checkpoint.map_regular_file(path)
    # A compressed body would be inflated in memory before any check (an 18 KB
    # file of zstd costs GBs): refused from the message headers alone.
    problem = file_problem(data)
    if problem is not None:
        raise refuse(f"expected an Arrow IPC file of table rows (uncompressed), found {problem}")
    try:
        reader = pa.ipc.open_file(data)
    except (pa.ArrowException, ValueError) as error:
        raise refuse(f"expected an Arrow IPC file of table rows, found {type(error).__name__}: "
                     f"{checkpoint.first_line(error)}") from None
    raw = reader.schema.metadata or {}
    meta = {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in raw.items()}
    missing = [key for key in _META_KEYS if key not in meta]
    if missing:
        raise refuse(f"expected the schema metadata {list(_META_KEYS)}, missing {missing}")
    if meta["fleetfeed.table_format"] != TABLE_FORMAT_VERSION:
        raise refuse(f"expected table format {TABLE_FORMAT_VERSION!r}, found "
                     f"{describe_value(meta['fleetfeed.table_format'])}")
    numbers = {}
    for key in ("dim", "pass", "shard"):
        if not (meta[key].isascii() and meta[key].isdigit() and len(meta[key]) <= 18):
            raise refuse(f"metadata {key!r}: expected an int >= 0 (below 10**18), "
                         f"found {describe_value(meta[key])}")
        numbers[key] = int(meta[key])
    if numbers["dim"] > MAX_DIM:
        raise refuse(f"metadata 'dim': expected at most {MAX_DIM}, found {numbers['dim']}")
    if table is not None and meta["table"] != table:
        raise refuse(f"expected rows of table {table!r}, found {describe_value(meta['table'])}")
    if dim is not None and numbers["dim"] != dim:
        raise refuse(f"table {meta['table']!r}: expected rows of dim {dim} (the model's "
                     f"table), found dim {numbers['dim']}")
    if meta["kind"] not in ("base", "delta") or meta["content"] not in ("rows", "dropped"):
        raise refuse(f"expected kind base or delta and content rows or dropped, found "
                     f"{describe_value(meta['kind'])} and {describe_value(meta['content'])}")
    expected = (_dropped_schema(raw) if meta["content"] == "dropped"
                else _rows_schema(numbers["dim"], meta["optimizer"], raw))
    if not reader.schema.equals(expected):
        raise refuse(f"expected the columns {_describe(expected)}, found "
                     f"{_describe(reader.schema)}")
    shard = ShardFile(path, meta["table"], numbers["dim"], meta["optimizer"], meta["kind"],
                      numbers["pass"], meta["content"], reader)
    for i in range(reader.num_record_batches):
        _check_batch(shard, i, refuse)
    return shard


def _check_batch(shard: ShardFile, i: int, refuse: Any) -> None:
    try:
        batch, custom = shard.reader.get_batch_with_custom_metadata(i)
        batch.validate(full=True)
        crc = batch_crc32(batch)
    except (pa.ArrowException, ValueError) as error:
        raise refuse(f"record batch {i}: invalid ({type(error).__name__}: "
                     f"{checkpoint.first_line(error)})") from None
    saved = (custom or {}).get(b"crc32", b"").decode("ascii", "replace")
    if saved != str(crc):
        raise refuse(f"record batch {i}: expected the CRC-32 of its values {describe_value(saved)} "
                     f"(written with it), found {crc}: the file changed after it was written")
    nulls = [f.name for f, c in zip(batch.schema, batch.columns, strict=True) if c.null_count]
    if nulls:
        raise refuse(f"record batch {i}: expected no nulls, found some in {nulls}")
    # An id listed twice as dropped is deleted once (writers before 2026-11-28
    # listed an id each time it was dropped); one with two rows is ambiguous.
    ids = batch.column(0).to_numpy()
    if shard.content == "rows" and np.unique(ids).shape[0] != ids.shape[0]:
        raise refuse(f"record batch {i}: expected distinct ids, found an id twice")
    if shard.content == "rows" and batch.num_rows:
        seen = batch.column("last_seen_pass").to_numpy()
        if int(seen.min()) < 0 or int(seen.max()) > shard.pass_id:
            raise refuse(f"record batch {i}: 'last_seen_pass': expected 0 to {shard.pass_id} "
                         f"(the file's pass), found {int(seen.min())} to {int(seen.max())}")


def _describe(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name}: {f.type}{'' if f.nullable else ' not null'}" for f in schema)


def table_shards(dirname: str, meta: dict[str, Any], name: str) -> list[ShardFile]:
    """Every file of table ``name`` in the checkpoint, opened and checked:
    each shard's rows file, then (delta) each shard's dropped file."""
    dim = meta["tables"][name]["dim"]
    suffixes = [".arrow"] + ([".dropped.arrow"] if meta["kind"] == "delta" else [])
    out = []
    for suffix in suffixes:
        for path in checkpoint.shard_paths(dirname, f"sparse.{name}.shard", meta, suffix):
            shard = open_shard(path, table=name, dim=dim)
            if shard.kind != meta["kind"]:
                raise CheckpointError(f"{path}: expected a {meta['kind']} file (meta.json), "
                                      f"found a {shard.kind} file", path=path)
            out.append(shard)
    return out


def read_tables(
    dirname: str, meta: dict[str, Any], tables: Mapping[str, Any]
) -> list[tuple[Any, list[ShardFile]]]:
    """Every saved file of ``tables`` (``SparseTable`` by name), each checked
    against its table, dropped files first, before any is loaded.

    Raises:
        CheckpointError: a table of the model is not in the checkpoint, or has
            another ``dim`` there; a file is malformed, missing, or beyond
            ``meta.json``'s server_num.
    """
    saved = meta["tables"]
    out = []
    for name, table in tables.items():
        if name not in saved:
            raise CheckpointError(
                f"checkpoint {dirname!r} holds tables {describe_value(sorted(saved))}; the model's "
                f"table {name!r} is not among them",
                path=dirname,
            )
        if saved[name]["dim"] != table.dim:
            raise CheckpointError(
                f"checkpoint {dirname!r}: table {name!r} has rows of dim {saved[name]['dim']}, "
                f"the model's table has dim {table.dim}",
                path=dirname,
            )
        files = table_shards(dirname, meta, name)
        out.append((table, sorted(files, key=lambda f: f.content != "dropped")))
    return out


def load_tables(files: Sequence[tuple[Any, list[ShardFile]]],
                owns: Any = None) -> None:
    """Applies checked ``read_tables`` files: per table, the dropped ids, then
    the rows (only those where ``owns(ids)`` is true, when given); then marks
    every row saved, so that the next delta holds what changes after the load.
    A base replaces the table's rows: afterwards it holds the base's, and the
    deltas after it describe it (Paddle's load keeps rows the files lack)."""
    for table, shards in files:
        if any(shard.kind == "base" for shard in shards):
            table.clear_rows()
        for shard in shards:
            for columns in shard.batches():
                rows_to_load = None if owns is None or shard.content == "dropped" else owns(
                    columns["ids"])
                table.load_state_dict(columns, rows_to_load, where=shard.path)
        table.mark_saved()


def read_table(dirname: str, name: str) -> Iterator[dict[str, Any]]:
    """Table ``name``'s saved rows in checkpoint ``dirname``, record batch by
    record batch as numpy columns (``id``'s as ``ids``; a delta's dropped ids
    as ``dropped``), every file checked first; no job needed.

    Raises:
        FileNotFoundError: no checkpoint in ``dirname``.
        CheckpointError: no such table, or a file is malformed.
    """
    meta = checkpoint.read_meta(dirname)
    if name not in meta["tables"]:
        raise CheckpointError(f"checkpoint {dirname!r} holds tables "
                              f"{describe_value(sorted(meta['tables']))}, not {name!r}",
                              path=dirname)
    for shard in table_shards(dirname, meta, name):
        yield from shard.batches()


def summary(dirname: str) -> dict[str, Any]:
    """What ``main`` prints: the checkpoint's kind, and per table its rows
    (dropped ids for a delta), dim, optimizer, pass and statistics."""
    meta = checkpoint.read_meta(dirname)
    tables = {}
    for name in meta["tables"]:
        rows = dropped = 0
        show = click = 0.0
        passes: list[int] = []
        optimizer = ""
        for shard in table_shards(dirname, meta, name):
            optimizer = optimizer or shard.optimizer
            for columns in shard.batches():
                if "dropped" in columns:
                    dropped += columns["dropped"].shape[0]
                    continue
                rows += columns["ids"].shape[0]
                show += float(columns["show"].sum(dtype=np.float64))
                click += float(columns["click"].sum(dtype=np.float64))
                if columns["ids"].size:
                    passes += [int(columns["last_seen_pass"].min()),
                               int(columns["last_seen_pass"].max())]
        tables[name] = {"rows": rows, "dropped": dropped, "dim": meta["tables"][name]["dim"],
                        "optimizer": optimizer, "show": show, "click": click,
                        "last_seen_pass": [min(passes), max(passes)] if passes else None}
    return {"kind": meta["kind"], "server_num": meta["server_num"], "tables": tables}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trainer.ps.checkpoint.table_files DIR [--json]``: prints each table of
    the checkpoint in DIR: rows, dim, optimizer, show and click totals, and
    the passes its rows were last seen in. Exit status 1 for a bad checkpoint."""
    parser = argparse.ArgumentParser(prog="python -m trainer.ps.checkpoint.table_files",
                                     description=main.__doc__)
    parser.add_argument("dirname")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    try:
        info = summary(args.dirname)
    except (CheckpointError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(info, indent=1, sort_keys=True))
        return 0
    print(f"{args.dirname}: {info['kind']} checkpoint of {info['server_num']} server(s)")
    for name, t in info["tables"].items():
        extra = f", {t['dropped']} dropped ids" if info["kind"] == "delta" else ""
        print(f"  {name}: {t['rows']} rows{extra}, dim {t['dim']}, optimizer {t['optimizer']}, "
              f"show {t['show']:.0f}, click {t['click']:.0f}, last seen in passes "
              f"{t['last_seen_pass']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
