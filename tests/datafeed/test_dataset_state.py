"""InMemoryDataset.state_dict / load_state_dict: exact mid-epoch resume in a new process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import SMALL_SCHEMA, write_small_files

from datafeed import InMemoryDataset, QueueDataset

EPOCHS = 3

# The training loop of a resumable job: shuffle only when the epoch has not begun.
RESUME = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from support import SMALL_SCHEMA
from datafeed import InMemoryDataset, QueueDataset

files, states, epochs = json.loads(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])
out = []
for state in states:
    ds = InMemoryDataset()
    ds.init(batch_size=4, use_var=SMALL_SCHEMA, seed=7)
    ds.set_filelist(files)
    ds.load_into_memory()
    ds.load_state_dict(state)
    seen = []
    for epoch in range(ds.epoch, epochs):
        if not ds.epoch_started:
            ds.local_shuffle()
        for batch in ds:
            seen += batch["dense"][:, 0].tolist()
    out.append(seen)
print(json.dumps(out))
"""


def _dataset(files: list[str], **settings) -> InMemoryDataset:
    ds = InMemoryDataset()
    ds.init(use_var=SMALL_SCHEMA, **{"batch_size": 4, "seed": 7, **settings})
    ds.set_filelist(files)
    ds.load_into_memory()
    return ds


def _run(ds: InMemoryDataset, checkpoints: dict[tuple[int, int], int] | None = None):
    """The whole job; states at (epoch, batches consumed) points, with how much was seen."""
    seen: list[float] = []
    states: list[tuple[dict, int]] = []
    for _epoch in range(ds.epoch, EPOCHS):
        if (
            checkpoints is not None and (ds.epoch, -1) in checkpoints
        ):  # the epoch boundary
            states.append((ds.state_dict(), len(seen)))
        if not ds.epoch_started:
            ds.local_shuffle()
        for batch in ds:
            seen += batch["dense"][:, 0].tolist()
            if (
                checkpoints is not None
                and (ds.epoch, ds.batches_consumed) in checkpoints
            ):
                states.append((ds.state_dict(), len(seen)))
    return seen, states


def test_resume_in_a_new_process_at_several_positions(tmp_path: Path) -> None:
    files = write_small_files(tmp_path, files=3, per_file=13)  # 39 records: 10 batches
    points = {
        (0, 1): 0,  # early in the first epoch
        (0, 7): 0,  # mid-epoch
        (0, 10): 0,  # after the last (short) batch, inside the loop
        (1, -1): 0,  # at the epoch boundary, before the next shuffle
        (2, 3): 0,  # a later epoch
    }
    ds = _dataset(files)
    start_state = ds.state_dict()
    full, states = _run(ds, points)
    assert len(full) == 39 * EPOCHS and len(states) == len(points)
    # Each epoch is a permutation of the records, and the epochs differ.
    epochs = [full[i * 39 : (i + 1) * 39] for i in range(EPOCHS)]
    assert all(sorted(e) == sorted(epochs[0]) for e in epochs)
    assert epochs[0] != epochs[1] != epochs[2]
    payload = [start_state] + [s for s, _ in states]
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            RESUME,
            str(Path(__file__).resolve().parents[1] / "helpers"),
            json.dumps(files),
            json.dumps(payload),
            str(EPOCHS),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    resumed = json.loads(result.stdout)
    assert resumed[0] == full  # from the very start: the whole job
    for (state, seen), rest in zip(states, resumed[1:], strict=True):
        assert rest == full[seen:], (state["epoch"], state["batches_consumed"])


def test_state_dict_contents(small_files: list[str]) -> None:
    ds = _dataset(small_files)
    ds.local_shuffle()
    batches = iter(ds)
    next(batches)
    next(batches)
    state = ds.state_dict()
    assert json.loads(json.dumps(state)) == state
    assert (
        state["epoch"] == 0
        and state["batches_consumed"] == 2
        and state["epoch_started"]
    )
    assert state["seed"] == 7 and state["shuffle_counter"] == 1
    assert state["shuffles"] == [["local", ds.last_shuffle_seed]]
    assert state["records"] == 15
    list(batches)
    assert (ds.epoch, ds.batches_consumed, ds.epoch_started) == (1, 0, False)


