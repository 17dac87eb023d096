"""Shared fixtures: small slot schemas, MultiSlot files, and child-process checks."""

from __future__ import annotations

import gzip
import os
import sys
from pathlib import Path

import pytest

from datafeed import Slot

REPO = Path(__file__).resolve().parent.parent
REAL_DATA = REPO / "examples" / "data" / "real"  # samples of public data sets: its README.md
PYTHON = sys.executable

# Child processes (pipe commands, generators, workers) import this checkout,
# whether or not it is installed in the interpreter running the tests.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
)

# A small schema with every kind of slot: dense float, sparse uint64, sparse
# int64, dense int64 label.
SMALL_SCHEMA = [
    Slot("dense", "float32", (3,)),
    Slot("ids", "uint64"),
    Slot("signed", "int64"),
    Slot("label", "int64", (1,)),
]


def small_record(i: int) -> dict:
    """Record number ``i`` of the small schema, as plain Python values."""
    return {
        "dense": [float(i), i + 0.5, -1.25],
        "ids": [i * 10 + k for k in range(1 + i % 3)],
        "signed": [-i, i] if i % 2 else [0],
        "label": [i % 2],
    }


def small_line(i: int) -> str:
    record = small_record(i)
    parts = []
    for name in ("dense", "ids", "signed", "label"):
        values = record[name]
        parts.append(" ".join([str(len(values))] + [str(v) for v in values]))
    return " ".join(parts) + "\n"


def write_small_files(directory: Path, files: int, per_file: int, gz: bool = False) -> list[str]:
    """Files of consecutive small records: file f holds records f*per_file ... ."""
    paths = []
    for f in range(files):
        text = "".join(small_line(f * per_file + i) for i in range(per_file))
        path = directory / (f"part-{f}.txt.gz" if gz else f"part-{f}.txt")
        if gz:
            with gzip.open(path, "wt") as out:
                out.write(text)
        else:
            path.write_text(text)
        paths.append(str(path))
    return paths


@pytest.fixture
def small_files(tmp_path: Path) -> list[str]:
    return write_small_files(tmp_path, files=3, per_file=5)


def child_pids() -> list[int]:
    """Live (non-zombie) child processes of this test process."""
    me = os.getpid()
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, ppid = fields[0], int(fields[1])
        if ppid == me and state != "Z":
            children.append(int(entry))
    return children


@pytest.fixture(autouse=True)
def no_leftover_children():
    """Every test must leave no child process behind."""
    yield
    assert child_pids() == [], "a test left child processes running"
