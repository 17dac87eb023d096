"""Executor.train_from_dataset / infer_from_dataset, and the AUC metrics."""

from __future__ import annotations

import itertools
import re
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from datafeed import InMemoryDataset, QueueDataset, Slot
from trainer import Executor, StreamingAUC, auc, fleet

SLOTS = [Slot("x", "float32", (2,)), Slot("label", "int64", (1,))]
PAPER_LINE = re.compile(
    r"^time: \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\], batch: \[(\d+)\], loss\[1\]:\[([-0-9.e]+)\]$"
)


def write_files(directory: Path, files: int = 2, per_file: int = 200) -> list[str]:
    """Two features in [-1, 1]; label = x0 > x1 (learnable by logistic regression)."""
    rng = np.random.default_rng(0)
    paths = []
    for f in range(files):
        x = rng.uniform(-1, 1, (per_file, 2))
        lines = [f"2 {a:.4f} {b:.4f} 1 {int(a > b)}\n" for a, b in x]
        path = directory / f"part-{f}.txt"
        path.write_text("".join(lines))
        paths.append(str(path))
    return paths


def make(kind: type, files: list[str], batch_size: int = 20, thread_num: int = 2):
    dataset = kind()
    dataset.init(batch_size=batch_size, thread_num=thread_num, use_var=SLOTS, pipe_command="cat")
    dataset.set_filelist(files)
    if kind is InMemoryDataset:
        dataset.load_into_memory()
    return dataset


class Logistic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(2, 1)

    def forward(self, batch):
        logit = self.linear(batch["x"]).squeeze(1)
        label = batch["label"].squeeze(1).float()
        loss = nn.functional.binary_cross_entropy_with_logits(logit, label)
        return {"loss": loss, "prob": torch.sigmoid(logit), "label": label}


@pytest.mark.parametrize("kind", [InMemoryDataset, QueueDataset])
def test_training_lowers_the_loss_and_prints_paddles_line(tmp_path, capsys, kind):
    files = write_files(tmp_path)
    dataset = make(kind, files)
    model = Logistic()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    executor = Executor()
    summaries = [
        executor.train_from_dataset(model, dataset, optimizer, thread=2, print_period=5)
        for _ in range(3)
    ]
    assert [s.batches for s in summaries] == [20, 20, 20]
    assert [s.records for s in summaries] == [400, 400, 400]
    assert summaries[0].threads == 2
    assert summaries[2].mean_loss < 0.7 * summaries[0].mean_loss
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 12  # batches 5, 10, 15, 20 of each pass
    matches = [PAPER_LINE.match(line) for line in lines]
    assert all(matches), lines
    assert [int(m.group(1)) for m in matches[:4]] == [5, 10, 15, 20]
    assert summaries[2].last_fetch["loss"] == [float(matches[-1].group(2))] or abs(
        summaries[2].last_fetch["loss"][0] - float(matches[-1].group(2))
    ) < 1e-5


def test_fetch_list_and_info_name_the_printed_values(tmp_path, capsys):
    dataset = make(InMemoryDataset, write_files(tmp_path, files=1, per_file=40))
    model = Logistic()
    Executor().train_from_dataset(
        model, dataset, torch.optim.SGD(model.parameters(), lr=0.1), thread=1,
        fetch_list=["loss", "label"], fetch_info=["cost", "y"], print_period=2,
    )
    line = capsys.readouterr().out.splitlines()[0]
    assert re.fullmatch(
        r"time: \[[^]]+\], batch: \[2\], cost\[1\]:\[[0-9.e-]+\], y\[20\]:\[([01] ){19}[01]\]",
        line,
    ), line


def test_fetch_list_empty_prints_nothing_and_debug_prints_timings(tmp_path, capsys):
    dataset = make(InMemoryDataset, write_files(tmp_path, files=1, per_file=40))
    model = Logistic()
    summary = Executor().train_from_dataset(
        model, dataset, torch.optim.SGD(model.parameters(), lr=0.1),
        fetch_list=[], debug=True, print_period=1,
    )
    captured = capsys.readouterr()
    assert captured.out == ""
    debug_lines = captured.err.splitlines()
    assert len(debug_lines) == 2 + 1  # one per batch, then the summary
    assert re.search(
        r"batch: \[2\], data wait: [0-9.]+ ms/batch, forward: [0-9.]+ ms/batch, "
        r"backward: [0-9.]+ ms/batch, step: [0-9.]+ ms/batch \(pull: [0-9.]+, "
        r"optimizer: [0-9.]+, push: [0-9.]+\), IO percent: [0-9.]+%, [0-9.]+ records/s",
        debug_lines[-1],
    )
    assert set(summary.timings) == {
        "data_wait", "forward", "backward", "step", "pull", "optimizer", "push"
    }
    timings = summary.timings
    assert timings["forward"] > 0 and timings["step"] > 0
    # No sparse rows: no pull; a plain torch optimizer's step is all optimizer.
    assert timings["pull"] == 0.0 and 0 < timings["optimizer"] <= timings["step"]
    assert timings["push"] == pytest.approx(timings["step"] - timings["optimizer"], abs=1e-3)


