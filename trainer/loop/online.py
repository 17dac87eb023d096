"""The parts of PaddleRec's online loop that decide what a pass is and what
the serving side is told: passes over time-sliced folders, the wait for a
slice's done file, and the done files that list each completed save.

Names and formats are those of Paddle's ``FleetUtil``
(``paddle.incubate.distributed.fleet.fleet_util``), which PaddleRec's online
trainer calls:

- ``online_pass_interval(days, hours, split_interval, split_per_pass,
  is_data_hourly_placed)``: a day's passes, each the list of its slices'
  folder names (``"HH"`` or ``"HHMM"``). Paddle expands ``days`` and ``hours``
  (``"{0..23}"``) with a shell; here they are parsed, never run.
- ``write_model_donefile``: appends ``day<TAB>xbox_base_key<TAB>model_path
  <TAB>pass_id<TAB>0`` to ``<output_path>/donefile.txt``, model_path being
  ``<output_path>/<day>/<pass_id>/`` (``/<day>/0/`` for pass -1, a base).
- ``write_xbox_donefile``: appends one JSON line per save for the serving side
  to ``xbox_patch_done.txt`` (a delta, ``<day>/delta-<pass>/``) or
  ``xbox_base_done.txt`` (pass -1, a base, ``<day>/base/``), with Paddle's
  keys (``id``, ``key``, ``input``, ``record_count``, ...).
- ``last_saved_model``: the last line of ``donefile.txt``, for a restart.
- ``next_base_key``: the key of a new base. A delta carries the key of the base
  it applies to, so each base takes a new one (PaddleRec: ``int(time.time())``
  at each base save).

Unlike Paddle, a done file is replaced whole or not at all (a new file, then
a rename: Paddle deletes the old one before uploading the new, so a crash
between the two loses every line; on HDFS, whose move also deletes first, the
new file waits complete beside it: ``fs.write_stream_atomically``), a save
already listed is never listed again (Paddle's xbox file also skips it; its
model file compares day and pass as numbers, as here), and only the caller
decides which worker writes: one process writes a done file at a time
(``FleetUtil``: worker 0), since a writer reads the file, adds its line and
replaces it.
"""

from __future__ import annotations

import datetime
import json
import logging
import posixpath
import re
import time
from collections import Counter, OrderedDict
from typing import Any
from urllib.parse import urlsplit, urlunsplit

__all__ = [
    "DONE_FILES",
    "DoneFileTimeout",
    "finish_done_files",
    "first_trained_day",
    "join",
    "last_saved_model",
    "next_base_key",
    "online_pass_interval",
    "read_schedule",
    "wait_for_done_file",
    "write_model_donefile",
    "write_schedule",
    "write_xbox_donefile",
]

log = logging.getLogger(__name__)

# The done files the online loop writes (FleetUtil's default names).
DONE_FILES = ("donefile.txt", "xbox_base_done.txt", "xbox_patch_done.txt")

# The online loop's passes of a day, as its first start had them (write_schedule).
SCHEDULE_FILE = "online_schedule.json"

# How often a wait for a slice says it is still waiting (and why, when a look failed).
WAIT_NOTE_SECONDS = 600.0

_RANGE = re.compile(r"^(?:(\d+)|\{(\d+)\.\.(\d+)\}|\{(\d+)\})$")


class DoneFileTimeout(TimeoutError):
    """A slice's done file did not appear within the timeout."""


def _expand(what: str, text: Any) -> list[int]:
    """``"7"``, ``"{7}"`` or ``"{0..23}"`` (Paddle's shell braces) as numbers."""
    match = _RANGE.match(str(text).strip())
    if match is None:
        raise ValueError(
            f"{what} must be a number, '{{N}}' or a range '{{A..B}}' (as Paddle's "
            f"online_pass_interval takes it), got {text!r}"
        )
    single, first, last, braced = match.groups()
    if single is not None or braced is not None:
        return [int(single if single is not None else braced)]
    if int(first) > int(last):
        raise ValueError(f"{what}: the range {text!r} runs backwards")
    return list(range(int(first), int(last) + 1))


