"""The in-process path (datafeed/source/inprocess.py, datafeed/parse/samples.pyx).

The oracle is the pipe path: the same reader run as a pipe command, or (for
property tests, without a process per example) the same samples written by
the generator's formatter and read back by the MultiSlot parser.
"""

from __future__ import annotations

import importlib.util
import os
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import PYTHON, REAL_DATA, REPO, child_pids

from datafeed import InMemoryDataset, ParseError, QueueDataset, ReaderError, SchemaError, Slot
from datafeed.config.slots import SlotSchema
from datafeed.parse.parsing import parse_bytes
from datafeed.source.inprocess import InProcessPool, _FileLoader
from generators import MultiSlotDataGenerator, SampleError, SampleFormatter

CRITEO_SLOTS = (
    [Slot("dense_feature", "float32", (13,))]
    + [Slot(f"C{i}", "uint64") for i in range(1, 27)]
    + [Slot("label", "int64", (1,))]
)
BST_SLOTS = [
    Slot(name, "uint64")
    for name in ["userid", "history", "cate", "position", "target", "target_cate",
                 "target_position", "label"]
]


def import_reader(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(f"reader_{path.stem}_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return getattr(module, name)


def load(slots, files, *, generator=None, command=None, threads=2, **settings):
    ds = InMemoryDataset()
    source = {"data_generator": generator} if generator is not None else {"pipe_command": command}
    ds.init(batch_size=8, thread_num=threads, use_var=slots, progress=False, **source, **settings)
    ds.set_filelist([str(f) for f in files])
    ds.load_into_memory()
    return ds


def same_stats(a, b) -> None:
    for name in ("files", "lines", "records", "skipped_lines", "skipped_reasons"):
        assert getattr(a.stats(), name) == getattr(b.stats(), name), name


# -- the real samples, against the pipe path --------------------------------------------


@pytest.mark.parametrize(
    "reader, cls, slots, data",
    [
        ("examples/criteo/reader.py", "CriteoReader", CRITEO_SLOTS, "criteo_raw.tsv"),
        ("examples/bst/reader.py", "BSTReader", BST_SLOTS, "bst_sequences.txt"),
    ],
)
def test_real_samples_give_the_pipe_paths_records_and_stats(tmp_path, reader, cls, slots, data):
    # Two copies of the file: two workers, and records in filelist order.
    text = (REAL_DATA / data).read_bytes()
    files = [tmp_path / "a.txt", tmp_path / "b.txt"]
    files[0].write_bytes(text)
    files[1].write_bytes(b"".join(line + b"\n" for line in reversed(text.splitlines())))
    pipe = load(slots, files, command=f"{PYTHON} {REPO / reader}")
    generator = import_reader(REPO / reader, cls)
    inproc = load(slots, files, generator=generator)
    assert inproc.to_arrow().equals(pipe.to_arrow())
    assert inproc.get_memory_data_size() == 2 * len(text.splitlines()) > 100
    same_stats(inproc, pipe)
    # bytes: the input read (there is no text)
    assert inproc.stats().bytes == sum(f.stat().st_size for f in files)
    # An instance works as well as a class.
    assert load(slots, files, generator=generator(), threads=1).to_arrow().equals(pipe.to_arrow())


def test_queue_dataset_streams_the_same_records(tmp_path):
    generator = import_reader(REPO / "examples/bst/reader.py", "BSTReader")
    path = REAL_DATA / "bst_sequences.txt"
    ds = QueueDataset()
    ds.init(batch_size=7, thread_num=2, use_var=BST_SLOTS, data_generator=generator, progress=False)
    ds.set_filelist([str(path), str(path)])
    rows = sum(batch.size for batch in ds)
    assert rows == 2 * len(path.read_text().splitlines())
    assert ds.stats().records == rows
    it = iter(ds)  # stopped early: the workers go
    next(it)
    it.close()
    assert child_pids() == []


# -- random samples, against format-then-parse ------------------------------------------

SCHEMA = SlotSchema([
    Slot("dense", "float32", (2,)),
    Slot("ids", "uint64"),
    Slot("signed", "int64"),
    Slot("weights", "float32"),
])


class ListReader(MultiSlotDataGenerator):
    """Yields, for input line i, the samples in ``self.table[i]``."""

    def __init__(self, table):
        super().__init__()
        self.table = table

    def generate_sample(self, line):
        index = int(line)
        return lambda: iter(self.table[index])


def midpoint_floats():
    # Doubles on a float32 rounding midpoint: repr() read back as float32 may
    # round differently from the double itself (the builder's slow path).
    return st.integers(1, 2**23).map(
        lambda m: struct.unpack("<d", struct.pack("<Q", (1023 << 52) | (m << 29) | (1 << 28)))[0]
    )


FLOATS = st.one_of(
    st.floats(allow_nan=False, width=64),
    st.floats(allow_nan=False, width=32),
    midpoint_floats(),
    st.sampled_from([0.0, -0.0, 1e-40, 3.4028235e38, 3.5e38, 1e-45, float("inf")]),
    st.integers(-(2**70), 2**70),
    st.builds(np.float32, st.floats(width=32, allow_nan=False)),
)
UINTS = st.one_of(
    st.integers(0, 2**64 - 1), st.integers(-5, 2**65), st.builds(np.int64, st.integers(0, 9)),
    st.sampled_from([True, 2.0]),
)
INTS = st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**65), 2**65))


