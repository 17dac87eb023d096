"""Measure fleetfeed's InMemoryDataset on MultiSlot files: one contender, one process.

The same stages as ``paddle_engine.py`` (load, memory per record, local
shuffle) through fleetfeed's public API, plus batch iteration: one epoch of
``for batch in dataset``, then a second shuffle and epoch to show that every
``local_shuffle`` reshuffles. ``run_engine.py`` starts it once per repeat, each
time in a fresh process, and takes medians.

The last line of stdout is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import sys
import time
from typing import Any

# Imported before the first RSS reading so that the load's memory delta holds
# records only, not torch's libraries (the batch stage imports torch anyway).
import pyarrow as pa
import torch

from datafeed import InMemoryDataset, Slot


def cpu_seconds() -> float:
    """User + system CPU time of this process's threads and its waited-for children.

    Less sensitive than wall time to other processes sharing the CPUs; the
    children are the ``cat`` pipe commands.
    """
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def read_status_kb(field: str) -> int:
    """One ``kB`` field of /proc/self/status (``VmRSS``, ``VmHWM``) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field} field (not Linux?)")


def fleetfeed_version() -> str:
    """The installed distribution's version, or "source" when run from a checkout."""
    try:
        return importlib.metadata.version("fleetfeed")
    except importlib.metadata.PackageNotFoundError:
        return "source"


def criteo_use_var() -> list[Slot]:
    """The benchmark's schema: 13 dense floats, 26 sparse ids, a label."""
    return (
        [Slot("dense_input", "float32", (13,))]
        + [Slot(f"C{i}", "uint64") for i in range(1, 27)]
        + [Slot("label", "int64", (1,))]
    )


def iterate_epoch(dataset: InMemoryDataset) -> tuple[float, int, list[int]]:
    """One pass of ``for batch in dataset``.

    Every slot of every batch is looked up and its shape read, which is what
    a training step costs the loader before the model runs, without copying
    any data.

    Returns:
        (seconds, records seen, the first batch's first few C1 ids).
    """
    records = 0
    touched = 0  # keeps the lookups live; not reported
    first: list[int] = []
    t0 = time.perf_counter()
    for batch in dataset:
        for name in batch:
            value = batch[name]
            if isinstance(value, torch.Tensor):
                touched += value.shape[0]
            else:  # Ragged
                touched += value.values.shape[0] + value.offsets.shape[0]
        records += batch.size
        if not first:
            first = batch["C1"].values[:8].tolist()
    return time.perf_counter() - t0, records, first


def measure(paths: list[str], batch_size: int, thread_num: int) -> dict[str, Any]:
    """Load ``paths`` into a fleetfeed InMemoryDataset and time the stages."""
    dataset = InMemoryDataset()
    dataset.init(
        batch_size=batch_size,
        thread_num=thread_num,
        use_var=criteo_use_var(),
        pipe_command="cat",
        progress=False,
    )
    dataset.set_filelist(paths)

    rss_before = read_status_kb("VmRSS")
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    dataset.load_into_memory()
    load_s = time.perf_counter() - t0
    load_cpu_s = cpu_seconds() - cpu0
    rss_loaded = read_status_kb("VmRSS")
    records = int(dataset.get_memory_data_size())
    stats = dataset.stats()
    table_nbytes = dataset.to_arrow().nbytes

    t0 = time.perf_counter()
    dataset.local_shuffle(seed=1)
    shuffle_s = time.perf_counter() - t0
    rss_shuffled = read_status_kb("VmRSS")
    epoch1_s, epoch1_records, first1 = iterate_epoch(dataset)

    t0 = time.perf_counter()
    dataset.local_shuffle(seed=2)
    shuffle2_s = time.perf_counter() - t0
    epoch2_s, epoch2_records, first2 = iterate_epoch(dataset)

    if not epoch1_records == epoch2_records == records:
        raise RuntimeError(
            f"iteration saw {epoch1_records} and {epoch2_records} records, "
            f"expected {records} (the loaded count) in each epoch"
        )
    return {
        "contender": "fleetfeed",
        "version": fleetfeed_version(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "pyarrow": pa.__version__,
        "threads": thread_num,
        "batch_size": batch_size,
        "files": len(paths),
        "input_bytes": sum(os.path.getsize(p) for p in paths),
        "records": records,
        "stats_lines": stats.lines,
        "stats_records": stats.records,
        "load_s": load_s,
        "load_lines_per_s": records / load_s,
        "load_cpu_s": load_cpu_s,
        "rss_before": rss_before,
        "rss_loaded": rss_loaded,
        "rss_shuffled": rss_shuffled,
        "bytes_per_record": (rss_loaded - rss_before) / records,
        # What the records themselves take, for comparison with the RSS delta
        # (which also counts allocator slack and parser buffers kept alive).
        "arrow_bytes_per_record": table_nbytes / records,
        "shuffle_s": shuffle_s,
        "shuffle2_s": shuffle2_s,
        "iterate_s": epoch1_s,
        "iterate_records_per_s": records / epoch1_s,
        "iterate2_records_per_s": records / epoch2_s,
        "reshuffled": first1 != first2,
        "vm_hwm": read_status_kb("VmHWM"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="MultiSlot text files")
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    missing = [p for p in args.paths if not os.path.isfile(p)]
    if missing:
        parser.error(f"missing input files: {', '.join(missing)}")
    result = measure(args.paths, args.batch_size, args.threads)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
