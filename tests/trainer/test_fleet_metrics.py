"""fleet.metrics: Paddle's cluster-wide metrics, reduced over every worker.

The unit tests reduce through a stand-in for ``fleet.util`` that adds the other
workers' values; the job test runs two real ranks (gloo, the job's key) and
compares what each gets with the metrics of all predictions computed offline.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
from support import run_collective_ranks

from trainer import StreamingAUC, auc, fleet
from trainer.metrics import FleetMetrics


class OtherWorkers:
    """A ``fleet.util`` for one worker whose peers' values are known, one list
    per peer: call ``n`` of ``all_reduce`` reduces the input with each peer's
    ``n``-th value."""

    def __init__(self, *peers_calls: list) -> None:
        self.peers_calls = peers_calls
        self.calls = 0

    def all_reduce(self, input, mode="sum", comm_world="worker"):
        values = [np.asarray(input)] + [
            np.asarray(calls[self.calls]).reshape(np.shape(input)) for calls in self.peers_calls
        ]
        self.calls += 1
        return {"sum": np.sum, "max": np.max, "min": np.min}[mode](np.stack(values), axis=0)


def predictions(seed: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.random(count) < 0.3
    scores = np.clip(rng.normal(0.35 + 0.3 * labels, 0.2), 0, 1)
    return labels.astype(np.int64), scores


def test_the_global_auc_is_the_auc_of_every_workers_predictions_in_buckets():
    (labels0, scores0), (labels1, scores1) = predictions(0, 5000), predictions(1, 7000)
    mine, theirs = StreamingAUC(), StreamingAUC()
    mine.update(labels0, scores0)
    theirs.update(labels1, scores1)
    pos, neg = theirs.state()
    metrics = FleetMetrics(OtherWorkers([pos, neg]))
    got = metrics.auc(mine)
    labels = np.concatenate([labels0, labels1])
    scores = np.concatenate([scores0, scores1])
    # Exactly the AUC of the scores rounded down to their bucket (ties count one half).
    buckets = np.floor(np.clip(scores * 4095, 0, 4095))
    assert got == pytest.approx(auc(labels, buckets), abs=1e-12)
    # Within the documented resolution of 4,096 buckets (the rounding moves it by
    # 3e-6 here; one worker's own AUC differs from the global one by 2e-3).
    assert abs(got - auc(labels, scores)) < 1e-3
    assert auc(labels0, scores0) != pytest.approx(got, abs=1e-3)  # not this worker's alone


def test_paddles_statistics_shape_gives_paddles_trapezoid_value():
    # Buckets lowest score first. By hand: 2 positives x 2 negatives = 4 pairs;
    # the positive of bucket 2 beats both negatives (2), the one of bucket 1
    # ties one (0.5) and beats the other (1): 3.5 / 4.
    metrics = FleetMetrics(OtherWorkers([[0, 0, 0], [0, 0, 0]]))
    assert metrics.auc(np.array([[0, 1, 1]]), np.array([[1, 1, 0]])) == 0.875
    # The same counts split over two workers.
    metrics = FleetMetrics(OtherWorkers([[0, 0, 1], [1, 0, 0]]))
    assert metrics.auc(np.array([[0, 1, 0]]), torch_tensor([[0, 1, 0]])) == 0.875


def torch_tensor(values):
    torch = pytest.importorskip("torch")
    return torch.tensor(values)


def test_an_auc_with_one_class_over_all_workers_is_one_half_as_paddles_and_is_logged(caplog):
    metrics = FleetMetrics(OtherWorkers([[0, 2], [0, 0]]))
    with caplog.at_level(logging.WARNING, logger="trainer.metrics"):
        assert metrics.auc([3, 1], [0, 0]) == 0.5
    assert "6 positive and 0 negative instances over all workers" in caplog.text


def test_sums_ratios_and_extremes_reduce_over_the_workers():
    # Worker 0: abserr 3, sqrerr 5, 4 instances, 3 correct; worker 1: 1, 3, 4, 1.
    metrics = FleetMetrics(OtherWorkers([[1.0], [4]]))
    assert metrics.mae(np.array([3.0]), np.array([4])) == 0.5
    metrics = FleetMetrics(OtherWorkers([[3.0], [4]]))
    assert metrics.mse([5.0], [4]) == 1.0
    metrics = FleetMetrics(OtherWorkers([[3.0], [4]]))
    assert metrics.rmse(np.array([5.0]), np.array([4])) == 1.0
    metrics = FleetMetrics(OtherWorkers([[1], [4]]))
    assert metrics.acc(np.array([3]), np.array([4])) == 0.5
    table = np.array([[1.0, 5.0], [-2.0, 0.0]])
    other = np.array([[4.0, 2.0], [1.0, -3.0]])
    assert FleetMetrics(OtherWorkers([other])).sum(table).tolist() == [[5, 7], [-1, -3]]
    assert FleetMetrics(OtherWorkers([other])).max(table).tolist() == [[4, 5], [1, 0]]
    assert FleetMetrics(OtherWorkers([other])).min(table).tolist() == [[1, 2], [-2, -3]]
    assert FleetMetrics(OtherWorkers([other])).sum(table).shape == (2, 2)
    # Element 0 of each statistic, as Paddle reads them: [abserr, anything].
    metrics = FleetMetrics(OtherWorkers([[1.0, 50.0], [4, 70]]))
    assert metrics.mae(np.array([3.0, 99.0]), np.array([4, 80])) == 0.5


def test_statistics_are_reduced_as_int64_or_float64_copies():
    class Alone:
        def all_reduce(self, input, mode="sum", comm_world="worker"):
            self.dtype = np.asarray(input).dtype
            return input  # what fleet.util does for one local worker

    alone = Alone()
    flags = np.array([True, False])
    summed = FleetMetrics(alone).sum(flags)
    assert alone.dtype == np.int64 and summed.tolist() == [1, 0]  # a count, not a logical or
    FleetMetrics(alone).max(np.array([3], dtype=np.uint32))
    assert alone.dtype == np.int64  # gloo reduces no unsigned type
    FleetMetrics(alone).min(np.array([0.5], dtype=np.float32))
    assert alone.dtype == np.float64
    table = np.ones(3)
    FleetMetrics(alone).sum(table)[0] = 7  # the caller's array is not the result
    assert table.tolist() == [1, 1, 1]


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda m: m.auc("auc_stat_pos", "auc_stat_neg"), TypeError,
         "Paddle reads a program variable from its scope; fleetfeed has no program"),
        (lambda m: m.sum(np.ones(2), scope=object()), TypeError, "leave scope out"),
        (lambda m: m.auc([1, 2, 3], [1, 2]), ValueError,
         "stat_pos has 3 buckets and stat_neg 2"),
        (lambda m: m.auc([[1, 2], [3, 4]], [[1, 2], [3, 4]]), ValueError,
         r"must have shape \[buckets\] or \[1, buckets\], got \(2, 2\)"),
        (lambda m: m.auc([1, -1], [1, 1]), ValueError, "must not be negative"),
        (lambda m: m.auc([1, 2]), TypeError, "auc needs stat_pos and stat_neg"),
        (lambda m: m.mae([1.0], [0]), ZeroDivisionError,
         "mae: total_ins_num summed over the workers is 0: no instance was counted"),
        (lambda m: m.sum(np.array([2**63], dtype=np.uint64)), ValueError,
         "a count of 9223372036854775808 does not fit an int64"),
        (lambda m: m.sum([]), ValueError, "expected at least one value"),
        (lambda m: m.sum(["a"]), TypeError, "expected numbers"),
    ],
)
def test_bad_inputs_are_named(call, error, message):
    class Alone:  # one worker: the input itself
        def all_reduce(self, input, mode="sum", comm_world="worker"):
            return np.asarray(input)

    with pytest.raises(error, match=message):
        call(FleetMetrics(Alone()))


def test_fleet_metrics_needs_fleet_init_first():
    from trainer.fleet import Fleet, UtilBase
    from trainer.job.errors import TrainerError

    # A fleet of its own: the process's fleet may have been initialised by another test.
    metrics = FleetMetrics(UtilBase(Fleet()))
    with pytest.raises(TrainerError, match=r"fleet.init\(\) has not been called"):
        metrics.sum(np.ones(2))
    assert isinstance(fleet.metrics, FleetMetrics)  # what fleet.metrics is


JOB = """
import json, sys
import numpy as np
import torch
from trainer import StreamingAUC, fleet

