"""Instruction count and single-thread rate of the parser loop alone.

Parses the first N lines of a Criteo-layout file (make_criteo.py layout: 13
dense floats, 26 uint64 ids, a label; or bench_parse.py's layout with
``--layout bench``) with one ChunkParser fed 4 MiB views, as readers.py does.

    python benchmarks/bench_parse_instr.py [--lines N] [--runs R] [--layout criteo|bench]

Under callgrind, count only the loop:

    valgrind --tool=callgrind --collect-atstart=no \
        --toggle-collect='__pyx_f_8datafeed_6_parse_6Engine__run' \
        /root/.pyenv/versions/3.11.7/bin/python3.11 benchmarks/bench_parse_instr.py \
        --lines 100000 --runs 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_parse import parse_all  # the same feed loop as readers.py

from datafeed import Slot, SlotSchema

CRITEO = SlotSchema(
    [Slot("dense_input", "float32", (13,))]
    + [Slot(f"C{i}", "uint64") for i in range(1, 27)]
    + [Slot("label", "int64", (1,))]
)
BENCH = SlotSchema(
    [Slot("label", "int64", (1,)), Slot("dense_feature", "float32", (13,))]
    + [Slot(f"C{i}", "uint64") for i in range(1, 27)]
)


def load(layout: str, lines: int) -> bytes:
    """The first ``lines`` lines of the layout's data file, made if missing."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    if layout == "criteo":
        from make_criteo import make_criteo

        # run_engine.py's defaults: 1,000,000 lines in 8 files, seed 0.
        path = Path(
            make_criteo(ROOT / "benchmarks" / "data" / "criteo", 1_000_000, 8)[0]
        )
    else:
        from bench_parse import load_text

        load_text(1_000_000)
        path = ROOT / "benchmarks" / "data" / "criteo_multislot_1000000.txt"
    out = []
    n = 0
    with open(path, "rb") as f:
        for line in f:
            out.append(line)
            n += 1
            if n == lines:
                break
    return b"".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--layout", choices=("criteo", "bench"), default="criteo")
    args = ap.parse_args()
    schema = CRITEO if args.layout == "criteo" else BENCH
    data = load(args.layout, args.lines)
    view = memoryview(data)
    wall, cpu = [], []
    for _ in range(args.runs):
        w, c = time.perf_counter(), time.thread_time()
        n = parse_all(view, "bench", schema)
        cpu.append(n / (time.thread_time() - c))
        wall.append(n / (time.perf_counter() - w))
    expected = data.count(b"\n")
    if n != expected:
        raise RuntimeError(f"parsed {n} records, expected {expected}")
    print(f"{n:,} lines, {len(data) / n:.0f} B/line, median of {args.runs}:")
    for name, rates in (("wall-clock", sorted(wall)), ("CPU time", sorted(cpu))):
        print(
            f"  {name:<10} {statistics.median(rates) / 1e6:.3f} M lines/s "
            f"(min {rates[0] / 1e6:.3f}, max {rates[-1] / 1e6:.3f})"
        )


if __name__ == "__main__":
    main()
