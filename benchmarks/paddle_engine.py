"""Measure Paddle's InMemoryDataset on MultiSlot files: one contender, one process.

Load, memory per record, five ``local_shuffle`` runs and (with ``--iterate``)
one ``train_from_dataset`` pass; each stage's peak resident memory is read
from VmHWM, reset before the stage (``/proc/self/clear_refs``), as
``fleetfeed_engine.py`` does.

Runs inside Paddle's own Python (``/opt/paddle-venv/bin/python``; the Makefile's
``bench-paddle`` builds ``.venv-paddle``), so it imports nothing from fleetfeed
and needs nothing beyond the standard library and paddle. ``run_engine.py``
starts it once per repeat, each time in a fresh process, and takes medians.

The last line of stdout is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

from process_memory import read_status_kb, reset_peak  # a sibling script


def cpu_seconds() -> float:
    """User + system CPU time of this process's threads and its waited-for children.

    Less sensitive than wall time to other processes sharing the CPUs; the
    children are the ``cat`` pipe commands.
    """
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


SHUFFLES = 5  # local_shuffle runs per process, as fleetfeed_engine.py


def measure(
    paths: list[str], batch_size: int, thread_num: int, iterate: bool
) -> dict[str, Any]:
    """Load ``paths`` into a Paddle InMemoryDataset and time the stages."""
    import paddle

    paddle.enable_static()
    # Paddle 3.x builds PIR programs by default, and under PIR
    # DatasetBase._set_use_var marks every slot dense (a pir.Value has no
    # lod_level). The legacy IR keeps C1..C26 sparse (lod_level=1), the way
    # CTR models declare them and the path whose parse drops zero feasigns.
    with paddle.pir_utils.OldIrGuard():
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            dense = paddle.static.data(
                "dense_input", shape=[-1, 13], dtype="float32", lod_level=0
            )
            sparse = [
                paddle.static.data(f"C{i}", shape=[-1, 1], dtype="int64", lod_level=1)
                for i in range(1, 27)
            ]
            label = paddle.static.data(
                "label", shape=[-1, 1], dtype="int64", lod_level=0
            )
            use_var = [dense, *sparse, label]
            if iterate:
                # The cheapest program that makes the executor feed every slot
                # of every batch: one op reading the label.
                paddle.mean(paddle.cast(label, "float32"))

        dataset = paddle.distributed.InMemoryDataset()
        dataset.init(
            batch_size=batch_size,
            thread_num=thread_num,
            use_var=use_var,
            pipe_command="cat",
        )
        dataset.set_filelist(paths)

        rss_before = read_status_kb("VmRSS")
        peak_before = read_status_kb("VmHWM")
        reset_peak()
        cpu0, t0 = cpu_seconds(), time.perf_counter()
        dataset.load_into_memory()
        load_s = time.perf_counter() - t0
        load_cpu_s = cpu_seconds() - cpu0
        rss_loaded = read_status_kb("VmRSS")
        peak_load = read_status_kb("VmHWM")
        records = int(dataset.get_memory_data_size())

        reset_peak()
        shuffle_runs = []
        for _ in range(SHUFFLES):
            t0 = time.perf_counter()
            dataset.local_shuffle()
            shuffle_runs.append(time.perf_counter() - t0)
        rss_shuffled = read_status_kb("VmRSS")
        peak_shuffle = read_status_kb("VmHWM")

        result: dict[str, Any] = {
            "contender": "paddle",
            "version": paddle.__version__,
            "python": platform.python_version(),
            "threads": thread_num,
            "batch_size": batch_size,
            "files": len(paths),
            "input_bytes": sum(os.path.getsize(p) for p in paths),
            "records": records,
            "load_s": load_s,
            "load_lines_per_s": records / load_s,
            "load_cpu_s": load_cpu_s,
            "rss_before": rss_before,
            "rss_loaded": rss_loaded,
            "rss_shuffled": rss_shuffled,
            "bytes_per_record": (rss_loaded - rss_before) / records,
            "shuffle_s": statistics.median(shuffle_runs),
            "shuffle_runs": shuffle_runs,
            "peak_load": peak_load,
            "peak_shuffle": peak_shuffle,
        }
        if iterate:
            # Not a target of the issue: Paddle has no Python-level batch
            # iterator, so its batching is timed through train_from_dataset
            # with a one-op program (batching + executor overhead).
            exe = paddle.static.Executor(paddle.CPUPlace())
            exe.run(startup)
            # train_from_dataset writes <id>_train_desc.prototxt into the
            # working directory (paddle/base/executor.py): keep it out of ours.
            cwd = os.getcwd()
            reset_peak()
            with tempfile.TemporaryDirectory(prefix="paddle_engine_") as scratch:
                os.chdir(scratch)
                try:
                    t0 = time.perf_counter()
                    exe.train_from_dataset(
                        program=main, dataset=dataset, thread=thread_num, debug=False
                    )
                    result["train_from_dataset_s"] = time.perf_counter() - t0
                finally:
                    os.chdir(cwd)
            result["train_from_dataset_records_per_s"] = (
                records / result["train_from_dataset_s"]
            )
            result["peak_iterate"] = read_status_kb("VmHWM")
        peaks = [peak_load, peak_shuffle, result.get("peak_iterate", 0)]
        result["peak_over_resident"] = max(peaks) / rss_loaded
        result["vm_hwm"] = max(peak_before, *peaks, read_status_kb("VmHWM"))
        return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="MultiSlot text files")
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--iterate", action="store_true", help="also time one train_from_dataset pass"
    )
    args = parser.parse_args(argv)
    missing = [p for p in args.paths if not os.path.isfile(p)]
    if missing:
        parser.error(f"missing input files: {', '.join(missing)}")
    result = measure(args.paths, args.batch_size, args.threads, args.iterate)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