def samples():
    sample = st.tuples(
        st.lists(FLOATS, min_size=1, max_size=3),
        st.lists(UINTS, min_size=1, max_size=4),
        st.lists(INTS, min_size=1, max_size=3),
        st.lists(FLOATS, min_size=1, max_size=3),
    ).map(lambda v: [("dense", v[0]), ("ids", v[1]), ("signed", v[2]), ("weights", v[3])])
    return st.lists(st.lists(st.one_of(sample, st.none()), max_size=3), min_size=1, max_size=6)


def run_in_process(tmp_path, table, skip):
    path = tmp_path / "lines.txt"
    path.write_text("".join(f"{i}\n" for i in range(len(table))))
    chunks = []
    loader = _FileLoader(
        ListReader(table), SCHEMA, (0, str(path), 0, None), chunks.append,
        skip_bad_lines=skip, max_line_bytes=1 << 20, chunk_rows=4,
    )
    stats = loader.run()
    return chunks, stats


def run_pipe_logic(table, skip):
    formatter = SampleFormatter()
    for line in table:
        for sample in line:
            if sample is not None:
                formatter.append(sample)
    return parse_bytes(SCHEMA, formatter.take(), skip_bad_lines=skip)


def rows_of(chunks):
    out = []
    for chunk in chunks:
        for r in range(chunk.rows):
            row = []
            for column in chunk.columns:
                offsets = column.offsets
                lo, hi = (r * column.width, (r + 1) * column.width) if offsets is None else (
                    offsets[r], offsets[r + 1])
                row.append(column.values[lo:hi].tobytes())  # bytes: -0.0 and NaN exactly
            out.append(row)
    return out


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(table=samples(), skip=st.booleans())
def test_random_samples_match_format_then_parse(tmp_path, table, skip):
    try:
        expected = run_pipe_logic(table, skip)
        error = None
    except (SampleError, ParseError) as e:
        expected, error = None, e
    if error is not None:
        with pytest.raises(type(error)) as raised:
            run_in_process(tmp_path, table, skip)
        if isinstance(error, ParseError):
            got = str(raised.value).replace(f"ListReader on {tmp_path / 'lines.txt'}", "<bytes>")
            assert got == str(error)
        else:
            assert str(raised.value) == str(error)
        return
    chunks, stats = run_in_process(tmp_path, table, skip)
    assert rows_of(chunks) == rows_of([expected])
    assert stats.records == expected.rows
    assert stats.lines == sum(s is not None for line in table for s in line)


def test_float_midpoints_round_as_the_text_does(tmp_path):
    # 1 + 2**-24 is a float32 midpoint; repr() is 1.0000000596046448, above it.
    value = 1 + 2**-24
    table = [[[("dense", [value, 0.1]), ("ids", [1]), ("signed", [-1]), ("weights", [value])]]]
    chunks, _ = run_in_process(tmp_path, table, False)
    parsed = parse_bytes([Slot("x", "float32", (1,))], f"1 {value!r}\n".encode())
    assert chunks[0].columns[0].values[0] == parsed.columns[0].values[0] == np.float32(1 + 2**-23)
    assert np.float32(value) == np.float32(1.0)  # what casting the double would give


# -- errors ---------------------------------------------------------------------------------


READER = '''
from generators import MultiSlotDataGenerator

class Reader(MultiSlotDataGenerator):
    def generate_sample(self, line):
        def records():
            n = int(line)
            if n == 3:
                yield [("ids", [1, 2]), ("label", [{bad}])]
            else:
                yield [("ids", [n, n + 1]), ("label", [n % 2])]
        return records

if __name__ == "__main__":
    Reader().run_from_stdin()
'''
SLOTS = [Slot("ids", "uint64"), Slot("label", "int64", (1,))]


