"""Longer mutation fuzzing of the parser: several seeds, one subprocess each.

Each subprocess runs tests/helpers/parser_fuzz.py (the Cython parser against the
reference parser on mutated MultiSlot text, raise and skip modes) for the given
time; a crash is a non-zero exit, a hang the timeout. Prints the counts and
writes the "fuzz" section of benchmarks/RESULTS.md.

Usage: python benchmarks/fuzz_parser.py [--seconds 60] [--seeds 4]
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

from results_file import write_section  # a sibling script

FUZZER = Path(__file__).resolve().parent.parent / "tests" / "parser_fuzz.py"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="per seed")
    parser.add_argument("--seeds", type=int, default=4)
    args = parser.parse_args()
    rows, crashes = [], 0
    for seed in range(1, args.seeds + 1):
        done = subprocess.run(
            [sys.executable, str(FUZZER), str(args.seconds), str(seed)],
            check=False, capture_output=True, text=True, timeout=args.seconds * 4 + 60,
        )
        if done.returncode != 0:
            crashes += 1
            print(f"seed {seed}: FAILED (exit {done.returncode})\n{done.stderr[-3000:]}")
            continue
        counts = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append(counts)
        print(json.dumps(counts))
    total = {k: sum(r[k] for r in rows) for k in ("inputs", "parse_errors", "records_compared",
                                                   "skipped_lines", "mismatches")}
    lines = [
        "## Parser fuzzing",
        "",
        (f"`python benchmarks/fuzz_parser.py --seconds {args.seconds:g} --seeds {args.seeds}` on "
        f"{datetime.date.today()}: mutated MultiSlot text (truncations, bit flips, huge counts and "
        "numbers, NUL bytes, invalid UTF-8, stray whitespace and CRs, lines over `max_line_bytes`, "
        "empty input) parsed by the Cython parser (random split points) and the reference parser, "
        "in raise and skip modes; outcomes must be identical."),
        "",
        "| seeds | inputs tried | ParseErrors | records compared | lines skipped | mismatches "
        "| crashes or hangs |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        (f"| {len(rows)} | {total['inputs']:,} | {total['parse_errors']:,} "
         f"| {total['records_compared']:,} | {total['skipped_lines']:,} | {total['mismatches']} "
         f"| {crashes} |"),
    ]
    write_section("fuzz", "\n".join(lines))
    print("\n".join(lines))
    sys.exit(1 if crashes or total["mismatches"] else 0)


if __name__ == "__main__":
    main()
