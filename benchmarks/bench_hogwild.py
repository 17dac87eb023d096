"""Hogwild trainers: records/s, CPU time and held-out AUC of thread=1 vs thread=N.

``train_from_dataset(thread=N, hogwild=True)`` on an InMemoryDataset runs N
processes sharing memory (trainer/loop/hogwild_processes.py); on any other
iterable of batches, N threads. Each N > 1 runs both ways: the dataset
itself (processes) and a generator over it (threads).

The small CTR model of issue 14 in one process, local mode (sparse tables in
process, through ``fleet.distributed_optimizer``): dense 4 floats plus three
sparse slots embedded at dim 4 (u: 1 id of 3,000; i: 1-3 ids of 5,000, summed;
c: 1 id of 50) into a 16-16-1 MLP; labels from a logistic truth
(benchmarks/make_small_ctr.py); 4 files x 20,000 lines, batch 256, Adagrad
lr 0.1 on the dense parameters and the tables, 2 epochs, each a
``local_shuffle`` and a ``train_from_dataset(thread=N)`` pass. Loading is not
timed. Each run is a fresh process; the thread counts alternate within every
repeat and the table gives medians. Records/s is over the timed epochs; CPU
ms/batch is the process's CPU time (all threads) over the same span, steadier
than records/s on a shared machine; the phase columns are the mean wall time
per batch of each thread's forward, backward and update (summed over threads,
so they overlap under Hogwild). AUC is exact, on a held-out file of 20,000 lines.

Usage: python benchmarks/bench_hogwild.py [--threads 1 2] [--repeats 3]
       [--lines 20000] [--epochs 2] [--torch-threads 0] [--no-write]
Results go to benchmarks/results/hogwild.md, rewritten whole by each run (every
figure and note in it comes from the run, with its commit and load average).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "benchmarks" / "data" / "small_ctr"
RESULTS = REPO / "benchmarks" / "results" / "hogwild.md"
RUN_TIMEOUT = 900
sys.path.insert(0, str(REPO / "benchmarks"))
import results_file  # noqa: E402  (the commit, command and load every figure carries)


def child(config: dict) -> dict:
    """One run in this process: load, train ``epochs`` timed passes, evaluate."""
    import numpy as np
    import torch
    from bench_small_ctr import (  # the side-by-side run's model, its CPU time counted alike
        cpu_seconds,
        small_ctr_model,
    )

    from datafeed import InMemoryDataset, Slot
    from trainer import Executor, auc, fleet

    slots = [
        Slot("dense", "float32", (4,)), Slot("u", "int64"), Slot("i", "int64"),
        Slot("c", "int64"), Slot("label", "int64", (1,)),
    ]

    def dataset(files: list[str], batch_size: int) -> InMemoryDataset:
        data = InMemoryDataset()
        data.init(batch_size=batch_size, thread_num=2, use_var=slots, pipe_command="cat")
        data.set_filelist(files)
        data.load_into_memory()
        return data

    if config["torch_threads"]:
        torch.set_num_threads(config["torch_threads"])
    fleet.init()
    torch.manual_seed(config["seed"])
    model = small_ctr_model(None)
    optimizer = fleet.distributed_optimizer(torch.optim.Adagrad(model.parameters(), lr=0.1))
    train = dataset(config["files"], config["batch_size"])
    executor = Executor()
    engines = set()
    records = batches = 0
    phases = {"forward": 0.0, "backward": 0.0, "step": 0.0}
    wall0, cpu0 = time.perf_counter(), cpu_seconds()
    for epoch in range(config["epochs"]):
        train.local_shuffle(seed=config["seed"] + epoch)
        source = train if config["engine"] != "threads" else (batch for batch in train)
        summary = executor.train_from_dataset(
            model, source, optimizer, thread=config["threads"], fetch_list=[],
            hogwild=config["threads"] > 1,
        )
        engines.add(summary.hogwild)
        records += summary.records
        batches += summary.batches
        for phase in phases:
            phases[phase] += summary.timings[phase]
    wall, cpu = time.perf_counter() - wall0, cpu_seconds() - cpu0
    held = dataset([config["heldout"]], 1024)
    probs, labels = [], []
    executor.infer_from_dataset(
        model, held, fetch_list=[], thread=1,
        fetch_handler=lambda out: (probs.append(out["prob"]), labels.append(out["label"])),
    )
    return {
        "threads": config["threads"],
        "engine": sorted(map(str, engines)),
        "records": records,
        "records_per_s": records / wall,
        "cpu_ms_per_batch": 1e3 * cpu / batches,
        "phase_ms": {k: 1e3 * v / batches for k, v in phases.items()},
        "auc": auc(np.concatenate([p.numpy() for p in labels]),
                   np.concatenate([p.numpy() for p in probs])),
        "torch_threads": torch.get_num_threads(),
    }


def run(config: dict) -> dict:
    """``child(config)`` in a fresh interpreter; its result."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(config)],
        capture_output=True, text=True, timeout=RUN_TIMEOUT, env=env, check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"bench_hogwild run {config['threads']} threads failed with exit status "
            f"{done.returncode}: {done.stderr[-2000:]}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(args: argparse.Namespace, runs: dict[str, list[dict]], loads: list[float],
          started: str) -> str:
    """The results as markdown."""
    base = statistics.median(r["records_per_s"] for r in next(iter(runs.values())))
    lines = [
        "# Hogwild trainers: the small CTR model, one machine",
        "",
        f"{args.files} files x {args.lines:,} lines, batch 256, Adagrad lr 0.1, "
        f"{args.epochs} epochs (local_shuffle + train_from_dataset each), local mode, "
        f"median of {args.repeats} alternating run(s), "
        f"`{results_file.command()}` at {results_file.commit()}, started {started}. "
        f"torch intra-op threads: {next(iter(runs.values()))[0]['torch_threads']}. "
        f"Machine: {os.cpu_count()} cores, shared; 1-minute load average at each "
        f"repeat's start: {', '.join(f'{v:.2f}' for v in loads)}.",
        "",
        "| thread | Hogwild trainers | records/s | vs the first row | CPU ms/batch "
        "| forward ms | backward ms | update ms | held-out AUC | records/s of each run |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for label, results in runs.items():
        threads, engine = label.split(" ", 1) if " " in label else (label, "-")
        rate = statistics.median(r["records_per_s"] for r in results)
        cpu = statistics.median(r["cpu_ms_per_batch"] for r in results)
        phase = {
            k: statistics.median(r["phase_ms"][k] for r in results)
            for k in ("forward", "backward", "step")
        }
        auc_value = statistics.median(r["auc"] for r in results)
        each = ", ".join(f"{r['records_per_s']:,.0f}" for r in results)
        lines.append(
            f"| {threads} | {engine} | {rate:,.0f} | {rate / base:.2f}x | {cpu:.2f} | "
            f"{phase['forward']:.2f} | {phase['backward']:.2f} | {phase['step']:.2f} | "
            f"{auc_value:.4f} | {each} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    """Command line: see the module's docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lines", type=int, default=20000)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument(
        "--torch-threads", type=int, default=0,
        help="torch.set_num_threads in each run (0: torch's default, one per core)",
    )
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))), flush=True)
        return
    import make_small_ctr

    parts, held = make_small_ctr.write(DATA, args.lines, args.files)
    trainers = [
        (threads, engine) for threads in args.threads
        for engine in ((None,) if threads == 1 else ("processes", "threads"))
    ]
    runs: dict[str, list[dict]] = {
        f"{t} {e}" if e else str(t): [] for t, e in trainers
    }
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    loads = []
    for repeat in range(args.repeats):
        loads.append(results_file.load_average())
        for threads, engine in trainers:
            result = run({
                "threads": threads, "engine": engine, "files": [str(p) for p in parts],
                "heldout": str(held), "batch_size": 256, "epochs": args.epochs, "seed": 0,
                "torch_threads": args.torch_threads,
            })
            if engine is not None and result["engine"] != [engine]:
                raise RuntimeError(f"thread={threads} ran as {result['engine']}, not {engine}")
            if result["records"] != args.epochs * args.files * args.lines:
                raise RuntimeError(f"thread={threads} {engine or ''} trained "
                                   f"{result['records']} records, not "
                                   f"{args.epochs * args.files * args.lines}")
            runs[f"{threads} {engine}" if engine else str(threads)].append(result)
            print(
                f"repeat {repeat} thread={threads} {engine or ''}: "
                f"{result['records_per_s']:,.0f} records/s, "
                f"{result['cpu_ms_per_batch']:.2f} CPU ms/batch, AUC {result['auc']:.4f}",
                flush=True,
            )
    text = table(args, runs, loads, started)
    print(text)
    if not args.no_write:
        RESULTS.write_text(text)


if __name__ == "__main__":
    main()
