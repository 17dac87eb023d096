"""The global shuffle: every worker's records redistributed over ``torch.distributed``.

The result is one seeded permutation of the records of all workers, cut into
per-worker shares. With ``total`` records over ``world`` workers, the records
are numbered by their global index (rank 0's records first, each worker's in its
order in memory); ``perm = default_rng(seed).permutation(total)`` puts record
``perm[j]`` at position ``j``; position ``j`` belongs to worker ``j % world``,
which holds it at local position ``j // world``. So:

- per-worker counts differ by at most one, and are known in advance;
- the outcome depends only on the seed, the inputs and the world size (never on
  chunk sizes, round sizes or timing), and each share arrives already shuffled;
- every receiver knows exactly which positions it must get, so a lost or
  duplicated record is detected, not guessed from counts.

Records travel as Arrow IPC streams (never pickle), each carrying its position in
an extra column, through ``all_to_all_single`` on byte tensors. A peer is not
trusted: what it announces is bounded before anything is allocated for it
(``_check_announced``: its bytes must hold its records, and the shuffle of
all the ranks' records must fit this host's memory; ``PeerAllowance``: over
all rounds a peer sends no more bytes than it announced), and every payload is
checked before its memory is used (``_decode``): the exact schema, one
uncompressed record batch that passes Arrow's full validation (offsets in order
and within bounds), and exactly the positions this rank expects from that peer
in that round; a refusal is a ``GlobalShuffleError`` naming the peer. Records go
in rounds of at least ``send_batch_size`` records per destination per sender and
about ``ROUND_BYTES``, so the memory in flight stays bounded; a sender releases
its records round by round, and a receiver keeps what arrives where it lies,
with the shuffled order (``RecordStore.order``), never copying it again
(``benchmarks/bench_global_shuffle.py`` measures throughput and peak memory
beside Paddle's; the checks add about 1 ms per 16 MB payload, within the
noise of a 2-core machine's throughput). Payloads
stay in host memory: over gloo, or over a gloo group made for the purpose when
the default group is NCCL. Every collective is waited for with a timeout; a
failure becomes a ``GlobalShuffleError`` that names this rank and, when the
rendezvous store can still tell, the ranks that stopped answering. While a
global shuffle runs in the main thread, SIGTERM is held back (for at most
``TERM_GRACE`` seconds of collectives, plus the peer probe of a failure) and
then delivered: a launcher that stops every rank when one dies (torchrun, so
``fleetrun --nproc_per_node``) still finds each survivor's error in its log.

With ``route_by=INS_ID`` (merge by line id on), records are not spread by the
permutation: each goes to rank ``XXH64(instance id, seed 0) % world``
(``datafeed.reorder.hashing``), where Paddle's global shuffle sends it, so the records
of one id meet on one rank for the merge. Every rank first sends every other
its records' destinations (one byte each for up to 256 ranks); from them each
receiver knows, as before, exactly which records (now labelled by their index
among all ranks' records) it must get from each peer in each round, and it
also checks that the instance ids it receives hash to it. A rank's share is
then in that global index order (the merge shuffles what it leaves); the
counts are as the ids fall, not balanced.

With ``route_by`` a uid slot (Paddle's ``_set_shuffle_by_uid``), records go the
same way, each to rank ``XXH64(uid) % world`` (the uid's 8 little-endian
bytes, ``datafeed.reorder.hashing.uid_ranks``), so that every record of one
user lands on one rank; a rank's share is then shuffled with the seed. A uid
slot must hold exactly one uint64 per record, as Paddle requires; a rank whose
records break that makes every rank fail, naming it, before anything is sent.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import pyarrow as pa

from ..config.errors import GlobalShuffleError, SchemaError
from ..config.slots import INS_ID, SlotSchema
from ..records.arrow import (
    chunk_from_record_batch,
    chunk_to_record_batch,
    schema_problem,
    stream_batch,
)
from ..records.columns import RecordChunk, SlotColumn
from ..records.memory import memory_limit_bytes, release_free_memory
from ..records.store import RecordStore
from .collectives import HeldTermination, TimedCollectives, host_group
from .hashing import ins_id_ranks, uid_problem, uid_ranks

logger = logging.getLogger("datafeed")

POSITION = "__fleetfeed_position"
# Bytes of records each sender sends in one round, at least: small rounds spend
# their time in per-round overhead (about 2x slower at 1024 records per
# destination on Criteo-sized records); this keeps the memory in flight bounded.
ROUND_BYTES = 16 << 20
DEFAULT_TIMEOUT = 300.0
_calls = 0  # global shuffles run by this process: keys each call's liveness probe


def global_shuffle(
    store: RecordStore,
    seed: int | None,
    *,
    send_batch_size: int = 1024,
    threads: int = 2,
    timeout: float | None = None,
    group: Any = None,
    route_by: str | None = None,
) -> tuple[RecordStore, int]:
    """Redistributes and shuffles the records of every rank of ``group``.

    Every rank of the group must call it (with the same seed, or with ``None``
    on every rank: then rank 0's fresh seed is used everywhere).

    Args:
        store: this rank's records; its chunks are released round by round.
        seed: the shuffle's seed, or ``None`` for one drawn by rank 0.
        send_batch_size: records per destination per sender in one round
            (Paddle's ``fleet_send_batch_size``); bounds the memory in flight.
        threads: threads for the local gathers.
        timeout: seconds each collective may take; default the group's own.
        group: a ``torch.distributed`` process group; default the default group.
        route_by: None to spread the records by one permutation; ``INS_ID``
            to send each record to the rank its instance id hashes to (merge
            by line id); or a uid slot's name, to send it where its uid hashes
            (shuffle by uid). See the module docstring. Every rank must pass
            the same value.

    Returns:
        This rank's new records (the chunks as they arrived, in an order:
        shuffled, or global index order when routed by instance id) and the
        seed used.

    Raises:
        GlobalShuffleError: a peer died or stalled, seeds disagree, records
            were lost, duplicated or malformed in transit, or a rank's uids
            are not one per record.
        SchemaError: ``route_by`` names a slot the records lack, or a uid slot
            that is not uint64.
    """
    check_route(store.schema, route_by)
    import torch
    import torch.distributed as dist

    global _calls
    _calls += 1
    with HeldTermination() as held:  # see TimedCollectives.run
        comm = TimedCollectives(dist, torch, host_group(dist, group), timeout, _calls, held)
        return _shuffle(comm, store, seed, send_batch_size, threads, route_by)


def check_route(schema: SlotSchema, route_by: str | None) -> None:
    """Raises ``SchemaError`` unless records of ``schema`` can be routed by
    ``route_by`` (see ``global_shuffle``)."""
    if route_by is None:
        return
    if route_by == INS_ID:
        if INS_ID not in schema.names:
            raise SchemaError(
                "global_shuffle by instance id (merge by line id) needs each record's "
                "instance id: set parse_ins_id=True and load the files again"
            )
        return
    if route_by not in schema.names:
        raise SchemaError(
            f"global_shuffle by uid: the uid slot {route_by!r} (_set_uid_slot) is not among "
            f"the dataset's slots {list(schema.names)}"
        )
    dtype = schema[schema.index(route_by)].dtype
    if str(dtype) != "uint64":
        raise SchemaError(
            f"global_shuffle by uid: the uid slot {route_by!r} is {dtype}; a uid is one "
            "uint64 per record (as Paddle requires)"
        )


def _route_code(schema: SlotSchema, route_by: str | None) -> int:
    """How records are routed, as every rank announces it: 0 by permutation,
    1 by instance id, 2 + i by the uid of slot i."""
    if route_by is None:
        return 0
    return 1 if route_by == INS_ID else 2 + schema.index(route_by)


def _route_ranks(column: SlotColumn, route_by: str, world: int) -> np.ndarray:
    return ins_id_ranks(column, world) if route_by == INS_ID else uid_ranks(column, world)


def _route_name(route_by: str) -> str:
    return "instance id" if route_by == INS_ID else f"uid (slot {route_by!r})"


def _shuffle(
    comm: TimedCollectives,
    store: RecordStore,
    seed: int | None,
    send_batch_size: int,
    threads: int,
    route_by: str | None,
) -> tuple[RecordStore, int]:
    import torch
    import torch.distributed as dist

    group = comm.group
    rank, world = comm.rank, comm.world
    started = time.perf_counter()
    # 1. Counts and seeds of every rank, in one collective.
    explicit = seed is not None
    bad_uid = -1
    if route_by is not None and route_by != INS_ID:  # told to every rank, as a count
        column, at = store.schema.index(route_by), 0
        for chunk in store.chunks:
            problem = uid_problem(chunk.columns[column], chunk.rows)
            if problem >= 0:
                bad_uid = at + problem
                break
            at += chunk.rows
        if bad_uid >= 0 and store.order is not None:  # its place in the store's order
            bad_uid = int(np.flatnonzero(store.order == bad_uid)[0])
    mine = torch.tensor(
        [
            store.rows,
            _fresh_seed() if seed is None else int(seed),
            int(explicit),
            store.nbytes,
            _route_code(store.schema, route_by),
            bad_uid,
        ],
        dtype=torch.int64,
    )
    gathered = [torch.empty(len(mine), dtype=torch.int64) for _ in range(world)]
    comm.run(
        lambda: dist.all_gather(gathered, mine, group=group, async_op=True),
        "exchanging counts",
    )
    table = torch.stack(gathered).numpy()
    _check_announced(table, rank, store.schema, memory_limit_bytes())
    _check_uids(table, rank, route_by)
    counts, seeds, given, nbytes = table[:, 0], table[:, 1], table[:, 2], table[:, 3]
    if given.any() and (not given.all() or len(set(seeds.tolist())) > 1):
        described = ", ".join(
            f"rank {r}: {int(s) if g else None}"
            for r, (s, g) in enumerate(zip(seeds, given, strict=True))
        )
        raise GlobalShuffleError(
            f"rank {rank}: global_shuffle needs the same seed on every rank (or None on "
            f"every rank), got {described}",
            rank=rank,
        )
    seed = int(seeds[0])
    total = int(counts.sum())
    first = int(counts[:rank].sum())
    local = int(counts[rank])
    logger.info(
        "global_shuffle on rank %d/%d: %d of %d records, seed %d",
        rank,
        world,
        local,
        total,
        seed,
    )
    # 2. Rounds: each sender sends ``send_batch_size * world`` of its records per
    # round, or about ROUND_BYTES of them when that is more.
    record_bytes = max(1, int(nbytes.sum()) // max(1, total))
    per_round = max(send_batch_size * world, ROUND_BYTES // record_bytes)
    rounds = max(1, -(-int(counts.max()) // per_round))
    schema = store.schema
    if route_by is not None:
        # 3. Each record goes to the rank of its instance id (or uid) and is
        # labelled by its global index; which labels each peer must send here in
        # each round.
        owners = _exchange_owners(comm, store, counts, route_by)
        positions = np.arange(first, first + local, dtype=np.int64)
        destinations = owners[first : first + local]
        expected, bounds = _expected_by_owner(owners, counts, rank, world, per_round, rounds)
        final = np.flatnonzero(owners == rank)
        del owners
    else:
        # 3. Where each local record goes: position j of the global permutation;
        # and which positions each peer must send here in each round.
        perm = np.random.default_rng(seed).permutation(total)
        mask = (perm >= first) & (perm < first + local)
        positions = np.empty(local, dtype=np.int64)
        where = np.flatnonzero(mask)
        positions[perm[where] - first] = where
        del mask, where
        expected, bounds = _expected_arrivals(perm, counts, rank, world, per_round, rounds)
        del perm
        destinations = positions % world
        final = None
    allowance = PeerAllowance(len(schema), nbytes.tolist())
    received: list[RecordChunk] = []
    received_positions: list[np.ndarray] = []
    # Records in chunk order go chunk by chunk, each released once sent;
    # records shuffled before (an order) are gathered round by round from a
    # store that holds their chunks until the last round.
    shuffled_before = None if store.order is None else RecordStore(
        schema, store.chunks, store.order
    )
    pending = list(store.chunks) if shuffled_before is None else []
    store.clear()  # the chunks now live in ``pending`` only, and go as they are sent
    for index in range(rounds):
        begin = min(index * per_round, local)
        end = min(begin + per_round, local)
        if shuffled_before is None:
            part, pending = _take_rows(pending, end - begin)
            source, rows = RecordStore(schema, part), np.arange(end - begin)
            del part
        else:
            source, rows = shuffled_before, np.arange(begin, end)
        payloads = _encode_round(
            schema,
            source,
            rows,
            positions[begin:end],
            destinations[begin:end],
            world,
            threads,
        )
        del source
        what = f"round {index + 1} of {rounds}"
        due = [expected[bounds[index * world + s] : bounds[index * world + s + 1]]
               for s in range(world)]
        limits = [allowance.limit(s, len(d)) for s, d in enumerate(due)]
        arrivals = dict(comm.exchange(*payloads, what, limits=limits))
        for source in range(world):
            if source not in arrivals and len(due[source]):
                raise GlobalShuffleError(
                    f"rank {rank}: global_shuffle {what}: rank {source} sent nothing, "
                    f"expected {len(due[source])} records",
                    rank=rank, peers=(source,),
                )
        for source, buffer in arrivals.items():
            allowance.received(source, len(due[source]), len(buffer))
            chunk, pos = _decode(schema, buffer, source, rank, world, due[source], route_by)
            received.append(chunk)
            received_positions.append(pos)
        del payloads, arrivals
        release_free_memory()  # the records sent: glibc keeps freed heap pages
    shuffled_before = None
    # 4. Exactly the expected positions arrived; order them (the local shuffle).
    arrived = (
        np.concatenate(received_positions)
        if received_positions
        else np.empty(0, np.int64)
    )
    expected = np.arange(rank, total, world, dtype=np.int64) if final is None else final
    order = np.argsort(arrived, kind="stable")
    if len(arrived) != len(expected) or not np.array_equal(arrived[order], expected):
        which = (
            f"positions {rank}, {rank + world}, ... of {total}" if final is None
            else f"of the {total} records, those whose {_route_name(route_by)}s hash to "
            f"rank {rank}"
        )
        raise GlobalShuffleError(
            f"rank {rank}: global_shuffle expected {len(expected)} records ({which}), "
            f"received {len(arrived)} with "
            f"{len(arrived) - len(np.unique(arrived))} duplicates; nothing was kept",
            rank=rank,
        )
    if route_by is not None and route_by != INS_ID:
        # By uid: this rank's share in a random order of its own (by instance id
        # it stays in global index order: the merge that follows shuffles it).
        order = order[np.random.default_rng([seed, rank]).permutation(len(order))]
    # The records stay where they arrived; the store's order is the shuffle.
    result = RecordStore(schema, received, order)
    del received, received_positions
    # 5. The global count, after.
    after = torch.tensor([result.rows], dtype=torch.int64)
    comm.run(
        lambda: dist.all_reduce(after, group=group, async_op=True), "checking the count"
    )
    if int(after.item()) != total:
        raise GlobalShuffleError(
            f"rank {rank}: global_shuffle started with {total} records over {world} ranks "
            f"and ended with {int(after.item())}",
            rank=rank,
        )
    logger.info(
        "global_shuffle on rank %d/%d done: %d records in %.2f s (seed %d)",
        rank,
        world,
        result.rows,
        time.perf_counter() - started,
        seed,
    )
    return result, seed



# Bytes per record this rank holds for every record of the job while it plans
# the shuffle: the permutation (or, by instance id, the owner of each record).
PLAN_BYTES_PER_RECORD = 8


def _check_announced(
    table: np.ndarray, rank: int, schema: SlotSchema, memory_limit: int | None
) -> None:
    """Every rank's announced count, bytes and flags must be possible, every
    rank must route the same way, and the shuffle they make must fit this
    host's ``memory_limit`` (bytes; None: unknown): all before anything is
    allocated from them (2**31 records would be a 16 GiB permutation)."""
    least = _least_record_bytes(schema)
    routes = 2 + len(schema)
    for source, (count, _seed, given, nbytes, route, bad_uid) in enumerate(table.tolist()):
        if (
            count < 0 or nbytes < 0 or given not in (0, 1) or not 0 <= route < routes
            or not -1 <= bad_uid < max(count, 0)
        ):
            raise GlobalShuffleError(
                f"rank {rank}: global_shuffle: rank {source} announced {count} records of "
                f"{nbytes} bytes (seed flag {given}, route {route}, first bad uid {bad_uid}); "
                f"expected counts and sizes >= 0, a seed flag 0 or 1, a route from 0 to "
                f"{routes - 1} and a record number or -1",
                rank=rank, peers=(source,),
            )
        if nbytes < count * least:  # an honest store holds at least this much
            raise GlobalShuffleError(
                f"rank {rank}: global_shuffle: rank {source} announced {count} records in "
                f"{nbytes} bytes; records of these slots take at least {least} bytes each "
                f"({count * least} bytes)",
                rank=rank, peers=(source,),
            )
    _check_plan_fits(table, rank, memory_limit)
    routes = table[:, 4]
    if (routes != routes[rank]).any():
        others = tuple(int(r) for r in np.flatnonzero(routes != routes[rank]))

        def described(route: int) -> str:
            if route == 0:
                return "by one permutation"
            if route == 1:
                return "by instance id (merge by line id)"
            return f"by the uid of slot {schema.names[route - 2]!r} (shuffle by uid)"

        theirs = "; ".join(f"rank {r}: {described(int(routes[r]))}" for r in others)
        raise GlobalShuffleError(
            f"rank {rank}: global_shuffle sends records {described(int(routes[rank]))} here, "
            f"otherwise on {theirs}; every rank needs the same merge_size / "
            "_set_merge_by_lineid and _set_uid_slot / _set_shuffle_by_uid settings",
            rank=rank, peers=others,
        )


def _check_uids(table: np.ndarray, rank: int, route_by: str | None) -> None:
    """Every rank fails, naming the ranks whose records do not hold one uid each."""
    bad = [(r, int(at)) for r, at in enumerate(table[:, 5].tolist()) if at >= 0]
    if route_by is None or route_by == INS_ID or not bad:
        return
    raise GlobalShuffleError(
        f"rank {rank}: global_shuffle by uid: the uid slot {route_by!r} must hold exactly "
        "one uint64 per record (as Paddle requires); "
        + "; ".join(f"rank {r}'s record {at} does not" for r, at in bad),
        rank=rank, peers=tuple(r for r, _ in bad if r != rank),
    )


def _check_plan_fits(table: np.ndarray, rank: int, memory_limit: int | None) -> None:
    """Refuses a shuffle this rank could not hold: the plan's bytes for every
    record of the job, plus this rank's share of the records (as every rank's
    share, at least on average). Names the rank whose announcement weighs most."""
    if memory_limit is None:
        return
    counts = [int(c) for c in table[:, 0]]
    sizes = [int(b) for b in table[:, 3]]
    world = len(counts)
    needed = PLAN_BYTES_PER_RECORD * sum(counts) + sum(sizes) // world
    if needed <= memory_limit:
        return
    weights = [PLAN_BYTES_PER_RECORD * c + b // world for c, b in zip(counts, sizes, strict=True)]
    heaviest = weights.index(max(weights))
    raise GlobalShuffleError(
        f"rank {rank}: global_shuffle: rank {heaviest} announced {counts[heaviest]} records "
        f"of {sizes[heaviest]} bytes; shuffling the {sum(counts)} records of all ranks takes "
        f"at least {needed} bytes on this rank ({PLAN_BYTES_PER_RECORD} bytes per record for "
        "the permutation, and this rank's share of the records' bytes), more than the "
        f"{memory_limit} bytes of memory of this host",
        rank=rank, peers=(heaviest,),
    )


def _least_record_bytes(schema: SlotSchema) -> int:
    """The fewest bytes one record of ``schema`` takes in a store: a dense slot
    its values; a sparse one an int32 offset, or (offset-free, one value per
    record) a single value when that is smaller (a one-byte text id)."""
    return sum(
        slot.width * slot.numpy_dtype.itemsize if slot.is_dense
        else min(4, slot.numpy_dtype.itemsize)
        for slot in schema
    )


def _exchange_owners(
    comm: TimedCollectives, store: RecordStore, counts: np.ndarray, route_by: str
) -> np.ndarray:
    """The rank each record of every rank goes to (by its instance id or uid),
    in global index order: every rank sends its own to every rank, and each
    peer's must be exactly one valid rank per record it announced."""
    rank, world = comm.rank, comm.world
    column = store.schema.index(route_by)
    dtype = np.uint8 if world <= 256 else np.int32
    mine = np.concatenate(
        [_route_ranks(chunk.columns[column], route_by, world) for chunk in store.chunks]
        or [np.empty(0, np.int64)]
    ).astype(dtype)
    if store.order is not None:  # in the store's order, as its records are numbered
        mine = mine[store.order]
    size = mine.nbytes
    send = np.tile(mine.view(np.uint8), world)
    itemsize = np.dtype(dtype).itemsize
    limits = [int(count) * itemsize for count in counts]
    arrivals = dict(comm.exchange(send, [size] * world, "sending the records' ranks",
                                  limits=limits))
    owners = np.empty(int(counts.sum()), dtype=np.int64)
    at = 0
    for source, count in enumerate(counts.tolist()):
        got = arrivals.get(source, np.empty(0, np.uint8))
        values = got.view(dtype) if len(got) == count * itemsize else None
        if values is None or (len(values) and int(values.max()) >= world) or (
            len(values) and int(values.min()) < 0
        ):
            raise GlobalShuffleError(
                f"rank {rank}: global_shuffle: rank {source} sent {len(got)} bytes of ranks "
                f"for its {count} records; expected one rank below {world} per record "
                f"({count * itemsize} bytes)",
                rank=rank, peers=(source,),
            )
        owners[at : at + count] = values
        at += count
    return owners