def online_pass_interval(
    days: Any, hours: Any, split_interval: Any, split_per_pass: Any,
    is_data_hourly_placed: bool, strict: bool = False,
) -> list[list[str]]:
    """A day's passes: each the folder names of its ``split_per_pass`` slices of
    ``split_interval`` minutes, over ``hours`` (``"{0..23}"``); ``"HH"`` when
    the data is placed hourly, else ``"HHMM"``. Splits that do not fill a last
    pass are left out, as in Paddle, with a warning (``strict``: an error),
    as are the minutes of ``hours`` past the last whole split; so are hourly
    folders that two passes read (splits under an hour).

    Raises:
        ValueError: a malformed ``days`` or ``hours``, intervals below 1, or
            (``strict``) a slice of ``hours`` that no pass reads or two read.
    """
    _expand("days", days)  # checked as Paddle does; the passes are the same each day
    hour_list = _expand("hours", hours)
    if hour_list[0] < 0 or hour_list[-1] > 23:
        raise ValueError(f"hours must lie in 0..23, got {hours!r}")
    interval, per_pass = int(split_interval), int(split_per_pass)
    if interval < 1 or per_pass < 1:
        raise ValueError(
            f"split_interval (minutes) and split_per_pass must be >= 1, got "
            f"{split_interval!r} and {split_per_pass!r}"
        )
    # As Paddle: the hours' minutes // split_interval splits, from the first hour.
    count = (hour_list[-1] - hour_list[0] + 1) * 60 // interval
    splits = []
    for minute in range(hour_list[0] * 60, hour_list[0] * 60 + count * interval, interval):
        hour, rest = divmod(minute, 60)
        splits.append(f"{hour:02}" if is_data_hourly_placed else f"{hour:02}{rest:02}")
    passes = [splits[i : i + per_pass] for i in range(0, len(splits) - per_pass + 1, per_pass)]
    problems = []
    missed = _left_out(passes, hour_list, interval, is_data_hourly_placed)
    if missed is not None:  # Paddle leaves them out without a word
        problems.append(f"no pass of the day reads {missed}, so their records are never trained")
    # Hourly folders in splits under an hour: a pass reads a folder once,
    # but two passes naming it train its records twice.
    passes_of = Counter(split for one_pass in passes for split in dict.fromkeys(one_pass))
    twice = [split for split, count in passes_of.items() if count > 1]
    if is_data_hourly_placed and twice:
        problems.append(f"more than one pass reads the hourly folders {_listed(twice)}, so "
                        "their records are trained more than once")
    if problems:
        message = (f"hours={hours!r}, split_interval={split_interval}, split_per_pass="
                   f"{split_per_pass}: {'; '.join(problems)}")
        if strict:
            raise ValueError(
                f"{message}; choose a split_interval and split_per_pass that divide "
                "the hours into whole passes, each folder in one"
            )
        log.warning("%s (as in Paddle)", message)
    return passes


def _left_out(
    passes: list[list[str]], hour_list: list[int], interval: int, is_data_hourly_placed: bool
) -> str | None:
    """What of the hours no pass reads, in words (None: nothing): the hourly
    folders no split names, or the minutes no split covers (splits that fill
    no last pass, the end of a span that the interval does not divide)."""
    if is_data_hourly_placed:
        read = {int(split) for one_pass in passes for split in one_pass}
        missed = [f"{hour:02}" for hour in hour_list if hour not in read]
        return f"the hourly folders {_listed(missed)}" if missed else None
    covered = set()
    for one_pass in passes:
        for split in one_pass:
            start = int(split[:2]) * 60 + int(split[2:])
            covered.update(range(start, start + interval))
    runs: list[list[int]] = []  # [first, last] minutes of each stretch no split covers
    for minute in range(hour_list[0] * 60, (hour_list[-1] + 1) * 60):
        if minute in covered:
            continue
        if runs and runs[-1][1] == minute - 1:
            runs[-1][1] = minute
        else:
            runs.append([minute, minute])
    if not runs:
        return None
    stretches = [f"{a // 60:02}{a % 60:02}-{b // 60:02}{b % 60:02}" for a, b in runs]
    return f"the minutes {_listed(stretches)}"


