"""Per-instance dumps (Paddle's dump_fields / dump_param through
DistributedStrategy.trainer_desc_configs): Paddle's line format, one file per
worker per call, every instance once, whatever the threads."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from datafeed import InMemoryDataset, Slot
from trainer import DistributedStrategy, Executor, fleet
from trainer.loop.dumps import format_lines

SLOTS = [Slot("label", "int64", (1,)), Slot("ids", "uint64"), Slot("dense", "float32", (2,))]


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embedding = nn.EmbeddingBag(50, 2, mode="sum")
        self.linear = nn.Linear(4, 1)

    def forward(self, batch):
        ids = batch["ids"]
        x = torch.cat([self.embedding(ids.values % 50, ids.offsets[:-1]), batch["dense"]], 1)
        prob = torch.sigmoid(self.linear(x))
        label = batch["label"].float()
        loss = nn.functional.binary_cross_entropy(prob, label)
        return {"loss": loss, "prob": prob, "label": batch["label"]}


@pytest.fixture
def dataset(tmp_path: Path) -> InMemoryDataset:
    path = tmp_path / "data.txt"
    path.write_text("".join(
        f"1 ins{i} 1 {i % 2} 2 {i} {i + 7} 2 {i / 10} 0.5\n" for i in range(200)
    ))
    ds = InMemoryDataset()
    ds.init(batch_size=16, thread_num=1, use_var=SLOTS)
    ds.update_settings(parse_ins_id=True)
    ds.set_filelist([str(path)])
    ds.load_into_memory()
    return ds


@pytest.fixture
def dump_strategy():
    """Sets the fleet's strategy to dump; a fresh fleet afterwards."""
    def use(**configs) -> None:
        strategy = DistributedStrategy()
        strategy.trainer_desc_configs = configs
        fleet.init(strategy=strategy)

    yield use
    fleet.init()


def test_lines_are_paddles_format() -> None:
    text = format_lines(
        3, 2, ["a1", "a2"], None,
        [("prob", np.array([[0.25], [1e-7]], np.float32)),
         ("label", np.array([[1, -1], [0, 2]], np.int64))],
        [("w", np.array([1.5, -2.0], np.float32))],
    )
    assert text == (
        "a1\t\tprob:1:0.25\tlabel:2:1:18446744073709551615\n"
        "a2\t\tprob:1:1e-07\tlabel:2:0:2\n"
        "(3,w):1.5:-2\n"
    )


def read_dump(folder: Path) -> list[list[str]]:
    (path,) = sorted(folder.iterdir())
    assert path.name == "part-000-00000"
    return [line.split("\t") for line in path.read_text().splitlines()]


def test_inference_dumps_every_instance_with_the_models_outputs(
    tmp_path, dataset, dump_strategy
) -> None:
    folder = tmp_path / "dumps"
    dump_strategy(dump_fields_path=str(folder), dump_fields=["prob", "label"])
    model = Model()
    Executor().infer_from_dataset(model, dataset)
    rows = read_dump(folder)
    assert [row[0] for row in rows] == [f"ins{i}" for i in range(200)]
    expected = []
    with torch.no_grad():
        for batch in dataset:
            expected += model(batch)["prob"].reshape(-1).tolist()
    for row, prob, i in zip(rows, expected, range(200), strict=True):
        assert row[1] == ""  # no content parsed
        assert row[2] == f"prob:1:{prob:g}"
        assert row[3] == f"label:1:{i % 2}"


@pytest.mark.parametrize("threads", [1, 2])
def test_training_dumps_each_instance_once_and_each_batchs_parameters(
    tmp_path, dataset, dump_strategy, threads, caplog
) -> None:
    folder = tmp_path / "dumps"
    dump_strategy(dump_fields_path=str(folder), dump_fields=["prob"],
                  dump_param=["linear.bias"])
    model = Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with caplog.at_level(logging.INFO):
        summary = Executor().train_from_dataset(model, dataset, optimizer, thread=threads,
                                                hogwild=threads > 1)
    rows = read_dump(folder)
    instances = [row for row in rows if not row[0].startswith("(")]
    params = [row[0] for row in rows if row[0].startswith("(")]
    assert sorted(row[0] for row in instances) == sorted(f"ins{i}" for i in range(200))
    assert all(row[2].startswith("prob:1:") for row in instances)
    assert len(params) == summary.batches == 13
    assert sorted(int(p[1:].split(",")[0]) for p in params) == list(range(13))
    assert all(p.split(")")[0].endswith(",linear.bias") for p in params)
    if threads > 1:  # processes could not write this process's file: threads
        assert summary.hogwild == "threads"
        assert "dump_fields are written by the trainer's process" in caplog.text


def test_a_second_call_replaces_the_first_calls_file(tmp_path, dataset, dump_strategy) -> None:
    folder = tmp_path / "dumps"
    dump_strategy(dump_fields_path=str(folder), dump_fields=["label"])
    Executor().infer_from_dataset(Model(), dataset)
    Executor().infer_from_dataset(Model(), dataset)
    assert len(read_dump(folder)) == 200


@pytest.mark.parametrize(
    ("configs", "error", "message"),
    [
        ({"dump_fields": ["prob"]}, ValueError, "names dump_fields or dump_param but no "
         "dump_fields_path"),
        ({"dump_fields_path": "DUMPS", "dump_param": ["nope"]}, KeyError,
         r"\['nope'\], which are not parameters of the model"),
        ({"dump_fields_path": "DUMPS", "dump_fields": ["nope"]}, KeyError,
         "dump_fields names 'nope', which the model's outputs lack"),
        ({"dump_fields_path": "FILE/sub", "dump_fields": ["prob"]}, OSError, None),
    ],
)
def test_bad_dump_settings_are_named(
    tmp_path, dataset, dump_strategy, configs, error, message
) -> None:
    (tmp_path / "FILE").write_text("a file where a folder should be")
    configs = {k: v.replace("DUMPS", str(tmp_path / "d")).replace("FILE", str(tmp_path / "FILE"))
               if isinstance(v, str) else v for k, v in configs.items()}
    dump_strategy(**configs)
    with pytest.raises(error, match=message):
        Executor().infer_from_dataset(Model(), dataset)


@pytest.mark.parametrize(
    ("configs", "error", "message"),
    [
        ({"stat_var_names": []}, KeyError, "'stat_var_names' is not a trainer_desc_configs key"),
        ({"dump_fields": "prob"}, TypeError, "must be a list of names, got 'prob'"),
        ({"dump_fields_path": 3}, TypeError, "must be a folder path"),
    ],
)
def test_the_strategy_refuses_what_it_cannot_carry_out(configs, error, message) -> None:
    strategy = DistributedStrategy()
    with pytest.raises(error, match=message):
        strategy.trainer_desc_configs = configs
    assert strategy.trainer_desc_configs == {
        "dump_fields_path": "", "dump_fields": [], "dump_param": [],
    }
