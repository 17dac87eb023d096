"""Exceptions raised by the datafeed engine.

Each class is also a builtin exception (``ValueError``, ``RuntimeError``) so that
code written against Paddle's exceptions keeps catching them. Every message says
what was expected, what was found, and where.
"""

from __future__ import annotations

import sys


class DatafeedError(Exception):
    """Base class of every error raised by ``datafeed``."""


class SchemaError(DatafeedError, ValueError):
    """A slot declaration (``use_var``) or a setting is invalid."""


class ParseError(DatafeedError, ValueError):
    """A line of MultiSlot text does not match the slot schema.

    Attributes:
        source: where the text came from (the input file, and the command that
            produced the text when there is one).
        line: 1-based number of the offending line in that text.
        slot: name of the slot being parsed, or ``None`` when the error is not
            tied to one slot (a blank line, tokens after the last slot).
        token: the offending token as bytes (possibly truncated), or ``None``.
    """

    def __init__(
        self,
        message: str,
        *,
        source: str,
        line: int,
        slot: str | None,
        token: bytes | None = None,
    ) -> None:
        super().__init__(message)
        self.source = source
        self.line = line
        self.slot = slot
        self.token = token

    def __reduce__(self):  # keep the attributes across pickling (worker processes)
        return (
            _rebuild_parse_error,
            (str(self), self.source, self.line, self.slot, self.token),
        )


def _rebuild_parse_error(message, source, line, slot, token):
    return ParseError(message, source=source, line=line, slot=slot, token=token)


class ReaderError(DatafeedError, RuntimeError):
    """A pipe command failed (non-zero exit status, or killed by a signal).

    Attributes:
        command: the pipe command as the user gave it.
        path: the input file the command was reading.
        returncode: the exit status; negative for a signal (as in ``subprocess``).
        stderr_tail: the last lines the command wrote to its standard error.
    """

    def __init__(
        self,
        message: str,
        *,
        command: str,
        path: str,
        returncode: int | None,
        stderr_tail: str,
    ) -> None:
        super().__init__(message)
        self.command = command
        self.path = path
        self.returncode = returncode
        self.stderr_tail = stderr_tail

    def __reduce__(self):
        return (
            _rebuild_reader_error,
            (str(self), self.command, self.path, self.returncode, self.stderr_tail),
        )


def _rebuild_reader_error(message, command, path, returncode, stderr_tail):
    return ReaderError(
        message,
        command=command,
        path=path,
        returncode=returncode,
        stderr_tail=stderr_tail,
    )


class CacheError(DatafeedError, ValueError):
    """A cache of parsed records cannot be used: not one, or stale.

    The message names the cache file and what differs (the slots, the file
    list, or a source file's size or mtime).
    """


class StateError(DatafeedError, ValueError):
    """A dataset state (``load_state_dict``'s argument, or a saved state file)
    is malformed or does not fit the dataset; nothing was changed.

    The message names the key, what was expected and what was found.
    """


class AccountingError(DatafeedError, RuntimeError):
    """The counts of a load do not add up: some input line is neither a record
    nor a counted skip (a bug in the engine, never a property of the input).

    The message names the file and its counts.
    """


class GlobalShuffleError(DatafeedError, RuntimeError):
    """The global shuffle could not complete: a peer failed, or data did not add up.

    Attributes:
        rank: the rank that raised it.
        peers: ranks found not answering, or the peer whose data was refused
            (empty when unknown).
    """

    def __init__(self, message: str, *, rank: int, peers: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.rank = rank
        self.peers = peers


def add_note(error: BaseException, note: str) -> None:
    """``error.add_note(note)``, also on Python 3.10, which has no ``add_note``.

    On 3.10 the note goes into ``error.__notes__`` as 3.11 keeps it, so code that
    reads the notes and pickling behave alike (3.10's tracebacks do not print them).
    """
    if sys.version_info >= (3, 11):
        error.add_note(note)
    elif isinstance(getattr(error, "__notes__", None), list):
        error.__notes__.append(note)
    else:
        error.__notes__ = [note]
