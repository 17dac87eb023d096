"""QueueDataset streams with bounded memory: peak RSS does not grow with the input."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

from support import PYTHON, small_line

MEASURE = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {tests!r})
    from support import SMALL_SCHEMA
    from datafeed import {kind}

    def peak_rss_bytes():
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024

    ds = {kind}()
    ds.init(batch_size=256, thread_num=2, use_var=SMALL_SCHEMA, progress=False)
    ds.set_filelist(sys.argv[1:])
    import torch  # paid before the baseline, not during the pass
    before = peak_rss_bytes()
    records = 0
    if {kind!r} == "InMemoryDataset":
        ds.load_into_memory()
    for batch in ds:
        records += batch.size
    print(json.dumps({{"records": records, "growth": peak_rss_bytes() - before}}))
    """
)


def peak_growth(kind: str, paths: list[str], tests_dir: str) -> dict:
    script = MEASURE.format(kind=kind, tests=tests_dir)
    out = subprocess.run(
        [PYTHON, "-c", script, *paths], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def write_lines(path: Path, start: int, count: int) -> str:
    with open(path, "w") as out:
        block = "".join(small_line(i) for i in range(1000))
        out.writelines(block for _ in range(count // 1000))
    return str(path)


def test_queue_dataset_peak_memory_does_not_grow_with_input(tmp_path):
    # Two files each, so that both runs have two reader threads; both inputs are
    # large enough for the queue to reach its steady state (measured: ~21 MB of
    # growth from 0.8 M lines on, +2 MB at 3.2 M lines).
    small = [write_lines(tmp_path / f"small-{i}.txt", 0, 200_000) for i in range(2)]
    large = [write_lines(tmp_path / f"large-{i}.txt", 0, 800_000) for i in range(2)]
    tests_dir = str(Path(__file__).resolve().parents[1] / "helpers")
    queue_small = peak_growth("QueueDataset", small, tests_dir)
    queue_large = peak_growth("QueueDataset", large, tests_dir)
    memory_large = peak_growth("InMemoryDataset", large, tests_dir)
    assert queue_small["records"] == 400_000 and queue_large["records"] == 1_600_000
    # 4x the input: the in-memory dataset grows by tens of MB, the queue must not.
    assert memory_large["growth"] > queue_large["growth"] + 40e6, (memory_large, queue_large)
    assert queue_large["growth"] < queue_small["growth"] + 6e6, (queue_small, queue_large)
