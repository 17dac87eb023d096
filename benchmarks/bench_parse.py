"""Parse rate of the MultiSlot parser on Criteo-layout text.

Makes 1,000,000 lines laid out as fleetfeed's Criteo example feeds them (label
``1 0|1``; 13 dense floats such as ``0.05`` or ``0.00497512437811`` in one
dense slot; 26 sparse slots ``1 <id up to 1e6>``), caches them under
benchmarks/data/, and measures, each contender in its own process:

* ``1-thread``: one ChunkParser fed 4 MiB views of the text (the caller keeps
  the unconsumed tail, as datafeed.source.readers does), a chunk taken after each feed;
* ``2-threads``: the same on two threads, each parsing one half (the GIL is
  released while parsing, so this should approach twice the rate);
* ``reference``: the pure-Python oracle of tests/helpers/reference_parser.py on the
  first 20,000 lines, for scale.

Prints lines/s, MB/s (median of 3 runs) and peak RSS per contender.

    python benchmarks/bench_parse.py [--lines N] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from datafeed import Slot, SlotSchema
from datafeed.parse.parsing import ChunkParser

DATA_DIR = ROOT / "benchmarks" / "data"
FEED_BYTES = 4 * 2**20
SCHEMA = SlotSchema(
    [Slot("label", "int64", (1,)), Slot("dense_feature", "float32", (13,))]
    + [Slot(f"C{i}", "uint64") for i in range(1, 27)]
)


def make_text(lines: int, seed: int = 0) -> bytes:
    """Criteo-layout MultiSlot lines, deterministic for a seed."""
    rng = np.random.default_rng(seed)
    # Dense features as Criteo's preprocessing writes them: zeros, short
    # decimals (counts / 100) and long quotients with 12 significant digits.
    short = [f"{k / 100:g}" for k in range(1, 500)]
    long = [repr(round(float(x), 14)) for x in rng.random(2000) * 0.05]
    pool = np.array(["0.0"] * 600 + short + long)
    dense = pool[rng.integers(0, len(pool), size=(lines, 13))]
    ids = rng.integers(0, 1_000_001, size=(lines, 26)).astype(str)
    labels = rng.integers(0, 2, size=lines).astype(str)
    out = []
    for i in range(lines):
        out.append(f"1 {labels[i]} 13 {' '.join(dense[i])} 1 {' 1 '.join(ids[i])}\n")
    return "".join(out).encode()


def load_text(lines: int) -> bytes:
    path = DATA_DIR / f"criteo_multislot_{lines}.txt"
    if not path.exists():
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(make_text(lines))
        tmp.replace(path)
    return path.read_bytes()


def parse_all(
    data: memoryview, source: str, schema: SlotSchema = SCHEMA, feed_bytes: int = FEED_BYTES
) -> int:
    """Parses ``data`` ``feed_bytes`` at a time, a chunk taken (and dropped)
    after each feed; returns the records parsed."""
    parser = ChunkParser(schema, source)
    start = 0
    while start < len(data):
        end = min(start + feed_bytes, len(data))
        consumed = parser.feed(data[start:end])
        if consumed == 0 and end == len(data):
            break
        start += consumed
        parser.take_chunk()
    parser.feed_final(data[start:])
    parser.take_chunk()
    return parser.records


def run_threads(data: bytes, threads: int, expected: int) -> float:
    """Seconds to parse ``data`` split at line ends over ``threads`` threads."""
    view = memoryview(data)
    bounds = [0]
    for k in range(1, threads):
        bounds.append(data.index(b"\n", len(data) * k // threads) + 1)
    bounds.append(len(data))
    counts = [0] * threads

    def work(k: int) -> None:
        counts[k] = parse_all(view[bounds[k] : bounds[k + 1]], f"part-{k}")

    workers = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    started = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    seconds = time.perf_counter() - started
    if sum(counts) != expected:
        raise RuntimeError(f"parsed {sum(counts)} records, expected {expected}")
    return seconds


def contender(name: str, lines: int, runs: int) -> dict[str, float]:
    data = load_text(lines)
    expected = data.count(b"\n")
    cpu, wall = time.process_time(), time.perf_counter()
    if name == "reference":
        sys.path.insert(0, str(ROOT / "tests" / "helpers"))
        import reference_parser

        data = data[: data.index(b"\n", len(data) * 20_000 // lines) + 1]
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            reference_parser.parse(SCHEMA, data)
            times.append(time.perf_counter() - started)
    else:
        threads = 1 if name == "1-thread" else 2
        times = [run_threads(data, threads, expected) for _ in range(runs)]
    # CPU seconds per wall second: near the thread count when the GIL is free.
    cpu_per_wall = (time.process_time() - cpu) / (time.perf_counter() - wall)
    seconds = statistics.median(times)
    return {
        "cpu_per_wall": cpu_per_wall,
        "lines_per_s": data.count(b"\n") / seconds,  # (reference: a prefix)
        "mb_per_s": len(data) / seconds / 1e6,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "bytes": len(data),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--contender", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.contender and args.contender != "prepare":  # measure one, print JSON
        print(json.dumps(contender(args.contender, args.lines, args.runs)))
        return
    if args.contender == "prepare":
        load_text(args.lines)
        return
    # Each child reports its own peak RSS, and Linux carries ru_maxrss across
    # exec: so this process never holds the text, a child makes it.
    started = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            __file__,
            "--contender",
            "prepare",
            "--lines",
            str(args.lines),
        ],
        check=True,
    )
    size = (DATA_DIR / f"criteo_multislot_{args.lines}.txt").stat().st_size
    print(
        f"{args.lines:,} Criteo-layout lines, {size / 1e6:.0f} MB "
        f"(ready in {time.perf_counter() - started:.1f} s); median of {args.runs}"
    )
    load = os.getloadavg()[0]
    if load > 0.5:
        print(
            f"note: the load average is {load:.1f} before starting; other processes "
            "share the CPUs, so these figures are lower bounds"
        )
    print(
        f"{'contender':<12} {'lines/s':>12} {'MB/s':>8} {'CPU/wall':>9} "
        f"{'peak RSS MB':>12}"
    )
    for name in ("1-thread", "2-threads", "reference"):
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--contender",
                name,
                "--lines",
                str(args.lines),
                "--runs",
                str(args.runs),
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        r = json.loads(out)
        print(
            f"{name:<12} {r['lines_per_s']:>12,.0f} {r['mb_per_s']:>8.1f} "
            f"{r['cpu_per_wall']:>9.2f} {r['peak_rss_mb']:>12.0f}"
        )


if __name__ == "__main__":
    main()
