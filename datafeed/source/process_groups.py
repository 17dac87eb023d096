"""Process groups of the commands fleetfeed starts, and how they end.

Every pipe or download command runs in a process group of its own
(``spawn``). The group is ended with ``end_group``: SIGTERM, then SIGKILL after
``STOP_GRACE_SECONDS``, so that nothing a command started outlives it. The
groups not yet ended are remembered: they are ended when the Python process
exits (``atexit``) and, while a load runs in the main thread, when it gets
SIGTERM (``commands_end_on_sigterm``).

The members of a group, and whether they still run, come from ``/proc``
(``process_table``, ``process_entry``: each process's parent, group and state),
the one place that reads it; fleetrun walks the same table to find what its
children started.

A command's stderr is read by a ``StderrTail`` thread that keeps only its last
``STDERR_TAIL_BYTES``: a flood costs neither memory nor disk.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

__all__ = [
    "JOB_KEY_VARIABLES",
    "ProcessEntry",
    "StderrTail",
    "command_environment",
    "commands_end_on_sigterm",
    "end_every_group",
    "end_group",
    "kill_group",
    "process_entry",
    "process_table",
    "spawn",
    "stderr_tail",
]

# Lines of a failed command's stderr quoted in its error.
STDERR_TAIL_LINES = 20
# Only the end of stderr is kept for them: a chatty command's megabytes of
# warnings are neither kept nor written anywhere to quote 20 lines.
STDERR_TAIL_BYTES = 16384
# A command's process group gets this long between SIGTERM and SIGKILL.
STOP_GRACE_SECONDS = 1.0
# The wait for a stopped group's stderr to end (a process that left the group
# may hold it open for ever: its reader thread is then left to end with it).
STDERR_JOIN_SECONDS = 1.0

# The process groups of the commands this process started and has not ended yet:
# ended at exit and on SIGTERM (see commands_end_on_sigterm).
_live_groups: set[int] = set()
_live_groups_lock = threading.RLock()  # a SIGTERM handler may take it again
# Set once every group is being ended (at exit, on SIGTERM): a command that a
# reader thread starts from then on is killed at once, and the groups' end
# waits for commands being started (``_spawning``), so that none outlives the
# process: a reader whose command was killed moves on to its next file.
_closing = False
_spawning = 0


# The job key's variables (trainer/job/keys.py): reader and download commands are
# third-party code that has no use for the key, so they never see it.
JOB_KEY_VARIABLES = ("FLEETFEED_JOB_KEY", "FLEETFEED_JOB_KEY_FILE", "FLEETFEED_JOB_SECRET")


def command_environment() -> dict[str, str]:
    """This process's environment without the job key's variables."""
    return {k: v for k, v in os.environ.items() if k not in JOB_KEY_VARIABLES}


def spawn(args: list[str], stdin: Any, stderr: Any) -> subprocess.Popen:
    """Starts ``args`` in its own process group, its stdout a pipe, without the
    job key in its environment."""
    global _spawning
    with _live_groups_lock:
        _spawning += 1
    try:
        process = subprocess.Popen(
            args, stdin=stdin, stdout=subprocess.PIPE, stderr=stderr, start_new_session=True,
            env=command_environment(),
        )
        with _live_groups_lock:
            _live_groups.add(process.pid)
            closing = _closing
        if closing:
            _signal_group(process.pid, signal.SIGKILL)
        return process
    finally:
        with _live_groups_lock:
            _spawning -= 1


def _signal_group(pgid: int, signum: int) -> bool:
    """Sends ``signum`` to the group; False when it has no process left."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member that changed user: nothing more we can do
        return False
    return True


def kill_group(process: subprocess.Popen) -> None:
    """Asks ``process`` and everything in its group to stop (SIGTERM), without
    waiting; ``end_group`` waits, and kills what did not stop."""
    process.poll()
    if process.returncode is None or process.pid in _live_groups:
        _signal_group(process.pid, signal.SIGTERM)


class ProcessEntry(NamedTuple):
    """One process as /proc/<pid>/stat shows it."""

    parent: int  # the parent's pid
    group: int  # the process group's id
    state: str  # "R", "S", ...; "Z": a zombie, dead but not yet reaped


def process_entry(pid: int) -> ProcessEntry | None:
    """Process ``pid`` as ``/proc`` shows it now; None when it is gone (or
    reaped), or without ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # pid (comm) state ppid pgrp ...; comm may hold spaces and ')'
            fields = stat.read().rsplit(b")", 1)[1].split()
        return ProcessEntry(int(fields[1]), int(fields[2]), fields[0].decode("ascii"))
    except (OSError, IndexError, ValueError):  # gone since it was listed
        return None


def process_table() -> dict[int, ProcessEntry]:
    """Every process ``/proc`` shows now, by pid (empty without ``/proc``)."""
    try:
        pids = [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return {}
    table = {}
    for pid in pids:
        entry = process_entry(pid)
        if entry is not None:
            table[pid] = entry
    return table


def _members(pgids: set[int]) -> list[int]:
    """The processes of the groups ``pgids`` (from /proc; none without it)."""
    return [pid for pid, entry in process_table().items() if entry.group in pgids]


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs: a zombie (dead, its parent yet to reap it)
    does not, though it still counts as a member of its group."""
    entry = process_entry(pid)
    return entry is not None and entry.state != "Z"


