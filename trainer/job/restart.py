"""Restarts of a whole job (``fleetrun --max_restarts K``): what fleetrun and the
fleet API tell each other, through environment variables and one small file.

fleetrun runs attempt 0, 1, ..., K of the job. Every process of an attempt gets:

- ``FLEETFEED_RESTART_COUNT``: the attempt's number (0 the first time), also as
  torchrun's ``TORCHELASTIC_RESTART_COUNT``; ``FLEETFEED_MAX_RESTARTS`` (and
  ``TORCHELASTIC_MAX_RESTARTS``): K;
- ``FLEETFEED_CHECKPOINT_RECORD``: a file where the first worker records each
  checkpoint that ``fleet.save_persistables(dirname, dataset=...)`` completed
  as a full save (``record_checkpoint``);
- ``FLEETFEED_RESUME_DIR``, on a restart after a checkpoint: the last recorded
  checkpoint. ``fleet.init_server()`` loads it, ``fleet.load_dataset_state(ds)``
  puts each worker's dataset where it was when the checkpoint was taken.

No cluster manager: fleetrun stops every process of a failed attempt before it
starts the next, with the same endpoints and the same job key.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from .errors import CheckpointError

__all__ = [
    "CHECKPOINT_RECORD_ENV",
    "MAX_RESTARTS_ENV",
    "RESTART_COUNT_ENV",
    "RESUME_DIR_ENV",
    "attempt_env",
    "read_record",
    "record_checkpoint",
    "restart_count",
    "resume_dir",
]

RESTART_COUNT_ENV = "FLEETFEED_RESTART_COUNT"
MAX_RESTARTS_ENV = "FLEETFEED_MAX_RESTARTS"
RESUME_DIR_ENV = "FLEETFEED_RESUME_DIR"
CHECKPOINT_RECORD_ENV = "FLEETFEED_CHECKPOINT_RECORD"
RECORD_FILE = "last_checkpoint.json"


def attempt_env(attempt: int, max_restarts: int, record: str, resume: str | None) -> dict[str, str]:
    """The variables fleetrun gives every process of attempt ``attempt``.

    Args:
        record: the file where the first worker records its checkpoints.
        resume: the checkpoint to resume from; None: start from the beginning.
    """
    env = {
        RESTART_COUNT_ENV: str(attempt),
        MAX_RESTARTS_ENV: str(max_restarts),
        "TORCHELASTIC_RESTART_COUNT": str(attempt),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        CHECKPOINT_RECORD_ENV: record,
    }
    if resume is not None:
        env[RESUME_DIR_ENV] = resume
    return env


def restart_count() -> int:
    """This attempt's number under ``fleetrun --max_restarts`` (0: the first, or
    no fleetrun restarts)."""
    value = os.environ.get(RESTART_COUNT_ENV, "0")
    return int(value) if value.isdigit() else 0


def resume_dir() -> str | None:
    """The checkpoint this attempt resumes from (``FLEETFEED_RESUME_DIR``), or None."""
    return os.environ.get(RESUME_DIR_ENV) or None


def record_checkpoint(dirname: str) -> None:
    """Records ``dirname`` (a full save holding the workers' dataset positions)
    as the job's last complete checkpoint, where fleetrun reads it before a
    restart (nothing without ``FLEETFEED_CHECKPOINT_RECORD``)."""
    path = os.environ.get(CHECKPOINT_RECORD_ENV)
    if not path:
        return
    entry = {
        "checkpoint": os.path.abspath(dirname), "attempt": restart_count(), "time": time.time()
    }
    # datafeed (and pyarrow) only when a record is written: import trainer stays light.
    from datafeed.source.fs import write_atomically

    write_atomically(path, json.dumps(entry).encode())


def read_record(path: str) -> dict[str, Any] | None:
    """The last checkpoint recorded in ``path`` (None: no checkpoint was recorded).

    Returns:
        ``{"checkpoint": directory, "attempt": n, "time": t}``.

    Raises:
        CheckpointError: the record is malformed, or its checkpoint has no
            ``meta.json`` any more.
    """
    try:
        with open(path, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        return None
    try:
        entry = json.loads(data)
    except (ValueError, RecursionError) as error:
        raise CheckpointError(
            f"{path}: expected the JSON record of a checkpoint, found {type(error).__name__}",
            path=path,
        ) from None
    if not (isinstance(entry, dict) and isinstance(entry.get("checkpoint"), str)):
        raise CheckpointError(
            f"{path}: expected an object with a 'checkpoint' directory, found {data[:200]!r}",
            path=path,
        )
    from ..ps.checkpoint.directory import restore_interrupted  # torch: not at import

    restore_interrupted(entry["checkpoint"])  # a job that died while replacing it
    meta = os.path.join(entry["checkpoint"], "meta.json")
    if not os.path.isfile(meta):
        raise CheckpointError(
            f"{path} records the checkpoint {entry['checkpoint']}, but {meta} does not exist "
            "and no copy set aside by an interrupted save (.<name>.tmp-*.old) was found "
            "beside it: it was removed",
            path=path,
        )
    return entry

