"""Several parameter servers, and checkpoints of a large table.

1. bench_ps.py's wide&deep job (2 workers) with 1, 2 and 3 servers, the server
   counts alternating within every repeat; records/s per worker and worker CPU
   ms per batch, medians over repeats x workers, and each count's ratio to one
   server. All processes share this machine's cores, so more servers cannot add
   compute here: the figure shows what sharding costs (more messages per step),
   not what it gains on several machines.
2. The time to checkpoint and to restore a table of ``--rows`` rows (dim 8,
   Adagrad state) through the local runtime (``save_persistables`` /
   ``load_persistables``), and to re-shard it on load into a job of 3 servers
   (each server reads every shard and keeps its rows), medians of repeats.

Usage: python benchmarks/bench_ps_servers.py [--servers 1 2 3] [--repeats 3]
       [--records 10000] [--rows 1000000] [--no-write]
Results go to benchmarks/results/ps_servers.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import bench_ps  # noqa: E402 - the job and its data live there

RESULTS = HERE / "results" / "ps_servers.md"


def server_counts(args: argparse.Namespace) -> str:
    """The table of records/s by server count."""
    job_args = bench_ps.default_job_args(records=args.records, epochs=1)
    files = bench_ps.ensure_data(args.records)
    rates: dict[int, list[float]] = {}
    cpus: dict[int, list[float]] = {}
    aucs: dict[int, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_ps_servers-") as tmp:
        for repeat in range(args.repeats):
            order = args.servers if repeat % 2 == 0 else list(reversed(args.servers))
            for n in order:
                job_dir = Path(tmp) / f"s{n}-{repeat}"
                job_dir.mkdir()
                workers = bench_ps.run_job(args.mode, job_args, files, job_dir, servers=n)
                rates.setdefault(n, []).extend(w["records"] / w["seconds"] for w in workers)
                cpus.setdefault(n, []).extend(w["cpu_ms"] for w in workers)
                aucs.setdefault(n, []).append(workers[0]["auc"])
                print(f"{n} server(s): {statistics.median(rates[n][-2:]):,.0f} records/s per "
                      f"worker, AUC {workers[0]['auc']:.4f}", flush=True)
    one = statistics.median(rates[args.servers[0]])
    lines = ["| servers | records/s per worker | vs first | worker CPU ms/batch | AUC |",
             "|---:|---:|---:|---:|---:|"]
    for n in args.servers:
        rate = statistics.median(rates[n])
        lines.append(f"| {n} | {rate:,.0f} | {rate / one:.2f}x | "
                     f"{statistics.median(cpus[n]):.2f} | {statistics.median(aucs[n]):.4f} |")
    return "\n".join(lines) + "\n"


def checkpoint_times(args: argparse.Namespace) -> str:
    """The table of save / load / re-shard times of a table of ``args.rows`` rows."""
    import numpy as np
    import torch

    from trainer.embedding import stores
    from trainer.job.role import ClusterRole
    from trainer.nn import SparseEmbedding
    from trainer.ps import ParameterServerRuntime
    from trainer.ps.server import ParameterServer

    torch.set_num_threads(1)
    emb = SparseEmbedding(8, "bench_ckpt", optimizer={"type": "adagrad", "lr": 0.05})
    runtime = ParameterServerRuntime(ClusterRole.local())
    bias = torch.nn.Parameter(torch.zeros(8))
    runtime.distributed_optimizer(torch.optim.Adagrad([bias], lr=0.05), model=emb)
    table = stores.local_store().table(emb.config)
    ids = np.random.default_rng(0).integers(0, 2**63, args.rows, dtype=np.int64)
    for start in range(0, args.rows, 100_000):  # rows with Adagrad state, as training leaves them
        chunk = torch.from_numpy(ids[start:start + 100_000])
        table.pull(chunk, create=True)
        table.push(chunk, torch.full((chunk.shape[0], 8), 0.01))
    times: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_ckpt-") as tmp:
        for repeat in range(args.repeats):
            path = str(Path(tmp) / f"ckpt{repeat}")
            t = time.perf_counter()
            runtime.save_persistables(path)
            times.setdefault("save (local, 1 shard)", []).append(time.perf_counter() - t)
            stores.local_store().clear()
            t = time.perf_counter()
            runtime.load_persistables(path)
            times.setdefault("load (local)", []).append(time.perf_counter() - t)
            if len(stores.local_store().table(emb.config)) != args.rows:
                raise RuntimeError("the restored table lost rows")
            # Re-shard: 3 servers each read the checkpoint and keep their ids.
            t = time.perf_counter()
            kept = 0
            for index in range(3):
                server = ParameterServer(
                    index, 3, 1, "async", {emb.config.name: emb.config.make_table(None)},
                    [torch.zeros(8)], None,
                )
                server.load(path)
                kept += len(server.tables[emb.config.name])
            times.setdefault("load re-sharded into 3 servers (in turn)", []).append(
                time.perf_counter() - t)
            if kept != args.rows:
                raise RuntimeError(f"re-sharding kept {kept} rows of {args.rows}")
    stores.local_store().clear()
    lines = [f"| {args.rows:,} rows x dim 8, Adagrad | seconds (median of {args.repeats}) "
             "| rows/s |", "|---|---:|---:|"]
    for what, values in times.items():
        seconds = statistics.median(values)
        lines.append(f"| {what} | {seconds:.2f} | {args.rows / seconds:,.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--mode", default="async", choices=["async", "geo", "sync"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--records", type=int, default=10_000, help="records per worker")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--skip-jobs", action="store_true", help="checkpoint figures only")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    jobs = "" if args.skip_jobs else server_counts(args)
    print(jobs)
    checkpoints = checkpoint_times(args)
    print(checkpoints)
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(
            "# Parameter server: several servers, checkpoints\n\n"
            + (f"wide&deep ({args.mode}), 2 workers, {args.records:,} records per worker x 1 "
               f"epoch, server counts alternating, {args.repeats} repeats, all processes on "
               "this 2-core machine.\n\n" + jobs + "\n" if jobs else "")
            + f"Checkpoints, `python benchmarks/bench_ps_servers.py --rows {args.rows}`:\n\n"
            + checkpoints
        )


if __name__ == "__main__":
    main()
