"""InMemoryDataset, QueueDataset and DatasetFactory, end to end on real files and commands."""

from __future__ import annotations

import os
import signal
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from support import PYTHON, SMALL_SCHEMA, small_record, write_small_files

from datafeed import (
    DatasetFactory,
    InMemoryDataset,
    ParseError,
    QueueDataset,
    Ragged,
    ReaderError,
    SchemaError,
    Slot,
)


def make_dataset(cls=InMemoryDataset, **settings) -> InMemoryDataset:
    ds = cls()
    options = {
        "batch_size": 4, "thread_num": 2, "use_var": SMALL_SCHEMA, "pipe_command": "cat",
        "progress": False,
    }
    options.update(settings)
    ds.init(**options)
    return ds


def records_of(ds) -> list[dict]:
    """Every record the dataset yields, as plain Python values, in order."""
    out = []
    for batch in ds:
        columns = {}
        for name in batch:
            value = batch[name]
            if isinstance(value, Ragged):
                columns[name] = value.tolist()
            else:
                columns[name] = value.reshape(batch.size, -1).tolist()
        for i in range(batch.size):
            out.append({name: columns[name][i] for name in columns})
    return out


def expected(indices) -> list[dict]:
    return [small_record(i) for i in indices]


# -- settings -------------------------------------------------------------------


def test_unknown_setting_is_a_type_error_naming_it():
    ds = InMemoryDataset()
    with pytest.raises(TypeError, match=r"unknown setting\(s\) 'bacth_size'"):
        ds.init(bacth_size=4)
    with pytest.raises(TypeError, match="'shuffle_seed'"):
        ds.update_settings(shuffle_seed=1)


@pytest.mark.parametrize(
    "setting, value, message",
    [
        ("batch_size", 0, r"'batch_size' setting must be an int >= 1, got 0"),
        ("thread_num", "2", r"'thread_num' setting must be an int >= 0, got '2'"),
        ("on_bad_line", "ignore", r"'on_bad_line' setting must be 'raise' or 'skip', got 'ignore'"),
        ("input_type", 2, r"'input_type' setting must be 0 \(one record per line\) or 1"),
        ("pipe_command", " ", "must be a shell command"),
    ],
)
def test_bad_setting_values_say_what_was_expected(setting, value, message):
    with pytest.raises(SchemaError, match=message):
        InMemoryDataset().init(**{setting: value})


def test_paddle_style_variables_become_slots(tmp_path):
    variables = [
        SimpleNamespace(name="dense", dtype="float32", shape=[-1, 3], lod_level=0),
        SimpleNamespace(name="ids", dtype="int64", shape=[-1, 1], lod_level=1),
    ]
    ds = InMemoryDataset()
    ds.init(use_var=variables)
    # Paddle's _set_use_var: a sparse int64 variable holds uint64 feature ids.
    assert list(ds.schema) == [Slot("dense", "float32", (3,)), Slot("ids", "uint64")]


def test_duplicate_slot_names_are_rejected():
    with pytest.raises(SchemaError, match="slot name 'a' appears twice"):
        InMemoryDataset().init(use_var=[Slot("a", "int64"), Slot("a", "float32")])


def test_set_filelist_names_every_missing_file(tmp_path, small_files):
    ds = make_dataset()
    missing = [str(tmp_path / "nope-1.txt"), str(tmp_path / "nope-2.txt")]
    with pytest.raises(FileNotFoundError, match="2 of 5 input files do not exist") as info:
        ds.set_filelist(small_files + missing)
    assert missing[0] in str(info.value) and missing[1] in str(info.value)


def test_factory_creates_both_kinds_and_rejects_others():
    assert isinstance(DatasetFactory().create_dataset("InMemoryDataset"), InMemoryDataset)
    assert isinstance(DatasetFactory().create_dataset("QueueDataset"), QueueDataset)
    with pytest.raises(ValueError, match="datafeed class 'FooDataset' does not exist"):
        DatasetFactory().create_dataset("FooDataset")


# -- loading ----------------------------------------------------------------------


