"""Base classes for ``reader.py`` generator scripts, as in Paddle's Fleet.

A user script subclasses one of them, overrides ``generate_sample`` and ends
with ``MyReader().run_from_stdin()``; fleetfeed (or Paddle) runs it once per
input file with the file on its stdin and reads MultiSlot text from its
stdout. The text is byte-identical to what Paddle's classes of the same name
write (paddle_semantics.md §1), so scripts and their output move freely
between the two systems.

Differences from Paddle, on purpose:

* a bad sample raises ``SampleError``, whose message names the slot, the
  sample and the value, and notes the input line it came from; an error that
  ``generate_sample`` or ``generate_batch`` raises gets the same note (under a
  pipe command, fleetfeed's ``ReaderError`` then names that line);
* numpy integer and floating scalars are numbers;
* every value is checked (Paddle stops checking a slot once it has seen a
  float there, and writes whatever follows), a sample without slots is
  refused, and a first sample that fails fixes no slot schema;
* ``set_batch`` takes only an int >= 1;
* output goes out in blocks of 256 KiB instead of one ``write`` per sample,
  and a closed stdout ends the process with one line on stderr, status 1.
"""

from __future__ import annotations

import os
import sys

from ._format import SampleFormatter, run_generator

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs import time in every generator process
    from collections.abc import Callable, Iterable, Iterator
    from typing import Any, BinaryIO, NoReturn, TextIO

    Sample = Any  # a list or tuple of (name, [values]) pairs, or a zip of them
    SampleSource = Callable[[], Iterable[Sample | None]]

# Output goes to stdout in blocks of at least this many bytes.
BLOCK_SIZE = 1 << 18