def _expected_by_owner(
    owners: np.ndarray, counts: np.ndarray, rank: int, world: int, per_round: int, rounds: int
) -> tuple[np.ndarray, np.ndarray]:
    """As ``_expected_arrivals``, when each record goes to ``owners[g]`` (its
    instance id's rank) labelled by its global index ``g``."""
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    records = np.flatnonzero(owners == rank)
    senders = np.searchsorted(starts, records, side="right") - 1
    keys = (records - starts[senders]) // per_round * world + senders
    order = np.argsort(keys, kind="stable")
    bounds = np.searchsorted(keys[order], np.arange(rounds * world + 1))
    return records[order], bounds


def _expected_arrivals(
    perm: np.ndarray, counts: np.ndarray, rank: int, world: int, per_round: int, rounds: int
) -> tuple[np.ndarray, np.ndarray]:
    """The positions this rank must receive, grouped by round and sender.

    Record ``perm[j]`` (the ``i``-th record of its sender) goes in that sender's
    round ``i // per_round``. Returns ``(positions, bounds)``: round ``k`` from
    rank ``s`` brings exactly ``positions[bounds[k * world + s] : bounds[k * world + s + 1]]``
    (ascending).
    """
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    records = perm[rank::world]  # position rank + k * world holds records[k]
    # A rank with no records shares its start with the next: side="right" skips it.
    senders = np.searchsorted(starts, records, side="right") - 1
    keys = (records - starts[senders]) // per_round * world + senders
    del senders
    groups = rounds * world
    # Few groups: a 16-bit key sorts by radix (3x faster than int64 at 1M records).
    small = np.uint16 if groups <= np.iinfo(np.uint16).max else np.int64
    keys = keys.astype(small)
    order = np.argsort(keys, kind="stable")
    bounds = np.searchsorted(keys[order], np.arange(groups + 1))
    del keys
    positions = order.astype(np.int64)
    positions *= world
    positions += rank
    return positions, bounds