@pytest.mark.parametrize("thread_num", [1, 2, 3])
def test_load_keeps_every_record_in_file_order(tmp_path, thread_num):
    paths = write_small_files(tmp_path, files=5, per_file=7)
    ds = make_dataset(thread_num=thread_num)
    ds.set_filelist(paths)
    ds.load_into_memory()
    assert ds.get_memory_data_size() == 35
    assert records_of(ds) == expected(range(35))
    stats = ds.stats()
    assert (stats.files, stats.lines, stats.records, stats.skipped_lines) == (5, 35, 35, 0)
    assert stats.bytes == sum(os.path.getsize(p) for p in paths)
    assert [f.records for f in stats.per_file] == [7] * 5


def test_gzip_files_are_decompressed_before_the_command(tmp_path):
    paths = write_small_files(tmp_path, files=2, per_file=4, gz=True)
    for command in ("cat", "cat | cat"):
        ds = make_dataset(pipe_command=command)
        ds.set_filelist(paths)
        ds.load_into_memory()
        assert records_of(ds) == expected(range(8))


def test_a_python_generator_as_pipe_command(tmp_path):
    reader = tmp_path / "reader.py"
    reader.write_text(
        textwrap.dedent(
            """
            from generators import MultiSlotDataGenerator

            class Reader(MultiSlotDataGenerator):
                def generate_sample(self, line):
                    def records():
                        a, b = line.split()
                        yield [("x", [float(a)]), ("ids", [int(b), int(b) + 1])]
                    return records

            Reader().run_from_stdin()
            """
        )
    )
    data = tmp_path / "in.txt"
    data.write_text("".join(f"{i * 0.5} {i}\n" for i in range(100)))
    ds = InMemoryDataset()
    ds.init(batch_size=32, use_var=[Slot("x", "float32", (1,)), Slot("ids", "uint64")],
            pipe_command=f"{PYTHON} {reader}", progress=False)
    ds.set_filelist([str(data)])
    ds.load_into_memory()
    table = ds.to_arrow()
    assert table.column("x").to_pylist() == [[i * 0.5] for i in range(100)]
    assert table.column("ids").to_pylist() == [[i, i + 1] for i in range(100)]


def test_load_appends_and_release_memory_empties(small_files):
    ds = make_dataset()
    ds.set_filelist(small_files)
    ds.load_into_memory()
    ds.load_into_memory()
    assert ds.get_memory_data_size() == 30
    ds.release_memory()
    assert ds.get_memory_data_size() == 0
    with pytest.raises(RuntimeError, match="no records in memory; call load_into_memory"):
        list(ds)


def test_a_load_on_top_of_records_a_pass_went_over_is_said(small_files, caplog):
    # A pass loop that forgot release_memory() trains every earlier day again.
    ds = make_dataset()
    ds.set_filelist(small_files)
    with caplog.at_level("WARNING", logger="datafeed"):
        ds.load_into_memory()
        ds.load_into_memory()  # two loads make one pass's data: nothing said
        assert caplog.text == ""
        list(ds)  # a pass
        ds.load_into_memory()
    assert "load_into_memory appends to the 30 records in memory, which a pass already " \
        "went over; call release_memory() first" in caplog.text
    assert ds.get_memory_data_size() == 45  # appended all the same, as documented
    caplog.clear()
    with caplog.at_level("WARNING", logger="datafeed"):
        ds.release_memory()
        ds.load_into_memory()
        list(ds)
        ds.release_memory()
        ds.load_into_memory()
    assert caplog.text == ""


def test_zeros_are_kept(tmp_path):
    path = tmp_path / "zeros.txt"
    path.write_text("3 0 0 0 1 0.0\n")
    ds = InMemoryDataset()
    ds.init(use_var=[Slot("ids", "uint64"), Slot("w", "float32")], progress=False)
    ds.set_filelist([str(path)])
    ds.load_into_memory()
    assert ds.to_arrow().to_pylist() == [{"ids": [0, 0, 0], "w": [0.0]}]


# -- failures ---------------------------------------------------------------------


def test_failing_command_is_a_reader_error_and_loads_nothing(small_files):
    ds = make_dataset()
    ds.set_filelist(small_files)
    ds.load_into_memory()
    ds.update_settings(pipe_command="echo 'reader broke: bad input' >&2; exit 3")
    with pytest.raises(ReaderError) as info:
        ds.load_into_memory()
    error = info.value
    assert error.returncode == 3
    assert error.path in small_files
    assert error.command.startswith("echo 'reader broke")
    assert "reader broke: bad input" in error.stderr_tail
    assert "exited with status 3" in str(error) and error.path in str(error)
    assert ds.get_memory_data_size() == 15  # the earlier load is intact


