"""The resumable state of an ``InMemoryDataset``: where iteration is, and how the
records in memory came to be in their order.

The order of the records is a function of the files loaded and the seeds of the
shuffles applied since (every shuffle is seeded), so the state stores the seeds,
not the records. A restarted job loads the same files, and ``load_state_dict``
replays the shuffles and resumes after the batches already consumed: it sees
exactly the records it had not yet seen in that epoch, in the same order as an
uninterrupted run, and later epochs' shuffles (seeds derived from the ``seed``
setting and the shuffle counter) continue the same sequence.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from . import shuffle

if TYPE_CHECKING:
    from .dataset import InMemoryDataset

logger = logging.getLogger("datafeed")

VERSION = 1
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


def dataset_state(ds: InMemoryDataset) -> dict[str, Any]:
    """``ds.state_dict()``: plain ints, strings, bools and lists."""
    rows = ds._store.rows if ds._store is not None else 0
    return {
        "version": VERSION,
        "epoch": ds._epoch,
        "batches_consumed": ds._batches,
        "epoch_started": ds._epoch_started,
        "batch_size": ds.batch_size,
        "drop_last": bool(ds._settings["drop_last"]),
        "seed": ds._settings["seed"],
        "shuffle_counter": ds._shuffles,
        "last_shuffle_seed": ds.last_shuffle_seed,
        # Records in memory before the first shuffle (the replay starts there).
        "records": ds._records_before_shuffles if ds._history else rows,
        "shuffles": [list(entry) for entry in ds._history],
    }


def load_dataset_state(ds: InMemoryDataset, state: dict[str, Any]) -> None:
    """``ds.load_state_dict(state)``: checks, replays the shuffles, sets the position."""
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
    store = ds._require_store("load_state_dict")
    if ds._history:
        raise ValueError(
            f"load_state_dict(): this dataset was already shuffled {len(ds._history)} times; "
            "call it right after load_into_memory(), before any shuffle"
        )
    if store.rows != state["records"]:
        raise ValueError(
            f"load_state_dict(): the state was taken with {state['records']} records in "
            f"memory before its shuffles, this dataset holds {store.rows}; load the same files"
        )
    here = {"batch_size": ds.batch_size, "drop_last": bool(ds._settings["drop_last"])}
    for key, value in here.items():
        if state[key] != value:
            raise ValueError(
                f"load_state_dict(): the state was taken with {key}={state[key]!r}, this "
                f"dataset has {key}={value!r}; the position is counted in batches"
            )
    if state["seed"] != ds._settings["seed"]:
        logger.warning(
            "load_state_dict(): the state's seed setting %r replaces this dataset's %r",
            state["seed"],
            ds._settings["seed"],
        )
        ds._settings.apply({"seed": state["seed"]}, where="load_state_dict")
    threads = ds._settings["thread_num"]
    for entry in state["shuffles"]:
        kind = entry[0]
        if kind == "local":
            ds._store = shuffle.local_shuffle(
                ds._require_store("load_state_dict"), int(entry[1]), threads
            )
        elif kind == "global":
            from . import global_shuffle as gs

            seed, world = int(entry[1]), int(entry[2])
            if gs.distributed_world() != world:
                raise ValueError(
                    f"load_state_dict(): the state replays a global shuffle among {world} "
                    f"workers; this process group has {gs.distributed_world()} ranks (in a PS "
                    "job, call fleet.worker_group() first, or use fleet.load_persistables("
                    "dirname, dataset=ds))"
                )
            current = ds._require_store("load_state_dict")
            ds._store = None
            ds._store, _ = gs.global_shuffle(
                current,
                seed,
                send_batch_size=ds._settings["fleet_send_batch_size"],
                threads=threads,
            )
        elif kind == "slots":
            current = ds._require_store("load_state_dict")
            names = {slot.name: i for i, slot in enumerate(ds.schema)}
            missing = [n for n in entry[2] if n not in names]
            if missing:
                raise ValueError(
                    f"load_state_dict(): the state's slots_shuffle names slots {missing} "
                    "that this dataset does not declare"
                )
            permutation = shuffle.permutation(current.rows, int(entry[1]))
            ds._store = current.permute_columns(
                sorted(names[n] for n in entry[2]), permutation
            )
        else:
            raise ValueError(
                f"load_state_dict(): unknown shuffle {entry!r} in the state"
            )
    ds._history = [tuple(entry) for entry in state["shuffles"]]
    ds._records_before_shuffles = int(state["records"])
    ds._shuffles = int(state["shuffle_counter"])
    ds.last_shuffle_seed = state["last_shuffle_seed"]
    ds._epoch = int(state["epoch"])
    ds._batches = int(state["batches_consumed"])
    ds._epoch_started = bool(state["epoch_started"])
    ds._resume_batches = ds._batches if ds._epoch_started and ds._batches else None
    logger.info(
        "load_state_dict: replayed %d shuffles; epoch %d, %d batches consumed",
        len(state["shuffles"]),
        ds._epoch,
        ds._batches,
    )
