"""Reliability: the parser survives hostile input and agrees with the reference.

A bounded mutation-fuzzing run in a subprocess (a crash kills the subprocess,
a hang hits the timeout); ``benchmarks/fuzz_parser.py`` runs the same longer.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import parser_fuzz
import pytest
from conftest import PYTHON

FUZZER = Path(__file__).with_name("parser_fuzz.py")


def test_fuzzed_input_parses_like_the_reference_and_never_crashes():
    done = subprocess.run(
        [PYTHON, str(FUZZER), "4", "20261122"], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts["mismatches"] == 0
    assert counts["inputs"] > 1000
    assert counts["parse_errors"] > 100 and counts["records_compared"] > 1000


def test_the_fuzzer_reports_a_disagreement(monkeypatch):
    # A reference that loses the last record of every text must be caught.
    real = parser_fuzz.reference_parser.parse

    def lossy(*args, **kwargs):
        result = real(*args, **kwargs)
        result.records = result.records[:-1]
        return result

    monkeypatch.setattr(parser_fuzz.reference_parser, "parse", lossy)
    with pytest.raises(AssertionError, match="parsers disagree"):
        parser_fuzz.fuzz(5, seed=1)


SOAK = """
import json, statistics, sys
sys.path.insert(0, {tests!r})
from conftest import SMALL_SCHEMA
from datafeed import InMemoryDataset
import torch  # imported before the baseline, as in a training script

def rss():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024

ds = InMemoryDataset()
ds.init(batch_size=256, thread_num=2, use_var=SMALL_SCHEMA, progress=False)
ds.set_filelist(sys.argv[1:])
base = rss()
loaded, released, records = [], [], []
for epoch in range({epochs}):
    ds.release_memory()
    released.append(rss() - base)
    ds.load_into_memory()
    ds.local_shuffle(seed=epoch)
    records.append(sum(batch.size for batch in ds))
    loaded.append(rss() - base)
print(json.dumps(dict(loaded=loaded, released=released[1:], records=records, store=ds.nbytes)))
"""


def test_repeated_load_shuffle_iterate_keeps_memory_flat(tmp_path):
    from conftest import small_line

    block = "".join(small_line(i) for i in range(1000))
    paths = []
    for f in range(2):
        path = tmp_path / f"part-{f}.txt"
        path.write_text(block * 150)
        paths.append(str(path))
    script = SOAK.format(tests=str(Path(__file__).parent), epochs=8)
    done = subprocess.run([PYTHON, "-c", script, *paths], capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    soak = json.loads(done.stdout.strip().splitlines()[-1])
    assert soak["records"] == [300_000] * 8  # every epoch sees every record
    store = soak["store"]
    loaded, released = soak["loaded"], soak["released"]
    # Flat after the first epoch: a leak of one store per epoch would add 7 stores.
    assert max(loaded[1:]) < loaded[0] + 0.75 * store, soak
    # release_memory gives most of the store back to the operating system.
    median = lambda values: sorted(values)[len(values) // 2]
    assert median(released) < median(loaded) - 0.5 * store, soak
