"""Checkpoint files of a parameter-server (or local) model.

A checkpoint is a directory::

    meta.json                       format, kind (base or delta), tables (name, dim,
                                    seed, ...), dense shapes, server_num, save_id,
                                    state, after
    sparse.<table>.shard<i>.arrow   server i's rows of a table (Arrow IPC, ``table_files``
                                    of this package; a delta adds ``.dropped.arrow`` files)
    dense.shard<i>.pt               the dense parameters server i owns (``indices``,
                                    ``params``) and its optimizer's state_dict

A base holds every row; a delta the rows changed since the save it follows
(``after``: that save's ``state``, ``CheckpointState``) and the ids dropped
since; loading a base then its deltas in order gives the tables exactly. Dense
parameters are small: every checkpoint holds them all. Every ``.pt`` file holds
only tensors, numbers, strings and lists/dicts of them: ``torch.load(path,
weights_only=True)`` reads it. Checkpoints of format ``fleetfeed-ps/1`` (sparse
rows in ``.pt`` files, before the Arrow files) are refused with a
``CheckpointError`` that says so. The directory is written under a temporary
name and renamed into place once complete, so a reader never sees a
half-written checkpoint; every file is synced to disk before the rename, and
the rename after it, so a done file written later names a whole checkpoint even
after a power loss. A checkpoint saved again under its name is swapped with the
new one in one step where Linux offers it (``renameat2``); elsewhere it is
moved aside first, and a process that dies between the two renames leaves it
there for ``restore_interrupted`` (a restart's read of its record) to put
back. Shards are re-sharded on load: a checkpoint written by S servers loads
into any number of servers, or into a local model. Every file
names what it holds (row ids, parameter indices), so a loading process keeps
what it owns by ``trainer.ps.placement``, whatever the placement at save time.
Optimizer state moves with what it belongs to: a row's with the row; a dense
parameter's (Adagrad's sums, Adam's moments) with the parameter
(``dense_optimizer_state``), the hyper-parameters from the lowest shard.

Loading checks every file before anything changes: a malformed or hand-edited
file (truncated JSON, wrong types, lengths that disagree, another shape) is a
``CheckpointError`` naming the file, what was expected and what was found.
"""

from __future__ import annotations

import glob
import json
import logging
import mmap
import os
import re
import stat
import threading
import uuid
import zipfile
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import torch

from datafeed.source.fs import (
    SET_ASIDE,
    remove_abandoned,
    replace_directory,
    staging_directory,
    sync_directory,
    write_atomically,
)

from ...job.errors import CheckpointError
from ..tables.describe import describe_value

FORMAT = "fleetfeed-ps/2"
# The torch-file format of sparse rows before the Arrow files: refused, by name.
OLD_FORMATS = ("fleetfeed-ps/1",)
KINDS = ("base", "delta")

log = logging.getLogger(__name__)


def dense_file(dirname: str, shard: int) -> str:
    return os.path.join(dirname, f"dense.shard{shard}.pt")


def save_file(obj: Any, path: str) -> None:
    """``torch.save`` of ``obj`` to ``path``, whole or not at all
    (``write_atomically``): a save that fails leaves no temporary file behind."""
    write_atomically(path, lambda temporary: torch.save(obj, temporary))


