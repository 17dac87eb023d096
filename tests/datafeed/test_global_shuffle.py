"""global_shuffle and cluster-wide sizes: 2 and 3 real processes, gloo on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from support import REPO, SMALL_SCHEMA, communicate_all, reserved_ports, small_line

from datafeed import InMemoryDataset
from datafeed.config.errors import SchemaError
from datafeed.reorder.global_shuffle import GlobalShuffleError

WORKER = r"""
import json, os, sys, time
sys.path.insert(0, os.path.join(sys.argv[3], "tests", "helpers"))
from support import SMALL_SCHEMA
from datafeed import InMemoryDataset
from datafeed.reorder import global_shuffle as gs
from datafeed.reorder.global_shuffle import GlobalShuffleError
from trainer import fleet

out, scenario, _repo, files_json = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
rank = int(os.environ["RANK"])
files = json.loads(files_json)[rank]
fleet.init(is_collective=True, timeout=4 if scenario in ("peer_stalls", "rank0_dies") else 8)
result = {}

def ids(ds):
    return [int(v) for batch in ds for v in batch["dense"][:, 0].tolist()]

def load(**settings):
    ds = InMemoryDataset()
    ds.init(batch_size=4, use_var=SMALL_SCHEMA, **settings)
    ds.set_filelist(files)
    ds.load_into_memory()
    return ds

if scenario in ("peer_dies", "peer_stalls", "rank0_dies"):
    if scenario == "rank0_dies":
        # Every rank's group has formed before rank 0 dies: dying during the
        # rendezvous (rank 0 also hosts the store) would test fleet.init instead.
        fleet.barrier_worker()
        if rank == 0:
            os._exit(3)
    if rank == fleet.worker_num() - 1 and scenario != "rank0_dies":
        if scenario == "peer_dies":
            os._exit(3)
        # Stalls (alive, silent) until the others have given up on it.
        while not os.path.exists(os.path.join(out, "rank0.json")):
            time.sleep(0.1)
        os._exit(0)
    ds = load()
    started = time.monotonic()
    try:
        ds.global_shuffle(fleet, seed=1)
    except GlobalShuffleError as error:
        result["error"] = str(error)
        result["peers"] = list(error.peers)
    result["seconds"] = time.monotonic() - started
    json.dump(result, open(os.path.join(out, f"rank{rank}.json"), "w"))
    os._exit(0)

if scenario == "merge":
    from datafeed import Slot
    from datafeed.reorder.hashing import ins_id_ranks

    def merged(**settings):
        ds = InMemoryDataset()
        ds.init(batch_size=5, use_var=[Slot("label", "int64", (1,)), Slot("C1", "uint64"),
                Slot("C2", "uint64"), Slot("dense", "float32", (2,))], **settings)
        ds.update_settings(parse_ins_id=True, merge_size=2)
        ds.set_filelist(files)
        ds.load_into_memory()
        return ds

    def records(ds):
        return [
            [ins_id, int(b["label"][i, 0]), b["C1"][i].tolist(), b["C2"][i].tolist(),
             b["dense"][i].tolist()]
            for b in ds for i, ins_id in enumerate(b.ins_ids)
        ]

    ds = merged(fleet_send_batch_size=1)
    result["before"] = ds.get_memory_data_size()
    round_bytes, gs.ROUND_BYTES = gs.ROUND_BYTES, 1  # one record per peer per round
    ds.global_shuffle(fleet, seed=5)
    gs.ROUND_BYTES = round_bytes
    result["records"] = records(ds)
    result["total_after"] = ds.get_memory_data_size(fleet)
    index = ds._store.schema.index("__ins_id__")
    result["owners"] = sorted({int(r) for chunk in ds._store.chunks
                               for r in ins_id_ranks(chunk.columns[index], fleet.worker_num())})
    big = merged()
    big.global_shuffle(fleet, seed=5)
    result["same_with_big_rounds"] = records(big) == result["records"]
    first = merged(seed=9)
    first.global_shuffle(fleet)
    consumed = 0
    for _ in first:
        consumed += 1
        break
    state = first.state_dict()
    result["shuffles"] = state["shuffles"]
    rest = records(first)
    again = merged(seed=9)
    again.load_state_dict(state)
    result["resumed"] = records(again) == rest[5 * consumed:]
    # merge on one rank only: refused on every rank, before anything is sent.
    mixed = merged()
    if rank == 0:
        mixed.update_settings(merge_size=0, merge_by_lineid=False)
    try:
        mixed.global_shuffle(fleet, seed=1)
    except GlobalShuffleError as error:
        result["mixed_error"] = str(error)
    result["kept_after_mixed"] = mixed.get_memory_data_size()
    fleet.stop_worker()
    json.dump(result, open(os.path.join(out, f"rank{rank}.json"), "w"))
    os._exit(0)

