"""Fixtures and hooks only; the helpers that tests import are in ``helpers/``
(``support.py`` first), which this file puts on ``sys.path``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "helpers"))

from support import REPO, child_pids, write_small_files  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    """Child processes (pipe commands, generators, workers, test files run as
    scripts) import this checkout, whether or not it is installed in the
    interpreter running the tests, and the helpers (``from support import ...``)."""
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), str(REPO / "tests" / "helpers")]
        + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    )


@pytest.fixture
def small_files(tmp_path: Path) -> list[str]:
    """Three files of five small records each (records 0-14, in order)."""
    return write_small_files(tmp_path, files=3, per_file=5)


@pytest.fixture(autouse=True)
def no_leftover_children():
    """Every test must leave no child process behind, but Hogwild trainer
    processes waiting for a next pass (by design: ended here, as at exit)."""
    yield
    hogwild_processes = sys.modules.get("trainer.loop.hogwild_processes")
    if hogwild_processes is not None:
        hogwild_processes.close_workers()
    assert child_pids() == [], "a test left child processes running"