def test_infer_leaves_parameters_alone_and_feeds_the_handler(tmp_path):
    dataset = make(QueueDataset, write_files(tmp_path), batch_size=50)
    model = Logistic()
    model.train()
    before = [p.detach().clone() for p in model.parameters()]
    metric = StreamingAUC()
    seen: list[int] = []
    modes: list[bool] = []

    def handler(outputs):
        seen.append(outputs["prob"].numel())
        metric.update(outputs["label"], outputs["prob"])
        assert not outputs["prob"].requires_grad

    class Spy(Logistic):
        def forward(self, batch):
            modes.append(self.training)
            return super().forward(batch)

    spy = Spy()
    spy.load_state_dict(model.state_dict())
    summary = Executor().infer_from_dataset(
        spy, dataset, thread=2, fetch_list=[], fetch_handler=handler
    )
    assert sorted(seen) == [50] * 8 and summary.records == 400
    assert modes == [False] * 8 and spy.training  # eval during, restored after
    for old, new in zip(before, spy.parameters(), strict=True):
        assert torch.equal(old, new)
    assert metric.count == 400
    assert 0.0 < metric.compute() < 1.0


class WithTable(nn.Module):
    """Logistic regression plus a sparse table keyed by the rounded features,
    and a BatchNorm (a submodule whose mode matters)."""

    def __init__(self, table: str) -> None:
        super().__init__()
        from trainer.nn import SparseEmbedding

        torch.manual_seed(0)
        self.linear = nn.Linear(3, 1)
        self.norm = nn.BatchNorm1d(2)
        self.emb = SparseEmbedding(1, table)

    def forward(self, batch):
        ids = (batch["x"] * 4).round().long().sum(1) + 10
        x = torch.cat([self.norm(batch["x"]), self.emb(ids)], dim=1)
        logit = self.linear(x).squeeze(1)
        label = batch["label"].squeeze(1).float()
        loss = nn.functional.binary_cross_entropy_with_logits(logit, label)
        return {"loss": loss, "prob": torch.sigmoid(logit), "label": label}


def test_threads_train_exactly_one_threads_model(tmp_path):
    # Threads take batches in order but reached the step lock in any order:
    # the model drifted from one thread's by up to 0.0125 in 300 batches.
    from trainer.embedding import pending, stores
    from trainer.job.role import ClusterRole
    from trainer.ps import ParameterServerRuntime

    files = write_files(tmp_path, files=2, per_file=600)
    trained = {}
    for threads in (1, 2, 3):
        model = WithTable("ordered")  # the same name: the same initial rows
        # Through the distributed optimizer, whose step pushes the sparse rows
        # (a plain torch optimizer left every pull pending, for the next test).
        optimizer = ParameterServerRuntime(ClusterRole.local(), None).distributed_optimizer(
            torch.optim.SGD(model.parameters(), lr=0.3), model=model)
        for _ in range(2):
            Executor().train_from_dataset(model, make(InMemoryDataset, files, batch_size=4),
                                          optimizer, thread=threads, print_period=10**6)
        rows = stores.local_store().tables["ordered"].state_dict()
        trained[threads] = ([p.detach().clone() for p in model.state_dict().values()],
                            rows["ids"].tolist(), rows["weights"].clone())
        stores.local_store().clear()
    for threads in (2, 3):
        assert all(torch.equal(a, b) for a, b in zip(trained[1][0], trained[threads][0],
                                                      strict=True)), threads
        assert trained[1][1] == trained[threads][1]
        assert torch.equal(trained[1][2], trained[threads][2])
    assert not torch.equal(trained[1][2], torch.zeros_like(trained[1][2]))
    assert pending.pending_rows() == []
    stores.local_store().clear()


