"""Readers bounded in every direction, attacked as a hostile pipe command would.

Each pipe command here is real: one that closes its output and keeps running,
one that floods its stderr, one that leaves a background child holding its
output, one still running when the Python process is interrupted or exits.
Their sleeping processes carry a unique duration (``sleep 1000.<digits>``) so
that a survivor is found in /proc and cleaned up even when a test fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import REPO, SMALL_SCHEMA, wait_for

from datafeed import InMemoryDataset, ReaderError
from datafeed.source.process import STDERR_TAIL_BYTES, PipeProcess

# A load that should end takes well under this; a hang is reported, not waited out.
LOAD_DEADLINE = 10.0


def processes_with(marker: str, program: str = "") -> list[int]:
    """Live processes whose command line contains ``marker`` (and starts with
    ``program``)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                text = cmdline.read()
                if marker.encode() not in text or not text.startswith(program.encode()):
                    continue
            with open(f"/proc/{entry}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        found.append(int(entry))
    return found


@pytest.fixture
def marker() -> Iterator[str]:
    """A sleep duration no other process uses; survivors are killed afterwards."""
    value = f"1000.{os.getpid()}{time.monotonic_ns() % 10**9}"
    yield value
    for pid in processes_with(value):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def no_process_left(marker: str) -> None:
    """Fails unless every process carrying ``marker`` is gone (within 5 s)."""
    wait_for(lambda: not processes_with(marker), f"the processes of {marker} to end", timeout=5,
             details=lambda: processes_with(marker))


def dataset_on(files: list[str], command: str, read_timeout: float | None) -> InMemoryDataset:
    dataset = InMemoryDataset()
    dataset.init(use_var=SMALL_SCHEMA, pipe_command=command, read_timeout=read_timeout,
                 thread_num=1)
    dataset.set_filelist(files)
    return dataset


def load_within(dataset: InMemoryDataset, seconds: float, marker: str) -> BaseException | None:
    """Runs ``load_into_memory``; returns its error. A hang fails the test (after
    its processes are killed, so that the load's thread ends)."""
    outcome: dict[str, BaseException | None] = {"error": None}

    def load() -> None:
        try:
            dataset.load_into_memory()
        except BaseException as error:  # noqa: BLE001 - handed to the test
            outcome["error"] = error

    thread = threading.Thread(target=load, daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        for pid in processes_with(marker):
            os.kill(pid, signal.SIGKILL)
        thread.join(10)
        pytest.fail(f"load_into_memory still ran after {seconds:g} s")
    outcome["seconds"] = time.monotonic() - started  # type: ignore[assignment]
    return outcome["error"]


# -- a command that closes its output and keeps running --------------------------------


def test_a_command_that_closes_stdout_and_keeps_running_is_stopped_by_read_timeout(
    small_files, marker
):
    command = f"cat; exec 1>&-; sleep {marker}"
    dataset = dataset_on(small_files[:1], command, read_timeout=1.0)
    error = load_within(dataset, LOAD_DEADLINE, marker)
    assert isinstance(error, ReaderError), error
    assert str(error) == (
        f"command {command!r} closed its output but did not exit within 1 s on "
        f"{small_files[0]} (the read_timeout setting); it was stopped (no stderr output)"
    )
    assert error.command == command and error.path == small_files[0]
    assert error.returncode is None
    no_process_left(marker)
    with pytest.raises(RuntimeError):
        dataset.to_arrow()  # nothing half-loaded


# -- a background child holding the output after the command exited --------------------


@pytest.mark.parametrize("read_timeout", [None, 1.0])
def test_a_background_child_of_an_exited_command_is_killed_and_the_records_kept(
    small_files, marker, read_timeout
):
    # The subshell's sleep inherits the command's stdout: no EOF until it ends.
    dataset = dataset_on(small_files, f"(sleep {marker} &); cat", read_timeout)
    started = time.monotonic()
    error = load_within(dataset, LOAD_DEADLINE, marker)
    assert error is None, error
    assert time.monotonic() - started < 5  # no read_timeout waited out
    assert dataset.get_memory_data_size() == 15
    no_process_left(marker)


def test_a_command_whose_background_child_escaped_its_group_is_an_error(
    tmp_path, small_files, marker
):
    # The command waits until its child is in a session of its own, then exits.
    ready = tmp_path / "escaped"
    command = (
        f"setsid sh -c 'touch {ready}; exec sleep {marker}' & "
        f"while [ ! -e {ready} ]; do sleep 0.01; done; cat"
    )
    dataset = dataset_on(small_files[:1], command, read_timeout=None)
    error = load_within(dataset, LOAD_DEADLINE, marker)
    assert isinstance(error, ReaderError), error
    assert str(error) == (
        f"command {command!r} exited, but a process it started outside its process group "
        f"still held its output open 2 s later, on {small_files[0]}; its output was not read "
        f"to the end (no stderr output)"
    )


# -- a command flooding its stderr -------------------------------------------------------


def open_temp_files(directory: str) -> list[str]:
    """Deleted files under ``directory`` that this process has open (a spool)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(directory) and target.endswith("(deleted)"):
            found.append(target)
    return found


def test_a_stderr_flood_is_kept_as_a_bounded_tail_not_spooled_to_disk(text_file_for_flood):
    temp = os.path.realpath(tempfile.gettempdir())
    before = set(open_temp_files(temp))  # pytest's own capture files
    spooled: list[str] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            spooled.extend(set(open_temp_files(temp)) - before)
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    # 64 MB of stderr while the output stays open, then a last line and a failure.
    command = (
        "head -c 64000000 /dev/zero | tr '\\0' x >&2; echo >&2; echo the last line >&2; exit 2"
    )
    source = open(text_file_for_flood, "rb")  # noqa: SIM115 - the PipeProcess closes it
    process = PipeProcess(command, source, name="flood.txt")
    try:
        process.stdout.read()
        with pytest.raises(ReaderError) as caught:
            process.wait()
    finally:
        process.close()
        done.set()
        watcher.join()
    assert spooled == []
    tail = caught.value.stderr_tail
    assert tail.endswith("\nthe last line")
    assert set(tail[: -len("\nthe last line")]) == {"x"}
    assert len(tail.encode()) <= STDERR_TAIL_BYTES
    assert caught.value.returncode == 2


@pytest.fixture
def text_file_for_flood(tmp_path: Path) -> Path:
    path = tmp_path / "flood.txt"
    path.write_bytes(b"1 1 1 1 1\n")
    return path


# -- the Python process interrupted, terminated, or exiting mid-load ---------------------

LOADER = textwrap.dedent(
    """
    import signal, sys, threading
    # A suite started in the background by a non-interactive shell inherits
    # SIGINT ignored, and Python then leaves it ignored: the interrupt must be one.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.path.insert(0, {tests!r})
    from support import SMALL_SCHEMA
    from datafeed import InMemoryDataset
    files, command, how = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
    dataset = InMemoryDataset()
    dataset.init(use_var=SMALL_SCHEMA, pipe_command=command, thread_num=2)
    dataset.set_filelist(files)
    print("loading", flush=True)
    if how == "exit":  # the main thread leaves while a reader thread still reads
        threading.Thread(target=dataset.load_into_memory, daemon=True).start()
        sys.stdin.readline()
        sys.exit(0)
    dataset.load_into_memory()
    """
)


def start_loader(tmp_path: Path, files: list[str], command: str, how: str) -> subprocess.Popen:
    script = tmp_path / "loader.py"
    script.write_text(LOADER.format(tests=str(REPO / "tests" / "helpers")))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(
        [sys.executable, str(script), ",".join(files), command, how],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def stopped(process: subprocess.Popen, send: Callable[[], None], marker: str) -> int:
    try:
        wait_for(lambda: len(processes_with(marker, "sleep")) == 2, "both pipe commands",
                 timeout=20, details=lambda: process.poll())
        send()
        process.communicate("", timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return process.returncode


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_or_terminated_load_kills_every_pipe_command(
    tmp_path, small_files, marker, signum
):
    loader = start_loader(tmp_path, small_files, f"cat; sleep {marker}", "load")
    returncode = stopped(loader, lambda: loader.send_signal(signum), marker)
    # Both still end the process as the signal does (KeyboardInterrupt re-raises SIGINT).
    assert returncode == -signum
    no_process_left(marker)


def test_a_process_exiting_mid_load_kills_every_pipe_command(tmp_path, small_files, marker):
    loader = start_loader(tmp_path, small_files, f"cat; sleep {marker}", "exit")
    returncode = stopped(loader, lambda: None, marker)  # its stdin closes: it exits
    assert returncode == 0
    no_process_left(marker)
