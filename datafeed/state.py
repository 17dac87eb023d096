"""The resumable state of the datasets: where iteration is, and (for an
``InMemoryDataset``) how the records in memory came to be in their order.

The order of the records is a function of the files loaded and the seeds of the
shuffles applied since (every shuffle is seeded), so the state stores the seeds,
not the records. A restarted job loads the same files, and ``load_state_dict``
replays the shuffles and resumes after the batches already consumed: it sees
exactly the records it had not yet seen in that epoch, in the same order as an
uninterrupted run, and later epochs' shuffles (seeds derived from the ``seed``
setting and the shuffle counter) continue the same sequence.

A ``QueueDataset`` has no order to restore: its state is the records handed out
per reader task (datafeed/position.py).

This module turns the iteration-state objects into plain dicts and back, and
checks that a state fits the dataset it is loaded into; the datasets call it
with their values (it never reads a dataset).
"""

from __future__ import annotations

import logging
from typing import Any

from . import collectives, global_shuffle, shuffle
from .position import Position, QueuePosition
from .shuffle import ShuffleHistory
from .slots import SlotSchema
from .store import RecordStore

logger = logging.getLogger("datafeed")

VERSION = 1
QUEUE_VERSION = 1
_KEYS = (
    "version",
    "epoch",
    "batches_consumed",
    "epoch_started",
    "batch_size",
    "drop_last",
    "seed",
    "shuffle_counter",
    "last_shuffle_seed",
    "records",
    "shuffles",
)

# -- InMemoryDataset -------------------------------------------------------------------


def inmemory_state(
    position: Position,
    history: ShuffleHistory,
    *,
    records: int,
    batch_size: int,
    drop_last: bool,
    seed: int | None,
) -> dict[str, Any]:
    """``InMemoryDataset.state_dict()``: plain ints, strings, bools and lists.

    Args:
        records: the records in memory now.
        seed: the ``seed`` setting.
    """
    return {
        "version": VERSION,
        "epoch": position.epoch,
        "batches_consumed": position.batches,
        "epoch_started": position.started,
        "batch_size": batch_size,
        "drop_last": drop_last,
        "seed": seed,
        "shuffle_counter": history.counter,
        "last_shuffle_seed": history.last_seed,
        # Records in memory before the first shuffle (the replay starts there).
        "records": history.records_before if history.entries else records,
        "shuffles": [list(entry) for entry in history.entries],
    }


def check_inmemory_state(state: Any) -> None:
    """Checks that ``state`` is an ``InMemoryDataset.state_dict()`` of this version.

    Raises:
        TypeError: not a dict.
        ValueError: keys missing, or another version.
    """
    if not isinstance(state, dict):
        raise TypeError(
            f"load_state_dict() takes a dict from state_dict(), got {type(state).__name__}"
        )
    missing = [k for k in _KEYS if k not in state]
    if missing:
        raise ValueError(
            f"load_state_dict(): the state lacks {', '.join(missing)}; not a dataset state_dict()"
        )
    if state["version"] != VERSION:
        raise ValueError(
            f"load_state_dict(): state version {state['version']!r}, expected {VERSION}"
        )


def check_inmemory_fit(
    state: dict[str, Any], *, records: int, shuffles_done: int, batch_size: int, drop_last: bool
) -> None:
    """Checks that ``state`` can be loaded into a dataset holding ``records``
    records, shuffled ``shuffles_done`` times since they were loaded.

    Raises:
        ValueError: the dataset was shuffled already, or holds another number
            of records, or has another batch size or ``drop_last``.
    """
    if shuffles_done:
        raise ValueError(
            f"load_state_dict(): this dataset was already shuffled {shuffles_done} times; "
            "call it right after load_into_memory(), before any shuffle"
        )
    if records != state["records"]:
        raise ValueError(
            f"load_state_dict(): the state was taken with {state['records']} records in "
            f"memory before its shuffles, this dataset holds {records}; load the same files"
        )
    here = {"batch_size": batch_size, "drop_last": drop_last}
    for key, value in here.items():
        if state[key] != value:
            raise ValueError(
                f"load_state_dict(): the state was taken with {key}={state[key]!r}, this "
                f"dataset has {key}={value!r}; the position is counted in batches"
            )