class PeerAllowance:
    """The bytes each peer may still send here, from what it announced.

    A peer's payloads carry records of its own store, each once: over all
    rounds their record bytes are at most the store's bytes it announced.
    Each payload may add what is not records: positions, offsets and IPC
    framing (``framing``). A peer's round therefore may bring what it has
    left plus that round's framing, and no more, so that a peer cannot make
    this rank hold its announcement again in every round.
    """

    def __init__(self, slots: int, announced: list[int]) -> None:
        self.slots = slots
        self.left = [int(b) for b in announced]

    def framing(self, rows: int) -> int:
        """The most bytes beside the records' own in a payload of ``rows``
        records: 8 per record per slot (offsets) and for its position, and
        the schema and message headers."""
        return rows * 8 * (self.slots + 1) + 4096 * (self.slots + 2)

    def limit(self, source: int, rows: int) -> int:
        """The most bytes ``source`` may send in a round that brings ``rows`` records."""
        return 0 if rows == 0 else self.left[source] + self.framing(rows)

    def received(self, source: int, rows: int, size: int) -> None:
        """Counts a payload of ``size`` bytes and ``rows`` records from ``source``."""
        self.left[source] -= min(self.left[source], max(0, size - self.framing(rows)))


# -- the send side -------------------------------------------------------------------


