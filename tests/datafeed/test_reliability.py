"""Reliability: the parser survives hostile input and agrees with the reference.

A bounded mutation-fuzzing run in a subprocess (a crash kills the subprocess,
a hang hits the timeout); ``benchmarks/fuzz_parser.py`` runs the same longer.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import parser_fuzz
import pytest
from support import PYTHON, REPO

FUZZER = REPO / "tests" / "helpers" / "parser_fuzz.py"


def test_fuzzed_input_parses_like_the_reference_and_never_crashes():
    done = subprocess.run(
        [PYTHON, str(FUZZER), "4", "20261122"],
        capture_output=True, text=True, timeout=120, check=False,
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
from support import SMALL_SCHEMA
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
    from support import small_line

    block = "".join(small_line(i) for i in range(1000))
    paths = []
    for f in range(2):
        path = tmp_path / f"part-{f}.txt"
        path.write_text(block * 150)
        paths.append(str(path))
    script = SOAK.format(tests=str(Path(__file__).resolve().parents[1] / "helpers"), epochs=8)
    done = subprocess.run(
        [PYTHON, "-c", script, *paths], capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    soak = json.loads(done.stdout.strip().splitlines()[-1])
    assert soak["records"] == [300_000] * 8  # every epoch sees every record
    store = soak["store"]
    loaded, released = soak["loaded"], soak["released"]
    # Flat after the first epoch: a leak of one store per epoch would add 7 stores.
    assert max(loaded[1:]) < loaded[0] + 0.75 * store, soak
    # release_memory gives most of the store back to the operating system.

    def median(values):
        return sorted(values)[len(values) // 2]

    assert median(released) < median(loaded) - 0.5 * store, soak


FULL_DISK = """
import json, os, resource, signal, sys
sys.path.insert(0, {tests!r})
from support import SMALL_SCHEMA
from datafeed import InMemoryDataset

cache, files = sys.argv[1], sys.argv[2:]
# A full disk, for this process only: writes past the limit fail with EFBIG
# (SIGXFSZ ignored, as a daemon's default would kill the process instead).
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, resource.RLIM_INFINITY))
ds = InMemoryDataset()
ds.init(batch_size=100, use_var=SMALL_SCHEMA, progress=False, cache=cache)
ds.set_filelist(files)
out = {{}}
try:
    ds.load_into_memory()
except OSError as error:
    out["errno"], out["message"] = error.errno, str(error)
