"""global_shuffle throughput and peak memory: 2 workers, gloo on 127.0.0.1.

Each worker holds ``--records`` Criteo-layout records (13 dense floats, 26
one-value uint64 slots, a label; about 268 bytes per record in memory), built
in memory so that the figure is the shuffle's alone. Prints records/s per
worker; the peak resident memory during the shuffle above the resident
memory before it, as a multiple of the worker's dataset size ("peak extra";
issue 4's goal: at most 1.5x); and the whole process's peak during the
shuffle over its resident size before it (VmHWM reset before the shuffle).

With ``--paddle``, Paddle 3.0.0's own ``global_shuffle`` runs after each of
fleetfeed's runs on the same number of Criteo-layout records per worker,
loaded from MultiSlot files (``make_criteo.py``), 1 server + 2 workers on its
parameter server (``paddle_global_shuffle.py``; its global shuffle needs the
PS runtime, which later CPU builds lack). Paddle's records come from files, so
its table has no dataset size; resident and peak are measured as for fleetfeed.

Usage: ``python benchmarks/bench_global_shuffle.py [--records N] [--workers W]
[--repeats R] [--paddle] [--no-write]`` (without ``--no-write`` the table goes
into benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))  # sibling scripts

import results_file
from process_memory import read_status_kb

from datafeed import Slot
from datafeed.config.slots import SlotSchema
from datafeed.records.columns import RecordChunk, SlotColumn
from datafeed.records.memory import release_free_memory
from datafeed.records.store import RecordStore
from datafeed.reorder.global_shuffle import global_shuffle

PADDLE_PYTHON = HERE.parent / ".venv-paddle30" / "bin" / "python"

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


def run_fleetfeed(workers: int, records: int) -> list[tuple]:
    """One fleetfeed run: a row per rank (see ``worker``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=worker, args=(r, workers, port, records, queue))
        for r in range(workers)
    ]
    for p in procs:
        p.start()
    try:
        return sorted(queue.get(timeout=600) for _ in procs)
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
                p.join()


def run_paddle(paddle_python: str, files: list[list[str]], threads: int) -> list[dict]:
    """One Paddle run (1 server + 2 workers of paddle_global_shuffle.py): a
    result per worker."""
    from bench_ps import free_port, run_processes

    with tempfile.TemporaryDirectory(prefix="bench_global_shuffle_") as scratch:
        tmp = Path(scratch)
        config = {
            "workers": len(files), "threads": threads, "files": files,
            "servers": [f"127.0.0.1:{free_port()}"],
            "worker_endpoints": [f"127.0.0.1:{free_port()}" for _ in files],
            "out": str(tmp / "paddle.result"),
        }
        script = str(HERE / "paddle_global_shuffle.py")
        commands = [
            (f"paddle-global-shuffle.{role}{index}",
             [paddle_python, script, json.dumps({**config, "role": role, "index": index})])
            for role, index in [("server", 0)] + [("worker", i) for i in range(len(files))]
        ]
        run_processes(commands, tmp, server_stops_itself=False)
        return [json.loads(Path(f"{config['out']}.{i}").read_text()) for i in range(len(files))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--records", type=int, default=1_000_000, help="records per worker"
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1, help="runs per contender, alternating")
    parser.add_argument("--paddle", action="store_true", help="Paddle 3.0.0's side by side")
    parser.add_argument("--paddle-python", default=str(PADDLE_PYTHON))
    parser.add_argument(
        "--no-write", action="store_true", help="print only; leave benchmarks/RESULTS.md alone"
    )
    args = parser.parse_args()
    paddle_files: list[list[str]] = []
    if args.paddle:
        if args.workers != 2:
            parser.error("--paddle runs 2 workers")
        if not Path(args.paddle_python).exists():
            parser.error(f"--paddle-python {args.paddle_python}: no such interpreter "
                         "(make bench-paddle-ps)")
        from make_criteo import make_criteo

        paths = [str(p) for p in make_criteo(
            HERE / "data" / "criteo_global_shuffle", args.records * 2, 8, 0
        )]
        paddle_files = [paths[:4], paths[4:]]
    rows, paddle_runs = [], []
    for _ in range(args.repeats):
        rows += run_fleetfeed(args.workers, args.records)
        if args.paddle:
            paddle_runs.append(run_paddle(args.paddle_python, paddle_files, threads=2))
    loadavg = os.getloadavg()[0]
    lines = [
        (
            f"# global_shuffle, {args.workers} workers on 127.0.0.1 (gloo), "
            f"{args.records:,} Criteo-layout records each"
        ),
        "",
        (
            f"`python benchmarks/bench_global_shuffle.py --records {args.records} "
            f"--workers {args.workers} --repeats {args.repeats}"
            + (" --paddle" if args.paddle else "")
            + f"` at commit {results_file.commit()} on "
            f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC: "
            f"{args.repeats} run(s) per contender, alternating; 1-minute load "
            f"average {loadavg:.2f} at the end. fleetfeed's records are built in memory"
            + (
                "; Paddle 3.0.0's (1 server + 2 workers on its parameter server, "
                "`thread_num=2`) are loaded from MultiSlot files first" if args.paddle else ""
            )
            + ". Each row is one worker of one run."
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
    for run in paddle_runs:
        for rank, r in enumerate(run):
            lines.append(
                f"| Paddle {r['version']}, rank {rank} | {r['records_in']:,} "
                f"| {r['records_out']:,} | {r['seconds']:.2f} "
                f"| {r['records_in'] / r['seconds']:,.0f} | - | - "
                f"| {r['resident'] / 2**20:.0f} | {r['peak'] / 2**20:.0f} "
                f"| {r['peak'] / r['resident']:.2f}x |"
            )
    if paddle_runs:
        ours = statistics.median(n / seconds for _, n, _, seconds, *_ in rows)
        paddle_rows = [r for run in paddle_runs for r in run]
        theirs = statistics.median(r["records_in"] / r["seconds"] for r in paddle_rows)
        our_peak = statistics.median(p / res for *_, res, p in rows)
        their_peak = statistics.median(r["peak"] / r["resident"] for r in paddle_rows)
        lines += [
            "",
            f"Medians over every worker: fleetfeed {ours:,.0f} records/s, peak "
            f"{our_peak:.2f}x resident; Paddle {theirs:,.0f} records/s, peak "
            f"{their_peak:.2f}x resident; fleetfeed / Paddle {ours / theirs:.2f}x.",
            "",
            "Records kept: fleetfeed "
            f"{sum(out for _, _, out, *_ in rows):,} of {sum(n for _, n, *_ in rows):,}; "
            f"Paddle {sum(r['records_out'] for r in paddle_rows):,} of "
            f"{sum(r['records_in'] for r in paddle_rows):,} "
            f"({sum(r['records_out_later'] for r in paddle_rows):,} three seconds later: "
            "none was still in flight).",
        ]
    report = "\n".join(lines)
    print(report)
    if not args.no_write:
        results_file.write_section("global_shuffle", results_file.as_section(report))


if __name__ == "__main__":
    main()
