"""The repository carries what its tests, docs and examples use.

A user has the clone alone: nothing may point outside it (the project's own
checkouts once sat next to a ``shared/`` folder that users do not have), and the
real samples it carries are the files its README describes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support import REAL_DATA, REPO

# Folders that are built, installed or generated here, not part of the project.
NOT_PROJECT = {".git", "build", "dist", "__pycache__", ".pytest_cache", ".hypothesis", "log"}
OUTSIDE = "../" + "shared"  # spelled in two pieces so that this file does not match itself


def project_files() -> list[Path]:
    files = []
    for path in REPO.rglob("*"):
        parts = path.relative_to(REPO).parts
        if any(p in NOT_PROJECT or p.startswith(".venv") or p.endswith(".egg-info") for p in parts):
            continue
        if parts[:2] in {("benchmarks", "data"), ("examples", "data")} or not path.is_file():
            continue
        if path.suffix in {".so", ".c", ".whl", ".gz", ".arrow"}:
            continue
        files.append(path)
    return files


def test_nothing_refers_to_a_folder_outside_the_repository():
    found = []
    for path in project_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if OUTSIDE in line:
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not found, "references outside the repository:\n" + "\n".join(found)


def readme_line_counts() -> dict[str, int]:
    counts = {}
    for line in (REAL_DATA / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 2 and "." in cells[0] and re.match(r"[\d,]+", cells[1]):
            counts[cells[0]] = int(re.match(r"[\d,]+", cells[1]).group().replace(",", ""))
    return counts


def test_the_samples_readme_lists_every_sample_with_its_exact_line_count():
    counts = readme_line_counts()
    on_disk = sorted(p.name for p in REAL_DATA.iterdir() if p.name != "README.md")
    assert sorted(counts) == on_disk
    for name, lines in counts.items():
        data = (REAL_DATA / name).read_bytes()
        # A last line without a final newline is a line too.
        assert data.count(b"\n") + (not data.endswith(b"\n")) == lines, name
    assert not (REAL_DATA / "criteo_raw.tsv").read_bytes().endswith(b"\n")


@pytest.mark.parametrize("name", ["NOTICE", "examples/data/real/README.md"])
def test_the_samples_name_their_source_and_licence(name: str):
    text = (REPO / name).read_text()
    assert "PaddleRec" in text and "Apache License 2.0" in text