def test_load_state_dict_refuses_a_state_that_does_not_fit(tmp_path: Path) -> None:
    files = write_small_files(tmp_path, files=3, per_file=5)
    ds = _dataset(files)
    ds.local_shuffle()
    state = ds.state_dict()
    other = _dataset(files[:2])
    with pytest.raises(ValueError, match="taken with 15 records .* holds 10"):
        other.load_state_dict(state)
    other = _dataset(files, batch_size=3)
    with pytest.raises(ValueError, match="batch_size=4, this dataset has batch_size=3"):
        other.load_state_dict(state)
    other = _dataset(files)
    other.local_shuffle()
    with pytest.raises(ValueError, match="already shuffled 1 times"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="the state lacks"):
        _dataset(files).load_state_dict({"epoch": 0})
    with pytest.raises(RuntimeError, match="no records in memory"):
        fresh = InMemoryDataset()
        fresh.init(batch_size=4, use_var=SMALL_SCHEMA)
        fresh.load_state_dict(state)


def test_release_memory_resets_the_position(small_files: list[str]) -> None:
    ds = _dataset(small_files)
    ds.local_shuffle()
    list(ds)
    ds.release_memory()
    assert (ds.epoch, ds.batches_consumed, ds.epoch_started) == (0, 0, False)
    ds.load_into_memory()
    assert ds.state_dict()["shuffles"] == []


def test_slots_shuffle_moves_the_named_slots_together(small_files: list[str]) -> None:
    from support import small_record

    from datafeed import SchemaError

    ds = _dataset(small_files)
    before = ds.to_arrow().to_pylist()
    ds.slots_shuffle(["ids", "signed"], seed=3)
    after = ds.to_arrow().to_pylist()
    assert [r["dense"] for r in after] == [r["dense"] for r in before]
    assert [r["label"] for r in after] == [r["label"] for r in before]
    pairs = [(r["ids"], r["signed"]) for r in after]
    assert sorted(pairs) == sorted((r["ids"], r["signed"]) for r in before)
    assert pairs != [(r["ids"], r["signed"]) for r in before]
    for ids, signed in pairs:  # both slots come from the same record
        j = ids[0] // 10
        assert small_record(j)["signed"] == signed
    assert ds.state_dict()["shuffles"] == [["slots", 3, ["ids", "signed"]]]
    with pytest.raises(SchemaError, match="no slot named 'nope'; the slots are dense"):
        ds.slots_shuffle(["nope"])


def test_resume_replays_a_slots_shuffle(small_files: list[str]) -> None:
    ds = _dataset(small_files)
    ds.local_shuffle()
    ds.slots_shuffle(["ids"])
    batches = iter(ds)
    next(batches)
    state = json.loads(json.dumps(ds.state_dict()))
    rest = [b["ids"].tolist() for b in batches]
    again = _dataset(small_files)
    again.load_state_dict(state)
    assert [b["ids"].tolist() for b in again] == rest


QUEUE_RESUME = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from support import SMALL_SCHEMA
from datafeed import QueueDataset

files, state, threads = json.loads(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])
ds = QueueDataset()
ds.init(batch_size=4, use_var=SMALL_SCHEMA, thread_num=threads)
ds.set_filelist(files)
ds.load_state_dict(state)
seen = []
for _ in range(ds.epoch, 2):
    for batch in ds:
        seen += batch["dense"][:, 0].tolist()
