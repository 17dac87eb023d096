"""Hand-edited or corrupted resume states and checkpoints, as an attacker (or a
bad disk) would hand them over: each is refused with the project's error, which
says what was expected and what was found, and nothing was changed before."""

from __future__ import annotations

import itertools
import json
import pathlib
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
import torch
from support import SMALL_SCHEMA
from torch import nn

from datafeed import InMemoryDataset, QueueDataset
from datafeed.config.errors import StateError
from trainer.embedding import pending, stores
from trainer.job.errors import CheckpointError
from trainer.job.role import ClusterRole
from trainer.nn import SparseEmbedding
from trainer.ps import ParameterServerRuntime, load_local
from trainer.ps.checkpoint import table_files

# -- InMemoryDataset.load_state_dict ------------------------------------------------


def _dataset(files: list[str]) -> InMemoryDataset:
    ds = InMemoryDataset()
    ds.init(batch_size=4, use_var=SMALL_SCHEMA, seed=7)
    ds.set_filelist(files)
    ds.load_into_memory()
    return ds


def _order(ds: InMemoryDataset) -> list[float]:
    return [row["dense"][0] for row in ds.to_arrow().to_pylist()]


@pytest.fixture
def shuffled_state(small_files: list[str]) -> tuple[dict, list[float]]:
    """A state taken one batch into a pass after a local shuffle, and the rest
    of that pass's records."""
    ds = _dataset(small_files)
    ds.local_shuffle()
    batches = iter(ds)
    next(batches)
    state = json.loads(json.dumps(ds.state_dict()))
    rest = [v for b in batches for v in b["dense"][:, 0].tolist()]
    return state, rest


def _edited(state: dict, **changes) -> dict:
    out = json.loads(json.dumps(state))
    for key, value in changes.items():
        if value is _DROP:
            del out[key]
        else:
            out[key] = value
    return out


_DROP = object()

# (changes to a valid state, what the message must say)
BAD_INMEMORY = {
    "not-a-dict": (None, r"expected a dict from state_dict\(\), found list"),
    "missing-key": ({"shuffles": _DROP}, r"lacks shuffles"),
    "version-str": ({"version": "1"}, r"'version': expected 1, found '1'"),
    "epoch-str": ({"epoch": "0"}, r"'epoch': expected an int >= 0, found '0'"),
    "epoch-negative": ({"epoch": -1}, r"'epoch': expected an int >= 0, found -1"),
    "batches-float": ({"batches_consumed": 1.0}, r"'batches_consumed': expected an int"),
    "batches-bool": ({"batches_consumed": True}, r"'batches_consumed': expected an int"),
    "started-int": ({"epoch_started": 1}, r"'epoch_started': expected a bool, found 1"),
    "seed-str": ({"seed": "7"}, r"'seed': expected None or an int"),
    "records-negative": ({"records": -15}, r"'records': expected an int >= 0, found -15"),
    "shuffles-str": ({"shuffles": "local"}, r"'shuffles': expected a list"),
    "entry-short": ({"shuffles": [["local"]]}, r"shuffles\[0\]: expected \['local', seed\]"),
    "entry-seed-str": ({"shuffles": [["local", "3"]]}, r"shuffles\[0\]: .* seed .* found '3'"),
    "entry-seed-negative": ({"shuffles": [["local", -3]]}, r"shuffles\[0\]: .* found -3"),
    "entry-unknown": ({"shuffles": [["sort", 3]]}, r"shuffles\[0\]: expected a shuffle kind"),
    "entry-slots-not-names": (
        {"shuffles": [["local", 3], ["slots", 4, "ids"]]},
        r"shuffles\[1\]: expected \['slots', seed, \[slot names\]\]",
    ),
    "global-world-zero": (
        {"shuffles": [["global", 3, 0]]},
        r"shuffles\[0\]: .* world size .* found 0",
    ),
    "counter-below-shuffles": (
        {"shuffle_counter": 0},
        r"'shuffle_counter': expected an int >= 1 \(the shuffles it lists\), found 0",
    ),
    # The last entry is refused only after the first was checked: a loader that
    # checks as it replays has shuffled the records once already.
    "last-entry-unknown-slot": (
        {"shuffles": "APPEND_SLOTS"},
        r"slots \['nope'\] that this dataset does not declare",
    ),
    "last-entry-global": (
        {"shuffles": "APPEND_GLOBAL"},
        r"replays a global shuffle among 2 workers; this process group has 1",
    ),
    "last-entry-merge-without-ins-ids": (
        {"shuffles": "APPEND_MERGE"},
        r"replays a merge by line id; the records in memory carry no instance ids",
    ),
    "merge-size-str": (
        {"shuffles": [["merge", 3, "2"]]},
        r"shuffles\[0\]: expected \['merge', seed, merge size\], found \['merge', 3, '2'\]",
    ),
    "huge-batches": (
        {"batches_consumed": 10**12},
        r"'batches_consumed': expected 0 to 4 \(batches per pass of 15 records, "
        r"batch_size 4\), found 1000000000000",
    ),
    "one-batch-too-many": ({"batches_consumed": 5}, r"expected 0 to 4 .* found 5"),
    "batches-without-a-pass": (
        {"batches_consumed": 2, "epoch_started": False},
        r"'batches_consumed': expected 0 when epoch_started is false, found 2",
    ),
    "seed-changed-and-bad-entry": (
        {"seed": 99, "shuffles": "APPEND_SLOTS"},
        r"does not declare",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INMEMORY))