class FrozenNorm(WithTable):
    """Its BatchNorm's statistics frozen the PyTorch way: train() overridden."""

    def __init__(self, table: str) -> None:
        super().__init__(table)
        self.mode_calls = 0

    def train(self, mode: bool = True):
        super().train(mode)
        self.norm.eval()
        self.mode_calls += 1  # an override keeping state in step (LoRA merges in eval)
        return self


def test_training_calls_train_and_inference_gives_every_part_its_mode_back(tmp_path):
    from trainer.embedding import stores

    files = write_files(tmp_path)
    model = FrozenNorm("modes")
    model.train()
    frozen = model.norm.running_mean.clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    Executor().train_from_dataset(model, make(InMemoryDataset, files), optimizer)
    assert model.training and not model.norm.training
    assert torch.equal(model.norm.running_mean, frozen)  # the override kept it frozen
    calls = model.mode_calls
    model.linear.eval()  # a part left in eval by hand: inference gives it back as it was
    Executor().infer_from_dataset(model, make(InMemoryDataset, files), fetch_list=[])
    assert model.training and not model.norm.training and not model.linear.training
    assert model.mode_calls > calls  # restored through train(), not by setting flags
    inner = WithTable("inner")
    inner.eval()  # a pretrained part handed over in eval mode (from_pretrained does)
    wrapper = nn.Module()
    wrapper.inner = inner
    wrapper.forward = inner.forward
    Executor().train_from_dataset(wrapper, make(InMemoryDataset, files), optimizer)
    assert inner.training and inner.norm.training  # model.train(), as any loop calls it
    stores.local_store().clear()


def test_inference_gives_a_part_shared_by_two_parents_its_mode_back(tmp_path):
    files = write_files(tmp_path)
    model = Logistic()
    shared = nn.Dropout(0.5)
    model.a, model.b = nn.Sequential(shared), nn.Sequential(shared)
    model.b.eval()  # the shared Dropout too
    shared.train()  # then back on by hand, under an eval parent
    Executor().infer_from_dataset(model, make(InMemoryDataset, files), fetch_list=[])
    assert shared.training and not model.b.training and model.a.training
    failing = Logistic()
    failing.train()
    with pytest.raises(TypeError):
        Executor().infer_from_dataset(failing, 42, fetch_list=[])  # iter(42) fails
    assert failing.training  # given back even when the pass could not start


def test_a_worker_thread_error_is_raised_in_the_caller_with_its_traceback(tmp_path):
    dataset = make(QueueDataset, write_files(tmp_path, files=2, per_file=200))
    calls = itertools.count()

    class Broken(Logistic):
        def forward(self, batch):
            if next(calls) == 3:
                raise ValueError("bad batch in the model")
            return super().forward(batch)

    model = Broken()
    with pytest.raises(ValueError, match="bad batch in the model") as info:
        Executor().train_from_dataset(
            model, dataset, torch.optim.SGD(model.parameters(), lr=0.1), thread=2,
            fetch_list=[],
        )
    assert any(entry.name == "forward" for entry in info.traceback)
    assert threading.active_count() == 1 or all(
        not t.name.startswith("trainer-worker") for t in threading.enumerate()
    )


def test_argument_errors(tmp_path):
    dataset = make(InMemoryDataset, write_files(tmp_path, files=1, per_file=20))
    model = Logistic()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    executor = Executor()
    with pytest.raises(RuntimeError, match="dataset is needed"):
        executor.train_from_dataset(model, None, optimizer)
    with pytest.raises(ValueError, match=r"fetch_info must name each fetch_list entry: 1 .*, 2"):
        executor.train_from_dataset(model, dataset, optimizer, fetch_info=["a", "b"])
    with pytest.raises(ValueError, match="print_period must be an int >= 1, got 0"):
        executor.train_from_dataset(model, dataset, optimizer, print_period=0)
    with pytest.raises(TypeError, match=r"a tensor under 'loss', got keys \['prob'\]"):
        executor.train_from_dataset(lambda b: {"prob": b["x"]}, dataset, optimizer)
    with pytest.raises(KeyError, match=r"fetch_list names \['auc'\]"):
        executor.train_from_dataset(model, dataset, optimizer, fetch_list=["auc"])
    fleet.init()
    with pytest.raises(ValueError, match="needs an optimizer"):
        executor.train_from_dataset(model, dataset)


