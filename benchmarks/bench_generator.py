"""The generator benchmark: one Criteo reader.py on three base classes.

Runs ``readers/criteo_reader.py`` as a real generator process,
``python criteo_reader.py < criteo.tsv``, its stdout read through a pipe as
fleetfeed and Paddle read it, with the base class taken from:

* ``fleetfeed``: ``generators.MultiSlotDataGenerator``;
* ``oracle``: ``tests/helpers/paddle_generator_oracle.py``, the plain-Python model of
  Paddle's class (what a straight port would cost);
* ``paddle``: Paddle 3.3.1's ``paddle.distributed.fleet.MultiSlotDataGenerator``
  in its own Python (``--paddle-python``);
* ``reader alone``: the same reader with samples made and dropped, which is
  the floor no base class can go under.

The input is ``data/real/criteo_raw.tsv`` repeated to ``--lines`` lines. Each
contender runs ``--repeats`` times, alternating, and as often with an empty
stdin to measure its start-up (interpreter and imports); lines/s are
``lines / (median wall time - median start-up)``. Every contender's output
must hash the same. Prints a table and writes ``benchmarks/results/generator.md``.
``--profile`` prints a cProfile summary of each contender instead.

Profile (``--profile --lines 50000``, cProfile, development machine: 2 CPU
cores, Python 3.11.7; cProfile's own overhead makes every total larger than
a timed run, and inflates Python-level calls most):

    before: Paddle 3.3.1's class                       4.9 s
        _gen_str (Paddle's data_generator.py)    2.03 s own, 2.36 s with callees
        criteo_sample (the reader)               1.01 s own, 1.46 s with callees
        isinstance (from _gen_str)               0.27 s, 5.7 million calls
        run_from_stdin                           0.17 s own
    before: the oracle (a straight Python port)        7.3 s
        _later_sample_text + _field_text         5.2 s with callees
    fleetfeed, first cut (floats via PyOS_double_to_string)   1.25 s
        criteo_sample (the reader)               0.50 s own, 0.92 s with callees
        _run -> run_generator (compiled: reading, checks, formatting, writing)
                                                 0.31 s own
    after: fleetfeed, floats via Ryu                   1.10 s
        criteo_sample (the reader)               0.50 s own, 0.93 s with callees
        _run -> run_generator                    0.16 s own

Formatting alone, 50,000 Criteo samples made beforehand (13 floats, 26 ids, a
label each): the oracle's _gen_str 22 us a sample; SampleFormatter with
PyOS_double_to_string 4.4 us (3.4 us of it the 13 floats: dtoa on 17-digit
values), with Ryu 1.7 us (floats 0.65 us, ids and label 0.95 us). The reader
itself takes ~9 us a line, so it is now ~85% of a fleetfeed generator's time.

Usage: ``python benchmarks/bench_generator.py [--lines N] [--repeats R]
[--paddle-python PATH|none] [--source TSV] [--no-write] [--profile]``
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import itertools
import os
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, cast

from results_file import as_section, write_section  # a sibling script

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
READER = HERE / "readers" / "criteo_reader.py"
# The project's real sample data (examples/data/real/README.md).
CRITEO_RAW = ROOT / "examples" / "data" / "real" / "criteo_raw.tsv"
RESULTS = HERE / "results" / "generator.md"
# This project's CI image first, then where `make bench-paddle` installs Paddle.
PADDLE_CANDIDATES = (
    Path("/opt/paddle-venv/bin/python"),
    ROOT / ".venv-paddle/bin/python",
)
READ_SIZE = 1 << 20
RUN_TIMEOUT_S = 600.0


class ContenderError(RuntimeError):
    """A contender's process failed or ran past its time limit."""