def test_a_refused_inmemory_state_changes_nothing(
    case: str, small_files: list[str], shuffled_state: tuple[dict, list[float]]
) -> None:
    state, rest = shuffled_state
    changes, message = BAD_INMEMORY[case]
    if changes is None:
        bad = [state]
    else:
        changes = dict(changes)
        if changes.get("shuffles") == "APPEND_SLOTS":
            changes["shuffles"] = state["shuffles"] + [["slots", 5, ["nope"]]]
            changes.setdefault("shuffle_counter", 2)
        elif changes.get("shuffles") == "APPEND_MERGE":
            changes["shuffles"] = state["shuffles"] + [["merge", 5, 2]]
            changes.setdefault("shuffle_counter", 2)
        elif changes.get("shuffles") == "APPEND_GLOBAL":
            changes["shuffles"] = state["shuffles"] + [["global", 5, 2]]
            changes.setdefault("shuffle_counter", 2)
        bad = _edited(state, **changes)
    ds = _dataset(small_files)
    before = _order(ds)
    with pytest.raises(StateError, match=message):
        ds.load_state_dict(bad)
    assert _order(ds) == before  # no shuffle replayed
    assert ds.state_dict()["shuffles"] == [] and ds.state_dict()["seed"] == 7
    assert (ds.epoch, ds.batches_consumed, ds.epoch_started) == (0, 0, False)
    # A retry with the good state resumes exactly where the state was taken.
    ds.load_state_dict(state)
    assert [v for b in ds for v in b["dense"][:, 0].tolist()] == rest


def test_a_state_at_the_end_of_a_pass_still_loads(small_files: list[str]) -> None:
    ds = _dataset(small_files)
    ds.local_shuffle()
    batches = iter(ds)
    for _ in range(4):  # 15 records, batch_size 4: the last batch is the 4th
        next(batches)
    state = ds.state_dict()
    assert state["batches_consumed"] == 4
    again = _dataset(small_files)
    again.load_state_dict(state)
    assert list(again) == [] and again.epoch == 1


# -- QueueDataset.load_state_dict ---------------------------------------------------


def _queue(files: list[str]) -> QueueDataset:
    ds = QueueDataset()
    ds.init(batch_size=4, use_var=SMALL_SCHEMA, thread_num=1)
    ds.set_filelist(files)
    return ds