def _take_rows(
    chunks: list[RecordChunk], rows: int
) -> tuple[list[RecordChunk], list[RecordChunk]]:
    """The first ``rows`` records of ``chunks`` (views), and the rest."""
    taken: list[RecordChunk] = []
    rest = list(chunks)
    while rows > 0:
        chunk = rest.pop(0)
        if chunk.rows <= rows:
            taken.append(chunk)
            rows -= chunk.rows
        else:
            taken.append(chunk.slice(0, rows))
            rest.insert(0, chunk.slice(rows, chunk.rows))
            rows = 0
    return taken, rest


def _encode_round(
    schema: SlotSchema,
    source: RecordStore,
    rows: np.ndarray,
    positions: np.ndarray,
    destinations: np.ndarray,
    world: int,
    threads: int,
) -> tuple[np.ndarray, list[int]]:
    """One Arrow IPC stream per destination rank, back to back in one buffer:
    the records at ``rows`` of ``source`` (store rows), with their ``positions``
    and ``destinations``.

    Returns the buffer and the bytes for each destination (0 for none). The
    streams are measured first and written into a buffer of the exact size: no
    growing buffers, no second copy to concatenate them.
    """
    if not len(positions):
        return np.empty(0, dtype=np.uint8), [0] * world
    order = np.argsort(destinations, kind="stable")
    grouped = source.take(rows[order], threads=threads).chunks[0]
    bounds = np.searchsorted(destinations[order], np.arange(world + 1))
    sorted_positions = positions[order]
    batches: list[pa.RecordBatch | None] = []
    sizes: list[int] = []
    for dest in range(world):
        lo, hi = int(bounds[dest]), int(bounds[dest + 1])
        if lo == hi:
            batches.append(None)
            sizes.append(0)
            continue
        batch = _wire_batch(schema, grouped.slice(lo, hi), sorted_positions[lo:hi])
        mock = pa.MockOutputStream()
        _write_stream(mock, batch)
        batches.append(batch)
        sizes.append(mock.size())
    send = np.empty(sum(sizes), dtype=np.uint8)
    sink = pa.FixedSizeBufferWriter(pa.py_buffer(send))
    for batch in batches:
        if batch is not None:
            _write_stream(sink, batch)
    return send, sizes