def _listed(names: list[str], most: int = 4) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def wait_for_done_file(
    folder: str, done_file: str = "to.hadoop.done", poll_interval: float = 60.0,
    timeout: float | None = None, filesystem: Any = None,
) -> float:
    """Waits until ``folder/done_file`` exists (a slice is complete); returns the
    seconds waited. A filesystem error while looking (a remote store that did
    not answer) counts as "not there yet": the job goes on waiting. Every
    ``WAIT_NOTE_SECONDS`` it warns that it still waits (with the error, when
    the last look failed).

    Raises:
        DoneFileTimeout: it did not appear within ``timeout`` seconds (None: no limit).
    """
    from datafeed.source import fs  # pyarrow: not at import trainer

    path = join(folder, done_file)
    started = time.monotonic()
    last_error: OSError | None = None
    noted = 0.0
    while True:
        try:
            if fs.exists(path, filesystem):
                return time.monotonic() - started
        except OSError as error:
            last_error = error
        waited = time.monotonic() - started
        if waited - noted >= WAIT_NOTE_SECONDS:
            noted = waited
            # A warning: with Python's default logging an INFO line is never
            # seen, and a job idle for ten minutes is news to whoever runs it.
            log.warning(
                "still waiting for %s after %.0f s%s", path, waited,
                f"; the last look failed: {last_error}" if last_error is not None else "",
            )
        if timeout is not None and waited >= timeout:
            why = f"; the last look failed: {last_error}" if last_error is not None else ""
            raise DoneFileTimeout(
                f"the slice {folder} is not complete: {done_file} did not appear within "
                f"{timeout:g} s (polled every {poll_interval:g} s){why}"
            )
        time.sleep(min(poll_interval, timeout - waited) if timeout is not None else poll_interval)


def join(folder: str, name: str) -> str:
    """``folder/name`` for a local folder or a URI (whose query stays last)."""
    if "://" not in folder:
        return folder.rstrip("/") + "/" + name
    parts = urlsplit(folder)
    return urlunsplit(parts._replace(path=posixpath.join(parts.path or "/", name)))


def _read_lines(path: str) -> list[str]:
    from datafeed.source import fs

    content = fs.read_replaced(path)  # a replacement a crash cut short: the new lines
    if content is None:
        return []
    return [line for line in content.decode().split("\n") if line.strip()]


def _lines_to_update(path: str) -> list[str]:
    """``_read_lines`` for the one writer of ``path``, which first puts in place
    what a crash inside its last replacement left beside it."""
    from datafeed.source import fs

    fs.finish_replacement(path)
    return _read_lines(path)


def finish_done_files(output_path: str) -> None:
    """Puts in place each done file of ``output_path`` that a crash inside its
    replacement left beside it (``fs.finish_replacement``), for readers that
    look for the file itself; its writer calls it."""
    from datafeed.source import fs

    for name in DONE_FILES:
        fs.finish_replacement(output_path.rstrip("/") + "/" + name)


def _replace(path: str, lines: list[str]) -> None:
    """Writes ``lines`` as the file ``path``, whole or not at all."""
    from datafeed.source import fs

    content = "".join(line + "\n" for line in lines).encode()
    fs.write_stream_atomically(path, lambda out: out.write(content))


def write_model_donefile(
    output_path: str, day: Any, pass_id: Any, xbox_base_key: Any,
    donefile_name: str = "donefile.txt",
) -> bool:
    """Lists a completed model save in ``output_path/donefile_name`` (Paddle's
    line); returns False, writing nothing, when that day and pass are listed."""
    day, pass_id, key = str(day), str(pass_id), int(xbox_base_key)
    model_path = output_path.rstrip("/") + f"/{day}/{pass_id if pass_id != '-1' else 0}/"
    path = output_path.rstrip("/") + "/" + donefile_name
    lines = _lines_to_update(path)
    for line in lines:
        fields = line.split("\t")
        if len(fields) >= 4 and int(fields[0]) == int(day) and int(fields[3]) == int(pass_id):
            return False
    _replace(path, [*lines, f"{day}\t{key}\t{model_path}\t{pass_id}\t0"])
    return True


