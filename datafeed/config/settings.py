"""Dataset settings: Paddle's names and defaults, plus fleetfeed's own, validated.

Paddle silently ignores an unknown setting; here it is a ``TypeError`` naming it,
and a bad value is a ``SchemaError`` that says what was expected.
"""

from __future__ import annotations

import os
from typing import Any

from .errors import SchemaError
from .slots import SlotSchema

# Paddle's DatasetBase.init arguments.
PADDLE_SETTINGS: dict[str, Any] = {
    "batch_size": 1,
    "thread_num": 1,
    "use_var": (),
    "pipe_command": "cat",
    "input_type": 0,
    "fs_name": "",
    "fs_ugi": "",
    "download_cmd": "cat",
}
# Settings fleetfeed adds.
FLEETFEED_SETTINGS: dict[str, Any] = {
    "drop_last": False,
    "seed": None,
    "on_bad_line": "raise",
    "progress": None,
    "max_line_bytes": 64 << 20,
    "read_timeout": None,
    # A generator class or instance run in worker processes instead of
    # pipe_command (datafeed/source/inprocess.py).
    "data_generator": None,
    # The filesystem of plain (non-URI) filelist entries: a pyarrow.fs or
    # fsspec filesystem (datafeed/source/fs.py). URIs name their own filesystem.
    "filesystem": None,
    # With fewer files than thread_num, read large local files as byte ranges,
    # each through its own reader (datafeed/source/ranges.py). None: only under
    # pipe_command "cat", whose lines fleetfeed's parser reads one by one; a
    # reader of its own may treat lines together (skip a header, group a
    # session), so it reads whole files, as Paddle does, unless True says it
    # treats each line on its own.
    "split_files": None,
}
# InMemoryDataset's extra settings in Paddle (init / update_settings /
# _init_distributed_settings), accepted so that Paddle scripts run unchanged.
INMEMORY_SETTINGS: dict[str, Any] = {
    "data_feed_type": "MultiSlotInMemoryDataFeed",
    "queue_num": None,
    "fleet_send_batch_size": 1024,
    "fleet_send_sleep_seconds": 0,
    # Merge by line id (Paddle's MergeByInsId, after global_shuffle): on with
    # merge_by_lineid; merge_size > 0 turns it on (and parse_ins_id) and keeps
    # only groups of exactly that many records.
    "merge_size": -1,
    "merge_by_lineid": False,
    "parse_ins_id": False,
    "parse_content": False,
    "fea_eval": False,
    "candidate_size": 10000,
    # fleetfeed's own, InMemoryDataset only: a cache file of the parsed
    # records (datafeed/records/cache.py).
    "cache": None,
    # In a job of several ranks, every rank yields the same number of batches
    # per pass (the fewest any rank has), so collective training never waits
    # on an uneven tail; the records left out are logged.
    "equal_batches": False,
}


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SchemaError(f"the {name!r} setting must be an int >= 1, got {value!r}")
    return value


_POSITIVE_INTS = ("batch_size", "max_line_bytes", "fleet_send_batch_size", "candidate_size")


def _is_number(value: Any, types: type | tuple[type, ...]) -> bool:
    return isinstance(value, types) and not isinstance(value, bool)


def _check(name: str, value: Any) -> Any:
    """Validates one setting; returns the value to store."""
    if name in _POSITIVE_INTS:
        return _positive_int(name, value)
    if name == "thread_num":
        # Paddle's plain attribute: 0 reads with one thread, and makes
        # train_from_dataset ask for its own thread= (as in Paddle).
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SchemaError(f"the 'thread_num' setting must be an int >= 0, got {value!r}")
        return value
    if name == "fleet_send_sleep_seconds":
        if not (_is_number(value, (int, float)) and value >= 0):
            raise SchemaError(
                f"the 'fleet_send_sleep_seconds' setting must be seconds >= 0, got {value!r}"
            )
        return value
    if name == "use_var":
        return SlotSchema(value)
    if name in ("pipe_command", "download_cmd", "fs_name", "fs_ugi", "data_feed_type"):
        if not isinstance(value, str):
            raise SchemaError(f"the {name!r} setting must be a str, got {value!r}")
        if name == "pipe_command" and not value.strip():
            raise SchemaError(
                "the 'pipe_command' setting must be a shell command, got an empty string"
            )
        return value
    if name == "input_type":
        if isinstance(value, bool) or value not in (0, 1):
            raise SchemaError(
                f"the 'input_type' setting must be 0 (one record per line) or 1 (one "
                f"batch per line), got {value!r}"
            )
        return value
    if name == "on_bad_line":
        if value not in ("raise", "skip"):
            raise SchemaError(f"the 'on_bad_line' setting must be 'raise' or 'skip', got {value!r}")
        return value
    if name == "read_timeout":
        if value is not None and not (_is_number(value, (int, float)) and value > 0):
            raise SchemaError(
                f"the 'read_timeout' setting must be None or seconds > 0, got {value!r}"
            )
        return value
    if name == "seed":
        if value is not None and not (_is_number(value, int) and value >= 0):
            raise SchemaError(f"the 'seed' setting must be None or an int >= 0, got {value!r}")
        return value
    if name in (
        "drop_last", "fea_eval", "equal_batches", "parse_ins_id", "parse_content",
        "merge_by_lineid",
    ):
        if not isinstance(value, bool):
            raise SchemaError(f"the {name!r} setting must be a bool, got {value!r}")
        return value
    if name in ("progress", "split_files"):
        if value is not None and not isinstance(value, bool):
            raise SchemaError(
                f"the {name!r} setting must be None, True or False, got {value!r}"
            )
        return value
    if name == "filesystem":
        from ..source.fs import as_filesystem  # imports pyarrow.fs only when set

        return as_filesystem(value)
    if name == "data_generator":
        from ..source.inprocess import check_generator  # imports generators only when set

        return check_generator(value)
    if name == "cache":
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise SchemaError(f"the 'cache' setting must be None or a file path, got {value!r}")
        return None if value is None else os.fspath(value)
    if name == "merge_size":
        if not _is_number(value, int):
            raise SchemaError(
                f"the 'merge_size' setting must be an int (> 0: merge by line id, "
                f"keeping groups of that many records), got {value!r}"
            )
        return value
    return value


class Settings:
    """A dataset's settings, by name; ``apply`` validates before changing anything."""

    def __init__(self, defaults: dict[str, Any]) -> None:
        self._defaults = dict(defaults)
        self._values = dict(defaults)
        self._values["use_var"] = SlotSchema(())

    def apply(self, updates: dict[str, Any], *, where: str) -> None:
        """Checks every one of ``updates``, then sets them all (none when one is bad).

        Raises:
            TypeError: an unknown setting, naming the method ``where`` it was given to.
            SchemaError: a setting with a bad value.
        """
        unknown = sorted(set(updates) - set(self._defaults))
        if unknown:
            raise TypeError(
                f"{where}() got unknown setting(s) {', '.join(map(repr, unknown))}; "
                f"known settings are {', '.join(sorted(self._defaults))}"
            )
        checked: dict[str, Any] = {}
        for name, value in updates.items():  # in order: a later setting wins
            checked[name] = _check(name, value)
            if name == "merge_size" and checked[name] > 0:
                # Paddle's _set_merge_by_lineid: merging needs the instance ids.
                checked["merge_by_lineid"] = True
                checked["parse_ins_id"] = True
        self._values.update(checked)

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def as_dict(self) -> dict[str, Any]:
        """A copy of every setting's value, by name."""
        return dict(self._values)
