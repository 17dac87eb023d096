"""Fixtures and hooks only; the helpers that tests import are in ``helpers/``
(``support.py`` first), which this file puts on ``sys.path``."""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "helpers"))

from support import REPO, child_pids, write_small_files  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    """Child processes (pipe commands, generators, workers, test files run as
    scripts) import this checkout, whether or not it is installed in the
    interpreter running the tests, and the helpers (``from support import ...``)."""
    # Every job has a key (loopback is shared by the machine's users): the jobs
    # the tests start share this one unless a test sets or removes its own.
    os.environ.setdefault("FLEETFEED_JOB_KEY", secrets.token_hex(32))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), str(REPO / "tests" / "helpers")]
        + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    )


@pytest.fixture(scope="session", autouse=True)
def checkpoint_root_for_tests(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The parameter servers the tests start save and load under the tests'
    temporary directories (a server takes a directory from a message only under
    its checkpoint root, trainer/ps/checkpoint/confined.py)."""
    os.environ.setdefault("FLEETFEED_CHECKPOINT_ROOT", str(tmp_path_factory.getbasetemp()))


@pytest.fixture
def small_files(tmp_path: Path) -> list[str]:
    """Three files of five small records each (records 0-14, in order)."""
    return write_small_files(tmp_path, files=3, per_file=5)


@pytest.fixture(autouse=True)
def local_tables_start_at_pass_0():
    """``fleet.set_pass`` is process-wide, as Paddle's: a test that sets it sets
    it for the tables of every test after it (a random order found one whose
    checkpoint then held pass 3 where it expected 0)."""
    yield
    stores = sys.modules.get("trainer.embedding.stores")
    if stores is not None:
        stores.local_store().set_pass(0)


@pytest.fixture(autouse=True)
def no_leftover_children():
    """Every test must leave no child process behind, but Hogwild trainer
    processes waiting for a next pass (by design: ended here, as at exit)."""
    yield
    hogwild_processes = sys.modules.get("trainer.loop.hogwild_processes")
    if hogwild_processes is not None:
        hogwild_processes.close_workers()
    assert child_pids() == [], "a test left child processes running"