def write_xbox_donefile(
    output_path: str, day: Any, pass_id: Any, xbox_base_key: Any, data_path: Any,
    fs_name: str = "", worker_num: int = 1, donefile_name: str | None = None,
    record_count: int | None = None, job_id: str = "",
) -> bool:
    """Lists a completed save for the serving side (Paddle's xbox line); returns
    False, writing nothing, when the file already lists that save or a later one.

    ``record_count``: the rows saved (Paddle writes the placeholder "111111").
    """
    day, pass_id, key = str(day), str(pass_id), int(xbox_base_key)
    base = pass_id == "-1"
    model_path = output_path.rstrip("/") + (f"/{day}/base/" if base else f"/{day}/delta-{pass_id}/")
    name = donefile_name or ("xbox_base_done.txt" if base else "xbox_patch_done.txt")
    path = output_path.rstrip("/") + "/" + name
    lines = _lines_to_update(path)
    if lines:
        last = json.loads(lines[-1])["input"].split("/")
        last_day, last_pass = int(last[-3]), int(last[-2].split("-")[-1] if not base else -1)
        if (int(day), int(pass_id)) <= (last_day, last_pass):
            return False
    if model_path.startswith(("hdfs:", "afs:")):
        model_path = model_path[model_path.find(":") + 1 :]
    entry: OrderedDict[str, str] = OrderedDict()
    entry["id"] = str(key) if base else str(int(time.time()))
    entry["key"] = str(key)
    entry["input"] = fs_name + model_path.rstrip("/") + "/000"
    entry["record_count"] = str(record_count) if record_count is not None else "111111"
    entry["partition_type"] = "2"
    entry["job_name"] = "default_job_name"
    entry["ins_tag"] = "feasign"
    entry["ins_path"] = ",".join(data_path) if isinstance(data_path, list) else str(data_path)
    entry["job_id"] = job_id
    entry["monitor_data"] = ""
    entry["monitor_path"] = output_path.rstrip("/") + "/monitor/" + day + ".txt"
    entry["mpi_size"] = str(worker_num)
    _replace(path, [*lines, json.dumps(entry)])
    return True


def next_base_key(previous: int) -> int:
    """The ``xbox_base_key`` of a new base: the time in seconds, as PaddleRec
    takes it for each base, and above ``previous`` (the key the last deltas
    carried) when the clock has not moved past it."""
    return max(int(time.time()), int(previous) + 1)


def write_schedule(output_path: str, schedule: dict[str, Any]) -> None:
    """Records the online loop's passes of a day (``OnlineLoop``) in
    ``output_path/online_schedule.json``, for a restart to check."""
    _replace(output_path.rstrip("/") + "/" + SCHEDULE_FILE, [json.dumps(schedule)])


def read_schedule(output_path: str) -> dict[str, Any] | None:
    """What ``write_schedule`` recorded in ``output_path``; None: nothing."""
    lines = _read_lines(output_path.rstrip("/") + "/" + SCHEDULE_FILE)
    if not lines:
        return None
    schedule = json.loads(lines[0])  # a ValueError when it is not JSON
    if not isinstance(schedule, dict):
        raise TypeError(f"expected a JSON object, found {type(schedule).__name__}")
    return schedule


def first_trained_day(output_path: str, donefile_name: str = "donefile.txt") -> str | None:
    """The first day trained into the saves that ``donefile_name`` lists, as
    ``YYYYMMDD``: the day of the first one, or the day after it when that is a
    day's end (the online loop's untrained model, listed as the end of the
    day before its first); None when nothing is listed."""
    lines = _read_lines(output_path.rstrip("/") + "/" + donefile_name)
    if not lines:
        return None
    fields = lines[0].split("\t")
    day = fields[0]
    if len(fields) > 3 and fields[3].strip() == "-1":
        try:
            after = datetime.datetime.strptime(day, "%Y%m%d") + datetime.timedelta(days=1)
        except ValueError:
            return day  # the caller names what it found
        return after.strftime("%Y%m%d")
    return day


def last_saved_model(
    output_path: str, donefile_name: str = "donefile.txt"
) -> tuple[int, int, str, int]:
    """``(day, pass_id, model_path, xbox_base_key)`` of the last save that
    ``donefile_name`` lists; ``(-1, -1, "", -1)`` when none (Paddle's
    ``get_last_save_model``)."""
    lines = _read_lines(output_path.rstrip("/") + "/" + donefile_name)
    if not lines:
        return -1, -1, "", -1
    day, key, model_path, pass_id = lines[-1].split("\t")[:4]
    return int(day), int(pass_id), model_path, int(key)
