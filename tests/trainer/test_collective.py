"""Collective mode: two real processes, a gloo group on 127.0.0.1, timeouts everywhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import run_collective_ranks

pytestmark = pytest.mark.distributed

WORKER = r'''
import json, os, sys
import torch
from torch import nn
from trainer import Executor, fleet
from trainer import collective
from trainer.job.errors import WorkerFailedError

out, scenario = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
result = {}
if scenario == "alone":
    try:
        fleet.init(is_collective=True, timeout=2)
    except WorkerFailedError as error:
        result["error"] = str(error)
        result["rank"] = error.rank
    json.dump(result, open(os.path.join(out, f"rank{rank}.json"), "w"))
    sys.exit(0)

fleet.init(is_collective=True, timeout=20)
result["role"] = [fleet.worker_index(), fleet.worker_num(), fleet.is_first_worker()]
if scenario == "peer_dies":
    if rank == 1:
        os._exit(0)
    try:
        collective.all_gather(torch.ones(2), dim=0)
    except WorkerFailedError as error:
        result["error"] = str(error)
    json.dump(result, open(os.path.join(out, f"rank{rank}.json"), "w"))
    os._exit(0)

if scenario == "huge_size":
    from trainer.collective import process_group
    from trainer.job.errors import TrainerError
    import torch.distributed as dist

    if rank == 1:  # announces a terabyte, as a hostile or broken rank could
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(2)]
        dist.all_gather(sizes, torch.tensor([1 << 40], dtype=torch.int64))
    else:
        try:
            process_group.all_gather_bytes(b"state")
        except TrainerError as error:
            result["error"] = str(error)
    json.dump(result, open(os.path.join(out, f"rank{rank}.json"), "w"))
    os._exit(0)

if scenario == "uneven_dataset":
    from datafeed import InMemoryDataset, Slot
    from trainer.job.errors import TrainerError

    path = os.path.join(out, f"part-{rank}.txt")
    with open(path, "w") as f:  # 24 records on rank 0, 32 on rank 1: 3 and 4 batches
        for i in range(24 + 8 * rank):
            f.write(f"3 {i % 3} {i % 5} {i % 7}\n")
    dataset = InMemoryDataset()
    dataset.init(batch_size=8, thread_num=1, use_var=[Slot("x", "float32", (3,))])
    dataset.set_filelist([path])
    dataset.load_into_memory()
    model = nn.Linear(3, 1)
    optimizer = fleet.distributed_optimizer(torch.optim.Adam(model.parameters(), lr=0.01))
    def forward(batch):
        return {"loss": model(batch["x"]).pow(2).mean()}
    try:
        Executor().train_from_dataset(forward, dataset, optimizer, thread=1, fetch_list=[])
    except TrainerError as error:
        result["error"] = str(error)
    dataset.update_settings(equal_batches=True)
    summary = Executor().train_from_dataset(forward, dataset, optimizer, thread=1, fetch_list=[])
    result["batches"] = summary.batches
    result["steps"] = optimizer.state_dict()["state"][0]["step"].item()
    json.dump(result, open(os.path.join(out, f"rank{rank}.json"), "w"))
    fleet.stop_worker()
    sys.exit(0)

# 1. model-parallel layers equal one full layer built with the same seed, once the
# optimizer averaged the replicated gradients and scaled the shards' (the ranks'
# backwards give the gradient of the sum of their equal losses).
torch.manual_seed(123)  # same input on both ranks
x = torch.randn(4, 6, requires_grad=True)
column = collective.ColumnParallelLinear(6, 8, seed=7)
row = collective.RowParallelLinear(8, 3, seed=9)
layers_optimizer = fleet.distributed_optimizer(
    torch.optim.SGD([*column.parameters(), *row.parameters()], lr=0.1)
)
y = row(column(x))
(y ** 2).sum().backward()
layers_optimizer.average_gradients()
full_c, full_r = nn.Linear(6, 8), nn.Linear(8, 3)
g = torch.Generator().manual_seed(7)
with torch.no_grad():
    full_c.weight.uniform_(-6 ** -0.5, 6 ** -0.5, generator=g)
    full_c.bias.uniform_(-6 ** -0.5, 6 ** -0.5, generator=g)
    g = torch.Generator().manual_seed(9)
    full_r.weight.copy_(torch.empty(3, 8).uniform_(-8 ** -0.5, 8 ** -0.5, generator=g))
    full_r.bias.copy_(torch.empty(3).uniform_(-8 ** -0.5, 8 ** -0.5, generator=g))
x2 = x.detach().clone().requires_grad_(True)
y2 = full_r(full_c(x2))
(y2 ** 2).sum().backward()
result["same_output"] = torch.allclose(y, y2, atol=1e-6)
# The input is one tensor seen by both ranks: its gradient is the ranks' mean.
input_grad = fleet.util.all_reduce(x.grad.clone()) / 2
result["same_input_grad"] = torch.allclose(input_grad, x2.grad, atol=1e-5)
shard = slice(rank * 4, (rank + 1) * 4)
result["same_column_grad"] = torch.allclose(
    column.weight.grad, full_c.weight.grad[shard], atol=1e-5
) and torch.allclose(column.bias.grad, full_c.bias.grad[shard], atol=1e-5)
result["same_row_grad"] = torch.allclose(
    row.weight.grad, full_r.weight.grad[:, shard], atol=1e-5
) and torch.allclose(row.bias.grad, full_r.bias.grad, atol=1e-5)

# A split layer that trains with nothing to average the ranks' gradients says so, once.
import warnings
lonely = collective.ColumnParallelLinear(6, 8)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    lonely(x).sum().backward()
    lonely(x).sum().backward()
result["unsynchronized_warnings"] = [str(w.message) for w in caught]

# 2. util.all_reduce and the barrier.
result["sum"] = fleet.util.all_reduce(rank + 1)
result["max"] = fleet.util.all_reduce(torch.tensor([rank, -rank]), mode="max").tolist()
fleet.barrier_worker()

# 3. DDP through distributed_model + Executor, uneven batch counts (3 vs 4 batches).
torch.manual_seed(rank)
model = fleet.distributed_model(nn.Linear(3, 1))
optimizer = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
batches = [{"x": torch.randn(8, 3)} for _ in range(3 + rank)]
target = torch.tensor([1.0, -2.0, 0.5])
def forward(batch):
    return {"loss": ((model(batch["x"]).squeeze(1) - batch["x"] @ target) ** 2).mean()}
def epoch():
    return Executor().train_from_dataset(forward, batches, optimizer, thread=1, fetch_list=[])
losses = [epoch().mean_loss for _ in range(15)]
result["losses"] = [losses[0], losses[-1]]
weights = model.module.weight.detach().reshape(-1)
gathered = collective.all_gather(weights, dim=0)
result["replicas_equal"] = torch.equal(gathered[:3], gathered[3:])
fleet.stop_worker()
json.dump(result, open(os.path.join(out, f"rank{rank}.json"), "w"))
'''


def run_ranks(
    tmp_path: Path, scenario: str, ranks: list[int], world_size: int = 2,
    read: list[int] | None = None,
) -> list[dict]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    finished = run_collective_ranks(
        script, [str(tmp_path), scenario], world_size=world_size, timeout=60, ranks=ranks
    )
    for code, output in finished:
        assert code == 0, output
    return [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in read or ranks]


@pytest.mark.slow
def test_two_ranks_model_parallel_ddp_and_collectives(tmp_path):
    results = run_ranks(tmp_path, "train", [0, 1])
    for rank, result in enumerate(results):
        assert result["role"] == [rank, 2, rank == 0]
        assert result["same_output"] and result["same_input_grad"]
        assert result["same_column_grad"] and result["same_row_grad"]
        (warning,) = result["unsynchronized_warnings"]
        assert warning.startswith(
            f"rank {rank}: ColumnParallelLinear is training but no fleet.distributed_optimizer"
        )
        assert result["sum"] == 3
        assert result["max"] == [1, 0]
        first, last = result["losses"]
        assert last < 0.05 * first
        assert result["replicas_equal"]  # DDP kept both replicas identical


def test_a_missing_peer_fails_init_within_the_timeout_naming_the_rank(tmp_path):
    (result,) = run_ranks(tmp_path, "alone", [0])
    assert result["rank"] == 0
    assert "rank 0 of 2: the process group at 127.0.0.1:" in result["error"]
    assert "did not form within 2s" in result["error"]


def test_a_peer_that_dies_fails_the_collective_naming_the_rank(tmp_path):
    result = run_ranks(tmp_path, "peer_dies", [0, 1], read=[0])[0]
    assert result["error"].startswith(
        "rank 0: all_gather failed (timeout 20s): a peer failed or stopped answering"
    )


@pytest.fixture(autouse=True)
def no_torch_env(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)


def test_a_rank_announcing_a_huge_gather_is_refused_before_any_allocation(tmp_path):
    # Every rank holds every rank's bytes: 1 TiB announced by one rank made each
    # of the others try to allocate it (an allocation error, or the OOM killer).
    result = run_ranks(tmp_path, "huge_size", [0, 1], read=[0])[0]
    assert result["error"] == (
        f"rank 0: rank 1 announced {1 << 40} bytes to gather; expected 0 to {64 << 20}"
    )


def test_an_uneven_dataset_is_refused_before_any_step_and_equal_batches_trains(tmp_path):
    # A rank out of batches stopped stepping while the other went on: with Adam
    # the two optimizers then differed for good (under DDP's join), or its
    # collectives met the other rank's gradients (without DDP).
    results = run_ranks(tmp_path, "uneven_dataset", [0, 1])
    for rank, result in enumerate(results):
        assert result["error"] == (
            f"rank {rank}: the ranks hold different numbers of batches this pass (rank 0: "
            "3, rank 1: 4); in collective training a rank out of batches stops stepping "
            "while the others go on, and their models part. Set "
            "dataset.update_settings(equal_batches=True): every rank then trains the "
            "fewest batches any rank has (the records left out are logged)"
        )
        assert result["batches"] == 3 and result["steps"] == 3  # nothing stepped before
