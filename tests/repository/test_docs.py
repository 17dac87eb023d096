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
  runnable block must mention ``NAME``);
- ``<!-- tested-in: tests/FILE.py::TEST -->``: another test runs it (the test
  must exist);
- ``<!-- not-tested: REASON -->``: an illustration (output, a directory layout).

Any other block (another language, no language) without a marker fails
``test_every_block_runs_or_is_marked``.
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
                if not any(block.argument in code for code in others):
                    problems.append(
                        f"{block.where}: {block.argument} is written but no other block uses it"
                    )
    assert not problems, "\n".join(problems)


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
