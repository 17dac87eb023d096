"""Digests of the code a reader runs, so that a cache of its records made before
an edit of ``reader.py`` is refused rather than loaded (``records/cache.py``).

What is digested (sha256 of the bytes; a file above ``DIGEST_LIMIT``: its
size and mtime):

* each file a pipe or download command names: a word, or what follows ``=``
  in one, that is an existing file once ``~`` and ``$VAR`` are expanded,
  relative to the working directory or to a ``cd DIR`` before it, including
  the words of an ``sh -c '...'`` script. Key ``file <word>``. Not the target
  of an output redirection or of ``tee`` (what the command writes);
* a ``data_generator`` class (or the class of an instance): its source, its
  base classes' from the same module, and what their code reads from that
  module (functions and classes by source, other values by ``repr``), so that
  an edit elsewhere in the training script does not make the cache stale.
  Key ``class <module>.<name>``.

Not seen, and said so in the docs: modules those files import, a ``python -m``
module, an instance's attributes, what a command downloads.

A load takes the digests before its readers run and again after
(``LoadedCode``). A file that changed meanwhile is either the readers' output
(a log named as ``--log=reader.log``: left out, it would make every cache
stale) or, when it looks like code (a script or an executable), the reader
edited while it ran: the records may then come from either version, and no
cache of them is written.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import os
import re
import shlex
import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("datafeed")

__all__ = ["DIGEST_LIMIT", "LoadedCode", "digests", "warn_unseen"]

#: Files larger than this (an interpreter binary, a vocabulary) are checked by
#: size and mtime: reading them whole at every load would cost more than the
#: load a cache saves.
DIGEST_LIMIT = 16 << 20

_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh"})
# An interpreter's program name, with an optional version: python3.11, perl5.
_INTERPRETER = re.compile(r"(python|pypy|perl|ruby|node|awk|gawk|sh|bash|dash|zsh|ksh)[0-9.]*")
# Options after which an interpreter's code is the next word, not a file.
_INLINE_CODE = frozenset({"-c", "-e", "--eval"})
_SCRIPT_SUFFIXES = (".py", ".sh", ".bash", ".pl", ".rb", ".js", ".awk", ".lua", ".r", ".R")
_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "(", ")"})

# (path, size, mtime_ns, inode) -> digest: a process loads the same reader again
# and again (each pass, each dataset) without reading it again.
_memo: dict[tuple[str, int, int, int], str] = {}
_MEMO_ENTRIES = 256


def digests(commands: Sequence[str | None], generator: Any) -> dict[str, str]:
    """The digests of the code behind ``commands`` (pipe, download) and
    ``generator`` (a ``data_generator`` class or instance, or None), keyed as
    the module docstring says. Never raises: a file it cannot read has a
    digest that says why (``unreadable: PermissionError``)."""
    code: dict[str, str] = {}
    for command in commands:
        for word, path in _named_files(command or ""):
            code[f"file {word}"] = _file_digest(path)
    if generator is not None:
        kind = generator if isinstance(generator, type) else type(generator)
        code[f"class {kind.__module__}.{kind.__qualname__}"] = _class_digest(kind)
    return code


@dataclass(frozen=True)
class LoadedCode:
    """The reader's code as a load ran it: the digests taken before the load
    (``kept``, less the readers' output) and the code files that changed
    while it ran (``edited``: no cache of its records may be written)."""

    kept: dict[str, str]
    edited: tuple[str, ...] = ()
    output: tuple[str, ...] = ()

    @classmethod
    def across(cls, before: dict[str, str], after: dict[str, str]) -> LoadedCode:
        changed = sorted(k for k in before.keys() & after.keys() if before[k] != after[k])
        edited = tuple(k for k in changed if _looks_like_code(k))
        output = tuple(k for k in changed if k not in edited)
        return cls({k: v for k, v in before.items() if k not in output}, edited, output)


def warn_unseen(commands: Sequence[str | None], loaded: LoadedCode, cache: str) -> None:
    """Warns about what a cache of these readers' records cannot check: a
    command that runs an interpreter on a file it does not name here (a
    ``python -m`` module), and the files the load changed (taken as output)."""
    for command in commands:
        words = _words(command or "")
        runs_code = any(_INTERPRETER.fullmatch(os.path.basename(w)) for w in words)
        inline = any(w in _INLINE_CODE for w in words)  # the code is the command's text
        named = [w for w, _ in _named_files(command or "")
                 if not _INTERPRETER.fullmatch(os.path.basename(w))]
        if runs_code and not inline and not named:
            logger.warning(
                "cache %s cannot see the code of the command %r: it names no file that "
                "exists here (a python -m module, a path the shell works out); after "
                "editing the reader, delete the cache", cache, command,
            )
    if loaded.output:
        logger.warning(
            "cache %s: %s changed while the readers ran: taken as their output, not "
            "checked for a stale cache", cache, ", ".join(loaded.output),
        )


def _looks_like_code(key: str) -> bool:
    """Whether a digested file is code rather than data or a log: a
    generator's class, a script, or an executable."""
    if not key.startswith("file "):
        return True
    word = key[len("file "):]
    path = os.path.expandvars(os.path.expanduser(word))
    return word.endswith(_SCRIPT_SUFFIXES) or os.access(path, os.X_OK)


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
        if word in _INLINE_CODE and _INTERPRETER.fullmatch(previous) and i + 1 < len(words):
            if previous in _SHELLS and word == "-c":
                found += _named_files(words[i + 1], cwd)  # a shell script's own words
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
    """The words of a shell command, separators (``;``, ``&&``, ``|``) apart,
    less what it writes to: the targets of output redirections and the files
    ``tee`` names."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError:  # unbalanced quotes: the shell will say so when it runs
        words = command.split()
    kept, target_next, in_tee = [], False, False
    for word in words:
        if target_next:
            target_next = False
        elif ">" in word and not word.strip("<>&|0123456789"):
            target_next = True  # ">", ">>", "&>", ">|": the next word is written to
        elif word in _SEPARATORS:
            in_tee = False
            kept.append(word)
        elif in_tee:
            continue
        else:
            in_tee = os.path.basename(word) == "tee"
            kept.append(word)
    return kept


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


def _class_digest(kind: type) -> str:
    """The sha256 of ``kind``'s code and what it reads from its module; its
    module's file when Python cannot give the sources."""
    module = sys.modules.get(kind.__module__)
    try:
        parts = _code_of(kind, vars(module) if module is not None else {}, set())
    except Exception:  # noqa: BLE001 - inspect raises OSError, TypeError, SyntaxError, ...
        path = getattr(module, "__file__", None) or _function_file(kind)
        return _file_digest(path) if path else "source not found"
    return "sha256 " + hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _code_of(value: Any, scope: dict[str, Any], seen: set[int]) -> list[str]:
    """The source of a class or function of the module ``scope``, of the
    classes it derives from there, and of what its code reads from ``scope``,
    recursively; other values read by ``repr`` (a constant, a list of slots)."""
    if id(value) in seen:
        return []
    seen.add(id(value))
    parts = [inspect.getsource(value)]
    codes = []
    if isinstance(value, type):
        for base in value.__mro__[1:]:
            if scope.get(base.__name__) is base:
                parts += _code_of(base, scope, seen)
        for member in vars(value).values():
            function = getattr(member, "__func__", member)  # staticmethod, classmethod
            if isinstance(member, property):
                function = member.fget
            if isinstance(function, types.FunctionType):
                codes.append(function.__code__)
    else:
        codes.append(value.__code__)
    for name in sorted({n for code in codes for n in _names_read(code)}):
        if name not in scope:
            continue
        read = scope[name]
        if isinstance(read, types.ModuleType):
            continue  # an import: not seen (the docs say so)
        if isinstance(read, (type, types.FunctionType)) and read.__module__ == value.__module__:
            parts += _code_of(read, scope, seen)
        elif not isinstance(read, (type, types.FunctionType, types.BuiltinFunctionType)):
            text = repr(read)
            # An object's default repr holds its address, new in every process.
            parts.append(f"{name} = {text}" if " at 0x" not in text else f"{name}: {type(read)}")
    return parts


def _names_read(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):  # a nested function, a comprehension
            names |= _names_read(const)
    return names


def _function_file(kind: type) -> str | None:
    for value in vars(kind).values():
        code = getattr(value, "__code__", None)
        if code is not None and os.path.isfile(code.co_filename):
            return code.co_filename
    return None