out = sys.argv[1]
fleet.init(is_collective=True, timeout=60)
rank = fleet.worker_index()
rng = np.random.default_rng(rank)
labels = (rng.random(4000 + 1000 * rank) < 0.3).astype(np.int64)
scores = np.clip(rng.normal(0.35 + 0.3 * labels, 0.2), 0, 1)
metric = StreamingAUC()
for start in range(0, len(labels), 512):
    metric.update(labels[start:start + 512], scores[start:start + 512])
pos, neg = metric.state()
errors = np.abs(scores - labels)
result = {
    "auc": fleet.metrics.auc(metric),
    "auc_paddle_shape": fleet.metrics.auc(pos[None, :], torch.tensor(neg[None, :])),
    "mae": fleet.metrics.mae(np.array([errors.sum()]), np.array([len(labels)])),
    "rmse": fleet.metrics.rmse(np.array([(errors ** 2).sum()]), np.array([len(labels)])),
    "acc": fleet.metrics.acc(np.array([((scores > 0.5) == labels).sum()]),
                             np.array([len(labels)])),
    "max": fleet.metrics.max(np.array([rank, -rank])).tolist(),
    "sum": fleet.metrics.sum(torch.tensor([[1.5, rank]])).tolist(),
    "flags": fleet.metrics.sum(np.array([True, rank == 0])).tolist(),
    "unsigned": fleet.metrics.max(np.array([rank + 1], dtype=np.uint32)).tolist(),
}
with open(f"{out}/rank{rank}.json", "w") as f:
    json.dump(result, f)