out["left"] = sorted(os.listdir(os.path.dirname(cache)))
out["records"] = sum(batch.size for batch in ds)  # still usable
print(json.dumps(out))
"""


def test_a_full_disk_while_writing_the_cache_is_a_clear_error_and_leaves_nothing(tmp_path):
    import errno

    from support import SMALL_SCHEMA, write_small_files

    from datafeed import InMemoryDataset

    data = tmp_path / "data"
    data.mkdir()
    files = write_small_files(data, files=2, per_file=3000)
    caches = tmp_path / "caches"
    caches.mkdir()
    cache = caches / "train.arrow"
    helpers = Path(__file__).resolve().parents[1] / "helpers"
    script = FULL_DISK.format(tests=str(helpers), limit=64 << 10)
    done = subprocess.run([PYTHON, "-c", script, str(cache), *files],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out.get("errno") == errno.EFBIG, out
    assert f"could not write the cache {cache}" in out["message"], out
    assert "6000 records loaded stay in memory" in out["message"], out
    assert out["left"] == [], (
        f"expected no cache and no temporary file in {caches}, found {out['left']}"
    )
    assert out["records"] == 6000
    # With room on the disk, the next load writes the cache and the one after reads it.
    def load() -> InMemoryDataset:
        ds = InMemoryDataset()
        ds.init(batch_size=100, use_var=SMALL_SCHEMA, progress=False, cache=str(cache))
        ds.set_filelist(files)
        ds.load_into_memory()
        return ds

    first = load()
    assert [p.name for p in caches.iterdir()] == ["train.arrow"]
    assert cache.stat().st_size > 64 << 10  # the limit did cut the first write short
    second = load()
    assert second.to_arrow().equals(first.to_arrow())
    assert second.stats().records == 6000


# -- accounting: every line read is a record or a counted skip, per file ------------

BAD_LINES = {
    "blank_line": "\n",
    "missing_slot": "3 1 2 3\n",
    "bad_count": "x 1\n",
    "not_a_number": "3 1 2 abc 1 5 1 0 1 1\n",
    "negative_uint64": "3 1 2 3 1 -5 1 0 1 1\n",
    "dense_count_mismatch": "3 1 2 3 1 5 1 0 2 1 1\n",
    "trailing_tokens": "3 1 2 3 1 5 1 0 1 1 7\n",
}
# (good records, bad lines by reason) per file; bad lines sit between good ones.
ACCOUNTING_FILES = [
    (50, {"blank_line": 2, "missing_slot": 1}),
    (40, {}),
    (30, {"bad_count": 1, "not_a_number": 2, "negative_uint64": 1,
          "dense_count_mismatch": 1, "trailing_tokens": 3}),
]


def _accounting_files(directory: Path) -> list[str]:
    from support import small_line

    paths, start = [], 0
    for index, (good, bad) in enumerate(ACCOUNTING_FILES):
        lines = [small_line(start + i) for i in range(good)]
        start += good
        at = 1
        for reason, count in bad.items():
            for _ in range(count):
                lines.insert(at, BAD_LINES[reason])
                at += 3
        path = directory / f"part-{index}.txt"
        text = "".join(lines)
        path.write_text(text[:-1] if index == 2 else text)  # a last line without b"\n"
        paths.append(str(path))
    return paths


def _assert_adds_up(stats, paths: list[str]) -> None:
    """Per file: the exact counts written, lines == records + skipped, and the
    reasons add up to the skipped lines."""
    assert [f.path for f in stats.per_file] == paths
    for f, (good, bad) in zip(stats.per_file, ACCOUNTING_FILES, strict=True):
        expected = (good + sum(bad.values()), good, sum(bad.values()), bad)
        found = (f.lines, f.records, f.skipped_lines, f.skipped_reasons)
        assert found == expected, (
            f"{f.path}: expected (lines, records, skipped, reasons) {expected}, found {found}"
        )
        assert f.lines == f.records + f.skipped_lines
    assert stats.lines == stats.records + stats.skipped_lines == 131
    assert stats.records == 120 and stats.files == 3
    assert stats.skipped_reasons == {
        "blank_line": 2, "missing_slot": 1, "bad_count": 1, "not_a_number": 2,
        "negative_uint64": 1, "dense_count_mismatch": 1, "trailing_tokens": 3,
    }


@pytest.mark.parametrize("pipe_command", ["cat", "cat -"], ids=["direct", "pipe"])
def test_a_load_accounts_for_every_line_per_file_and_logs_it(tmp_path, caplog, pipe_command):
    import logging

    from support import SMALL_SCHEMA

    from datafeed import InMemoryDataset

    paths = _accounting_files(tmp_path)
    ds = InMemoryDataset()
    ds.init(batch_size=7, thread_num=2, use_var=SMALL_SCHEMA, pipe_command=pipe_command,
            on_bad_line="skip", progress=False)
    ds.set_filelist(paths)
    with caplog.at_level(logging.INFO, logger="datafeed"):
        ds.load_into_memory()
    _assert_adds_up(ds.stats(), paths)
    assert sum(batch.size for batch in ds) == 120  # every record counted is delivered
    assert "loaded 3 files: 131 lines = 120 records + 11 skipped lines" in caplog.text
    # The files with skipped lines are named at INFO with their reasons.
    assert (f"{paths[0]}: 53 lines = 50 records + 3 skipped "
            "(blank_line 2, missing_slot 1)") in caplog.text
    assert (f"{paths[2]}: 38 lines = 30 records + 8 skipped (bad_count 1, dense_count_mismatch 1, "
            "negative_uint64 1, not_a_number 2, trailing_tokens 3)") in caplog.text
    assert f"{paths[1]}:" not in caplog.text  # a clean file only at DEBUG


def test_queue_passes_and_train_from_dataset_account_for_every_line(tmp_path, caplog):
    import logging

    import torch
    from support import SMALL_SCHEMA

    from datafeed import InMemoryDataset, QueueDataset
    from trainer import Executor

    paths = _accounting_files(tmp_path)

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(3, 1)

        def forward(self, batch):
            logit = self.linear(batch["dense"]).squeeze(1)
            return {"loss": torch.nn.functional.binary_cross_entropy_with_logits(
                logit, batch["label"].squeeze(1).float())}

    model = Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    queue = QueueDataset()
    queue.init(batch_size=8, thread_num=2, use_var=SMALL_SCHEMA, on_bad_line="skip", progress=False)
    queue.set_filelist(paths)
    for _ in range(2):  # each pass reads the files anew and is accounted anew
        assert sum(batch.size for batch in queue) == 120
        _assert_adds_up(queue.stats(), paths)
    for dataset in (queue, InMemoryDataset()):
        if isinstance(dataset, InMemoryDataset):
            dataset.init(batch_size=8, thread_num=2, use_var=SMALL_SCHEMA, on_bad_line="skip",
                         progress=False)
            dataset.set_filelist(paths)
            dataset.load_into_memory()
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="trainer.executor"):
            summary = Executor().train_from_dataset(
                model, dataset, optimizer, thread=2, fetch_list=[]
            )
        assert summary.records == 120 and summary.batches == 15
        assert summary.input is dataset.stats()
        _assert_adds_up(summary.input, paths)
        assert re.search(
            r"train_from_dataset: 15 batches, 120 records in [\d.]+ s; input: 3 files, 131 lines = "
            r"120 records \+ 11 skipped lines \(bad_count 1, blank_line 2, ", caplog.text
        ), caplog.text


def test_a_load_whose_counts_do_not_add_up_is_an_error_naming_the_file(tmp_path, monkeypatch):
    from support import SMALL_SCHEMA

    from datafeed import InMemoryDataset
    from datafeed.config.errors import AccountingError
    from datafeed.parse.parsing import ChunkParser

    paths = _accounting_files(tmp_path)
    # A parser that loses count of one kind of skipped line.
    real = ChunkParser.skipped_reasons.fget

    def reasons_without_not_a_number(self):
        return {k: v for k, v in real(self).items() if k != "not_a_number"}

    monkeypatch.setattr(ChunkParser, "skipped_reasons", property(reasons_without_not_a_number))
    ds = InMemoryDataset()
    ds.init(batch_size=8, use_var=SMALL_SCHEMA, on_bad_line="skip", progress=False)
    ds.set_filelist(paths)
    with pytest.raises(AccountingError, match=re.escape(f"the load of {paths[2]} does not add up")):
        ds.load_into_memory()
    with pytest.raises(RuntimeError):
        ds.to_arrow()  # nothing was kept


TRAIN_SOAK = """
import json, os, sys
sys.path.insert(0, {tests!r})
from support import SMALL_SCHEMA
import torch
from datafeed import InMemoryDataset
from trainer import Executor

