"""Digests of the code a reader runs, so that a cache of its records made before
an edit of ``reader.py`` is refused rather than loaded (``records/cache.py``).

What is digested (sha256 of the bytes; a file above ``DIGEST_LIMIT``: its
size and mtime):

* each file a pipe or download command names: a word, or what follows ``=``
  in one, that is an existing file once ``~`` and ``$VAR`` are expanded,
  relative to the working directory or to a ``cd DIR`` before it, including
  the words of an ``sh -c '...'`` script. Key ``file <word>``. Not the target
  of an output redirection or of ``tee`` (what the command writes);
* a ``data_generator`` class (or the class of an instance): the file of its
  module, ``__main__``'s (the training script) too. Key ``class
  <module>.<name>``.

Not seen, and said so in the docs: modules those files import, a ``python -m``
module, an instance's attributes, what a command downloads. A file the readers
change while they run is their output, not their code (a log named as
``--log=reader.log``): ``changed_across_load`` finds it, to be left out.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from typing import Any

logger = logging.getLogger("datafeed")

__all__ = ["DIGEST_LIMIT", "changed_across_load", "digests", "warn_unseen"]

#: Files larger than this (an interpreter binary, a vocabulary) are checked by
#: size and mtime: reading them whole at every load would cost more than the
#: load a cache saves.
DIGEST_LIMIT = 16 << 20

_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh"})
_INTERPRETERS = ("python", "pypy", "perl", "ruby", "node", *_SHELLS)

# (path, size, mtime_ns, inode) -> digest: a process loads the same reader again
# and again (each pass, each dataset) without reading it again.
_memo: dict[tuple[str, int, int, int], str] = {}
_MEMO_ENTRIES = 256


def digests(commands: Sequence[str | None], generator: Any) -> dict[str, str]:
    """The digests of the code behind ``commands`` (pipe, download) and
    ``generator`` (a ``data_generator`` class or instance, or None), keyed as
    the module docstring says. Never raises for a file it cannot read: its
    digest says why (``unreadable: PermissionError``)."""
    code: dict[str, str] = {}
    for command in commands:
        for word, path in _named_files(command or ""):
            code[f"file {word}"] = _file_digest(path)
    if generator is not None:
        kind = generator if isinstance(generator, type) else type(generator)
        path = _class_file(kind)
        code[f"class {kind.__module__}.{kind.__qualname__}"] = (
            _file_digest(path) if path is not None else "source not found"
        )
    return code


def changed_across_load(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    """The keys whose files changed between the digests taken before a load and
    after it: the readers' output (a log), or the reader edited while it ran."""
    return sorted(k for k in before.keys() & after.keys() if before[k] != after[k])


def warn_unseen(commands: Sequence[str | None], changed: Sequence[str], cache: str) -> None:
    """Warns about what a cache of these readers' records cannot check: a
    command that runs an interpreter but names no file here, and the files
    that changed while the readers ran (left out of the digests kept)."""
    for command in commands:
        seen = [w for w, _ in _named_files(command or "") if not _is_interpreter(w)]
        if command and not seen and _runs_interpreter(command):
            logger.warning(
                "cache %s cannot see the code of the command %r: it names no file that "
                "exists here (a python -m module, a path the shell works out); after "
                "editing the reader, delete the cache", cache, command,
            )
    if changed:
        logger.warning(
            "cache %s: %s changed while the readers ran: taken as their output, not "
            "checked (if it is the reader's code, edited meanwhile, delete the cache)",
            cache, ", ".join(changed),
        )


def _named_files(command: str, cwd: str = "") -> list[tuple[str, str]]:
    """(word as written, path) of each existing file ``command`` names."""
    found: list[tuple[str, str]] = []
    words = _words(command)
    skip_next = False
    for i, word in enumerate(words):
        if skip_next:
            skip_next = False
            continue
        previous = os.path.basename(words[i - 1]) if i else ""
        if word == "-c" and previous in _SHELLS and i + 1 < len(words):
            found += _named_files(words[i + 1], cwd)
            skip_next = True
            continue
        if previous == "cd":
            cwd = os.path.join(cwd, os.path.expandvars(os.path.expanduser(word)))
            continue
        for candidate in (word, *word.split("=", 1)[1:]):
            path = os.path.join(cwd, os.path.expandvars(os.path.expanduser(candidate)))
            if candidate and os.path.isfile(path):
                found.append((candidate, path))
    return found


def _words(command: str) -> list[str]:
    """The words of a shell command, less what it writes to: the targets of
    output redirections and the files ``tee`` names."""
    try:
        words = shlex.split(command)
    except ValueError:  # unbalanced quotes: the shell will say so when it runs
        words = command.split()
    kept, target_next, in_tee = [], False, False
    for word in words:
        if target_next:
            target_next = False
        elif ">" in word:
            # "2>>", ">", "&>" alone: the next word is the target; "2>log": this one.
            target_next = word.rstrip(">|&") == "" or word.rstrip(">|&").isdigit()
        elif in_tee and word not in ("|", "&&", "||", ";"):
            continue
        else:
            in_tee = os.path.basename(word) == "tee"
            kept.append(word)
    return kept


def _is_interpreter(word: str) -> bool:
    return os.path.basename(word).startswith(_INTERPRETERS)


def _runs_interpreter(command: str) -> bool:
    """Whether ``command`` runs an interpreter on code it does not hold
    (``python -c CODE`` holds its code: the command's text is compared)."""
    words = _words(command)
    return any(_is_interpreter(w) for w in words) and "-c" not in words


def _file_digest(path: str) -> str:
    try:
        st = os.stat(path)
        key = (os.path.realpath(path), st.st_size, st.st_mtime_ns, st.st_ino)
        if key in _memo:
            return _memo[key]
        if st.st_size > DIGEST_LIMIT:
            digest = f"{st.st_size} bytes, mtime_ns {st.st_mtime_ns}"
        else:
            with open(path, "rb") as file:
                digest = "sha256 " + hashlib.sha256(file.read()).hexdigest()
    except OSError as error:  # unreadable, or gone since it was named
        return f"unreadable: {type(error).__name__}"
    if len(_memo) >= _MEMO_ENTRIES:
        _memo.clear()
    _memo[key] = digest
    return digest


def _class_file(kind: type) -> str | None:
    """The file a class was defined in: its module's, or (a module loaded
    without a name in ``sys.modules``) that of a function of the class."""
    path = getattr(sys.modules.get(kind.__module__), "__file__", None)
    if path:
        return path
    for value in vars(kind).values():
        code = getattr(value, "__code__", None)
        if code is not None and os.path.isfile(code.co_filename):
            return code.co_filename
    return None
