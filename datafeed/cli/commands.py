"""The ``datafeed`` command line: look at what a reader produces before a long job.

``datafeed preview``  the first records of each file, decoded per slot name;
``datafeed check``    the first bad lines (file:line, slot, token), all counted by reason;
``datafeed stats``    records, values per record of each slot, distinct ids, speed;
``datafeed convert``  the parsed records as Parquet or a fleetfeed cache file.

Each command runs ``--pipe`` on every FILE (the file on its stdin, as a dataset
does) and parses the output with the slots of ``--slots`` (see
``datafeed.config.spec``). Line numbers are those of the pipe command's output, which
are the input file's for a one-record-per-line reader.

Exit status: 0 when all is well, 1 when ``check`` finds bad lines or a reader
fails, 2 on a usage error (bad arguments, a missing file, a bad slot spec).

What the data (or a reader's stderr, or a file's name) holds reaches the
terminal through ``_printable``: a control character is shown escaped, never
sent, so a file cannot retitle, clear or recolour the user's terminal.
"""

from __future__ import annotations

import argparse
import json
import logging
import mmap
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any, TextIO, cast

from ..config.errors import DatafeedError, ParseError, ReaderError
from ..config.slots import Slot, SlotSchema
from ..config.spec import parse_slots
from ..datasets.progress import LoadProgress, progress_enabled
from ..parse.parsing import ChunkParser, chunk_to_arrow, parse_bytes
from ..records.stats import LoadCounters
from ..source import fs
from ..source.process import feed_in_pieces
from ..source.readers import is_identity_command, start_command

__all__ = ["main"]

SHOWN_VALUES = 8
# The parser is fed this much at a time by ``check``: parsed rows are dropped
# after each piece, so memory stays flat whatever the file's size.
CHECK_FEED_BYTES = 1 << 20
# Bad lines ``check`` reports in full unless told otherwise (--examples): each
# costs a few hundred bytes, and the rest are counted by reason anyway.
DEFAULT_EXAMPLES = 100


class UsageError(Exception):
    """A problem with the command line's arguments (exit status 2)."""


# -- helpers shared by the commands ----------------------------------------------------


def _schema(spec: str) -> SlotSchema:
    return SlotSchema(parse_slots(spec))


def _printable(text: str, *, lines: bool = False) -> str:
    """``text`` with every character that is not printable (ESC, CR, BEL, a
    right-to-left override) written as Python writes it in a string literal
    (``\\x1b``), and a file name's byte that is not UTF-8 (``\\udcff``) as
    that byte (``\\xff``); printable Unicode stays as it is. With ``lines``
    (a message that quotes a reader's stderr), newlines and tabs stay too."""
    if text.isprintable():
        return text
    kept = "\n\t" if lines else ""
    return "".join(c if c in kept else _escaped(c) for c in text)


def _escaped(character: str) -> str:
    if character.isprintable():
        return character
    code = ord(character)
    if 0xDC80 <= code <= 0xDCFF:  # os.fsdecode's stand-in for the byte code - 0xDC00
        return f"\\x{code - 0xDC00:02x}"
    return ascii(character)[1:-1]


def _check_files(paths: Sequence[str]) -> None:
    missing = fs.missing_files(paths)  # local paths or URIs (datafeed/source/fs.py)
    if missing:
        raise FileNotFoundError(
            f"{len(missing)} of {len(paths)} input files do not exist: " + ", ".join(missing)
        )


