"""Collective training that cannot silently diverge (issue 24): Fleet's quick
start ported by its imports, with and without ``distributed_model``, and
model-parallel shards (``is_distributed=True``) that are never averaged.

Two real ranks on gloo over 127.0.0.1; each writes its parameters, and the test
replays the same steps in one process to get what they must be.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from support import run_collective_ranks
from torch import nn

pytestmark = pytest.mark.distributed

STEPS = 20

# Fleet's collective quick start, as a Paddle user ports it: the MLP, gen_data,
# fleet.init(is_collective=True), distributed_optimizer(...).minimize(cost). Each
# rank builds its model from its own seed: the ranks must still train one model.
RANK_SCRIPT = r'''
import json, os, sys
import torch
from torch import nn
from trainer import fleet

out, scenario, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
CLIP_NORM = 0.01
rank = int(os.environ["RANK"])
torch.set_num_threads(1)


def mlp():
    return nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                         nn.Linear(64, 2))


def gen_data(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.rand(128, 32, generator=g), torch.randint(0, 2, (128,), generator=g)


class Sharded(nn.Module):
    """A replicated layer beside a model-parallel shard: each rank holds its own
    slice of the second layer's weight, marked as Paddle marks it."""

    def __init__(self):
        super().__init__()
        self.replicated = nn.Linear(8, 1)
        self.shard = nn.Linear(8, 1, bias=False)
        self.shard.weight.is_distributed = True

    def forward(self, x):
        return self.replicated(x) + self.shard(x)


class Uneven(nn.Module):
    """The MLP, a layer only rank 0 uses and a layer no rank uses."""

    def __init__(self):
        super().__init__()
        # Declared first, so last in the backward's order: the MLP's buckets
        # leave while the backward runs, and go stale at the second backward.
        self.unused = nn.Linear(2, 2)
        self.rank0_only = nn.Linear(32, 2)
        torch.manual_seed(100 + rank)
        self.mlp = mlp()

    def forward(self, x, rank):
        out = self.mlp(x)
        return out + self.rank0_only(x) if rank == 0 else out


fleet.init(is_collective=True)
torch.manual_seed(100 + rank)  # a different start on every rank
if scenario == "accumulate":
    from trainer.collective import data_parallel

    data_parallel.BUCKET_BYTES = 16 << 10  # several buckets for this small MLP
    model = Uneven()
    optimizer = fleet.distributed_optimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    for step in range(steps):
        for micro in range(2):  # two backwards before each step
            x, y = gen_data(rank, 2 * step + micro)
            nn.functional.cross_entropy(model(x, rank), y).backward()
        optimizer.step()
        optimizer.zero_grad()
elif scenario == "frozen":
    model = nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.Tanh(), nn.Linear(64, 2))
    model[0].weight.requires_grad_(False)  # a frozen layer: not in the optimizer
    model[0].bias.requires_grad_(False)
    model[1].running_mean.fill_(rank)  # statistics of each rank's own
    model[1].num_batches_tracked.fill_(10 + rank)
    optimizer = fleet.distributed_optimizer(
        torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05))
    state = {name: t.detach().reshape(-1).tolist() for name, t in model.state_dict().items()}
    json.dump(state, open(os.path.join(out, f"rank{rank}.json"), "w"))
    fleet.stop_worker()
    sys.exit(0)
elif scenario == "skipped_backward":
    from trainer.collective import data_parallel
    from trainer.job.errors import TrainerError

    data_parallel.BUCKET_BYTES = 1  # every parameter in a bucket of its own
    model = mlp()
    optimizer = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.05))
    errors = []
    x, y = gen_data(rank, 0)
    try:
        if rank == 0:  # e.g. `if torch.isfinite(loss): loss.backward()` on one rank only
            nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    except TrainerError as error:
        errors.append(str(error))
    # Caught, the job goes on: the buckets that paired off leave nothing behind
    # (their sums were copied into the next step's unused gradients).
    optimizer.zero_grad(set_to_none=False)
    model[:3](x).sum().backward()  # the last layer unused on both ranks
    last_grad = model[4].weight.grad.abs().sum().item()
    json.dump({"errors": errors, "last_grad": last_grad},
              open(os.path.join(out, f"rank{rank}.json"), "w"))
    fleet.stop_worker()
    sys.exit(0)