def _write_stream(sink: Any, batch: pa.RecordBatch) -> None:
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)


def _wire_batch(
    schema: SlotSchema, chunk: RecordChunk, positions: np.ndarray
) -> pa.RecordBatch:
    """The records as Arrow, with their positions in a last column.

    A sparse column whose records all hold ``width`` values (no offsets in the
    store, as Criteo's one-value slots) travels as ``fixed_size_list``: the
    offsets would add 4 bytes per record per slot to the wire and to memory.
    """
    batch = chunk_to_record_batch(schema, chunk, uniform_sparse=True)
    return batch.append_column(
        pa.field(POSITION, pa.int64(), nullable=False), pa.array(positions)
    )


def _check_wire_schema(schema: SlotSchema, got: pa.Schema) -> str | None:
    """What is wrong with a payload's schema, or None: the slots' columns (sparse
    slots may come as ``fixed_size_list``), then the int64 positions."""
    if len(got) != len(schema) + 1:
        return f"{len(got)} columns, expected {len(schema)} slots and the positions"
    problem = schema_problem(schema, got, uniform_sparse=True)
    if problem is not None:
        return problem
    for field in got:
        if pa.types.is_large_list(field.type) or field.nullable:
            return f"column {field.name!r} is {field}, expected a non-null list or fixed_size_list"
    last = got.field(len(schema))
    if last.name != POSITION or last.type != pa.int64():
        return (
            f"last column {last.name!r} of type {last.type}, expected int64 positions"
        )
    return None


