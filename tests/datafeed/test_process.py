"""Child processes (datafeed/source/process.py): how commands start, end and fail, the
process table their groups are found in, and the loop that feeds command output to
the parser in pieces."""

from __future__ import annotations

import gzip
import io
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import BinaryIO

import pytest
from support import SMALL_SCHEMA, small_line

from datafeed import ReaderError
from datafeed.parse.parsing import ChunkParser, chunk_to_arrow, parse_bytes
from datafeed.source.process import (
    STDERR_TAIL_BYTES,
    STDERR_TAIL_LINES,
    CommandStream,
    PipeProcess,
    describe_exit,
    feed_in_pieces,
)
from datafeed.source.process_groups import STOP_GRACE_SECONDS, process_entry, process_table


def run_to_end(process: PipeProcess) -> bytes:
    """All the command's output; its failure, if any, raised by ``wait()``."""
    try:
        data = process.stdout.read()
        process.wait()
        return data
    finally:
        process.close()


def opened(path: Path) -> BinaryIO:
    """``path`` open for reading, for a PipeProcess, which owns and closes its source."""
    return open(path, "rb")


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    path = tmp_path / "input.txt"
    path.write_bytes(b"".join(b"line %d\n" % i for i in range(1000)))
    return path


# -- how a command ended --------------------------------------------------------------


def test_describe_exit_names_the_status_or_the_signal():
    assert describe_exit(0) == "exited with status 0"
    assert describe_exit(3) == "exited with status 3"
    assert describe_exit(-signal.SIGKILL) == "was killed by signal SIGKILL"
    assert describe_exit(-signal.SIGTERM) == "was killed by signal SIGTERM"
    assert describe_exit(-200) == "was killed by signal 200"  # a number with no name


def test_a_pipe_command_killed_by_a_signal_names_the_signal(text_file: Path):
    command = "cat > /dev/null; kill -TERM $$"
    process = PipeProcess(command, opened(text_file), name="input.txt")
    with pytest.raises(ReaderError) as caught:
        run_to_end(process)
    error = caught.value
    assert str(error) == (
        "command 'cat > /dev/null; kill -TERM $$' was killed by signal SIGTERM "
        "on input.txt (no stderr output)"
    )
    assert (error.command, error.path, error.returncode) == (command, "input.txt", -15)


def test_a_download_command_killed_by_a_signal_names_the_signal():
    stream = CommandStream("echo partial; echo oops >&2; kill -KILL $$", "fetch", "/day/part-0")
    with stream, pytest.raises(ReaderError) as caught:
        assert stream.read(100) == b"partial\n"
        stream.read(100)
    error = caught.value
    assert str(error) == (
        "download command 'fetch' was killed by signal SIGKILL on /day/part-0; "
        "last stderr lines:\noops"
    )
    assert error.returncode == -signal.SIGKILL and error.stderr_tail == "oops"


def test_a_failed_command_quotes_only_the_last_stderr_lines(text_file: Path):
    command = "for i in $(seq 1 100); do echo err $i >&2; done; exit 3"
    process = PipeProcess(command, opened(text_file), name="input.txt")
    with pytest.raises(ReaderError) as caught:
        run_to_end(process)
    expected_tail = "\n".join(f"err {i}" for i in range(81, 101))
    assert STDERR_TAIL_LINES == 20
    assert caught.value.stderr_tail == expected_tail
    assert caught.value.returncode == 3
    assert str(caught.value) == (
        f"command {command!r} exited with status 3 on input.txt; "
        f"last stderr lines:\n{expected_tail}"
    )


def test_the_stderr_tail_is_bounded_in_bytes_too(text_file: Path):
    # One 100 kB line of stderr: only the end of the file is read for the tail.
    command = "head -c 100000 /dev/zero | tr '\\0' x >&2; exit 1"
    process = PipeProcess(command, opened(text_file), name="input.txt")
    with pytest.raises(ReaderError) as caught:
        run_to_end(process)
    assert caught.value.stderr_tail == "x" * STDERR_TAIL_BYTES


# -- inputs ---------------------------------------------------------------------------


def test_a_local_file_byte_range_is_exactly_those_bytes(text_file: Path):
    data = text_file.read_bytes()
    process = PipeProcess("cat", opened(text_file), name="r", start=100, end=2345)
    assert run_to_end(process) == data[100:2345]


def test_a_stream_is_fed_to_the_command_whole():
    data = b"".join(b"record %d\n" % i for i in range(50000))
    process = PipeProcess("cat | cat", io.BytesIO(data), name="stream")
    assert run_to_end(process) == data


def test_a_gzip_stream_goes_through_gunzip_first():
    data = b"".join(b"record %d\n" % i for i in range(5000))
    process = PipeProcess("wc -l", io.BytesIO(gzip.compress(data)), name="x.gz", gunzip=True)
    assert run_to_end(process).strip() == b"5000"


