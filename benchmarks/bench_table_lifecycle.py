"""Sparse-table lifecycle costs, in one process (docs/table_lifecycle.md).

A table of ``--rows`` ids (dim 8, Adagrad): rows/s of a training pull and of a
push of ``--batch`` random existing ids (median of 5 rounds of 60 batches),
bytes per row (allocated), and the time of a shrink that drops half the rows
(the index rebuild included) and of a budget's eviction; with ``--saves``, the
time of a base save and of a delta save (after 1% of the rows changed), of
loading the base then the delta into a fresh table, their bytes on disk, and
the process's resident memory growth per row of the table (VmRSS).

    python benchmarks/bench_table_lifecycle.py [--rows 1000000] [--saves]
    python benchmarks/bench_table_lifecycle.py --sweep 100000000

``--sweep ROWS`` grows one table from 1M rows to ROWS and prints its resident
memory growth per row at every size 10% apart, and the worst over the best.

``--paddle-python .venv-paddle30/bin/python`` (``make bench-paddle-ps``) also
runs Paddle 3.0.0's parameter server (``benchmarks/paddle_table_memory.py``):
one server, one worker pulling and pushing the same number of distinct ids
through a ``memory_sparse_table`` of dim 8 with Adagrad, and reports the
server's resident memory growth per row beside ours, measured the same way
(``benchmarks/fleetfeed_table_memory.py``: our server process).

Each side is checked before it reports: our table must hold ``--rows`` rows
(``len`` and ``stats()``), Paddle's server must report as many
(paddle_table_memory.py fails otherwise), and the loaded checkpoint as many
rows as the saved table. The figures, with the commit, the load average and
the command, replace this script's section of benchmarks/RESULTS.md and,
when Paddle was measured, the ``table_memory`` block of
docs/table_lifecycle.md (``--no-write``: print only).

Run it with another checkout first on ``PYTHONPATH`` to measure that code (a
table without ``stats()`` is measured for pull and push only, and nothing is
written).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

if not any(Path(p, "trainer").is_dir() for p in sys.path[1:] if p):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import results_file
import torch
from process_memory import read_status_kb

from datafeed.records.memory import release_free_memory
from trainer.ps.checkpoint import directory as checkpoint
from trainer.ps.checkpoint import table_files
from trainer.ps.tables.optim import OptimizerSpec
from trainer.ps.tables.table import SparseTable

DIM = 8
DOC = Path(__file__).resolve().parent.parent / "docs" / "table_lifecycle.md"
MB = 1e6


def rate(run, batches, grads) -> float:
    """Median rows/s of ``run(ids, grads)`` over the batches, 5 rounds."""
    rounds = []
    for _ in range(5):
        start, rows = time.perf_counter(), 0
        for ids, grad in zip(batches, grads, strict=True):
            run(ids, grad)
            rows += ids.shape[0]
        rounds.append(rows / (time.perf_counter() - start))
    return float(np.median(rounds))


def rss() -> int:
    """This process's resident memory in bytes (VmRSS)."""
    return read_status_kb("VmRSS")


def save(table: SparseTable, dirname: str, kind: str) -> float:
    """Seconds to write ``table`` as a one-server checkpoint of ``kind``."""
    start = time.perf_counter()
    staging = checkpoint.staging_dir(dirname)
    table_files.write_shard(table, staging, 0, delta=kind == "delta")
    meta = {"format": checkpoint.FORMAT, "kind": kind, "save_id": uuid.uuid4().hex,
            "after": None, "server_num": 1, "mode": "local",
            "tables": {table.name: {"dim": DIM}}, "dense": []}
    checkpoint.commit(staging, dirname, meta)
    return time.perf_counter() - start


def load(table: SparseTable, dirname: str) -> float:
    """Seconds to check and load the checkpoint in ``dirname`` into ``table``."""
    start = time.perf_counter()
    meta = checkpoint.read_meta(dirname)
    table_files.load_tables(table_files.read_tables(dirname, meta, {table.name: table}))
    return time.perf_counter() - start


