"""Real public samples (examples/data/real) through the example readers, end to end."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from support import PYTHON, REAL_DATA, REPO

from datafeed import InMemoryDataset, QueueDataset, Ragged, Slot

CRITEO_RAW = REAL_DATA / "criteo_raw.tsv"
BST = REAL_DATA / "bst_sequences.txt"
CRITEO_SLOTS = (
    [Slot("dense_feature", "float32", (13,))]
    + [Slot(f"C{i}", "uint64") for i in range(1, 27)]
    + [Slot("label", "int64", (1,))]
)
BST_NAMES = [
    "userid", "history", "cate", "position", "target", "target_cate", "target_position", "label"
]
BST_SLOTS = [Slot(name, "uint64") for name in BST_NAMES]


def load(cls, slots, reader: Path, path: Path, batch_size: int = 16):
    ds = cls()
    ds.init(batch_size=batch_size, thread_num=2, use_var=slots,
            pipe_command=f"{PYTHON} {reader}", progress=False)
    ds.set_filelist([str(path)])
    if cls is InMemoryDataset:
        ds.load_into_memory()
    return ds


def expected_criteo(line: str) -> dict:
    """What examples/criteo/reader.py promises, computed independently of it."""
    fields = line.rstrip("\n").split("\t")
    dense = [math.log1p(max(int(v), 0)) if v else 0.0 for v in fields[1:14]]
    ids = [
        (c << 32) | (int(v, 16) if v else 0xFFFFFFFF) for c, v in enumerate(fields[14:], start=1)
    ]
    return {"label": int(fields[0]), "dense": dense, "ids": ids}


def test_criteo_raw_sample_loads_every_line_exactly():
    lines = CRITEO_RAW.read_text().splitlines(keepends=True)
    ds = load(InMemoryDataset, CRITEO_SLOTS, REPO / "examples/criteo/reader.py", CRITEO_RAW)
    assert ds.get_memory_data_size() == len(lines) >= 99
    table = ds.to_arrow()
    for row, line in enumerate(lines):
        want = expected_criteo(line)
        assert table.column("label")[row].as_py() == [want["label"]]
        assert table.column("dense_feature")[row].as_py() == pytest.approx(want["dense"], rel=1e-6)
        assert [table.column(f"C{c}")[row].as_py()[0] for c in range(1, 27)] == want["ids"]


def test_bst_sequences_keep_their_variable_lengths():
    lines = BST.read_text().splitlines()
    want = []
    for line in lines:
        values = {name: [] for name in BST_NAMES}
        for token in line.split():
            name, _, value = token.partition(":")
            values[name].append(int(value))
        want.append({name: values[name] or [0] for name in BST_NAMES})
    ds = load(InMemoryDataset, BST_SLOTS, REPO / "examples/bst/reader.py", BST, batch_size=10)
    got = []
    for batch in ds:
        columns = {name: batch[name].tolist() for name in BST_NAMES}
        got += [{name: columns[name][i] for name in BST_NAMES} for i in range(batch.size)]
    assert got == want
    lengths = {len(record["history"]) for record in want}
    assert len(lengths) > 5  # the sample really is variable-length
    history = next(iter(ds))["history"]
    assert isinstance(history, Ragged) and history.offsets[0] == 0


def test_queue_dataset_reads_the_same_records_as_in_memory():
    memory = load(InMemoryDataset, BST_SLOTS, REPO / "examples/bst/reader.py", BST)
    queue = load(QueueDataset, BST_SLOTS, REPO / "examples/bst/reader.py", BST)
    def rows(ds):
        out = []
        for batch in ds:
            columns = {name: batch[name].tolist() for name in BST_NAMES}
            out += [tuple(tuple(columns[n][i]) for n in BST_NAMES) for i in range(batch.size)]
        return out
    assert sorted(rows(queue)) == sorted(rows(memory))
    assert len(rows(queue)) == len(BST.read_text().splitlines())