def status(key):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.EmbeddingBag(1000, 4, mode="sum")
        self.out = torch.nn.Linear(7, 1)
        self.kept = []

    def forward(self, batch):
        ids = batch["ids"]
        x = torch.cat([batch["dense"], self.emb(ids.values % 1000, ids.offsets[:-1])], dim=1)
        if os.environ.get("LEAK"):  # the test's own check that a leak is seen
            self.kept.append(x.detach().clone().repeat(1, 8))
        logit = self.out(x).squeeze(1)
        return {{"loss": torch.nn.functional.binary_cross_entropy_with_logits(
            logit, batch["label"].squeeze(1).float())}}

torch.manual_seed(0)
model = Model()
optimizer = torch.optim.Adagrad(model.parameters(), lr=0.05)
ds = InMemoryDataset()
ds.init(batch_size=512, thread_num=2, use_var=SMALL_SCHEMA, progress=False)
ds.set_filelist(sys.argv[1:])
ds.load_into_memory()
base = status("VmRSS")
calls = []
for call in range(3):
    summary = Executor().train_from_dataset(model, ds, optimizer, thread=2, fetch_list=[])
    calls.append(dict(records=summary.records, loss=summary.mean_loss,
                      rss=status("VmRSS") - base, peak=status("VmHWM") - base))
print(json.dumps(dict(calls=calls, store=ds.nbytes)))
"""


@pytest.mark.parametrize("leak", [False, True], ids=["flat", "a_leak_is_seen"])
def test_three_train_from_dataset_calls_on_one_dataset_keep_memory_flat(tmp_path, leak):
    import os

    from support import small_line

    block = "".join(small_line(i) for i in range(1000))
    paths = []
    for f in range(2):
        path = tmp_path / f"part-{f}.txt"
        path.write_text(block * 150)
        paths.append(str(path))
    script = TRAIN_SOAK.format(tests=str(Path(__file__).resolve().parents[1] / "helpers"))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if leak:
        env["LEAK"] = "1"
    done = subprocess.run([PYTHON, "-c", script, *paths], capture_output=True, text=True,
                          timeout=240, check=False, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    soak = json.loads(done.stdout.strip().splitlines()[-1])
    calls, store = soak["calls"], soak["store"]
    assert [c["records"] for c in calls] == [300_000] * 3  # every call sees every record
    # Peak and current RSS flat after the first call: growth after it stays
    # under a quarter of the store (a leak of one pass's batches is about a store).
    peak_growth = calls[2]["peak"] - calls[0]["peak"]
    rss_growth = calls[2]["rss"] - calls[0]["rss"]
    flat = peak_growth < 0.25 * store and rss_growth < 0.25 * store
    assert flat != leak, (
        f"expected peak RSS {'to grow' if leak else 'flat'} after the first call; store {store} "
        f"bytes, peak growth {peak_growth}, RSS growth {rss_growth}: {calls}"
    )


# -- a worker killed during global_shuffle under fleetrun ----------------------------

SHUFFLE_WORKER = r"""
import os, signal, sys
sys.path.insert(0, os.path.join(sys.argv[2], "tests", "helpers"))
from support import SMALL_SCHEMA, small_line
from datafeed import InMemoryDataset
from datafeed.reorder import global_shuffle as gs
from trainer import fleet

