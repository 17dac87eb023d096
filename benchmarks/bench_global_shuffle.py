"""global_shuffle throughput and peak memory: 2 workers, gloo on 127.0.0.1.

Each worker holds ``--records`` Criteo-layout records (13 dense floats, 26
one-value uint64 slots, a label; about 268 bytes per record in memory), built
in memory so that the figure is the shuffle's alone. Prints records/s per
worker; the peak resident memory during the shuffle above the resident
memory before it, as a multiple of the worker's dataset size ("peak extra";
issue 4's goal: at most 1.5x); and the whole process's peak during the
shuffle over its resident size before it (VmHWM reset before the shuffle).

Usage: ``python benchmarks/bench_global_shuffle.py [--records N] [--workers W]
[--write]`` (``--write`` puts the table in benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import sys
import time
from pathlib import Path

import numpy as np
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from datafeed import Slot
from datafeed.config.slots import SlotSchema
from datafeed.records.columns import RecordChunk, SlotColumn
from datafeed.records.memory import release_free_memory
from datafeed.records.store import RecordStore
from datafeed.reorder.global_shuffle import global_shuffle

SCHEMA = SlotSchema(
    [Slot("dense_input", "float32", (13,))]
    + [Slot(f"C{i}", "uint64") for i in range(1, 27)]
    + [Slot("label", "int64", (1,))]
)


def make_store(rank: int, records: int, chunk_rows: int = 8192) -> RecordStore:
    rng = np.random.default_rng(rank)
    chunks = []
    for start in range(0, records, chunk_rows):
        n = min(chunk_rows, records - start)
        columns = [SlotColumn(rng.random(n * 13, dtype=np.float32), None, 13)]
        columns += [
            SlotColumn(rng.integers(0, 10**6, n, dtype=np.uint64), None, 1)
            for _ in range(26)
        ]
        columns.append(SlotColumn(rng.integers(0, 2, n, dtype=np.int64), None, 1))
        chunks.append(RecordChunk(tuple(columns), n))
    return RecordStore(SCHEMA, chunks)


def read_status_kb(field: str) -> int:
    """One ``kB`` field of /proc/self/status (``VmRSS``, ``VmHWM``) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field} field (not Linux?)")


def worker(rank: int, world: int, port: int, records: int, queue: mp.Queue) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )
    store = make_store(rank, records)
    size = store.nbytes
    release_free_memory()
    dist.barrier()
    resident = read_status_kb("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:  # VmHWM from here (Linux 4.0+)
        f.write("5")
    started = time.perf_counter()
    result, _ = global_shuffle(store, 7, threads=4)
    seconds = time.perf_counter() - started
    peak = read_status_kb("VmHWM")
    queue.put((rank, records, result.rows, seconds, size, peak - resident, resident, peak))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--records", type=int, default=1_000_000, help="records per worker"
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--no-write", action="store_true", help="print only; leave benchmarks/RESULTS.md alone"
    )
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=worker, args=(r, args.workers, port, args.records, queue))
        for r in range(args.workers)
    ]
    for p in procs:
        p.start()
    rows = sorted(queue.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(60)
    lines = [
        (
            f"# global_shuffle, {args.workers} workers on 127.0.0.1 (gloo), "
            f"{args.records:,} Criteo-layout records each"
        ),
        "",
        (
            "| rank | records in | records out | seconds | records/s | dataset MB | peak extra "
            "| resident before MiB | peak MiB | peak / resident |"
        ),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for rank, n, out, seconds, size, extra, resident, peak in rows:
        lines.append(
            f"| {rank} | {n:,} | {out:,} | {seconds:.2f} | {n / seconds:,.0f} | "
            f"{size / 1e6:.0f} | {extra / size:.2f}x | {resident / 2**20:.0f} "
            f"| {peak / 2**20:.0f} | {peak / resident:.2f}x |"
        )
    report = "\n".join(lines)
    print(report)
    if not args.no_write:
        from results_file import as_section, write_section

        write_section("global_shuffle", as_section(report))


if __name__ == "__main__":
    main()