class PaddleProgram:
    """What ``paddle.static.default_main_program()`` is to the call: not callable,
    with Paddle's ``global_block()``."""

    def global_block(self) -> None:
        return None


class PaddleScope:
    """What ``paddle.static.global_scope()`` is: variables by name, no ``step()``."""

    def find_var(self, name: str) -> None:
        return None


@pytest.fixture
def fleet_left_clean():
    yield
    fleet.init()  # the next test finds no model or optimizer of this one's in fleet


def test_paddles_positional_order_runs_the_model_and_optimizer_fleet_holds(
    tmp_path, capsys, fleet_left_clean
):
    dataset = make(InMemoryDataset, write_files(tmp_path, files=1, per_file=40))
    fleet.init()
    model = fleet.distributed_model(Logistic())
    fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.5))
    before = model.linear.weight.detach().clone()
    executor = Executor()
    # The parameter-server quick start's call, unchanged.
    summary = executor.train_from_dataset(
        PaddleProgram(), dataset, PaddleScope(), debug=False, fetch_list=["loss"],
        fetch_info=["loss"], print_period=1,
    )
    assert (summary.batches, summary.records) == (2, 40)
    assert not torch.equal(model.linear.weight, before)  # fleet's optimizer stepped it
    assert len([PAPER_LINE.match(line) for line in capsys.readouterr().out.splitlines()]) == 2
    # The model first with Paddle's scope third; None for the program (Paddle's default).
    stepped = model.linear.weight.detach().clone()
    assert executor.train_from_dataset(model, dataset, PaddleScope(), fetch_list=[]).records == 40
    assert not torch.equal(model.linear.weight, stepped)
    assert executor.train_from_dataset(None, dataset, PaddleScope(), fetch_list=[]).records == 40
    trained = model.linear.weight.detach().clone()
    for program in (PaddleProgram(), None):
        summary = executor.infer_from_dataset(program, dataset, PaddleScope(), fetch_list=[])
        assert summary.records == 40 and summary.mean_loss is not None
    assert torch.equal(model.linear.weight, trained)


def test_paddles_order_without_fleets_model_or_optimizer_shows_fleetfeeds_call(
    tmp_path, fleet_left_clean
):
    dataset = make(InMemoryDataset, write_files(tmp_path, files=1, per_file=20))
    fleet.init()  # holds no model and no optimizer
    executor = Executor()
    call = re.escape("exe.train_from_dataset(model, dataset, optimizer, thread=..., fetch_list=[")
    with pytest.raises(
        TypeError,
        match=r"train_from_dataset got Paddle's program \(a PaddleProgram\) in place of the "
        f"model, and fleet holds no model for it to stand for: call {call}.* with the model, "
        r"or give the model to fleet.distributed_model\(model\) first",
    ):
        executor.train_from_dataset(PaddleProgram(), dataset, PaddleScope())
    with pytest.raises(TypeError, match=r"infer_from_dataset got Paddle's program \(None\)"):
        executor.infer_from_dataset(None, dataset)
    model = Logistic()
    with pytest.raises(
        ValueError,
        match=r"needs an optimizer: the third argument, a PaddleScope, is Paddle's scope, which "
        r"stands for the optimizer given to fleet.distributed_optimizer, and none was given; "
        rf"call fleet.distributed_optimizer\(optimizer\) first, or {call}",
    ):
        executor.train_from_dataset(model, dataset, PaddleScope())
    with pytest.raises(
        TypeError,
        match=r"third argument must be an optimizer \(with step\(\)\) or Paddle's scope, "
        f"got 4; fleetfeed's call is {call}",
    ):
        executor.train_from_dataset(model, dataset, 4)
    with pytest.raises(TypeError, match=r"model must be callable as model\(batch\), got a dict"):
        executor.train_from_dataset({"w": 1}, dataset, torch.optim.SGD(model.parameters(), lr=1))


# -- metrics ----------------------------------------------------------------------------


def brute_force_auc(labels, scores) -> float:
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 1), st.integers(0, 6)), min_size=2, max_size=40
    ).filter(lambda rows: len({y for y, _ in rows}) == 2)
)
def test_auc_matches_the_pairwise_definition_with_ties(rows):
    labels = [y for y, _ in rows]
    scores = [(s + 0.5) / 7 for _, s in rows]  # few distinct values: many ties
    assert auc(labels, scores) == pytest.approx(brute_force_auc(labels, scores))
    streaming = StreamingAUC(num_thresholds=7)  # one bucket per distinct score
    streaming.update(np.array(labels), torch.tensor(scores))
    assert streaming.compute() == pytest.approx(brute_force_auc(labels, scores))