if scenario == "by_uid":
    from datafeed import Slot
    from datafeed.reorder.hashing import uid_ranks

    def by_uid(paths, **settings):
        ds = InMemoryDataset()
        ds.init(batch_size=4, use_var=[Slot("uid", "uint64"), Slot("dense", "float32", (1,))],
                **settings)
        ds._set_uid_slot("uid")
        ds._set_shuffle_by_uid(True)
        ds.set_filelist(paths)
        ds.load_into_memory()
        return ds

    def records(ds):
        return [[int(u), int(d)] for b in ds
                for u, d in zip(b["uid"].values.tolist(), b["dense"][:, 0].tolist())]

    ds = by_uid(files, fleet_send_batch_size=1)
    result["before"] = ds.get_memory_data_size()
    round_bytes, gs.ROUND_BYTES = gs.ROUND_BYTES, 1  # one record per peer per round
    ds.global_shuffle(fleet, seed=5)
    gs.ROUND_BYTES = round_bytes
    result["records"] = records(ds)
    index = ds._store.schema.index("uid")
    result["owners"] = sorted({int(r) for chunk in ds._store.chunks
                               for r in uid_ranks(chunk.columns[index], fleet.worker_num())})
    big = by_uid(files)
    big.global_shuffle(fleet, seed=5)
    result["same_with_big_rounds"] = records(big) == result["records"]
    other_seed = by_uid(files)
    other_seed.global_shuffle(fleet, seed=6)
    result["other_seed"] = records(other_seed)
    first = by_uid(files, seed=9)
    first.global_shuffle(fleet)
    next(iter(first))
    state = first.state_dict()
    result["shuffles"] = state["shuffles"]
    rest = records(first)
    again = by_uid(files, seed=9)
    again.load_state_dict(state)
    result["resumed"] = records(again) == rest[4:]
    # A record without exactly one uid (on rank 1): every rank fails, naming it.
    bad = by_uid(files + ([sys.argv[5]] if rank == 1 else []))
    try:
        bad.global_shuffle(fleet, seed=1)
    except GlobalShuffleError as error:
        result["bad_uid_error"] = str(error)
    result["kept_after_bad_uid"] = bad.get_memory_data_size()
    fleet.stop_worker()
    json.dump(result, open(os.path.join(out, f"rank{rank}.json"), "w"))
    os._exit(0)

ds = load(fleet_send_batch_size=3)  # many small rounds
result["before"] = ds.get_memory_data_size()
result["total_before"] = ds.get_memory_data_size(fleet)
round_bytes, gs.ROUND_BYTES = gs.ROUND_BYTES, 1
ds.global_shuffle(fleet, seed=11)
gs.ROUND_BYTES = round_bytes
result["order"] = ids(ds)
result["total_after"] = ds.get_shuffle_data_size(fleet)
result["seed"] = ds.last_shuffle_seed
# The outcome does not depend on the round size.
big = load()
big.global_shuffle(fleet, seed=11)
result["same_with_big_rounds"] = ids(big) == result["order"]
# Records shuffled before are numbered in their shuffled order (gathered round
# by round): as if they had been copied into that order first.
import numpy as np
ordered = load(fleet_send_batch_size=3)
ordered.local_shuffle(seed=2)
round_bytes, gs.ROUND_BYTES = gs.ROUND_BYTES, 1
ordered.global_shuffle(fleet, seed=11)
gs.ROUND_BYTES = round_bytes
copied = load()
copied.local_shuffle(seed=2)
copied._store = copied._store.take(np.arange(copied._store.rows))
copied.global_shuffle(fleet, seed=11)
result["ordered_sender"] = ids(ordered) == ids(copied) and ids(ordered) != result["order"]
# seed=None everywhere: rank 0's fresh seed, the same on every rank.
fresh = load()
fresh.global_shuffle()
result["fresh_seed"] = fresh.last_shuffle_seed
result["fresh_order"] = ids(fresh)
# Resume after a global shuffle: a new dataset replays it from the state.
first = load(seed=3)
first.global_shuffle(fleet)
seen = []
for batch in first:
    seen += batch["dense"][:, 0].tolist()
    if len(seen) >= 4:
        break