@dataclass
class Contender:
    """One way of running the reader: a Python and the base class it uses."""

    name: str
    python: str
    base: str
    pythonpath: str = ""
    walls: list[float] = field(default_factory=list)
    startups: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)
    startup_cpus: list[float] = field(default_factory=list)
    peak_rss_kib: list[int] = field(default_factory=list)
    output_bytes: int = 0
    output_sha256: str = ""

    def env(self) -> dict[str, str]:
        env = dict(os.environ, FLEETFEED_BENCH_BASE=self.base)
        env.pop("PYTHONPATH", None)
        # Unbuffered stdout (set in some images) turns each of Paddle's
        # per-sample writes into a system call; measure the usual, buffered case.
        env.pop("PYTHONUNBUFFERED", None)
        if self.pythonpath:
            env["PYTHONPATH"] = self.pythonpath
        return env


@dataclass
class RunResult:
    """What one run of the reader took and wrote."""

    wall_s: float
    cpu_s: float
    peak_rss_kib: int
    output_bytes: int
    output_sha256: str


class ChildWatcher(threading.Thread):
    """Samples a child's peak RSS and kills it when it runs too long.

    The peak comes from /proc/PID/status (VmHWM, a high-water mark of the
    child's own memory). The rusage of wait4 would not do: its ru_maxrss
    starts from this benchmark's own size, inherited through fork.
    """

    def __init__(self, process: subprocess.Popen[bytes], timeout_s: float) -> None:
        super().__init__(daemon=True)
        self.process = process
        self.deadline = time.monotonic() + timeout_s
        self.peak_rss_kib = 0
        self.timed_out = False
        self.done = threading.Event()

    def run(self) -> None:
        status_path = f"/proc/{self.process.pid}/status"
        while not self.done.wait(0.02):
            try:
                with open(status_path) as status:
                    for line in status:
                        if line.startswith("VmHWM:"):
                            kib = int(line.split()[1])
                            self.peak_rss_kib = max(self.peak_rss_kib, kib)
            except (OSError, ValueError):
                pass  # exiting: the mark read last stands
            if time.monotonic() > self.deadline:
                self.timed_out = True
                self.process.kill()
                return


def run_reader(contender: Contender, input_path: Path, *extra_args: str) -> RunResult:
    """Runs the reader once with ``input_path`` on stdin, hashing its stdout.

    Raises:
        ContenderError: The process exited non-zero or ran too long.
    """
    command = [contender.python, *extra_args, str(READER)]
    digest = hashlib.sha256()
    output_bytes = 0
    with open(input_path, "rb") as stdin, tempfile.TemporaryFile() as stderr:
        start = time.perf_counter()
        process = subprocess.Popen(
            command,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=contender.env(),
        )
        watcher = ChildWatcher(process, RUN_TIMEOUT_S)
        watcher.start()
        pipe = cast(IO[bytes], process.stdout)  # stdout=PIPE above
        try:
            while block := pipe.read(READ_SIZE):
                digest.update(block)
                output_bytes += len(block)
            # wait4 rather than wait: it also reports the child's CPU time.
            _, status, usage = os.wait4(process.pid, 0)
            wall = time.perf_counter() - start
            process.returncode = os.waitstatus_to_exitcode(status)
        finally:
            watcher.done.set()
            watcher.join()
            if process.returncode is None:
                process.kill()
                process.wait()
            pipe.close()
        if watcher.timed_out:
            raise ContenderError(f"{contender.name} ran past {RUN_TIMEOUT_S:.0f} s")
        if process.returncode != 0:
            stderr.seek(0)
            tail = stderr.read().decode(errors="replace").strip().splitlines()[-10:]
            raise ContenderError(
                f"{contender.name}: {' '.join(command)} exited with status "
                f"{process.returncode}; last stderr lines:\n" + "\n".join(tail)
            )
    cpu = usage.ru_utime + usage.ru_stime
    peak = watcher.peak_rss_kib or usage.ru_maxrss  # no /proc: the rough figure
    return RunResult(wall, cpu, peak, output_bytes, digest.hexdigest())


def make_input(directory: Path, lines: int, source_path: Path) -> Path:
    """Writes the source file's lines again and again, ``lines`` of them."""
    source = source_path.read_text().splitlines()
    path = directory / f"criteo_{lines}.tsv"
    with open(path, "w") as out:
        # Every line gets its "\n", the file's last one included.
        out.writelines(
            line + "\n" for line in itertools.islice(itertools.cycle(source), lines)
        )
    return path


