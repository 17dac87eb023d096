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
per reader task (datafeed/iterate/position.py).

This module turns the iteration-state objects into plain dicts and back, and
checks that a state fits the dataset it is loaded into; the datasets call it
with their values (it never reads a dataset).
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from ..config.errors import SchemaError, StateError
from ..config.slots import INS_ID, SlotSchema
from ..records.store import RecordStore
from ..reorder import collectives, global_shuffle, merge, shuffle
from ..reorder.shuffle import ShuffleHistory
from .position import Position, QueuePosition

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
_QUEUE_KEYS = (
    "version",
    "kind",
    "epoch",
    "batches_consumed",
    "batch_size",
    "drop_last",
    "filelist",
    "tasks",
    "delivered",
)
# Seeds a replayed shuffle accepts: numpy's generators take any int >= 0; the
# global shuffle exchanges its seed as an int64.
# A global shuffle that sent each record to the rank of its instance id (merge
# by line id on; a "merge" entry follows it).
GLOBAL_BY_INS_ID = "global_by_ins_id"
# A global shuffle that sent each record to the rank of its uid (shuffle by uid).
GLOBAL_BY_UID = "global_by_uid"
_GLOBAL = ("global", GLOBAL_BY_INS_ID, GLOBAL_BY_UID)
_SEED_LIMITS = {
    "local": 1 << 64, "slots": 1 << 64, "merge": 1 << 64, "global": 1 << 63,
    GLOBAL_BY_INS_ID: 1 << 63, GLOBAL_BY_UID: 1 << 63,
}
_SHAPES = {
    "local": "['local', seed]",
    "global": "['global', seed, world size]",
    GLOBAL_BY_INS_ID: f"['{GLOBAL_BY_INS_ID}', seed, world size]",
    GLOBAL_BY_UID: f"['{GLOBAL_BY_UID}', seed, world size, uid slot]",
    "slots": "['slots', seed, [slot names]]",
    "merge": "['merge', seed, merge size]",
}
# Shuffles after which the records in memory are not those loaded.
_RECOUNTING = (*_GLOBAL, "merge")
_WHERE = "load_state_dict()"
_QUEUE_WHERE = "QueueDataset.load_state_dict()"

# -- InMemoryDataset -------------------------------------------------------------------


