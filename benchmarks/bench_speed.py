"""Raw Criteo files -> records in memory: fleetfeed's three paths against Paddle and a DataLoader.

Every contender reads the same raw Criteo TSV files (examples/criteo/make_data.py)
with the same parsing logic (examples/criteo/reader.py's ``generate_sample``)
and 2 workers, each repeat in a fresh process:

* ``fleetfeed-pipe``: InMemoryDataset, ``pipe_command="python examples/criteo/reader.py"``;
* ``fleetfeed-inprocess``: InMemoryDataset, ``data_generator=CriteoReader``;
* ``fleetfeed-cache``: ``load_cache`` of a cache saved from the in-process load
  (memory-mapped: pages are read on first touch, so a full pass over the
  values is timed as well, as ``cache+touch``);
* ``paddle``: Paddle 3.3.1's InMemoryDataset with the same reader on Paddle's
  ``MultiSlotDataGenerator`` as pipe command (benchmarks/readers/criteo_reader_paddle.py);
* ``dataloader``: a plain ``torch.utils.data.DataLoader`` (num_workers=2) over an
  IterableDataset that splits the files across workers, parses each line with
  the reader's own ``generate_sample`` and yields per-slot tensors (default
  collate, batch_size 512); all batches are kept in memory.

Lines/s is the median of the repeats. Results go to benchmarks/results/speed.md.

Usage: python benchmarks/bench_speed.py [--files 4] [--lines 50000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from results_file import as_section, write_section  # a sibling script

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "benchmarks" / "data" / "speed"


def default_paddle_python() -> str:
    """Paddle's interpreter: $FLEETFEED_PADDLE_PYTHON, .venv-paddle (make bench-paddle), /opt."""
    for candidate in (
        os.environ.get("FLEETFEED_PADDLE_PYTHON"),
        str(REPO / ".venv-paddle" / "bin" / "python"),
        "/opt/paddle-venv/bin/python",
    ):
        if candidate and os.path.exists(candidate):
            return candidate
    return "none"


PADDLE_PYTHON = default_paddle_python()
THREADS = 2

PADDLE_SCRIPT = r"""
import json, sys, time
import paddle
paddle.enable_static()
paths = sys.argv[1:]
with paddle.pir_utils.OldIrGuard():
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        dense = paddle.static.data("dense_feature", shape=[-1, 13], dtype="float32", lod_level=0)
        sparse = [paddle.static.data(f"C{i}", shape=[-1, 1], dtype="int64", lod_level=1)
                  for i in range(1, 27)]
        label = paddle.static.data("label", shape=[-1, 1], dtype="int64", lod_level=0)
    dataset = paddle.distributed.InMemoryDataset()
    dataset.init(batch_size=512, thread_num=%(threads)d, use_var=[dense, *sparse, label],
                 pipe_command="%(python)s %(reader)s")
    dataset.set_filelist(paths)
    t0 = time.perf_counter()
    dataset.load_into_memory()
    seconds = time.perf_counter() - t0
    print(json.dumps({"records": int(dataset.get_memory_data_size()), "seconds": seconds}))
"""


def slots():
    from datafeed import Slot

    return (
        [Slot("dense_feature", "float32", (13,))]
        + [Slot(f"C{i}", "uint64") for i in range(1, 27)]
        + [Slot("label", "int64", (1,))]
    )


def criteo_reader():
    sys.path.insert(0, str(REPO / "examples" / "criteo"))
    from reader import CriteoReader

    return CriteoReader


def run_fleetfeed(paths: list[str], how: str, cache: str) -> dict:
    from datafeed import InMemoryDataset

    ds = InMemoryDataset()
    source = (
        {"pipe_command": f"{sys.executable} {REPO / 'examples/criteo/reader.py'}"}
        if how == "pipe" else {"data_generator": criteo_reader()}
    )
    ds.init(batch_size=512, thread_num=THREADS, use_var=slots(), progress=False, **source)
    ds.set_filelist(paths)
    started = time.perf_counter()
    if how in ("cache", "cache+touch"):
        ds.load_cache(cache)
        if how == "cache+touch":  # read every page of every column once
            for chunk in ds._store.chunks:
                for column in chunk.columns:
                    column.values.sum()
    else:
        ds.load_into_memory()
    seconds = time.perf_counter() - started
    if how == "inprocess" and not os.path.exists(cache):
        ds.save_cache(cache)
    return {"records": ds.get_memory_data_size(), "seconds": seconds}


def run_dataloader(paths: list[str]) -> dict:
    import torch
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info

    reader = criteo_reader()()

    class CriteoFiles(IterableDataset):
        def __iter__(self):
            info = get_worker_info()
            mine = paths if info is None else paths[info.id :: info.num_workers]
            for path in mine:
                with open(path) as lines:
                    for line in lines:
                        for sample in reader.generate_sample(line)():
                            values = dict(sample)
                            yield {
                                "dense_feature": torch.tensor(values["dense_feature"],
                                                              dtype=torch.float32),
                                "sparse": torch.tensor([values[f"C{i}"][0] for i in range(1, 27)],
                                                       dtype=torch.int64),
                                "label": torch.tensor(values["label"], dtype=torch.int64),
                            }

    started = time.perf_counter()
    batches = list(DataLoader(CriteoFiles(), batch_size=512, num_workers=THREADS))
    seconds = time.perf_counter() - started
    return {"records": sum(len(b["label"]) for b in batches), "seconds": seconds}