state = first.state_dict()
rest = ids(first)  # a full pass from the start
again = load(seed=3)
again.load_state_dict(state)
result["resumed"] = ids(again) == rest[len(seen):]
# Seeds that differ between ranks are an error, on every rank.
mixed = load()
try:
    mixed.global_shuffle(fleet, seed=rank)
except GlobalShuffleError as error:
    result["seed_error"] = str(error)
result["kept_after_seed_error"] = mixed.get_memory_data_size()
# equal_batches: every rank yields the fewest batches any rank has.
result["equal_batches"] = sum(1 for _ in load(equal_batches=True))
result["unequal_batches"] = sum(1 for _ in load())
fleet.stop_worker()
json.dump(result, open(os.path.join(out, f"rank{rank}.json"), "w"))
os._exit(0)
"""


def _run_job(
    tmp_path: Path,
    world: int,
    scenario: str,
    per_rank_files: list[list[str]],
    timeout: float = 60.0,
    extra_args: tuple[str, ...] = (),
) -> list[dict]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    # Rank 0's rendezvous store listens on the reserved port.
    with reserved_ports(1) as (port,):
        procs = []
        for rank in range(world):
            env = dict(
                os.environ,
                RANK=str(rank),
                WORLD_SIZE=str(world),
                LOCAL_RANK=str(rank),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                GLOO_SOCKET_IFNAME="lo",
            )
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(script),
                        str(tmp_path),
                        scenario,
                        str(REPO),
                        json.dumps(per_rank_files),
                        *extra_args,
                    ],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                )
            )
        outputs = communicate_all(procs, timeout)
    results = []
    for rank in range(world):
        path = tmp_path / f"rank{rank}.json"
        dead = 0 if scenario == "rank0_dies" else world - 1
        if scenario in ("peer_dies", "peer_stalls", "rank0_dies") and rank == dead:
            results.append({})
            continue
        assert path.exists(), f"rank {rank} wrote no result:\n" + "\n".join(outputs)
        results.append(json.loads(path.read_text()))
    return results


def _per_rank_files(
    tmp_path: Path, sizes: list[int]
) -> tuple[list[list[str]], list[int]]:
    """Rank r loads ``sizes[r]`` consecutive small records (in two files)."""
    data = tmp_path / "data"
    data.mkdir()
    files, ids, start = [], [], 0
    for rank, n in enumerate(sizes):
        folder = data / f"rank{rank}"
        folder.mkdir()
        half = n // 2
        paths = []
        for part, count in enumerate((half, n - half)):
            path = folder / f"part-{part}.txt"

            path.write_text("".join(small_line(start + i) for i in range(count)))
            ids += range(start, start + count)
            start += count
            paths.append(str(path))
        files.append(paths)
    return files, ids


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("sizes", [[23, 10], [7, 31, 12]], ids=["world2", "world3"])
def test_global_shuffle_across_processes(tmp_path: Path, sizes: list[int]) -> None:
    files, all_ids = _per_rank_files(tmp_path, sizes)
    world, total = len(sizes), len(all_ids)
    results = _run_job(tmp_path, world, "main", files)
    orders = [r["order"] for r in results]
    # Nothing lost or duplicated.
    assert Counter(i for order in orders for i in order) == Counter(all_ids)
    # Balanced: counts differ by at most one.
    counts = [len(o) for o in orders]
    assert max(counts) - min(counts) <= 1
    assert [r["before"] for r in results] == sizes
    assert all(r["total_before"] == r["total_after"] == total for r in results)
    # Deterministic: independent of round size, and equal to the documented
    # permutation (record perm[j] at position j // world of rank j % world).
    import numpy as np

    perm = np.random.default_rng(11).permutation(total)
    for rank, order in enumerate(orders):
        assert order == [all_ids[g] for g in perm[rank::world]]
        assert results[rank]["same_with_big_rounds"]
        assert results[rank]["seed"] == 11
    # A fresh seed is shared by every rank, and the shuffle is still loss-free.
    assert len({r["fresh_seed"] for r in results}) == 1
    assert Counter(i for r in results for i in r["fresh_order"]) == Counter(all_ids)
    assert all(r["resumed"] for r in results)
    assert all(r["ordered_sender"] for r in results)
    assert all("same seed on every rank" in r["seed_error"] for r in results)
    assert [r["kept_after_seed_error"] for r in results] == sizes
    assert [r["unequal_batches"] for r in results] == [-(-n // 4) for n in sizes]
    fewest = min(-(-n // 4) for n in sizes)
    assert [r["equal_batches"] for r in results] == [fewest] * world


def _merge_files(tmp_path: Path, world: int) -> tuple[list[list[str]], dict[str, list]]:
    """Paddle lines with instance ids (``1 <id>`` first) whose halves lie on
    different ranks, and the records a merge with merge_size=2 makes of them."""
    lines: list[list[str]] = [[] for _ in range(world)]

    def put(rank: int, ins_id: str, label: int, c1: int, c2: int, dense: tuple) -> None:
        lines[rank % world].append(
            f"1 {ins_id} 1 {label} 1 {c1} 1 {c2} 2 {dense[0]} {dense[1]}\n"
        )

    expected = {}
    for k in range(12):
        put(k, f"u{k}", 1, 100 + k, 0, (0, 0))  # the join side
        put(k + 1, f"u{k}", 0, 0, 200 + k, (k, 1))  # the update side, on the next rank
        expected[f"u{k}"] = [f"u{k}", 1, [100 + k], [200 + k], [float(k), 1.0]]
    for k in range(3):
        put(k, f"single{k}", 1, 1, 0, (0, 0))  # alone: dropped (merge_size=2)
    put(0, "conflict", 1, 7, 0, (0, 0))
    put(1, "conflict", 0, 8, 0, (0, 0))  # C1 in both records: dropped
    for k in range(3):
        put(k, "triple", 0, 0, 0, (0, 0))  # three records: dropped
    files = []
    for rank, text in enumerate(lines):
        path = tmp_path / f"merge-{rank}.txt"
        path.write_text("".join(text))
        files.append([str(path)])
    return files, expected


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("world", [2, 3])
def test_merge_by_lineid_across_processes(tmp_path: Path, world: int) -> None:
    files, expected = _merge_files(tmp_path, world)
    results = _run_job(tmp_path, world, "merge", files)
    # 32 records, 12 instance ids in two halves on two ranks: 12 merged records,
    # each on one rank only, the rank its id hashes to (XXH64 % world).
    merged = [record for r in results for record in r["records"]]
    assert sorted(r[0] for r in merged) == sorted(expected)
    assert {r[0]: r for r in merged} == expected
    assert sum(r["before"] for r in results) == 32
    assert all(r["total_after"] == 12 for r in results)
    for rank, result in enumerate(results):
        assert result["owners"] in ([rank], []), result["owners"]
        assert result["same_with_big_rounds"]
        assert result["resumed"]
        assert [entry[0] for entry in result["shuffles"]] == ["global_by_ins_id", "merge"]
        assert "every rank needs the same merge_size" in result["mixed_error"]
        assert result["kept_after_mixed"] == result["before"]
    # What one worker makes of all the lines: the same records.
    alone = InMemoryDataset()
    from datafeed import Slot

    alone.init(batch_size=50, use_var=[Slot("label", "int64", (1,)), Slot("C1", "uint64"),
               Slot("C2", "uint64"), Slot("dense", "float32", (2,))])
    alone.update_settings(parse_ins_id=True, merge_size=2)
    alone.set_filelist([f for rank_files in files for f in rank_files])
    alone.load_into_memory()
    alone.global_shuffle(seed=5)
    (batch,) = list(alone)
    assert sorted(batch.ins_ids) == sorted(expected)


@pytest.mark.distributed
def test_shuffle_by_uid_sends_each_users_records_to_one_worker(tmp_path: Path) -> None:
    # 30 records of 7 users over 2 ranks, each user's records on both ranks.
    lines: list[list[str]] = [[], []]
    uids = {}
    for record in range(30):
        uid = (record % 7) * 1_000_003 + 11
        uids[record] = uid
        lines[record % 2].append(f"1 {uid} 1 {record}\n")
    files = []
    for rank, text in enumerate(lines):
        path = tmp_path / f"uid-{rank}.txt"
        path.write_text("".join(text))
        files.append([str(path)])
    bad = tmp_path / "two-uids.txt"
    bad.write_text("1 5 1 100\n2 5 6 1 101\n")  # its record 1 holds two uids
    results = _run_job(tmp_path, 2, "by_uid", files, extra_args=(str(bad),))
    got = [tuple(r) for result in results for r in result["records"]]
    assert sorted(got) == sorted((uid, record) for record, uid in uids.items())
    users_by_rank = [{uid for uid, _ in result["records"]} for result in results]
    assert not users_by_rank[0] & users_by_rank[1]  # no user on both ranks
    assert len(users_by_rank[0] | users_by_rank[1]) == 7
    for rank, result in enumerate(results):
        assert result["owners"] in ([rank], [])  # XXH64(uid) % 2 is this rank
        assert result["same_with_big_rounds"]
        # The seed shuffles a rank's share: same records, another order.
        assert sorted(result["other_seed"]) == sorted(result["records"])
        assert result["other_seed"] != result["records"]
        assert result["resumed"]
        assert [entry[0] for entry in result["shuffles"]] == ["global_by_uid"]
        assert result["shuffles"][0][3] == "uid"
        assert result["bad_uid_error"].endswith(
            "global_shuffle by uid: the uid slot 'uid' must hold exactly one uint64 per "
            "record (as Paddle requires); rank 1's record 16 does not"
        ), result["bad_uid_error"]
        assert result["kept_after_bad_uid"] == result["before"] + 2 * rank


def test_shuffle_by_uid_needs_the_uid_slot(small_files: list[str]) -> None:
    ds = InMemoryDataset()
    ds.init(batch_size=4, use_var=SMALL_SCHEMA)
    ds.set_filelist(small_files)
    ds.load_into_memory()
    ds._set_shuffle_by_uid(True)
    with pytest.raises(SchemaError, match=r"call _set_uid_slot\(<slot name>\) first"):
        ds.global_shuffle(seed=1)
    ds._set_uid_slot("dense")
    with pytest.raises(SchemaError, match="the uid slot 'dense' is float32; a uid is one uint64"):
        ds.global_shuffle(seed=1)
    assert ds.get_memory_data_size() == 15  # nothing was lost


@pytest.mark.parametrize(
    ("slot", "reason"),
    [("dense", "the uid slot 'dense' is float32"), ("nope", "the uid slot 'nope'")],
)
def test_a_state_replaying_a_shuffle_by_an_unusable_uid_slot_is_refused(
    small_files: list[str], slot: str, reason: str
) -> None:
    from datafeed.config.errors import StateError

    ds = InMemoryDataset()
    ds.init(batch_size=4, use_var=SMALL_SCHEMA)
    ds.set_filelist(small_files)
    ds.load_into_memory()
    state = dict(ds.state_dict(), shuffles=[["global_by_uid", 1, 1, slot]],
                 records_in_memory=15, shuffle_counter=1)
    with pytest.raises(StateError, match=f"the state replays a shuffle by the uid of slot "
                                         f"'{slot}', which these records cannot take: .*{reason}"):
        ds.load_state_dict(state)
    assert ds.get_memory_data_size() == 15  # the records stay


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("scenario", ["peer_dies", "peer_stalls"])
def test_a_failed_peer_is_named_within_the_timeout(
    tmp_path: Path, scenario: str
) -> None:
    files, _ = _per_rank_files(tmp_path, [5, 6, 7])
    results = _run_job(tmp_path, 3, scenario, files)
    for rank in (0, 1):
        error = results[rank]["error"]
        assert f"rank {rank} of 3: global_shuffle failed" in error
        assert results[rank]["peers"] == [2], error
        assert "not answering: rank 2" in error
        # The group's timeout (4 s when stalled) and the 3 s liveness probe.
        # About 7 s idle; a loaded 2-core CI machine takes longer.
        assert results[rank]["seconds"] < 30


def test_without_a_process_group_it_is_a_local_shuffle(small_files: list[str]) -> None:
    from support import SMALL_SCHEMA

    a, b = InMemoryDataset(), InMemoryDataset()
    for ds in (a, b):
        ds.init(batch_size=5, use_var=SMALL_SCHEMA)
        ds.set_filelist(small_files)
        ds.load_into_memory()
    a.global_shuffle(seed=4)
    b.local_shuffle(seed=4)
    assert a.to_arrow().equals(b.to_arrow())
    assert a.get_memory_data_size() == 15
    # Paddle's count after a global shuffle with no other worker (the records stay here).
    assert a.get_shuffle_data_size() == 0


def test_a_fleet_of_several_workers_without_a_group_is_an_error(
    small_files: list[str],
) -> None:
    from support import SMALL_SCHEMA

    class TwoWorkers:
        def worker_num(self) -> int:
            return 2

    ds = InMemoryDataset()
    ds.init(batch_size=5, use_var=SMALL_SCHEMA)
    ds.set_filelist(small_files)
    ds.load_into_memory()
    with pytest.raises(
        GlobalShuffleError,
        match="the fleet has 2 workers but the torch.distributed process group has 1",
    ):
        ds.global_shuffle(TwoWorkers(), seed=1)
    with pytest.raises(
        GlobalShuffleError, match="get_memory_data_size: the fleet has 2 workers"
    ):
        ds.get_memory_data_size(TwoWorkers())
    assert ds.get_memory_data_size() == 15  # the failed calls left the records alone


def _loaded(files: list[str], use_var=None) -> InMemoryDataset:
    from support import SMALL_SCHEMA

    ds = InMemoryDataset()
    ds.init(batch_size=5, use_var=use_var or SMALL_SCHEMA)
    ds.set_filelist(files)
    ds.load_into_memory()
    return ds


def test_payloads_round_trip_and_are_checked_against_the_slots(
    small_files: list[str],
) -> None:
    import numpy as np

    from datafeed import Slot
    from datafeed.records.store import RecordStore
    from datafeed.reorder import global_shuffle as gs

    ds = _loaded(small_files)
    store = ds._store
    schema = ds.schema
    positions = np.arange(15, dtype=np.int64)
    send, sizes = gs._encode_round(schema, store, positions, positions, positions % 2, 2, 1)
    assert len(sizes) == 2 and sum(sizes) == len(send)
    first = send[: sizes[0]]
    evens = np.arange(0, 15, 2, dtype=np.int64)
    chunk, got = gs._decode(schema, first, source=1, rank=0, world=2, expected=evens)
    assert got.tolist() == evens.tolist()
    decoded = RecordStore(schema, [chunk]).to_arrow().to_pylist()
    assert decoded == ds.to_arrow().to_pylist()[::2]
    # Meant for rank 1, arriving at rank 0.
    with pytest.raises(
        GlobalShuffleError, match="from rank 1 is refused: it holds records meant for other"
    ) as refused:
        gs._decode(schema, send[sizes[0] :], 1, 0, 2, np.arange(0, 14, 2, dtype=np.int64))
    assert refused.value.peers == (1,)
    # Fewer records than the counts announced.
    with pytest.raises(GlobalShuffleError, match="holds 8 records, expected 7"):
        gs._decode(schema, first, 1, 0, 2, evens[:-1])
    # Another rank's slots: named, with the slot that differs.
    other = [Slot("dense", "float32", (3,)), Slot("ids", "int64"), *schema[2:]]
    with pytest.raises(
        GlobalShuffleError, match="from rank 1 is refused: it does not match the slots: slot 'ids'"
    ):
        gs._decode(type(schema)(other), first, 1, 0, 2, evens)
    with pytest.raises(
        GlobalShuffleError, match="from rank 1 is refused: not a readable Arrow IPC stream"
    ):
        gs._decode(schema, np.frombuffer(b"not arrow at all", np.uint8), 1, 0, 2, evens)


def test_equal_batches_is_a_bool_and_a_no_op_alone(small_files: list[str]) -> None:
    from datafeed import SchemaError

    ds = _loaded(small_files)
    with pytest.raises(SchemaError, match="'equal_batches' setting must be a bool"):
        ds.update_settings(equal_batches="yes")
    ds.update_settings(equal_batches=True)
    assert sum(b.size for b in ds) == 15


@pytest.mark.slow
@pytest.mark.distributed
def test_the_death_of_rank_0_is_named(tmp_path: Path) -> None:
    files, _ = _per_rank_files(tmp_path, [5, 6, 7])
    results = _run_job(tmp_path, 3, "rank0_dies", files)
    for rank in (1, 2):
        error = results[rank]["error"]
        assert f"rank {rank} of 3: global_shuffle failed" in error
        assert "not answering: rank 0" in error, error
        assert results[rank]["seconds"] < 30


PS_JOB = r"""
import json, os, sys
sys.path.insert(0, os.path.join(sys.argv[2], "tests", "helpers"))
import torch
from support import SMALL_SCHEMA
from datafeed import InMemoryDataset
from trainer import fleet