def test_a_corrupt_gzip_input_is_gunzips_error():
    process = PipeProcess("cat", io.BytesIO(b"not gzip at all"), name="bad.gz", gunzip=True)
    with pytest.raises(ReaderError, match="command 'gzip -dc' exited with status 1 on bad.gz"):
        run_to_end(process)


def test_a_byte_range_of_a_stream_is_refused_and_the_stream_closed():
    source = io.BytesIO(b"abc\n")
    with pytest.raises(ValueError, match="byte ranges of remote files are not supported: s3"):
        PipeProcess("cat", source, name="s3", start=1, end=3)
    assert source.closed


def test_close_stops_a_command_that_is_still_running(text_file: Path):
    process = PipeProcess("sleep 600", opened(text_file), name="input.txt")
    process.close()  # conftest checks that no child is left behind
    assert process.process.returncode == -signal.SIGTERM  # asked first, not killed


def test_close_kills_a_command_that_ignores_sigterm_after_the_grace_period(text_file: Path):
    command = "trap '' TERM; sleep 600 & echo ready; wait"
    process = PipeProcess(command, opened(text_file), name="input.txt")
    assert process.stdout.readline() == b"ready\n"  # the trap is set
    started = time.monotonic()
    process.close()
    assert process.process.returncode == -signal.SIGKILL
    assert STOP_GRACE_SECONDS <= time.monotonic() - started < STOP_GRACE_SECONDS + 3


# -- the process table ----------------------------------------------------------------


def test_the_process_table_reads_a_command_named_with_spaces_and_parentheses(tmp_path: Path):
    # /proc/<pid>/stat shows the name as "(x) (y z)": only the last ')' ends it.
    odd = tmp_path / "x) (y z"
    shutil.copy(shutil.which("sleep"), odd)
    child = subprocess.Popen([str(odd), "600"], start_new_session=True)
    try:
        entry = process_table()[child.pid]
        assert entry.parent == os.getpid() and entry.group == child.pid
        # The state may change between two reads (R while the child starts, then S).
        again = process_entry(child.pid)
        assert entry.state != "Z" and again is not None
        assert (again.parent, again.group) == (entry.parent, entry.group)
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while (entry := process_entry(child.pid)) is not None and entry.state != "Z":
            assert time.monotonic() < deadline, f"pid {child.pid} still {entry.state}"
            time.sleep(0.01)
        assert entry is not None and entry.group == child.pid  # dead, not yet reaped
    finally:
        child.kill()
        child.wait()


# -- feeding the parser in pieces -----------------------------------------------------


class LineRecorder:
    """A parser stand-in: consumes complete lines, records what it was fed."""

    def __init__(self) -> None:
        self.fed: list[bytes] = []

    def feed(self, view: memoryview) -> int:
        data = bytes(view)
        consumed = data.rfind(b"\n") + 1
        if consumed:
            self.fed.append(data[:consumed])
        return consumed


@pytest.mark.parametrize(
    ("piece_bytes", "piece_lengths", "calls"),
    [
        (10, [10] * 500, 501),  # the last call: the tail alone, nothing consumed
        (25, [20] * 250, 251),
        (64, [60] * 83 + [20], 84),  # the last piece reaches the end: no extra call
        (1 << 20, [5000], 1),
    ],
)
def test_feeding_in_pieces_passes_on_exactly_the_complete_lines(
    piece_bytes: int, piece_lengths: list[int], calls: int
):
    data = b"".join(b"%09d\n" % (i * 7919) for i in range(500)) + b"tail without newline"
    parser = LineRecorder()
    after_piece_calls = []
    consumed = feed_in_pieces(
        parser, memoryview(data), piece_bytes, lambda: after_piece_calls.append(len(parser.fed))
    )
    assert consumed == 5000
    assert b"".join(parser.fed) == data[:5000]
    assert [len(piece) for piece in parser.fed] == piece_lengths
    assert len(after_piece_calls) == calls
    assert after_piece_calls[:3] == [1, 2, 3][: len(after_piece_calls)]


def test_a_line_longer_than_a_piece_is_fed_whole():
    data = b"short\n" + b"y" * 1000 + b"\nend\n"
    parser = LineRecorder()
    consumed = feed_in_pieces(parser, memoryview(data), 10, lambda: None)
    assert consumed == len(data)
    assert parser.fed[0] == b"short\n"
    assert b"".join(parser.fed) == data


def test_feeding_a_real_parser_in_pieces_gives_the_records_of_one_feed():
    text = "".join(small_line(i) for i in range(300)).encode()
    parser = ChunkParser(SMALL_SCHEMA, "pieces")
    chunks = []
    consumed = feed_in_pieces(
        parser, memoryview(text), 113, lambda: chunks.append(parser.take_chunk())
    )
    assert consumed == len(text)
    rows = [
        row for c in chunks if c is not None for row in chunk_to_arrow(parser.schema, c).to_pylist()
    ]
    whole = chunk_to_arrow(parser.schema, parse_bytes(parser.schema, text, "whole"))
    assert rows == whole.to_pylist()
    assert parser.lines == parser.records == 300
