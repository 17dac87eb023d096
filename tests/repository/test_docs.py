"""Every fenced code block of README.md and docs/*.md runs, or says why not.

Each document's blocks run in order, in one fresh directory (``work/``, with
``examples/`` linked in, so that ``examples/data/real/...`` resolves as it does
from the repository root):

- a ``python`` block is executed; the blocks of one document share one namespace
  (one Python process per document);
- a ``sh`` / ``bash`` / ``shell`` block runs in ``bash -e -o pipefail`` (the
  ``fleetrun`` and ``datafeed`` commands work without installing: they fall back
  to ``python -m trainer.job.launch`` / ``python -m datafeed.cli``).

An HTML comment right before a block changes that:

- ``<!-- file: NAME -->`` writes the block to ``NAME`` and ``<!-- append: NAME -->``
  appends it (for a ``reader.py`` or ``train.py`` that other blocks run; another
  runnable block must mention ``NAME``, or its file name when ``NAME`` is in a
  directory of its own, as in ``porting/train.py``);
- ``<!-- tested-in: tests/FILE.py::TEST -->``: another test runs it (the test
  must exist);
- ``<!-- not-tested: REASON -->``: an illustration (output, a directory layout).

Any other block (another language, no language) without a marker fails
``test_every_block_runs_or_is_marked``.

A reader follows the pages one after another in one directory (the repository
root), so no page may write a file that another page writes: neither a file of
a ``file``/``append`` marker (``test_no_two_pages_write_the_same_file``) nor any
file that running its blocks leaves behind, fleetrun's logs aside (checked after
each page against the pages run before it). And every file a page leaves
behind is one that ``.gitignore`` covers, so that following the docs leaves
``git status`` clean.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PYTHON_LANGS = {"python", "py"}
SHELL_LANGS = {"sh", "bash", "shell"}
MARKER = re.compile(r"<!--\s*(not-tested|tested-in|file|append)\s*:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(`{3,})\s*([\w+-]*)\s*$")
DOC_TIMEOUT = 300


@dataclass
class Block:
    doc: str  # the path relative to the repository
    line: int  # line number of the first line of code (1-based)
    lang: str
    code: str
    marker: str | None = None  # not-tested, tested-in, file, append
    argument: str = ""

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def blocks_of(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, each with the marker right before it."""
    lines = path.read_text().splitlines()
    doc = str(path.relative_to(REPO))
    found: list[Block] = []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        ticks, lang = fence.group(1), fence.group(2).lower()
        end = i + 1
        while end < len(lines) and lines[end].strip() != ticks:
            end += 1
        if end == len(lines):
            raise AssertionError(f"{doc}:{i + 1}: a code fence that is never closed")
        block = Block(doc, i + 2, lang, "\n".join(lines[i + 1 : end]) + "\n")
        before = i - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        marker = MARKER.match(lines[before].strip()) if before >= 0 else None
        if marker:
            block.marker, block.argument = marker.group(1), marker.group(2)
        found.append(block)
        i = end + 1
    return found


def runnable(block: Block) -> bool:
    return block.marker in ("file", "append") or (
        block.marker is None and block.lang in PYTHON_LANGS | SHELL_LANGS
    )


ALL_BLOCKS = {path.name: blocks_of(path) for path in DOCS}


def test_every_block_runs_or_is_marked():
    problems = []
    for blocks in ALL_BLOCKS.values():
        for block in blocks:
            if block.marker is None and block.lang not in PYTHON_LANGS | SHELL_LANGS:
                problems.append(
                    f"{block.where}: a ```{block.lang} block that nothing runs: make it "
                    "python or sh, or mark it <!-- not-tested: why --> "
                    "(see tests/repository/test_docs.py)"
                )
            elif block.marker == "not-tested" and len(block.argument) < 5:
                problems.append(f"{block.where}: not-tested needs a reason")
            elif block.marker == "tested-in":
                file, _, test = block.argument.partition("::")
                source = REPO / file
                if not source.is_file() or not re.search(
                    rf"^def {re.escape(test)}\(", source.read_text(), re.MULTILINE
                ):
                    problems.append(f"{block.where}: tested-in names no test: {block.argument}")
            elif block.marker in ("file", "append"):
                others = [b.code for b in blocks if b is not block and runnable(b)]
                # A file in a directory of its own is run from there, by its name.
                names = {block.argument, Path(block.argument).name}
                if not any(name in code for code in others for name in names):
                    problems.append(
                        f"{block.where}: {block.argument} is written but no other block uses it"
                    )
    assert not problems, "\n".join(problems)


