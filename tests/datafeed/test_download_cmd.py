"""Paddle's ``download_cmd``: plain paths read through a command that prints the
file, the path appended as one quoted argument, never through a shell's parsing."""

from __future__ import annotations

import gzip
import os
import shlex
import sys
from pathlib import Path

import pytest
from support import SMALL_SCHEMA, small_line

from datafeed import InMemoryDataset, QueueDataset, ReaderError, SchemaError
from datafeed.source.fs import DownloadCommand

# A stand-in for `hadoop fs -cat`: prints ROOT/<path without its scheme>.
FAKE_HADOOP = """
import os, sys
root, path = sys.argv[1], sys.argv[-1]
with open(os.path.join(root, path.split(":", 1)[-1].lstrip("/")), "rb") as f:
    sys.stdout.buffer.write(f.read())
"""


@pytest.fixture
def store(tmp_path: Path) -> tuple[str, list[str], list[str]]:
    """A fake remote store: (download_cmd, paths in it, the lines of each)."""
    root = tmp_path / "store"
    (root / "day").mkdir(parents=True)
    script = tmp_path / "fake_hadoop.py"
    script.write_text(FAKE_HADOOP)
    texts = ["".join(small_line(f * 4 + i) for i in range(4)) for f in range(3)]
    (root / "day" / "part-0").write_text(texts[0])
    (root / "day" / "part-1").write_text(texts[1])
    with gzip.open(root / "day" / "part-2.gz", "wt") as out:
        out.write(texts[2])
    command = shlex.join([sys.executable, str(script), str(root), "fs", "-cat"])
    return command, ["afs:/day/part-0", "afs:/day/part-1", "afs:/day/part-2.gz"], texts


def rows(dataset) -> list[list]:
    return dataset.to_arrow().column("ids").to_pylist()


@pytest.mark.parametrize("pipe", ["cat", "cat | cat"])  # read directly / fed to a command
def test_download_cmd_loads_what_the_command_prints(store, small_files, pipe):
    command, paths, _ = store
    local = InMemoryDataset()
    local.init(use_var=SMALL_SCHEMA)
    local.set_filelist(small_files)  # records 0..14: the same lines as the store's 0..11
    local.load_into_memory()
    dataset = InMemoryDataset()
    dataset.init(use_var=SMALL_SCHEMA, pipe_command=pipe, download_cmd=command, thread_num=2)
    dataset.set_filelist(paths)  # nothing local to check: accepted as they are
    dataset.load_into_memory()
    assert dataset.stats().records == 12 and dataset.stats().files == 3
    assert rows(dataset) == rows(local)[:12]


def test_download_cmd_streams_in_a_queue_dataset(store):
    command, paths, _ = store
    dataset = QueueDataset()
    dataset.init(batch_size=5, use_var=SMALL_SCHEMA, pipe_command="cat | cat", download_cmd=command)
    dataset.set_filelist(paths)
    assert sum(batch.size for batch in dataset) == 12


def test_the_path_is_one_quoted_argument(tmp_path: Path):
    marker = tmp_path / "pwned"
    nasty = f'a"; touch {marker}; ".txt $(touch {marker}) `touch {marker}`'
    assert DownloadCommand("printf %s").shell_command(nasty) == (
        f"printf %s -- {shlex.quote(nasty)}"
    )
    # The command receives "--", then the path as its one last argument.
    dataset = InMemoryDataset()
    dataset.init(use_var=SMALL_SCHEMA, on_bad_line="skip", download_cmd="printf '%s\\n'")
    dataset.set_filelist([nasty])
    dataset.load_into_memory()
    assert dataset.stats().lines == 2 and dataset.stats().skipped_lines == 2
    assert not marker.exists()


ARGV_AS_A_RECORD = """
import sys
if sys.argv[1:] != ["--", "--help"]:
    sys.exit(f"unexpected arguments {sys.argv[1:]}")
sys.stdout.write("3 1 2 3 1 7 1 -7 1 0\\n")
"""


