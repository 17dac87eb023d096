"""benchmarks/RESULTS.md: one section per benchmark script, between markers.

Each script replaces only its own ``<!-- NAME:begin -->`` ... ``<!-- NAME:end -->``
section, so that the scripts can run separately (or all through ``make bench``)
and the file always holds the latest figures of each. ``commit``, ``command``
and ``load_average`` give what every written figure carries with it.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
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


def commit() -> str:
    """HEAD's short hash, marked when tracked files differ from it (the figures
    then measured code that no commit holds)."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=False)
        # The results a running benchmark rewrites are not code it measures.
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain",
                                "--untracked-files=no", "--", ".", ":!benchmarks/results"],
                               capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    name = head.stdout.strip() or "unknown"
    return name + (" with uncommitted changes" if dirty.stdout.strip() else "")


def command() -> str:
    """The command line that ran this script, as a reader would retype it."""
    script = Path(sys.argv[0]).resolve()
    with contextlib.suppress(ValueError):  # a script outside the repository: its full path
        script = script.relative_to(Path(__file__).resolve().parent.parent)
    return " ".join(["python", str(script), *(shlex.quote(a) for a in sys.argv[1:])])


def load_average() -> float:
    """The machine's 1-minute load average now."""
    return os.getloadavg()[0]
