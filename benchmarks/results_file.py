"""benchmarks/RESULTS.md: one section per benchmark script, between markers.

Each script replaces only its own ``<!-- NAME:begin -->`` ... ``<!-- NAME:end -->``
section, so that the scripts can run separately (or all through ``make bench``)
and the file always holds the latest figures of each.
"""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def write_section(name: str, markdown: str, path: Path = RESULTS) -> None:
    """Puts ``markdown`` in the ``name`` section of ``path``, keeping the rest."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n{markdown.strip()}\n{end}"
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    start, stop = text.find(begin), text.find(end)
    if start != -1 and stop > start:
        text = text[:start] + block + text[stop + len(end) :]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


def as_section(markdown: str) -> str:
    """A report whose title is a level-1 heading, demoted to level 2."""
    lines = markdown.splitlines()
    return "\n".join("#" + line if line.startswith("# ") else line for line in lines)