def disk_bytes(dirname: str) -> int:
    return sum(p.stat().st_size for p in Path(dirname).glob("sparse.*"))


def saves(table: SparseTable, ids: np.ndarray) -> dict:
    """Base and delta save and load times (``--saves``)."""
    work = tempfile.mkdtemp(prefix="bench-saves-")
    try:
        base, delta = f"{work}/base", f"{work}/delta"
        base_s = save(table, base, "base")
        changed = ids[:: 100]
        table.pull(changed, create=True)
        delta_s = save(table, delta, "delta")
        fresh = SparseTable("bench", DIM, OptimizerSpec("adagrad", {"lr": 0.05}))
        load_base_s = load(fresh, base)
        load_delta_s = load(fresh, delta)
        if len(fresh) != len(table):
            raise SystemExit(f"the loaded table holds {len(fresh)} rows, not {len(table)}")
        figures = {"base_s": base_s, "disk_bytes_per_row": disk_bytes(base) / len(table),
                   "delta_rows": int(changed.shape[0]), "delta_s": delta_s,
                   "load_base_s": load_base_s, "load_delta_s": load_delta_s}
        print(f"save base: {base_s:.2f} s ({figures['disk_bytes_per_row']:.1f} bytes/row on "
              f"disk); save delta of {changed.shape[0]} rows: {delta_s:.3f} s; load base: "
              f"{load_base_s:.2f} s; load delta: {load_delta_s:.3f} s")
        return figures
    finally:
        shutil.rmtree(work, ignore_errors=True)


def paddle(python: str, rows: int) -> dict:
    """Paddle 3.0.0's server memory growth per row, by paddle_table_memory.py
    (which fails unless the server holds all ``rows``); ``{"failure": ...}``
    when it failed."""
    script = Path(__file__).resolve().parent / "paddle_table_memory.py"
    load = results_file.load_average()
    result = subprocess.run([python, str(script), str(rows)], capture_output=True, text=True,
                            timeout=3600, check=False)
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("{")]
    if result.returncode or not lines:
        failure = result.stderr.strip().splitlines()[-1:] or ["no output"]
        print(f"paddle: failed (exit {result.returncode}): {result.stderr[-2000:]}")
        return {"failure": f"exit {result.returncode}: {failure[0]}"}
    figures = json.loads(lines[-1])
    if figures.get("rows_held") != rows:
        raise SystemExit(f"Paddle's table holds {figures.get('rows_held')} rows, not {rows}")
    figures.update(bytes_per_row=figures["growth"] / rows, load=load)
    print(f"paddle 3.0.0 memory_sparse_table ({figures['accessor']}, dim {DIM}, adagrad): "
          f"{rows} ids pulled and pushed, {figures['rows_held']} rows held, server RSS "
          f"growth {figures['bytes_per_row']:.1f} bytes/row, in {figures['seconds']:.1f} s")
    return figures


def server_process(rows: int) -> dict:
    """Our table's memory per row as a server process, by fleetfeed_table_memory.py
    (Paddle's procedure: one server, one worker; fails unless the server holds
    all ``rows``)."""
    script = Path(__file__).resolve().parent / "fleetfeed_table_memory.py"
    result = subprocess.run([sys.executable, str(script), str(rows)], capture_output=True,
                            text=True, timeout=3600, check=False)
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("{")]
    if result.returncode or not lines:
        raise SystemExit(f"fleetfeed_table_memory.py failed (exit {result.returncode}): "
                         f"{result.stderr[-2000:]}")
    figures = json.loads(lines[-1])
    figures["bytes_per_row"] = figures["growth"] / rows
    print(f"fleetfeed server process: {rows} ids pulled and pushed, {figures['rows_held']} "
          f"rows held, server RSS growth {figures['bytes_per_row']:.1f} bytes/row")
    return figures