def reader_with(tmp_path, bad: str):
    path = tmp_path / "reader.py"
    path.write_text(READER.replace("{bad}", bad))
    data = tmp_path / "data.txt"
    data.write_text("".join(f"{i}\n" for i in range(6)))
    return path, import_reader(path, "Reader"), data


def test_a_value_the_schema_refuses_is_a_parse_error_naming_file_line_and_slot(tmp_path):
    script, generator, data = reader_with(tmp_path, "1.5")
    refused = (
        r"line 4, slot 'label': expected an integer \(int64 slots do not take floats\), "
        r"found b'1.5'"
    )
    with pytest.raises(ParseError, match=refused) as pipe:
        load(SLOTS, [data], command=f"{PYTHON} {script}")
    with pytest.raises(ParseError) as inproc:
        load(SLOTS, [data], generator=generator)
    assert str(inproc.value) == str(pipe.value).replace(f"'{PYTHON} {script}' on", "Reader on")
    assert (inproc.value.line, inproc.value.slot) == (4, "label")
    assert any("input line 4 of" in note for note in inproc.value.__notes__)


def test_skip_mode_counts_the_same_skips(tmp_path):
    script, generator, data = reader_with(tmp_path, "-1, 2")  # a dense slot of width 1
    pipe = load(SLOTS, [data], command=f"{PYTHON} {script}", on_bad_line="skip")
    inproc = load(SLOTS, [data], generator=generator, on_bad_line="skip")
    assert inproc.stats().skipped_reasons == {"dense_count_mismatch": 1}
    same_stats(inproc, pipe)
    assert inproc.to_arrow().equals(pipe.to_arrow())


def test_a_sample_the_generator_refuses_is_its_sample_error(tmp_path):
    _, generator, data = reader_with(tmp_path, "")
    data.write_text("0\n3\n")
    with pytest.raises(SampleError, match=r"slot 'label' of sample 2 is empty: pad it") as raised:
        load(SLOTS, [data], generator=generator)
    assert any(f"input line 2 of {data}" in note for note in raised.value.__notes__)
    assert any("traceback in the generator worker" in n for n in raised.value.__notes__)


def test_the_generators_own_exception_comes_back_with_its_line(tmp_path):
    _, generator, data = reader_with(tmp_path, "")
    data.write_text("0\nnot a number\n")
    with pytest.raises(ValueError, match="invalid literal for int") as raised:
        load(SLOTS, [data], generator=generator)
    notes = raised.value.__notes__
    assert any("input line 2 of" in note and "'not a number" in note for note in notes)


def test_a_worker_that_dies_is_a_reader_error(tmp_path):
    data = tmp_path / "data.txt"
    data.write_text("1\n2\n")

    class Dies(MultiSlotDataGenerator):
        def generate_sample(self, line):
            os._exit(7)

    died = r"worker process died \(exit code 7\) while Dies was reading"
    with pytest.raises(ReaderError, match=died):
        load(SLOTS, [data], generator=Dies)


EXITS = """
import sys
from generators import MultiSlotDataGenerator

class Reader(MultiSlotDataGenerator):
    def generate_sample(self, line):
        def records():
            n = int(line)
            if n == 3:
                sys.exit({status})
            yield [("ids", [n, n + 1]), ("label", [n % 2])]
        return records

class Batched(Reader):
    def generate_batch(self, samples):
        return lambda: iter(samples)

if __name__ == "__main__":
    reader = Batched() if sys.argv[1:] == ["batched"] else Reader()
    reader.set_batch(2)
    reader.run_from_stdin()
"""


@pytest.mark.parametrize("status", ["", "0", "256"])  # 256: status 0 (its low 8 bits)
def test_sys_exit_0_ends_the_files_samples_where_it_is_called(tmp_path, status):
    """A generator process that calls sys.exit(0) ends its output after the
    samples it wrote: the pipe path keeps them (every sample before the exit;
    Paddle's reader would also lose the batch of batch_size_ it was filling),
    and the in-process path gives the same records and stats."""
    script = tmp_path / "reader.py"
    script.write_text(EXITS.replace("{status}", status))
    data = tmp_path / "data.txt"
    data.write_text("".join(f"{i}\n" for i in range(6)))
    # Samples 0-2; batched by the class's own generate_batch, the batch still
    # filling at the exit ([2]) never went through it.
    for kind, expected in (("Reader", [[0, 1], [1, 2], [2, 3]]), ("Batched", [[0, 1], [1, 2]])):
        argument = " batched" if kind == "Batched" else ""
        pipe = load(SLOTS, [data], command=f"{PYTHON} {script}{argument}", threads=1)
        generator = import_reader(script, kind)()
        generator.set_batch(2)
        inproc = load(SLOTS, [data], generator=generator, threads=1)
        assert pipe.to_arrow().column("ids").to_pylist() == expected, kind
        assert inproc.to_arrow().equals(pipe.to_arrow()), kind
        same_stats(inproc, pipe)
        assert inproc.stats().bytes > 0  # what was read, though the file was not read to its end


