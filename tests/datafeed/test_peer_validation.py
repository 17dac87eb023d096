"""global_shuffle against a hostile peer: 2 real ranks, gloo on 127.0.0.1.

Rank 0 runs the real ``global_shuffle``; rank 1 is the attacker. It takes part
in the collectives as an honest rank would, then hands the exchange layer a
payload made by hand: garbage, a truncated stream, offsets that run backwards or
past the values, other slots, lying counts and lengths, a compressed body, an
absurd size, more records than any host could shuffle. Rank 0 must refuse each
with a GlobalShuffleError that names rank 1, and must not crash (before this,
some of them ended it with SIGSEGV, allocated 16 GiB, or raised a bare OSError).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from support import REPO, SMALL_SCHEMA, communicate_all, reserved_ports, small_line

# Each attack, and what rank 0's error must say about it.
ATTACKS = {
    "garbage": "not a readable Arrow IPC stream",
    "truncated": "not a readable Arrow IPC stream (Expected to read",
    "backwards_offsets": "Arrow's validation failed",
    "offsets_past_the_values": "Arrow's validation failed",
    "other_slots": "does not match the slots: slot 'ids'",
    "no_positions": "4 columns, expected 4 slots and the positions",
    "fewer_records": "holds 2 records, expected",
    "duplicated_positions": "positions are not the ones this round expects",
    "records_for_another_rank": "meant for other ranks",
    "lying_lengths": "validation failed: In column 0",
    "two_batches": "expected a schema and one record batch",
    "nulls": "validity bitmap",
    "compressed_zstd": "a compressed record batch",
    "compressed_lz4": "a compressed record batch",
    "negative_count": "rank 1 announced -5 records",
    "huge_payload": "rank 1 announced a payload of 1099511627776 bytes",
    # 2**31 records: their permutation alone is 16 GiB, allocated before any check.
    "huge_count": "rank 1 announced 2147483648 records in 2000 bytes",
    "huge_count_and_bytes": "rank 1 announced 2147483648 records of 60129542144 bytes",
    "lying_batch_length": "an unreadable record batch (Array length did not match",
    "lying_payload_size": "64 bytes after the end of the stream, expected none",
}
HONEST_RECORDS = 12
SEED = 7

JOB = r"""
import datetime, json, os, struct, sys
sys.path.insert(0, os.path.join(sys.argv[2], "tests", "helpers"))
import numpy as np
import pyarrow as pa
import torch
import torch.distributed as dist
from support import SMALL_SCHEMA

out, attacks = sys.argv[1], json.loads(sys.argv[3])
HOST_MEMORY = 8 << 30  # rank 0's host, whatever the machine running the test
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
SEED, ATTACKER_RECORDS = 7, 9

if rank == 0:
    from datafeed import InMemoryDataset
    from datafeed.config.errors import GlobalShuffleError
    from datafeed.reorder import global_shuffle as gs
    gs.memory_limit_bytes = lambda: HOST_MEMORY
    outcome = {}
    for attack in attacks:
        ds = InMemoryDataset()
        ds.init(batch_size=4, use_var=SMALL_SCHEMA)
        ds.set_filelist([os.path.join(out, "honest.txt")])
        ds.load_into_memory()
        try:
            ds.global_shuffle(seed=SEED)
            outcome[attack] = {"accepted": ds.get_memory_data_size()}
        except GlobalShuffleError as error:
            outcome[attack] = {"error": str(error), "peers": list(error.peers)}
        except Exception as error:  # a wrong kind of error is a failure, reported
            outcome[attack] = {"other": f"{type(error).__name__}: {error}"}
    json.dump(outcome, open(os.path.join(out, "rank0.json"), "w"))
    sys.exit(0)

# -- rank 1, the attacker ------------------------------------------------------------
from datafeed.reorder.collectives import TimedCollectives