def import_time_s() -> float:
    """How long ``import generators`` takes in a fresh interpreter (median of 5)."""
    code = (
        "import time; start = time.perf_counter(); import generators; "
        "print(time.perf_counter() - start)"
    )
    times = []
    for _ in range(5):
        result = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
        times.append(float(result.stdout))
    return statistics.median(times)


def resolve_paddle_python(option: str | None) -> str | None:
    """The Python to run Paddle with, or None to leave Paddle out."""
    if option == "none":
        return None
    if option is not None:
        return option
    for candidate in PADDLE_CANDIDATES:
        if candidate.exists():
            return str(candidate)
    return None


def make_contenders(paddle_python: str | None) -> list[Contender]:
    """Every contender, Paddle only when its Python is known."""
    contenders = [
        Contender("fleetfeed", sys.executable, "fleetfeed", str(ROOT)),
        Contender(
            "oracle (Paddle's model)", sys.executable, "oracle", str(ROOT / "tests" / "helpers")
        ),
    ]
    if paddle_python is not None:
        contenders.append(Contender("paddle 3.3.1", paddle_python, "paddle"))
    contenders.append(Contender("reader alone", sys.executable, "none"))
    return contenders


def measure(
    contenders: list[Contender], input_path: Path, empty: Path, repeats: int
) -> None:
    for repeat in range(repeats):
        for contender in contenders:
            startup = run_reader(contender, empty)
            contender.startups.append(startup.wall_s)
            contender.startup_cpus.append(startup.cpu_s)
            result = run_reader(contender, input_path)
            contender.walls.append(result.wall_s)
            contender.cpus.append(result.cpu_s)
            contender.peak_rss_kib.append(result.peak_rss_kib)
            contender.output_bytes = result.output_bytes
            contender.output_sha256 = result.output_sha256
            print(
                f"  run {repeat + 1}/{repeats} {contender.name:<24} "
                f"{result.wall_s:6.2f} s",
                file=sys.stderr,
            )


def lines_per_s(contender: Contender, lines: int) -> float:
    """Lines per second of wall time, start-up excluded."""
    return lines / (
        statistics.median(contender.walls) - statistics.median(contender.startups)
    )


def lines_per_cpu_s(contender: Contender, lines: int) -> float:
    """Lines per second of the child's CPU time (user + system), start-up excluded.

    Steadier than wall time on a machine that other work shares.
    """
    return lines / (
        statistics.median(contender.cpus) - statistics.median(contender.startup_cpus)
    )


def check_outputs(contenders: list[Contender]) -> str:
    """'identical' when every contender that writes output wrote the same bytes."""
    writers = [c for c in contenders if c.base != "none"]
    hashes = {c.output_sha256 for c in writers}
    if len(hashes) != 1:
        listing = ", ".join(f"{c.name}: {c.output_sha256[:16]}" for c in writers)
        raise ContenderError(f"the contenders wrote different output: {listing}")
    return f"identical ({writers[0].output_bytes:,} bytes, sha256 {hashes.pop()[:16]})"