def map_regular_file(path: str) -> pa.Buffer:
    """The bytes of the regular file ``path``, memory-mapped (a FIFO or a device
    is refused before it is read: reading one would block or never end).

    Raises:
        CheckpointError: not a regular file, or empty.
        OSError: it cannot be opened.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointError(f"{path}: expected a regular file, found another kind "
                                  f"(mode {info.st_mode:o})", path=path)
        if info.st_size == 0:
            raise CheckpointError(f"{path}: expected a checkpoint file, found an empty one",
                                  path=path)
        return pa.py_buffer(mmap.mmap(fd, 0, access=mmap.ACCESS_READ))
    finally:
        os.close(fd)


def _check_torch_archive(path: str) -> None:
    """``torch.save`` stores its entries uncompressed: an entry that is deflated,
    or larger than the file, would be inflated in memory before any check."""
    data = map_regular_file(path)
    size = data.size
    try:
        with zipfile.ZipFile(pa.BufferReader(data)) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as error:
        raise CheckpointError(
            f"{path}: expected a torch.save file of tensors (a zip archive), found "
            f"{type(error).__name__}: {first_line(error)}", path=path,
        ) from None
    for entry in entries:
        if entry.compress_type != zipfile.ZIP_STORED or entry.file_size > size:
            raise CheckpointError(
                f"{path}: expected torch.save's uncompressed entries, found {entry.filename!r:.80} "
                f"compressed (method {entry.compress_type}) or announcing {entry.file_size} bytes "
                f"in a file of {size}", path=path,
            )


def load_file(path: str) -> Any:
    """The tensors, numbers and strings in ``path`` (never other pickled objects).

    Raises:
        CheckpointError: not a ``torch.save`` file of such values (truncated,
            corrupt, compressed, or holding pickled objects that ``weights_only``
            refuses).
    """
    _check_torch_archive(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except OSError:
        raise
    except Exception as error:  # noqa: BLE001 - torch raises many kinds for a bad file
        raise CheckpointError(
            f"{path}: expected a torch.save file of tensors (read with weights_only=True), "
            f"found {type(error).__name__}: {first_line(error)}",
            path=path,
        ) from error


# The names of a checkpoint's files (and the workers' positions that
# fleet.save_persistables(dataset=) adds, trainer/fleet.py's DATASET_STATE_FILE).
_CHECKPOINT_FILE = re.compile(
    r"meta\.json|dataset_state\.json|dense\.shard\d+\.pt|sparse\..+\.shard\d+(\.dropped)?\.(arrow|pt)"
)


def check_replaceable(dirname: str, new_files: Sequence[str] = ()) -> None:
    """Raises unless a checkpoint may be saved to ``dirname``: absent, or a
    directory that holds nothing but a checkpoint's files (or ``new_files``,
    names the new checkpoint holds). A save replaces its directory whole, so
    anything else there (the user's own files, a local ``model.pt``, the
    folder a job runs in) would be deleted without a word.

    Raises:
        CheckpointError: ``dirname`` is a file, or holds other entries (named).
    """
    try:
        entries = list(os.scandir(dirname))
    except FileNotFoundError:
        return
    except NotADirectoryError:
        raise CheckpointError(
            f"{dirname}: expected a directory to save a checkpoint to, found a file", path=dirname
        ) from None
    foreign = sorted(
        entry.name + ("/" if entry.is_dir(follow_symlinks=False) else "")
        for entry in entries
        if entry.is_dir(follow_symlinks=False)
        or not (_CHECKPOINT_FILE.fullmatch(entry.name) or entry.name in new_files)
    )
    if foreign:
        shown = ", ".join(repr(name) for name in foreign[:5])
        more = f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        raise CheckpointError(
            f"{dirname}: a checkpoint replaces its directory whole, and this one holds "
            f"{len(foreign)} entr{'y' if len(foreign) == 1 else 'ies'} that a checkpoint "
            f"does not ({shown}{more}); save to a new or empty directory, or move them out",
            path=dirname,
        )


def staging_dir(dirname: str, new_files: Sequence[str] = ()) -> str:
    """A fresh temporary directory beside ``dirname`` to write a checkpoint into
    (``CheckpointError`` first when ``dirname`` may not be replaced:
    ``check_replaceable``, with the names of the extra files it will hold);
    what earlier saves of this process space (host, boot, pid namespace)
    whose processes are gone left beside it is removed (``remove_abandoned``)."""
    check_replaceable(dirname, new_files)
    # A save that died (a crash, a kill) left its staging directory, as large
    # as a checkpoint: a job that restarts and saves here again removes it.
    for path in remove_abandoned(dirname, complete_marker="meta.json"):
        log.warning("%s: removed %s, left by a save whose process is gone", dirname, path)
    return staging_directory(dirname)


def commit(staging: str, dirname: str, meta: dict[str, Any]) -> None:
    """Writes meta.json into ``staging`` and moves it to ``dirname`` (replacing
    it, if ``check_replaceable`` allows). Every file of the checkpoint is on
    disk before (its writers synced theirs; meta.json and the folder here),
    and the rename is after: a done file that lists it after a power loss
    finds it whole."""
    write_atomically(
        os.path.join(staging, "meta.json"),
        json.dumps(meta, indent=1, sort_keys=True).encode(),
    )
    sync_directory(staging)
    # Checked again: files may have appeared while the checkpoint was written.
    check_replaceable(dirname, os.listdir(staging))
    # A crash between replace_directory's two renames, where the system cannot
    # swap, leaves the old checkpoint aside for restore_interrupted.
    replace_directory(staging, dirname)


def restore_interrupted(dirname: str) -> bool:
    """Puts back the checkpoint that a replacement of ``dirname`` in two renames
    moved aside, when the process died between them (``commit``); the newest
    such when there are several. Returns whether one was put back."""
    if os.path.exists(dirname):
        return False
    parent, name = os.path.split(os.path.abspath(dirname))
    # Only a committed checkpoint is ever set aside: any such folder is whole.
    pattern = os.path.join(glob.escape(parent), f".{glob.escape(name)}.tmp-*{SET_ASIDE}")
    moved = [path for path in glob.glob(pattern) if os.path.isdir(path)]
    if not moved:
        return False
    newest = max(moved, key=lambda path: os.stat(path).st_mtime_ns)
    os.replace(newest, dirname)
    sync_directory(parent)
    log.warning("%s: put back the checkpoint that an interrupted replacement had moved "
                "to %s", dirname, newest)
    return True


def read_meta(dirname: str) -> dict[str, Any]:
    """The checked ``meta.json`` of the checkpoint in ``dirname``.

    Raises:
        FileNotFoundError: ``dirname`` has no ``meta.json``.
        CheckpointError: it is not JSON of this format: its ``dense`` shapes
            and ``tables`` (each with an int ``dim``) are checked.
    """
    path = os.path.join(dirname, "meta.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{dirname!r} is not a fleetfeed checkpoint: {path} is missing"
        )
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except (ValueError, RecursionError) as error:  # JSONDecodeError, UnicodeDecodeError
        raise CheckpointError(
            f"{path}: expected JSON of a fleetfeed checkpoint, found "
            f"{type(error).__name__}: {first_line(error)}",
            path=path,
        ) from None
    if not isinstance(meta, dict):
        raise CheckpointError(
            f"{path}: expected a JSON object with the checkpoint's tables and dense "
            f"shapes, found {type(meta).__name__}",
            path=path,
        )
    if meta.get("format") in OLD_FORMATS:
        raise CheckpointError(
            f"{path}: format {meta['format']!r} (sparse rows in torch .pt files) is no longer "
            f"read; this version reads {FORMAT!r} (Arrow table files): load it with the "
            "fleetfeed that wrote it and save it again, or retrain",
            path=path,
        )
    if meta.get("format") != FORMAT:
        raise CheckpointError(
            f"{path}: expected format {FORMAT!r}, found {describe_value(meta.get('format'))}",
            path=path,
        )
    for key in ("dense", "tables", "server_num", "kind"):
        if key not in meta:
            raise CheckpointError(
                f"{path}: expected the key {key!r}, found keys {describe_value(sorted(meta))}",
                path=path,
            )
    if meta["kind"] not in KINDS or not all(
        isinstance(meta.get(key), (str, type(None))) for key in ("after", "state", "save_id")
    ):
        raise CheckpointError(
            f"{path}: expected 'kind' base or delta, and 'after', 'state' and 'save_id' save "
            f"ids or null, found {describe_value(meta['kind'])}, "
            f"{describe_value(meta.get('after'))}, {describe_value(meta.get('state'))} and "
            f"{describe_value(meta.get('save_id'))}",
            path=path,
        )
    dense = meta["dense"]
    if not isinstance(dense, list):
        raise CheckpointError(
            f"{path}: 'dense': expected a list of shapes, found {describe_value(dense)}", path=path
        )
    for index, shape in enumerate(dense):
        if not (isinstance(shape, list) and all(_is_int(n) and n >= 0 for n in shape)):
            raise CheckpointError(
                f"{path}: 'dense'[{index}]: expected a shape (a list of ints >= 0), "
                f"found {describe_value(shape)}",
                path=path,
            )
    tables = meta["tables"]
    if not isinstance(tables, dict):
        raise CheckpointError(
            f"{path}: 'tables': expected an object of tables by name, "
            f"found {describe_value(tables)}",
            path=path,
        )
    for name, table in tables.items():
        dim = table.get("dim") if isinstance(table, dict) else None
        if not (_is_int(dim) and dim >= 1):
            raise CheckpointError(
                f"{path}: table {describe_value(name)}: expected 'dim' an int >= 1, "
                f"found {describe_value(dim)}",
                path=path,
            )
    if not (_is_int(meta["server_num"]) and meta["server_num"] >= 1):
        raise CheckpointError(
            f"{path}: 'server_num': expected an int >= 1, "
            f"found {describe_value(meta['server_num'])}",
            path=path,
        )
    return meta


def _dense_paths(dirname: str, meta: dict[str, Any]) -> list[str]:
    return shard_paths(dirname, "dense.shard", meta)


def shard_paths(dirname: str, prefix: str, meta: dict[str, Any], suffix: str = ".pt") -> list[str]:
    """``<prefix><i><suffix>`` for every server i of ``meta``'s server_num, in order.

    Raises:
        CheckpointError: a shard missing, or one beyond server_num (its rows
            would be lost or taken from another checkpoint without a word).
    """
    pattern = os.path.join(glob.escape(dirname), f"{glob.escape(prefix)}*{glob.escape(suffix)}")
    found: dict[int, str] = {}
    for path in glob.glob(pattern):
        number = os.path.basename(path)[len(prefix):-len(suffix)]
        if number.isdigit() and number.isascii():  # not another table's file
            found[int(number)] = path
    server_num = meta["server_num"]
    if len(found) != server_num or not all(i in found for i in range(server_num)):
        raise CheckpointError(
            f"checkpoint {dirname!r}: expected the files {prefix}0{suffix} to "
            f"{prefix}{server_num - 1}{suffix} (meta.json: server_num {server_num}), found "
            f"{describe_value(sorted(os.path.basename(p) for p in found.values()))}",
            path=dirname,
        )
    return [found[i] for i in range(server_num)]


def dense_values(dirname: str, meta: dict[str, Any] | None = None) -> dict[int, torch.Tensor]:
    """Every saved dense parameter, by index, each checked against the shapes
    of ``meta`` (read from ``dirname`` when not given).

    Raises:
        CheckpointError: a dense shard file is malformed, disagrees with
            ``meta.json``, or a parameter is in none or in two of them.
    """
    if meta is None:
        meta = read_meta(dirname)
    shapes = [list(s) for s in meta["dense"]]
    out: dict[int, torch.Tensor] = {}
    found_in: dict[int, str] = {}
    for path in _dense_paths(dirname, meta):
        shard = load_file(path)
        for index, value in _dense_entries(shard, path, shapes):
            if index in found_in:
                raise CheckpointError(
                    f"{path}: dense parameter {index}: expected in one dense shard, found "
                    f"also in {found_in[index]}",
                    path=path,
                )
            found_in[index] = path
            out[index] = value
    for index, shape in enumerate(shapes):
        if index not in out:
            raise CheckpointError(
                f"checkpoint {dirname!r}: dense parameter {index} (of shape {shape}) is in no "
                "dense.shard*.pt file",
                path=dirname,
            )
    return out


def _dense_entries(
    shard: Any, path: str, shapes: list[list[int]]
) -> list[tuple[int, torch.Tensor]]:
    """The (index, tensor) pairs of a dense shard file, checked."""
    for key in ("indices", "params"):
        if not isinstance(shard, dict) or key not in shard:
            found = (
                f"keys {describe_value(sorted(map(str, shard)))}" if isinstance(shard, dict)
                else type(shard).__name__
            )
            raise CheckpointError(f"{path}: expected the key {key!r}, found {found}", path=path)
    indices, params = shard["indices"], shard["params"]
    if not (
        isinstance(indices, torch.Tensor) and indices.dtype == torch.int64 and indices.dim() == 1
    ):
        raise CheckpointError(
            f"{path}: 'indices': expected a 1-D int64 tensor, found {describe_value(indices)}",
            path=path,
        )
    if not (isinstance(params, list) and all(isinstance(p, torch.Tensor) for p in params)):
        raise CheckpointError(
            f"{path}: 'params': expected a list of tensors, found {describe_value(params)}",
            path=path,
        )
    if len(params) != len(indices):
        raise CheckpointError(
            f"{path}: expected as many params as indices ({len(indices)}), found {len(params)}",
            path=path,
        )
    entries = []
    for index, value in zip(indices.tolist(), params, strict=True):
        if not 0 <= index < len(shapes):
            raise CheckpointError(
                f"{path}: 'indices': expected ints 0 to {len(shapes) - 1} (the dense "
                f"parameters in meta.json), found {index}",
                path=path,
            )
        if list(value.shape) != shapes[index] or not value.is_floating_point():
            raise CheckpointError(
                f"{path}: dense parameter {index}: expected shape {shapes[index]} (meta.json) "
                f"of floats, found {list(value.shape)} of {value.dtype}",
                path=path,
            )
        entries.append((index, value))
    return entries


def dense_optimizer_state(
    dirname: str, meta: dict[str, Any], optimizer: torch.optim.Optimizer, *, who: str
) -> dict[str, Any] | None:
    """The dense optimizer's saved state, re-sharded for ``optimizer``: each
    parameter's state (Adagrad's sums, Adam's moments, ...) from the dense shard
    that holds the parameter, the hyper-parameters from the lowest-numbered shard.
    A ``state_dict`` for ``optimizer.load_state_dict``, checked so that loading it
    cannot fail; a parameter with no saved state keeps the state it has.

    None, logged at WARNING with ``who`` (the loading process), where there is
    nothing to restore: a shard saved none (GEO servers run no optimizer), or the
    state is another optimizer's (other hyper-parameter names, other groups).

    Raises:
        CheckpointError: a saved state of the wrong form: not a state_dict, a
            parameter number out of range, a tensor of another shape.
    """
    shapes = [list(s) for s in meta["dense"]]
    merged: dict[int, Any] = {}
    groups: list[dict[str, Any]] | None = None
    for path in _dense_paths(dirname, meta):
        shard = load_file(path)
        saved = shard.get("optimizer") if isinstance(shard, dict) else None
        if saved is None:
            log.warning("%s: %s holds no dense optimizer state; none restored", who, path)
            return None
        state, saved_groups = _checked_optimizer_state(saved, path, shapes)
        mismatch = _groups_mismatch(saved_groups, optimizer.param_groups)
        if mismatch:
            log.warning(
                "%s: dense optimizer state not restored: %s is another optimizer's (%s)",
                who, path, mismatch,
            )
            return None
        if groups is None:
            groups = saved_groups
        for index, _ in _dense_entries(shard, path, shapes):
            if index in state:
                merged[index] = state[index]
    if groups is None:
        return None
    current = optimizer.state_dict()["state"]
    for index, value in current.items():
        merged.setdefault(index, value)
    return {"state": merged, "param_groups": groups}


def _checked_optimizer_state(
    saved: Any, path: str, shapes: list[list[int]]
) -> tuple[dict[int, dict[str, Any]], list[dict[str, Any]]]:
    """The (state, param_groups) of a saved ``optimizer.state_dict()``, checked:
    groups numbering the parameters 0..n-1 in order, per-parameter state of
    numbers and tensors of the parameter's shape (or of one element)."""

    def refuse(message: str) -> CheckpointError:
        return CheckpointError(f"{path}: 'optimizer': {message}", path=path)

    if not (isinstance(saved, dict) and isinstance(saved.get("state"), dict)
            and isinstance(saved.get("param_groups"), list)):
        raise refuse("expected a state_dict with 'state' and 'param_groups', "
                     f"found {describe_value(saved)}")
    groups = saved["param_groups"]
    numbered: list[Any] = []
    for group in groups:
        if not (isinstance(group, dict) and isinstance(group.get("params"), list)):
            raise refuse("expected param_groups of dicts with 'params', "
                         f"found {describe_value(group)}")
        numbered += group["params"]
    if numbered != list(range(len(shapes))):
        raise refuse(
            f"expected param_groups numbering the {len(shapes)} dense parameters 0 to "
            f"{len(shapes) - 1} in order, found {describe_value(numbered)}"
        )
    state = saved["state"]
    for index, values in state.items():
        if not (_is_int(index) and 0 <= index < len(shapes)):
            raise refuse(f"'state': expected parameter numbers 0 to {len(shapes) - 1}, "
                         f"found {describe_value(index)}")
        if not isinstance(values, dict):
            raise refuse(f"'state'[{index}]: expected a dict, found {describe_value(values)}")
        for key, value in values.items():
            fits = value is None or isinstance(value, (int, float)) or (
                isinstance(value, torch.Tensor)
                and (list(value.shape) == shapes[index] or value.numel() <= 1)
            )
            if not (isinstance(key, str) and fits):
                raise refuse(
                    f"'state'[{index}][{describe_value(key)}]: expected a number or a tensor "
                    f"of the parameter's shape {shapes[index]}, found {describe_value(value)}"
                )
    return state, groups