print(json.dumps(seen))
"""


def _queue(files: list[str], threads: int) -> QueueDataset:
    ds = QueueDataset()
    ds.init(batch_size=4, use_var=SMALL_SCHEMA, thread_num=threads)
    ds.set_filelist(files)
    return ds


@pytest.mark.parametrize("threads", [1, 3], ids=["one-reader", "byte-ranges"])
def test_queue_dataset_resumes_mid_pass_in_a_new_process(tmp_path: Path, threads: int) -> None:
    # One big file with 3 readers is read as 3 byte ranges at once, which
    # interleave: the state counts per range, not per file.
    from support import small_line

    if threads == 1:
        files = write_small_files(tmp_path, files=3, per_file=11)
    else:
        path = tmp_path / "big.txt"
        path.write_text("".join(small_line(i) for i in range(3000)))
        files = [str(path)]
    from datafeed.source import ranges

    ranges_min, ranges.MIN_RANGE_BYTES = ranges.MIN_RANGE_BYTES, 1024
    try:
        ds = _queue(files, threads)
        first_pass = [v for b in ds for v in b["dense"][:, 0].tolist()]
        assert ds.epoch == 1 and ds.batches_consumed == 0
        seen, state = [], None
        for batch in ds:  # the second pass, interrupted after 5 batches
            seen += batch["dense"][:, 0].tolist()
            if ds.batches_consumed == 5:
                state = json.loads(json.dumps(ds.state_dict()))
                break
        assert state is not None and state["epoch"] == 1 and sum(state["delivered"]) == 20
        if threads > 1:
            assert len(state["tasks"]) == 3  # byte ranges of the one file
        # The restarted job reads the same plan of ranges (the byte-range
        # threshold lowered in the child too).
        script = QUEUE_RESUME.replace(
            "from datafeed import QueueDataset",
            "from datafeed import QueueDataset\nfrom datafeed.source import ranges\n"
            "ranges.MIN_RANGE_BYTES = 1024",
        )
        done = subprocess.run(
            [sys.executable, "-c", script, str(Path(__file__).resolve().parents[1] / "helpers"),
             json.dumps(files), json.dumps(state), str(threads)],
            capture_output=True, text=True, timeout=60, check=True,
        )
    finally:
        ranges.MIN_RANGE_BYTES = ranges_min
    rest = json.loads(done.stdout)
    if threads == 1:  # one reader: the very order of an uninterrupted pass
        assert seen + rest == first_pass
    else:  # ranges interleave as in any pass: exactly the records not yet seen
        assert sorted(seen + rest) == sorted(first_pass)
        assert not set(seen) & set(rest)


def test_queue_dataset_state_refuses_another_file_list_or_plan(small_files: list[str]) -> None:
    ds = _queue(small_files, 1)
    next(iter(ds))  # one batch in
    state = ds.state_dict()
    other = _queue(small_files[:1], 1)
    with pytest.raises(ValueError, match="the state was taken with filelist="):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="takes a QueueDataset.state_dict"):
        other.load_state_dict({"epoch": 0})
    changed = json.loads(json.dumps(state))
    changed["tasks"][0][1] = 5
    again = _queue(small_files, 1)
    again.load_state_dict(changed)
    with pytest.raises(ValueError, match="resume with the thread_num and split_files setting "
                       "the state was taken with"):
        next(iter(again))


def test_save_persistables_checkpoints_model_and_dataset_together(
    tmp_path: Path, small_files: list[str]
) -> None:
    import torch

    from trainer import fleet

    fleet.init()  # one local worker
    model = torch.nn.Linear(3, 1)
    ds = _queue(small_files, 1)
    everything = [v for b in ds for v in b["dense"][:, 0].tolist()]
    seen = []
    for batch in ds:
        seen += batch["dense"][:, 0].tolist()
        if ds.batches_consumed == 2:
            fleet.save_persistables(str(tmp_path / "ckpt"), model=model, dataset=ds)
            break
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "dataset_state.json", "model.pt"
    ]  # nothing left under a temporary name
    restored, resumed = torch.nn.Linear(3, 1), _queue(small_files, 1)
    fleet.load_persistables(str(tmp_path / "ckpt"), model=restored, dataset=resumed)
    assert torch.equal(restored.weight, model.weight)
    assert seen + [v for b in resumed for v in b["dense"][:, 0].tolist()] == everything
    # A save that dies between its two files (the positions first, then the
    # model) leaves positions that name another model: refused, never paired.
    from datafeed import StateError
    from datafeed.source import fs

    (tmp_path / "ckpt" / "notes.txt").write_text("mine")  # the user's: kept
    real_write = fs.write_atomically

    def dies_at_the_model(path, content):
        if path.endswith("model.pt"):
            raise OSError("killed")
        return real_write(path, content)

    with torch.no_grad():
        model.weight.add_(1.0)
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(fs, "write_atomically", dies_at_the_model)
        with pytest.raises(OSError, match="killed"):
            fleet.save_persistables(str(tmp_path / "ckpt"), model=model, dataset=ds)
    with pytest.raises(StateError, match=r"saved with another .*model.pt \(a save died"):
        fleet.load_persistables(str(tmp_path / "ckpt"), model=restored, dataset=_queue(
            small_files, 1))
    fleet.save_persistables(str(tmp_path / "ckpt"), model=model, dataset=ds)  # whole again
    fleet.load_persistables(str(tmp_path / "ckpt"), model=restored, dataset=_queue(
        small_files, 1))
    assert (tmp_path / "ckpt" / "notes.txt").read_text() == "mine"
    (tmp_path / "ckpt" / "dataset_state.json").unlink()
    with pytest.raises(FileNotFoundError, match="was saved without a dataset"):
        fleet.load_persistables(str(tmp_path / "ckpt"), model=restored, dataset=resumed)


def test_only_a_full_save_with_positions_is_recorded_for_fleetrun_restarts(
    tmp_path: Path, small_files: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """fleetrun --max_restarts resumes from the recorded checkpoint: a save
    without the workers' positions, or a delta, would make a restart repeat or
    lose records, so neither is recorded (the online loop relies on that)."""
    import torch

    from trainer import fleet
    from trainer.job import restart

    record = tmp_path / restart.RECORD_FILE
    monkeypatch.setenv(restart.CHECKPOINT_RECORD_ENV, str(record))
    fleet.init()  # one local worker
    model = torch.nn.Linear(3, 1)
    ds = _queue(small_files, 1)
    next(iter(ds))
    fleet.save_persistables(str(tmp_path / "model_only"), model=model)
    fleet.save_persistables(str(tmp_path / "delta"), model=model, dataset=ds, mode=1)
    assert not record.exists()
    fleet.save_persistables(str(tmp_path / "full"), model=model, dataset=ds)
    assert json.loads(record.read_text())["checkpoint"] == str(tmp_path / "full")


def test_a_batch_size_changed_mid_pass_counts_the_pass_in_the_size_it_began_with(
    tmp_path: Path,
) -> None:
    # The state recorded the setting (8), the 3 batches were of 4: a resume
    # skipped 24 records for 12, and trained none of the other 12.
    pytest.importorskip("torch", reason="batches are torch tensors")
    files = write_small_files(tmp_path, files=2, per_file=20)  # 40 records
    ds = _dataset(files)
    batches = iter(ds)
    seen = [v for _ in range(3) for v in next(batches)["dense"][:, 0].tolist()]
    batches.close()
    ds.update_settings(batch_size=8)
    saved = ds.state_dict()
    assert saved["batch_size"] == 4 and saved["batches_consumed"] == 3
    resumed = _dataset(files)  # batch_size 4, as the pass was
    resumed.load_state_dict(saved)
    rest = [v for batch in resumed for v in batch["dense"][:, 0].tolist()]
    assert len(seen) == 12 and sorted(seen + rest) == sorted(
        v for batch in _dataset(files) for v in batch["dense"][:, 0].tolist())