def test_command_killed_by_a_signal(small_files):
    ds = make_dataset(pipe_command="cat; kill -KILL $$")
    ds.set_filelist(small_files)
    with pytest.raises(ReaderError, match="killed by signal SIGKILL") as info:
        ds.load_into_memory()
    assert info.value.returncode == -signal.SIGKILL
    assert ds.get_memory_data_size() == 0


def test_generator_crash_midway_is_a_reader_error_not_a_parse_error(tmp_path, small_files):
    # The crash leaves a half-written last line: the exit status must win.
    reader = tmp_path / "crash.py"
    reader.write_text(
        "import sys\n"
        "sys.stdout.write(sys.stdin.readline())\n"
        "sys.stdout.write('3 1.0 2.0')\n"
        "sys.stdout.flush()\n"
        "raise RuntimeError('generator crashed on purpose')\n"
    )
    ds = make_dataset(pipe_command=f"{PYTHON} {reader}")
    ds.set_filelist(small_files[:1])
    with pytest.raises(ReaderError, match="exited with status 1") as info:
        ds.load_into_memory()
    assert "RuntimeError: generator crashed on purpose" in info.value.stderr_tail


def test_a_pipe_readers_own_error_names_the_input_line_and_the_file(tmp_path, small_files):
    # The in-process path notes the line on the error itself; a pipe command's
    # ReaderError finds it in the note under the generator's traceback.
    reader = tmp_path / "fails_on_line_3.py"
    reader.write_text(textwrap.dedent("""\
        from generators import MultiSlotDataGenerator

        class Reader(MultiSlotDataGenerator):
            lines = 0

            def generate_sample(self, line):
                self.lines += 1
                if self.lines == 3:
                    raise ValueError("cannot read this line")
                return lambda: iter([[("dense", [1.0, 2.0, 3.0]), ("ids", [1]),
                                      ("signed", [1]), ("label", [0])]])

        Reader().run_from_stdin()
    """))
    ds = make_dataset(pipe_command=f"{PYTHON} {reader}", thread_num=1)
    ds.set_filelist(small_files[:1])
    with pytest.raises(ReaderError) as info:
        ds.load_into_memory()
    message = str(info.value)
    headline = message.partition(";")[0]
    assert headline == (
        f"command '{PYTHON} {reader}' exited with status 1 on {small_files[0]}, "
        "in the samples of input line 3"
    )
    assert "ValueError: cannot read this line" in message


def test_parse_error_names_file_line_and_slot(tmp_path, small_files):
    bad = tmp_path / "bad.txt"
    bad.write_text("3 1 2 3 1 7 1 0 1 1\n3 1 2 3 1 x 1 0 1 1\n")
    ds = make_dataset()
    ds.set_filelist(small_files + [str(bad)])
    with pytest.raises(ParseError) as info:
        ds.load_into_memory()
    error = info.value
    assert (error.line, error.slot) == (2, "ids")
    assert str(bad) in error.source and str(bad) in str(error)
    assert ds.get_memory_data_size() == 0


def test_skip_mode_counts_every_skipped_line(tmp_path):
    bad = tmp_path / "mixed.txt"
    bad.write_text(
        "3 1 2 3 1 7 1 0 1 1\n"      # good
        "3 1 2 3 1 x 1 0 1 1\n"      # bad value
        "\n"                         # blank line
        "3 1 2 3 1 8 1 0 1 0\n"      # good
        "3 1 2 3 1 9 1 0 1 0 5\n"    # extra token
    )
    ds = make_dataset(on_bad_line="skip")
    ds.set_filelist([str(bad)])
    ds.load_into_memory()
    stats = ds.stats()
    assert (stats.lines, stats.records, stats.skipped_lines) == (5, 2, 3)
    assert sum(stats.skipped_reasons.values()) == 3
    assert ds.to_arrow().column("ids").to_pylist() == [[7], [8]]


