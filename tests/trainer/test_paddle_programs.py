"""The programs Paddle users bring, ported by their imports (``paddle_programs/``),
run as a Paddle user runs them: on 2 ranks, and checked against what they must
compute. Fleet's collective quick start is ``test_collective_optimizer.py``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from support import run_collective_ranks
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