def inmemory_state(
    position: Position,
    history: ShuffleHistory,
    *,
    records: int,
    batch_size: int,
    drop_last: bool,
    seed: int | None,
    cached_shuffles: int = 0,
) -> dict[str, Any]:
    """``InMemoryDataset.state_dict()``: plain ints, strings, bools and lists.

    Args:
        records: the records in memory now.
        seed: the ``seed`` setting.
        cached_shuffles: the shuffles the records had when the cache they
            were loaded from was saved (0: loaded from files).
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
        # And now: a global shuffle or a merge changes the count; the position
        # is checked against it before anything is replayed.
        "records_in_memory": records,
        "shuffles": [list(entry) for entry in history.entries],
        "cached_shuffles": cached_shuffles,
    }


def check_inmemory_state(state: Any) -> None:
    """Checks that ``state`` is an ``InMemoryDataset.state_dict()`` of this
    version: every key there, of its type and within its range.

    Raises:
        StateError: not a dict, keys missing, another version, or a value of
            the wrong type or out of range (the message names the key, what was
            expected and what was found).
    """
    _check_keys(state, _KEYS, _WHERE)
    _check_version(state, VERSION, _WHERE)
    for key in ("epoch", "batches_consumed", "records"):
        _check_int(state, key, 0, _WHERE)
    _check_int(state, "batch_size", 1, _WHERE)
    for key in ("epoch_started", "drop_last"):
        if not isinstance(state[key], bool):
            raise StateError(f"{_WHERE}: {key!r}: expected a bool, found {_shown(state[key])}")
    for key in ("seed", "last_shuffle_seed"):
        value = state[key]
        if value is not None and not (_is_int(value) and value >= 0):
            raise StateError(
                f"{_WHERE}: {key!r}: expected None or an int >= 0, found {_shown(value)}"
            )
    for key in ("records_in_memory", "cached_shuffles"):  # absent from earlier versions' states
        if key in state:
            _check_int(state, key, 0, _WHERE)
    shuffles = state["shuffles"]
    if not isinstance(shuffles, list):
        raise StateError(
            f"{_WHERE}: 'shuffles': expected a list of shuffles, found {_shown(shuffles)}"
        )
    for index, entry in enumerate(shuffles):
        _check_entry(index, entry)
    counter = state["shuffle_counter"]
    if not (_is_int(counter) and counter >= len(shuffles)):
        raise StateError(
            f"{_WHERE}: 'shuffle_counter': expected an int >= {len(shuffles)} (the shuffles "
            f"it lists), found {_shown(counter)}"
        )
    if state["batches_consumed"] and not state["epoch_started"]:
        raise StateError(
            f"{_WHERE}: 'batches_consumed': expected 0 when epoch_started is false, "
            f"found {_shown(state['batches_consumed'])}"
        )


def _check_entry(index: int, entry: Any) -> None:
    """Checks the form of ``shuffles[index]`` (``check_replay`` checks that
    what it names exists here)."""
    kind = entry[0] if isinstance(entry, list) and entry else None
    if not isinstance(kind, str) or kind not in _SHAPES:
        raise StateError(
            f"{_WHERE}: shuffles[{index}]: expected a shuffle kind "
            f"{', '.join(map(repr, _SHAPES))} first, found {_shown(entry)}"
        )
    last = entry[2] if len(entry) >= 3 else None
    if (
        len(entry) != (2 if kind == "local" else 4 if kind == GLOBAL_BY_UID else 3)
        or (kind == "slots" and not _is_names(last))
        or (kind == "merge" and not _is_int(last))
        or (kind == GLOBAL_BY_UID and not isinstance(entry[3], str))
    ):
        raise StateError(
            f"{_WHERE}: shuffles[{index}]: expected {_SHAPES[kind]}, found {_shown(entry)}"
        )
    seed, limit = entry[1], _SEED_LIMITS[kind]
    if not (_is_int(seed) and 0 <= seed < limit):
        raise StateError(
            f"{_WHERE}: shuffles[{index}]: expected the seed of {_SHAPES[kind]} an int from "
            f"0 to 2**{limit.bit_length() - 1}-1, found {_shown(seed)}"
        )
    if kind in _GLOBAL and not (_is_int(last) and last >= 1):
        raise StateError(
            f"{_WHERE}: shuffles[{index}]: expected the world size of {_SHAPES[kind]} an int "
            f">= 1, found {_shown(last)}"
        )


def check_inmemory_fit(
    state: dict[str, Any],
    *,
    records: int,
    shuffles_done: int,
    batch_size: int,
    drop_last: bool,
    schema: SlotSchema,
) -> None:
    """Checks that ``state`` (checked by ``check_inmemory_state``) can be loaded
    into a dataset holding ``records`` records of ``schema`` (the columns in
    memory), shuffled ``shuffles_done`` times since they were loaded: every
    shuffle it lists can be replayed here, and its position lies within the
    pass. The caller replays nothing before this returns.

    Raises:
        StateError: the dataset was shuffled already, or holds another number
            of records, or has another batch size or ``drop_last``; a shuffle
            cannot be replayed here; ``batches_consumed`` is beyond the pass.
    """
    if shuffles_done:
        raise StateError(
            f"{_WHERE}: this dataset was already shuffled {shuffles_done} times; "
            "call it right after load_into_memory(), before any shuffle"
        )
    if records != state["records"]:
        raise StateError(
            f"{_WHERE}: the state was taken with {_shown(state['records'])} records in "
            f"memory before its shuffles, this dataset holds {records}; load the same files"
        )
    here = {"batch_size": batch_size, "drop_last": drop_last}
    for key, value in here.items():
        if state[key] != value:
            raise StateError(
                f"{_WHERE}: the state was taken with {key}={_shown(state[key])}, this "
                f"dataset has {key}={value!r}; the position is counted in batches"
            )
    for entry in state["shuffles"]:
        check_replay(entry, schema)
    rows = _records_after_replay(state)
    if rows is None:
        return
    full, rest = divmod(rows, batch_size)
    batches = full + (1 if rest and not drop_last else 0)
    if state["batches_consumed"] > batches:
        raise StateError(
            f"{_WHERE}: 'batches_consumed': expected 0 to {batches} (batches per pass of "
            f"{rows} records, batch_size {batch_size}), found "
            f"{_shown(state['batches_consumed'])}"
        )


def _records_after_replay(state: dict[str, Any]) -> int | None:
    """The records in memory once the state's shuffles are replayed; None when
    a global shuffle or a merge changed them and the state (of an earlier
    version) does not say how many it left."""
    now = state.get("records_in_memory")
    if any(entry[0] in _RECOUNTING for entry in state["shuffles"]):
        return now
    if now is not None and now != state["records"]:
        raise StateError(
            f"{_WHERE}: 'records_in_memory': expected {_shown(state['records'])} (only a "
            f"global shuffle or a merge changes the records), found {_shown(now)}"
        )
    return state["records"]


def check_replay(entry: list[Any], schema: SlotSchema) -> None:
    """Checks that the shuffle ``entry`` (of a checked state) can be replayed on
    records of ``schema``.

    Raises:
        StateError: a global shuffle among another number of workers, a slots
            shuffle of slots this dataset lacks, or a merge by line id of
            records without their instance ids.
    """
    kind = entry[0]
    if kind in _GLOBAL:
        world = entry[2]
        if collectives.distributed_world() != world:
            raise StateError(
                f"{_WHERE}: the state replays a global shuffle among {_shown(world)} "
                f"workers; this process group has {collectives.distributed_world()} ranks "
                "(in a PS job, call fleet.worker_group() first, or use "
                "fleet.load_persistables(dirname, dataset=ds))"
            )
        if kind == GLOBAL_BY_UID:
            try:
                global_shuffle.check_route(schema, entry[3])
            except SchemaError as error:
                raise StateError(
                    f"{_WHERE}: the state replays a shuffle by the uid of slot "
                    f"{_shown(entry[3])}, which these records cannot take: {error}"
                ) from None
    elif kind == "slots":
        text = {field.name for field in getattr(schema, "text_fields", ())}
        names = {slot.name for slot in schema} - text
        missing = [n for n in entry[2] if n not in names]
        if missing:
            raise StateError(
                f"{_WHERE}: the state's slots_shuffle names slots {_shown(missing)} "
                "that this dataset does not declare"
            )
    elif kind == "merge":
        if INS_ID not in {slot.name for slot in schema}:
            raise StateError(
                f"{_WHERE}: the state replays a merge by line id; the records in memory "
                "carry no instance ids (load them with parse_ins_id=True)"
            )
    elif kind != "local":
        raise StateError(f"{_WHERE}: unknown shuffle {_shown(entry)} in the state")


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
        return shuffle.local_shuffle(store, seed)
    if kind == "merge":  # merge by line id: ("merge", seed, merge_size)
        return merge.merge_by_ins_id(store, int(entry[2]), seed)[0]
    if kind in _GLOBAL:
        shuffled, _ = global_shuffle.global_shuffle(
            store, seed, send_batch_size=send_batch_size, threads=threads,
            route_by=INS_ID if kind == GLOBAL_BY_INS_ID
            else entry[3] if kind == GLOBAL_BY_UID else None,
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
    with ``batch_size`` and ``drop_last``; checks all of it first.

    Raises:
        StateError: not a QueueDataset state of this version, taken with
            another file list, batch size or ``drop_last``, or a value of the
            wrong type or out of range.
    """
    if not isinstance(state, dict) or state.get("kind") != "QueueDataset":
        raise StateError(
            f"{_QUEUE_WHERE} takes a QueueDataset.state_dict(), got {_shown(state)}"
        )
    _check_keys(state, _QUEUE_KEYS, _QUEUE_WHERE)
    _check_version(state, QUEUE_VERSION, _QUEUE_WHERE)
    here = {"filelist": list(filelist), "batch_size": batch_size, "drop_last": drop_last}
    for key, value in here.items():
        if state[key] != value:
            raise StateError(
                f"{_QUEUE_WHERE}: the state was taken with {key}={_shown(state[key])}, "
                f"this dataset has {key}={_shown(value)}"
            )
    for key in ("epoch", "batches_consumed"):
        _check_int(state, key, 0, _QUEUE_WHERE)
    tasks, delivered = state["tasks"], state["delivered"]
    _check_tasks(tasks, len(filelist))
    if not isinstance(delivered, list) or len(delivered) != len(tasks):
        found = len(delivered) if isinstance(delivered, list) else _shown(delivered)
        raise StateError(
            f"{_QUEUE_WHERE}: 'delivered': expected {len(tasks)} counts (one per task), "
            f"found {found}"
        )
    for index, count in enumerate(delivered):
        if not (_is_int(count) and count >= 0):
            raise StateError(
                f"{_QUEUE_WHERE}: delivered[{index}]: expected an int >= 0, found "
                f"{_shown(count)}"
            )
    # Every batch but a pass's last is full: the records handed out fix the count.
    handed = sum(delivered)
    batches = -(-handed // batch_size)
    if state["batches_consumed"] != batches:
        raise StateError(
            f"{_QUEUE_WHERE}: 'batches_consumed': expected {batches} ({handed} records "
            f"handed out, batch_size {batch_size}), found {_shown(state['batches_consumed'])}"
        )
    position = QueuePosition()
    position.epoch = state["epoch"]
    position.batches = state["batches_consumed"]
    position.tasks = [list(t) for t in tasks]
    position.delivered = list(delivered)
    # Resumes only a pass that had handed records out: its plan must recur.
    position.resume_tasks = position.tasks if any(position.delivered) else None
    return position


def _check_tasks(tasks: Any, files: int) -> None:
    """Checks a QueueDataset state's reader plan: ``[file index, first byte,
    end byte or None]`` per task, over ``files`` files."""
    if not isinstance(tasks, list):
        raise StateError(
            f"{_QUEUE_WHERE}: 'tasks': expected a list of reader tasks, found {_shown(tasks)}"
        )
    for index, task in enumerate(tasks):
        if not (
            isinstance(task, list)
            and len(task) == 3
            and _is_int(task[0])
            and _is_int(task[1])
            and task[1] >= 0
            and (task[2] is None or (_is_int(task[2]) and task[2] >= task[1]))
        ):
            raise StateError(
                f"{_QUEUE_WHERE}: tasks[{index}]: expected [file index, first byte, end byte "
                f"or None], found {_shown(task)}"
            )
        if not 0 <= task[0] < files:
            raise StateError(
                f"{_QUEUE_WHERE}: tasks[{index}]: expected a file index 0 to {files - 1} "
                f"(the file list has {files} files), found {_shown(task[0])}"
            )


# -- the states saved beside a checkpoint ----------------------------------------------


def worker_states_file(states: list[Any], model: bytes | None = None) -> bytes:
    """What ``fleet.save_persistables(dataset=...)`` writes beside a checkpoint:
    ``{"workers": [state, ...]}``, and (``model``: the bytes of the model file
    saved beside it, a local checkpoint) their SHA-256, so that a load can tell
    positions left by another save (one that died between the two files)."""
    saved: dict[str, Any] = {"workers": states}
    if model is not None:
        saved["model_sha256"] = hashlib.sha256(model).hexdigest()
    return json.dumps(saved).encode()


def read_worker_states(path: str, model_path: str | None = None) -> list[Any]:
    """The per-worker dataset states in ``path`` (``worker_states_file``).
    Each state is checked when a dataset loads it.

    Raises:
        StateError: not such a JSON file, or (``model_path``: the model file
            beside it) the states were saved with another model.
    """
    try:
        with open(path, encoding="utf-8") as source:
            saved = json.load(source)
    except (ValueError, RecursionError) as error:  # JSONDecodeError, UnicodeDecodeError
        raise StateError(
            f"{path}: expected JSON written by save_persistables(dataset=...), found "
            f"{type(error).__name__}: {_bounded(str(error))}"
        ) from None
    if not isinstance(saved, dict) or "workers" not in saved:
        found = type(saved).__name__ if not isinstance(saved, dict) else _shown(saved)
        raise StateError(
            f'{path}: expected a JSON object {{"workers": [one state per worker]}}, '
            f"found {found}"
        )
    if not isinstance(saved["workers"], list):
        raise StateError(
            f"{path}: expected 'workers' a list of states, one per worker, found "
            f"{type(saved['workers']).__name__}"
        )
    wanted = saved.get("model_sha256")
    if wanted is not None and model_path is not None:
        with open(model_path, "rb") as model:
            found = hashlib.sha256(model.read()).hexdigest()
        if found != wanted:
            raise StateError(
                f"{path}: these positions were saved with another {model_path} (a save "
                "died between the two files): resuming would train records twice or "
                "skip them; resume from an earlier checkpoint"
            )
    return saved["workers"]


# -- checks ------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_names(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(n, str) for n in value)


def _check_keys(state: Any, keys: tuple[str, ...], where: str) -> None:
    if not isinstance(state, dict):
        raise StateError(
            f"{where}: expected a dict from state_dict(), found {type(state).__name__}"
        )
    missing = [k for k in keys if k not in state]
    if missing:
        raise StateError(
            f"{where}: the state lacks {', '.join(missing)}; not a dataset state_dict() "
            f"(found keys {_shown(sorted(map(str, state))[:20])})"
        )


def _check_version(state: dict[str, Any], version: int, where: str) -> None:
    if not _is_int(state["version"]) or state["version"] != version:
        raise StateError(
            f"{where}: 'version': expected {version}, found {_shown(state['version'])}"
        )


def _check_int(state: dict[str, Any], key: str, low: int, where: str) -> None:
    value = state[key]
    if not (_is_int(value) and value >= low):
        raise StateError(f"{where}: {key!r}: expected an int >= {low}, found {_shown(value)}")


def _bounded(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _shown(value: Any, depth: int = 0) -> str:
    """``repr(value)`` of bounded size: a hand-edited state may hold huge
    strings, lists or ints (an int's repr over 4,300 digits raises)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an int of {value.bit_length()} bits"
    if value is None or isinstance(value, (bool, int, float, str)):
        return _bounded(repr(value), 80)
    if isinstance(value, (list, tuple)) and len(value) <= 8 and depth < 2:
        return "[" + ", ".join(_shown(v, depth + 1) for v in value) + "]"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)} items"
    if isinstance(value, dict):
        return f"a dict with keys {_shown(sorted(map(str, value))[:8], depth + 1)}"
    return f"a {type(value).__name__}"
