"""The parameter server with latency between workers and servers (issue 28).

A 1 server + 2 workers job (``--model wide_deep``: bench_ps.py's wide&deep on
Criteo-layout records, batch 512; ``--model small_ctr``: bench_small_ctr.py's
small CTR model, batch 256, whose steps are the shortest) with the workers
reaching the server through a userspace relay that adds a
chosen one-way delay (tests/helpers/latency_relay.py: the kernel here has no
netem). Every run goes through a relay, the baseline with 0 added delay, so
that the relay's own cost cancels out of each contender's ratio. With
``--paddle``, Paddle 3.0.0's parameter server (paddle_ps.py) runs the same
job through the same relays, as the anchor. Runs alternate: within each
repeat and mode, every delay and contender in turn, the order reversed on odd
repeats.

The small CTR model trains through ``train_from_dataset``, whose async
workers send their pulls ahead (trainer/embedding/ahead.py); a third
contender, ``pull_ahead=0``, runs the same job with each forward waiting for
its pull, as before issue 28. The wide&deep job trains in a loop of its own
(bench_ps.py), which sends nothing ahead.

Prints and writes ``benchmarks/results/ps_latency.md`` (``--model
small_ctr``: ``ps_latency_small_ctr.md``; with other ``--records`` or
``--epochs`` than the defaults, ``_<records>x<epochs>`` is added to the name;
``--no-write``: print only): per
mode, contender and delay, records/s per worker (median over the runs and
both workers), the ratio to the contender's own rate at 0 added delay and to
Paddle's at the same delay, the held-out AUC and its change from 0 added
delay, and the batches the workers' pulls went ahead.

    python benchmarks/bench_ps_latency.py --delays-ms 0 1 --modes async geo --repeats 2 --paddle
    python benchmarks/bench_ps_latency.py --model small_ctr --repeats 7 --paddle
    python benchmarks/bench_ps_latency.py --model small_ctr --records 80000 --repeats 3 --paddle
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import results_file
from bench_ps import (
    PADDLE_PYTHON,
    RELAYED_BYTES,
    default_job_args,
    ensure_data,
    paddle_data,
    run_job,
    run_paddle_job,
)

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delays-ms", type=float, nargs="+", default=[0.0, 1.0],
                        help="one-way delays added by the relay, in milliseconds")
    parser.add_argument("--modes", nargs="+", default=["async", "geo"],
                        choices=["async", "geo", "sync"])
    parser.add_argument("--model", choices=["wide_deep", "small_ctr"], default="wide_deep")
    parser.add_argument("--records", type=int, default=20_000,
                        help="wide_deep: records per worker; small_ctr: lines per file (4 files)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--paddle", action="store_true", help="Paddle 3.0.0's PS alongside")
    parser.add_argument("--paddle-python", default=str(PADDLE_PYTHON))
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if 0.0 not in args.delays_ms:
        parser.error("--delays-ms needs 0: every ratio is to the rate at 0 added delay")
    if args.paddle and not Path(args.paddle_python).exists():
        parser.error(f"--paddle needs Paddle 3.0.0's interpreter at {args.paddle_python} "
                     "(make bench-paddle-ps builds it)")
    job = default_job_args(records=args.records, epochs=args.epochs,
                           paddle_python=args.paddle_python)
    load_before = results_file.load_average()
    run = job_runner(args, job)
    contenders = ["fleetfeed"] + (["fleetfeed-pull-in-forward"] if args.model == "small_ctr"
                                  else []) + (["paddle"] if args.paddle else [])
    runs: dict[tuple[str, str, float], list[list[dict]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_ps_latency-") as tmp:
        for repeat in range(args.repeats):
            for mode in args.modes:
                turns = [(who, delay) for delay in args.delays_ms for who in contenders
                         if mode == "async" or who != "fleetfeed-pull-in-forward"]
                if repeat % 2:
                    turns.reverse()
                for who, delay in turns:
                    job_dir = Path(tmp) / f"{who}-{mode}-{delay}-{repeat}"
                    job_dir.mkdir()
                    workers = run(who, mode, delay / 1000, job_dir)
                    workers[0]["relayed_bytes"] = RELAYED_BYTES[-1]
                    runs.setdefault((who, mode, delay), []).append(workers)
                    rates = ", ".join(f"{w['records'] / w['seconds']:,.0f}" for w in workers)
                    print(f"{who} {mode} +{delay:g} ms: {rates} records/s per worker, "
                          f"AUC {workers[0]['auc']:.4f}, batches ahead "
                          f"{', '.join(str(depth(w)) for w in workers)}", flush=True)
    table = results_table(args, contenders, runs)
    print(table)
    if not args.no_write:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        name = "ps_latency" if args.model == "wide_deep" else "ps_latency_small_ctr"
        if args.records != 20_000 or args.epochs != 2:  # not the job the docs quote
            name += f"_{args.records}x{args.epochs}"
        what = (
            f"bench_ps.py's job (wide&deep, {args.records:,} Criteo-layout records per worker "
            f"x {args.epochs} epochs, batch {job.batch_size})" if args.model == "wide_deep"
            else f"bench_small_ctr.py's PS job (the small CTR model, 4 files x {args.records:,} "
            f"lines, 2 per worker, x {args.epochs} epochs, batch 256)"
        )
        (RESULTS_DIR / f"{name}.md").write_text(
            "# Parameter server with latency: 1 server + 2 workers through a relay\n\n"
            f"{what}, the workers reaching the "
            "server through tests/helpers/latency_relay.py with the added one-way delay "
            "given (0: the relay alone), medians over "
            f"{args.repeats} run(s) x 2 workers, alternating, `{results_file.command()}` at "
            f"{results_file.commit()}, 1-minute load average {load_before:.2f} before the "
            "runs. The machine's 2 cores are shared by the 3 processes, the relay's "
            "threads and anything else running."
            + (" Paddle: paddlepaddle 3.0.0, `benchmarks/paddle_ps.py` (see results/ps.md)."
               if args.paddle else "")
            + "\n\n" + table
        )


def job_runner(args: argparse.Namespace, job: argparse.Namespace):
    """``run(who, mode, delay seconds, directory)`` -> the workers' results, for
    the model of ``args``."""
    if args.model == "wide_deep":
        files = ensure_data(args.records)
        paddle_files, vocab = paddle_data(files) if args.paddle else ([], 0)

        def run(who: str, mode: str, delay: float, directory: Path) -> list[dict]:
            # This job's workers train in a loop of their own: no pulls ahead.
            if who == "fleetfeed":
                return run_job(mode, job, files, directory, delay=delay)
            return run_paddle_job(mode, job, paddle_files, vocab, directory, delay=delay)

        return run
    import bench_small_ctr
    import make_small_ctr

    options = bench_small_ctr.parser_of_options().parse_args(
        ["--lines", str(args.records), "--epochs", str(args.epochs),
         "--paddle-ps", args.paddle_python]
    )
    data = (bench_small_ctr.DATA if args.records == 20000
            else bench_small_ctr.DATA.parent / f"small_ctr-{args.records}")
    files, held = make_small_ctr.write(data, args.records, 4)

    def run_small(who: str, mode: str, delay: float, directory: Path) -> list[dict]:
        ahead = 0 if who == "fleetfeed-pull-in-forward" else -1
        who = "paddle" if who == "paddle" else "fleetfeed"
        return bench_small_ctr.run_ps(
            who, mode, options, files, held, directory, delay, pull_ahead=ahead
        )["workers"]

    return run_small


def results_table(
    args: argparse.Namespace, contenders: list[str],
    runs: dict[tuple[str, str, float], list[list[dict]]],
) -> str:
    lines = [
        "| mode | contender | added one-way delay (ms) | records/s per worker "
        "| x its rate at 0 ms | x Paddle's at this delay | AUC | AUC - its AUC at 0 ms "
        "| batches ahead | MB through the relay per run |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode in args.modes:
        for who in contenders:
            if (who, mode, 0.0) not in runs:
                continue
            base = rate(runs[(who, mode, 0.0)])
            base_auc = statistics.median(run[0]["auc"] for run in runs[(who, mode, 0.0)])
            for delay in args.delays_ms:
                these = runs[(who, mode, delay)]
                auc = statistics.median(run[0]["auc"] for run in these)
                relayed = statistics.median(run[0]["relayed_bytes"] for run in these) / 1e6
                paddle = runs.get(("paddle", mode, delay))
                versus = f"{rate(these) / rate(paddle):.2f}x" if paddle else "-"
                depths = sorted({depth(w) for run in these for w in run})
                lines.append(
                    f"| {mode} | {CONTENDERS.get(who, who)} | {delay:g} "
                    f"| {rate(these):,.0f} | {rate(these) / base:.2f}x | {versus} | {auc:.4f} "
                    f"| {auc - base_auc:+.4f} | {', '.join(map(str, depths))} | {relayed:,.1f} |"
                )
    return "\n".join(lines) + "\n"


CONTENDERS = {
    "paddle": "Paddle 3.0.0",
    "fleetfeed-pull-in-forward": "fleetfeed, pull_ahead=0 (each forward waits for its pull)",
}


def depth(worker: dict) -> int | str:
    """The batches a worker's pulls went ahead at the end (its RunSummary); 0:
    none sent; "-": not reported (Paddle, or a loop of the benchmark's own)."""
    if "pulls_ahead" not in worker:
        return "-"
    ahead = worker["pulls_ahead"]
    return 0 if not ahead else ahead["depth"]


def rate(runs: list[list[dict]]) -> float:
    """Records/s per worker: the median over every worker of every run."""
    return statistics.median(w["records"] / w["seconds"] for run in runs for w in run)


if __name__ == "__main__":
    sys.exit(main())