def report(args: argparse.Namespace, ours: dict, theirs: dict | None) -> str:
    """This script's section of benchmarks/RESULTS.md."""
    lines = [
        f"## Sparse table lifecycle and memory per row (bench_table_lifecycle.py, "
        f"{args.rows:,} rows)",
        "",
        f"`{results_file.command()}` at {ours['commit']}; one process, "
        f"{os.cpu_count()} cores shared with other work, 1-minute load average "
        f"{ours['load']:.2f} when our table was built. One table of {args.rows:,} ids, "
        f"dim {DIM}, Adagrad (per-element sums); the table was checked to hold "
        f"{ours['rows']:,} rows.",
        "",
        "| what | figure |",
        "|---|---|",
        f"| pull / push ({args.batch}-id batches, median of 5 rounds) | "
        f"{ours['pull'] / 1e6:.1f} M / {ours['push'] / 1e6:.1f} M rows/s |",
        f"| bytes per row, allocated (`table_stats`) | {ours['allocated_per_row']:.1f} |",
        f"| resident memory growth per row (VmRSS) | {ours['rss_per_row']:.1f} |",
        f"| of which the id index (allocated) | {ours['index_per_row']:.1f} |",
    ]
    if "saves" in ours:
        saved = ours["saves"]
        lines += [
            f"| save base (Arrow IPC, {saved['disk_bytes_per_row']:.1f} bytes/row on disk) | "
            f"{saved['base_s']:.2f} s |",
            f"| save delta ({saved['delta_rows']:,} changed rows) | {saved['delta_s']:.3f} s |",
            f"| load base into a fresh table (every batch checked first) | "
            f"{saved['load_base_s']:.2f} s |",
            f"| load delta | {saved['load_delta_s']:.3f} s |",
        ]
    lines += [
        f"| shrink dropping {ours['dropped']:,} of {args.rows:,} rows | "
        f"{ours['shrink_s']:.3f} s |",
        f"| budget eviction of {ours['evicted']:,} rows | {ours['evict_s']:.3f} s |",
    ]
    if theirs is not None:
        lines += ["", paddle_paragraph(args.rows, ours, theirs)]
    return "\n".join(lines) + "\n"


def paddle_paragraph(rows: int, ours: dict, theirs: dict) -> str:
    """Paddle's memory per row beside ours, as measured (both tables checked full)."""
    if "failure" in theirs:
        return f"Paddle 3.0.0 (`benchmarks/paddle_table_memory.py`): failed, {theirs['failure']}."
    ratio = ours["rss_per_row"] / theirs["bytes_per_row"]
    server = ours["server"]
    server_ratio = server["bytes_per_row"] / theirs["bytes_per_row"]
    return (
        f"Paddle 3.0.0 (`benchmarks/paddle_table_memory.py`, `.venv-paddle30`): one server "
        f"and one worker; `memory_sparse_table` with `{theirs['accessor']}` and "
        f"`SparseAdaGradSGDRule` (embedding of dim {DIM}), ids 0..{rows - 1:,} pulled and "
        f"pushed once in steps of 100,000, the client flushed, the server checked to hold "
        f"{theirs['rows_held']:,} rows (1-minute load average {theirs['load']:.2f}): its "
        f"VmRSS grew {theirs['growth'] / MB:,.1f} MB, **{theirs['bytes_per_row']:.1f} bytes "
        f"per row** ({theirs['seconds']:.1f} s). Ours: **{ours['rss_per_row']:.1f} bytes per "
        f"row**, {ratio:.2f}x Paddle's (our table in one process; ours keeps a per-element "
        f"Adagrad sum, {4 * DIM} bytes a row, where Paddle's rule keeps one per row). As a "
        f"server process the same way (`benchmarks/fleetfeed_table_memory.py`: one server, "
        f"one worker, the same ids in the same steps, {server['rows_held']:,} rows held): "
        f"**{server['bytes_per_row']:.1f} bytes per row, {server_ratio:.2f}x Paddle's**."
    )