def run_paddle(paths: list[str]) -> dict:
    script = PADDLE_SCRIPT % {
        "threads": THREADS,
        "python": PADDLE_PYTHON,
        "reader": REPO / "benchmarks" / "readers" / "criteo_reader_paddle.py",
    }
    out = subprocess.run(
        [PADDLE_PYTHON, "-c", script, *paths], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def contender(name: str, paths: list[str], cache: str) -> dict:
    if name.startswith("fleetfeed-"):
        return run_fleetfeed(paths, name.removeprefix("fleetfeed-"), cache)
    if name == "dataloader":
        return run_dataloader(paths)
    return run_paddle(paths)


CONTENDERS = [
    "paddle", "dataloader", "fleetfeed-pipe", "fleetfeed-inprocess",
    "fleetfeed-cache", "fleetfeed-cache+touch",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=CONTENDERS)
    parser.add_argument("--paddle-python", default=PADDLE_PYTHON,
                        help="Paddle 3.3.1's interpreter, or 'none' to leave Paddle out")
    parser.add_argument("--contender", help=argparse.SUPPRESS)  # one run, in this process
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("paths", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.contender:
        print(json.dumps(contender(args.contender, args.paths, args.cache)))
        return

    sys.path.insert(0, str(REPO / "examples" / "criteo"))
    from make_data import make_files

    data = DATA / f"{args.files}x{args.lines}"
    paths = sorted(str(p) for p in data.glob("part-*.tsv"))
    if len(paths) != args.files:
        paths = make_files(str(data), files=args.files, lines=args.lines, seed=0)
    cache = str(data / "records.arrow")
    if os.path.exists(cache):
        os.unlink(cache)  # made afresh by the first in-process run
    python_path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=python_path)
    env["FLEETFEED_PADDLE_PYTHON"] = args.paddle_python
    order = [c for c in CONTENDERS if c in args.only]
    if args.paddle_python == "none":
        order = [c for c in order if c != "paddle"]
    if any(c.startswith("fleetfeed-cache") for c in order) and "fleetfeed-inprocess" not in order:
        order.insert(0, "fleetfeed-inprocess")
    results: dict[str, list[dict]] = {name: [] for name in order}
    for repeat in range(args.repeats):
        for name in order:
            out = subprocess.run(
                [sys.executable, __file__, "--contender", name, "--cache", cache, *paths],
                capture_output=True, text=True, env=env, check=False,
            )
            if out.returncode:
                sys.exit(f"{name} failed:\n{out.stderr[-3000:]}")
            result = json.loads(out.stdout.strip().splitlines()[-1])
            results[name].append(result)
            rate = result["records"] / result["seconds"]
            print(f"repeat {repeat + 1} {name:24s} {rate:12,.0f} lines/s", flush=True)
    write_report(results, paths, args)


def write_report(
    results: dict[str, list[dict]], paths: list[str], args: argparse.Namespace
) -> None:
    rates = {
        name: statistics.median(r["records"] / r["seconds"] for r in runs)
        for name, runs in results.items()
    }
    records = {name: runs[0]["records"] for name, runs in results.items()}
    paddle = rates.get("paddle")
    loader = rates.get("dataloader")
    lines = [
        "# Raw Criteo files -> records in memory",
        "",
        (
            f"`python benchmarks/bench_speed.py --files {args.files} --lines {args.lines} "
            f"--repeats {args.repeats}`: {len(paths)} files x {args.lines:,} lines "
            f"({sum(os.path.getsize(p) for p in paths) / 1e6:.1f} MB), {THREADS} workers each, "
            f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}. Median of {args.repeats} runs, "
            "each in a fresh process. Same reader logic everywhere "
            "(examples/criteo/reader.py's generate_sample)."
        ),
        "",
        "| contender | records | lines/s (median) | x Paddle | x DataLoader |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, rate in rates.items():
        vs_paddle = f"{rate / paddle:.1f}x" if paddle else "-"
        vs_loader = f"{rate / loader:.1f}x" if loader else "-"
        lines.append(f"| {name} | {records[name]:,} | {rate:,.0f} | {vs_paddle} | {vs_loader} |")
    lines += [
        "",
        "Targets (issue 5): pipe >= 2.5x Paddle, in-process >= 4x, cache >= 20x; "
        ">= 2x the DataLoader.",
        "`fleetfeed-cache` memory-maps the cache (pages are read on first touch);",
        "`fleetfeed-cache+touch` also reads every value once.",
        "",
    ]
    out = REPO / "benchmarks" / "results" / "speed.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    write_section("speed", as_section("\n".join(lines)))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