"""


@pytest.mark.distributed
@pytest.mark.parametrize("workers", [2, 3])
def test_every_worker_gets_the_metrics_of_all_predictions(tmp_path: Path, workers: int):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    results = run_collective_ranks(script, [str(tmp_path)], world_size=workers, timeout=120)
    assert all(code == 0 for code, _ in results), results
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(workers)]
    assert all(g == got[0] for g in got)  # every worker gets the same numbers
    labels, scores = [], []
    for rank in range(workers):  # the same draws as the job's, offline
        rng = np.random.default_rng(rank)
        rank_labels = (rng.random(4000 + 1000 * rank) < 0.3).astype(np.int64)
        labels.append(rank_labels)
        scores.append(np.clip(rng.normal(0.35 + 0.3 * rank_labels, 0.2), 0, 1))
    labels, scores = np.concatenate(labels), np.concatenate(scores)
    buckets = np.floor(np.clip(scores * 4095, 0, 4095))
    assert got[0]["auc"] == pytest.approx(auc(labels, buckets), abs=1e-12)
    assert got[0]["auc_paddle_shape"] == got[0]["auc"]
    errors = np.abs(scores - labels)
    assert got[0]["mae"] == pytest.approx(errors.mean(), rel=1e-12)
    assert got[0]["rmse"] == pytest.approx(math.sqrt((errors ** 2).mean()), rel=1e-12)
    assert got[0]["acc"] == pytest.approx(((scores > 0.5) == labels).mean(), rel=1e-12)
    assert got[0]["max"] == [workers - 1, 0]
    assert got[0]["sum"] == [[1.5 * workers, sum(range(workers))]]
    assert got[0]["flags"] == [workers, 1]  # counted, where gloo's sum of booleans is an or
    assert got[0]["unsigned"] == [workers]  # gloo reduces no unsigned type: sent as int64