def table(contenders: list[Contender], lines: int) -> str:
    """The results as a Markdown table, ratios against Paddle when it ran."""
    paddle = next((c for c in contenders if c.base == "paddle"), None)
    header = (
        "| contender | lines/s | vs Paddle | lines/CPU-s | vs Paddle (CPU) "
        "| output MB/s | start-up s | peak RSS MiB |"
    )
    rows = [header, "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for contender in contenders:
        rate = lines_per_s(contender, lines)
        cpu_rate = lines_per_cpu_s(contender, lines)
        if paddle is not None:
            ratio = f"{rate / lines_per_s(paddle, lines):.2f}x"
            cpu_ratio = f"{cpu_rate / lines_per_cpu_s(paddle, lines):.2f}x"
        else:
            ratio = cpu_ratio = "n/a"
        output_rate = contender.output_bytes * rate / lines / 1e6
        output = f"{output_rate:.1f}" if contender.base != "none" else "-"
        rows.append(
            f"| {contender.name} | {rate:,.0f} | {ratio} | {cpu_rate:,.0f} | "
            f"{cpu_ratio} | {output} | {statistics.median(contender.startups):.3f} | "
            f"{max(contender.peak_rss_kib) / 1024:.0f} |"
        )
    return "\n".join(rows)


def profile(contenders: list[Contender], input_path: Path, top: int = 8) -> None:
    """Prints where each contender spends its time, by cProfile."""
    with tempfile.TemporaryDirectory() as directory:
        for contender in contenders:
            stats_path = Path(directory) / f"{contender.base}.prof"
            run_reader(contender, input_path, "-m", "cProfile", "-o", str(stats_path))
            stats = pstats.Stats(str(stats_path))
            total = stats.total_tt  # type: ignore[attr-defined]  # not in typeshed
            print(f"\n== {contender.name}: {total:.2f} s under cProfile")
            stats.sort_stats("tottime").print_stats(top)


def write_results(text: str) -> None:
    """Writes the report to benchmarks/results/generator.md and RESULTS.md."""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    write_section("generator", as_section(text))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--lines",
        type=int,
        default=200_000,
        help="input lines (criteo_raw.tsv repeated); default 200000",
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs per contender")
    parser.add_argument(
        "--source",
        type=Path,
        default=CRITEO_RAW,
        help=f"raw Criteo TSV lines to repeat (default: {CRITEO_RAW})",
    )
    parser.add_argument(
        "--paddle-python",
        default=None,
        help="Paddle's Python, or 'none' to skip Paddle "
        "(default: /opt/paddle-venv/bin/python if it exists)",
    )
    parser.add_argument(
        "--no-write",
        action="store_true",
        help=f"print only, leave {RESULTS.relative_to(ROOT)} alone",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="print a cProfile summary of each contender instead",
    )
    args = parser.parse_args(argv)
    if args.lines < 1 or args.repeats < 1:
        parser.error("--lines and --repeats must be >= 1")

    paddle_python = resolve_paddle_python(args.paddle_python)
    contenders = make_contenders(paddle_python)
    with tempfile.TemporaryDirectory(prefix="bench_generator_") as directory:
        input_path = make_input(Path(directory), args.lines, args.source)
        if args.profile:
            profile(contenders, input_path)
            return 0
        empty = Path(directory) / "empty.tsv"
        empty.touch()
        input_bytes = input_path.stat().st_size
        import_s = import_time_s()
        measure(contenders, input_path, empty, args.repeats)
    outputs = check_outputs(contenders)
    rows = table(contenders, args.lines)
    command = (
        f"python benchmarks/bench_generator.py --lines {args.lines} "
        f"--repeats {args.repeats}"
    )
    machine = (
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} CPU cores; Paddle: {paddle_python or 'not run'}"
    )
    workload = (
        f"Input: `data/real/criteo_raw.tsv` repeated to {args.lines:,} lines "
        f"({input_bytes / 1e6:.1f} MB); the reader writes 13 dense floats, 26 ids "
        f"and a label per line. Output: {outputs}."
    )
    method = (
        "lines/s = lines / (median wall time - median start-up), medians of "
        f"{args.repeats} runs; start-up is the same process on an empty stdin "
        "(interpreter and imports). lines/CPU-s: the same with the child's user + "
        "system CPU time, steadier on a shared machine. Output is read through a "
        "pipe, as a loader reads it; PYTHONUNBUFFERED is unset."
    )
    imports = (
        f"`import generators` in a fresh interpreter: {import_s * 1000:.1f} ms "
        "(median of 5)."
    )
    report = (
        "\n\n".join(
            [
                "# Generator benchmark: one Criteo reader.py, three base classes",
                f"`{command}` on {datetime.date.today()}, {machine}.",
                workload,
                method,
                rows,
                imports,
            ]
        )
        + "\n"
    )
    print(report)
    if not args.no_write:
        write_results(report)
        print(f"wrote {RESULTS.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