BAD_QUEUE = {
    "missing-filelist": ({"filelist": _DROP}, r"lacks filelist"),
    "epoch-str": ({"epoch": "1"}, r"'epoch': expected an int >= 0, found '1'"),
    "tasks-not-list": ({"tasks": 3}, r"'tasks': expected a list"),
    "task-short": ({"tasks": [[0, 0]]}, r"tasks\[0\]: expected \[file index, first byte"),
    "task-file-out-of-range": (
        {"tasks": [[0, 0, None], [1, 0, None], [9, 0, None]]},
        r"tasks\[2\]: .* file index 0 to 2 .* found 9",
    ),
    "delivered-length": (
        {"delivered": [4]},
        r"'delivered': expected 3 counts \(one per task\), found 1",
    ),
    "delivered-negative": ({"delivered": [-4, 0, 0]}, r"delivered\[0\]: expected an int >= 0"),
    "huge-batches": (
        {"batches_consumed": 10**12},
        r"'batches_consumed': expected 1 \(4 records handed out, batch_size 4\), "
        r"found 1000000000000",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_QUEUE))
def test_a_refused_queue_state_changes_nothing(case: str, small_files: list[str]) -> None:
    ds = _queue(small_files)
    next(iter(ds))  # one batch of 4 records in
    state = json.loads(json.dumps(ds.state_dict()))
    assert state["tasks"] == [[0, 0, None], [1, 0, None], [2, 0, None]]
    changes, message = BAD_QUEUE[case]
    fresh = _queue(small_files)
    with pytest.raises(StateError, match=message):
        fresh.load_state_dict(_edited(state, **changes))
    assert (fresh.epoch, fresh.batches_consumed) == (0, 0)
    fresh.load_state_dict(state)
    assert sum(len(b["dense"]) for b in fresh) == 11  # the rest of the 15


# -- the dataset state saved beside a checkpoint ------------------------------------


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"workers": [{"version": 1', r"dataset_state.json: expected JSON .* found"),
        ('["version"]', r"dataset_state.json: expected .*\{\"workers\": .* found list"),
        ('{"workers": {"0": 1}}', r"dataset_state.json: expected .* list .* found dict"),
    ],
    ids=["truncated", "not-a-dict", "workers-not-a-list"],
)
def test_a_corrupt_saved_dataset_state_is_a_state_error(
    tmp_path: Path, small_files: list[str], content: str, message: str
) -> None:
    from trainer import fleet

    fleet.init()  # one local worker
    model = torch.nn.Linear(3, 1)
    ds = _queue(small_files)
    next(iter(ds))
    fleet.save_persistables(str(tmp_path / "ckpt"), model=model, dataset=ds)
    (tmp_path / "ckpt" / "dataset_state.json").write_text(content)
    with pytest.raises(StateError, match=message):
        fleet.load_persistables(str(tmp_path / "ckpt"), model=model, dataset=_queue(small_files))


# -- load_local ---------------------------------------------------------------------

_names = itertools.count()


class ThreeDense(nn.Module):
    """Two sparse tables and four dense parameters (the last a bias of 1)."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.emb = SparseEmbedding(4, prefix + "emb")
        self.wide = SparseEmbedding(1, prefix + "wide", optimizer={"type": "adagrad", "lr": 0.1})
        self.hidden = nn.Linear(4, 3)
        self.out = nn.Linear(3, 1)


@pytest.fixture
def saved(tmp_path: Path):
    """A checkpoint of a ThreeDense model with rows in both tables; yields
    (prefix, checkpoint dir). Tables are process-wide: cleared after."""
    prefix = f"vbc{next(_names)}"
    stores.local_store().clear()  # pass 0, whatever ran before
    torch.manual_seed(0)
    model = ThreeDense(prefix)
    runtime = ParameterServerRuntime(ClusterRole.local(), None)
    runtime.distributed_optimizer(torch.optim.Adagrad(model.parameters(), lr=0.1))
    ids = torch.tensor([3, 5, 7, 11])
    model.emb(ids)
    model.wide(ids)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(0.5)
    runtime.save_persistables(str(tmp_path / "ckpt"))
    stores.local_store().clear()
    yield prefix, tmp_path / "ckpt"
    stores.local_store().clear()
    pending.clear_pending()


def _table_rows(prefix: str) -> dict[str, int]:
    tables = stores.local_store().tables
    return {k: len(tables[prefix + k]) if prefix + k in tables else 0 for k in ("emb", "wide")}


def _edit_pt(path: Path, edit) -> None:
    data = torch.load(path, weights_only=True)
    edit(data)
    torch.save(data, path)


def _edit_meta(ckpt: Path, edit) -> None:
    meta = json.loads((ckpt / "meta.json").read_text())
    edit(meta)
    (ckpt / "meta.json").write_text(json.dumps(meta))


class _Payload:
    """What an attacker would pickle into a .pt: creates a file when unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def _sparse(ckpt: Path, prefix: str, table: str) -> Path:
    return ckpt / f"sparse.{prefix}{table}.shard0.arrow"


