"""The trainer examples run end to end on small data and learn."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO

EXAMPLES = REPO / "examples"
MAKE_DATA = EXAMPLES / "criteo" / "make_data.py"


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_data(out_dir: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(MAKE_DATA), str(out_dir), *flags],
        capture_output=True, text=True, timeout=60, check=False,
    )


def line_counts(out_dir: Path) -> dict[str, int]:
    """Lines per ``part-*.tsv`` file of ``out_dir``."""
    return {
        path.name: len(path.read_text().splitlines())
        for path in sorted(out_dir.glob("part-*.tsv"))
    }


def test_make_data_regenerates_its_directory_when_the_flags_change(tmp_path):
    out = tmp_path / "data"
    assert make_data(out, "--files", "3", "--lines", "40").returncode == 0
    assert line_counts(out) == {f"part-0000{i}.tsv": 40 for i in range(3)}
    # Fewer files of other sizes: nothing of the earlier run is left for a glob to find.
    result = make_data(out, "--files", "2", "--lines", "25")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(out / "part-00000.tsv"), str(out / "part-00001.tsv")]
    assert line_counts(out) == {"part-00000.tsv": 25, "part-00001.tsv": 25}
    # The same flags again: the files are kept, not rewritten.
    written = {path: path.stat().st_mtime_ns for path in out.glob("part-*.tsv")}
    assert make_data(out, "--files", "2", "--lines", "25").returncode == 0
    assert {path: path.stat().st_mtime_ns for path in out.glob("part-*.tsv")} == written
    # Another seed is other data.
    before = (out / "part-00000.tsv").read_text()
    assert make_data(out, "--files", "2", "--lines", "25", "--seed", "1").returncode == 0
    assert (out / "part-00000.tsv").read_text() != before


def test_make_data_refuses_files_it_did_not_stamp(tmp_path):
    out = tmp_path / "data"
    out.mkdir()
    (out / "part-00000.tsv").write_text("someone else's data\n")
    result = make_data(out, "--files", "2", "--lines", "25")
    assert result.returncode == 1
    assert result.stderr == (
        f"make_data.py: {out} holds 1 part-*.tsv file(s) (part-00000.tsv, ...) but no "
        ".params stamp, so they may be another program's or an older run's: expected an "
        "empty directory or one make_data.py stamped; remove them or choose another directory\n"
    )
    assert (out / "part-00000.tsv").read_text() == "someone else's data\n"


def test_make_data_run_by_several_processes_at_once_writes_the_files_once(tmp_path):
    out = tmp_path / "data"
    command = [sys.executable, str(MAKE_DATA), str(out), "--files", "3", "--lines", "500"]
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE) for _ in range(3)]
    outputs = [process.communicate(timeout=60)[0] for process in processes]
    assert [process.returncode for process in processes] == [0, 0, 0]
    assert len(set(outputs)) == 1
    assert line_counts(out) == {f"part-0000{i}.tsv": 500 for i in range(3)}


@pytest.mark.slow
def test_wide_and_deep_trains_on_data_of_its_own_flags(tmp_path):
    # A run with --lines 200, then --lines 100: the second trains on 100-line files.
    env = dict(os.environ, PYTHONPATH=str(REPO))
    script = EXAMPLES / "wide_and_deep_ps" / "train.py"
    flags = ["--files", "3", "--epochs", "1", "--print-period", "1000"]
    for lines in ("200", "100"):
        result = subprocess.run(
            [sys.executable, str(script), *flags, "--lines", lines],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "held-out AUC: wide&deep" in result.stdout
        assert line_counts(tmp_path / "wide_and_deep_data") == {
            f"part-0000{i}.tsv": int(lines) for i in range(3)
        }


@pytest.mark.slow
def test_mlp_local_learns_and_prints_paddles_lines(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # main() extends it
    monkeypatch.syspath_prepend(str(EXAMPLES / "criteo"))
    module = load_module(EXAMPLES / "mlp_local" / "train.py", "mlp_local_train")
    result = module.main([
        "--data", str(tmp_path / "data"), "--files", "3", "--lines", "4000",
        "--epochs", "2", "--print-period", "10",
    ])
    out = capsys.readouterr().out
    assert result["loss1"] < result["loss0"]
    assert result["auc"] > 0.85
    assert re.search(r"^time: \[[^]]+\], batch: \[10\], loss\[1\]:\[[0-9.]+\]$", out, re.MULTILINE)
    assert re.search(
        r"^epoch 1: mean loss [0-9.]+, [0-9,]+ records/s, held-out AUC 0\.\d+$", out, re.MULTILINE
    )


def fleetrun(tmp_path: Path, script: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "trainer.job.launch", "--nproc_per_node=2", str(script), *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )


@pytest.mark.slow
@pytest.mark.distributed
def test_collective_mlp_two_processes(tmp_path):
    # Data an earlier run left with other flags: more files, of another size. None
    # of it may reach the training or the held-out set.
    stale = make_data(tmp_path / "collective_mlp_data", "--files", "8", "--lines", "50")
    assert stale.returncode == 0, stale.stderr
    result = fleetrun(tmp_path, EXAMPLES / "collective_mlp" / "train.py", "--lines", "3000")
    assert result.returncode == 0, result.stdout + result.stderr
    epochs = re.findall(
        r"epoch (\d): mean loss ([0-9.]+) over 2 workers, held-out AUC ([0-9.]+) on 6000 records",
        result.stdout,
    )
    assert [e[0] for e in epochs] == ["0", "1"], result.stdout
    assert float(epochs[1][1]) < float(epochs[0][1])
    assert float(epochs[1][2]) > 0.85
    assert "rank 1/2: training on ['collective_mlp_data/part-00002.tsv', " in result.stdout


@pytest.mark.slow
@pytest.mark.distributed
def test_model_parallel_alexnet_two_processes(tmp_path):
    result = fleetrun(
        tmp_path, EXAMPLES / "model_parallel_alexnet" / "train.py",
        "--train", "1536", "--test", "256", "--epochs", "3",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    accuracy = [float(a) for a in re.findall(r"held-out accuracy ([0-9.]+)", result.stdout)]
    losses = [float(a) for a in re.findall(r"mean loss ([0-9.]+)", result.stdout)]
    assert len(accuracy) == 3 and accuracy[-1] > 0.6, result.stdout
    assert losses[-1] < 0.6 * losses[0]
    assert "replicated parameters in sync across 2 ranks: True" in result.stdout


@pytest.mark.slow
@pytest.mark.distributed
def test_online_training_trains_each_arriving_slice_once_and_lists_each_save_once(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    online = EXAMPLES / "online_training"
    # Two hourly slices land while the job runs: the job waits for each done file.
    slices = subprocess.Popen(
        [sys.executable, str(online / "make_slices.py"), "online_data", "--hours", "2",
         "--lines", "300", "--every", "0.2"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    job = [sys.executable, "-m", "trainer.job.launch", "--server_num=1", "--worker_num=2",
           str(online / "train.py"), "--data", "online_data", "--out", "online_out",
           "--hours", "{0..1}", "--timeout", "60"]
    try:
        first = subprocess.run(job, cwd=tmp_path, env=env, capture_output=True, text=True,
                               timeout=180, check=False)
    finally:
        slices.wait(timeout=60)
    log = (tmp_path / "log" / "workerlog.0").read_text()
    assert first.returncode == 0, first.stdout + first.stderr + log
    aucs = re.findall(r"^day 20261127 pass (\d) \((\d\d)\): 600 records, cluster AUC ([0-9.]+),",
                      log, re.MULTILINE)
    assert [(p, s) for p, s, _ in aucs] == [("1", "00"), ("2", "01")], log
    assert float(aucs[-1][2]) > 0.8  # the slices follow a logistic model the job learns
    out = tmp_path / "online_out"
    # Every record of a pass dumped once over both workers, by its instance id.
    for number, hour in ((1, "00"), (2, "01")):
        dumped = [line.split("\t")[0]
                  for part in sorted((out / "dump" / "20261127" / str(number)).iterdir())
                  for line in part.read_text().splitlines()]
        expected = [f"20261127{hour}-{k}-{i}"
                    for k in range(2) for i in range(300)]
        assert sorted(dumped) == sorted(expected), number
    donefile = (out / "donefile.txt").read_text().splitlines()
    # The untrained model (listed as the day before's end), the passes, the day's end.
    assert [line.split("\t")[3] for line in donefile] == ["-1", "1", "2", "-1"]
    assert len((out / "xbox_patch_done.txt").read_text().splitlines()) == 2
    start_line, base_line = (out / "xbox_base_done.txt").read_text().splitlines()
    assert json.loads(start_line)["input"].endswith("/20261126/base/000")
    # Each listed delta holds the rows its pass changed (a full save before it
    # would leave it empty).
    for number in (1, 2):
        tables = subprocess.run(
            [sys.executable, "-m", "trainer.ps.checkpoint.table_files",
             str(out / "20261127" / f"delta-{number}")],
            env=env, capture_output=True, text=True, timeout=60, check=True,
        ).stdout
        rows = [int(n) for n in re.findall(r"^  (?:user|item): (\d+) rows", tables, re.MULTILINE)]
        assert len(rows) == 2 and min(rows) > 100, tables
    # A job that died after listing the base in donefile.txt, before the serving
    # side's line: the restart adds that line, and trains and lists nothing twice.
    (out / "xbox_base_done.txt").write_text(start_line + "\n")
    again = subprocess.run(job, cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=120, check=False)
    log = (tmp_path / "log" / "workerlog.0").read_text()
    assert again.returncode == 0, again.stdout + again.stderr + log
    assert "resuming after day 20261127 pass -1" in log and "cluster AUC" not in log
    assert (out / "donefile.txt").read_text().splitlines() == donefile
    assert len((out / "xbox_patch_done.txt").read_text().splitlines()) == 2
    repaired = json.loads((out / "xbox_base_done.txt").read_text().splitlines()[-1])
    assert repaired["key"] == json.loads(base_line)["key"]
    assert repaired["input"].endswith("/20261127/base/000")