def fields(ids_type=pa.uint64()):
    return [
        pa.field("dense", pa.list_(pa.float32(), 3), nullable=False),
        pa.field("ids", pa.list_(ids_type), nullable=False),
        pa.field("signed", pa.list_(pa.int64()), nullable=False),
        pa.field("label", pa.list_(pa.int64(), 1), nullable=False),
        pa.field("__fleetfeed_position", pa.int64(), nullable=False),
    ]


def batch(positions, ids_type=pa.uint64(), positions_column=True):
    n = len(positions)
    offsets = pa.array(np.arange(n + 1, dtype=np.int32))
    arrays = [
        pa.FixedSizeListArray.from_arrays(pa.array(np.ones(3 * n, np.float32)), 3),
        pa.ListArray.from_arrays(offsets, pa.array(np.arange(n), type=ids_type)),
        pa.ListArray.from_arrays(offsets, pa.array(np.arange(n), type=pa.int64())),
        pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(n, np.int64)), 1),
        pa.array(np.asarray(positions, np.int64)),
    ]
    schema = fields(ids_type)
    if not positions_column:
        arrays, schema = arrays[:-1], schema[:-1]
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(schema))


def stream(*batches, compression=None):
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, batches[0].schema, options=options) as writer:
        for one in batches:
            writer.write_batch(one)
    return bytearray(sink.getvalue().to_pybytes())


def header_span(payload):
    # The record batch message's header: after the schema message's 8-byte
    # prefix and header, and its own 8-byte prefix.
    schema_length = struct.unpack_from("<i", payload, 4)[0]
    start = 8 + schema_length + 8
    return start, start + struct.unpack_from("<i", payload, start - 4)[0]