def _edit_arrow(path: Path, edit=None, metadata=None, crc: bool = True) -> None:
    """Rewrites a table file edited by ``edit`` (a pyarrow Table -> Table),
    with schema ``metadata`` changed, each batch with its CRC-32 (unless not)."""
    table = pa.ipc.open_file(pa.BufferReader(path.read_bytes())).read_all()
    changes = {k.encode(): v.encode() for k, v in (metadata or {}).items()}
    saved = {**table.schema.metadata, **changes}
    edited = (edit(table) if edit else table).replace_schema_metadata(saved)
    original = table.to_batches()
    with pa.OSFile(str(path), "wb") as out, pa.ipc.new_file(out, edited.schema) as writer:
        for i, batch in enumerate(edited.to_batches()):
            crc32 = table_files.batch_crc32(batch if crc else original[i])
            writer.write_batch(batch, custom_metadata={"crc32": str(crc32)})


def _attack(case: str, ckpt: Path, prefix: str) -> str:
    """Corrupts the checkpoint as ``case`` says; returns the message to expect."""
    dense = ckpt / "dense.shard0.pt"
    emb, wide = _sparse(ckpt, prefix, "emb"), _sparse(ckpt, prefix, "wide")
    if case == "meta-truncated":
        (ckpt / "meta.json").write_text('{"format": "fleetfeed-ps/1", "dense": [[3, 4]')
        return r"meta.json: expected JSON .* found"
    if case == "meta-a-list":
        (ckpt / "meta.json").write_text("[1, 2]")
        return r"meta.json: expected a JSON object .* found list"
    if case == "meta-no-dense":
        _edit_meta(ckpt, lambda m: m.pop("dense"))
        return r"meta.json: expected the key 'dense'"
    if case == "meta-dense-not-shapes":
        _edit_meta(ckpt, lambda m: m.update(dense=[[3, 4], "x", [1, 3], [1]]))
        return r"meta.json: 'dense'\[1\]: expected a shape"
    if case == "meta-tables-bad-dim":
        _edit_meta(ckpt, lambda m: m["tables"][prefix + "emb"].update(dim="4"))
        return rf"meta.json: table '{prefix}emb': expected 'dim' an int >= 1, found '4'"
    if case == "meta-last-dense-shape":  # the model has [1]: refused before any copy
        _edit_meta(ckpt, lambda m: m["dense"].__setitem__(-1, [2]))
        return r"holds 4 dense parameters of shapes .* the model has 4 of shapes"
    if case == "dense-last-shape":  # meta intact; only the shard's last tensor differs
        _edit_pt(dense, lambda d: d["params"].__setitem__(-1, torch.zeros(2)))
        return r"dense.shard0.pt: dense parameter 3: expected shape \[1\] .* found \[2\]"
    if case == "dense-lengths-disagree":
        _edit_pt(dense, lambda d: d["params"].pop())
        return r"dense.shard0.pt: expected as many params as indices \(4\), found 3"
    if case == "dense-index-missing":
        _edit_pt(dense, lambda d: (d["params"].pop(), d.update(indices=d["indices"][:-1])))
        return r"dense parameter 3 .* in no dense.shard\*.pt file"
    if case == "dense-index-out-of-range":
        _edit_pt(dense, lambda d: d.update(indices=torch.tensor([0, 1, 2, 9])))
        return r"dense.shard0.pt: 'indices': expected ints 0 to 3 .* found 9"
    if case == "dense-params-not-tensors":
        _edit_pt(dense, lambda d: d.update(params="oops"))
        return r"dense.shard0.pt: 'params': expected a list of tensors, found 'oops'"
    if case == "dense-truncated":
        dense.write_bytes(dense.read_bytes()[:100])
        return r"dense.shard0.pt: expected a torch.save file of tensors"
    if case == "sparse-ids-duplicated":  # the second table, after a good first one
        _edit_arrow(wide, lambda t: t.set_column(0, t.schema.field(0), pa.array(
            [7] * t.num_rows, pa.uint64())))
        return rf"{prefix}wide.shard0.arrow: record batch 0: expected distinct ids"
    if case == "sparse-weights-null":
        _edit_arrow(wide, lambda t: t.set_column(1, t.schema.field(1), pa.array(
            [None, [1.0], [2.0], [3.0]], t.schema.field(1).type)))
        return r"wide.shard0.arrow: record batch 0: expected no nulls, found some in \['weights'\]"
    if case == "sparse-ids-float":
        _edit_arrow(wide, lambda t: t.set_column(0, "id", t.column(0).cast(pa.float64())))
        return r"wide.shard0.arrow: expected the columns id: uint64 not null, .* found id: double"
    if case == "sparse-dim-str":
        _edit_arrow(wide, metadata={"dim": "x"})
        return (r"wide.shard0.arrow: metadata 'dim': expected an int >= 0 \(below 10\*\*18\), "
                r"found 'x'")
    if case == "sparse-weights-wrong-dim":
        _edit_arrow(emb, metadata={"dim": "3"})
        return r"emb.shard0.arrow: table .*: expected rows of dim 4 .* found dim 3"
    if case == "sparse-optimizer-state-missing":
        _edit_arrow(wide, lambda t: t.drop_columns(["state.sum"]))
        return r"wide.shard0.arrow: expected the columns .*state.sum.* found id: uint64 not null, w"
    if case == "sparse-pass-beyond-file":
        _edit_arrow(wide, lambda t: t.set_column(t.num_columns - 1, t.schema.field(-1), pa.array(
            [9] * t.num_rows, pa.int64())))
        return r"wide.shard0.arrow: record batch 0: 'last_seen_pass': expected 0 to 0"
    if case == "sparse-a-value-changed":  # valid Arrow: only the CRC-32 tells
        _edit_arrow(wide, lambda t: t.set_column(1, t.schema.field(1), pa.array(
            [[9.0]] * t.num_rows, t.schema.field(1).type)), crc=False)
        return r"wide.shard0.arrow: record batch 0: expected the CRC-32 of its values"
    if case == "sparse-truncated":
        wide.write_bytes(wide.read_bytes()[:200])
        return r"wide.shard0.arrow: expected an Arrow IPC file of table rows"
    if case == "sparse-table-missing":
        wide.unlink()
        _edit_meta(ckpt, lambda m: m["tables"].pop(prefix + "wide"))
        return rf"holds tables \[.*'{prefix}emb'\]; the model's table '{prefix}wide' is not"
    if case == "dense-pickle-payload":
        torch.save({"name": _Payload(ckpt.parent / "pwned")}, dense)
        return r"dense.shard0.pt: expected a torch.save file of tensors .*weights_only"
    if case == "old-torch-format":
        _edit_meta(ckpt, lambda m: m.update(format="fleetfeed-ps/1"))
        return r"format 'fleetfeed-ps/1' \(sparse rows in torch .pt files\) is no longer read"
    raise AssertionError(case)