def test_a_path_that_looks_like_an_option_is_not_one(tmp_path: Path):
    """``--help`` reaches the command after ``--``: a file name, not an option."""
    script = tmp_path / "argv.py"
    script.write_text(ARGV_AS_A_RECORD)
    dataset = InMemoryDataset()
    dataset.init(use_var=SMALL_SCHEMA, download_cmd=shlex.join([sys.executable, str(script)]))
    dataset.set_filelist(["--help"])
    dataset.load_into_memory()
    assert dataset.stats().records == 1
    assert dataset.to_arrow().column("ids").to_pylist() == [[7]]


@pytest.mark.parametrize("path", ["-", ""])
def test_a_path_that_names_standard_input_is_refused(path):
    dataset = InMemoryDataset()
    dataset.init(use_var=SMALL_SCHEMA, download_cmd="hadoop fs -cat")
    with pytest.raises(SchemaError) as refused:
        dataset.set_filelist(["afs:/day/part-0", path])
    assert str(refused.value) == (
        f"download_cmd 'hadoop fs -cat': the input path {path!r} names no file (the command "
        "would read its own standard input); expected a file's path"
    )
    assert dataset.get_filelist() == []


@pytest.mark.parametrize("pipe", ["cat", "cat | cat"])
def test_a_failing_download_is_a_reader_error(store, pipe):
    command, paths, _ = store
    dataset = InMemoryDataset()
    dataset.init(use_var=SMALL_SCHEMA, pipe_command=pipe, download_cmd=command)
    dataset.set_filelist([paths[0], "afs:/day/missing"])
    with pytest.raises(ReaderError) as caught:
        dataset.load_into_memory()
    error = caught.value
    assert error.command == command and error.path == "afs:/day/missing"
    assert error.returncode == 1 and "FileNotFoundError" in error.stderr_tail
    assert f"download command {command!r} exited with status 1 on afs:/day/missing" in str(error)
    with pytest.raises(RuntimeError):
        dataset.to_arrow()  # a failed load leaves nothing half-loaded


def test_a_silent_download_is_stopped_by_read_timeout():
    dataset = InMemoryDataset()
    dataset.init(use_var=SMALL_SCHEMA, pipe_command="cat | cat", download_cmd="sleep 60; echo",
                 read_timeout=0.5)
    dataset.set_filelist(["afs:/slow"])
    with pytest.raises(ReaderError, match="wrote no output for 0.5 s"):
        dataset.load_into_memory()
    # conftest's fixture checks that the download command did not outlive the load


def test_cat_and_empty_mean_local_files(small_files):
    for command in ("cat", " cat ", ""):
        dataset = InMemoryDataset()
        dataset.init(use_var=SMALL_SCHEMA, download_cmd=command)
        with pytest.raises(FileNotFoundError):
            dataset.set_filelist(["/no/such/file"])
        dataset.set_filelist(small_files)
        dataset.load_into_memory()
        assert dataset.stats().records == 15


@pytest.mark.parametrize("pipe", ["cat", "cat | cat"])
def test_a_file_name_that_is_not_utf8_reaches_the_command_as_the_os_gave_it(store, pipe):
    """A name listed from disk may hold any bytes (Python gives ``\\udcff`` for
    byte 0xff): the command gets the very bytes, and errors show the name."""
    command, _, texts = store
    root = Path(shlex.split(command)[2])
    (root / os.fsdecode(b"day/part-\xff")).write_text(texts[0])
    name = os.fsdecode(b"afs:/day/part-\xff")
    dataset = InMemoryDataset()
    dataset.init(use_var=SMALL_SCHEMA, pipe_command=pipe, download_cmd=command)
    dataset.set_filelist([name])
    dataset.load_into_memory()
    assert dataset.stats().records == 4
    missing = os.fsdecode(b"afs:/day/gone-\xfe")
    dataset.set_filelist([missing])
    with pytest.raises(ReaderError) as caught:
        dataset.load_into_memory()
    assert caught.value.path == missing and "exited with status 1" in str(caught.value)
