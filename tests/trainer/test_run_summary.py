"""RunSummary.input: a dataset's stats(), whose errors surface; nothing from
another iterable's ``stats`` (trainer/loop/run_summary.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from datafeed import InMemoryDataset, Slot
from trainer import Executor

SLOTS = [Slot("dense", "float32", (1,)), Slot("label", "float32", (1,))]


class Logistic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(1, 1)

    def forward(self, batch):
        logit = self.linear(batch["dense"]).reshape(-1)
        label = batch["label"].reshape(-1)
        return {"loss": nn.functional.binary_cross_entropy_with_logits(logit, label)}


def loaded(tmp_path) -> InMemoryDataset:
    path = tmp_path / "part-0.txt"
    path.write_text("".join(f"1 {i / 10:.1f} 1 {i % 2}\n" for i in range(40)))
    data = InMemoryDataset()
    data.init(batch_size=10, thread_num=1, use_var=SLOTS, pipe_command="cat")
    data.set_filelist([str(path)])
    data.load_into_memory()
    return data


def train(source):
    model = Logistic()
    return Executor().train_from_dataset(
        model, source, torch.optim.SGD(model.parameters(), lr=0.1), fetch_list=[]
    )


def test_the_summary_holds_the_datasets_stats(tmp_path):
    data = loaded(tmp_path)
    summary = train(data)
    assert summary.input is data.stats() and summary.input.records == 40


def test_an_error_of_the_datasets_stats_is_raised(tmp_path, monkeypatch):
    data = loaded(tmp_path)

    def broken() -> None:
        raise RuntimeError("the load accounting is broken")

    monkeypatch.setattr(data, "stats", broken)
    with pytest.raises(RuntimeError, match="the load accounting is broken"):
        train(data)


def test_another_iterables_stats_is_not_called(tmp_path):
    class Batches(list):
        def stats(self, of_what):  # a method of another meaning, with an argument
            raise AssertionError("called")

    summary = train(Batches(loaded(tmp_path)))
    assert summary.batches == 4 and summary.input is None