# -- the receive side ----------------------------------------------------------------


def _decode(
    schema: SlotSchema,
    buffer: np.ndarray,
    source: int,
    rank: int,
    world: int,
    expected: np.ndarray,
    route_by: str | None = None,
) -> tuple[RecordChunk, np.ndarray]:
    """A payload from ``source`` as a chunk and its positions, checked before use.

    ``expected``: the positions (ascending) this rank must get in it; with
    ``route_by``, the global indices, and every record's instance id (or uid)
    must hash to this rank. Any refusal is a ``GlobalShuffleError`` that names ``source``
    (in ``peers``).
    """
    where = f"rank {rank}: global_shuffle payload from rank {source}"

    def refuse(problem: str) -> GlobalShuffleError:
        return GlobalShuffleError(f"{where} is refused: {problem}", rank=rank, peers=(source,))

    def wire_schema_problem(found: pa.Schema) -> str | None:
        problem = _check_wire_schema(schema, found)
        if problem is None:
            return None
        return f"it does not match the slots: {problem} (do all ranks declare the same use_var?)"

    try:
        batch = stream_batch(buffer, wire_schema_problem)
    except (ValueError, OSError, pa.ArrowException) as error:  # Arrow's own, to be sure
        raise refuse(str(error)) from None
    if batch.num_rows != len(expected):
        raise refuse(
            f"it holds {batch.num_rows} records, expected {len(expected)} (as the counts "
            "every rank announced place them)"
        )
    positions = batch.column(len(schema)).to_numpy()
    if route_by is None and (positions % world != rank).any():
        raise refuse("it holds records meant for other ranks")
    if not np.array_equal(np.sort(positions), expected):
        raise refuse(
            f"its {len(positions)} positions are not the ones this round expects from it "
            "(records lost or duplicated)"
        )
    try:
        # Read-only views (only gathered from); a column whose records all hold
        # the same number of values comes back offset-free, as the store keeps it.
        chunk = chunk_from_record_batch(schema, batch)
    except (ValueError, OSError, pa.ArrowException) as error:
        raise refuse(str(error)) from None
    if route_by is not None:
        column = chunk.columns[schema.index(route_by)]
        problem = -1 if route_by == INS_ID else uid_problem(column, batch.num_rows)
        if problem >= 0:
            raise refuse(f"its record {problem} does not hold exactly one uid in slot {route_by!r}")
        owners = _route_ranks(column, route_by, world)
        if (owners != rank).any():
            wrong = int(np.flatnonzero(owners != rank)[0])
            raise refuse(
                f"it holds records meant for other ranks: the {_route_name(route_by)} of its "
                f"record {wrong} (position {int(positions[wrong])}) hashes to rank "
                f"{int(owners[wrong])}"
            )
    return chunk, positions


def _fresh_seed() -> int:
    from .shuffle import fresh_seed

    return fresh_seed()