def test_no_two_pages_write_the_same_file():
    writers: dict[str, list[str]] = {}
    for blocks in ALL_BLOCKS.values():
        for block in blocks:
            if block.marker in ("file", "append"):
                where = writers.setdefault(os.path.normpath(block.argument), [])
                if not any(w.startswith(f"{block.doc}:") for w in where):
                    where.append(block.where)
    shared = {name: where for name, where in writers.items() if len(where) > 1}
    assert not shared, "\n".join(
        f"{name} is written by {' and by '.join(where)}: a reader who follows both pages "
        "loses the first one's file; give each page its own file names or directory"
        for name, where in shared.items()
    )


def test_the_readme_says_how_long_make_test_takes_and_how_to_run_less():
    readme = (REPO / "README.md").read_text()
    # The time is quoted from what benchmarks/suite_rounds.py wrote, once it ran.
    assert "<!-- results:results/suite:begin -->" in readme, (
        "README.md must quote benchmarks/results/suite.md: how long `make test` takes"
    )
    if (REPO / "benchmarks" / "results" / "suite.md").exists():
        assert re.search(r"`make test` takes .*?\d+ min \d+ s", readme, re.DOTALL), (
            "README.md must say how long `make test` takes (measured: N min N s)"
        )
    subsets = [
        b.code for b in ALL_BLOCKS["README.md"] if re.search(r"pytest -m \"[^\"]+\"", b.code)
    ]
    assert subsets, "README.md must show a faster part of the suite (pytest -m \"...\")"
    expression = re.search(r"pytest -m \"([^\"]+)\"", subsets[0]).group(1)
    used = set(re.findall(r"\w+", expression)) - {"not", "and", "or"}
    # pyproject.toml's markers list, one '"name: what it means",' a line (no
    # tomllib: the suite runs on Python 3.10 too).
    markers = re.search(r"^markers = \[(.*?)^\]", (REPO / "pyproject.toml").read_text(),
                        re.MULTILINE | re.DOTALL)
    assert markers, "pyproject.toml declares no pytest markers"
    declared = set(re.findall(r'^\s*"(\w+):', markers.group(1), re.MULTILINE))
    assert used <= declared, f"README.md selects markers pyproject.toml lacks: {used - declared}"


def test_the_marker_parser_sees_every_kind():
    kinds = {b.marker for blocks in ALL_BLOCKS.values() for b in blocks}
    assert {None, "file", "not-tested"} <= kinds
    assert sum(len(blocks) for blocks in ALL_BLOCKS.values()) >= 15


def test_the_slot_specs_of_docs_cli_md_parse(tmp_path: Path):
    from datafeed import parse_slots

    specs = [
        b.code for b in ALL_BLOCKS["cli.md"]
        if b.argument.endswith("::test_the_slot_specs_of_docs_cli_md_parse")
    ]
    assert len(specs) == 2
    compact = parse_slots(specs[0].strip())
    slots_file = tmp_path / "slots.txt"
    slots_file.write_text(specs[1])
    assert parse_slots(str(slots_file)) == compact
    assert [s.name for s in compact] == ["dense_feature", *(f"C{i}" for i in range(1, 27)), "label"]


