"""Quotes the benchmarks' results into the README and the docs, so that every
figure there is one a benchmark script wrote.

A quote is a block in a Markdown file::

    <!-- results:SOURCE:begin -->
    ...
    <!-- results:SOURCE:end -->

where SOURCE names a section of ``benchmarks/RESULTS.md`` (``engine``) or a
file of ``benchmarks/results/`` (``results/small_ctr``), optionally followed by
``#K`` for its K-th table (the first by default). The block holds the source's
paragraph that says how its figures were made (the command, commit, load) and
that table, verbatim, with a link to the whole source.

    python benchmarks/quote_results.py           # rewrites every quote
    python benchmarks/quote_results.py --check   # exit 1 where a quote is stale

``make bench`` runs it after the benchmarks; the test suite runs ``--check``
(``tests/repository/test_figures.py``), so a quote never disagrees with its
source.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
RESULTS_DIR = ROOT / "benchmarks" / "results"
QUOTE = re.compile(
    r"<!-- results:(?P<source>[\w/]+(?:#\d+)?):begin -->\n.*?<!-- results:(?P=source):end -->",
    re.S,
)


def documents() -> list[Path]:
    """The Markdown files that may quote results."""
    return [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "examples").glob("*/README.md")),
        ROOT / "benchmarks" / "README.md",
        ROOT / "SECURITY.md",
    ]


def _source_text(source: str) -> tuple[str, Path]:
    """The Markdown of ``source`` (a RESULTS.md section or a results file), and
    the file it lies in."""
    if source.startswith("results/"):
        path = RESULTS_DIR / (source.removeprefix("results/") + ".md")
        if not path.is_file():  # a benchmark not run yet
            return "", path
        return path.read_text(), path
    text = RESULTS.read_text()
    begin, end = f"<!-- {source}:begin -->", f"<!-- {source}:end -->"
    start, stop = text.find(begin), text.find(end)
    if start == -1 or stop < start:
        raise SystemExit(f"quote_results: benchmarks/RESULTS.md has no section {source!r}")
    return text[start + len(begin) : stop], RESULTS


def _paragraphs(markdown: str) -> list[str]:
    return [p.strip("\n") for p in re.split(r"\n\s*\n", markdown) if p.strip()]


def quoted(source: str, into: Path) -> str:
    """The body of a quote of ``source`` placed in the file ``into``."""
    name, _, index = source.partition("#")
    text, path = _source_text(name)
    if not text:
        return f"No results yet: `{path.relative_to(ROOT)}` is written by its benchmark script."
    paragraphs = _paragraphs(text)
    tables = [p for p in paragraphs if p.startswith("|")]
    wanted = int(index or 1)
    if not 1 <= wanted <= len(tables):
        raise SystemExit(
            f"quote_results: {source!r} asks for table {wanted}; {path.name} "
            f"{'section ' + name if path == RESULTS else ''} has {len(tables)}"
        )
    how = next(
        (p for p in paragraphs if not p.startswith(("#", "|", "<", "-"))),
        "",
    )
    how = " ".join(how.split())  # one line: a wrapped "+ 2 workers" is no list item
    link = os.path.relpath(path, into.parent)
    where = f"[{path.relative_to(ROOT)}]({link})"
    if path == RESULTS:
        where += f", section `{name}`"
    intro = f"Quoted by `benchmarks/quote_results.py` from {where}." + (f" {how}" if how else "")
    return f"{intro}\n\n{tables[wanted - 1]}"


def refreshed(path: Path) -> str:
    """``path``'s text with every quote rewritten from its source."""
    def replace(match: re.Match) -> str:
        source = match.group("source")
        return (
            f"<!-- results:{source}:begin -->\n{quoted(source, path)}\n"
            f"<!-- results:{source}:end -->"
        )

    return QUOTE.sub(replace, path.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 naming every stale quote")
    args = parser.parse_args(argv)
    stale = []
    for path in documents():
        if not path.exists():
            continue
        text = refreshed(path)
        if text != path.read_text():
            stale.append(path.relative_to(ROOT))
            if not args.check:
                path.write_text(text)
    if args.check and stale:
        print("quote_results: stale quotes in " + ", ".join(map(str, stale))
              + "; run python benchmarks/quote_results.py", file=sys.stderr)
        return 1
    for name in stale:
        print(f"quote_results: rewrote the quotes of {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
