"""The test suite, run whole several times: how long it takes and whether it flakes.

    python benchmarks/suite_rounds.py                       # make test's run, once
    python benchmarks/suite_rounds.py --rounds 5 --random-order --busy-loops 2
    python benchmarks/suite_rounds.py --quick               # without slow/distributed tests

Each round is one pytest run (``make test``'s command: two pytest-xdist workers
taking whole files unless ``--workers``; with ``--random-order``
pytest-randomly's order under a seed of its own, printed so that a failing
round can be replayed); ``--busy-loops N`` keeps N processes
spinning beside the rounds (a loaded machine). A round that passes its time
limit is stopped and counted as a hang. Writes ``benchmarks/results/NAME.md``
(``suite`` unless ``--name``) with every round, the commit, the command and the
machine's load, and exits 1 when a round did not pass.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from results_file import command, commit, load_average

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"
# pytest's last line: "2 failed, 1192 passed, 1 skipped in 1545.49s (0:25:45)",
# framed by "=" signs unless -q.
SUMMARY = re.compile(
    r"^=*\s*(?P<counts>\d+ \w+(?:, \d+ \w+)*) in (?P<seconds>[\d.]+)s", re.M
)
DURATION = re.compile(r"^(?P<seconds>[\d.]+)s (?P<phase>call|setup|teardown)\s+(?P<test>\S+)", re.M)
SLOWEST = 15  # the tests listed per round, slowest first


def _busy_loops(count: int) -> list[subprocess.Popen]:
    return [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(count)
    ]


def _round(args: argparse.Namespace, seed: int) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           f"--durations={SLOWEST}"]
    cmd += [f"--randomly-seed={seed}"] if args.random_order else ["-p", "no:randomly"]
    if args.workers:
        cmd += ["-n", str(args.workers), "--dist", "loadfile"]
    if args.quick:
        cmd += ["-m", "not slow and not distributed"]
    started = time.monotonic()
    process = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=args.round_timeout)
        hung = False
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        hung = True
    wall = time.monotonic() - started
    counts = {}
    match = ([None] + list(SUMMARY.finditer(output)))[-1]  # pytest's last summary line
    if match is not None:
        for part in match.group("counts").split(", "):
            number, _, kind = part.partition(" ")
            if number.isdigit():
                counts[kind] = int(number)
    failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.M)))
    ok = not hung and process.returncode == 0
    return {
        "seed": seed if args.random_order else "-", "ok": ok, "hung": hung, "wall": wall,
        "returncode": process.returncode, "counts": counts, "failed": failed,
        "slowest": [(float(m["seconds"]), m["phase"], m["test"])
                    for m in DURATION.finditer(output)],
        "tail": output[-3000:],
    }


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def _write(
    args: argparse.Namespace, name: str, rounds: list[dict], load_before: float, started: str
) -> int:
    """Writes the rounds run so far to results/NAME.md; the number that failed."""
    failures = sum(not r["ok"] for r in rounds)
    hangs = sum(r["hung"] for r in rounds)
    walls = sorted(r["wall"] for r in rounds)
    kind = "the tests not marked slow or distributed" if args.quick else "the whole suite"
    order = "pytest-randomly's order, a seed per round" if args.random_order else \
        "make test's order (-p no:randomly)"
    workers = (f"{args.workers} pytest-xdist workers (whole files each)" if args.workers
               else "one pytest process")
    lines = [
        f"# The test suite, {len(rounds)} of {args.rounds} round(s)",
        "",
        f"`{command()}` at {commit()}, started {started}: {kind}, a pytest run per round "
        f"on {workers}, {order}, {args.busy_loops} busy loop(s) beside it on {os.cpu_count()} "
        f"CPU(s); 1-minute load average {load_before:.2f} before the first round. "
        f"{len(rounds) - failures} of {len(rounds)} round(s) passed, {hangs} hung; "
        f"median round {_minutes(walls[len(walls) // 2])}.",
        "",
        "| round | seed | result | passed | failed | skipped | wall time | load after |",
        "|---:|---:|---|---:|---:|---:|---|---:|",
    ]
    for index, r in enumerate(rounds, 1):
        verdict = "passed" if r["ok"] else ("hung" if r["hung"] else "failed")
        counts = r["counts"]
        lines.append(
            f"| {index} | {r['seed']} | {verdict} | {counts.get('passed', 0)} | "
            f"{counts.get('failed', 0) + counts.get('errors', 0) + counts.get('error', 0)} | "
            f"{counts.get('skipped', 0)} | {_minutes(r['wall'])} | {r['load']:.2f} |"
        )
    for index, r in enumerate(rounds, 1):
        if r["failed"]:
            lines.append(f"\nRound {index} failed: " + ", ".join(f"`{t}`" for t in r["failed"]))
    slowest = rounds[-1]["slowest"]
    if slowest:
        lines += [
            "", f"Where the last round's time went: its {len(slowest)} slowest test phases "
            f"(pytest --durations), {sum(t for t, _, _ in slowest):.0f} s of "
            f"{rounds[-1]['wall']:.0f} s.", "",
            "| seconds | phase | test |", "|---:|---|---|",
            *(f"| {t:.1f} | {phase} | `{test}` |" for t, phase, test in slowest),
        ]
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"{name}.md"
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path.relative_to(ROOT)}", flush=True)
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--random-order", action="store_true",
                        help="each round in pytest-randomly's order under its own seed")
    parser.add_argument("--busy-loops", type=int, default=0,
                        help="processes spinning beside the rounds (a loaded machine)")
    parser.add_argument("--quick", action="store_true",
                        help="leave out the tests marked slow or distributed")
    parser.add_argument("--round-timeout", type=float, default=45 * 60,
                        help="seconds after which a round counts as a hang (default 45 min)")
    parser.add_argument("--workers", type=int, default=2,
                        help="pytest-xdist workers, as make test's PYTEST_WORKERS "
                             "(default 2; 0: one process)")
    parser.add_argument("--first-seed", type=int, default=1000)
    parser.add_argument("--name", default=None,
                        help="the results file's name (default suite, suite_quick, "
                             "or suite_loaded with busy loops)")
    args = parser.parse_args(argv)
    name = args.name or ("suite_loaded" if args.busy_loops else
                         "suite_quick" if args.quick else "suite")
    load_before = load_average()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    loops = _busy_loops(args.busy_loops)
    rounds = []
    try:
        for index in range(args.rounds):
            result = _round(args, args.first_seed + index)
            result["load"] = load_average()
            rounds.append(result)
            verdict = "passed" if result["ok"] else ("HUNG" if result["hung"] else "FAILED")
            print(f"round {index + 1}/{args.rounds} (seed {result['seed']}): {verdict} in "
                  f"{_minutes(result['wall'])}, {result['counts']}", flush=True)
            if not result["ok"]:
                print(result["tail"], flush=True)
            _write(args, name, rounds, load_before, started)  # what ran so far
    finally:
        for loop in loops:
            os.killpg(loop.pid, signal.SIGKILL)
            loop.wait()
    failures = _write(args, name, rounds, load_before, started)
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