@pytest.mark.parametrize(("status", "code"), [("3", 3), ("-1", 255), ("'no more'", 1)])
def test_sys_exit_with_a_failing_status_is_a_reader_error(tmp_path, status, code):
    """As a pipe command that exits with that status: the load fails, naming
    the file and the input line (re-raised as it was, the SystemExit ended
    the loading process with no word of where)."""
    script = tmp_path / "reader.py"
    script.write_text(EXITS.replace("{status}", status))
    data = tmp_path / "data.txt"
    data.write_text("".join(f"{i}\n" for i in range(6)))
    with pytest.raises(ReaderError, match=f"exited with status {code} on {data}") as pipe:
        load(SLOTS, [data], command=f"{PYTHON} {script}", threads=1)
    for kind in ("Reader", "Batched"):
        with pytest.raises(ReaderError) as inproc:
            load(SLOTS, [data], generator=import_reader(script, kind), threads=1)
        assert re.search(rf"{kind} called sys.exit\({re.escape(status)}\) \(exit status {code}\) "
                         rf"on {re.escape(str(data))}; in the .*input line 4", str(inproc.value))
        assert (inproc.value.returncode, inproc.value.path) == (code, str(data))
    assert pipe.value.returncode == code


@pytest.mark.parametrize(("status", "code"), [("0", 0), ("4", 4)])
def test_sys_exit_in_the_readers_init_is_a_process_that_exits_first(tmp_path, status, code):
    """A reader class whose __init__ exits: with status 0 the file has no
    samples, as a pipe command that exits before its first; else a ReaderError."""
    script = tmp_path / "reader.py"
    script.write_text(EXITS.replace("{status}", "0").replace(
        "class Batched(Reader):", f"class Quits(Reader):\n    def __init__(self):\n"
        f"        sys.exit({status})\n\nclass Batched(Reader):"))
    data = tmp_path / "data.txt"
    data.write_text("".join(f"{i}\n" for i in range(6)))
    quits = import_reader(script, "Quits")
    if code == 0:
        loaded = load(SLOTS, [data], generator=quits, threads=1)
        assert (loaded.get_memory_data_size(), loaded.stats().lines) == (0, 0)
    else:
        with pytest.raises(ReaderError, match=rf"Quits called sys.exit\({status}\) "
                                              rf"\(exit status {code}\) on {re.escape(str(data))}"):
            load(SLOTS, [data], generator=quits, threads=1)


def test_closures_and_lambdas_work_and_generate_batch_goes_through_text(tmp_path):
    data = tmp_path / "data.txt"
    data.write_text("".join(f"{i}\n" for i in range(10)))
    offset = 100

    class Batched(MultiSlotDataGenerator):
        make = staticmethod(lambda n: [("ids", [n + offset]), ("label", [n % 2])])

        def generate_sample(self, line):
            return lambda: iter([self.make(int(line))])

        def generate_batch(self, samples):
            return lambda: iter(reversed(samples))

    generator = Batched()
    generator.set_batch(4)
    ds = load(SLOTS, [data], generator=generator)
    ids = ds.to_arrow().column("ids").to_pylist()
    assert ids == [[103], [102], [101], [100], [107], [106], [105], [104], [109], [108]]


def test_interrupting_a_load_leaves_no_worker(tmp_path):
    data = tmp_path / "data.txt"
    data.write_text("1\n" * 4)

    class Slow(MultiSlotDataGenerator):
        def generate_sample(self, line):
            import time

            time.sleep(30)

    pool = InProcessPool([str(data)], Slow, SlotSchema(SLOTS), threads=2)
    calls = []

    def interrupt(_counters):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pool.run(lambda i, c: None, on_progress=interrupt)
    assert child_pids() == []


def test_data_generator_must_be_a_generator():
    ds = InMemoryDataset()
    expected = "'data_generator' setting must be a generators.DataGenerator"
    with pytest.raises(SchemaError, match=expected):
        ds.init(use_var=SLOTS, data_generator=lambda line: line)