def _format_value(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _format_values(values: Sequence[Any]) -> str:
    shown = " ".join(_format_value(v) for v in values[:SHOWN_VALUES])
    if len(values) > SHOWN_VALUES:
        shown += f" ... (+{len(values) - SHOWN_VALUES} more)"
    return shown


def _slot_kind(slot: Slot) -> str:
    return f"dense{list(slot.shape)}" if slot.shape is not None else "sparse"


def _dataset(args: argparse.Namespace, schema: SlotSchema, on_bad_line: str) -> Any:
    from ..datasets.inmemory import InMemoryDataset

    dataset = InMemoryDataset()
    dataset.init(
        batch_size=1,
        thread_num=args.threads,
        use_var=list(schema),
        pipe_command=args.pipe,
        on_bad_line=on_bad_line,
        progress=args.progress,
        split_files=getattr(args, "split_files", None),
    )
    dataset.set_filelist(args.files)
    return dataset


# -- preview ---------------------------------------------------------------------------


def _first_lines(command: str, path: str, count: int) -> tuple[list[bytes], bool]:
    """The first ``count`` output lines of ``command`` on ``path``, and whether the
    output ended before that (the command then ran to its end and was checked)."""
    process = start_command(command, path)
    try:
        lines: list[bytes] = []
        stdout = cast(IO[bytes], process.stdout)  # Popen(stdout=PIPE) always has one
        while len(lines) < count:
            line = stdout.readline()
            if not line:
                process.wait()  # the whole output was read: a failure is an error
                return lines, True
            lines.append(line)
        return lines, False
    finally:
        process.close()  # kills the command when we stopped reading early


def _decode_loosely(schema: SlotSchema, line: bytes) -> list[tuple[str, str]]:
    """Each slot's count and value tokens as the line holds them, whatever their
    type: how a misaligned line lines up against the slots."""
    tokens = line.split()
    rows = []
    position = 0
    for slot in schema:
        if position >= len(tokens):
            rows.append((slot.name, "(missing: the line ends here)"))
            continue
        count_token = tokens[position]
        try:
            count = int(count_token)
        except ValueError:
            rows.append((slot.name, f"count {count_token!r} is not an integer"))
            position += 1
            continue
        end = position + 1 + max(count, 0)
        values = [t.decode("utf-8", "replace") for t in tokens[position + 1 : end]]
        position = end
        rows.append((slot.name, f"count {count:>3}: {_format_values(values)}"))
    if position < len(tokens):
        extra = [t.decode("utf-8", "replace") for t in tokens[position:]]
        rows.append(("(trailing)", f"{len(extra)} tokens: {_format_values(extra)}"))
    return rows


def _preview(args: argparse.Namespace, out: TextIO) -> int:
    schema = _schema(args.slots)
    _check_files(args.files)
    if args.n < 1:
        raise UsageError(f"-n must be >= 1, got {args.n}")
    width = max(len(s.name) for s in schema)
    bad = 0
    for path in args.files:
        print(_printable(f"== {path} (pipe: {args.pipe}) =="), file=out)
        lines, _ = _first_lines(args.pipe, path, args.n)
        if not lines:
            print("(no records)", file=out)
        for number, line in enumerate(lines, start=1):
            try:
                chunk = parse_bytes(schema, line, path)
            except ParseError as error:
                bad += 1
                what = str(error).replace(f"{path}, line 1", f"{path}:{number}", 1)
                print(_printable(f"record {number}: BAD LINE {what}"), file=out)
                for name, text in _decode_loosely(schema, line):
                    print(_printable(f"  {name:<{width}}  {text}"), file=out)
                continue
            record = chunk_to_arrow(schema, chunk).to_pylist()[0]
            print(f"record {number}:", file=out)
            for slot in schema:
                values = record[slot.name]
                print(
                    f"  {slot.name:<{width}}  {slot.dtype:<7} {_slot_kind(slot):<10} "
                    f"count {len(values):>3}: {_format_values(values)}",
                    file=out,
                )
    return 1 if bad else 0


# -- check -----------------------------------------------------------------------------


@dataclass
class _FileCheck:
    """What ``check`` found in one file: every bad line counted (by reason),
    the first ones of the run (``--examples``) in full."""

    path: str
    lines: int = 0
    records: int = 0
    bad: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    examples: list[dict[str, Any]] = field(default_factory=list)
    reader_error: str | None = None
    bytes: int = 0


def _command_output(command: str, path: str) -> tuple[Any, Any]:
    """The pipe command's whole output on ``path`` as an open file (a temporary
    file, or the input itself for plain ``cat``), and that file's size."""
    if is_identity_command(command) and not fs.is_gzip(path) and not fs.is_remote(path):
        file = open(path, "rb")  # noqa: SIM115 - closed by the caller
        return file, os.fstat(file.fileno()).st_size
    output = tempfile.TemporaryFile()  # noqa: SIM115 - returned open to the caller
    process = start_command(command, path)
    try:
        shutil.copyfileobj(cast(IO[bytes], process.stdout), output, 1 << 20)
        output.flush()  # the caller maps the file: the bytes must be in it
        process.wait()
    except BaseException:
        output.close()
        raise
    finally:
        process.close()
    return output, output.tell()


def _feed_all(parser: ChunkParser, view: memoryview) -> None:
    """Feeds ``view`` to the parser piece by piece, dropping the parsed rows."""
    start = feed_in_pieces(parser, view, CHECK_FEED_BYTES, parser.take_chunk)
    parser.feed_final(view[start:])
    parser.take_chunk()


def _check_text(
    schema: SlotSchema, path: str, data: mmap.mmap, view: memoryview, result: _FileCheck,
    examples: int,
) -> None:
    """Counts the lines, records and bad lines of ``view`` by reason, and keeps
    the first ``examples`` bad lines in full."""
    # Pass 1, skip mode: the counts (lines, records, reasons) at full speed.
    counter = ChunkParser(schema, path, skip_bad_lines=True, max_line_bytes=max(len(view), 1))
    _feed_all(counter, view)
    result.lines, result.records = counter.lines, counter.records
    result.bad, result.reasons = counter.skipped_lines, counter.skipped_reasons
    if not counter.skipped_lines:
        return
    # Pass 2, raise mode: the skip mode keeps only the first few messages, so
    # the examples are found by parsing on from just after the previous one.
    offset, base_line = 0, 0
    while offset <= len(view) and len(result.examples) < examples:
        parser = ChunkParser(schema, path, max_line_bytes=max(len(view), 1))
        try:
            _feed_all(parser, view[offset:])
            return
        except ParseError as error:
            line = base_line + error.line
            message = str(error)
            prefix = f"{path}, line {error.line}"
            rest = message[len(prefix):] if message.startswith(prefix) else f": {message}"
            where = f"{path}:{line}"
            text = f"{where}: {rest[2:]}" if rest.startswith(", ") else where + rest
            result.examples.append(
                {
                    "file": path,
                    "line": line,
                    "slot": error.slot,
                    "token": (
                        None if error.token is None else error.token.decode("utf-8", "replace")
                    ),
                    "message": text,
                }
            )
            for _ in range(error.line):  # move past the bad line
                newline = data.find(b"\n", offset)
                offset = len(view) if newline < 0 else newline + 1
            base_line = line
            if offset >= len(view):
                return


def _check(args: argparse.Namespace, out: TextIO) -> int:
    schema = _schema(args.slots)
    _check_files(args.files)
    if args.examples < 0:
        raise UsageError(f"--examples must be >= 0, got {args.examples}")
    examples_left = args.examples
    counters = LoadCounters()
    progress = LoadProgress(len(args.files), progress_enabled(args.progress), "checking")
    results = []
    started = time.perf_counter()
    try:
        for path in args.files:
            result = _FileCheck(path)
            results.append(result)
            try:
                file, size = _command_output(args.pipe, path)
            except ReaderError as error:
                result.reader_error = str(error)
            else:
                with file:
                    result.bytes = size
                    if size:
                        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                            view = memoryview(mapped)
                            try:
                                _check_text(schema, path, mapped, view, result, examples_left)
                            finally:
                                view.release()
                        examples_left -= len(result.examples)
            counters.add(result.lines, result.bytes)
            counters.file_done()
            progress.update(counters)
    finally:
        progress.close()
    seconds = time.perf_counter() - started
    bad = sum(r.bad for r in results)
    shown = sum(len(r.examples) for r in results)
    failed = [r for r in results if r.reader_error]
    summary = {
        "files": len(results),
        "lines": sum(r.lines for r in results),
        "records": sum(r.records for r in results),
        "bad_lines": bad,
        "bad_shown": shown,
        "reader_errors": len(failed),
        "seconds": round(seconds, 3),
        "per_file": [
            {
                "file": r.path,
                "lines": r.lines,
                "records": r.records,
                "bad_lines": r.bad,
                "reasons": r.reasons,
                "reader_error": r.reader_error,
            }
            for r in results
        ],
        "bad": [b for r in results for b in r.examples],
    }
    if args.json:
        json.dump(summary, out, indent=2)
        out.write("\n")
    else:
        for result in results:
            for line in result.examples:
                print(_printable(line["message"]), file=out)
            if result.reader_error:
                failure = f"{result.path}: reader failed: {result.reader_error}"
                print(_printable(failure, lines=True), file=out)
        if bad > shown:
            more = f"{bad - shown} more bad line" + ("s" if bad - shown > 1 else "")
            print(f"... and {more}, counted by reason below (--examples N shows more)",
                  file=out)
        for result in results:
            reasons = ", ".join(f"{k}={v}" for k, v in sorted(result.reasons.items()))
            state = "READER FAILED" if result.reader_error else (
                f"{result.bad} bad" + (f" ({reasons})" if reasons else "")
            )
            print(
                _printable(f"{result.path}: {result.lines} lines, {result.records} records, "
                          f"{state}"),
                file=out,
            )
        verdict = "OK" if not bad and not failed else "FAILED"
        print(
            f"{verdict}: {summary['files']} files, {summary['lines']} lines, "
            f"{summary['records']} records, {bad} bad lines, {len(failed)} reader errors "
            f"in {seconds:.2f} s",
            file=out,
        )
    return 1 if bad or failed else 0


# -- stats -----------------------------------------------------------------------------


def _slot_stats(slot: Slot, column: Any) -> dict[str, Any]:
    import pyarrow.compute as pc

    lengths = pc.list_value_length(column)
    values = pc.list_flatten(column)
    rows = len(column)
    return {
        "slot": slot.name,
        "dtype": slot.dtype,
        "kind": _slot_kind(slot),
        "values": len(values),
        "min_per_record": pc.min(lengths).as_py() if rows else 0,
        "mean_per_record": round(pc.mean(lengths).as_py(), 4) if rows else 0.0,
        "max_per_record": pc.max(lengths).as_py() if rows else 0,
        "distinct": pc.count_distinct(values).as_py() if len(values) else 0,
    }


def _stats(args: argparse.Namespace, out: TextIO) -> int:
    schema = _schema(args.slots)
    _check_files(args.files)
    dataset = _dataset(args, schema, args.on_bad_line)
    dataset.load_into_memory()
    load = dataset.stats()
    table = dataset.to_arrow()
    slots = [_slot_stats(slot, table.column(slot.name)) for slot in schema]
    input_bytes = sum(fs.stat(p).size for p in args.files)
    seconds = max(load.seconds, 1e-9)
    report = {
        "files": load.files,
        "lines": load.lines,
        "records": load.records,
        "skipped_lines": load.skipped_lines,
        "skipped_reasons": load.skipped_reasons,
        "input_mb": round(input_bytes / 1e6, 6),
        "text_mb": round(load.bytes / 1e6, 6),
        "seconds": round(load.seconds, 4),
        "lines_per_second": round(load.lines / seconds, 1),
        "slots": slots,
    }
    if args.json:
        json.dump(report, out, indent=2)
        out.write("\n")
        return 0
    print(
        f"{report['files']} files, {report['lines']} lines, {report['records']} records, "
        f"{report['skipped_lines']} skipped lines",
        file=out,
    )
    print(
        f"{report['input_mb']:.3f} MB of input, {report['text_mb']:.3f} MB of MultiSlot "
        f"text in {load.seconds:.2f} s ({report['lines_per_second']:,.0f} lines/s)",
        file=out,
    )
    width = max(len(s.name) for s in schema)
    print(
        f"{'slot':<{width}}  {'dtype':<7} {'kind':<10} {'values':>10} {'min':>6} "
        f"{'mean':>8} {'max':>6} {'distinct':>9}",
        file=out,
    )
    for row in slots:
        print(
            f"{row['slot']:<{width}}  {row['dtype']:<7} {row['kind']:<10} {row['values']:>10} "
            f"{row['min_per_record']:>6} {row['mean_per_record']:>8.2f} "
            f"{row['max_per_record']:>6} {row['distinct']:>9}",
            file=out,
        )
    return 0


# -- convert ---------------------------------------------------------------------------


def _convert(args: argparse.Namespace, out: TextIO) -> int:
    schema = _schema(args.slots)
    _check_files(args.files)
    dataset = _dataset(args, schema, args.on_bad_line)
    dataset.load_into_memory()
    os.makedirs(args.out, exist_ok=True)
    if args.format == "parquet":
        import pyarrow.parquet as pq

        target = os.path.join(args.out, "data.parquet")
        pq.write_table(dataset.to_arrow(), target)
    else:  # the cache file of datafeed/records/cache.py: InMemoryDataset.load_cache() reads it
        target = os.path.join(args.out, "data.arrow")
        dataset.save_cache(target)
    with open(os.path.join(args.out, "slots.txt"), "w", encoding="utf-8") as file:
        file.write("# name dtype [shape]: datafeed.parse_slots() reads this file\n")
        for slot in schema:
            shape = "" if slot.shape is None else " " + "x".join(map(str, slot.shape))
            file.write(f"{slot.name} {slot.dtype}{shape}\n")
    load = dataset.stats()
    print(
        f"wrote {load.records} records ({load.skipped_lines} lines skipped) from "
        f"{load.files} files to {target}",
        file=out,
    )
    return 0


# -- the parser of the command line -----------------------------------------------------


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "files", nargs="+", metavar="FILE", help="input files (.gz is decompressed)"
    )
    parser.add_argument(
        "--pipe",
        default="cat",
        metavar="CMD",
        help="shell command run per file, the file on its stdin, printing MultiSlot "
        "text (default: cat)",
    )
    parser.add_argument(
        "--slots",
        required=True,
        metavar="SPEC",
        help="the slots, in order: 'dense:float32:13,C1..C26:uint64,label:int64:1' "
        "(name:dtype[:shape]; no shape = sparse) or a file of 'name dtype [shape]' lines",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log what the load does (seed, speed)"
    )
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show a progress bar (default: when stderr is a terminal)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``datafeed`` argument parser, with one sub-command per tool."""
    parser = argparse.ArgumentParser(
        prog="datafeed",
        description="Look at what a reader (pipe command) produces: preview, check, "
        "stats and convert MultiSlot data.",
        epilog="Exit status: 0 OK, 1 bad lines or a failed reader, 2 usage error.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    preview = commands.add_parser(
        "preview", help="print the first records of each file, decoded per slot",
        description="Print the first records of each file, each slot by name with its "
        "value count and values; a line that does not parse is shown token by token "
        "against the slots, so a misaligned slot is obvious.",
    )
    _add_common(preview)
    preview.add_argument("-n", type=int, default=5, help="records per file (default 5)")
    preview.set_defaults(run=_preview)

    check = commands.add_parser(
        "check", help="report bad lines; non-zero exit status when any",
        description="Parse every line, report the first bad ones as FILE:LINE: slot, "
        "what was expected and the token found, and count all of them by reason in a "
        "summary per file.",
    )
    _add_common(check)
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.add_argument(
        "--examples", type=int, default=DEFAULT_EXAMPLES, metavar="N",
        help=f"bad lines reported in full, the first of all files (default "
        f"{DEFAULT_EXAMPLES}); every bad line is counted by reason",
    )
    check.set_defaults(run=_check)

    stats = commands.add_parser(
        "stats", help="records, values per record of each slot, distinct ids, speed",
        description="Load every file and print record counts, per-slot value counts "
        "per record (min/mean/max), distinct values, MB and lines/s.",
    )
    _add_common(stats)
    stats.add_argument("--threads", "-j", type=int, default=1, help="files read at once")
    stats.add_argument(
        "--split-files", action=argparse.BooleanOptionalAction, default=None,
        help="with fewer files than -j, read large files as byte ranges, each by its own "
        "reader (default: with --pipe cat only; say so for a reader that treats each "
        "line on its own)",
    )
    stats.add_argument(
        "--on-bad-line", choices=("raise", "skip"), default="skip",
        help="skip (and count) bad lines, or stop at the first (default: skip)",
    )
    stats.add_argument("--json", action="store_true", help="print the report as JSON")
    stats.set_defaults(run=_stats)

    convert = commands.add_parser(
        "convert", help="write the parsed records as Parquet or a fleetfeed cache",
        description="Load every file and write the records to DIR/data.parquet (or "
        "DIR/data.arrow, a cache that InMemoryDataset.load_cache reads), with the "
        "slots in DIR/slots.txt.",
    )
    _add_common(convert)
    convert.add_argument("--out", required=True, metavar="DIR", help="output directory")
    convert.add_argument(
        "--format", choices=("parquet", "arrow"), default="parquet",
        help="parquet (default) or arrow (the fleetfeed cache format)",
    )
    convert.add_argument("--threads", "-j", type=int, default=1, help="files read at once")
    convert.add_argument(
        "--split-files", action=argparse.BooleanOptionalAction, default=None,
        help="with fewer files than -j, read large files as byte ranges, each by its own "
        "reader (default: with --pipe cat only; say so for a reader that treats each "
        "line on its own)",
    )
    convert.add_argument(
        "--on-bad-line", choices=("raise", "skip"), default="raise",
        help="stop at the first bad line (default) or skip and count them",
    )
    convert.set_defaults(run=_convert)
    for sub in (preview, check):
        sub.set_defaults(threads=1)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``datafeed`` command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(name)s: %(levelname)s: %(message)s",
    )
    try:
        status = int(args.run(args, sys.stdout))
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        # `datafeed preview ... | head` closed our stdout: stop quietly (the
        # recipe of the Python docs, so that the exit-time flush fails silently too).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except (UsageError, DatafeedError, OSError) as error:
        sys.stdout.flush()
        if isinstance(error, (ReaderError, ParseError)):  # the data, not the usage
            print(_printable(f"datafeed {args.command}: {error}", lines=True), file=sys.stderr)
            return 1
        print(_printable(f"datafeed {args.command}: error: {error}", lines=True),
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