@pytest.mark.parametrize(
    "name", [name for name, blocks in ALL_BLOCKS.items() if any(runnable(b) for b in blocks)]
)
def test_doc_snippets_run(name: str, tmp_path: Path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "examples").symlink_to(REPO / "examples")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps([asdict(b) for b in ALL_BLOCKS[name] if runnable(b)]))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    result = subprocess.run(
        [sys.executable, __file__, str(plan)],
        cwd=work, env=env, capture_output=True, text=True, timeout=DOC_TIMEOUT, check=False,
    )
    assert result.returncode == 0, f"{name}:\n{result.stdout[-4000:]}\n{result.stderr[-6000:]}"
    ran = re.findall(r"^docs-test: ran (\S+)$", result.stdout, re.MULTILINE)
    assert len(ran) == sum(1 for b in ALL_BLOCKS[name] if runnable(b) and b.marker is None)

    left = files_left_in(work)
    not_ignored = not_ignored_by_git(left)
    assert not not_ignored, (
        f"following {name} in the repository root leaves files that .gitignore does not "
        f"cover (git status would show them): {sorted(not_ignored)}"
    )
    for earlier, their_files in FILES_LEFT_BY_PAGE.items():
        shared = {path for path in left & their_files if not path.startswith(SHARED_OUTPUT)}
        assert not shared, (
            f"{name} and {earlier} both write {sorted(shared)}: a reader who follows both "
            "pages in one directory loses the first one's files; give each page its own "
            "file names or directory"
        )
    FILES_LEFT_BY_PAGE[name] = left


# The files each page run so far in this session left behind, for the next pages.
FILES_LEFT_BY_PAGE: dict[str, set[str]] = {}
# fleetrun's default log directory: every job rewrites it, whichever page started it.
SHARED_OUTPUT = ("log/",)


def files_left_in(work: Path) -> set[str]:
    """Every file under ``work`` (relative paths), but what is in its ``examples`` link."""
    left = set()
    for directory, subdirectories, files in os.walk(work):
        if Path(directory) == work and "examples" in subdirectories:
            subdirectories.remove("examples")
        left.update(str((Path(directory) / f).relative_to(work)) for f in files)
    return left


def not_ignored_by_git(paths: set[str]) -> set[str]:
    """The ``paths`` (relative to the repository root) that .gitignore does not cover."""
    if not paths:
        return set()
    checked = subprocess.run(
        ["git", "check-ignore", "--no-index", "--stdin", "-z", "--verbose", "--non-matching"],
        cwd=REPO, input="\0".join(sorted(paths)) + "\0", capture_output=True, text=True,
        check=False,
    )
    # 0: some paths are ignored, 1: none is; --non-matching lists every path either way.
    assert checked.returncode in (0, 1), checked.stderr
    # Four fields a path: the rule's file, line and pattern (all empty when no rule
    # covers the path), then the path.
    fields = checked.stdout.split("\0")[:-1]
    return {fields[i + 3] for i in range(0, len(fields), 4) if not fields[i]}


# -- the driver: one process per document, run in its work directory ----------------

SHELL_PRELUDE = """
command -v fleetrun >/dev/null || fleetrun() { "$FLEETFEED_PYTHON" -m trainer.job.launch "$@"; }
command -v datafeed >/dev/null || datafeed() { "$FLEETFEED_PYTHON" -m datafeed.cli "$@"; }
command -v python >/dev/null || python() { "$FLEETFEED_PYTHON" "$@"; }
"""


def drive(plan_path: str) -> None:
    """Runs the blocks of a plan (written by ``test_doc_snippets_run``) in order."""
    namespace: dict = {"__name__": "__docs__"}
    # `python` in a block (and in a pipe command) is this interpreter.
    os.environ["PATH"] = os.pathsep.join(
        [os.path.dirname(sys.executable), os.environ.get("PATH", "")]
    )
    env = dict(os.environ, FLEETFEED_PYTHON=sys.executable)
    for raw in json.loads(Path(plan_path).read_text()):
        block = Block(**raw)
        if block.marker == "file":
            Path(block.argument).parent.mkdir(parents=True, exist_ok=True)
            Path(block.argument).write_text(block.code)
            continue
        if block.marker == "append":
            with open(block.argument, "a") as out:
                out.write(block.code)
            continue
        print(f"docs-test: running {block.where}", flush=True)
        if block.lang in PYTHON_LANGS:
            # Padded so that tracebacks give the line numbers of the document.
            code = compile("\n" * (block.line - 1) + block.code, block.doc, "exec")
            exec(code, namespace)  # noqa: S102 - running the docs is the point
        else:
            result = subprocess.run(
                ["bash", "-e", "-o", "pipefail", "-c", SHELL_PRELUDE + block.code],
                env=env, check=False,
            )
            if result.returncode != 0:
                raise SystemExit(f"{block.where}: the shell block exited with {result.returncode}")
        print(f"docs-test: ran {block.where}", flush=True)


if __name__ == "__main__":
    drive(sys.argv[1])
