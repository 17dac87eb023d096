"""The programs Paddle users bring, ported by their imports (``paddle_programs/``),
run as a Paddle user runs them (``fleetrun``, or Paddle's environment variables),
on 2 ranks, and checked against what they must compute: Fleet's quick start in
its three forms, Paddle's model-parallel AlexNet, PaddleRec's ten-line paradigm.
``test_collective_optimizer.py`` covers the collective quick start's corners
(ranks that start apart, DDP or not, accumulation).
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from support import REPO, finish_job, reserved_ports, run_collective_ranks
from torch.nn import functional as F

pytestmark = pytest.mark.distributed

PROGRAMS = Path(__file__).resolve().parent / "paddle_programs"


def load_program(name: str):
    spec = importlib.util.spec_from_file_location(name, PROGRAMS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_two_ranks(tmp_path: Path, program: str, *args: str) -> list[dict[str, np.ndarray]]:
    for rank, (code, output) in enumerate(
        run_collective_ranks(PROGRAMS / f"{program}.py", [str(tmp_path), *args])
    ):
        assert code == 0, f"rank {rank} exited {code}:\n{output}"
    return [dict(np.load(tmp_path / f"rank{rank}.npz")) for rank in (0, 1)]


def alexnet_first_step_in_one_process(ranks: list[dict[str, np.ndarray]]):
    """The full model (the convolutions as rank 0 broadcast them, each fully
    connected layer the two ranks' slices stacked) on both ranks' first batches,
    with the ranks' dropout masks, minimising the mean of the two losses."""
    alexnet = load_program("model_parallel_alexnet")
    full = alexnet.SimpleModelParallelClassifierNet(class_num=10, rank_num=1, rank_id=0)
    with torch.no_grad():
        for name, parameter in full.named_parameters():
            if name.startswith("model_parallel_linear"):
                parameter.copy_(torch.from_numpy(np.concatenate(
                    [ranks[0][f"start/{name}"], ranks[1][f"start/{name}"]]
                )))
            else:
                parameter.copy_(torch.from_numpy(ranks[0][f"start/{name}"]))
    outputs, losses = [], []
    for rank in (0, 1):
        image, label = alexnet.batch(0, rank)
        torch.manual_seed(7 + rank)
        outputs.append(full(image))
        losses.append(F.cross_entropy(outputs[-1], label))
    ((losses[0] + losses[1]) / 2).backward()
    return outputs, dict(full.named_parameters())


@pytest.mark.slow
def test_model_parallel_alexnet_equals_one_process_on_both_batches(tmp_path):
    """Paddle's model-parallel AlexNet on 2 ranks, each with its own batch: the
    first step's outputs and gradients are one process's, with the full weights,
    on both batches (1e-5: float32 sums in another order); after 20 Adam steps the
    replicated parameters are equal across ranks and the slices differ."""
    ranks = run_two_ranks(tmp_path, "model_parallel_alexnet", "20")
    replicated = [k.removeprefix("start/") for k in ranks[0]
                  if k.startswith("start/conv")]
    shards = [k.removeprefix("start/") for k in ranks[0]
              if k.startswith("start/model_parallel_linear")]
    assert len(replicated) == 10 and len(shards) == 6
    for name in replicated:  # rank 0's start, broadcast
        assert np.array_equal(ranks[0][f"start/{name}"], ranks[1][f"start/{name}"]), name
    for name in shards:  # each rank's own slice, never broadcast
        assert not np.allclose(ranks[0][f"start/{name}"], ranks[1][f"start/{name}"]), name

    outputs, full = alexnet_first_step_in_one_process(ranks)
    for rank in (0, 1):
        np.testing.assert_allclose(
            ranks[rank]["output"], outputs[rank].detach().numpy(), atol=1e-5, rtol=0
        )
        for name in replicated:
            np.testing.assert_allclose(
                ranks[rank][f"grad/{name}"], full[name].grad.numpy(), atol=1e-5, rtol=0,
                err_msg=f"rank {rank}: {name}",
            )
        for name in shards:
            rows = full[name].grad.shape[0] // 2
            np.testing.assert_allclose(
                ranks[rank][f"grad/{name}"],
                full[name].grad[rank * rows : (rank + 1) * rows].numpy(),
                atol=1e-5, rtol=0, err_msg=f"rank {rank}: {name}",
            )

    for name in replicated:
        np.testing.assert_allclose(
            ranks[0][f"end/{name}"], ranks[1][f"end/{name}"], atol=1e-6, rtol=0, err_msg=name
        )
        assert not np.array_equal(ranks[0][f"end/{name}"], ranks[0][f"start/{name}"]), name
    for name in shards:
        assert not np.allclose(ranks[0][f"end/{name}"], ranks[1][f"end/{name}"]), name


def fleetrun(tmp_path: Path, *args: str) -> None:
    """``fleetrun ARGS`` in ``tmp_path`` (its logs go there), asserting it exits 0."""
    result = subprocess.run(
        [sys.executable, "-m", "trainer.job.launch", *args], cwd=tmp_path,
        capture_output=True, text=True, timeout=180, check=False,
    )
    logs = {p.name: p.read_text()[-2000:] for p in (tmp_path / "log").glob("*")}
    assert result.returncode == 0, (result.stdout, result.stderr, logs)


@pytest.mark.slow
def test_the_three_forms_of_fleets_quick_start_train_one_model(tmp_path):
    """The MLP of Fleet's quick start, 20 SGD steps from one start: the local
    form on both workers' batches as one, the parameter-server form (1 server,
    2 workers, synchronous) and the collective form (2 ranks, no
    distributed_model) end at the same parameters. 1e-6: float32 sums in
    another order moved them by at most 1.5e-8 here."""
    steps = "20"
    local = subprocess.run(
        [sys.executable, str(PROGRAMS / "quick_start_local.py"), str(tmp_path), steps],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert local.returncode == 0, local.stderr
    assert local.stdout.splitlines()[-1].startswith("step19 cost=")
    fleetrun(tmp_path, "--server_num=1", "--worker_num=2",
             str(PROGRAMS / "quick_start_ps.py"), str(tmp_path), steps)
    fleetrun(tmp_path, "--nproc_per_node=2",
             str(PROGRAMS / "quick_start_collective.py"), str(tmp_path), steps)
    expected = np.load(tmp_path / "local.npz")
    torch.manual_seed(0)
    start = load_program("nets").MLP().state_dict()
    for form in ("ps_worker0", "ps_worker1", "collective0", "collective1"):
        trained = np.load(tmp_path / f"{form}.npz")
        assert sorted(trained) == sorted(expected) == sorted(start)
        for name in expected:
            assert not np.allclose(expected[name], start[name].numpy(), atol=1e-4), name
            np.testing.assert_allclose(trained[name], expected[name], atol=1e-6, rtol=0,
                                       err_msg=f"{form}: {name}")


def write_ctr_files(directory: Path, files: int, lines: int) -> set[int]:
    """Raw CTR lines ``label, user, item, category``: a click's chance is a
    logistic of a fixed weight per user and per item; the ids the reader makes
    of them (one table, a range per field) are returned."""
    rng = random.Random(5)
    user_weight = [rng.gauss(0, 1.5) for _ in range(60)]
    item_weight = [rng.gauss(0, 1.5) for _ in range(40)]
    directory.mkdir()
    ids = set()
    for f in range(files):
        rows = []
        for _ in range(lines):
            user, item, category = rng.randrange(60), rng.randrange(40), rng.randrange(5)
            chance = 1 / (1 + np.exp(-(user_weight[user] + item_weight[item])))
            rows.append(f"{int(rng.random() < chance)}\t{user}\t{item}\t{category}\n")
            if f < files - 1:  # the last file is held out
                ids |= {user, (1 << 32) | item, (2 << 32) | category}
        (directory / f"part-{f}").write_text("".join(rows))
    return ids


@pytest.mark.slow
def test_paddlerec_paradigm_runs_a_two_by_two_job_from_paddles_variables(tmp_path):
    """PaddleRec's guide: 2 servers and 2 workers, each process started with
    the guide's environment variables and the same script. Every record trains
    once per pass on one worker, the table holds every id, the synchronous
    workers end with the same dense parameters, and the model learned."""
    data = tmp_path / "data"
    ids = write_ctr_files(data, files=5, lines=400)
    out = tmp_path / "out"
    out.mkdir()
    with reserved_ports(2) as ports:
        servers = [f"127.0.0.1:{port}" for port in ports]
        common = dict(
            os.environ, PADDLE_PSERVERS_IP_PORT_LIST=",".join(servers), PADDLE_TRAINERS_NUM="2",
            FLEETFEED_JOB_KEY="paddlerec-paradigm-test-key", PYTHONPATH=str(REPO),
            OMP_NUM_THREADS="1",
        )
        roles = [
            {"TRAINING_ROLE": "PSERVER", "POD_IP": "127.0.0.1", "PADDLE_PORT": str(port)}
            for port in ports
        ] + [{"TRAINING_ROLE": "TRAINER", "PADDLE_TRAINER_ID": str(i)} for i in (0, 1)]
        procs = []
        for index, role in enumerate(roles):
            with open(tmp_path / f"process{index}.log", "w") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, str(PROGRAMS / "paddlerec_paradigm.py"), str(data), str(out)],
                    env={**common, **role}, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                ))
        finish_job(procs, 180, tmp_path)
    workers = [json.loads((out / f"worker{i}.json").read_text()) for i in (0, 1)]
    # Files 0 and 2 on worker 0, 1 and 3 on worker 1: 800 records each, every pass.
    for worker in workers:
        assert [p["records"] for p in worker["passes"]] == [800, 800]
        assert worker["passes"][1]["mean_loss"] < worker["passes"][0]["mean_loss"]
        assert worker["rows"] == len(ids)
    for a, b in zip(workers[0]["dense"], workers[1]["dense"], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
    # The true weights score 0.905 on the held-out file; the job reached 0.888 in
    # 3 runs of 3 (synchronous: the same every run), so 0.87 catches a loss of 0.02.
    assert workers[0]["auc"] > 0.87, workers[0]