def _groups_mismatch(saved: list[dict[str, Any]], groups: list[dict[str, Any]]) -> str:
    """Why ``saved`` param_groups are not those of ``groups`` ('' where they are)."""
    if len(saved) != len(groups):
        return f"{len(saved)} parameter groups, the optimizer has {len(groups)}"
    for number, (old, new) in enumerate(zip(saved, groups, strict=True)):
        if len(old["params"]) != len(new["params"]):
            return (f"group {number} has {len(old['params'])} parameters, the optimizer's "
                    f"{len(new['params'])}")
        if set(old) != set(new):
            return (f"group {number} has the settings {sorted(map(str, old))}, the "
                    f"optimizer's {sorted(new)}")
    return ""


def check_dense_shapes(meta: dict[str, Any], params: Sequence[torch.Tensor], dirname: str) -> None:
    """Checks that the checked ``meta`` lists the shapes of ``params``, in order.

    Raises:
        CheckpointError: another count or shape (before any is loaded).
    """
    saved = [tuple(s) for s in meta["dense"]]
    have = [tuple(p.shape) for p in params]
    if saved != have:
        raise CheckpointError(
            f"checkpoint {dirname!r} holds {len(saved)} dense parameters of shapes {saved}; "
            f"the model has {len(have)} of shapes {have} (in its optimizer's order)",
            path=dirname,
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message, at most 200 characters."""
    text = str(error).strip().splitlines()
    line = text[0] if text else ""
    return line if len(line) <= 200 else line[:197] + "..."


def save_kind(mode: Any) -> str:
    """``"base"`` or ``"delta"`` for ``save_persistables``' ``mode``: Paddle's
    numbers (0: every row, 1: the rows changed since the last save) or the names.

    Raises:
        ValueError: another mode. Paddle's 2 (an "xbox base": only rows whose
            show/click score passes its accessor's base_threshold, for serving)
            has no counterpart here.
    """
    kinds = {0: "base", 1: "delta", "base": "base", "delta": "delta"}
    if isinstance(mode, bool) or not isinstance(mode, (int, str)) or mode not in kinds:
        raise ValueError(
            f"save_persistables: mode must be 0 or 'base' (every row) or 1 or 'delta' (rows "
            f"changed since the last save, and the ids dropped since), got {mode!r}"
            + (" (Paddle's xbox base, filtered by score, is not supported)" if mode == 2 else "")
        )
    return kinds[mode]


def state_of(meta: dict[str, Any]) -> str | None:
    """The state of the rows a checkpoint holds: its ``state`` (a save made
    with nothing changed since the save before it holds that save's state, as
    the day's checkpoint after a pass's delta does), else its ``save_id``."""
    return meta.get("state") or meta.get("save_id")


class CheckpointState:
    """Which checkpoint state a process's rows and dense values are at, so
    that a save can say it holds the same state as the save before it (the
    day's checkpoint right after a pass's delta) and a delta can name the
    state it follows (``after``): that of the last committed save, or of the
    load. A save begun and not committed has marked its rows saved: the state
    is unknown (None) until a later save commits or a load. Thread-safe: a
    server's handlers run on a pool."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: str | None = None
        self._dense: list[torch.Tensor] | None = None
        self._pending: str | None = None  # the save begun and not committed

    @property
    def state(self) -> str | None:
        """The state the rows are at (None: unknown)."""
        with self._lock:
            return None if self._pending is not None else self._state

    def begin(self) -> tuple[str, str | None]:
        """A save starts: ``(token, state)``, the token its commit must give,
        and the state the rows were at (None: unknown)."""
        with self._lock:
            before = None if self._pending is not None else self._state
            self._pending = uuid.uuid4().hex
            return self._pending, before

    def written(self, token: str, tables_unchanged: bool, dense: list[torch.Tensor]) -> bool:
        """The save of ``token`` wrote the tables (``tables_unchanged``: none
        changed since its last save or load) and ``dense``; whether it holds
        the state the rows were at when it began."""
        with self._lock:
            unchanged = (
                tables_unchanged and token == self._pending and self._dense is not None
                and len(self._dense) == len(dense)
                and all(torch.equal(a, b) for a, b in zip(self._dense, dense, strict=True))
            )
            self._dense = [d.detach().clone() for d in dense]
            return unchanged

    def committed(self, token: str, state: str) -> bool:
        """The save of ``token`` is committed holding ``state``; False (nothing
        changes) when it is not the save in progress."""
        with self._lock:
            if token != self._pending:
                return False
            self._state, self._pending = state, None
            return True

    def loaded(self, meta: dict[str, Any], dense: list[torch.Tensor], exact: bool) -> None:
        """The checkpoint of ``meta`` was loaded, ``dense`` its values. ``exact``:
        the rows now are the checkpoint's (``loads_exactly``); else their state
        is unknown, and the next delta is written as a base."""
        with self._lock:
            self._state, self._pending = state_of(meta) if exact else None, None
            self._dense = [d.detach().clone() for d in dense]

    def loads_exactly(self, meta: dict[str, Any]) -> bool:
        """Whether loading the checkpoint of ``meta`` leaves exactly its rows: a
        base (which replaces the rows), or a delta of the state the rows are at
        (a delta loaded over rows of an unknown state leaves them unknown)."""
        if meta["kind"] == "base":
            return True
        state = self.state
        return state is not None and meta.get("after") == state


def check_follows(meta: dict[str, Any], state: str | None, dirname: str) -> None:
    """Checks that a delta checkpoint follows the rows' ``state`` (that of the
    last save or load; None: unknown, nothing checked).

    Raises:
        CheckpointError: the delta follows another save.
    """
    if meta["kind"] != "delta" or state is None or meta.get("after") in (None, state):
        return
    raise CheckpointError(
        f"checkpoint {dirname!r} is a delta of save {meta['after']}; the tables here are at "
        f"save {state} (the last saved or loaded): load its base and the deltas before it, "
        "in order",
        path=dirname,
    )
