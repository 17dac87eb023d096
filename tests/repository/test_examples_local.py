"""The trainer examples run end to end on small data and learn."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO

EXAMPLES = REPO / "examples"


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
