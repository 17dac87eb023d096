"""Exceptions raised by the trainer: each is also a builtin exception.

Messages say what was expected, what was found, and where (variable, endpoint, rank).
"""

from __future__ import annotations


class TrainerError(Exception):
    """Base class of every error raised by ``trainer``."""


class RoleError(TrainerError, ValueError):
    """The job's role environment (or a role maker's arguments) is missing or malformed."""


class ServerUnavailableError(TrainerError, RuntimeError):
    """A parameter server could not be reached, or stopped answering.

    Attributes:
        endpoint: the server's ``host:port``.
    """

    def __init__(self, message: str, *, endpoint: str) -> None:
        super().__init__(message)
        self.endpoint = endpoint


class WorkerFailedError(TrainerError, RuntimeError):
    """A peer worker failed or stopped answering during a collective step.

    Attributes:
        rank: the rank of the worker that failed, when known.
    """

    def __init__(self, message: str, *, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank


class ServerCallError(TrainerError, RuntimeError):
    """A parameter server refused or failed a call (its handler raised).

    Attributes:
        endpoint: the server's ``host:port``.
        remote_type: the name of the exception the server's handler raised.
    """

    def __init__(self, message: str, *, endpoint: str, remote_type: str) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.remote_type = remote_type


class CheckpointError(TrainerError, ValueError):
    """A checkpoint cannot be loaded: a file is malformed, or does not fit the
    model. Raised before anything was changed.

    Attributes:
        path: the checkpoint file (or directory) at fault.
    """

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


class TrainerProcessError(TrainerError, RuntimeError):
    """A Hogwild trainer process failed (trainer/loop/hogwild_processes.py).

    A failure whose exception is a builtin type is raised again as that type,
    with this error (holding the process's traceback) as its cause; others are
    raised as this error.

    Attributes:
        process: which process (0-based) failed.
    """

    def __init__(self, message: str, *, process: int) -> None:
        super().__init__(message)
        self.process = process
