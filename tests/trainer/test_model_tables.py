"""A runtime's sparse tables are its model's: those of the SparseEmbedding modules
of the model whose parameters the optimizer holds, not of every SparseEmbedding
alive in the process (a notebook's other model, one kept by a traceback).

Two models live in one process, each with its own optimizer, beside a third
that trains nothing. Each checkpoint holds its own model's tables only and loads
into a fresh process that also builds both models. The fresh processes (and a
PS job's) run this file as a script (``python tests/trainer/test_model_tables.py
'<json>'``).
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

HERE = Path(__file__).resolve()
# As a script, this file finds the checkout and the test helpers itself.
for _path in (HERE.parents[2], HERE.parents[1] / "helpers"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from support import finish_job, reserved_ports  # noqa: E402

from trainer import fleet  # noqa: E402
from trainer.embedding import pending, stores  # noqa: E402
from trainer.job.errors import TrainerError  # noqa: E402
from trainer.job.role import ClusterRole, Role  # noqa: E402
from trainer.nn import SparseEmbedding  # noqa: E402
from trainer.ps import ParameterServerRuntime  # noqa: E402
from trainer.ps.runtime import model_configs  # noqa: E402

JOB_TIMEOUT = 120  # generous for a loaded 2-core machine; a hang still fails
A_IDS = [1, 2, 3, 5, 8, 13, 21]
B_IDS = [100, 200, 300, 400]

_prefixes = itertools.count()


def fresh_prefix() -> str:
    """Table names no other test uses (the registry and the store are process-wide)."""
    return f"mt{next(_prefixes)}_"


class Flat(nn.Module):
    """Tables ``<prefix>emb`` (dim 4) and ``<prefix>wide`` (dim 1, its own optimizer)."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.emb = SparseEmbedding(4, prefix + "emb")
        self.wide = SparseEmbedding(1, prefix + "wide", optimizer={"type": "adagrad", "lr": 0.1})
        self.out = nn.Linear(4, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return (self.out(self.emb(ids)) + self.wide(ids)).squeeze(1)


class Nested(nn.Module):
    """Table ``<prefix>deep`` (dim 3) beside dense layers two levels down: the
    optimizer's parameters are held by modules inside ``head``, not by the model."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.deep = SparseEmbedding(3, prefix + "deep", seed=7)
        self.head = nn.Sequential(nn.Linear(3, 2), nn.Tanh(), nn.Linear(2, 1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.deep(ids)).squeeze(1)


def train(model: nn.Module, optimizer, ids: list[int], steps: int = 3) -> None:
    x = torch.tensor(ids)
    y = (x % 2).float()
    for _ in range(steps):
        nn.functional.binary_cross_entropy_with_logits(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()


def local_rows(names, ids: list[int]) -> dict[str, list]:
    """The rows of ``ids`` in this process's tables ``names``."""
    tables = stores.local_store().tables
    return {n: tables[n].pull(torch.tensor(ids), create=False).tolist() for n in sorted(names)}


def dense(model: nn.Module) -> list:
    return [p.detach().tolist() for p in model.parameters()]


def saved_tables(ckpt: Path) -> tuple[list[str], list[str]]:
    """The checkpoint's tables (meta.json) and sparse files."""
    meta = json.loads((ckpt / "meta.json").read_text())
    return sorted(meta["tables"]), sorted(p.name for p in ckpt.glob("sparse.*"))


def run_script(config: dict) -> dict:
    """This file as a script in a fresh process: its printed JSON."""
    done = subprocess.run(
        [sys.executable, str(HERE), json.dumps(config)],
        capture_output=True, text=True, timeout=JOB_TIMEOUT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture(autouse=True)
def clean_local_tables():
    yield
    stores.local_store().clear()
    pending.clear_pending()


# -- local mode --------------------------------------------------------------------------


def test_two_models_in_one_process_each_save_and_load_their_own_tables(tmp_path):
    a, b, idle = fresh_prefix(), fresh_prefix(), fresh_prefix()
    torch.manual_seed(0)
    flat, nested = Flat(a), Nested(b)
    bystander = Flat(idle)  # alive, with rows, trained by no optimizer here
    stores.local_store().table(bystander.emb.config).pull(torch.tensor(A_IDS), create=True)

    fleet.init()  # no role environment: local mode
    flat_opt = fleet.distributed_optimizer(torch.optim.Adagrad(flat.parameters(), lr=0.1))
    nested_runtime = ParameterServerRuntime(ClusterRole.local())
    nested_opt = nested_runtime.distributed_optimizer(
        torch.optim.Adagrad(nested.parameters(), lr=0.1)
    )
    assert list(nested_runtime.configs) == [b + "deep"]
    train(flat, flat_opt, A_IDS)
    train(nested, nested_opt, B_IDS)
    assert sorted(fleet.table_stats()) == [a + "emb", a + "wide"]
    assert {n: s["rows"] for n, s in nested_runtime.table_stats().items()} == {
        b + "deep": len(B_IDS)
    }

    fleet.save_persistables(str(tmp_path / "flat"))
    nested_runtime.save_persistables(str(tmp_path / "nested"))
    assert saved_tables(tmp_path / "flat") == (
        [a + "emb", a + "wide"], [f"sparse.{a}emb.shard0.arrow", f"sparse.{a}wide.shard0.arrow"]
    )
    assert saved_tables(tmp_path / "nested") == ([b + "deep"], [f"sparse.{b}deep.shard0.arrow"])

    # Fresh processes that build all three models, as this one did, load each
    # checkpoint through its model's runtime: the same rows and dense values.
    for which, model, ckpt, ids in (
        ("flat", flat, tmp_path / "flat", A_IDS), ("nested", nested, tmp_path / "nested", B_IDS)
    ):
        loaded = run_script({
            "action": "load", "prefixes": [a, b, idle], "model": which, "ckpt": str(ckpt),
            "ids": ids,
        })
        own = saved_tables(ckpt)[0]
        assert loaded["configs"] == own
        assert loaded["rows"] == local_rows(own, ids)
        assert loaded["dense"] == dense(model)
    del bystander


def test_set_pass_and_shrink_leave_another_models_tables_alone():
    a, b = fresh_prefix(), fresh_prefix()
    flat, nested = Flat(a), Nested(b)
    flat_runtime = ParameterServerRuntime(ClusterRole.local())
    flat_opt = flat_runtime.distributed_optimizer(torch.optim.SGD(flat.parameters(), lr=0.1))
    nested_runtime = ParameterServerRuntime(ClusterRole.local())
    nested_opt = nested_runtime.distributed_optimizer(
        torch.optim.SGD(nested.parameters(), lr=0.1)
    )
    train(flat, flat_opt, A_IDS, steps=1)
    train(nested, nested_opt, B_IDS, steps=1)
    flat_runtime.set_pass(3)
    assert sorted(flat_runtime.shrink()) == [a + "emb", a + "wide"]
    tables = stores.local_store().tables
    assert [tables[n].current_pass for n in (a + "emb", a + "wide", b + "deep")] == [3, 3, 0]


def test_an_optimizer_of_no_module_names_what_it_expected_and_takes_the_model():
    prefix = fresh_prefix()
    sparse_only = SparseEmbedding(2, prefix + "only")
    placeholder = nn.Parameter(torch.zeros(1))
    runtime = ParameterServerRuntime(ClusterRole.local())
    with pytest.raises(TrainerError, match=r"found 1 parameter \(shapes \[\[1\]\]\) in no module"
                                           r".*distributed_optimizer\(optimizer, model=model\)"):
        runtime.distributed_optimizer(torch.optim.SGD([placeholder], lr=0.1))
    assert runtime.optimizer is None and runtime.configs == {}
    with pytest.raises(TypeError, match="model must be the torch.nn.Module .* got list"):
        runtime.distributed_optimizer(torch.optim.SGD([placeholder], lr=0.1), [sparse_only])
    runtime.distributed_optimizer(torch.optim.SGD([placeholder], lr=0.1), model=sparse_only)
    assert list(runtime.configs) == [prefix + "only"]


def test_a_model_inside_a_live_container_brings_the_containers_tables():
    """The outermost module holding the parameters is the model: a container
    that holds the model holds its tables too."""
    a, b = fresh_prefix(), fresh_prefix()
    flat = Flat(a)
    both = nn.ModuleDict({"flat": flat, "nested": Nested(b)})
    params = list(flat.parameters())
    assert list(model_configs(params)) == sorted([a + "emb", a + "wide", b + "deep"])
    assert list(model_configs(params, model=flat)) == [a + "emb", a + "wide"]
    del both


# -- a parameter-server job ----------------------------------------------------------------


@pytest.mark.distributed
def test_a_ps_job_serves_and_saves_its_models_tables_only(tmp_path):
    """Every role builds two models; the optimizer trains one. The server holds
    that model's tables only, and its checkpoint loads into a fresh local process."""
    a, b = fresh_prefix(), fresh_prefix()
    with reserved_ports(1) as ports:
        base = {"action": "ps", "prefixes": [a, b], "servers": [f"127.0.0.1:{ports[0]}"],
                "ckpt": str(tmp_path / "ckpt"), "out": str(tmp_path / "worker.json")}
        procs = []
        for role in ("server", "worker"):
            with open(tmp_path / f"{role}.log", "w") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, str(HERE), json.dumps({**base, "role": role})],
                    stdout=log, stderr=subprocess.STDOUT,
                ))
        finish_job(procs, JOB_TIMEOUT, tmp_path)
    worker = json.loads((tmp_path / "worker.json").read_text())
    own = [a + "emb", a + "wide"]
    assert worker["served"] == own
    assert saved_tables(tmp_path / "ckpt") == (
        own, [f"sparse.{a}emb.shard0.arrow", f"sparse.{a}wide.shard0.arrow"]
    )
    loaded = run_script({"action": "load", "prefixes": [a, b], "model": "flat",
                         "ckpt": str(tmp_path / "ckpt"), "ids": A_IDS})
    assert loaded["configs"] == own
    assert loaded["rows"] == worker["rows"]
    assert loaded["dense"] == worker["dense"]