LOAD_LOCAL_CASES = [
    "meta-truncated", "meta-a-list", "meta-no-dense", "meta-dense-not-shapes",
    "meta-tables-bad-dim", "meta-last-dense-shape", "dense-last-shape",
    "dense-lengths-disagree", "dense-index-missing", "dense-index-out-of-range",
    "dense-params-not-tensors", "dense-truncated", "sparse-ids-duplicated",
    "sparse-weights-null", "sparse-ids-float", "sparse-dim-str",
    "sparse-weights-wrong-dim", "sparse-optimizer-state-missing", "sparse-pass-beyond-file",
    "sparse-a-value-changed", "sparse-truncated", "sparse-table-missing", "old-torch-format",
    "dense-pickle-payload",
]


@pytest.mark.parametrize("case", LOAD_LOCAL_CASES)
def test_a_refused_checkpoint_changes_nothing(case: str, saved) -> None:
    prefix, ckpt = saved
    good = ckpt.parent / "good"
    shutil.copytree(ckpt, good)
    message = _attack(case, ckpt, prefix)
    model = ThreeDense(prefix)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(-1.0)
    with pytest.raises(CheckpointError, match=message):
        load_local(model, str(ckpt))
    assert all(bool((p == -1.0).all()) for p in model.parameters())  # no dense overwritten
    assert _table_rows(prefix) == {"emb": 0, "wide": 0}  # no row inserted
    assert not (ckpt.parent / "pwned").exists()
    load_local(model, str(good))  # the intact checkpoint still loads, whole
    assert all(bool((p == 0.5).all()) for p in model.parameters())
    assert _table_rows(prefix) == {"emb": 4, "wide": 4}


