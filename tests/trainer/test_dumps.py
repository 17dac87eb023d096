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
from trainer.loop.dumps import FieldDumper, format_lines

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
    # Paddle 2.x/3.x device_worker.cc: "%.9g" floats, int64 as "%lu", int32 "%d".
    text = format_lines(
        3, 2, ["a1", "a2"], ["c1", "c2"],
        [("prob", np.array([[0.25], [1e-7]], np.float32)),
         ("label", np.array([[1, -1], [0, 2]], np.int64)),
         ("small", np.array([[-3], [4]], np.int32))],
        [("w", np.array([[1.5, -2.0, np.nan]], np.float64))],
    )
    assert text == (
        "a1\tc1\tprob:1:0.25\tlabel:2:1:18446744073709551615\tsmall:1:-3\n"
        "a2\tc2\tprob:1:1.00000001e-07\tlabel:2:0:2\tsmall:1:4\n"
        "(3,w):1.5:-2:nan\n"
    )
    # Without instance ids a line starts with its first field's tab, as in Paddle.
    assert format_lines(0, 1, None, None, [("p", np.array([[0.5]]))], []) == "\tp:1:0.5\n"


def test_ids_that_are_not_utf8_are_written_as_they_were(tmp_path) -> None:
    raw_id = b"id\xff\xfe"
    ids = [raw_id.decode("utf-8", "surrogateescape")]  # as the datasets hand them out
    dumper = FieldDumper(str(tmp_path), ["p"], [], 4)

    class OneRecord:
        ins_ids, contents = ids, None

    dumper.add(OneRecord(), {"p": torch.tensor([0.5])}, 1)
    dumper.close()
    assert (tmp_path / "part-004-00000").read_bytes() == raw_id + b"\t\tp:1:0.5\n"


def test_a_writer_that_fails_fails_the_call_with_its_error(
    tmp_path, dataset, dump_strategy
) -> None:
    folder = tmp_path / "dumps"
    (folder / "part-000-00000").mkdir(parents=True)  # where the file should go
    dump_strategy(dump_fields_path=str(folder), dump_fields=["prob"])
    with pytest.raises(RuntimeError, match=r"(?s)writing the dump .*part-000-00000 failed: its "
                                           r"writer process exited 1: .*IsADirectoryError"):
        Executor().infer_from_dataset(Model(), dataset)


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
        name, count, text = row[2].split(":")
        assert (name, count) == ("prob", "1")
        assert np.float32(float(text)) == np.float32(prob)  # 9 digits: the float32 itself
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


def test_dumped_parameters_are_their_values_at_each_batch(
    tmp_path, dataset, dump_strategy
) -> None:
    folder = tmp_path / "dumps"
    dump_strategy(dump_fields_path=str(folder), dump_param=["linear.weight"])
    model = Model()
    Executor().train_from_dataset(model, dataset, torch.optim.SGD(model.parameters(), lr=0.0))
    rows = read_dump(folder)
    weights = [row[0] for row in rows if row[0].startswith("(")]
    assert len(weights) == 13
    expected = model.linear.weight.detach().reshape(-1).tolist()  # lr 0: unchanged
    for number, line in enumerate(sorted(weights, key=lambda w: int(w[1:].split(",")[0]))):
        head, *values = line.split(":")
        assert head == f"({number},linear.weight)"
        assert [np.float32(float(v)) for v in values] == [np.float32(v) for v in expected]


def test_a_second_call_replaces_the_first_calls_file(tmp_path, dataset, dump_strategy) -> None:
    folder = tmp_path / "dumps"
    dump_strategy(dump_fields_path=str(folder), dump_fields=["label"])
    Executor().infer_from_dataset(Model(), dataset)
    Executor().infer_from_dataset(Model(), dataset)
    assert len(read_dump(folder)) == 200


class FailsAtBatch(Model):
    def __init__(self, batch: int) -> None:
        super().__init__()
        self.left = batch

    def forward(self, batch):
        self.left -= 1
        if self.left == 0:
            raise RuntimeError("the model failed")
        return super().forward(batch)


def test_a_failed_call_leaves_the_previous_dump_and_no_partial_one(
    tmp_path, dataset, dump_strategy
) -> None:
    folder = tmp_path / "dumps"
    dump_strategy(dump_fields_path=str(folder), dump_fields=["label"])
    Executor().infer_from_dataset(Model(), dataset)
    before = (folder / "part-000-00000").read_bytes()
    with pytest.raises(RuntimeError, match="the model failed"):
        Executor().infer_from_dataset(FailsAtBatch(8), dataset)  # 7 of 13 batches dumped
    assert [p.name for p in folder.iterdir()] == ["part-000-00000"]  # nothing hidden left
    assert (folder / "part-000-00000").read_bytes() == before


KILLED_WRITER = """
import os, signal, sys, torch
from trainer.loop.dumps import FieldDumper
dumper = FieldDumper(sys.argv[1], ["p"], [], 0)
class Batch:
    ins_ids, contents = [f"i{n}" for n in range(100)], None
for _ in range(20):
    dumper.add(Batch(), {"p": torch.rand(100)}, 100)
print(dumper._child.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # as a crash would, between two batches
"""


def test_a_killed_training_process_leaves_no_dump(tmp_path) -> None:
    import os
    import subprocess
    import sys
    import time

    done = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(tmp_path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == -9, done.stderr
    writer = int(done.stdout)
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{writer}") and time.monotonic() < deadline:
        time.sleep(0.05)  # the writer sees its pipe end, removes its file and exits
    assert list(tmp_path.iterdir()) == []


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
        ({"dump_fields_path": "DUMPS", "dump_fields": ["loss"]}, ValueError,
         r"output 'loss' has shape \[\]; a dumped field is \[batch, k\] or \[batch\]"),
    ],
)
def test_bad_dump_settings_are_named(
    tmp_path, dataset, dump_strategy, configs, error, message
) -> None:
    (tmp_path / "FILE").write_text("a file where a folder should be")
    configs = {k: v.replace("DUMPS", str(tmp_path / "d")).replace("FILE", str(tmp_path / "FILE"))
               if isinstance(v, str) else v for k, v in configs.items()}
    dump_strategy(**configs)
    model = Model()
    with pytest.raises(error, match=message):
        Executor().infer_from_dataset(model, dataset)
    assert model.training  # infer_from_dataset's eval mode ended with the call


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


@pytest.mark.parametrize(
    ("folder", "path"),
    [
        ("/data/dumps", "/data/dumps/part-002-00000"),
        ("hdfs://nn:9000/dumps/day1", "hdfs://nn:9000/dumps/day1/part-002-00000"),
        ("s3://bucket/d?endpoint_override=localhost%3A9000&scheme=http",
         "s3://bucket/d/part-002-00000?endpoint_override=localhost%3A9000&scheme=http"),
    ],
)
def test_the_file_goes_in_the_folder_of_a_path_or_a_uri(folder, path) -> None:
    from trainer.loop.dumps import _join

    assert _join(folder, "part-002-00000") == path