elif scenario == "uneven_backwards":
    # A rank that skips a backward (a non-finite loss), gradients made by
    # torch.autograd.grad, a backward that raised, two models in one
    # optimizer found in another order of the garbage collector on each rank.
    import gc
    gc.disable()
    first = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8))
    gc.collect() if rank == 0 else None
    second = nn.Sequential(nn.Linear(8, 1), nn.BatchNorm1d(1))
    gc.collect() if rank == 1 else None
    first[1].running_mean.fill_(1.0 + rank)
    second[1].running_mean.fill_(2.0 + rank)
    optimizer = fleet.distributed_optimizer(
        torch.optim.SGD([*first.parameters(), *second.parameters()], lr=0.1))
    model = nn.Sequential(first, second)
    for step in range(steps):
        x = torch.full((4, 4), float(rank + step)) + torch.arange(4.0).view(4, 1)
        loss = model(x).pow(2).mean()
        if step == 1:
            grads = torch.autograd.grad(loss, list(model.parameters()))
            for p, g in zip(model.parameters(), grads, strict=True):
                p.grad = g
        elif step == 2:
            class Fails(torch.autograd.Function):
                @staticmethod
                def forward(ctx, value):
                    return value.clone()

                @staticmethod
                def backward(ctx, grad):
                    raise RuntimeError("a backward that fails midway")

            try:  # the second model's gradients are in, then it raises
                second(Fails.apply(first(x))).pow(2).mean().backward()
            except RuntimeError:
                pass
            optimizer.zero_grad()
            loss.backward()
        elif rank == 1 and step == 3:  # nothing to learn here: still a backward
            (loss * 0).backward()
        else:
            loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
        optimizer.step()
        optimizer.zero_grad()
elif scenario == "clip":
    model = mlp()
    optimizer = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.05))
    for step in range(steps):
        x, y = gen_data(rank, step)
        nn.functional.cross_entropy(model(x), y).backward()
        nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)  # of the averaged gradients
        optimizer.step()
        optimizer.zero_grad()
elif scenario == "sharded":
    model = Sharded()
    net = fleet.distributed_model(model)
    optimizer = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
else:
    model = mlp()
    net = fleet.distributed_model(model) if scenario == "ddp" else model
    optimizer = fleet.distributed_optimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    for step in range(steps):
        x, y = gen_data(rank, step)
        optimizer.minimize(nn.functional.cross_entropy(net(x), y))