class DataGenerator:
    """The base of all generators: Paddle's run loop, without a text format.

    Subclass ``MultiSlotDataGenerator`` or ``MultiSlotStringDataGenerator``
    rather than this class, unless you also write your own ``_gen_str``
    (a method that turns one sample into one line of text).

    Attributes:
        batch_size_: How many samples ``run_from_stdin`` groups before it
            hands them to ``generate_batch`` (Paddle's attribute name).
    """

    # Class-level defaults keep a subclass working when its __init__ forgets
    # to call super().__init__() (Paddle's fails with an AttributeError).
    batch_size_: int = 32
    _formatter: SampleFormatter | None = None

    def __init__(self) -> None:
        self.batch_size_ = 32
        self._formatter = None

    @property
    def _proto_info(self) -> list[tuple[str, str]] | None:
        """Paddle's per-slot types seen so far: ``[(name, "uint64"|"float")]``."""
        if self._formatter is None:
            return None
        return self._formatter.proto_info

    @_proto_info.setter
    def _proto_info(self, value: None) -> None:
        # Paddle code resets the first-sample schema by assigning None.
        if value is not None:
            raise ValueError(f"_proto_info can only be reset to None, got {value!r}")
        self._formatter = None

    def set_batch(self, batch_size: int) -> None:
        """Sets how many samples are grouped before ``generate_batch``.

        Args:
            batch_size: The number of samples per batch.

        Raises:
            ValueError: ``batch_size`` is not an int >= 1.
        """
        self.batch_size_ = _checked_batch_size(batch_size)

    def generate_sample(self, line: Any) -> SampleSource:
        """Turns one input line into samples. Must be overridden.

        Args:
            line: One line of stdin (a str with its trailing ``\\n``), or None
                under ``run_from_memory``. Typed ``Any`` so that an override
                may declare ``line: str``.

        Returns:
            A callable that takes no arguments and yields samples: lists or
            tuples (or zips) of ``(name, [values])`` pairs. None samples are
            skipped.
        """
        raise NotImplementedError(
            "Please rewrite this function to return a list or tuple: "
            "[(name, [feasign, ...]), ...] or ((name, [feasign, ...]), ...)"
        )

    def generate_batch(self, samples: list[Sample]) -> SampleSource:
        """Turns a batch of samples into the samples to write.

        Override it to emit samples that depend on the whole batch; the
        default yields the batch unchanged.

        Args:
            samples: Up to ``batch_size_`` samples from ``generate_sample``.

        Returns:
            A callable that takes no arguments and yields samples.
        """

        def local_iter() -> Iterator[Sample]:
            yield from samples

        return local_iter

    def run_from_stdin(self) -> None:
        """Writes the samples of every stdin line to stdout.

        Raises:
            SampleError: A sample is not valid; a note names the input line.
            Exception: What ``generate_sample`` or ``generate_batch`` raised,
                with the same note.
            SystemExit: stdout was closed by the process reading it (status 1,
                after a one-line message on stderr).
        """
        self._run(sys.stdin)

    def run_from_memory(self) -> None:
        """Writes the samples of ``generate_sample(None)`` to stdout.

        Raises:
            SampleError: A sample is not valid.
            SystemExit: stdout was closed by the process reading it.
        """
        self._run((None,))

    def write_multislot(
        self,
        lines: Iterable[str | None],
        write: Callable[[bytes], object],
        *,
        block_size: int = BLOCK_SIZE,
    ) -> None:
        """Writes the MultiSlot text of the samples of ``lines`` through ``write``.

        The bytes are those that ``run_from_stdin`` writes for these lines in a
        fresh process: the samples of ``generate_sample`` (through
        ``generate_batch`` when the class overrides it) in the class's format,
        from a new formatter, so samples are numbered from 1 and the first one
        fixes the slot schema. ``run_from_stdin``'s own formatter (and so
        ``_proto_info``) is left alone.

        Args:
            lines: The input lines, as ``sys.stdin`` gives them (with their
                ``\\n``), or ``[None]`` for ``generate_sample(None)``.
            write: Called with each block of bytes, in order.
            block_size: Blocks are at least this many bytes, except the last.

        Raises:
            SampleError: A sample is not valid; a note names the input line.
            ValueError: ``batch_size_`` is below 1.
        """
        self._write(lines, self._new_formatter(), self.batch_size_, write, block_size)

    @classmethod
    def uses_builtin_format(cls) -> bool:
        """Whether the class's text comes from the built-in compiled formatter.

        True for ``MultiSlotDataGenerator`` and ``MultiSlotStringDataGenerator``
        and their subclasses, unless a subclass writes its own ``_gen_str``;
        False for ``DataGenerator`` itself (whose ``_gen_str`` raises Paddle's
        error) and for any class with a ``_gen_str`` of its own.
        """
        return cls._gen_str in _BUILT_IN_FORMATS

    @classmethod
    def writes_samples_as_given(cls) -> bool:
        """Whether each sample becomes, as it is, one line of numeric MultiSlot text.

        True for a ``MultiSlotDataGenerator`` subclass that overrides neither
        ``generate_batch`` nor its text format (``_gen_str`` or the formatter
        it uses): each sample of ``generate_sample`` is then checked and
        written by a default ``SampleFormatter``, so the record a line parses
        to follows from its sample alone. datafeed's in-process path relies on
        this to skip the text.
        """
        return (
            issubclass(cls, MultiSlotDataGenerator)
            and cls._gen_str is MultiSlotDataGenerator._gen_str
            and cls._new_formatter is DataGenerator._new_formatter
            and cls.generate_batch is DataGenerator.generate_batch
        )

    def _gen_str(self, line: Sample) -> str:
        raise NotImplementedError(
            "pls use MultiSlotDataGenerator or PairWiseDataGenerator"
        )

    def _new_formatter(self) -> SampleFormatter:
        return SampleFormatter()

    def _sample_formatter(self) -> SampleFormatter:
        if self._formatter is None:
            self._formatter = self._new_formatter()
        return self._formatter

    def _run(self, lines: Iterable[str | None]) -> None:
        if sys.version_info < (3, 11):
            _print_notes_after_tracebacks()
        batch_size = _checked_batch_size(self.batch_size_)
        formatter = self._sample_formatter()
        stdout = sys.stdout
        write = _block_writer(stdout)
        try:
            self._write(lines, formatter, batch_size, write, BLOCK_SIZE)
            stdout.flush()
        except BrokenPipeError:
            _exit_on_broken_pipe(stdout)

    def _write(
        self,
        lines: Iterable[str | None],
        formatter: SampleFormatter,
        batch_size: int,
        write: Callable[[bytes], object],
        block_size: int,
    ) -> None:
        # The default generate_batch passes samples through unchanged, so
        # they can be formatted as they come, without building batches.
        generate_batch = (
            None
            if type(self).generate_batch is DataGenerator.generate_batch
            else self.generate_batch
        )
        # The compiled formatter writes the built-in formats; anything else
        # (a plain DataGenerator, a subclass's own _gen_str) goes through
        # _gen_str, which for DataGenerator raises Paddle's error.
        gen_str = None if self.uses_builtin_format() else self._gen_str
        run_generator(
            lines,
            self.generate_sample,
            generate_batch,
            batch_size,
            formatter,
            gen_str,
            write,
            block_size,
        )


