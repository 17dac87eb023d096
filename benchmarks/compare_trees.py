"""Two source trees of fleetfeed side by side: is a change slower anywhere?

A restructuring must leave every benchmark no slower. This runs the figures that
the benchmarks report (engine load/shuffle/batches, the three end-to-end load
paths, the generator, global_shuffle, the parameter server, the small CTR model,
a sparse table of 10M ids) for a BEFORE tree and
an AFTER tree, alternating the two in fresh processes (ABBA order, so that a
machine getting busier or quieter does not favour one side), and prints medians
and AFTER/BEFORE ratios.

Each tree runs its own benchmark scripts with ``PYTHONPATH`` set to it, so the
scripts may differ between the trees. A BEFORE tree is typically a worktree of
the previous commit whose extensions were built in place::

    git worktree add /tmp/before HEAD~1
    (cd /tmp/before && python setup.py build_ext --inplace)
    python benchmarks/compare_trees.py /tmp/before . --repeats 3

The interpreter is this one (same torch, numpy and pyarrow for both trees).
Writes ``benchmarks/results/compare_trees.md`` unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "compare_trees.md"
ALL_BENCHMARKS = [
    "engine", "speed", "generator", "global_shuffle", "ps", "ps_latency", "small_ctr", "table",
]


@dataclass(frozen=True)
class Figure:
    """One measured quantity; ``higher_is_better`` says which way a change is a gain."""

    name: str
    unit: str
    higher_is_better: bool


@dataclass
class Benchmark:
    """A command run in each tree and the figures read from its output."""

    name: str
    figures: list[Figure]
    command: Callable[[Path], list[str]]
    extract: Callable[[str], dict[str, float]]
    timeout_s: float = 900


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def table_rows(stdout: str) -> dict[str, list[str]]:
    """Markdown table rows of a report, keyed by their first cell."""
    rows = {}
    for line in stdout.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


def number(cell: str) -> float:
    return float(re.sub(r"[^0-9.eE+-]", "", cell))


def engine(paths: list[str], threads: int) -> Benchmark:
    def extract(stdout: str) -> dict[str, float]:
        run = last_json(stdout)
        return {
            "load": run["load_lines_per_s"],
            "memory per record": run["bytes_per_record"],
            "local_shuffle": run["shuffle_s"],
            "batch iteration": run["iterate_records_per_s"],
        }

    return Benchmark(
        "engine (benchmarks/fleetfeed_engine.py)",
        [
            Figure("load", "lines/s", True),
            Figure("memory per record", "B", False),
            Figure("local_shuffle", "s", False),
            Figure("batch iteration", "records/s", True),
        ],
        lambda tree: [
            str(tree / "benchmarks" / "fleetfeed_engine.py"), "--threads", str(threads), *paths
        ],
        extract,
    )


def load_path(how: str, paths: list[str], cache_dir: Path) -> Benchmark:
    def extract(stdout: str) -> dict[str, float]:
        run = last_json(stdout)
        return {how: run["records"] / run["seconds"]}

    return Benchmark(
        f"end to end, {how} (benchmarks/bench_speed.py)",
        [Figure(how, "records/s", True)],
        lambda tree: [
            str(tree / "benchmarks" / "bench_speed.py"),
            "--contender", f"fleetfeed-{how}",
            # One cache per tree: each reads the cache its own code wrote.
            "--cache", str(cache_dir / f"records-{tree.name}.arrow"), *paths,
        ],
        extract,
    )


def generator(lines: int, source: str) -> Benchmark:
    def extract(stdout: str) -> dict[str, float]:
        row = table_rows(stdout)["fleetfeed"]
        return {"generator": number(row[0]), "generator (CPU)": number(row[2])}

    return Benchmark(
        "generator (benchmarks/bench_generator.py)",
        [Figure("generator", "lines/s", True), Figure("generator (CPU)", "lines/CPU-s", True)],
        lambda tree: [
            str(tree / "benchmarks" / "bench_generator.py"), "--paddle-python", "none",
            "--no-write", "--repeats", "1", "--lines", str(lines), "--source", source,
        ],
        extract,
    )


def global_shuffle(records: int) -> Benchmark:
    def extract(stdout: str) -> dict[str, float]:
        rows = [cells for key, cells in table_rows(stdout).items() if key.isdigit()]
        figures = {
            "global_shuffle": statistics.median(number(r[3]) for r in rows),
            "global_shuffle peak extra": max(number(r[5]) for r in rows),
        }
        if all(len(r) > 8 for r in rows):  # since the whole process's peak is reported
            figures["global_shuffle peak / resident"] = max(number(r[8]) for r in rows)
        return figures

    return Benchmark(
        "global_shuffle, 2 workers (benchmarks/bench_global_shuffle.py)",
        [
            Figure("global_shuffle", "records/s/worker", True),
            Figure("global_shuffle peak extra", "x dataset", False),
            Figure("global_shuffle peak / resident", "x", False),
        ],
        lambda tree: [
            str(tree / "benchmarks" / "bench_global_shuffle.py"), "--no-write",
            "--records", str(records),
        ],
        extract,
    )


def small_ctr_local(files: list[Path], held: Path, threads: int) -> Benchmark:
    """The small CTR model trained locally (bench_small_ctr.py's fleetfeed child:
    SparseEmbedding tables in the process), one process with ``threads`` trainers."""
    config = {"mode": "local", "threads": threads, "files": [str(f) for f in files],
              "heldout": str(held), "batch_size": 256, "epochs": 2, "seed": 0,
              "lr": 0.1, "init_scale": 0.01}
    name = f"small CTR local thread={threads}"

    def extract(stdout: str) -> dict[str, float]:
        run = last_json(stdout)
        return {name: run["records_per_s"], f"{name} AUC": run["auc"]}

    return Benchmark(
        f"small CTR model, local, thread={threads} (benchmarks/bench_small_ctr.py)",
        [Figure(name, "records/s", True), Figure(f"{name} AUC", "AUC", True)],
        lambda tree: [
            str(tree / "benchmarks" / "bench_small_ctr.py"), "--child", json.dumps(config),
        ],
        extract,
    )


def parameter_server(records: int) -> Benchmark:
    def extract(stdout: str) -> dict[str, float]:
        rows = table_rows(stdout)
        # Columns: records/s per worker, pull ms, push ms, worker CPU ms per batch, ...
        return {
            "PS async": number(rows["async"][0]), "PS GEO": number(rows["geo (k=20)"][0]),
            "PS async CPU": number(rows["async"][3]), "PS GEO CPU": number(rows["geo (k=20)"][3]),
        }

    return Benchmark(
        "parameter server, 1 server + 2 workers (benchmarks/bench_ps.py)",
        [Figure("PS async", "records/s/worker", True), Figure("PS GEO", "records/s/worker", True),
         Figure("PS async CPU", "worker CPU ms/batch", False),
         Figure("PS GEO CPU", "worker CPU ms/batch", False)],
        lambda tree: [
            str(tree / "benchmarks" / "bench_ps.py"), "--no-write", "--repeats", "1",
            "--modes", "async", "geo", "--records", str(records),
        ],
        extract,
    )


def ps_latency(delay_ms: int) -> Benchmark:
    """The small CTR model's PS job, 1 server + 2 workers reaching it through
    the latency relay with ``delay_ms`` added each way (bench_ps_latency.py):
    each mode's records/s per worker, pulls sent ahead as configured (the
    script also runs the job at 0 ms, which it needs for its ratios)."""
    modes = ("async", "geo")
    names = {mode: f"PS {mode} small CTR +{delay_ms} ms" for mode in modes}

    def extract(stdout: str) -> dict[str, float]:
        out = {}
        for line in stdout.splitlines():
            # | mode | contender | delay | records/s per worker | ...
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if (len(cells) > 3 and cells[0] in names and cells[1] == "fleetfeed"
                    and cells[2] == str(delay_ms)):
                out[names[cells[0]]] = number(cells[3])
        return out

    return Benchmark(
        f"small CTR PS job through a relay adding {delay_ms} ms each way "
        "(benchmarks/bench_ps_latency.py)",
        [Figure(name, "records/s/worker", True) for name in names.values()],
        lambda tree: [
            str(tree / "benchmarks" / "bench_ps_latency.py"), "--no-write", "--repeats", "1",
            "--model", "small_ctr", "--modes", *modes, "--delays-ms", "0", str(delay_ms),
        ],
        extract,
    )


def sparse_table(rows: int) -> Benchmark:
    """One sparse table of ``rows`` ids (bench_table_lifecycle.py): pull and
    push rates, and the bytes per row it allocates (the figure both trees'
    scripts print the same way)."""

    def extract(stdout: str) -> dict[str, float]:
        rates = re.search(r"pull ([\d.]+) M rows/s, push ([\d.]+) M rows/s", stdout)
        allocated = re.search(r"bytes per row \(allocated\): ([\d.]+)", stdout)
        if rates is None or allocated is None:
            raise ValueError("no pull/push rates or bytes per row in the output")
        return {
            "table pull": float(rates[1]) * 1e6, "table push": float(rates[2]) * 1e6,
            "table bytes per row": float(allocated[1]),
        }

    return Benchmark(
        f"sparse table of {rows:,} ids, dim 8, Adagrad (benchmarks/bench_table_lifecycle.py)",
        [Figure("table pull", "rows/s", True), Figure("table push", "rows/s", True),
         Figure("table bytes per row", "bytes (allocated)", False)],
        lambda tree: [
            str(tree / "benchmarks" / "bench_table_lifecycle.py"), "--no-write",
            "--rows", str(rows),
        ],
        extract,
    )


def run_once(bench: Benchmark, tree: Path) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, *bench.command(tree)], cwd=tree, env=env, capture_output=True,
        text=True, timeout=bench.timeout_s, check=False,
    )
    if out.returncode:
        sys.exit(
            f"{bench.name} failed in {tree} (exit {out.returncode}):\n"
            f"{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
        )
    try:
        figures = bench.extract(out.stdout)
    except (KeyError, IndexError, ValueError) as exc:
        sys.exit(f"{bench.name}: could not read its figures from {tree}'s output ({exc!r}):\n"
                 f"{out.stdout[-3000:]}")
    print(f"  {tree.name or tree}: {time.monotonic() - started:5.1f} s  "
          + ", ".join(f"{k} {v:,.4g}" for k, v in figures.items()), flush=True)
    return figures


def compare(bench: Benchmark, before: Path, after: Path, repeats: int) -> list[str]:
    print(f"{bench.name}", flush=True)
    runs: dict[Path, list[dict[str, float]]] = {before: [], after: []}
    for repeat in range(repeats):
        order = (before, after) if repeat % 2 == 0 else (after, before)
        for tree in order:
            runs[tree].append(run_once(bench, tree))
    rows = []
    for fig in bench.figures:
        if not all(fig.name in r for r in runs[before] + runs[after]):
            # A figure one tree's script does not report yet: its own values only.
            shown = {
                tree: statistics.median(r[fig.name] for r in runs[tree])
                if all(fig.name in r for r in runs[tree]) else None
                for tree in (before, after)
            }
            b_text, a_text = (
                "-" if v is None else f"{v:,.4g}" for v in (shown[before], shown[after])
            )
            rows.append(f"| {fig.name} | {fig.unit} | {b_text} | {a_text} | - | not in both |")
            continue
        b = statistics.median(r[fig.name] for r in runs[before])
        a = statistics.median(r[fig.name] for r in runs[after])
        ratio = a / b if b else float("nan")
        gain = ratio if fig.higher_is_better else (1 / ratio if ratio else float("nan"))
        rows.append(
            f"| {fig.name} | {fig.unit} | {b:,.4g} | {a:,.4g} | {ratio:.3f} | "
            f"{'faster/smaller' if gain >= 1 else 'slower/larger'} ({gain:.2f}x) |"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path, help="the tree to compare against")
    parser.add_argument("after", type=Path, help="the changed tree")
    parser.add_argument("--repeats", type=int, default=3, help="runs per tree per benchmark")
    parser.add_argument("--lines", type=int, default=1_000_000, help="engine input lines")
    parser.add_argument("--only", nargs="*", default=ALL_BENCHMARKS, choices=ALL_BENCHMARKS)
    parser.add_argument("--no-write", action="store_true", help=f"print only, leave {RESULTS}")
    args = parser.parse_args(argv)
    before, after = args.before.resolve(), args.after.resolve()
    for tree in (before, after):
        if not (tree / "datafeed").is_dir():
            parser.error(f"{tree} is not a fleetfeed source tree (no datafeed/ in it)")

    sys.path.insert(0, str(HERE))
    from make_criteo import make_criteo

    data = HERE / "data"
    engine_paths = [str(p) for p in make_criteo(data / "criteo", lines=args.lines, files=8)]
    sys.path.insert(0, str(HERE.parent / "examples" / "criteo"))
    from make_data import make_files

    raw = data / "compare_raw"
    raw_paths = sorted(str(p) for p in raw.glob("part-*.tsv"))
    if len(raw_paths) != 4:
        raw_paths = make_files(str(raw), files=4, lines=50_000, seed=0)
    source = str(HERE.parent / "examples" / "data" / "real" / "criteo_raw.tsv")
    from make_small_ctr import write as write_small_ctr

    small_files, small_held = write_small_ctr(data / "small_ctr", 20000, 4)

    benches = {
        "engine": [engine(engine_paths, threads=2)],
        "speed": [load_path(how, raw_paths, raw) for how in ("pipe", "inprocess", "cache")],
        "generator": [generator(200_000, source)],
        "global_shuffle": [global_shuffle(500_000)],
        "ps": [parameter_server(20_000)],
        "ps_latency": [ps_latency(1)],
        "small_ctr": [small_ctr_local(small_files, small_held, t) for t in (1, 2)],
        "table": [sparse_table(10_000_000)],
    }
    lines = [
        "# Two trees side by side",
        "",
        f"`python benchmarks/compare_trees.py {args.before} {args.after} --repeats {args.repeats}"
        + (f" --only {' '.join(args.only)}" if args.only != ALL_BENCHMARKS else "") + "`"
        f" on {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores: medians of "
        f"{args.repeats} runs per tree, alternating in fresh processes (ABBA).",
        "",
        "| figure | unit | before | after | after/before | change |",
        "|---|---|---:|---:|---:|---|",
    ]
    for key in args.only:
        for bench in benches[key]:
            lines.extend(compare(bench, before, after, args.repeats))
    report = "\n".join(lines)
    print(report)
    if not args.no_write:
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