def payload_for(attack, due):
    honest = batch(due)
    offsets = np.arange(len(due) + 1, dtype=np.int32).tobytes()
    if attack == "garbage":
        return bytearray(np.random.default_rng(0).bytes(512))
    if attack == "truncated":
        whole = stream(honest)
        return whole[: len(whole) // 2 // 8 * 8]
    if attack in ("backwards_offsets", "offsets_past_the_values"):
        bad = np.arange(len(due) + 1, dtype=np.int32)
        if attack == "backwards_offsets":
            bad[1], bad[2] = 2, 1
        else:
            bad[-1] = 1 << 30
        whole = stream(honest)
        at = bytes(whole).index(offsets)  # the "ids" column's offsets
        whole[at : at + len(offsets)] = bad.tobytes()
        return whole
    if attack == "other_slots":
        return stream(batch(due, ids_type=pa.int32()))
    if attack == "no_positions":
        return stream(batch(due, positions_column=False))
    if attack == "fewer_records":
        return stream(batch(due[:2]))
    if attack == "duplicated_positions":
        return stream(batch([due[0]] * len(due)))
    if attack == "records_for_another_rank":
        return stream(batch([p + 1 for p in due]))
    if attack == "lying_batch_length":
        # Only the batch's own length lies: Arrow's reader fails (an OSError).
        whole = stream(honest)
        start, end = header_span(whole)
        at = bytes(whole).index(struct.pack("<q", len(due)), start, end)
        whole[at : at + 8] = struct.pack("<q", len(due) + 1000)
        return whole
    if attack == "lying_lengths":
        # Every length in the header (the batch's, each column's) grows past its buffers.
        whole = stream(honest)
        start, end = header_span(whole)
        header = bytes(whole[start:end]).replace(
            struct.pack("<q", len(due)), struct.pack("<q", len(due) + 1000)
        )
        whole[start:end] = header
        return whole
    if attack == "two_batches":
        return stream(batch(due[:2]), batch(due[2:]))
    if attack == "nulls":
        arrays = list(honest.columns)
        arrays[1] = pa.ListArray.from_arrays(
            pa.array([0] + [None] + list(range(2, len(due) + 1)), pa.int32()),
            pa.array(np.arange(len(due)), type=pa.uint64()),
        )
        return stream(pa.RecordBatch.from_arrays(arrays, schema=honest.schema))
    if attack.startswith("compressed_"):
        return stream(honest, compression=attack.split("_")[1])
    raise ValueError(attack)


# What rank 1 announces in the first collective: records, seed, seed given,
# bytes, route (0: by permutation), first record without one uid (-1: none).
# A record of SMALL_SCHEMA takes at least 28 bytes.
ANNOUNCED = {
    "negative_count": [-5, SEED, 1, 2000, 0, -1],
    "huge_count": [1 << 31, SEED, 1, 2000, 0, -1],
    "huge_count_and_bytes": [1 << 31, SEED, 1, 28 << 31, 0, -1],
}
comm = TimedCollectives(dist, torch, None, 20.0, None)
for attack in attacks:
    announced = torch.tensor(
        ANNOUNCED.get(attack, [ATTACKER_RECORDS, SEED, 1, 2000, 0, -1]), dtype=torch.int64
    )
    counts = [torch.empty(6, dtype=torch.int64) for _ in range(2)]
    dist.all_gather(counts, announced)
    if attack in ANNOUNCED:
        continue  # rank 0 gives up after the counts
    honest_records = int(counts[0][0])
    total = honest_records + ATTACKER_RECORDS
    perm = np.random.default_rng(SEED).permutation(total)
    # What rank 0 expects from rank 1: even positions holding rank 1's records.
    due = [j for j in range(0, total, 2) if perm[j] >= honest_records]
    if attack == "huge_payload":
        incoming = torch.empty(2, dtype=torch.int64)
        dist.all_to_all_single(incoming, torch.tensor([1 << 40, 0], dtype=torch.int64))
        continue  # rank 0 refuses the size and allocates nothing
    if attack == "lying_payload_size":
        # It announces 64 bytes more than it then sends: gloo fills what came.
        payload = torch.from_numpy(np.frombuffer(stream(batch(due)), np.uint8))
        incoming = torch.empty(2, dtype=torch.int64)
        dist.all_to_all_single(incoming, torch.tensor([len(payload) + 64, 0]))
        dist.all_to_all_single(
            torch.empty(int(incoming.sum()), dtype=torch.uint8), payload,
            output_split_sizes=incoming.tolist(), input_split_sizes=[len(payload), 0],
        )
        continue
    payload = np.frombuffer(bytes(payload_for(attack, due)), np.uint8)
    comm.exchange(payload, [len(payload), 0], f"attack {attack}")
dist.destroy_process_group()
sys.exit(0)
"""


# With merge by line id: rank 1 lies about where its records go (by instance id).
BY_ID_ATTACKS = {
    "owner_out_of_range": "expected one rank below 2 per record",
    "owners_short": "rank 1 sent 5 bytes of ranks for its 6 records",
    "ids_for_another_rank": "its record 0 (position 12) hashes to rank 1",
}

BY_ID_JOB = r"""
import datetime, json, os, sys
sys.path.insert(0, os.path.join(sys.argv[2], "tests", "helpers"))
import numpy as np
import pyarrow as pa
import torch
import torch.distributed as dist
from support import SMALL_SCHEMA
from datafeed import InMemoryDataset
from datafeed.reorder import global_shuffle as gs
from datafeed.reorder.collectives import TimedCollectives
from datafeed.config.errors import GlobalShuffleError

out, attacks = sys.argv[1], json.loads(sys.argv[3])
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))

def load(name):
    ds = InMemoryDataset()
    ds.init(batch_size=4, use_var=SMALL_SCHEMA)
    ds.update_settings(parse_ins_id=True, merge_size=2)
    ds.set_filelist([os.path.join(out, name)])
    ds.load_into_memory()
    return ds

if rank == 0:
    outcome = {}
    for attack in attacks:
        try:
            load("honest.txt").global_shuffle(seed=7)
            outcome[attack] = {"accepted": True}
        except GlobalShuffleError as error:
            outcome[attack] = {"error": str(error), "peers": list(error.peers)}
        except Exception as error:
            outcome[attack] = {"other": f"{type(error).__name__}: {error}"}
    json.dump(outcome, open(os.path.join(out, "rank0.json"), "w"))
    sys.exit(0)