class MultiSlotDataGenerator(DataGenerator):
    """A generator of numeric slots, checked as Paddle checks them.

    Every sample must be a list or tuple (or a zip) of ``(name, [values])``
    pairs with str names and non-empty lists of int or float values
    (``bool`` and numpy integer and floating scalars included). The first
    sample fixes the slot names and their order; every later sample must
    have the same. Output per slot: the number of values, then the values
    through ``str()``.

    Example::

        class Reader(MultiSlotDataGenerator):
            def generate_sample(self, line):
                def sample():
                    label, *ids = line.split()
                    yield [("ids", [int(i) for i in ids]), ("label", [int(label)])]
                return sample

        Reader().run_from_stdin()
    """

    def _gen_str(self, line: Sample) -> str:
        """Checks one sample and returns its line of text.

        Raises:
            SampleError: The sample is not valid.
        """
        return self._sample_formatter().format(line).decode()


class MultiSlotStringDataGenerator(DataGenerator):
    """A generator of string slots, written as they are.

    Values must be str (the caller has formatted them); no other check is
    made, as in Paddle: an empty list is written as ``0``.
    """

    def _new_formatter(self) -> SampleFormatter:
        return SampleFormatter(strings=True)

    def _gen_str(self, line: Sample) -> str:
        """Returns the line of text of one sample.

        Raises:
            SampleError: The sample is not a list of pairs, or a value is not
                a str.
        """
        return self._sample_formatter().format(line).decode()


_BUILT_IN_FORMATS = frozenset(
    {MultiSlotDataGenerator._gen_str, MultiSlotStringDataGenerator._gen_str}
)


def _checked_batch_size(batch_size: object) -> int:
    # Paddle takes anything; 0 or a float makes its batches silently never fill.
    if (
        isinstance(batch_size, bool)
        or not isinstance(batch_size, int)
        or batch_size < 1
    ):
        raise ValueError(f"the batch size must be an int >= 1, got {batch_size!r}")
    return batch_size


def _block_writer(stdout: TextIO) -> Callable[[bytes], object]:
    """A function that writes one block of bytes to ``stdout``, in full."""
    buffer = getattr(stdout, "buffer", None)
    if buffer is None:  # stdout replaced by a text-only stream (a test, a notebook)

        def write_text(block: bytes) -> object:
            return stdout.write(block.decode())

        return write_text

    def write_block(block: bytes) -> None:
        # Anything print()ed to stdout so far goes out first, in order.
        stdout.flush()
        written = buffer.write(block)
        if written is not None and written >= len(block):
            return
        # Under PYTHONUNBUFFERED (or python -u) stdout.buffer is a raw FileIO,
        # whose write may take only part of the block.
        _write_rest(buffer, memoryview(block)[written or 0 :])

    return write_block


def _write_rest(raw: BinaryIO, rest: memoryview) -> None:
    while rest:
        written = raw.write(rest)
        if written is None:  # a non-blocking stdout that is full: wait for room
            import select

            select.select([], [raw], [])
            continue
        rest = rest[written:]


def _exit_on_broken_pipe(stdout: TextIO) -> NoReturn:
    # The reader of our stdout has gone (`| head`, a failed loader). Point
    # stdout at /dev/null so that the interpreter's final flush does not
    # raise again, say what happened in one line and stop.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "generator"
    sys.stderr.write(
        f"{script}: stdout was closed by the process reading it (broken pipe); "
        "stopping\n"
    )
    sys.stderr.flush()
    raise SystemExit(1)


def _print_notes_after_tracebacks() -> None:
    """On Python 3.10, makes an uncaught error's ``__notes__`` (the input line of a
    bad sample) follow its traceback on stderr, where 3.11 prints them."""
    previous = sys.excepthook
    if getattr(previous, "prints_notes", False):
        return

    def excepthook(kind: type[BaseException], error: BaseException, tb: object) -> None:
        previous(kind, error, tb)
        for note in getattr(error, "__notes__", None) or ():
            print(note, file=sys.stderr)

    excepthook.prints_notes = True  # type: ignore[attr-defined]
    sys.excepthook = excepthook