def check_replay(entry: list[Any], schema: SlotSchema) -> None:
    """Checks that the shuffle ``entry`` of a state can be replayed here.

    Raises:
        ValueError: an unknown shuffle, a global shuffle among another number of
            workers, or a slots shuffle of slots this dataset lacks.
    """
    kind = entry[0]
    if kind == "global":
        world = int(entry[2])
        if collectives.distributed_world() != world:
            raise ValueError(
                f"load_state_dict(): the state replays a global shuffle among {world} "
                f"workers; this process group has {collectives.distributed_world()} ranks "
                "(in a PS job, call fleet.worker_group() first, or use "
                "fleet.load_persistables(dirname, dataset=ds))"
            )
    elif kind == "slots":
        names = {slot.name for slot in schema}
        missing = [n for n in entry[2] if n not in names]
        if missing:
            raise ValueError(
                f"load_state_dict(): the state's slots_shuffle names slots {missing} "
                "that this dataset does not declare"
            )
    elif kind != "local":
        raise ValueError(f"load_state_dict(): unknown shuffle {entry!r} in the state")


def replay_shuffle(
    store: RecordStore,
    entry: list[Any],
    *,
    threads: int,
    send_batch_size: int,
) -> RecordStore:
    """The records of ``store`` in the order the shuffle ``entry`` gave them
    (checked by ``check_replay``). A global shuffle consumes ``store``'s chunks as
    it sends them; every worker must replay it together."""
    kind, seed = entry[0], int(entry[1])
    if kind == "local":
        return shuffle.local_shuffle(store, seed, threads)
    if kind == "global":
        shuffled, _ = global_shuffle.global_shuffle(
            store, seed, send_batch_size=send_batch_size, threads=threads
        )
        return shuffled
    names = {slot.name: i for i, slot in enumerate(store.schema)}
    permutation = shuffle.permutation(store.rows, seed)
    return store.permute_columns(sorted(names[n] for n in entry[2]), permutation)


def restored_history(state: dict[str, Any]) -> ShuffleHistory:
    """The shuffle history of a checked ``InMemoryDataset`` state."""
    history = ShuffleHistory()
    history.entries = [tuple(entry) for entry in state["shuffles"]]
    history.records_before = int(state["records"])
    history.counter = int(state["shuffle_counter"])
    history.last_seed = state["last_shuffle_seed"]
    return history


def restored_position(state: dict[str, Any]) -> Position:
    """The position of a checked ``InMemoryDataset`` state: the next pass skips
    the batches consumed when the state was taken mid-epoch."""
    position = Position()
    position.epoch = int(state["epoch"])
    position.batches = int(state["batches_consumed"])
    position.started = bool(state["epoch_started"])
    position.resume_batches = position.batches if position.started and position.batches else None
    return position


# -- QueueDataset ----------------------------------------------------------------------


def queue_state(
    position: QueuePosition, *, filelist: list[str], batch_size: int, drop_last: bool
) -> dict[str, Any]:
    """``QueueDataset.state_dict()``: plain ints, strings and lists."""
    return {
        "version": QUEUE_VERSION,
        "kind": "QueueDataset",
        "epoch": position.epoch,
        "batches_consumed": position.batches,
        "batch_size": batch_size,
        "drop_last": drop_last,
        "filelist": list(filelist),
        "tasks": [list(t) for t in position.tasks],
        "delivered": list(position.delivered),
    }


def restored_queue_position(
    state: Any, *, filelist: list[str], batch_size: int, drop_last: bool
) -> QueuePosition:
    """The position of a ``QueueDataset.state_dict()`` taken over ``filelist``
    with ``batch_size`` and ``drop_last``.

    Raises:
        ValueError: not a QueueDataset state of this version, or taken with
            another file list, batch size or ``drop_last``.
    """
    if not isinstance(state, dict) or state.get("kind") != "QueueDataset":
        raise ValueError(
            "QueueDataset.load_state_dict() takes a QueueDataset.state_dict(), got "
            f"{type(state).__name__} {str(state)[:80]!r}"
        )
    if state.get("version") != QUEUE_VERSION:
        raise ValueError(
            f"QueueDataset.load_state_dict(): state version {state.get('version')!r}, "
            f"expected {QUEUE_VERSION}"
        )
    here = {"filelist": list(filelist), "batch_size": batch_size, "drop_last": drop_last}
    for key, value in here.items():
        if state[key] != value:
            raise ValueError(
                f"QueueDataset.load_state_dict(): the state was taken with {key}="
                f"{state[key]!r}, this dataset has {key}={value!r}"
            )
    position = QueuePosition()
    position.epoch = int(state["epoch"])
    position.batches = int(state["batches_consumed"])
    position.tasks = [list(t) for t in state["tasks"]]
    position.delivered = [int(n) for n in state["delivered"]]
    # Resumes only a pass that had handed records out: its plan must recur.
    position.resume_tasks = position.tasks if any(position.delivered) else None
    return position