def test_preload_surfaces_errors_in_wait(small_files):
    ds = make_dataset()
    ds.set_filelist(small_files)
    ds.preload_into_memory()
    ds.wait_preload_done()
    assert ds.get_memory_data_size() == 15
    ds.update_settings(pipe_command="exit 7")
    ds.preload_into_memory(thread_num=1)
    with pytest.raises(ReaderError, match="exited with status 7"):
        ds.wait_preload_done()
    assert ds.get_memory_data_size() == 15


def test_a_failure_stops_the_other_readers_promptly(tmp_path, small_files):
    # One command hangs forever, another fails: the load must fail, not hang.
    slow = tmp_path / "slow.txt"
    slow.write_text("hang\n")
    ds = make_dataset(pipe_command='if grep -q hang; then sleep 600; else exit 5; fi', thread_num=2)
    ds.set_filelist([str(slow), small_files[0]])
    with pytest.raises(ReaderError, match="exited with status 5"):
        ds.load_into_memory()


# -- shuffling ----------------------------------------------------------------------


def loaded(tmp_path, **settings) -> InMemoryDataset:
    paths = write_small_files(tmp_path, files=3, per_file=20)
    ds = make_dataset(**settings)
    ds.set_filelist(paths)
    ds.load_into_memory()
    return ds


def test_local_shuffle_is_a_reproducible_permutation(tmp_path):
    a, b = loaded(tmp_path), loaded(tmp_path)
    a.local_shuffle(seed=42)
    b.local_shuffle(seed=42)
    order_a, order_b = records_of(a), records_of(b)
    assert order_a == order_b
    assert order_a != expected(range(60))
    assert sorted(order_a, key=lambda r: r["dense"][0]) == expected(range(60))
    assert a.last_shuffle_seed == 42


def test_local_shuffle_reshuffles_every_time_and_follows_the_seed_setting(tmp_path):
    a, b = loaded(tmp_path, seed=7), loaded(tmp_path, seed=7)
    a.local_shuffle()
    first = records_of(a)
    a.local_shuffle()
    assert records_of(a) != first
    b.local_shuffle()
    assert records_of(b) == first  # same seed setting, same sequence of shuffles


def test_unseeded_shuffle_logs_its_seed(tmp_path, caplog):
    ds = loaded(tmp_path)
    with caplog.at_level("INFO", logger="datafeed"):
        ds.local_shuffle()
    assert f"seed {ds.last_shuffle_seed}" in caplog.text


def test_global_shuffle_without_fleet_is_a_local_shuffle(tmp_path):
    a, b = loaded(tmp_path), loaded(tmp_path)
    a.global_shuffle(seed=3)
    b.local_shuffle(seed=3)
    assert records_of(a) == records_of(b)


# -- batches --------------------------------------------------------------------------


def test_batches_have_the_documented_layout(tmp_path):
    ds = loaded(tmp_path, batch_size=8)
    batches = list(ds)
    assert [b.size for b in batches] == [8] * 7 + [4]
    batch = batches[1]  # records 8..15
    assert len(batch) == 4 and list(batch) == ["dense", "ids", "signed", "label"]
    assert batch["dense"].shape == (8, 3) and batch["dense"].dtype == torch.float32
    assert batch["label"].shape == (8, 1) and batch["label"].dtype == torch.int64
    ids = batch["ids"]
    assert isinstance(ids, Ragged)
    assert ids.offsets.dtype == torch.int64 and ids.offsets[0] == 0 and len(ids.offsets) == 9
    assert ids.values.dtype == torch.int64
    assert ids.tolist() == [small_record(i)["ids"] for i in range(8, 16)]
    assert ids.lengths.tolist() == [1 + i % 3 for i in range(8, 16)]
    # EmbeddingBag takes values and offsets[:-1] directly.
    bag = torch.nn.EmbeddingBag(200, 2, mode="sum")
    assert bag(ids.values, ids.offsets[:-1]).shape == (8, 2)


def test_drop_last_drops_the_partial_batch(tmp_path):
    ds = loaded(tmp_path, batch_size=8, drop_last=True)
    assert [b.size for b in ds] == [8] * 7
    assert len(ds) == 7


