"""Soak of the online loop through crashes (issue 29): two days of hourly slices
(48 passes) landing on a schedule while examples/online_training/train.py
trains them under ``fleetrun --max_restarts`` (1 server, 2 workers), with ten
SIGKILLs of random processes at random moments, against the same job run
without a failure; in sync mode and in async mode.

Each run is checked (tests/helpers/online_soak.py): every record of every
slice dumped once by its pass, every pass listed once and in order in
donefile.txt and in the serving done files, every listed save complete. Then:
sync mode, the final tables against the run without failures (the same rows,
the largest difference of any value); async mode, the mean of the passes'
cluster AUCs; both, the time from the end of one pass's training (its last
worker) to the start of the next's (its first worker) against the pass's
training time, for the passes whose slices were there (preloaded).

Prints and writes ``benchmarks/results/online_soak.md``.

Usage: python benchmarks/soak_online.py [--lines 25000] [--kills 10] [--seed 29]
       [--modes sync,async] [--every 0.5]
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "helpers"))

import online_soak  # noqa: E402
import results_file  # noqa: E402

RESULTS = HERE / "results" / "online_soak.md"


def gaps(job: online_soak.Job) -> dict[str, float]:
    """Gap / training time of each preloaded pass, by "day/pass"."""
    return {f"{day}/{number}": p["gap"] / p["trained"]
            for (day, number), p in online_soak.pass_lines(job).items()
            if p["gap"] is not None and p["preloaded"]}


def describe_gaps(ratios: dict[str, float]) -> str:
    if not ratios:
        return "no preloaded pass"
    over = {name: r for name, r in ratios.items() if r > 0.05}
    return (f"median {statistics.median(ratios.values()):.1%}, {len(over)} of {len(ratios)} "
            f"over 5%" + (": " + ", ".join(f"{n} {r:.1%}" for n, r in over.items())
                          if over else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=25000, help="lines per file (2 per slice)")
    parser.add_argument("--days", type=int, default=2)
    parser.add_argument("--hours", type=int, default=24)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=29)
    parser.add_argument("--every", type=float, default=0.5, help="seconds between slices")
    parser.add_argument("--modes", default="sync,async")
    args = parser.parse_args()
    schedule = online_soak.Schedule(days=args.days, hours=args.hours, lines=args.lines,
                                    every=args.every)
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    loads = [results_file.load_average()]
    lines = [
        "# The online loop through crashes",
        "",
        f"`{results_file.command()}` at {results_file.commit()}, started {started}: "
        f"{args.days} days x {args.hours} hourly slices of 2 x {args.lines:,} records, one "
        f"landing every {args.every:g} s while examples/online_training/train.py trains "
        f"them (1 server, 2 workers, `fleetrun --max_restarts={args.kills + 2}`); each mode "
        f"run once without a failure and once with {args.kills} SIGKILLs, each after a "
        f"wait of 1-8 s (drawn, seed {args.seed}) from the moment an attempt's workers "
        f"exist, of the server or a worker (3 in 4) or one of their children (a reader's "
        f"`cat`, a dump writer).",
        "",
    ]
    failed = False
    with tempfile.TemporaryDirectory(prefix="soak_online.") as scratch:
        root = Path(scratch)
        source = online_soak.make_source(root / "source", schedule)
        last_base = f"{schedule.day_names()[-1]}/base"
        for mode in args.modes.split(","):
            runs = {}
            for name, kills in (("without failures", 0), (f"{args.kills} kills", args.kills)):
                print(f"{mode}, {name} ...", flush=True)
                job = online_soak.run_job(
                    root / f"{mode}-{kills}", source, schedule, mode, kills,
                    seed=args.seed + len(runs), wait=(1.0, 8.0), progress=print)
                loads.append(results_file.load_average())
                problems = ([f"fleetrun exited {job.returncode}"] if job.returncode else []) + (
                    online_soak.check(job, source, schedule) if job.returncode == 0 else [])
                failed |= bool(problems) or len(job.kills) != kills
                runs[name] = (job, problems)
                print(f"{mode}, {name}: {job.seconds:.0f} s, {job.restarts} restarts, "
                      f"problems: {problems or 'none'}", flush=True)
            (clean, clean_problems), (crashed, crashed_problems) = runs.values()
            lines += [f"## {mode} mode", "",
                      f"| run | seconds | restarts | checks | pass AUC (mean of "
                      f"{len(schedule.slices())}) | gap / training, preloaded passes |",
                      "|---|---:|---:|---|---:|---|"]
            aucs = {}
            for name, (job, problems) in runs.items():
                passes = online_soak.pass_lines(job)
                aucs[name] = statistics.mean(p["auc"] for p in passes.values()) if passes else 0
                lines.append(f"| {name} | {job.seconds:.0f} | {job.restarts} | "
                             f"{'; '.join(problems) or 'all held'} | {aucs[name]:.4f} | "
                             f"{describe_gaps(gaps(job))} |")
            lines.append("")
            if not clean_problems and not crashed_problems:
                if mode == "sync":
                    difference = online_soak.table_difference(
                        clean.out / last_base, crashed.out / last_base)
                    failed |= difference > 1e-5
                    lines.append(f"Final tables ({last_base}), crashed against without "
                                 f"failures: largest difference of any value {difference:g} "
                                 f"(acceptance: the same rows, within 1e-5).")
                else:
                    difference = abs(aucs["without failures"] - aucs[f"{args.kills} kills"])
                    failed |= difference > 0.002
                    lines.append(f"Mean pass AUC, crashed against without failures: "
                                 f"{difference:.4f} apart (acceptance: within 0.002).")
                lines.append("")
            lines += ["| kill | at (s) | attempt | process | donefile.txt's last line then |",
                      "|---:|---:|---:|---|---|"]
            lines += [f"| {i} | {k.at} | {k.attempt} | {k.victim} | {k.listed} |"
                      for i, k in enumerate(crashed.kills, 1)]
            lines.append("")
    lines.append(f"1-minute load average before each run: {', '.join(f'{v:.2f}' for v in loads)}.")
    text = "\n".join(lines) + "\n"
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(text)
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
