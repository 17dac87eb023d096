"""Sparse-table lifecycle costs, in one process (docs/table_lifecycle.md).

A table of ``--rows`` ids (dim 8, Adagrad): rows/s of a training pull and of a
push of ``--batch`` random existing ids (median of 5 rounds of 60 batches),
bytes per row (allocated), and the time of a shrink that drops half the rows
(the index rebuild included) and of a budget's eviction; with ``--saves``, the
time of a base save and of a delta save (after 1% of the rows changed), of
loading the base then the delta into a fresh table, their bytes on disk, and
the process's resident memory growth per row of the table (VmRSS).

    python benchmarks/bench_table_lifecycle.py [--rows 1000000] [--saves]

``--paddle-python .venv-paddle30/bin/python`` (``make bench-paddle-ps``) also
runs Paddle 3.0.0's parameter server (``benchmarks/paddle_table_memory.py``):
one server, one worker pulling and pushing the same number of distinct ids
through a ``memory_sparse_table`` of dim 8 with Adagrad, and reports the
server's resident memory growth per row.

Run it with another checkout first on ``PYTHONPATH`` to measure that code (a
table without ``stats()`` is measured for pull and push only).
"""

from __future__ import annotations

import argparse
import json
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
import torch

from trainer.ps.checkpoint import directory as checkpoint
from trainer.ps.checkpoint import table_files
from trainer.ps.tables.optim import OptimizerSpec
from trainer.ps.tables.table import SparseTable

DIM = 8


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
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


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


def saves(table: SparseTable, ids: np.ndarray) -> None:
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
        assert len(fresh) == len(table)
        print(f"save base: {base_s:.2f} s ({disk_bytes(base) / len(table):.1f} bytes/row on "
              f"disk); save delta of {changed.shape[0]} rows: {delta_s:.3f} s; load base: "
              f"{load_base_s:.2f} s; load delta: {load_delta_s:.3f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def paddle(python: str, rows: int) -> None:
    """Paddle 3.0.0's server memory growth per row, by paddle_table_memory.py."""
    script = Path(__file__).resolve().parent / "paddle_table_memory.py"
    result = subprocess.run([python, str(script), str(rows)], capture_output=True, text=True,
                            timeout=3600, check=False)
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("{")]
    if result.returncode or not lines:
        print(f"paddle: failed (exit {result.returncode}): {result.stderr[-2000:]}")
        return
    figures = json.loads(lines[-1])
    print(f"paddle 3.0.0 memory_sparse_table ({figures['accessor']}, dim {DIM}, adagrad): "
          f"{figures['rows']} ids pulled and pushed, server RSS growth "
          f"{figures['growth'] / figures['rows']:.1f} bytes/row, in {figures['seconds']:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=8192)
    parser.add_argument("--saves", action="store_true", help="time base and delta saves")
    parser.add_argument("--paddle-python", help="Paddle 3.0.0's python: measure its table too")
    args = parser.parse_args()
    torch.set_num_threads(1)
    before = rss()
    table = SparseTable("bench", DIM, OptimizerSpec("adagrad", {"lr": 0.05}))
    ids = np.arange(args.rows, dtype=np.int64) * 2654435761 + 7
    for start in range(0, args.rows, 100_000):
        table.pull(ids[start:start + 100_000], create=True)
    grown = rss() - before
    rng = np.random.default_rng(0)
    batches = [np.unique(ids[rng.integers(0, args.rows, args.batch)]) for _ in range(60)]
    grads = [torch.randn(b.shape[0], DIM) for b in batches]
    pull = rate(lambda b, g: table.pull(b, create=True), batches, grads)
    push = rate(lambda b, g: table.push(b, g), batches, grads)
    print(f"{args.rows} rows, dim {DIM}, adagrad: pull {pull / 1e6:.2f} M rows/s, "
          f"push {push / 1e6:.2f} M rows/s")
    if not hasattr(table, "stats"):
        return
    stats = table.stats()
    print(f"bytes per row (allocated): {stats['bytes'] / stats['rows']:.1f}; resident memory "
          f"growth: {grown / stats['rows']:.1f}")
    if args.saves:
        saves(table, ids)
    if args.paddle_python:
        paddle(args.paddle_python, args.rows)
    table.set_pass(1)
    table.pull(ids[: args.rows // 2], create=True)
    table.set_pass(3)
    table.accessor = type(table.accessor)(delete_after_unseen_days=2)
    start = time.perf_counter()
    dropped, kept = table.shrink()
    print(f"shrink: dropped {dropped}, kept {kept} rows in {time.perf_counter() - start:.3f} s")
    budget = SparseTable("budget", DIM, OptimizerSpec("adagrad", {"lr": 0.05}),
                         max_rows=args.rows)
    budget.pull(ids, create=True)
    start = time.perf_counter()
    budget.pull(ids[:1] + 1, create=True)  # one new id: evicts a sixteenth
    print(f"budget eviction of {budget.stats()['evicted']} rows: "
          f"{time.perf_counter() - start:.3f} s")


if __name__ == "__main__":
    main()
