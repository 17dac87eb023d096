"""The fleet API: the local fallback, PS-mode role queries, the strategy."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch

from trainer import DistributedStrategy, Role, TrainerError, UserDefinedRoleMaker, fleet


@pytest.fixture(autouse=True)
def no_role_environment(monkeypatch):
    for name in ("PADDLE_PSERVERS_IP_PORT_LIST", "TRAINING_ROLE", "RANK", "WORLD_SIZE",
                 "PADDLE_TRAINER_ENDPOINTS", "FLEETFEED_JOB_SECRET",
                 "FLEETFEED_JOB_KEY", "FLEETFEED_JOB_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)


def test_local_fallback_runs_the_same_script(caplog):
    fleet.init()
    assert fleet.is_worker() and not fleet.is_server() and fleet.is_first_worker()
    assert (fleet.worker_index(), fleet.worker_num(), fleet.server_num()) == (0, 1, 0)
    assert fleet.server_endpoints() == [] and fleet.server_endpoints(to_string=True) == ""
    with caplog.at_level(logging.INFO, logger="trainer.fleet"):
        for call in (fleet.init_worker, fleet.init_server, fleet.run_server, fleet.stop_worker):
            call()
        fleet.barrier_worker()
    # INFO, not WARNING: running the job's script locally is intended.
    assert {r.levelno for r in caplog.records} == {logging.INFO}
    assert [r.getMessage() for r in caplog.records] == [
        f"{name}() does nothing in non-distributed fleet mode"
        for name in ("init_worker", "init_server", "run_server", "stop_worker")
    ]
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert fleet.distributed_model(model) is model
    wrapped = fleet.distributed_optimizer(optimizer)
    assert hasattr(wrapped, "step") and hasattr(wrapped, "zero_grad")
    assert fleet.util.all_reduce(3.5) == 3.5
    assert fleet.util.get_file_shard(["a", "b", "c"]) == ["a", "b", "c"]


def test_local_save_and_load_persistables(tmp_path):
    fleet.init()
    model = torch.nn.Linear(3, 2)
    fleet.distributed_model(model)
    fleet.save_persistables(str(tmp_path / "ckpt"))
    other = torch.nn.Linear(3, 2)
    fleet.load_persistables(str(tmp_path / "ckpt"), model=other)
    assert torch.equal(other.weight, model.weight)
    with pytest.raises(FileNotFoundError, match="missing/model.pt does not exist"):
        fleet.load_persistables(str(tmp_path / "missing"), model=other)
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['dirnam'\]"):
        fleet.save_persistables(str(tmp_path), dirnam="x")


def test_ps_role_queries_and_file_shards():
    maker = UserDefinedRoleMaker(
        current_id=2, role=Role.WORKER, worker_num=3,
        server_endpoints=["127.0.0.1:6001", "127.0.0.1:6002"],
    )
    fleet.init(maker)
    assert fleet.is_worker() and not fleet.is_first_worker()
    assert (fleet.worker_index(), fleet.worker_num(), fleet.server_num()) == (2, 3, 2)
    assert fleet.server_endpoints(to_string=True) == "127.0.0.1:6001,127.0.0.1:6002"
    files = [f"part-{i}" for i in range(8)]
    assert fleet.util.get_file_shard(files) == ["part-6", "part-7"]  # blocks 3, 3, 2


def test_init_argument_errors():
    with pytest.raises(TypeError, match=r"is_collective must be a bool, got 1 \(int\)"):
        fleet.init(is_collective=1)
    with pytest.raises(TypeError, match="role_maker must be a trainer role maker.*got str"):
        fleet.init(role_maker="worker")
    with pytest.raises(TypeError, match="strategy must be a DistributedStrategy, got dict"):
        fleet.init(strategy={"a_sync": True})


def test_queries_before_init_fail_clearly():
    fresh = fleet.Fleet()
    with pytest.raises(TrainerError, match=r"fleet.init\(\) has not been called"):
        fresh.worker_num()


def test_strategy_modes_follow_paddle():
    strategy = DistributedStrategy()
    assert strategy.a_sync is True and strategy.a_sync_configs["k_steps"] == -1
    assert strategy.mode == "async"
    strategy.a_sync = False
    assert strategy.mode == "sync" and strategy.a_sync_configs["k_steps"] == 0
    strategy.a_sync_configs = {"k_steps": 8}
    conflict = r"a_sync=False \(sync\) cannot be combined with .*k_steps'\]=8"
    with pytest.raises(ValueError, match=conflict):
        _ = strategy.mode
    strategy.a_sync = True  # resets k_steps to 0, as Paddle's setter does
    assert strategy.mode == "async" and strategy.a_sync_configs["k_steps"] == 0
    strategy.a_sync_configs = {"k_steps": 20}
    assert strategy.mode == "geo" and strategy.k_steps == 20
    assert strategy.a_sync_configs["send_queue_size"] == 16  # other keys untouched


def test_strategy_rejects_unknown_names_and_bad_values():
    strategy = DistributedStrategy()
    with pytest.raises(TypeError, match="a_snyc is not an attribute of DistributedStrategy"):
        strategy.a_snyc = True
    with pytest.raises(KeyError, match="'k_step' is not a key of a_sync_configs"):
        strategy.a_sync_configs = {"k_step": 4}
    with pytest.raises(TypeError, match=r"a_sync must be a bool, got 1 \(int\)"):
        strategy.a_sync = 1
    with pytest.raises(TypeError, match=r"a_sync_configs\['k_steps'\] must be int, got '4'"):
        strategy.a_sync_configs = {"k_steps": "4"}
    with pytest.raises(ValueError, match="k_steps'\\] must be >= 0 \\(or -1, unset\\), got -5"):
        strategy.a_sync_configs = {"k_steps": -5}


def test_strategy_factory_makes_paddles_three_modes():
    # PaddleRec's distributed guide: strategy = StrategyFactory.create_sync_strategy()
    from trainer import StrategyFactory
    from trainer.job.strategy import parameter_server_mode

    assert fleet.StrategyFactory is StrategyFactory
    made = {
        "sync": StrategyFactory.create_sync_strategy(),
        "async": StrategyFactory.create_async_strategy(),
        "geo": StrategyFactory.create_geo_strategy(20),
    }
    assert {mode: (s.a_sync, s.a_sync_configs["k_steps"], s.mode) for mode, s in made.items()} == {
        "sync": (False, 0, "sync"), "async": (True, 0, "async"), "geo": (True, 20, "geo"),
    }
    assert all(isinstance(s, DistributedStrategy) for s in made.values())
    assert parameter_server_mode(made["geo"]) == ("geo", 20)
    assert StrategyFactory.create_geo_strategy().k_steps == 100  # Paddle's default
    fleet.init(strategy=made["sync"])
    assert fleet.current().strategy.mode == "sync"
    # Fleet keeps a copy, as Paddle's does: the caller's later changes change nothing.
    made["sync"].a_sync = True
    assert fleet.current().strategy.mode == "sync"
    with pytest.raises(NotImplementedError, match="half-async .* use create_sync_strategy"):
        StrategyFactory.create_half_async_strategy()


@pytest.mark.parametrize(
    ("update_frequency", "error", "message"),
    [
        (0, ValueError, r"update_frequency\) takes the steps between two pushes as an int >= 1, "
                        "got 0"),
        (-3, ValueError, "as an int >= 1, got -3"),
        (2.5, TypeError, r"as an int >= 1, got 2.5 \(float\)"),
        (True, TypeError, r"as an int >= 1, got True \(bool\)"),
        ("10", TypeError, r"as an int >= 1, got '10' \(str\)"),
    ],
)
def test_strategy_factory_refuses_a_bad_geo_period(update_frequency, error, message):
    with pytest.raises(error, match=message):
        fleet.StrategyFactory.create_geo_strategy(update_frequency)


def test_paddles_classes_are_on_fleet_where_paddle_code_reaches_for_them():
    import generators
    import trainer

    assert (fleet.MultiSlotDataGenerator, fleet.MultiSlotStringDataGenerator) == (
        generators.MultiSlotDataGenerator, generators.MultiSlotStringDataGenerator)
    assert (fleet.DistributedStrategy, fleet.PaddleCloudRoleMaker, fleet.UserDefinedRoleMaker,
            fleet.Role) == (DistributedStrategy, trainer.PaddleCloudRoleMaker,
                            UserDefinedRoleMaker, Role)


def test_a_paddlerec_reader_subclasses_fleets_generator(tmp_path):
    # PaddleRec's reader.py: `import paddle.distributed.fleet as fleet`, then
    # `class Reader(fleet.MultiSlotDataGenerator)`; only the import changes.
    reader = tmp_path / "reader.py"
    reader.write_text(
        "from trainer import fleet\n"
        "class Reader(fleet.MultiSlotDataGenerator):\n"
        "    def generate_sample(self, line):\n"
        "        def samples():\n"
        "            label, *ids = line.split()\n"
        "            yield [('ids', [int(i) for i in ids]), ('label', [int(label)])]\n"
        "        return samples\n"
        "Reader().run_from_stdin()\n"
    )
    done = subprocess.run(
        [sys.executable, str(reader)], input="1 7 8\n0 9\n", capture_output=True, text=True,
        timeout=60, check=True,
    )
    assert done.stdout == "2 7 8 1 1\n1 9 1 0\n"


def test_local_mode_trains_sparse_tables_through_the_ps_runtime(tmp_path):
    """No role environment + trainer.ps: fleet's optimizer updates in-process sparse
    tables, also from two Executor threads, and save/load_persistables round-trip."""
    nn_module = pytest.importorskip("trainer.nn")
    import numpy as np

    from datafeed import InMemoryDataset, Slot
    from trainer import Executor

    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, (1000, 3))
    lines = [f"3 {a} {b} {c} 1 {int((a % 2) + (b % 2) + (c % 2) >= 2)}\n" for a, b, c in ids]
    (tmp_path / "part-0").write_text("".join(lines))
    dataset = InMemoryDataset()
    dataset.init(batch_size=50, thread_num=2, pipe_command="cat",
                 use_var=[Slot("ids", "uint64"), Slot("label", "int64", (1,))])
    dataset.set_filelist([str(tmp_path / "part-0")])
    dataset.load_into_memory()

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = nn_module.SparseEmbedding(4, "fleet_test_ids")
            self.out = torch.nn.Linear(4, 1)

        def forward(self, batch):
            logit = self.out(self.embedding(batch["ids"])).squeeze(1)
            label = batch["label"].squeeze(1).float()
            return {"loss": torch.nn.functional.binary_cross_entropy_with_logits(logit, label)}

    fleet.init()
    torch.manual_seed(0)
    model = Model()
    fleet.distributed_optimizer(torch.optim.Adagrad(model.parameters(), lr=0.1))
    executor = Executor()
    losses = [executor.train_from_dataset(model, dataset, thread=2, fetch_list=[]).mean_loss
              for _ in range(3)]
    assert losses[2] < 0.3 * losses[0]
    trained = executor.infer_from_dataset(model, dataset, fetch_list=[]).mean_loss
    fleet.save_persistables(str(tmp_path / "ckpt"))
    executor.train_from_dataset(model, dataset, torch.optim.SGD(model.parameters(), lr=5.0),
                                fetch_list=[])  # moves the dense weights only
    assert executor.infer_from_dataset(model, dataset, fetch_list=[]).mean_loss != trained
    fleet.load_persistables(str(tmp_path / "ckpt"))
    restored = executor.infer_from_dataset(model, dataset, fetch_list=[]).mean_loss
    assert restored == pytest.approx(trained)


def test_collective_fallback_and_a_one_rank_group():
    import torch.distributed as dist
    from support import reserved_ports

    fleet.init(is_collective=True)  # no torchrun environment: one local process
    model = torch.nn.Linear(2, 1)
    assert fleet.distributed_model(model) is model and not dist.is_initialized()
    fleet.barrier_worker()
    with reserved_ports(1) as (port,):  # this process's rendezvous store listens on it
        maker = UserDefinedRoleMaker(True, current_id=0, worker_endpoints=[f"127.0.0.1:{port}"],
                                     job_secret="fleet-test-job-key-0123456789")
        fleet.init(maker, timeout=10)
    try:
        assert dist.is_initialized() and dist.get_world_size() == 1
        wrapped = fleet.distributed_model(model)
        assert isinstance(wrapped, torch.nn.parallel.DistributedDataParallel)
        assert fleet.util.all_reduce(torch.tensor([2.0]), mode="mean").tolist() == [2.0]
        fleet.barrier_worker()
    finally:
        fleet.stop_worker()  # leaves the group
    assert not dist.is_initialized()
