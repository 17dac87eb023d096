"""Long mutation fuzzing of the parameter server's wire: millions of messages.

A key holder (``tests/helpers/wire_fuzz.py``) sends mutated requests (random
bytes, huge integers, deep nesting, bad shapes and dtypes, truncations, wrong
frame counts, other operations' arguments) to a real server process serving
the real handlers, in batches of ``--check-every``; after each batch the server
must answer a legitimate ``describe`` within 15 s, and its resident memory is
read. The run fails (exit 1) when the server dies or stops answering, or when
its RSS grows more than ``--rss-bound`` MiB past the reading after warm-up (the
first ``--warm-up`` messages: the table's rows, the allocator's arenas).

Prints a progress line per million messages and one JSON line at the end;
writes benchmarks/results/ps_wire_fuzz.md unless ``--no-write``.

Usage: python benchmarks/fuzz_ps_wire.py [--messages 10000000] [--check-every 10000]
       [--seed 1] [--hours 2] [--rss-bound 64] [--warm-up 200000] [--refuse OP]
       [--no-write]

``--refuse worker_done`` measures the wire alone: ``ParameterServer.worker_done``
keeps one future per call once every worker is done (about 1.6 KB each), so a
fuzzer that repeats it grows the server by design of that handler, not of the wire.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "helpers"))

import wire_fuzz  # noqa: E402
from support import reserved_ports  # noqa: E402

RESULTS = HERE / "results" / "ps_wire_fuzz.md"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000_000)
    parser.add_argument("--check-every", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hours", type=float, default=2.0, help="stop after this long anyway")
    parser.add_argument("--rss-bound", type=float, default=64.0, help="MiB past warm-up")
    parser.add_argument("--warm-up", type=int, default=200_000, help="messages")
    parser.add_argument("--refuse", action="append", default=[], metavar="OP",
                        help="an operation the target refuses (its handler's own memory)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    readings: list[tuple[int, float]] = []  # (messages sent, RSS MiB) after each batch
    next_report = [1_000_000]
    failure = None
    with tempfile.TemporaryDirectory() as scratch, reserved_ports(1) as (port,):
        endpoint = f"127.0.0.1:{port}"
        log_path = Path(scratch) / "target.log"
        with wire_fuzz.running_target(
            endpoint, log_path, refused_ops=tuple(args.refuse)
        ) as target:
            rss_start = target.rss_mib()
            started = time.monotonic()

            def after_batch(counts: wire_fuzz.FuzzCounts) -> None:
                readings.append((counts.sent, target.rss_mib()))
                if counts.sent >= next_report[0]:
                    next_report[0] += 1_000_000
                    rate = counts.sent / (time.monotonic() - started)
                    print(f"{counts.sent:>11,} messages  {rate:,.0f}/s  RSS "
                          f"{readings[-1][1]:.0f} MiB  slowest answer "
                          f"{counts.slowest_liveness_s:.2f}s", flush=True)

            try:
                counts = wire_fuzz.fuzz(
                    endpoint, args.seed, args.messages, args.hours * 3600, args.check_every,
                    on_batch=after_batch,
                )
            except wire_fuzz.ServerDied as died:
                counts, failure = None, f"{died}; server log: {target.log()[-2000:]}"
            seconds = time.monotonic() - started
            alive = target.alive()
            log_lines = target.log().count("\n")
            rss_end = target.rss_mib() if alive else float("nan")
    if counts is None:
        print(f"FAILED: {failure}")
        return 1
    warm = next((rss for sent, rss in readings if sent >= args.warm_up), readings[-1][1])
    peak = max(rss for _, rss in readings)
    growth = peak - warm
    summary = {
        "messages": counts.sent, "seconds": round(seconds, 1), "refused_ops": args.refuse,
        "messages_per_s": round(counts.sent / seconds), "seed": args.seed,
        "liveness_checks": counts.liveness_checks,
        "slowest_liveness_s": round(counts.slowest_liveness_s, 3),
        "error_replies": counts.error_replies, "result_replies": counts.result_replies,
        "error_types": counts.error_types, "rss_start_mib": round(rss_start, 1),
        "rss_after_warm_up_mib": round(warm, 1), "rss_peak_mib": round(peak, 1),
        "rss_end_mib": round(rss_end, 1), "server_log_lines": log_lines, "alive": alive,
    }
    print(json.dumps(summary))
    ok = alive and growth <= args.rss_bound
    if not args.no_write:
        write_results(summary, args, ok)
    if not ok:
        print(f"FAILED: server alive {alive}, RSS grew {growth:.0f} MiB past warm-up "
              f"(bound {args.rss_bound:g})")
    return 0 if ok else 1


def write_results(summary: dict, args: argparse.Namespace, ok: bool) -> None:
    lines = [
        "# Parameter-server wire fuzzing",
        "",
        f"`python benchmarks/fuzz_ps_wire.py --messages {args.messages} --check-every "
        f"{args.check_every} --seed {args.seed}"
        + "".join(f" --refuse {op}" for op in args.refuse)
        + f"` on {datetime.date.today()}: mutated requests "
        "from a key holder against one server process with the real handlers; a legitimate "
        f"`describe` after every {args.check_every:,} messages.",
        "",
        "| messages | seconds | messages/s | liveness checks | slowest answer | "
        "RSS start / after warm-up / peak / end (MiB) | server log lines | result |",
        "|---|---|---|---|---|---|---|---|",
        f"| {summary['messages']:,} | {summary['seconds']:,} | {summary['messages_per_s']:,} | "
        f"{summary['liveness_checks']:,} | {summary['slowest_liveness_s']} s | "
        f"{summary['rss_start_mib']} / {summary['rss_after_warm_up_mib']} / "
        f"{summary['rss_peak_mib']} / {summary['rss_end_mib']} | {summary['server_log_lines']} | "
        f"{'passed' if ok else 'FAILED'} |",
        "",
        f"Replies: {summary['error_replies']:,} errors ({summary['error_types']}), "
        f"{summary['result_replies']:,} results; the other messages had no readable id and "
        "were dropped.",
        "",
    ]
    RESULTS.write_text("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