# -- this file as a script -------------------------------------------------------------------


def load_main(config: dict) -> dict:
    """A fresh process: builds every model, loads one model's checkpoint
    through its runtime, and reports that model's rows and dense values."""
    torch.manual_seed(1)  # other initial values than the models that were saved
    models = [Flat(config["prefixes"][0]), Nested(config["prefixes"][1])]
    models += [Flat(prefix) for prefix in config["prefixes"][2:]]
    model = models[0] if config["model"] == "flat" else models[1]
    runtime = ParameterServerRuntime(ClusterRole.local())
    runtime.distributed_optimizer(torch.optim.Adagrad(model.parameters(), lr=0.1))
    runtime.load_persistables(config["ckpt"])
    return {"configs": sorted(runtime.configs), "rows": local_rows(runtime.configs, config["ids"]),
            "dense": dense(model)}


def ps_main(config: dict) -> None:
    """One process of a PS job (1 server, 1 worker): trains and saves Flat."""
    role = ClusterRole(Role.SERVER if config["role"] == "server" else Role.WORKER, 0, 1,
                       tuple(config["servers"]), job_secret="job-secret-0123456789")
    torch.manual_seed(0)
    flat, _other_model = Flat(config["prefixes"][0]), Nested(config["prefixes"][1])
    runtime = ParameterServerRuntime(role, None)
    optimizer = runtime.distributed_optimizer(torch.optim.Adagrad(flat.parameters(), lr=0.1))
    if role.is_server:
        runtime.init_server()
        runtime.run_server()
        return
    runtime.init_worker()
    train(flat, optimizer, A_IDS)
    runtime.refresh()
    served = sorted(runtime.table_stats())
    runtime.save_persistables(config["ckpt"])
    flat.eval()
    with torch.no_grad():
        ids = torch.tensor(A_IDS)
        rows = {flat.emb.name: flat.emb(ids).tolist(), flat.wide.name: flat.wide(ids).tolist()}
    runtime.stop_worker()
    out = {"served": served, "rows": rows, "dense": dense(flat)}
    Path(config["out"]).write_text(json.dumps(out))


if __name__ == "__main__":
    job = json.loads(sys.argv[1])
    if job["action"] == "load":
        print(json.dumps(load_main(job)))
    else:
        ps_main(job)
