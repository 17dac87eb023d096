"""What authentication costs the parameter server: the same job with a job key
(CURVE: handshake, encrypted and authenticated traffic) and without one (the
transport's NULL mechanism), alternating in every repeat.

The job is bench_ps.py's (1 server + 2 workers, wide&deep on Criteo-layout
records, loading not timed). Reported: records/s per worker, median over the
repeats x 2 workers, and the ratio keyed / keyless paired by repeat; and each
worker's CPU time per batch (steadier than records/s on a shared machine:
encryption shows there, whatever else the machine runs).

Usage: python benchmarks/bench_ps_auth.py [--modes async geo] [--repeats 3]
       [--records 20000] [--epochs 1] [--no-write]
Results go to benchmarks/results/ps_auth.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_ps  # noqa: E402 - the job and its data live there

RESULTS = Path(__file__).resolve().parent / "results" / "ps_auth.md"


def rate(workers: list[dict]) -> float:
    """Median records/s over a job's workers."""
    return statistics.median(w["records"] / w["seconds"] for w in workers)


def cpu_ms(workers: list[dict]) -> float:
    """Median worker CPU milliseconds per batch over a job's workers."""
    return statistics.median(w["cpu_ms"] for w in workers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", nargs="+", default=["async", "geo"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    job_args = bench_ps.default_job_args(records=args.records, epochs=args.epochs)
    files = bench_ps.ensure_data(args.records)
    rates: dict[tuple[str, str], list[float]] = {}
    cpus: dict[tuple[str, str], list[float]] = {}
    ratios: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_ps_auth-") as tmp:
        for repeat in range(args.repeats):
            for mode in args.modes:
                order = [("key", bench_ps.JOB_KEY), ("no key", None)]
                if repeat % 2:
                    order.reverse()
                got = {}
                for who, key in order:
                    job_dir = Path(tmp) / f"{mode}-{who.replace(' ', '')}-{repeat}"
                    job_dir.mkdir()
                    workers = bench_ps.run_job(mode, job_args, files, job_dir, key=key)
                    got[who] = rate(workers)
                    rates.setdefault((mode, who), []).append(got[who])
                    cpus.setdefault((mode, who), []).append(cpu_ms(workers))
                    print(f"{mode} {who}: {got[who]:,.0f} records/s per worker, "
                          f"{cpu_ms(workers):.2f} CPU ms/batch", flush=True)
                ratios.setdefault(mode, []).append(got["key"] / got["no key"])
    lines = ["| mode | with key (CURVE) records/s | without key (NULL) records/s "
             "| keyed / keyless, paired (median, range) | worker CPU ms/batch, key / no key "
             "| CPU keyed / keyless |", "|---|---:|---:|---|---:|---:|"]
    for mode in args.modes:
        paired = sorted(ratios[mode])
        cpu_key = statistics.median(cpus[(mode, "key")])
        cpu_none = statistics.median(cpus[(mode, "no key")])
        lines.append(
            f"| {mode} | {statistics.median(rates[(mode, 'key')]):,.0f} | "
            f"{statistics.median(rates[(mode, 'no key')]):,.0f} | "
            f"{statistics.median(paired):.3f}x ({paired[0]:.3f}-{paired[-1]:.3f}) | "
            f"{cpu_key:.2f} / {cpu_none:.2f} | {cpu_key / cpu_none:.3f}x |"
        )
    table = "\n".join(lines) + "\n"
    print(table)
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(
            "# Parameter server: the cost of authentication\n\n"
            f"bench_ps.py's job (1 server + 2 workers, wide&deep), {args.records:,} records per "
            f"worker x {args.epochs} epoch(s), keyed and keyless jobs alternating, "
            f"{args.repeats} repeats, `python benchmarks/bench_ps_auth.py "
            f"--repeats {args.repeats}`.\n\n" + table
        )


if __name__ == "__main__":
    main()