params = {name: p.detach().reshape(-1).tolist() for name, p in model.named_parameters()}
json.dump(params, open(os.path.join(out, f"rank{rank}.json"), "w"))
fleet.stop_worker()
'''


def run_two_ranks(tmp_path: Path, scenario: str) -> list[dict[str, torch.Tensor]]:
    """Runs the script on ranks 0 and 1; their parameters by name."""
    script = tmp_path / "quick_start_collective.py"
    script.write_text(RANK_SCRIPT)
    for code, output in run_collective_ranks(script, [str(tmp_path), scenario, str(STEPS)]):
        assert code == 0, output
    return [
        {name: torch.tensor(values) for name, values in
         json.loads((tmp_path / f"rank{rank}.json").read_text()).items()}
        for rank in (0, 1)
    ]


def one_process_on_both_ranks_batches(
    momentum: float = 0.9, clip: float | None = None
) -> dict[str, torch.Tensor]:
    """The MLP from rank 0's start, each step on the average of the two ranks'
    gradients (``clip``: that average clipped to this norm): what a
    data-parallel job of two ranks must compute."""
    torch.manual_seed(100)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                          nn.Linear(64, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=momentum)
    for step in range(STEPS):
        grads = []
        for rank in (0, 1):
            g = torch.Generator().manual_seed(1000 * step + rank)
            x, y = torch.rand(128, 32, generator=g), torch.randint(0, 2, (128,), generator=g)
            model.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for p, g0, g1 in zip(model.parameters(), *grads, strict=True):
            p.grad = (g0 + g1) / 2
        if clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
    return {name: p.detach().reshape(-1) for name, p in model.named_parameters()}


@pytest.mark.slow
def test_uneven_backwards_and_two_models_keep_the_ranks_equal(tmp_path):
    """Each rank averages at the end of its backwards, or at the step when it
    ran none: a rank that skips one, gradients from torch.autograd.grad and a
    backward that raised do not leave the ranks' collectives paired off; two
    models in one optimizer start from rank 0's in one order on every rank."""
    rank0, rank1 = run_two_ranks(tmp_path, "uneven_backwards")
    assert rank0.keys() == rank1.keys()
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), name
    assert not torch.equal(rank0["1.1.weight"], torch.ones(1))  # it trained


def test_a_rank_that_skips_a_backward_is_refused_on_every_rank(tmp_path):
    # Rank 0 averages at the end of its backward, rank 1 (no backward) at its
    # step: their collectives still pair, but rank 1 clipped nothing and the
    # ranks' models would part, so both raise.
    script = tmp_path / "quick_start_collective.py"
    script.write_text(RANK_SCRIPT)
    for code, output in run_collective_ranks(script, [str(tmp_path), "skipped_backward", "1"]):
        assert code == 0, output
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    errors = [result["errors"] for result in results]
    assert [result["last_grad"] for result in results] == [0.0, 0.0]
    assert errors[0] == ["rank 0: the ranks ran different backwards since the last step (this "
                         "rank's is its backward 1): every rank must run the same backwards "
                         "between two steps, as under DDP (a rank with nothing to learn from "
                         "a batch calls (loss * 0).backward())"]
    assert errors[1][0].startswith("rank 1: the ranks ran different backwards since the last "
                                   "step (this rank's is its step)")


@pytest.mark.slow
def test_frozen_layers_and_buffers_start_from_rank_0s_too(tmp_path):
    """Paddle's startup program broadcasts every parameter, trainable or not:
    an optimizer given only the trainable ones left a frozen layer and the
    BatchNorm statistics different on each rank, each replica another
    function, without a word."""
    rank0, rank1 = run_two_ranks(tmp_path, "frozen")
    assert rank0.keys() == rank1.keys()
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), name
    assert rank1["1.running_mean"].eq(0).all()  # rank 0's
    assert rank1["1.num_batches_tracked"].tolist() == [10]
    torch.manual_seed(100)
    assert torch.equal(rank1["0.weight"], nn.Linear(32, 64).weight.detach().reshape(-1))


@pytest.mark.slow
def test_clipping_between_backward_and_step_clips_the_averaged_gradients(tmp_path):
    """The means are in ``.grad`` when the backward returns: a clip (or a
    GradScaler's unscale) before the step works on them, as in Paddle, where
    each gradient's all-reduce follows its op. Written at the step, the means
    replaced the clipped gradients: the model moved thousands of times the
    clip's bound."""
    rank0, rank1 = run_two_ranks(tmp_path, "clip")
    expected = one_process_on_both_ranks_batches(momentum=0.0, clip=0.01)
    for name in expected:
        assert torch.equal(rank0[name], rank1[name]), name
        assert torch.allclose(rank0[name], expected[name], atol=1e-6, rtol=0), name


def accumulated_reference() -> dict[str, torch.Tensor]:
    """The ``accumulate`` scenario in one process: each rank's gradient is the sum
    over its two micro-batches; the step takes their mean over the ranks (the
    layer rank 0 alone uses gets half its gradient; the unused one none)."""
    torch.manual_seed(100)
    unused, rank0_only = nn.Linear(2, 2), nn.Linear(32, 2)
    torch.manual_seed(100)
    mlp = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                        nn.Linear(64, 2))
    model = nn.ModuleDict({"unused": unused, "rank0_only": rank0_only, "mlp": mlp})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(STEPS):
        per_rank = []
        for rank in (0, 1):
            model.zero_grad()
            for micro in range(2):
                g = torch.Generator().manual_seed(1000 * (2 * step + micro) + rank)
                x, y = torch.rand(128, 32, generator=g), torch.randint(0, 2, (128,), generator=g)
                out = mlp(x) + (model["rank0_only"](x) if rank == 0 else 0)
                nn.functional.cross_entropy(out, y).backward()
            per_rank.append({n: p.grad.clone() for n, p in model.named_parameters()
                             if p.grad is not None})
        for name, p in model.named_parameters():
            held = [grads[name] for grads in per_rank if name in grads]
            p.grad = sum(held) / 2 if held else None
        optimizer.step()
    return {name: p.detach().reshape(-1) for name, p in model.named_parameters()}


@pytest.mark.slow
def test_accumulated_and_uneven_gradients_average_as_one_process(tmp_path):
    """Two backwards before each step (the gradients of the first are already on
    their way when the second adds to them), a layer only rank 0 uses, and one
    no rank uses: the ranks agree, and agree with one process."""
    rank0, rank1 = run_two_ranks(tmp_path, "accumulate")
    expected = accumulated_reference()
    assert rank0.keys() == rank1.keys() == expected.keys()
    for name in expected:
        assert torch.allclose(rank0[name], rank1[name], atol=1e-6, rtol=0), name
        assert torch.allclose(rank0[name], expected[name], atol=1e-5, rtol=0), name
    # The unused layer never moved: no rank had a gradient, so none was made up.
    torch.manual_seed(100)
    unused_at_start = nn.Linear(2, 2).weight.detach().reshape(-1)
    assert torch.equal(rank0["unused.weight"], unused_at_start)


def names_keyed(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """DDP's state is the wrapped module's: the same names either way."""
    return {name.removeprefix("module."): value for name, value in params.items()}


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["optimizer_only", "ddp"])
def test_quick_start_collective_trains_one_model_on_both_ranks(tmp_path, scenario):
    """Without distributed_model (Paddle's quick start never calls it) and with
    it: after 20 steps both ranks hold the same parameters, and they are those of
    one process stepping on the average of the ranks' gradients."""
    rank0, rank1 = run_two_ranks(tmp_path, scenario)
    expected = one_process_on_both_ranks_batches()
    assert rank0.keys() == rank1.keys() == expected.keys()
    for name in expected:
        # Equal across ranks: both applied the same averaged gradients (1e-6).
        assert torch.allclose(rank0[name], rank1[name], atol=1e-6, rtol=0), name
        # The averaged training: float32 sums in another order (1e-5).
        assert torch.allclose(rank0[name], expected[name], atol=1e-5, rtol=0), name


def sharded_reference() -> list[dict[str, torch.Tensor]]:
    """Both ranks of the ``sharded`` scenario replayed in one process: the
    replicated layer starts as rank 0's and steps on the average gradient; each
    rank's shard keeps its own start and steps on its own gradient over the
    number of ranks (the job minimises the mean of the ranks' losses, and a
    shard's loss is its rank's alone here)."""
    starts = []
    for rank in (0, 1):
        torch.manual_seed(100 + rank)
        replicated, shard = nn.Linear(8, 1), nn.Linear(8, 1, bias=False)
        starts.append((replicated, shard))
    replicated = starts[0][0]
    shards = [starts[0][1], starts[1][1]]
    for step in range(STEPS):
        grads = []
        for rank in (0, 1):
            g = torch.Generator().manual_seed(1000 * step + rank)
            x, y = torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)
            replicated.zero_grad()
            shards[rank].zero_grad()
            nn.functional.mse_loss(replicated(x) + shards[rank](x), y).backward()
            grads.append([p.grad.clone() for p in replicated.parameters()])
            with torch.no_grad():
                shards[rank].weight -= 0.1 * shards[rank].weight.grad / 2
        with torch.no_grad():
            for p, g0, g1 in zip(replicated.parameters(), *grads, strict=True):
                p -= 0.1 * (g0 + g1) / 2
    return [
        {"replicated.weight": replicated.weight.detach().reshape(-1),
         "replicated.bias": replicated.bias.detach().reshape(-1),
         "shard.weight": shards[rank].weight.detach().reshape(-1)}
        for rank in (0, 1)
    ]


@pytest.mark.slow
def test_model_parallel_shards_are_never_broadcast_or_averaged(tmp_path):
    """``is_distributed=True`` (Paddle's mark of a model-parallel shard): with
    distributed_model and distributed_optimizer, the replicated layer is equal
    on both ranks, the shards differ, and each is what its own rank computed."""
    ranks = [names_keyed(params) for params in run_two_ranks(tmp_path, "sharded")]
    expected = sharded_reference()
    assert torch.allclose(ranks[0]["replicated.weight"], ranks[1]["replicated.weight"],
                          atol=1e-6, rtol=0)
    assert not torch.allclose(ranks[0]["shard.weight"], ranks[1]["shard.weight"], atol=1e-3)
    for rank in (0, 1):
        for name, value in expected[rank].items():
            assert torch.allclose(ranks[rank][name], value, atol=1e-5, rtol=0), (rank, name)


@pytest.fixture(autouse=True)
def no_torch_env(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)


def test_a_model_with_sparse_tables_is_refused_in_a_collective_job():
    # Nothing in a collective job pushes a SparseEmbedding's rows: they would
    # never train, with only a warning after thousands of pulls.
    from trainer.collective.data_parallel import CollectiveOptimizer
    from trainer.embedding import stores
    from trainer.job.errors import TrainerError
    from trainer.nn import SparseEmbedding

    class Ctr(nn.Module):
        def __init__(self):
            super().__init__()
            self.ids = SparseEmbedding(4, "collective_refused")
            self.out = nn.Linear(4, 1)

    model = Ctr()
    try:
        with pytest.raises(TrainerError, match=r"SparseEmbedding tables \['collective_refused'\]"):
            CollectiveOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        dense_only = nn.Linear(4, 1)  # another model beside it is not refused
        CollectiveOptimizer(torch.optim.SGD(dense_only.parameters(), lr=0.1))
    finally:
        stores.local_store().clear()
