"""Sparse-table lifecycle costs, in one process (docs/table_lifecycle.md).

A table of ``--rows`` ids (dim 8, Adagrad): rows/s of a training pull and of a
push of ``--batch`` random existing ids (median of 5 rounds of 60 batches),
bytes per row (allocated), and the time of a shrink that drops half the rows
(the index rebuild included) and of a budget's eviction.

    python benchmarks/bench_table_lifecycle.py [--rows 1000000]

Run it with another checkout first on ``PYTHONPATH`` to measure that code (a
table without ``stats()`` is measured for pull and push only).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if not any(Path(p, "trainer").is_dir() for p in sys.path[1:] if p):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import torch

from trainer.ps.optim import OptimizerSpec
from trainer.ps.table import SparseTable

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=8192)
    args = parser.parse_args()
    torch.set_num_threads(1)
    table = SparseTable("bench", DIM, OptimizerSpec("adagrad", {"lr": 0.05}))
    ids = np.arange(args.rows, dtype=np.int64) * 2654435761 + 7
    for start in range(0, args.rows, 100_000):
        table.pull(ids[start:start + 100_000], create=True)
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
    print(f"bytes per row (allocated): {stats['bytes'] / stats['rows']:.1f}")
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