comm = TimedCollectives(dist, torch, None, 20.0, None)
for attack in attacks:
    store = load("attacker.txt")._store  # 6 records whose ids hash to rank 1
    announced = torch.tensor([store.rows, 7, 1, store.nbytes, 1, -1], dtype=torch.int64)
    table = [torch.empty(6, dtype=torch.int64) for _ in range(2)]
    dist.all_gather(table, announced)
    honest = int(table[0][0])
    owners = np.zeros(store.rows, np.uint8)  # "all of them go to rank 0"
    if attack == "owner_out_of_range":
        owners[3] = 7
    elif attack == "owners_short":
        owners = owners[:-1]
    comm.exchange(np.tile(owners, 2), [len(owners)] * 2, "owners")
    if attack != "ids_for_another_rank":
        continue  # rank 0 refuses the owners
    chunk = store.chunks[0]
    batch = gs._wire_batch(store.schema, chunk, np.arange(honest, honest + store.rows))
    sink = pa.BufferOutputStream()
    gs._write_stream(sink, batch)
    payload = np.frombuffer(sink.getvalue().to_pybytes(), np.uint8)
    comm.exchange(payload, [len(payload), 0], "records")
dist.destroy_process_group()
sys.exit(0)
"""


def _ins_id_lines(prefix: str, count: int, rank: int, world: int = 2) -> str:
    """``count`` lines of the small schema with instance ids that hash to ``rank``."""
    import numpy as np

    from datafeed.reorder.hashing import xxh64

    candidates = [f"{prefix}{i}".encode() for i in range(64 * count)]
    data = np.frombuffer(b"".join(candidates), np.uint8)
    owners = xxh64(data, np.cumsum([0] + [len(c) for c in candidates])) % np.uint64(world)
    chosen = [c.decode() for c, o in zip(candidates, owners.tolist(), strict=True) if o == rank]
    return "".join(f"1 {ins_id} {small_line(i)}" for i, ins_id in enumerate(chosen[:count]))


def _run(tmp_path: Path, attacks: list[str], timeout: float = 120.0,
         by_id: bool = False) -> tuple[dict, list[int], str]:
    script = tmp_path / "job.py"
    script.write_text(BY_ID_JOB if by_id else JOB)
    (tmp_path / "honest.txt").write_text(
        _ins_id_lines("h", HONEST_RECORDS, 0) if by_id
        else "".join(small_line(i) for i in range(HONEST_RECORDS))
    )
    (tmp_path / "attacker.txt").write_text(_ins_id_lines("a", 6, 1))
    with reserved_ports(1) as (port,):
        procs = []
        for rank in range(2):
            env = dict(
                os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo",
            )
            procs.append(subprocess.Popen(
                [sys.executable, str(script), str(tmp_path), str(REPO), json.dumps(attacks)],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            ))
        outputs = communicate_all(procs, timeout)
    log = "\n".join(outputs)
    path = tmp_path / "rank0.json"
    assert path.exists(), f"rank 0 wrote no result:\n{log}"
    return json.loads(path.read_text()), [p.returncode for p in procs], log


@pytest.mark.slow
@pytest.mark.distributed
def test_a_hostile_peer_is_refused_and_named(tmp_path: Path) -> None:
    outcome, returncodes, log = _run(tmp_path, list(ATTACKS))
    assert returncodes == [0, 0], log  # rank 0 survived every attack (no SIGSEGV: -11)
    for attack, says in ATTACKS.items():
        result = outcome[attack]
        assert "error" in result, f"{attack}: {result}"
        assert result["peers"] == [1], f"{attack}: {result}"
        assert "rank 1" in result["error"] and says in result["error"], f"{attack}: {result}"


@pytest.mark.slow
@pytest.mark.distributed
def test_a_peer_lying_about_instance_id_routing_is_refused(tmp_path: Path) -> None:
    outcome, returncodes, log = _run(tmp_path, list(BY_ID_ATTACKS), by_id=True)
    assert returncodes == [0, 0], log
    for attack, says in BY_ID_ATTACKS.items():
        result = outcome[attack]
        assert "error" in result, f"{attack}: {result}"
        assert result["peers"] == [1], f"{attack}: {result}"
        assert "rank 1" in result["error"] and says in result["error"], f"{attack}: {result}"


def test_the_attacker_header_patch_finds_the_lengths() -> None:
    """The lying-lengths attack edits only the record batch header: check the
    offsets it computes against Arrow's own framing."""
    import pyarrow as pa

    batch = pa.record_batch([pa.array([1, 2, 3])], names=["a"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    payload = sink.getvalue().to_pybytes()
    reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(payload))
    schema_message, batch_message = reader.read_next_message(), reader.read_next_message()
    schema_length = struct.unpack_from("<i", payload, 4)[0]
    start = 8 + schema_length + 8
    end = start + struct.unpack_from("<i", payload, start - 4)[0]
    assert schema_length == schema_message.metadata.size
    assert payload[start:end] == batch_message.metadata.to_pybytes()


# -- the checks, without a process group ------------------------------------------------


def _table(*rows: list[int]) -> np.ndarray:
    """What each rank announced: records, seed, seed given, bytes, route, first
    record without one uid."""
    return np.array(rows, dtype=np.int64)


HONEST = [12, SEED, 1, 12 * 40, 0, -1]


@pytest.mark.parametrize(
    "attacker, says",
    [
        ([1 << 31, SEED, 1, 2000, 0, -1],
         "rank 1 announced 2147483648 records in 2000 bytes; records of these slots take "
         "at least 28 bytes each (60129542144 bytes)"),
        ([1 << 31, SEED, 1, 28 << 31, 0, -1],
         "rank 1 announced 2147483648 records of 60129542144 bytes; shuffling the 2147483660 "
         "records of all ranks takes at least 47244640592 bytes on this rank (8 bytes per "
         "record for the permutation, and this rank's share of the records' bytes), more "
         "than the 8589934592 bytes of memory of this host"),
        ([3, SEED, 1, 1 << 62, 0, -1],
         "rank 1 announced 3 records of 4611686018427387904 bytes"),
        # A route beyond the slots (2 + the 4 slots of SMALL_SCHEMA), and first
        # bad uids outside -1 .. count - 1.
        ([12, SEED, 1, 12 * 40, 6, -1], "rank 1 announced 12 records of 480 bytes (seed "
         "flag 1, route 6, first bad uid -1); expected counts and sizes >= 0, a seed flag "
         "0 or 1, a route from 0 to 5 and a record number or -1"),
        ([12, SEED, 1, 12 * 40, 0, 12], "rank 1 announced 12 records of 480 bytes (seed "
         "flag 1, route 0, first bad uid 12)"),
        ([12, SEED, 1, 12 * 40, 0, -2], "rank 1 announced 12 records of 480 bytes (seed "
         "flag 1, route 0, first bad uid -2)"),
        # Another route than this rank's: by instance id against by permutation.
        ([12, SEED, 1, 12 * 40, 1, -1], "rank 0: global_shuffle sends records by one "
         "permutation here, otherwise on rank 1: by instance id (merge by line id)"),
    ],
)
def test_announcements_are_bounded_before_anything_is_allocated(attacker, says) -> None:
    from datafeed.config.errors import GlobalShuffleError
    from datafeed.config.slots import SlotSchema
    from datafeed.reorder import global_shuffle as gs

    schema = SlotSchema(SMALL_SCHEMA)
    gs._check_announced(_table(HONEST, HONEST), 0, schema, 8 << 30)  # an honest job passes
    with pytest.raises(GlobalShuffleError) as refused:
        gs._check_announced(_table(HONEST, attacker), 0, schema, 8 << 30)
    assert refused.value.peers == (1,)
    said = str(refused.value)
    assert said.startswith(says if says.startswith("rank 0") else
                           f"rank 0: global_shuffle: {says}"), said


def test_a_peer_sends_no_more_bytes_over_all_rounds_than_it_announced() -> None:
    """Each round's limit is what the peer has left of the bytes it announced
    (plus the framing of that round's records), not its whole announcement again."""
    from datafeed.reorder import global_shuffle as gs

    allowance = gs.PeerAllowance(slots=4, announced=[0, 1000])
    framing = gs.PeerAllowance(slots=4, announced=[0, 0]).limit(1, 10)
    assert allowance.limit(0, 0) == 0 and allowance.limit(1, 0) == 0
    assert allowance.limit(1, 10) == 1000 + framing
    allowance.received(1, 10, 700 + framing)  # 700 bytes of records in round 1
    assert allowance.limit(1, 10) == 300 + framing
    allowance.received(1, 10, 100)  # less than the framing allows: no record bytes used
    assert allowance.limit(1, 10) == 300 + framing


def _honest_payload(due: list[int]) -> bytearray:
    from datafeed.config.slots import SlotSchema
    from datafeed.parse.parsing import parse_bytes
    from datafeed.reorder import global_shuffle as gs

    schema = SlotSchema(SMALL_SCHEMA)
    text = "".join(small_line(i) for i in range(len(due))).encode()
    batch = gs._wire_batch(schema, parse_bytes(schema, text), np.asarray(due, np.int64))
    sink = pa.BufferOutputStream()
    gs._write_stream(sink, batch)
    return bytearray(sink.getvalue().to_pybytes())


def test_every_lying_length_in_a_payload_is_refused_naming_the_peer() -> None:
    """Every 4-byte word of an honest payload (message lengths, buffer offsets
    and lengths, node lengths) replaced by a lie: each result is accepted or a
    GlobalShuffleError naming the sender, never another error (before, dozens
    were a bare OSError from Arrow's reader)."""
    from datafeed.config.errors import GlobalShuffleError
    from datafeed.config.slots import SlotSchema
    from datafeed.reorder import global_shuffle as gs

    schema = SlotSchema(SMALL_SCHEMA)
    due = [0, 2, 6, 8, 10, 14]
    honest = _honest_payload(due)
    others = []
    for at in range(0, len(honest) - 3, 4):
        for lie in (-1, 7, 1 << 30, 0x7FFFFFFF, len(honest)):
            payload = bytearray(honest)
            struct.pack_into("<i", payload, at, lie)
            try:
                gs._decode(schema, np.frombuffer(bytes(payload), np.uint8), 1, 0, 2,
                           np.asarray(due, np.int64))
            except GlobalShuffleError as error:
                assert error.peers == (1,) and "from rank 1 is refused" in str(error)
            except Exception as error:  # noqa: BLE001 - any other kind is the failure
                others.append(f"word {at}: {lie}: {type(error).__name__}: {error}")
    assert not others, "\n".join(others[:10])


def test_bytes_after_the_end_of_a_payload_are_refused() -> None:
    """A peer that announces more bytes than its stream leaves the rest of the
    receive buffer unwritten: never taken as part of an accepted payload."""
    from datafeed.config.errors import GlobalShuffleError
    from datafeed.config.slots import SlotSchema
    from datafeed.reorder import global_shuffle as gs

    due = np.asarray([0, 2, 6], np.int64)
    payload = _honest_payload(due.tolist()) + bytes(64)
    with pytest.raises(GlobalShuffleError, match="64 bytes after the end of the stream"):
        gs._decode(SlotSchema(SMALL_SCHEMA), np.frombuffer(bytes(payload), np.uint8),
                   1, 0, 2, due)


def test_the_memory_limit_is_this_machines_or_less() -> None:
    import os

    from datafeed.records.memory import memory_limit_bytes

    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 0 < memory_limit_bytes() <= physical
