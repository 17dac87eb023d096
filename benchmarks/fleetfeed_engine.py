"""Measure fleetfeed's InMemoryDataset on MultiSlot files: one contender, one process.

The same stages as ``paddle_engine.py`` (load, memory per record, five local
shuffles) through fleetfeed's public API, plus batch iteration: one epoch of
``for batch in dataset`` after the shuffles, then a sixth shuffle and epoch to
show that every ``local_shuffle`` reshuffles. Each stage's peak resident
memory is read from VmHWM, reset before the stage (``/proc/self/clear_refs``).
The garbage collections during the load are counted and timed (torch is
imported, as in a training script). ``run_engine.py`` starts it once per
repeat, each time in a fresh process, and takes medians.

``--kernel`` measures instead the parser kernel alone on the same files, read
into memory first: ``ChunkParser`` on two threads, each parsing every other
file, chunks taken and dropped: fed 4 MiB at a time (``benchmarks/bench_parse.py``'s
2-thread contender), then fed 256 KiB at a time, where the parser's column
buffers stay in cache (its fastest). That is what a load could reach if
reading the files and writing the records into memory that stays cost
nothing.

The last line of stdout is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import threading
import time
from typing import Any

# Imported before the first RSS reading so that the load's memory delta holds
# records only, not torch's libraries (the batch stage imports torch anyway).
import numpy as np
import pyarrow as pa
import torch
from bench_parse import FEED_BYTES, parse_all  # sibling scripts
from process_memory import read_status_kb, reset_peak

from datafeed import InMemoryDataset, Slot, SlotSchema

SHUFFLES = 5  # local_shuffle runs per process: the stability measure
KERNEL_FEED_BYTES = FEED_BYTES  # bench_parse.py's feeds
KERNEL_SMALL_FEED_BYTES = 256 << 10  # the kernel's fastest feeds


def cpu_seconds() -> float:
    """User + system CPU time of this process's threads and its waited-for children.

    Less sensitive than wall time to other processes sharing the CPUs; the
    children are the ``cat`` pipe commands.
    """
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class CollectionClock:
    """The garbage collections between ``start()`` and ``stop()``: how many of
    each generation, and the milliseconds they took."""

    def __init__(self) -> None:
        self.counts = [0, 0, 0]
        self.ms = [0.0, 0.0, 0.0]
        self._began = 0.0
        self._on = False
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if not self._on:
            return
        if phase == "start":
            self._began = time.perf_counter()
        else:
            generation = info["generation"]
            self.counts[generation] += 1
            self.ms[generation] += (time.perf_counter() - self._began) * 1e3

    def start(self) -> None:
        self._on = True

    def stop(self) -> None:
        self._on = False


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
    objects_before = len(gc.get_objects())

    collections = CollectionClock()
    rss_before = read_status_kb("VmRSS")
    peak_before = read_status_kb("VmHWM")  # the imports' peak
    reset_peak()
    collections.start()
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    dataset.load_into_memory()
    load_s = time.perf_counter() - t0
    load_cpu_s = cpu_seconds() - cpu0
    collections.stop()
    rss_loaded = read_status_kb("VmRSS")
    peak_load = read_status_kb("VmHWM")
    records = int(dataset.get_memory_data_size())
    stats = dataset.stats()
    array_bytes = dataset.nbytes  # values and offsets (no order before a shuffle)

    reset_peak()
    shuffle_runs, shuffle_cpu_runs = [], []
    for seed in range(1, SHUFFLES + 1):
        cpu0, t0 = time.thread_time(), time.perf_counter()
        dataset.local_shuffle(seed=seed)
        shuffle_runs.append(time.perf_counter() - t0)
        # This thread's CPU time: the shuffle's own work, page faults included,
        # without the time another process held the core.
        shuffle_cpu_runs.append(time.thread_time() - cpu0)
    rss_shuffled = read_status_kb("VmRSS")
    peak_shuffle = read_status_kb("VmHWM")
    reset_peak()
    epoch1_s, epoch1_records, first1 = iterate_epoch(dataset)
    peak_iterate = read_status_kb("VmHWM")

    vm_hwm = max(peak_before, peak_load, peak_shuffle, peak_iterate)

    # The alternative the engine declines: copying the shuffled records into
    # their order (what a shuffle did before), then passes over the copy.
    store = dataset._store
    reset_peak()
    t0 = time.perf_counter()
    copy = store.take(np.arange(store.rows), threads=thread_num)
    copy_s = time.perf_counter() - t0
    peak_copy = read_status_kb("VmHWM")
    dataset._store = copy
    contiguous_s, _, _ = iterate_epoch(dataset)
    dataset._store = store
    del copy

    t0 = time.perf_counter()
    dataset.local_shuffle(seed=SHUFFLES + 1)
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
        # What the records' arrays themselves take, for comparison with the
        # RSS delta (which also counts allocator slack).
        "array_bytes_per_record": array_bytes / records,
        "shuffle_s": statistics.median(shuffle_runs),
        "shuffle_runs": shuffle_runs,
        "shuffle_cpu_runs": shuffle_cpu_runs,
        "shuffle2_s": shuffle2_s,
        "peak_load": peak_load,
        "peak_shuffle": peak_shuffle,
        "peak_iterate": peak_iterate,
        # The measure: the highest of the three peaks over the whole
        # process's resident size after the load.
        "peak_over_resident": max(peak_load, peak_shuffle, peak_iterate) / rss_loaded,
        "load_collections": collections.counts,
        "load_collection_ms": collections.ms,
        "objects_before_load": objects_before,
        "iterate_s": epoch1_s,
        "iterate_records_per_s": records / epoch1_s,
        "iterate2_records_per_s": records / epoch2_s,
        "reshuffled": first1 != first2,
        "copy_s": copy_s,
        "copy_peak_over_resident": peak_copy / rss_loaded,
        "contiguous_iterate_records_per_s": records / contiguous_s,
        "vm_hwm": vm_hwm,  # the declined copy's peak is copy_peak_over_resident
    }


def measure_kernel(paths: list[str], thread_num: int) -> dict[str, Any]:
    """The parser kernel alone on ``paths``, read into memory first."""
    schema = SlotSchema(criteo_use_var())
    texts = []
    for path in paths:
        with open(path, "rb") as f:
            texts.append(f.read())

    def rate(feed_bytes: int) -> float:
        counts = [0] * thread_num

        def work(k: int) -> None:
            for text in texts[k::thread_num]:
                counts[k] += parse_all(memoryview(text), "kernel", schema, feed_bytes)

        workers = [threading.Thread(target=work, args=(k,)) for k in range(thread_num)]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        seconds = time.perf_counter() - t0
        if sum(counts) != sum(text.count(b"\n") for text in texts):
            raise RuntimeError(f"the kernel parsed {sum(counts)} records, not every line")
        return sum(counts) / seconds

    return {
        "contender": "kernel",
        "threads": thread_num,
        "records": sum(text.count(b"\n") for text in texts),
        "kernel_lines_per_s": rate(KERNEL_FEED_BYTES),
        "kernel_small_feeds_lines_per_s": rate(KERNEL_SMALL_FEED_BYTES),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="MultiSlot text files")
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--kernel", action="store_true", help="the parser kernel alone (see the docstring)"
    )
    args = parser.parse_args(argv)
    missing = [p for p in args.paths if not os.path.isfile(p)]
    if missing:
        parser.error(f"missing input files: {', '.join(missing)}")
    if args.kernel:
        result = measure_kernel(args.paths, args.threads)
    else:
        result = measure(args.paths, args.batch_size, args.threads)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