def test_batches_across_chunk_boundaries_are_exact(tmp_path):
    # 3 files = 3 chunks; batch_size 7 makes batches straddle them.
    ds = loaded(tmp_path, batch_size=7)
    assert records_of(ds) == expected(range(60))


def test_uint64_values_arrive_as_int64_with_the_same_bits(tmp_path):
    path = tmp_path / "big.txt"
    path.write_text(f"2 {2**64 - 1} {2**63}\n1 5\n")
    ds = InMemoryDataset()
    ds.init(batch_size=2, use_var=[Slot("ids", "uint64")], progress=False)
    ds.set_filelist([str(path)])
    ds.load_into_memory()
    (batch,) = list(ds)
    values = batch["ids"].values
    assert values.tolist() == [-1, -(2**63), 5]
    assert values.numpy().view(np.uint64).tolist() == [2**64 - 1, 2**63, 5]


def test_iteration_repeats_for_every_epoch(tmp_path):
    ds = loaded(tmp_path, batch_size=16)
    assert records_of(ds) == records_of(ds) == expected(range(60))


def test_to_arrow_matches_the_batches(tmp_path):
    ds = loaded(tmp_path)
    ds.local_shuffle(seed=5)
    table = ds.to_arrow()
    assert table.num_rows == 60
    assert str(table.schema.field("dense").type) == "fixed_size_list<item: float>[3]"
    assert str(table.schema.field("ids").type) == "list<item: uint64>"
    rows = records_of(ds)
    assert table.column("ids").to_pylist() == [r["ids"] for r in rows]
    assert table.column("dense").to_pylist() == [r["dense"] for r in rows]


# -- QueueDataset -------------------------------------------------------------------------


def test_queue_dataset_streams_every_record(tmp_path):
    paths = write_small_files(tmp_path, files=4, per_file=9)
    ds = make_dataset(QueueDataset, batch_size=5, thread_num=2)
    ds.set_filelist(paths)
    for _ in range(2):  # every pass reads the files anew
        got = records_of(ds)
        assert sorted(got, key=lambda r: r["dense"][0]) == expected(range(36))
        assert ds.stats().records == 36


def test_queue_dataset_refuses_to_shuffle():
    ds = QueueDataset()
    with pytest.raises(NotImplementedError, match="please use InMemoryDataset for local_shuffle"):
        ds.local_shuffle()
    with pytest.raises(NotImplementedError, match="please use InMemoryDataset for global_shuffle"):
        ds.global_shuffle()


def test_queue_dataset_raises_reader_errors(small_files):
    ds = make_dataset(QueueDataset, pipe_command="head -n 2; exit 4")
    ds.set_filelist(small_files)
    with pytest.raises(ReaderError, match="exited with status 4"):
        records_of(ds)


def test_queue_dataset_stopped_early_leaves_nothing_running(tmp_path):
    paths = write_small_files(tmp_path, files=2, per_file=3)
    ds = make_dataset(QueueDataset, batch_size=1, pipe_command="cat; sleep 600")
    ds.set_filelist(paths)
    iterator = iter(ds)
    first = next(iterator)
    assert first.size == 1
    iterator.close()  # the autouse fixture checks that no child process is left


def test_progress_bar_shows_files_lines_and_throughput(tmp_path, capsys):
    paths = write_small_files(tmp_path, files=3, per_file=50)
    ds = make_dataset(progress=True, pipe_command="sleep 0.3; cat", thread_num=1)
    ds.set_filelist(paths)
    ds.load_into_memory()
    err = capsys.readouterr().err
    assert "loading" in err and "/3" in err and "file" in err
    assert "lines=" in err and "MB_s=" in err


def test_no_progress_bar_when_disabled(tmp_path, capsys):
    ds = make_dataset(progress=False)
    ds.set_filelist(write_small_files(tmp_path, files=2, per_file=5))
    ds.load_into_memory()
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("command", ["cat", "cat | cat"])
def test_a_line_longer_than_the_read_buffer(tmp_path, command):
    # 1.2 M ids on one line: ~9 MB, more than the 4 MiB read buffer.
    ids = list(range(1_200_000))
    path = tmp_path / "long.txt"
    path.write_text(f"{len(ids)} " + " ".join(map(str, ids)) + "\n1 7\n")
    ds = InMemoryDataset()
    ds.init(batch_size=2, use_var=[Slot("ids", "uint64")], pipe_command=command, progress=False)
    ds.set_filelist([str(path)])
    ds.load_into_memory()
    (batch,) = list(ds)
    assert batch["ids"].lengths.tolist() == [len(ids), 1]
    assert batch["ids"].values[-2:].tolist() == [len(ids) - 1, 7]