def test_streaming_auc_is_close_to_exact_and_merges():
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 2, 20_000)
    scores = 1 / (1 + np.exp(-(labels * 1.5 + rng.normal(0, 1.5, labels.size))))
    exact = auc(labels, scores)
    first, second = StreamingAUC(), StreamingAUC()
    first.update(labels[:5000], scores[:5000])
    second.update(labels[5000:], scores[5000:])
    first.merge(second)
    assert 0.7 < exact < 0.85
    assert abs(first.compute() - exact) < 1e-3
    assert first.count == 20_000


def test_auc_errors():
    with pytest.raises(ValueError, match="undefined with 3 positive and 0 negative"):
        auc([1, 1, 1], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match=r"labels must be 0 or 1, found \[2\]"):
        auc([0, 2], [0.1, 0.2])
    with pytest.raises(ValueError, match="same number of values, found 2 labels and 3 scores"):
        StreamingAUC().update([0, 1], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="undefined with 0 positive and 0 negative"):
        StreamingAUC().compute()


def test_streaming_auc_refuses_scores_that_are_not_probabilities():
    # Paddle's auc op refuses them; clipping logits into the end buckets gave
    # 0.74 for an exact 0.80, without a word.
    metric = StreamingAUC()
    with pytest.raises(ValueError, match=r"expected probabilities in \[0, 1\], found 2 of 4 "
                       r"scores outside, e.g. \[-0.5, 7.3\] \(logits\? give torch.sigmoid"):
        metric.update([0, 1, 0, 1], torch.tensor([0.2, 1.0, -0.5, 7.3], dtype=torch.float64))
    assert metric.count == 0  # nothing of the batch was counted
    metric.update([0, 1], [0.0, 1.0])  # the ends are probabilities
    assert metric.state()[:, [0, -1]].tolist() == [[0, 1], [1, 0]]
    # A float32 mixture of probabilities rounds past 1: the top bucket, not an error.
    rounded = np.array([np.nextafter(np.float32(1), np.float32(2)), -1e-7], dtype=np.float32)
    metric.update([1, 0], torch.from_numpy(rounded))
    assert metric.state()[:, [0, -1]].tolist() == [[0, 2], [2, 0]]
    large = StreamingAUC(num_thresholds=2**24 + 3)  # float32(n) rounds up to n + 1
    large.update([1], torch.tensor([1.0]))
    assert large.state()[0, -1] == 1


def test_streaming_auc_buckets_as_paddles_kernel_multiplies():
    # Paddle's kernel takes uint32(p * num_thresholds) in the scores' type:
    # float32(0.005) * 1000 is 5 in float32, 4.99999989 in float64.
    metric = StreamingAUC(num_thresholds=1000)
    metric.update([1, 0], torch.tensor([0.005, 0.007], dtype=torch.float32))
    assert np.flatnonzero(metric.state()[0]).tolist() == [5]
    assert np.flatnonzero(metric.state()[1]).tolist() == [7]
    wide = StreamingAUC(num_thresholds=1000)
    wide.update([1], np.array([np.float32(0.005)], dtype=np.float64))  # as float64: bucket 4
    assert np.flatnonzero(wide.state()[0]).tolist() == [4]


def test_place_moves_batches_to_the_device(tmp_path):
    dataset = make(InMemoryDataset, write_files(tmp_path, files=1, per_file=40))
    devices = []

    def model(batch):
        devices.append((batch["x"].device.type, batch["label"].device.type, batch.size))
        return {}

    summary = Executor(place="meta").infer_from_dataset(model, dataset, fetch_list=[], thread=1)
    assert devices == [("meta", "meta", 20)] * 2
    assert summary.records == 40 and summary.mean_loss is None


def test_infer_prints_the_default_loss_only_when_there_is_one(tmp_path, capsys):
    dataset = make(InMemoryDataset, write_files(tmp_path, files=1, per_file=40))
    Executor().infer_from_dataset(lambda batch: {"prob": batch["x"]}, dataset, print_period=1)
    assert capsys.readouterr().out == ""
    Executor().infer_from_dataset(Logistic(), dataset, print_period=1)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(PAPER_LINE.match(line) for line in lines)
