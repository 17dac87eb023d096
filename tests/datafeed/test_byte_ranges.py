"""Byte ranges (datafeed/source/ranges.py): one large file read by several commands at once."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from support import PYTHON, REAL_DATA, REPO, SMALL_SCHEMA, small_line

from datafeed import InMemoryDataset, ParseError, QueueDataset, Slot
from datafeed.config.slots import SlotSchema
from datafeed.source import ranges
from datafeed.source.readers import ReaderPool


@pytest.fixture
def big_file(tmp_path: Path) -> Path:
    path = tmp_path / "one.txt"
    path.write_text("".join(small_line(i) for i in range(400)))
    return path


@pytest.fixture(autouse=True)
def small_ranges(monkeypatch):
    monkeypatch.setattr(ranges, "MIN_RANGE_BYTES", 1024)


def load(paths, threads, command="cat", **settings) -> InMemoryDataset:
    ds = InMemoryDataset()
    ds.init(batch_size=16, thread_num=threads, use_var=SMALL_SCHEMA, pipe_command=command,
            progress=False, **settings)
    ds.set_filelist([str(p) for p in paths])
    ds.load_into_memory()
    return ds


def test_ranges_start_at_lines_and_cover_the_file(tmp_path):
    path = tmp_path / "lines.txt"
    lines = [("x" * (i * 37 % 300)) + "\n" for i in range(200)]
    path.write_text("".join(lines))
    tasks = ranges.plan_tasks([str(path)], threads=5, min_bytes=1000)
    assert len(tasks) == 5
    data = path.read_bytes()
    pieces = [data[start:end] for _, _, start, end in tasks]
    assert b"".join(pieces) == data
    assert all(piece.endswith(b"\n") for piece in pieces)
    # Enough files, small files or compressed files are not split.
    assert ranges.plan_tasks([str(path)] * 5, threads=5, min_bytes=1000) == [
        (i, str(path), 0, None) for i in range(5)]
    assert len(ranges.plan_tasks([str(path)], threads=5, min_bytes=10**6)) == 1
    gz = tmp_path / "lines.txt.gz"
    gz.write_bytes(gzip.compress(data))
    assert ranges.plan_tasks([str(gz)], threads=5, min_bytes=10) == [(0, str(gz), 0, None)]


@pytest.mark.parametrize(
    "command", ["cat", "cat -", f"{PYTHON} -c 'import sys; sys.stdout.write(sys.stdin.read())'"]
)
def test_one_file_split_gives_the_same_records_in_order_and_stats(big_file, command):
    whole = load([big_file], threads=1, command=command)
    split = load([big_file], threads=4, command=command, split_files=True)
    assert len(split._reader_pool(4).tasks) == 4
    assert split.to_arrow().equals(whole.to_arrow())
    for name in ("files", "lines", "records", "bytes"):
        assert getattr(split.stats(), name) == getattr(whole.stats(), name), name
    assert split.stats().per_file[0].lines == 400
    pool = ReaderPool([str(big_file)], command, SlotSchema(SMALL_SCHEMA), threads=4)
    assert len(pool.tasks) == 4 and pool.threads == 4


def test_two_files_three_threads_split_each(tmp_path, big_file):
    other = tmp_path / "two.txt"
    other.write_text("".join(small_line(i) for i in range(400, 700)))
    whole = load([big_file, other], threads=1)
    split = load([big_file, other], threads=4)
    assert split.to_arrow().equals(whole.to_arrow())
    assert [f.lines for f in split.stats().per_file] == [400, 300]


def test_the_criteo_reader_over_ranges(tmp_path):
    path = tmp_path / "criteo.tsv"
    lines = (REAL_DATA / "criteo_raw.tsv").read_bytes().splitlines()
    path.write_bytes(b"".join(line + b"\n" for line in lines * 2))
    slots = ([Slot("dense_feature", "float32", (13,))]
             + [Slot(f"C{i}", "uint64") for i in range(1, 27)] + [Slot("label", "int64", (1,))])

    def run(threads):
        ds = InMemoryDataset()
        ds.init(thread_num=threads, use_var=slots, progress=False,
                pipe_command=f"{PYTHON} {REPO / 'examples/criteo/reader.py'}")
        ds.set_filelist([str(path)])
        ds.load_into_memory()
        return ds

    assert run(3).to_arrow().equals(run(1).to_arrow())


def test_a_reader_of_its_own_reads_whole_files_unless_told_it_may_split(tmp_path, big_file):
    # A reader that skips its file's first line (a header) loses one record per
    # extra range when a file is split: only "cat", whose lines fleetfeed's
    # parser reads one by one, is split unless split_files=True says so.
    header = tmp_path / "with_header.txt"
    header.write_text("slot names\n" + big_file.read_text())
    skip_header = "tail -n +2"
    for threads in (1, 4):
        ds = load([header], threads=threads, command=skip_header)
        assert ds.get_memory_data_size() == 400
        assert len(ds._reader_pool(threads).tasks) == 1
    assert len(load([big_file], threads=4)._reader_pool(4).tasks) == 4  # cat: split
    told = load([header], threads=4, command=skip_header, split_files=True)
    assert told.get_memory_data_size() < 400  # what the default prevents
    unsplit = load([big_file], threads=4, split_files=False)
    assert len(unsplit._reader_pool(4).tasks) == 1


def test_a_bad_line_in_a_range_names_the_range(big_file):
    text = big_file.read_text().splitlines(keepends=True)
    text[350] = "1 2 3\n"
    big_file.write_text("".join(text))
    with pytest.raises(ParseError, match=r"one.txt \(bytes \d+-\d+\), line \d+"):
        load([big_file], threads=4)


def test_queue_dataset_reads_every_range(big_file):
    ds = QueueDataset()
    ds.init(batch_size=32, thread_num=3, use_var=SMALL_SCHEMA, progress=False)
    ds.set_filelist([str(big_file)])
    assert sum(batch.size for batch in ds) == 400
    assert ds.stats().lines == 400
