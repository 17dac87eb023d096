"""The parsed-data cache (datafeed/records/cache.py): round trip, zero copy, stale
caches refused."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from support import SMALL_SCHEMA, write_small_files

from datafeed import CacheError, InMemoryDataset, Slot


def dataset(files, **settings) -> InMemoryDataset:
    ds = InMemoryDataset()
    ds.init(batch_size=4, thread_num=2, use_var=SMALL_SCHEMA, progress=False, **settings)
    ds.set_filelist(files)
    return ds


def rewrite_metadata(path: Path, change) -> None:
    """The cache at ``path`` with its fleetfeed metadata passed through
    ``change`` (which edits the dict in place), its batches as they were."""
    import json

    original = pa.ipc.open_file(str(path))
    meta = json.loads(original.schema.metadata[b"fleetfeed.cache"])
    change(meta)
    schema = original.schema.with_metadata({b"fleetfeed.cache": json.dumps(meta).encode()})
    batches = [original.get_batch(i) for i in range(original.num_record_batches)]
    with pa.ipc.new_file(str(path) + ".new", schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    os.replace(str(path) + ".new", path)


@pytest.fixture
def files(tmp_path: Path) -> list[str]:
    return write_small_files(tmp_path, files=3, per_file=7)


def test_save_then_load_gives_the_same_records_batches_and_stats(tmp_path, files):
    source = dataset(files)
    source.load_into_memory()
    path = tmp_path / "records.arrow"
    source.save_cache(path)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []

    loaded = dataset(files)
    loaded.load_cache(path)
    assert loaded.to_arrow().equals(source.to_arrow())
    assert pa.ipc.open_file(path).read_all().equals(source.to_arrow())  # plain Arrow
    for name in ("files", "lines", "records", "bytes", "skipped_lines"):
        assert getattr(loaded.stats(), name) == getattr(source.stats(), name)
    loaded.local_shuffle(seed=3)  # the mapped columns shuffle like any others
    source.local_shuffle(seed=3)
    assert loaded.to_arrow().equals(source.to_arrow())
    assert loaded.get_memory_data_size() == 21
    pytest.importorskip("torch", reason="batches are torch tensors")  # make smoke-oldest
    got = [{k: v.tolist() if hasattr(v, "tolist") else v for k, v in b.items()} for b in loaded]
    want = [{k: v.tolist() if hasattr(v, "tolist") else v for k, v in b.items()} for b in source]
    assert repr(got) == repr(want)


def test_loaded_columns_are_writable_views_of_the_mapping(tmp_path, files):
    source = dataset(files)
    source.load_into_memory()
    path = tmp_path / "c.arrow"
    source.save_cache(path)
    loaded = dataset(files)
    loaded.load_cache(path)
    column = loaded._store.chunks[0].columns[1]  # sparse ids
    assert column.values.base is not None and column.values.flags.writeable
    assert not column.values.flags.owndata
    # Uniform sparse columns come back without offsets, as the parser gives them.
    widths = [c.offsets is None for c in loaded._store.chunks[0].columns]
    assert widths == [c.offsets is None for c in source._store.chunks[0].columns]


def test_cache_setting_writes_once_then_loads_from_the_cache(tmp_path, files):
    path, ran = tmp_path / "auto.arrow", tmp_path / "ran"
    command = f"cat && touch {ran}"  # leaves a mark each time it runs
    first = dataset(files, cache=str(path), pipe_command=command)
    first.load_into_memory()
    assert path.exists() and ran.exists()
    ran.unlink()
    second = dataset(files, cache=str(path), pipe_command=command)
    second.load_into_memory()
    assert second.to_arrow().equals(first.to_arrow()) and not ran.exists()  # never run


def test_a_cache_made_by_another_reader_is_refused(tmp_path, files):
    path = tmp_path / "c.arrow"
    made = dataset(files, pipe_command="cat")
    made.load_into_memory()
    made.save_cache(path)
    for settings, change in [
        # Another reader than cat reads whole files (split_files), as Paddle.
        ({"pipe_command": "grep -v x"},
         "pipe_command 'cat' -> 'grep -v x'; split_files True -> False"),
        ({"split_files": False}, "split_files True -> False"),
        ({"on_bad_line": "skip"}, "on_bad_line 'raise' -> 'skip'"),
        ({"max_line_bytes": 1024}, "max_line_bytes 67108864 -> 1024"),
    ]:
        with pytest.raises(CacheError, match="its records were made with other reader "
                           rf"settings \({re.escape(change)}\)"):
            dataset(files, **settings).load_cache(path)
    dataset(files, pipe_command="cat").load_cache(path)  # the same reader: loaded
    # A cache written before the reader settings were recorded cannot be trusted.
    rewrite_metadata(path, lambda meta: meta.pop("reader"))
    with pytest.raises(CacheError, match="does not record the reader settings"):
        dataset(files, pipe_command="cat").load_cache(path)


def test_a_changed_source_is_refused(tmp_path, files):
    path = tmp_path / "c.arrow"
    ds = dataset(files)
    ds.load_into_memory()
    ds.save_cache(path)
    with open(files[1], "a") as out:
        out.write("3 1 2 3 1 5 1 0 1 1\n")
    stale = (
        rf"stale cache .*c.arrow: source {files[1]} "
        r"changed since the cache was made \(size \d+ -> \d+ bytes"
    )
    with pytest.raises(CacheError, match=stale):
        dataset(files).load_cache(path)
    last = dataset(files[2:])
    last.load_into_memory()
    last.save_cache(path)
    os.utime(files[2], ns=(0, 0))  # the same size but another mtime is stale too
    same_size = r"changed since the cache was made \(size (\d+) -> \1 bytes, mtime"
    with pytest.raises(CacheError, match=same_size):
        dataset(files[2:]).load_cache(path)


def test_other_slots_or_files_are_refused(tmp_path, files):
    path = tmp_path / "c.arrow"
    ds = dataset(files)
    ds.load_into_memory()
    ds.save_cache(path)
    other = InMemoryDataset()
    other.init(use_var=[Slot("dense", "float32", (3,)), Slot("ids", "int64")], progress=False)
    other_slots = (
        r"it holds slots \[dense:float32:3, ids:uint64, .*\] "
        r"but use_var declares \[dense:float32:3, ids:int64\]"
    )
    with pytest.raises(CacheError, match=other_slots):
        other.load_cache(path)
    other_files = "another file list .*cached files not in the filelist: .*part-2.txt"
    with pytest.raises(CacheError, match=other_files):
        dataset(files[:2]).load_cache(path)
    with pytest.raises(CacheError, match="the same files in another order"):
        dataset(list(reversed(files))).load_cache(path)
    os.unlink(files[0])
    with pytest.raises(CacheError, match="part-0.txt no longer exists"):
        dataset([]).load_cache(path)


def test_not_a_cache_is_refused(tmp_path, files):
    junk = tmp_path / "junk.arrow"
    junk.write_bytes(b"not arrow at all")
    with pytest.raises(CacheError, match="is not an Arrow IPC file"):
        dataset(files).load_cache(junk)
    plain = tmp_path / "plain.arrow"
    table = pa.table({"x": np.arange(3)})
    with pa.ipc.new_file(str(plain), table.schema) as writer:
        writer.write_table(table)
    with pytest.raises(CacheError, match="not a fleetfeed cache"):
        dataset(files).load_cache(plain)


def test_a_failed_write_leaves_no_file(tmp_path, files, monkeypatch):
    ds = dataset(files)
    ds.load_into_memory()
    path = tmp_path / "c.arrow"

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError, match="disk full"):
        ds.save_cache(path)
    assert list(tmp_path.glob("*.arrow")) == [] and list(tmp_path.glob(".*tmp")) == []


def test_a_corrupt_cache_is_refused_not_trusted(tmp_path, files):
    source = dataset(files)
    source.load_into_memory()
    path = tmp_path / "records.arrow"
    source.save_cache(str(path))
    # Make the second offset of the "ids" column jump backwards: still inside the
    # values, so only a full validation notices; trusted, it would misplace records.
    data = bytearray(path.read_bytes())
    base = pa.py_buffer(bytes(data))  # same bytes, to locate the buffer by address
    reader = pa.ipc.open_file(base)
    column = reader.get_batch(0).column("ids")
    position = column.buffers()[1].address - base.address + 4 * (column.offset + 1)
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int32)
    data[position : position + 4] = np.int32(offsets[column.offset + 3] + 1).tobytes()
    path.write_bytes(bytes(data))

    loaded = dataset(files)
    with pytest.raises(CacheError, match=r"is corrupt: record batch 0"):
        loaded.load_cache(str(path))
    assert loaded.get_memory_data_size() == 0


def test_a_cache_with_other_column_types_is_refused(tmp_path, files):
    source = dataset(files)
    source.load_into_memory()
    path = tmp_path / "records.arrow"
    source.save_cache(str(path))
    other = [
        Slot(s.name, "float32" if s.name == "signed" else s.dtype, s.shape) for s in SMALL_SCHEMA
    ]
    loaded = InMemoryDataset()
    loaded.init(batch_size=4, use_var=other, progress=False)
    loaded.set_filelist(files)
    with pytest.raises(CacheError):
        loaded.load_cache(str(path))


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_a_compressed_cache_with_the_original_metadata_is_refused(tmp_path, files, codec):
    """pyarrow decompresses such a file into memory outside the mapping: before
    this was refused, the columns came back empty (IndexError when iterated, a
    crash in local_shuffle)."""
    source = dataset(files)
    source.load_into_memory()
    path = tmp_path / "records.arrow"
    source.save_cache(str(path))
    original = pa.ipc.open_file(str(path))
    batches = [original.get_batch(i) for i in range(original.num_record_batches)]
    options = pa.ipc.IpcWriteOptions(compression=codec)
    with pa.ipc.new_file(str(path) + ".new", original.schema, options=options) as writer:
        for batch in batches:  # the same schema, metadata and batches, compressed
            writer.write_batch(batch)
    os.replace(str(path) + ".new", path)
    assert pa.ipc.open_file(str(path)).read_all().equals(source.to_arrow())  # Arrow reads it

    loaded = dataset(files)
    with pytest.raises(CacheError) as refused:
        loaded.load_cache(str(path))
    message = str(refused.value)
    assert str(path) in message
    assert "message 1 is a compressed record batch, expected uncompressed Arrow IPC" in message
    assert loaded.get_memory_data_size() == 0


def test_buffers_outside_the_file_are_refused(tmp_path, files):
    """The check behind the one above, alone: a batch whose buffers are not in
    the mapped file (here: read from a copy) is refused, naming the column."""
    from datafeed.records.arrow import batch_problem

    source = dataset(files)
    source.load_into_memory()
    batch = source.to_arrow().to_batches()[0]
    elsewhere = np.zeros(64, np.uint8)
    problem = batch_problem(batch, (elsewhere.ctypes.data, elsewhere.nbytes))
    assert problem is not None and "column 'dense' has a buffer outside the bytes read" in problem
    assert batch_problem(batch) is None


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda meta: meta.update(uniform_widths=[]), "has uniform_widths for 0 record batches"),
        (lambda meta: meta.update(records=meta["records"] + 1), "its metadata says 22 records"),
        (lambda meta: meta.update(sources=[{"path": 3}]), "has a source {'path': 3}"),
        (lambda meta: meta.update(per_file=[{"nonsense": 1}]), "malformed metadata"),
        (lambda meta: meta.update(slots="dense"), "has 'slots' = 'dense', expected a list"),
    ],
)
def test_malformed_metadata_is_a_cache_error(tmp_path, files, change, says):
    source = dataset(files)
    source.load_into_memory()
    path = tmp_path / "records.arrow"
    source.save_cache(str(path))
    rewrite_metadata(path, change)
    with pytest.raises(CacheError, match="is corrupt") as refused:
        dataset([]).load_cache(str(path))
    assert says in str(refused.value) and str(path) in str(refused.value)


def test_metadata_that_is_not_json_is_a_cache_error(tmp_path, files):
    table = pa.table({"x": np.arange(3)})
    path = tmp_path / "c.arrow"
    schema = table.schema.with_metadata({b"fleetfeed.cache": b"{not json"})
    with pa.ipc.new_file(str(path), schema) as writer:
        writer.write_table(table)
    with pytest.raises(CacheError, match="has metadata that is not JSON"):
        dataset(files).load_cache(str(path))


def test_a_cache_made_before_the_readers_code_changed_is_refused(tmp_path, files, monkeypatch):
    # The command's files, named relative to the working directory as users do.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "filter.sh").write_text("cat\n")
    (tmp_path / "conf.txt").write_text("a\n")
    command = "sh filter.sh --conf=conf.txt"
    made = dataset(files, pipe_command=command)
    made.load_into_memory()
    made.save_cache("c.arrow")
    dataset(files, pipe_command=command).load_cache("c.arrow")  # nothing changed: loaded
    (tmp_path / "filter.sh").write_text("grep -v '^3 '\n")  # fewer records from now on
    with pytest.raises(CacheError, match=r"other reader settings \(the reader's code: "
                       r"file filter.sh changed since\)"):
        dataset(files, pipe_command=command).load_cache("c.arrow")
    (tmp_path / "filter.sh").write_text("cat\n")
    (tmp_path / "conf.txt").write_text("b\n")  # what follows "=" is read too
    with pytest.raises(CacheError, match=r"file conf.txt changed since"):
        dataset(files, pipe_command=command).load_cache("c.arrow")
    (tmp_path / "conf.txt").write_text("a\n")
    dataset(files, pipe_command=command).load_cache("c.arrow")  # the same bytes again: loaded
    # The target of an output redirection is the command's output, not its code.
    logged = f"{command} 2>> reader.log"
    (tmp_path / "reader.log").write_text("old\n")
    made = dataset(files, pipe_command=logged)
    made.load_into_memory()
    made.save_cache("c.arrow")
    (tmp_path / "reader.log").write_text("new\n")
    dataset(files, pipe_command=logged).load_cache("c.arrow")


def test_files_the_readers_write_are_not_their_code(tmp_path, files, monkeypatch, caplog):
    # A log the command names as a word changes while the readers run, so it
    # is their output (said in a warning); one that tee writes is never read.
    # A later load that writes the log again does not make the cache stale.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "filter.sh").write_text('cat; echo "$$" >> "${1#--log=}"\n')
    (tmp_path / "run.log").write_text("")
    (tmp_path / "out.log").write_text("")
    for command, warned in [("sh filter.sh --log=run.log", True),
                            ("sh filter.sh /dev/null | tee -a out.log", False)]:
        caplog.clear()
        with caplog.at_level("WARNING", logger="datafeed"):
            dataset(files, pipe_command=command, cache="c.arrow").load_into_memory()
        said = "changed while the readers ran: taken as their output"
        assert (said in caplog.text) == warned, caplog.text
        assert ("file run.log changed" in caplog.text) == warned
        dataset(files, pipe_command=command).load_into_memory()  # writes the log again
        dataset(files, pipe_command=command).load_cache("c.arrow")
        (tmp_path / "filter.sh").write_text('cat; echo "$$" >> "${1#--log=}" # edited\n')
        with pytest.raises(CacheError, match="file filter.sh changed since"):
            dataset(files, pipe_command=command).load_cache("c.arrow")
        (tmp_path / "filter.sh").write_text('cat; echo "$$" >> "${1#--log=}"\n')
        os.unlink("c.arrow")
    assert len((tmp_path / "out.log").read_text()) > 0


@pytest.mark.parametrize("command, word", [
    ("cd sub && sh filter.sh", "filter.sh"),  # relative to the cd
    ("sh -c 'sh sub/filter.sh'", "sub/filter.sh"),  # a shell's script
    ("sh $READER_DIR/filter.sh", "$READER_DIR/filter.sh"),  # a variable
])
def test_the_readers_file_is_found_as_the_shell_finds_it(tmp_path, files, monkeypatch,
                                                          command, word):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("READER_DIR", str(tmp_path / "sub"))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "filter.sh").write_text("cat\n")
    (tmp_path / "filter.sh").write_text("cat\n")  # a decoy where the words alone point
    made = dataset(files, pipe_command=command)
    made.load_into_memory()
    made.save_cache("c.arrow")
    (tmp_path / "sub" / "filter.sh").write_text("grep -v '^3 '\n")
    with pytest.raises(CacheError, match=rf"file {re.escape(word)} changed since"):
        dataset(files, pipe_command=command).load_cache("c.arrow")


def test_a_command_whose_code_cannot_be_seen_is_named_in_a_warning(
    tmp_path, files, monkeypatch, caplog
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "echo_reader.py").write_text("import sys\nsys.stdout.write(sys.stdin.read())\n")
    made = dataset(files, pipe_command=f"{sys.executable} -m echo_reader")
    made.load_into_memory()
    with caplog.at_level("WARNING", logger="datafeed"):
        made.save_cache(tmp_path / "c.arrow")
    assert "cannot see the code of the command" in caplog.text and "-m echo_reader" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="datafeed"):
        dataset(files, pipe_command=f"{sys.executable} -m echo_reader").load_into_memory()
        inline = dataset(files, pipe_command="grep -v x")  # its code is its text
        inline.load_into_memory()
        inline.save_cache(tmp_path / "d.arrow")
    assert caplog.text == ""  # a load without a cache says nothing


def test_a_reader_edited_while_it_ran_leaves_no_cache(tmp_path, files, monkeypatch, caplog):
    # The records may come from either version: a cache made of them would
    # hide the edit, and a later check could not tell.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "filter.sh").write_text("cat; echo '# touched' >> filter.sh\n")  # edits itself
    with caplog.at_level("WARNING", logger="datafeed"):
        ds = dataset(files, pipe_command="sh filter.sh", cache="c.arrow")
        ds.load_into_memory()
    assert ds.get_memory_data_size() == 21 and not (tmp_path / "c.arrow").exists()
    assert "no cache written to c.arrow: file filter.sh changed while the readers ran" \
        in caplog.text
    with pytest.raises(CacheError, match="save_cache: file filter.sh changed while the "
                       "readers ran, so the records in memory may come from either version"):
        ds.save_cache("c.arrow")


def test_a_save_records_the_reader_its_records_came_from(tmp_path, files, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "filter.sh").write_text('cat; echo "$$" >> run.log\n')
    (tmp_path / "run.log").write_text("")
    made = dataset(files, pipe_command="sh filter.sh run.log", cache="c.arrow")
    made.load_into_memory()  # run.log changed: the readers' output, left out
    dataset(files, pipe_command="sh filter.sh run.log").load_into_memory()
    # A cache loaded then saved again records what the first one did, not the
    # log as it is now (which would refuse the copy at the next run).
    copy = dataset(files, pipe_command="sh filter.sh run.log")
    copy.load_cache("c.arrow")
    copy.save_cache("d.arrow")
    dataset(files, pipe_command="sh filter.sh run.log").load_into_memory()
    dataset(files, pipe_command="sh filter.sh run.log").load_cache("d.arrow")
    # A setting changed after the load did not make the records in memory.
    other = dataset(files, pipe_command="cat")
    other.load_into_memory()
    other.set_pipe_command("grep -v x")
    other.save_cache("e.arrow")
    with pytest.raises(CacheError, match="pipe_command 'cat' -> 'grep -v x'"):
        dataset(files, pipe_command="grep -v x").load_cache("e.arrow")
    dataset(files, pipe_command="cat").load_cache("e.arrow")


GENERATOR_MODULE = '''
from generators import MultiSlotDataGenerator

SCALE = 1.0


class Reader(MultiSlotDataGenerator):
    def generate_sample(self, line):
        def sample():
            fields = [int(x) for x in line.split()]
            yield [("dense", [SCALE * fields[0]] * 3), ("ids", [fields[1]]),
                   ("signed", [fields[2]]), ("label", [fields[3]])]
        return sample
'''


def test_a_cache_made_before_the_generators_module_changed_is_refused(tmp_path, monkeypatch):
    import importlib

    lines = tmp_path / "in.txt"
    lines.write_text("".join(f"{i} {i * 10} {-i} {i % 2}\n" for i in range(9)))
    (tmp_path / "cached_reader.py").write_text(GENERATOR_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "cached_reader", raising=False)
    reader = importlib.import_module("cached_reader").Reader
    made = dataset([str(lines)], data_generator=reader)
    made.load_into_memory()
    made.save_cache(tmp_path / "c.arrow")
    dataset([str(lines)], data_generator=reader()).load_cache(tmp_path / "c.arrow")  # same code
    # An edit the class does not read (the rest of a training script) is not its code.
    (tmp_path / "cached_reader.py").write_text(GENERATOR_MODULE + "\nLEARNING_RATE = 0.1\n")
    dataset([str(lines)], data_generator=reader).load_cache(tmp_path / "c.arrow")
    # A module-level constant the class reads changes the records.
    (tmp_path / "cached_reader.py").write_text(GENERATOR_MODULE.replace("1.0", "2.0"))
    reloaded = importlib.reload(sys.modules["cached_reader"]).Reader
    with pytest.raises(CacheError, match=r"the reader's code: class cached_reader.Reader "
                       r"changed since"):
        dataset([str(lines)], data_generator=reloaded).load_cache(tmp_path / "c.arrow")
    # So does its own source, read as Python holds it.
    (tmp_path / "cached_reader.py").write_text(GENERATOR_MODULE.replace("[fields[1]]",
                                                                        "[fields[1] + 1]"))
    reloaded = importlib.reload(sys.modules["cached_reader"]).Reader
    with pytest.raises(CacheError, match=r"class cached_reader.Reader changed since"):
        dataset([str(lines)], data_generator=reloaded).load_cache(tmp_path / "c.arrow")


def test_a_cache_made_when_every_reader_split_large_files_is_stale_for_others(tmp_path, files):
    # Before split_files, a reader that treats lines together (one skipping a
    # header) lost records at the byte-range cuts: its cache is refused.
    for command, refused in [("cat", False), ("grep -v x", True)]:
        path = tmp_path / f"{refused}.arrow"
        made = dataset(files, pipe_command=command)
        made.load_into_memory()
        made.save_cache(path)
        rewrite_metadata(path, lambda meta: meta["reader"].pop("split_files"))
        if refused:
            with pytest.raises(CacheError, match="split_files True -> False"):
                dataset(files, pipe_command=command).load_cache(path)
        else:
            dataset(files, pipe_command=command).load_cache(path)


def test_a_cache_that_does_not_record_the_readers_code_loads_with_a_warning(
    tmp_path, files, caplog
):
    path = tmp_path / "c.arrow"
    made = dataset(files)
    made.load_into_memory()
    made.save_cache(path)
    rewrite_metadata(path, lambda meta: meta["reader"].pop("reader_code"))
    with caplog.at_level("WARNING", logger="datafeed"):
        loaded = dataset(files)
        loaded.load_cache(path)
    assert loaded.to_arrow().equals(made.to_arrow())
    assert "does not record its reader's code" in caplog.text
    # Its other settings are still checked.
    with pytest.raises(CacheError, match="on_bad_line 'raise' -> 'skip'"):
        dataset(files, on_bad_line="skip").load_cache(path)


TRAINING_SCRIPT = '''
import sys
from datafeed import InMemoryDataset, Slot
from generators import MultiSlotDataGenerator

LEARNING_RATE = 0.01  # the rest of a training script
SCALE = 1.0


def scaled(x):
    return [SCALE * x] * 3


class Reader(MultiSlotDataGenerator):
    def generate_sample(self, line):
        def sample():
            fields = [int(x) for x in line.split()]
            yield [("dense", scaled(fields[0])), ("ids", [fields[1]]),
                   ("signed", [fields[2]]), ("label", [fields[3]])]
        return sample


ds = InMemoryDataset()
ds.init(batch_size=4, thread_num=1, use_var=[
    Slot("dense", "float32", (3,)), Slot("ids", "uint64"), Slot("signed", "int64"),
    Slot("label", "int64", (1,))], data_generator=Reader, cache="c.arrow", progress=False)
ds.set_filelist(["in.txt"])
ds.load_into_memory()
print(ds.get_memory_data_size(), LEARNING_RATE)
'''


def test_a_generator_in_the_training_script_is_checked_by_what_it_reads(tmp_path):
    (tmp_path / "in.txt").write_text("".join(f"{i} {i * 10} {-i} {i % 2}\n" for i in range(5)))
    script = tmp_path / "train.py"

    def run(text: str):
        script.write_text(text)
        return subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)

    assert run(TRAINING_SCRIPT).stdout.split() == ["5", "0.01"]  # loaded, cache written
    assert (tmp_path / "c.arrow").exists()
    edited = run(TRAINING_SCRIPT.replace("0.01", "0.02"))  # not the reader's code
    assert edited.returncode == 0 and edited.stdout.split() == ["5", "0.02"], edited.stderr
    # A helper function or constant the class reads is its code.
    for change in [("SCALE = 1.0", "SCALE = 2.0"), ("[SCALE * x] * 3", "[SCALE * x + 1] * 3")]:
        stale = run(TRAINING_SCRIPT.replace(*change))
        assert stale.returncode == 1
        assert "class __main__.Reader changed since" in stale.stderr, stale.stderr


def test_a_load_cache_on_top_of_records_a_pass_went_over_is_said(tmp_path, files, caplog):
    pytest.importorskip("torch", reason="a pass hands out torch tensors")  # make smoke-oldest
    ds = dataset(files, cache=str(tmp_path / "c.arrow"))
    ds.load_into_memory()  # writes the cache
    list(ds)
    with caplog.at_level("WARNING", logger="datafeed"):
        ds.load_cache(tmp_path / "c.arrow")  # with the cache setting, called directly
    assert "load_cache appends to the 21 records in memory" in caplog.text


def test_a_resume_from_a_cache_saved_after_a_shuffle_is_refused(tmp_path, files):
    # The cache holds the shuffled order, and load_state_dict replays the
    # state's shuffles on records as loaded: the resumed batches repeated a
    # quarter of the records and skipped as many, without a word.
    pytest.importorskip("torch", reason="batches are torch tensors")
    from datafeed import StateError

    def records(batches) -> list:
        return sorted(repr(b["label"].tolist()) + repr(b["dense"].tolist()) for b in batches)

    for save_after_shuffle in (True, False):
        path = tmp_path / f"records-{save_after_shuffle}.arrow"
        source = dataset(files)
        source.load_into_memory()
        if not save_after_shuffle:
            source.save_cache(path)
        source.local_shuffle(seed=1)
        if save_after_shuffle:
            source.save_cache(path)
        batches = iter(source)
        seen = [next(batches) for _ in range(2)]
        saved_state = source.state_dict()
        rest = list(batches)
        resumed = dataset(files)
        resumed.load_cache(path)
        if save_after_shuffle:
            with pytest.raises(StateError, match=r"come from a cache saved after 1 shuffle"):
                resumed.load_state_dict(saved_state)
            # Saved again, the records still carry the shuffle that ordered them.
            resumed.save_cache(tmp_path / "again.arrow")
            again = dataset(files)
            again.load_cache(tmp_path / "again.arrow")
            with pytest.raises(StateError, match=r"saved after 1 shuffle"):
                again.load_state_dict(saved_state)
            # A state taken on records of that cache resumes on them.
            first, second = dataset(files), dataset(files)
            first.load_cache(path)
            cached_batches = iter(first)
            next(cached_batches)
            taken = first.state_dict()
            second.load_cache(path)
            second.load_state_dict(taken)
            assert records(second) == records(cached_batches)
            continue
        resumed.load_state_dict(saved_state)
        assert records(resumed) == records(rest) and len(rest) + len(seen) == 6