def write(args: argparse.Namespace, ours: dict, theirs: dict | None) -> None:
    """The figures into benchmarks/RESULTS.md and, with Paddle's, the docs."""
    results_file.write_section("table_lifecycle", report(args, ours, theirs))
    if theirs is None or "failure" in theirs:
        return
    results_file.write_section("table_memory", (
        f"At {args.rows:,} ids a server process's resident memory grows "
        f"{ours['server']['bytes_per_row']:.1f} bytes per row against "
        f"{theirs['bytes_per_row']:.1f} for Paddle 3.0.0's own sparse table on the same ids "
        f"({ours['server']['bytes_per_row'] / theirs['bytes_per_row']:.2f}x), both measured "
        f"the same way and checked to hold every row; our table alone, in one process, "
        f"{ours['rss_per_row']:.1f} (`{results_file.command()}` at {ours['commit']}, "
        f"1-minute load average {ours['load']:.2f}; `benchmarks/RESULTS.md`)."
    ), DOC)


def sweep(largest: int) -> dict:
    """Resident memory growth per row of one table grown from 1M rows to
    ``largest`` in steps of 10%: each size's figure, and the largest over
    the smallest."""
    sizes, size = [], 1_000_000
    while size <= largest:
        sizes.append(size)
        size = int(size * 1.1)
    ids = np.arange(sizes[-1], dtype=np.int64) * 2654435761 + 7
    before = rss()
    table = SparseTable("sweep", DIM, OptimizerSpec("adagrad", {"lr": 0.05}))
    per_row, done = {}, 0
    for size in sizes:
        for start in range(done, size, 100_000):
            table.pull(ids[start:min(start + 100_000, size)], create=True)
        done = size
        if len(table) != size:
            raise SystemExit(f"the table holds {len(table)} rows, not {size}")
        # This loop's own pull temporaries stay in glibc's heap until given
        # back; given back, what remains is the table (it gives back what its
        # own growth frees). Unreturned, they were 20-30 bytes a row at 1M rows.
        release_free_memory()
        per_row[size] = (rss() - before) / size
        print(f"  {size:>12,} rows: {per_row[size]:.1f} bytes/row", flush=True)
    best, worst = min(per_row.values()), max(per_row.values())
    print(f"sweep 1M..{sizes[-1]:,} rows: {best:.1f}-{worst:.1f} bytes/row, "
          f"worst/best {worst / best:.2f}")
    return {"per_row": per_row, "best": best, "worst": worst}


