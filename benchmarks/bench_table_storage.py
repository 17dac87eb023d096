"""Tables of 16-bit floats against float32 ones (issue 28): memory per row as a
server process, and what they cost the small CTR model.

* Memory: ``fleetfeed_table_memory.py`` (one server and one worker; ``--rows``
  ids of dim 8, Adagrad, pulled and pushed in steps of 100,000; the server
  checked to hold every row) with ``storage="float32"`` and ``"float16"``.
* The model: bench_small_ctr.py's local run (the small CTR model, 4 files x
  20,000 lines, 2 epochs, batch 256, one trainer thread: a float32 run is
  deterministic, a float16 one rounds its rows at random), its tables float32
  or float16; the held-out AUC and records/s of each, medians of ``--repeats``
  runs alternating.

Writes ``benchmarks/results/table_storage.md`` (``--no-write``: print only).

    python benchmarks/bench_table_storage.py [--rows 10000000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "table_storage.md"
STORAGES = ("float32", "float16")


def memory(rows: int, storage: str) -> dict:
    out = subprocess.run(
        [sys.executable, str(HERE / "fleetfeed_table_memory.py"), str(rows), storage],
        capture_output=True, text=True, timeout=3600, check=False,
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode or not lines:
        raise SystemExit(f"fleetfeed_table_memory.py {storage} failed: {out.stderr[-2000:]}")
    figures = json.loads(lines[-1])
    figures["bytes_per_row"] = figures["growth"] / rows
    print(f"{storage}: server RSS growth {figures['bytes_per_row']:.1f} bytes/row, "
          f"{figures['rows_held']:,} rows held", flush=True)
    return figures


def model_run(storage: str, files: list[Path], held: Path) -> dict:
    config = {"mode": "local", "threads": 1, "files": [str(f) for f in files],
              "heldout": str(held), "batch_size": 256, "epochs": 2, "seed": 0,
              "lr": 0.1, "init_scale": 0.01, "storage": storage}
    out = subprocess.run(
        [sys.executable, str(HERE / "bench_small_ctr.py"), "--child", json.dumps(config)],
        capture_output=True, text=True, timeout=1800, check=False,
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode or not lines:
        raise SystemExit(f"the {storage} run failed: {out.stderr[-2000:]}")
    run = json.loads(lines[-1])
    if run["records"] != 2 * 4 * 20_000:
        raise SystemExit(f"the {storage} run trained {run['records']} records")
    print(f"{storage}: AUC {run['auc']:.5f}, {run['records_per_s']:,.0f} records/s", flush=True)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    import make_small_ctr
    import results_file

    load, commit = results_file.load_average(), results_file.commit()
    mem = {storage: memory(args.rows, storage) for storage in STORAGES}
    files, held = make_small_ctr.write(HERE / "data" / "small_ctr", 20000, 4)
    runs: dict[str, list[dict]] = {s: [] for s in STORAGES}
    for repeat in range(args.repeats):
        for storage in STORAGES if repeat % 2 == 0 else STORAGES[::-1]:
            runs[storage].append(model_run(storage, files, held))
    auc = {s: statistics.median(r["auc"] for r in runs[s]) for s in STORAGES}
    rate = {s: statistics.median(r["records_per_s"] for r in runs[s]) for s in STORAGES}
    lines = [
        "# Sparse tables of 16-bit floats",
        "",
        f"`{results_file.command()}` at {commit}, 1-minute load average {load:.2f} before "
        "the runs, 2 cores shared with other work.",
        "",
        f"Memory: `benchmarks/fleetfeed_table_memory.py` (one server, one worker; "
        f"{args.rows:,} ids, dim 8, Adagrad, pulled and pushed in steps of 100,000; the "
        "server's resident memory growth per row, the server checked to hold every row). "
        f"Model: the small CTR model trained locally (bench_small_ctr.py's local run, one "
        f"trainer thread: a float32 run is deterministic, a float16 one rounds its rows at "
        f"random), 4 files x 20,000 lines, 2 epochs; medians of {args.repeats} alternating "
        f"runs; float16 AUCs of the runs: "
        + ", ".join(f"{r['auc']:.5f}" for r in runs["float16"]) + ".",
        "",
        "| storage | server bytes per row | held-out AUC | AUC - float32's | records/s |",
        "|---|---:|---:|---:|---:|",
    ]
    for storage in STORAGES:
        lines.append(
            f"| {storage} | {mem[storage]['bytes_per_row']:.1f} | {auc[storage]:.5f} "
            f"| {auc[storage] - auc['float32']:+.5f} | {rate[storage]:,.0f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        RESULTS.write_text(text)


if __name__ == "__main__":
    main()