def _stop_groups(pgids: list[int], grace: float, leader: subprocess.Popen | None = None) -> None:
    """SIGTERM to the groups, up to ``grace`` seconds for their processes to
    end, then SIGKILL to whatever is left in them (or was started meanwhile)."""
    pgids = [pgid for pgid in pgids if _signal_group(pgid, signal.SIGTERM)]
    if not pgids:
        return
    members = _members(set(pgids))
    deadline = time.monotonic() + grace
    while (leader is not None and leader.poll() is None) or any(map(_running, members)):
        if time.monotonic() > deadline:
            break
        time.sleep(0.01)
    for pgid in pgids:
        _signal_group(pgid, signal.SIGKILL)


def end_group(process: subprocess.Popen, grace: float = STOP_GRACE_SECONDS) -> None:
    """Ends ``process``'s group: SIGTERM, up to ``grace`` seconds for every
    member to go, SIGKILL for the rest; reaps ``process``.

    Costs one system call when the leader has exited and nothing is left, the
    usual end of a command. A background child left behind by an exited leader
    is stopped here, not waited for.
    """
    pgid = process.pid
    process.poll()  # a zombie leader would keep its group alive
    if process.returncode is None or _signal_group(pgid, 0):
        _stop_groups([pgid], grace, leader=process)
        process.wait()
    with _live_groups_lock:
        _live_groups.discard(pgid)


def end_every_group(grace: float = STOP_GRACE_SECONDS) -> None:
    """Ends the group of every command this process started and has not ended
    (SIGTERM, SIGKILL after ``grace``), and of any started meanwhile: run at
    exit and on SIGTERM."""
    global _closing
    with _live_groups_lock:
        _closing = True
        groups = list(_live_groups)
        _live_groups.clear()
    _stop_groups(groups, grace)
    deadline = time.monotonic() + grace
    while _spawning and time.monotonic() < deadline:  # they kill their own (spawn)
        time.sleep(0.01)


def _forget_groups_in_child() -> None:
    global _closing, _spawning
    _live_groups.clear()  # a forked child's groups are its parent's to end
    _closing, _spawning = False, 0


atexit.register(end_every_group)
os.register_at_fork(after_in_child=_forget_groups_in_child)


def _end_commands_and_die(signum: int, _frame: object) -> None:
    end_every_group()
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)  # the process still ends as SIGTERM ends it


@contextlib.contextmanager
def commands_end_on_sigterm() -> Iterator[None]:
    """While the block runs, a SIGTERM first ends every command's group, then
    ends the process as it would have (the default action).

    Only in the main thread, and only when SIGTERM has its default action (a
    handler of the program's own is left alone). SIGINT needs nothing: it is a
    ``KeyboardInterrupt``, and the load's ``finally`` ends the commands.
    """
    installed = False
    if threading.current_thread() is threading.main_thread():
        with contextlib.suppress(ValueError, OSError):
            if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                signal.signal(signal.SIGTERM, _end_commands_and_die)
                installed = True
    try:
        yield
    finally:
        if installed and signal.getsignal(signal.SIGTERM) is _end_commands_and_die:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


class StderrTail:
    """A command's stderr, read by a thread that keeps only its last
    ``STDERR_TAIL_BYTES`` (a flood costs neither memory nor disk).

    Args:
        pipe: the read end of the command's stderr pipe, owned from here on.
        name: the thread's name.
    """

    def __init__(self, pipe: Any, name: str) -> None:
        self._pipe = pipe
        self._kept = bytearray()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        descriptor = self._pipe.fileno()
        try:
            while True:
                data = os.read(descriptor, 1 << 16)
                if not data:
                    break
                with self._lock:
                    self._kept += data
                    if len(self._kept) > 2 * STDERR_TAIL_BYTES:  # trimmed now and then
                        del self._kept[:-STDERR_TAIL_BYTES]
        except OSError:
            pass
        finally:
            self._pipe.close()

    def text(self, count: int = STDERR_TAIL_LINES, wait: float = STDERR_JOIN_SECONDS) -> str:
        """The last ``count`` lines (of the last ``STDERR_TAIL_BYTES``), once
        the stderr ended or ``wait`` seconds passed."""
        self._thread.join(wait)
        with self._lock:
            data = bytes(self._kept[-STDERR_TAIL_BYTES:])
        text = data.decode("utf-8", "replace")
        return "\n".join(text.rstrip("\n").splitlines()[-count:])


def stderr_tail(stderr: StderrTail | None, count: int = STDERR_TAIL_LINES) -> str:
    """The last ``count`` lines a command wrote to its stderr ("" without one)."""
    return "" if stderr is None else stderr.text(count)