def test_a_missing_meta_is_still_file_not_found(saved) -> None:
    prefix, ckpt = saved
    (ckpt / "meta.json").unlink()
    with pytest.raises(FileNotFoundError, match="is not a fleetfeed checkpoint"):
        load_local(ThreeDense(prefix), str(ckpt))


@pytest.mark.parametrize("case", LOAD_LOCAL_CASES)
def test_a_refused_checkpoint_changes_nothing_in_a_local_runtime(case: str, saved) -> None:
    """``load_persistables`` of a local runtime: dense parameters, the dense
    optimizer's state and the tables are left as they were."""
    prefix, ckpt = saved
    good = ckpt.parent / "good"
    shutil.copytree(ckpt, good)
    message = _attack(case, ckpt, prefix)
    model = ThreeDense(prefix)
    runtime = ParameterServerRuntime(ClusterRole.local(), None)
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.1)
    runtime.distributed_optimizer(optimizer)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(-1.0)
    for p in model.parameters():
        optimizer.state[p]["sum"].fill_(7.0)
    with pytest.raises(CheckpointError, match=message):
        runtime.load_persistables(str(ckpt))
    assert all(bool((p == -1.0).all()) for p in model.parameters())
    assert all(bool((optimizer.state[p]["sum"] == 7.0).all()) for p in model.parameters())
    assert _table_rows(prefix) == {"emb": 0, "wide": 0}
    assert not (ckpt.parent / "pwned").exists()
    runtime.load_persistables(str(good))  # the intact checkpoint still loads, whole
    assert all(bool((p == 0.5).all()) for p in model.parameters())
    assert all(bool((optimizer.state[p]["sum"] == 0.0).all()) for p in model.parameters())
    assert _table_rows(prefix) == {"emb": 4, "wide": 4}


def test_a_malformed_dense_optimizer_state_changes_nothing_in_a_local_runtime(saved) -> None:
    prefix, ckpt = saved
    _edit_pt(ckpt / "dense.shard0.pt",
             lambda d: d["optimizer"]["state"][2].update(sum=torch.zeros(5)))
    model = ThreeDense(prefix)
    runtime = ParameterServerRuntime(ClusterRole.local(), None)
    runtime.distributed_optimizer(torch.optim.Adagrad(model.parameters(), lr=0.1))
    with pytest.raises(CheckpointError, match=r"'state'\[2\]\['sum'\]: expected .* shape \[1, 3\]"):
        runtime.load_persistables(str(ckpt))
    assert all(bool((p != 0.5).any()) for p in model.parameters())
    assert _table_rows(prefix) == {"emb": 0, "wide": 0}