out, rank = sys.argv[1], int(os.environ["RANK"])
with open(os.path.join(out, f"rank{rank}.pid"), "w") as f:
    f.write(str(os.getpid()))
fleet.init(is_collective=True)
path = os.path.join(out, f"part-{rank}.txt")
with open(path, "w") as f:
    f.write("".join(small_line(rank * 1000 + i) for i in range(200)))
ds = InMemoryDataset()
ds.init(batch_size=8, use_var=SMALL_SCHEMA, progress=False, fleet_send_batch_size=10)
ds.set_filelist([path])
ds.load_into_memory()
gs.ROUND_BYTES = 1  # many small rounds
if rank == 2:  # dies after the first round of records was exchanged
    exchange = gs.TimedCollectives.exchange

    def exchange_then_die(self, *args, **kwargs):
        result = exchange(self, *args, **kwargs)
        print(f"rank {rank}: SIGKILL after the first round", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    gs.TimedCollectives.exchange = exchange_then_die
ds.global_shuffle(fleet, seed=5)
print(f"rank {rank}: global_shuffle finished", flush=True)
"""


def test_a_worker_killed_during_global_shuffle_stops_the_fleetrun_job(tmp_path):
    import os
    import sys
    import time

    repo = Path(__file__).resolve().parents[2]
    script = tmp_path / "shuffle.py"
    script.write_text(SHUFFLE_WORKER)
    env = dict(os.environ, PYTHONPATH=str(repo))
    started = time.monotonic()
    launcher = subprocess.Popen(
        [
            sys.executable, "-m", "trainer.job.launch", "--nproc_per_node=3",
            str(script), str(tmp_path), str(repo),
        ],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    try:
        output, _ = launcher.communicate(timeout=150)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, 9)
            launcher.communicate()
    seconds = time.monotonic() - started
    assert launcher.returncode != 0, output[-4000:]
    assert seconds < 120, f"fleetrun took {seconds:.0f}s to stop"
    assert "rank 2: SIGKILL after the first round" in output
    # fleetrun's failure summary (torchrun's) names the dead worker as the root cause.
    root = output[output.find("Root Cause"):]
    dead_rank = r"rank\s+: 2 \(local_rank: 2\)\s+exitcode\s+: -9 .*\(SIGKILL\)"
    assert re.search(dead_rank, root), output[-4000:]
    # Each survivor's log holds its GlobalShuffleError naming the dead rank.
    for rank in (0, 1):
        assert re.search(
            rf"GlobalShuffleError: rank {rank} of 3: global_shuffle failed while round \d+ of \d+: "
            r"exchanging [a-z]+; not answering: rank 2 \(", output
        ), f"rank {rank} logged no GlobalShuffleError naming rank 2:\n{output[-4000:]}"
    assert "global_shuffle finished" not in output
    for pid_file in tmp_path.glob("rank*.pid"):  # nothing of the job is left running
        pid = int(pid_file.read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert len(list(tmp_path.glob("rank*.pid"))) == 3


def test_a_sigterm_held_during_global_shuffle_is_delivered_afterwards_not_lost():
    import os
    import signal

    from datafeed.reorder.global_shuffle import HeldTermination

    seen: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: seen.append(signum))
    try:
        with HeldTermination() as held:
            os.kill(os.getpid(), signal.SIGTERM)
            assert held.received == signal.SIGTERM and seen == []  # held back...
            assert not held.expired(60.0) and held.expired(0.0)
        assert seen == [signal.SIGTERM]  # ...then delivered to the handler that was there
        assert signal.getsignal(signal.SIGTERM) is not None and held.received is None
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- a single-machine job listens on 127.0.0.1 only ----------------------------------

BIND_JOB = r"""
import os, sys, time
import torch
from trainer import fleet

out, mode = sys.argv[1], sys.argv[2]

def wait_for_the_test():
    # The test lists the job's sockets while every process is inside the job.
    open(os.path.join(out, f"ready-{os.getpid()}"), "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(out, "done")) and time.monotonic() < deadline:
        time.sleep(0.05)

if mode == "collective":
    sys.path.insert(0, os.path.join(sys.argv[3], "tests", "helpers"))
    from support import SMALL_SCHEMA, small_line
    from datafeed import InMemoryDataset
    fleet.init(is_collective=True)
    path = os.path.join(out, f"part-{fleet.worker_index()}.txt")
    with open(path, "w") as f:
        f.write("".join(small_line(i) for i in range(50)))
    ds = InMemoryDataset()
    ds.init(batch_size=8, use_var=SMALL_SCHEMA, progress=False)
    ds.set_filelist([path])
    ds.load_into_memory()
    ds.global_shuffle(fleet, seed=1)
    assert ds.get_memory_data_size(fleet) == 100
    wait_for_the_test()
    fleet.barrier_worker()
else:
    from trainer.nn import SparseEmbedding
    fleet.init()
    torch.manual_seed(0)
    model = SparseEmbedding(4, "bind_emb")
    placeholder = torch.zeros(1, requires_grad=True)
    optimizer = fleet.distributed_optimizer(torch.optim.SGD([placeholder], lr=0.1), model=model)
    if fleet.is_server():
        fleet.init_server()
        open(os.path.join(out, f"ready-{os.getpid()}"), "w").close()
        fleet.run_server()
    else:
        fleet.init_worker()
        from datafeed import Ragged
        ids = Ragged(torch.tensor([1, 2, 3]), torch.tensor([0, 2, 3]))
        model(ids).sum().backward()
        optimizer.step()
        wait_for_the_test()
        fleet.stop_worker()
"""


def _descendants(root: int) -> list[int]:
    import os

    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _listening_sockets(pids: list[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every listening TCP socket the processes hold."""
    import ipaddress
    import os

    owner = {}
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if link.startswith("socket:["):
                    owner[link[8:-1]] = pid
        except OSError:
            continue
    found = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/net/{table}") as sockets:
            next(sockets)
            for line in sockets:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state != "0A" or inode not in owner:  # 0A: LISTEN
                    continue
                address, port = local.split(":")
                raw = bytes.fromhex(address)
                # /proc prints each 32-bit word in host (little-endian) order.
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                found.append((owner[inode], str(ipaddress.ip_address(raw)), int(port, 16)))
    return found


@pytest.mark.parametrize("mode", ["collective", "ps"])
def test_a_single_machine_fleetrun_job_listens_on_loopback_only(tmp_path, mode):
    import os
    import sys
    import time

    repo = Path(__file__).resolve().parents[2]
    script = tmp_path / "job.py"
    script.write_text(BIND_JOB)
    args = ["--nproc_per_node=2"] if mode == "collective" else ["--server_num=2", "--worker_num=2"]
    launcher = subprocess.Popen(
        [
            sys.executable, "-m", "trainer.job.launch", *args,
            str(script), str(tmp_path), mode, str(repo),
        ],
        cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(repo)),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        expected = 2 if mode == "collective" else 4
        while len(list(tmp_path.glob("ready-*"))) < expected and time.monotonic() < deadline:
            assert launcher.poll() is None, launcher.communicate()[0][-4000:]
            time.sleep(0.1)
        assert len(list(tmp_path.glob("ready-*"))) == expected, "the job did not get going"
        listening = _listening_sockets(_descendants(launcher.pid))
        (tmp_path / "done").touch()
        output, _ = launcher.communicate(timeout=90)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, 9)
            launcher.communicate()
    assert launcher.returncode == 0, output[-4000:]
    job_pids = {int(p.name.split("-")[1]) for p in tmp_path.glob("ready-*")}
    # Every process of the job listens somewhere (store, gloo, parameter server)...
    assert listening and {pid for pid, _, _ in listening} & job_pids, listening
    # ...and only on the loopback interface.
    exposed = [(pid, address, port) for pid, address, port in listening if address != "127.0.0.1"]
    assert not exposed, (
        f"expected every listening socket on 127.0.0.1, found {exposed} (all: {listening})"
    )
