"""One logger per package, silent at INFO until the user configures logging; loads
and shuffles report files, lines/s, skipped lines and seeds at INFO."""

from __future__ import annotations

import importlib
import logging
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO, SMALL_SCHEMA, small_line

import datafeed
import generators
import trainer
from datafeed import InMemoryDataset, QueueDataset


def package_modules(package) -> list:
    names = [package.__name__] + [
        info.name for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
    ]
    return [importlib.import_module(name) for name in names]


@pytest.mark.parametrize("package", [datafeed, trainer, generators], ids=lambda p: p.__name__)
def test_every_logger_belongs_to_its_package(package):
    loggers = [
        (module.__name__, value.name)
        for module in package_modules(package)
        for value in vars(module).values()
        if isinstance(value, logging.Logger)
    ]
    assert all(
        name == package.__name__ or name.startswith(package.__name__ + ".") for _, name in loggers
    ), loggers
    if package is not generators:  # generators write nothing but their records
        assert loggers
    # A library adds no handler: where records go is the application's choice.
    assert logging.getLogger(package.__name__).handlers == []


def test_nothing_is_printed_at_info_by_default(tmp_path: Path):
    data = tmp_path / "part-0.txt"
    data.write_text("".join(small_line(i) for i in range(10)))
    script = f"""
import sys
sys.path.insert(0, "{REPO / 'tests' / 'helpers'}")
from support import SMALL_SCHEMA
from datafeed import InMemoryDataset
from trainer import fleet
fleet.init()
dataset = InMemoryDataset()
dataset.init(batch_size=4, use_var=SMALL_SCHEMA)
dataset.set_filelist(["{data}"])
dataset.load_into_memory()
dataset.local_shuffle()
print(sum(batch.size for batch in dataset))
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout == "10\n"
    assert result.stderr == ""


def info_messages(caplog, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == name and r.levelno == logging.INFO]


def test_a_load_logs_files_throughput_and_skipped_lines(tmp_path: Path, caplog):
    paths = []
    for f in range(2):
        path = tmp_path / f"part-{f}.txt"
        path.write_text("".join(small_line(i) for i in range(5)) + ("bad line\n" if f else ""))
        paths.append(str(path))
    dataset = InMemoryDataset()
    dataset.init(use_var=SMALL_SCHEMA, on_bad_line="skip")
    dataset.set_filelist(paths)
    with caplog.at_level(logging.INFO, logger="datafeed"):
        dataset.load_into_memory()
    message = info_messages(caplog, "datafeed")[0]
    assert message.startswith("loaded 2 files: 11 lines"), message
    for part in ("10 records", "1 skipped lines"):
        assert part in message, message
    assert re.search(r"[0-9.]+ MB in [0-9.]+ s \([0-9]+ lines/s\)$", message), message
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["skipped 1 malformed lines: {'bad_count': 1}"]


def test_shuffles_log_their_seed(small_files, caplog):
    dataset = InMemoryDataset()
    dataset.init(use_var=SMALL_SCHEMA)
    dataset.set_filelist(small_files)
    dataset.load_into_memory()
    with caplog.at_level(logging.INFO, logger="datafeed"):
        dataset.local_shuffle(seed=7)
        dataset.local_shuffle()  # a fresh seed: logged, and kept
        dataset.slots_shuffle(["ids"], seed=3)
    assert info_messages(caplog, "datafeed") == [
        "local_shuffle of 15 records with seed 7",
        f"local_shuffle of 15 records with seed {dataset.state_dict()['shuffles'][1][1]}",
        "slots_shuffle of ['ids'] over 15 records with seed 3",
    ]


def test_a_queue_dataset_pass_logs_its_load(small_files, caplog):
    dataset = QueueDataset()
    dataset.init(batch_size=4, use_var=SMALL_SCHEMA)
    dataset.set_filelist(small_files)
    with caplog.at_level(logging.INFO, logger="datafeed"):
        assert sum(batch.size for batch in dataset) == 15
    message = info_messages(caplog, "datafeed")[0]
    assert message.startswith("loaded 3 files: 15 lines"), message
    assert "15 records" in message and "0 skipped lines" in message, message
    assert message.endswith(" lines/s)"), message


def test_fleet_init_logs_the_role(monkeypatch, caplog):
    for name in ("PADDLE_PSERVERS_IP_PORT_LIST", "TRAINING_ROLE", "RANK", "WORLD_SIZE",
                 "PADDLE_TRAINER_ENDPOINTS"):
        monkeypatch.delenv(name, raising=False)
    with caplog.at_level(logging.INFO, logger="trainer"):
        trainer.fleet.init()
    [message] = info_messages(caplog, "trainer.fleet")
    assert message.startswith("fleet.init: ")