def sweep_report(args: argparse.Namespace, figures: dict, commit: str, load: float) -> str:
    """The sweep's section of benchmarks/RESULTS.md."""
    per_row = figures["per_row"]
    largest = max(per_row)
    return (
        f"## Sparse table memory per row from 1M to {largest:,} rows "
        f"(bench_table_lifecycle.py --sweep)\n\n"
        f"`{results_file.command()}` at {commit}, 1-minute load average {load:.2f}: one "
        f"table (dim {DIM}, Adagrad with per-element sums) grown by training pulls of "
        f"100,000 ids, its process's resident memory growth per row at every size 10% "
        f"apart, after the process gave its free heap back to the OS (`malloc_trim`: the "
        f"loop's pull temporaries, which glibc keeps), each size checked to be held. "
        f"Best {figures['best']:.1f}, worst {figures['worst']:.1f} "
        f"bytes per row: **worst/best {figures['worst'] / figures['best']:.2f}**.\n\n"
        "| rows | bytes per row |\n|---:|---:|\n"
        + "".join(f"| {size:,} | {value:.1f} |\n" for size, value in per_row.items())
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=8192)
    parser.add_argument("--saves", action="store_true", help="time base and delta saves")
    parser.add_argument("--paddle-python", help="Paddle 3.0.0's python: measure its table too")
    parser.add_argument("--no-write", action="store_true", help="print the figures only")
    parser.add_argument("--sweep", type=int, metavar="ROWS",
                        help="only the memory per row from 1M rows to ROWS, 10%% apart")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.sweep:
        commit, load = results_file.commit(), results_file.load_average()
        figures = sweep(args.sweep)
        if not args.no_write:
            results_file.write_section("table_memory_sweep",
                                       sweep_report(args, figures, commit, load))
        return
    ours = {"commit": results_file.commit(), "load": results_file.load_average()}
    # The ids exist before the baseline: the growth is the table's alone.
    ids = np.arange(args.rows, dtype=np.int64) * 2654435761 + 7
    before = rss()
    table = SparseTable("bench", DIM, OptimizerSpec("adagrad", {"lr": 0.05}))
    for start in range(0, args.rows, 100_000):
        table.pull(ids[start:start + 100_000], create=True)
    grown = rss() - before
    if len(table) != args.rows:
        raise SystemExit(f"the table holds {len(table)} rows, not {args.rows}")
    rng = np.random.default_rng(0)
    batches = [np.unique(ids[rng.integers(0, args.rows, args.batch)]) for _ in range(60)]
    grads = [torch.randn(b.shape[0], DIM) for b in batches]
    ours["pull"] = rate(lambda b, g: table.pull(b, create=True), batches, grads)
    ours["push"] = rate(lambda b, g: table.push(b, g), batches, grads)
    print(f"{args.rows} rows, dim {DIM}, adagrad: pull {ours['pull'] / 1e6:.2f} M rows/s, "
          f"push {ours['push'] / 1e6:.2f} M rows/s")
    if not hasattr(table, "stats"):
        return
    stats = table.stats()
    if stats["rows"] != args.rows:
        raise SystemExit(f"table_stats counts {stats['rows']} rows, not {args.rows}")
    ours.update(rows=stats["rows"], allocated_per_row=stats["bytes"] / stats["rows"],
                rss_per_row=grown / stats["rows"],
                index_per_row=table._index.cells.nbytes / stats["rows"])
    print(f"bytes per row (allocated): {ours['allocated_per_row']:.1f}; resident memory "
          f"growth: {ours['rss_per_row']:.1f}")
    if args.saves:
        ours["saves"] = saves(table, ids)
    theirs = paddle(args.paddle_python, args.rows) if args.paddle_python else None
    if theirs is not None:
        ours["server"] = server_process(args.rows)
    table.set_pass(1)
    table.pull(ids[: args.rows // 2], create=True)
    table.set_pass(3)
    table.accessor = type(table.accessor)(delete_after_unseen_days=2)
    start = time.perf_counter()
    ours["dropped"], kept = table.shrink()
    ours["shrink_s"] = time.perf_counter() - start
    if ours["dropped"] + kept != args.rows or len(table) != kept:
        raise SystemExit(f"shrink dropped {ours['dropped']} and kept {kept} of {args.rows}")
    print(f"shrink: dropped {ours['dropped']}, kept {kept} rows in {ours['shrink_s']:.3f} s")
    budget = SparseTable("budget", DIM, OptimizerSpec("adagrad", {"lr": 0.05}),
                         max_rows=args.rows)
    budget.pull(ids, create=True)
    start = time.perf_counter()
    budget.pull(ids[:1] + 1, create=True)  # one new id: evicts a sixteenth
    ours["evict_s"] = time.perf_counter() - start
    ours["evicted"] = budget.stats()["evicted"]
    if len(budget) > args.rows:
        raise SystemExit(f"the budget's table holds {len(budget)} rows, past {args.rows}")
    print(f"budget eviction of {ours['evicted']} rows: {ours['evict_s']:.3f} s")
    if not args.no_write:
        write(args, ours, theirs)


if __name__ == "__main__":
    main()