out, files_json = sys.argv[1], sys.argv[3]
fleet.init(timeout=30)
model = torch.nn.Linear(3, 1)
fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
if fleet.is_server():
    fleet.init_server()
    fleet.run_server()
    sys.exit(0)
fleet.init_worker()
rank = fleet.worker_index()
ds = InMemoryDataset()
ds.init(batch_size=4, use_var=SMALL_SCHEMA)
ds.set_filelist(json.loads(files_json)[rank])
ds.load_into_memory()
result = {"before": ds.get_memory_data_size(), "total": ds.get_memory_data_size(fleet)}
ds.global_shuffle(fleet, seed=11)
result["order"] = [int(v) for b in ds for v in b["dense"][:, 0].tolist()]
result["reduced"] = fleet.util.all_reduce([rank + 1, 10], mode="max").tolist()
# One call checkpoints the job mid-epoch; a fresh dataset resumes from it.
seen = []
for batch in ds:
    seen += [int(v) for v in batch["dense"][:, 0].tolist()]
    if ds.batches_consumed == 2:
        fleet.save_persistables(os.path.join(out, "ckpt"), dataset=ds)
        break
resumed = InMemoryDataset()
resumed.init(batch_size=4, use_var=SMALL_SCHEMA)
resumed.set_filelist(json.loads(files_json)[rank])
resumed.load_into_memory()
fleet.load_persistables(os.path.join(out, "ckpt"), dataset=resumed)
result["seen"] = seen
result["rest"] = [int(v) for b in resumed for v in b["dense"][:, 0].tolist()]
fleet.stop_worker()
json.dump(result, open(os.path.join(out, f"rank{rank}.json"), "w"))
"""


@pytest.mark.slow
@pytest.mark.distributed
def test_global_shuffle_among_the_workers_of_a_ps_job(tmp_path: Path) -> None:
    """A PS job's workers have no process group of their own (they talk to the
    servers over RPC): fleet.worker_group() forms one on first use. The job's
    checkpoint holds every worker's dataset position."""
    import numpy as np

    files, all_ids = _per_rank_files(tmp_path, [9, 14])
    script = tmp_path / "ps_job.py"
    script.write_text(PS_JOB)
    done = subprocess.run(
        [sys.executable, "-m", "trainer.job.launch", "--server_num=1", "--worker_num=2",
         str(script), str(tmp_path), str(REPO), json.dumps(files)],
        cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["before"] for r in results] == [9, 14]
    assert [r["total"] for r in results] == [23, 23]
    perm = np.random.default_rng(11).permutation(23)
    for rank, result in enumerate(results):
        assert result["order"] == [all_ids[g] for g in perm[rank::2]]
        assert result["reduced"] == [2, 10]
        # Resumed from the checkpoint: exactly the records not yet seen, in order.
        assert result["seen"] + result["rest"] == result["order"]
        assert len(result["seen"]) == 8
    saved = json.loads((tmp_path / "ckpt" / "dataset_state.json").read_text())
    assert [w["batches_consumed"] for w in saved["workers"]] == [2, 2]
    assert (tmp_path / "ckpt" / "meta.json").exists()  # the PS checkpoint beside it
