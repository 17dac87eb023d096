"""The engine benchmark: fleetfeed vs Paddle's InMemoryDataset, side by side.

Makes Criteo-layout MultiSlot data (``make_criteo.py``), then runs each
contender ``--repeats`` times, every run in a fresh process and the contenders
alternating (fleetfeed, paddle, fleetfeed, ...) so that machine noise spreads
over both. Prints the medians and their ratios against the issue's acceptance
targets, and writes them into ``benchmarks/RESULTS.md`` between the
``<!-- engine:begin -->`` / ``<!-- engine:end -->`` markers, leaving the rest of
that file to the other benchmarks.

Paddle runs in its own Python (``--paddle-python``, e.g. ``.venv-paddle/bin/python``
from ``make bench-paddle``); ``--paddle-python none`` measures fleetfeed alone.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from make_criteo import make_criteo  # a sibling script, not a package
from results_file import write_section

# Where `make bench-paddle` puts Paddle, then where this project's CI image has it.
PADDLE_CANDIDATES = (
    ROOT / ".venv-paddle/bin/python",
    Path("/opt/paddle-venv/bin/python"),
)


class ContenderError(RuntimeError):
    """A contender's process failed or printed no JSON result."""


def run_contender(
    name: str, command: list[str], env: dict[str, str], timeout: float
) -> dict[str, Any]:
    """Run one measurement process to completion and parse its last stdout line.

    Raises:
        ContenderError: on a non-zero exit, a timeout, or output without JSON.
    """
    try:
        # subprocess.run waits for the child and closes its pipes, also when
        # the timeout kills it.
        proc = subprocess.run(
            command,
            env=env,
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        raise ContenderError(
            f"{name}: {' '.join(command[:2])} ran past {timeout:.0f} s"
        ) from exc
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise ContenderError(
            f"{name}: {' '.join(command[:2])} exited with status {proc.returncode}; "
            f"last stderr lines:\n{tail}"
        )
    try:
        return json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise ContenderError(
            f"{name}: expected a JSON object on the last stdout line, found {lines[-1][:200]!r}"
        ) from exc


def resolve_paddle(option: str) -> str | None:
    """The Paddle interpreter to use: a path, ``none``, or ``auto`` (look around)."""
    if option == "none":
        return None
    if option == "auto":
        found = [p for p in PADDLE_CANDIDATES if p.exists()]
        return str(found[0]) if found else None
    if not Path(option).exists():
        raise SystemExit(
            f"--paddle-python {option}: no such interpreter (run `make bench-paddle`, "
            "or pass --paddle-python none)"
        )
    return option


def warm_page_cache(paths: list[str]) -> None:
    """Read the inputs once so that no contender pays for the first, cold read."""
    for path in paths:
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if key in r]
    return statistics.median(values) if values else None