def test_a_line_over_max_line_bytes_is_a_parse_error(tmp_path):
    path = tmp_path / "long.txt"
    path.write_text("3 1 2 3\n" + "1 " + "9" * 5000 + "\n")
    ds = InMemoryDataset()
    ds.init(use_var=[Slot("ids", "uint64")], max_line_bytes=1000, progress=False)
    ds.set_filelist([str(path)])
    with pytest.raises(ParseError, match="line 2") as info:
        ds.load_into_memory()
    assert "1000" in str(info.value)


def test_read_timeout_stops_a_silent_command(small_files):
    import time

    ds = make_dataset(
        pipe_command="head -n 2; echo stuck >&2; sleep 600", read_timeout=2, thread_num=1
    )
    ds.set_filelist(small_files[:1])
    started = time.monotonic()
    with pytest.raises(ReaderError, match=r"wrote no output for 2 s on .*part-0.txt") as info:
        ds.load_into_memory()
    assert time.monotonic() - started < 10
    assert info.value.returncode is None and "stuck" in info.value.stderr_tail
    assert ds.get_memory_data_size() == 0


def test_read_timeout_does_not_stop_a_slow_but_steady_command(small_files):
    ds = make_dataset(pipe_command="while read line; do echo \"$line\"; sleep 0.05; done",
                      read_timeout=2, thread_num=1)
    ds.set_filelist(small_files[:1])
    ds.load_into_memory()
    assert records_of(ds) == expected(range(5))


def test_read_timeout_must_be_positive():
    expected = "'read_timeout' setting must be None or seconds > 0, got 0"
    with pytest.raises(SchemaError, match=expected):
        InMemoryDataset().init(read_timeout=0)


# -- the collector during a load ----------------------------------------------------------


@pytest.mark.parametrize("preload", [False, True])
def test_collections_during_a_load_leave_the_callers_objects_alone(
    tmp_path, preload: bool
) -> None:
    """A collection that runs while records load (forced here: a collection
    every allocation; those of the reader threads are watched) finds the
    objects made before the load frozen, so it never traverses them; after
    the load they are collectable again."""
    import gc
    import threading

    files = write_small_files(tmp_path, files=4, per_file=50)
    callers = [[i] for i in range(20_000)]  # the training script's objects
    frozen_during: list[int] = []

    def record(phase: str, info: dict) -> None:
        if phase == "start" and threading.current_thread().name.startswith("datafeed-reader"):
            frozen_during.append(gc.get_freeze_count())

    ds = InMemoryDataset()
    ds.init(batch_size=4, use_var=SMALL_SCHEMA, thread_num=2)
    ds.set_filelist(files)
    from datafeed.records import memory

    assert gc.get_freeze_count() <= memory._FROZEN_AT_START  # Python 3.12 starts with some
    threshold = gc.get_threshold()
    gc.callbacks.append(record)
    gc.set_threshold(1)
    try:
        if preload:
            ds.preload_into_memory()
            ds.wait_preload_done()
        else:
            ds.load_into_memory()
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(record)
    assert ds.get_memory_data_size() == 200
    assert frozen_during and min(frozen_during) > len(callers)
    assert gc.get_freeze_count() == 0  # unfrozen after the load


def test_a_caller_that_froze_its_objects_keeps_them_frozen(small_files: list[str]) -> None:
    import gc

    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        ds = InMemoryDataset()
        ds.init(batch_size=4, use_var=SMALL_SCHEMA)
        ds.set_filelist(small_files)
        ds.load_into_memory()
        # Still frozen: an unfreeze would empty the permanent generation. (Frozen
        # objects can still die by reference count, so the count may fall.)
        assert 0 < gc.get_freeze_count() <= frozen and gc.get_freeze_count() > frozen // 2
    finally:
        gc.unfreeze()
