"""Checkpoint files of a parameter-server (or local) model.

A checkpoint is a directory::

    meta.json                       tables (name, dim, seed, ...), dense shapes, server_num
    sparse.<table>.shard<i>.pt      server i's rows of a table: ids, weights, optimizer state
    dense.shard<i>.pt               the dense parameters server i owns (+ its optimizer state)

Every ``.pt`` file holds only tensors, numbers, strings and lists/dicts of them:
``torch.load(path, weights_only=True)`` reads it. The directory is written under
a temporary name and renamed into place once complete, so a reader never sees a
half-written checkpoint. Shards are re-sharded on load: a checkpoint written by
S servers loads into any number of servers, or into a local model.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import torch

FORMAT = "fleetfeed-ps/1"


def sparse_file(dirname: str, table: str, shard: int) -> str:
    return os.path.join(dirname, f"sparse.{table}.shard{shard}.pt")


def dense_file(dirname: str, shard: int) -> str:
    return os.path.join(dirname, f"dense.shard{shard}.pt")


def save_file(obj: Any, path: str) -> None:
    """``torch.save`` under a temporary name, then an atomic rename."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load_file(path: str) -> Any:
    return torch.load(path, map_location="cpu", weights_only=True)


def staging_dir(dirname: str) -> str:
    """A fresh temporary directory beside ``dirname`` to write a checkpoint into."""
    parent = os.path.dirname(os.path.abspath(dirname))
    os.makedirs(parent, exist_ok=True)
    name = os.path.basename(os.path.abspath(dirname))
    path = os.path.join(parent, f".{name}.tmp-{uuid.uuid4().hex[:8]}")
    os.makedirs(path)
    return path


def commit(staging: str, dirname: str, meta: dict[str, Any]) -> None:
    """Writes meta.json into ``staging`` and moves it to ``dirname`` (replacing it)."""
    with open(os.path.join(staging, "meta.json"), "w") as out:
        json.dump(meta, out, indent=1, sort_keys=True)
    if os.path.exists(dirname):
        old = f"{staging}.old"
        os.replace(dirname, old)
        os.replace(staging, dirname)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, dirname)


def read_meta(dirname: str) -> dict[str, Any]:
    path = os.path.join(dirname, "meta.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{dirname!r} is not a fleetfeed checkpoint: {path} is missing"
        )
    with open(path) as f:
        meta = json.load(f)
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path}: expected format {FORMAT!r}, found {meta.get('format')!r}")
    return meta


def sparse_shards(dirname: str, table: str) -> Iterator[dict[str, Any]]:
    """Every saved shard of a table."""
    pattern = os.path.join(glob.escape(dirname), f"sparse.{glob.escape(table)}.shard*.pt")
    for path in sorted(glob.glob(pattern)):
        yield load_file(path)


def dense_values(dirname: str) -> dict[int, torch.Tensor]:
    """Every saved dense parameter, by index."""
    out: dict[int, torch.Tensor] = {}
    for path in sorted(glob.glob(os.path.join(glob.escape(dirname), "dense.shard*.pt"))):
        shard = load_file(path)
        for index, value in zip(shard["indices"].tolist(), shard["params"], strict=True):
            out[int(index)] = value
    return out


def dense_optimizer_states(dirname: str) -> list[dict[str, Any]]:
    out = []
    for path in sorted(glob.glob(os.path.join(glob.escape(dirname), "dense.shard*.pt"))):
        shard = load_file(path)
        if shard.get("optimizer") is not None:
            out.append(shard["optimizer"])
    return out


def check_dense_shapes(meta: dict[str, Any], params: Sequence[torch.Tensor], dirname: str) -> None:
    saved = [tuple(s) for s in meta["dense"]]
    have = [tuple(p.shape) for p in params]
    if saved != have:
        raise ValueError(
            f"checkpoint {dirname!r} holds {len(saved)} dense parameters of shapes {saved}; "
            f"the model's optimizer has {len(have)} of shapes {have}"
        )