def machine_facts() -> dict[str, str]:
    """The facts a reader needs to compare these figures with their own."""
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kb = int(f.readline().split()[1])
    try:
        commit = (
            subprocess.run(
                ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                check=False,
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
            or "unknown"
        )
    except (OSError, subprocess.TimeoutExpired):
        commit = "unknown"
    return {
        "cpus": f"{len(os.sched_getaffinity(0))} (nproc)",
        "cpu": cpu,
        "memory": f"{mem_kb / 2**20:.0f} GiB",
        "os": f"{platform.system()} {platform.release()}",
        "commit": commit,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime(
            "%Y-%m-%d %H:%M UTC"
        ),
    }


def fmt(value: float | None, spec: str, suffix: str = "") -> str:
    """``value`` formatted with ``spec`` plus ``suffix``, or "n/a" when missing."""
    return "n/a" if value is None else format(value, spec) + suffix


def copy_line(ff: list[dict[str, Any]]) -> str:
    """What copying the shuffled records into their order would cost and save."""
    copy_s = median_of(ff, "copy_s")
    gathered = median_of(ff, "iterate_records_per_s")
    contiguous = median_of(ff, "contiguous_iterate_records_per_s")
    if copy_s is None or not gathered or not contiguous or not ff:
        return "- the contiguous copy of shuffled records: not measured"
    records = ff[0]["records"]
    saved = records / gathered - records / contiguous  # seconds a pass, per order
    passes = f"{copy_s / saved:.1f}" if saved > 0 else "never"
    return (
        "- declined, measured: copying the shuffled records into their order (as a "
        f"shuffle did before) takes {copy_s:.3f} s with a peak of "
        f"{fmt(median_of(ff, 'copy_peak_over_resident'), '.2f')}x the resident size, "
        f"and a pass over the copy runs at {contiguous / 1e6:.2f} M records/s "
        f"against {gathered / 1e6:.2f} gathered: the copy pays back after {passes} "
        "passes over one order, at that peak; a job that shuffles before every pass "
        "never makes it back"
    )


def build_report(
    args: argparse.Namespace,
    paths: list[str],
    ff: list[dict[str, Any]],
    pd: list[dict[str, Any]],
    loadavg: tuple[str, str],
    kernel: list[dict[str, Any]] | None = None,
) -> str:
    """The engine section of RESULTS.md (also printed): facts, medians, targets."""
    facts = machine_facts()

    def med(runs: list[dict[str, Any]], key: str, scale: float = 1.0) -> float | None:
        value = median_of(runs, key)
        return None if value is None else value / scale

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None or b == 0 else a / b

    def verdict(value: float | None, ok: Callable[[float], bool]) -> str:
        return "n/a" if value is None else ("**met**" if ok(value) else "not met")

    kernel = kernel or []
    ff_load, pd_load = (
        med(ff, "load_lines_per_s", 1e6),
        med(pd, "load_lines_per_s", 1e6),
    )
    kernel_rate = med(kernel, "kernel_lines_per_s", 1e6)
    kernel_fastest = med(kernel, "kernel_small_feeds_lines_per_s", 1e6)
    ff_mem, pd_mem = med(ff, "bytes_per_record"), med(pd, "bytes_per_record")
    ff_shuf, pd_shuf = med(ff, "shuffle_s"), med(pd, "shuffle_s")
    ff_iter = med(ff, "iterate_records_per_s", 1e6)
    ff_peak, pd_peak = med(ff, "peak_over_resident"), med(pd, "peak_over_resident")

    def spread(runs: list[dict[str, Any]], key: str = "shuffle_runs") -> float | None:
        """The widest slowest/fastest ratio of the shuffles of one run."""
        spreads = [max(r[key]) / min(r[key]) for r in runs if r.get(key) and min(r[key]) > 0]
        return max(spreads) if spreads else None

    load_x, kernel_x, mem_x, shuf_x = (
        ratio(ff_load, pd_load),
        ratio(ff_load, kernel_rate),
        ratio(ff_mem, pd_mem),
        ratio(pd_shuf, ff_shuf),
    )
    ff_spread, pd_spread = spread(ff), spread(pd)

    def across(runs: list[dict[str, Any]]) -> float | None:
        """Slowest / fastest of the runs' shuffle times (each run's median)."""
        times = [r["shuffle_s"] for r in runs if r.get("shuffle_s")]
        return max(times) / min(times) if times else None

    ff_across, pd_across = across(ff), across(pd)
    rows = [
        ("load_into_memory (M lines/s)", fmt(ff_load, ".3f"), fmt(pd_load, ".3f"),
         fmt(load_x, ".2f", "x (fleetfeed / Paddle)"), ">= 4.5x",
         verdict(load_x, lambda r: r >= 4.5)),
        ("parser kernel alone, same files, 2 threads, 4 MiB feeds (M lines/s) [3]",
         fmt(kernel_rate, ".3f"), "-", fmt(kernel_x, ".2f", " (load / kernel)"), ">= 0.75",
         verdict(kernel_x, lambda r: r >= 0.75)),
        ("the same, 256 KiB feeds: the kernel's fastest (M lines/s) [3]",
         fmt(kernel_fastest, ".3f"), "-",
         fmt(ratio(ff_load, kernel_fastest), ".2f", " (load / kernel)"), "-", "-"),
        ("memory (bytes/record, RSS delta)", fmt(ff_mem, ".0f"), fmt(pd_mem, ".0f"),
         fmt(mem_x, ".2f", "x (fleetfeed / Paddle)"), "<= 0.45x",
         verdict(mem_x, lambda r: r <= 0.45)),
        (f"local_shuffle (s, median of {len(ff[0]['shuffle_runs']) if ff else 5} a run)",
         fmt(ff_shuf, ".4f"), fmt(pd_shuf, ".3f"),
         fmt(shuf_x, ".1f", "x faster (Paddle s / fleetfeed s)"), ">= 20x",
         verdict(shuf_x, lambda r: r >= 20)),
        (f"local_shuffle: slowest / fastest of the {len(ff)} runs", fmt(ff_across, ".2f"),
         fmt(pd_across, ".2f"), "-", "<= 2", verdict(ff_across, lambda r: r <= 2)),
        ("local_shuffle: slowest / fastest shuffle within one run, the widest run [4]",
         fmt(ff_spread, ".2f"), fmt(pd_spread, ".2f"), "-", "-", "-"),
        ("the same in the shuffling thread's CPU time [4]",
         fmt(spread(ff, "shuffle_cpu_runs"), ".2f"), "-", "-", "-", "-"),
        ("batch iteration after a shuffle (M records/s)", fmt(ff_iter, ".2f"), "n/a [1]", "-",
         ">= 4 M records/s", verdict(ff_iter, lambda r: r >= 4)),
        ("peak RSS in load + shuffles + epoch / RSS after load", fmt(ff_peak, ".3f"),
         fmt(pd_peak, ".3f"), "-", "<= 1.15x", verdict(ff_peak, lambda r: r <= 1.15)),
    ]  # fmt: skip

    def mib(runs: list[dict[str, Any]], key: str) -> str:
        return fmt(med(runs, key, 2**20), ".0f")

    memory_rows = [
        ("before the load (VmRSS)", mib(ff, "rss_before"), mib(pd, "rss_before")),
        ("after the load (VmRSS)", mib(ff, "rss_loaded"), mib(pd, "rss_loaded")),
        ("peak during the load", mib(ff, "peak_load"), mib(pd, "peak_load")),
        ("after the shuffles (VmRSS)", mib(ff, "rss_shuffled"), mib(pd, "rss_shuffled")),
        ("peak during the shuffles", mib(ff, "peak_shuffle"), mib(pd, "peak_shuffle")),
        ("peak during one epoch [2]", mib(ff, "peak_iterate"), mib(pd, "peak_iterate")),
    ]
    collections = [r["load_collections"] for r in ff if "load_collections" in r]
    collection_ms = [sum(r["load_collection_ms"]) for r in ff if "load_collection_ms" in r]

    out = [
        "## Engine: fleetfeed vs Paddle InMemoryDataset",
        "",
        (
            f"Generated by `benchmarks/run_engine.py` on {facts['date']} "
            f"(commit {facts['commit']})."
        ),
        "",
        (
            f"- machine: {facts['cpu']}, {facts['cpus']} CPUs, {facts['memory']}, "
            f"{facts['os']}"
        ),
    ]
    if ff:
        out.append(
            f"- python {ff[0]['python']}, torch {ff[0]['torch']}, "
            f"pyarrow {ff[0]['pyarrow']}, fleetfeed {ff[0]['version']}"
        )
    if pd:
        out.append(f"- paddlepaddle {pd[0]['version']} (python {pd[0]['python']})")
    input_bytes = sum(os.path.getsize(p) for p in paths)
    out += [
        (
            f"- data: {args.lines:,} Criteo-layout MultiSlot lines in {len(paths)} files, "
            f"{input_bytes / 1e6:.0f} MB ({input_bytes / args.lines:.0f} bytes/line): "
            "`dense_input` float32[13], C1..C26 one uint64 id each, `label` int64[1] "
            f"(`make_criteo.py`, seed {args.seed})"
        ),
        (
            f"- settings: `batch_size={args.batch_size}`, `thread_num={args.threads}`, "
            f'`pipe_command="cat"`; medians of {args.repeats} runs per contender, each '
            "in a fresh process, contenders alternating; inputs in the page cache"
        ),
        (
            "- memory per record = (VmRSS after `load_into_memory` - VmRSS before) "
            "/ records"
        ),
        (
            # The machine may be shared: the load average tells a reader how
            # much the wall-clock figures below were contended.
            f"- 1-minute load average: {loadavg[0]} before the runs, {loadavg[1]} after"
        ),
        "",
        "| measure | fleetfeed | Paddle | measured ratio | target | |",
        "|---|---:|---:|---|---|---|",
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
        "Resident memory by stage (MiB, whole process, medians; each peak is VmHWM "
        "reset before its stage):",
        "",
        "| stage | fleetfeed | Paddle |",
        "|---|---:|---:|",
        *("| " + " | ".join(row) + " |" for row in memory_rows),
        "",
        (
            "- garbage collections during fleetfeed's load (torch imported, "
            f"{fmt(med(ff, 'objects_before_load'), '.0f')} objects before it): "
            f"generations 0/1/2 collected {collections[0] if collections else 'n/a'} "
            f"times in the first run, at most {max(collection_ms, default=0):.1f} ms "
            "in any run; the caller's objects are frozen during a load"
        ),
        (
            "- [4] each run shuffles five times; one slow shuffle among all the runs' "
            "makes this row. `time.thread_time()` around each shuffle counts its own "
            "work, page faults included, without the time other processes of this "
            "machine held the core (a virtual machine's thread time still counts the "
            "host's)"
        ),
        (
            "- [3] `ChunkParser` alone on the same files read into memory first, "
            "two threads, a chunk taken after each feed and dropped "
            "(`fleetfeed_engine.py --kernel`; 4 MiB feeds: `bench_parse.py`'s "
            "measure): reading the files and writing the records into memory that "
            "stays cost nothing there. A load writes every record into new pages, "
            "and their first-touch page faults are, after the parse itself, its "
            "largest cost under perf; the kernel reuses the memory of the chunks it "
            "dropped and never pays them"
        ),
        (
            "- peak RSS (VmHWM, whole process until the epoch after the shuffles, median): "
            f"fleetfeed {fmt(med(ff, 'vm_hwm', 2**20), '.0f', ' MiB')}, "
            f"Paddle {fmt(med(pd, 'vm_hwm', 2**20), '.0f', ' MiB')}"
        ),
        (
            "- CPU seconds of `load_into_memory` (threads + `cat` children, median; "
            "less sensitive to other load than wall time): "
            f"fleetfeed {fmt(med(ff, 'load_cpu_s'), '.2f', ' s')}, "
            f"Paddle {fmt(med(pd, 'load_cpu_s'), '.2f', ' s')} "
            f"({fmt(ratio(med(pd, 'load_cpu_s'), med(ff, 'load_cpu_s')), '.2f', 'x')} "
            "as much CPU for Paddle)"
        ),
        (
            "- fleetfeed records' arrays (values and offsets): "
            f"{fmt(med(ff, 'array_bytes_per_record'), '.0f')} bytes/record"
        ),
        copy_line(ff),
        (
            "- fleetfeed sixth `local_shuffle`: "
            f"{fmt(med(ff, 'shuffle2_s'), '.3f')} s, then iteration at "
            f"{fmt(med(ff, 'iterate2_records_per_s', 1e6), '.2f')} M records/s; its first "
            "batch differed from the first epoch's in "
            f"{sum(bool(r.get('reshuffled')) for r in ff)}/{len(ff)} runs"
        ),
        (
            "- [1] Paddle has no Python batch iterator; `train_from_dataset` with a "
            "one-op program (batching + executor) ran at "
            f"{fmt(med(pd, 'train_from_dataset_records_per_s', 1e6), '.2f')} M records/s"
        ),
        "",
        "<details><summary>every run, in the order run</summary>",
        "",
        (
            "| run | contender | M lines/s | load CPU s | bytes/record | shuffle s "
            "| M records/s [2] | peak RSS MiB |"
        ),
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for i, r in enumerate(sorted(ff + pd, key=lambda r: r["_order"])):  # kernel: above
        batches = r.get(
            "iterate_records_per_s", r.get("train_from_dataset_records_per_s")
        )
        out.append(
            f"| {i + 1} | {r['contender']} | {r['load_lines_per_s'] / 1e6:.3f} "
            f"| {r['load_cpu_s']:.2f} "
            f"| {r['bytes_per_record']:.0f} | {r['shuffle_s']:.3f} "
            f"| {fmt(None if batches is None else batches / 1e6, '.2f')} "
            f"| {r['vm_hwm'] / 2**20:.0f} |"
        )
    out += [
        "",
        "Parser kernel alone, each run in the order run (M lines/s, 4 MiB / 256 KiB "
        "feeds): " + (", ".join(
            f"{r['kernel_lines_per_s'] / 1e6:.3f} / "
            f"{r['kernel_small_feeds_lines_per_s'] / 1e6:.3f}" for r in kernel) or "n/a"),
        "",
        "[2] fleetfeed: `for batch in dataset`; Paddle: `train_from_dataset`. "
        "Shuffle s: the median of the run's shuffles.",
        "",
        "</details>",
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="thread_num for both")
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the generated data"
    )
    parser.add_argument(
        "--paddle-python",
        default="auto",
        help="Paddle's interpreter, 'none' to skip Paddle, or 'auto': "
        + ", then ".join(str(p) for p in PADDLE_CANDIDATES),
    )
    parser.add_argument("--data-dir", type=Path, default=HERE / "data")
    parser.add_argument("--results", type=Path, default=HERE / "RESULTS.md")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per run")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    paddle_python = resolve_paddle(args.paddle_python)

    paths = make_criteo(args.data_dir / "criteo", args.lines, args.files, args.seed)
    warm_page_cache(paths)
    loadavg_before = os.getloadavg()[0]
    common = [f"--threads={args.threads}", f"--batch-size={args.batch_size}", *paths]
    # The checkout's own datafeed is measured, installed or not.
    ff_env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
        ),
    )
    contenders = [
        (
            "fleetfeed",
            [sys.executable, str(HERE / "fleetfeed_engine.py"), *common],
            ff_env,
        ),
        (
            "kernel",
            [sys.executable, str(HERE / "fleetfeed_engine.py"), "--kernel", *common],
            ff_env,
        ),
    ]
    if paddle_python:
        # GLOG_minloglevel=2 keeps Paddle's per-thread INFO lines out of the
        # captured stderr, so that an error's tail shows the error.
        pd_env = dict(os.environ, GLOG_minloglevel="2")
        pd_env.pop("PYTHONPATH", None)
        contenders.append(
            (
                "paddle",
                [paddle_python, str(HERE / "paddle_engine.py"), "--iterate", *common],
                pd_env,
            )
        )
    else:
        print("Paddle: skipped (--paddle-python none or not found)", file=sys.stderr)

    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in contenders}
    order = 0
    for repeat in range(args.repeats):
        for name, command, env in contenders:
            result = run_contender(name, command, env, args.timeout)
            result["_order"] = order
            order += 1
            results[name].append(result)
            if name == "kernel":
                progress = f"parse {result['kernel_lines_per_s'] / 1e6:.3f} M lines/s"
            else:
                progress = (
                    f"load {result['load_lines_per_s'] / 1e6:.3f} M lines/s, "
                    f"{result['bytes_per_record']:.0f} bytes/record, "
                    f"shuffle {result['shuffle_s']:.4f} s"
                )
            print(f"[{repeat + 1}/{args.repeats}] {name:9s} {progress}",
                  file=sys.stderr, flush=True)
    counts = {r["records"] for runs in results.values() for r in runs}
    if counts != {args.lines}:
        raise SystemExit(
            f"the contenders loaded {sorted(counts)} records, expected {args.lines}"
        )

    loadavg = (f"{loadavg_before:.2f}", f"{os.getloadavg()[0]:.2f}")
    section = build_report(
        args, paths, results.get("fleetfeed", []), results.get("paddle", []), loadavg,
        results.get("kernel", []),
    )
    print(section)
    if not args.no_write:
        write_section("engine", section, args.results)
        print(f"\nwrote the engine section of {args.results}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ContenderError as exc:
        sys.exit(f"run_engine: {exc}")
