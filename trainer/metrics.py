"""Metrics: the AUC exact (rank-based) and streaming (bucketed), and Paddle's
cluster-wide ``fleet.metrics``.

``auc(labels, scores)`` is the exact value, the Mann-Whitney statistic with tied
scores given their average rank (so a tie between a positive and a negative
counts one half). ``StreamingAUC`` keeps two histograms of scores, as Paddle's
``auc`` op does (``num_thresholds`` buckets over [0, 1]), so an evaluation of any
size takes fixed memory, several threads can feed it, and workers can add up
their histograms (``merge`` or an all-reduce of ``state()``).

``FleetMetrics`` is ``fleet.metrics``: Paddle's ``sum``, ``max``, ``min``,
``auc``, ``acc``, ``mae``, ``mse`` and ``rmse``, each reduced over every worker
through ``fleet.util.all_reduce`` (the workers' process group, formed with the
job's key), with Paddle's arguments and results.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any, Protocol

import numpy as np

__all__ = ["FleetMetrics", "StreamingAUC", "auc"]

logger = logging.getLogger("trainer.metrics")

#: How far past [0, 1] a score may lie and still count as the end it rounds
#: from (float32 sums of probabilities reach 1 + 2.4e-7); a logit lies further.
ROUNDING = 1e-6


def _as_numpy(values: Any) -> np.ndarray:
    if hasattr(values, "detach"):  # a torch tensor
        values = values.detach().cpu().numpy()
    return np.asarray(values).reshape(-1)


def _labels_and_scores(labels: Any, scores: Any) -> tuple[np.ndarray, np.ndarray]:
    """Boolean labels and float64 scores of the same length, without NaN."""
    positive = _labels(labels)
    score = _as_numpy(scores).astype(np.float64)
    if positive.shape != score.shape:
        raise ValueError(
            f"labels and scores must have the same number of values, found "
            f"{positive.size} labels and {score.size} scores"
        )
    if np.isnan(score).any():
        raise ValueError("scores contain NaN")
    return positive, score


def _labels(values: Any) -> np.ndarray:
    labels = _as_numpy(values)
    if labels.size and not np.isin(labels, (0, 1)).all():
        bad = labels[~np.isin(labels, (0, 1))][:5]
        raise ValueError(f"labels must be 0 or 1, found {bad.tolist()}")
    return labels.astype(bool)


def auc(labels: Any, scores: Any) -> float:
    """The exact AUC of ``scores`` against binary ``labels``.

    Args:
        labels: 0/1 values (numpy array, torch tensor or sequence; any shape).
        scores: higher means more likely positive; same number of values.

    Returns:
        The probability that a random positive scores above a random negative,
        ties counting one half.

    Raises:
        ValueError: on mismatched lengths, non-binary labels, NaN scores, or when
            only one class is present (the AUC is undefined).
    """
    positive, score = _labels_and_scores(labels, scores)
    n_pos = int(positive.sum())
    n_neg = positive.size - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError(
            f"AUC is undefined with {n_pos} positive and {n_neg} negative labels: "
            "both classes are needed"
        )
    order = np.argsort(score, kind="mergesort")
    sorted_scores = score[order]
    # Average 1-based rank of each run of tied scores.
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    average_rank = first + (counts + 1) / 2.0
    ranks = np.repeat(average_rank, counts)
    rank_sum = ranks[positive[order]].sum()
    return float((rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


class StreamingAUC:
    """AUC over any number of batches, in fixed memory (Paddle's bucketed ``auc``).

    Scores are probabilities in [0, 1] (others are refused, as Paddle's op
    refuses them: give ``torch.sigmoid(logits)``, not logits; a rounding of
    up to ``ROUNDING`` past either end is taken as the end). A score ``s``
    falls in bucket ``floor(s * num_thresholds)``, the product taken in the
    scores' own float type as Paddle's kernel takes it (float32 scores in
    float32), so every score lands in Paddle's bucket; scores in the same bucket
    count as ties. With the default 4095 thresholds the result is within about
    1e-3 of the exact AUC for well-spread scores.

    ``compute`` is the AUC of everything since the last ``reset``: Paddle's
    cumulative ``auc`` output, not its ``batch_auc`` (there is no sliding
    window: ``reset`` starts a new one).

    Thread-safe: ``update`` may be called from several threads.

    Args:
        num_thresholds: buckets minus one (Paddle's argument of the same name).
    """

    def __init__(self, num_thresholds: int = 4095) -> None:
        if not isinstance(num_thresholds, int) or num_thresholds < 1:
            raise ValueError(f"num_thresholds must be an int >= 1, got {num_thresholds!r}")
        self.num_thresholds = num_thresholds
        self._positive = np.zeros(num_thresholds + 1, dtype=np.int64)
        self._negative = np.zeros(num_thresholds + 1, dtype=np.int64)
        self._lock = threading.Lock()

    def update(self, labels: Any, scores: Any) -> None:
        """Adds a batch: 0/1 ``labels`` and probability ``scores`` of equal size.

        Raises:
            ValueError: on mismatched lengths, non-binary labels, NaN scores or
                scores outside [0, 1].
        """
        given = _as_numpy(scores)
        positive, score = _labels_and_scores(labels, given)
        # A float32 mixture of probabilities can round to 1.0000001: that is
        # no logit, and should not stop a run hours in.
        outside = (score < -ROUNDING) | (score > 1 + ROUNDING)
        if outside.any():
            raise ValueError(
                f"StreamingAUC.update: expected probabilities in [0, 1], found "
                f"{int(outside.sum())} of {score.size} scores outside, e.g. "
                f"{score[outside][:3].tolist()} (logits? give torch.sigmoid(logits))"
            )
        if given.dtype in (np.float32, np.float64):
            score = given  # Paddle's kernel multiplies in the scores' own type
        bucket = (score * score.dtype.type(self.num_thresholds)).astype(np.int64)
        # Within the rounding above, and where float32(num_thresholds) rounds up.
        np.clip(bucket, 0, self.num_thresholds, out=bucket)
        size = self.num_thresholds + 1
        pos = np.bincount(bucket[positive], minlength=size)
        neg = np.bincount(bucket[~positive], minlength=size)
        with self._lock:
            self._positive += pos
            self._negative += neg

    def state(self) -> np.ndarray:
        """The histograms as one int64 array ``[2, num_thresholds + 1]`` (positives,
        negatives): add these up across workers and ``load_state`` the sum."""
        with self._lock:
            return np.stack([self._positive, self._negative])

    def load_state(self, state: Any) -> None:
        """Replaces the histograms with ``state`` (as returned by ``state()``)."""
        array = _as_numpy(state).astype(np.int64).reshape(2, -1)
        if array.shape[1] != self.num_thresholds + 1:
            raise ValueError(
                f"state has {array.shape[1]} buckets, this metric has "
                f"{self.num_thresholds + 1}"
            )
        with self._lock:
            self._positive = array[0].copy()
            self._negative = array[1].copy()

    def merge(self, other: StreamingAUC) -> None:
        """Adds another metric's counts (same ``num_thresholds``) to this one."""
        self.load_state(self.state() + other.state())

    def reset(self) -> None:
        """Forgets every prediction seen so far."""
        with self._lock:
            self._positive[:] = 0
            self._negative[:] = 0

    @property
    def count(self) -> int:
        """Scores seen so far."""
        with self._lock:
            return int(self._positive.sum() + self._negative.sum())

    def compute(self) -> float:
        """The AUC of everything seen so far.

        Raises:
            ValueError: when only one class has been seen.
        """
        with self._lock:
            positive = self._positive.astype(np.float64)
            negative = self._negative.astype(np.float64)
        n_pos, n_neg = positive.sum(), negative.sum()
        if n_pos == 0 or n_neg == 0:
            raise ValueError(
                f"AUC is undefined with {int(n_pos)} positive and {int(n_neg)} "
                "negative labels: both classes are needed"
            )
        # Negatives below each bucket, plus half the negatives tied within it.
        below = np.cumsum(negative) - negative
        return float((positive * (below + negative / 2.0)).sum() / (n_pos * n_neg))

    def __repr__(self) -> str:
        return f"StreamingAUC(num_thresholds={self.num_thresholds}, count={self.count})"


class Reducer(Protocol):
    """What ``FleetMetrics`` reduces through: ``fleet.util`` (``UtilBase``)."""

    def all_reduce(self, input: Any, mode: str = "sum", comm_world: str = "worker") -> Any:
        """``input`` reduced over every worker by ``mode`` (sum, max or min)."""


class FleetMetrics:
    """Paddle's ``fleet.metrics``: metrics of the whole job, each worker giving
    its own statistics and every worker getting the same result.

    Each function is a collective: every worker calls it, in the same order.
    Inputs are numpy arrays, torch tensors, numbers or sequences (Paddle also
    takes a program variable or its name, read from a scope: here the values
    themselves are passed). ``util`` is the reducer (default ``fleet.util``).
    """

    def __init__(self, util: Reducer) -> None:
        self._util = util

    def _reduce(self, what: str, value: Any, mode: str, util: Reducer | None) -> np.ndarray:
        array = _statistic(what, value)
        reduced = (util or self._util).all_reduce(array.reshape(-1), mode)
        return _as_numpy(reduced).reshape(array.shape)

    def sum(self, input: Any, scope: Any = None, util: Reducer | None = None) -> np.ndarray:
        """``input`` summed over the workers, elementwise, in its shape."""
        _no_scope("sum", scope)
        return self._reduce("input", input, "sum", util)

    def max(self, input: Any, scope: Any = None, util: Reducer | None = None) -> np.ndarray:
        """The elementwise maximum of ``input`` over the workers."""
        _no_scope("max", scope)
        return self._reduce("input", input, "max", util)

    def min(self, input: Any, scope: Any = None, util: Reducer | None = None) -> np.ndarray:
        """The elementwise minimum of ``input`` over the workers."""
        _no_scope("min", scope)
        return self._reduce("input", input, "min", util)

    def auc(
        self, stat_pos: Any, stat_neg: Any = None, scope: Any = None,
        util: Reducer | None = None,
    ) -> float:
        """The AUC of every worker's predictions, from bucket statistics.

        ``stat_pos`` and ``stat_neg`` count the positives and negatives whose
        score fell in each bucket, lowest scores first (Paddle's ``auc`` op
        outputs, shape ``[1, buckets]`` or ``[buckets]``); or give a
        ``StreamingAUC`` alone. The counts are summed over the workers, then
        the area is taken bucket by bucket from the highest score down, a
        bucket's positives and negatives counting as ties (one half): the AUC
        of all workers' predictions with scores rounded to their buckets
        (``StreamingAUC``'s 4,096 buckets: within about 1e-3 of the exact AUC).
        As Paddle, 0.5 when no worker saw a positive or none a negative (logged).
        """
        _no_scope("auc", scope)
        if isinstance(stat_pos, StreamingAUC):
            if stat_neg is not None:
                raise TypeError("auc: give a StreamingAUC alone, or stat_pos and stat_neg")
            stat_pos, stat_neg = stat_pos.state()
        elif stat_neg is None:
            raise TypeError("auc needs stat_pos and stat_neg (or one StreamingAUC)")
        positive = self._reduce("stat_pos", stat_pos, "sum", util).astype(np.float64)
        negative = self._reduce("stat_neg", stat_neg, "sum", util).astype(np.float64)
        positive, negative = _bucket_row(positive, "stat_pos"), _bucket_row(negative, "stat_neg")
        if positive.shape != negative.shape:
            raise ValueError(
                f"auc: stat_pos has {positive.size} buckets and stat_neg {negative.size}; "
                "they must have the same"
            )
        if (positive < 0).any() or (negative < 0).any():
            raise ValueError("auc: bucket counts must not be negative")
        n_pos, n_neg = float(positive.sum()), float(negative.sum())
        if n_pos == 0 or n_neg == 0:
            logger.warning(
                "fleet.metrics.auc: %d positive and %d negative instances over all "
                "workers; the AUC is undefined, 0.5 returned (as Paddle)", n_pos, n_neg,
            )
            return 0.5
        below = np.cumsum(negative) - negative  # negatives in lower buckets
        return float((positive * (below + negative / 2.0)).sum() / (n_pos * n_neg))

    def acc(
        self, correct: Any, total: Any, scope: Any = None, util: Reducer | None = None
    ) -> float:
        """Correct instances over all instances, both summed over the workers."""
        _no_scope("acc", scope)
        return self._ratio("acc", "correct", correct, "total", total, util)

    def mae(
        self, abserr: Any, total_ins_num: Any, scope: Any = None, util: Reducer | None = None
    ) -> float:
        """Summed absolute error over the instance count, over all workers."""
        _no_scope("mae", scope)
        return self._ratio("mae", "abserr", abserr, "total_ins_num", total_ins_num, util)

    def mse(
        self, sqrerr: Any, total_ins_num: Any, scope: Any = None, util: Reducer | None = None
    ) -> float:
        """Summed squared error over the instance count, over all workers."""
        _no_scope("mse", scope)
        return self._ratio("mse", "sqrerr", sqrerr, "total_ins_num", total_ins_num, util)

    def rmse(
        self, sqrerr: Any, total_ins_num: Any, scope: Any = None, util: Reducer | None = None
    ) -> float:
        """The square root of ``mse``."""
        _no_scope("rmse", scope)
        return math.sqrt(
            self._ratio("rmse", "sqrerr", sqrerr, "total_ins_num", total_ins_num, util)
        )

    def _ratio(
        self, metric: str, top_name: str, top: Any, bottom_name: str, bottom: Any,
        util: Reducer | None,
    ) -> float:
        # Element 0 of each, as Paddle reads them (ctr_metric_bundle's outputs are [1]).
        numerator = float(self._reduce(top_name, top, "sum", util).reshape(-1)[0])
        denominator = float(self._reduce(bottom_name, bottom, "sum", util).reshape(-1)[0])
        if denominator == 0:  # Paddle's float division raises the same type
            raise ZeroDivisionError(
                f"{metric}: {bottom_name} summed over the workers is 0: no instance was counted"
            )
        return numerator / denominator


def _statistic(what: str, value: Any) -> np.ndarray:
    if isinstance(value, str) or type(value).__name__ == "Variable":
        raise TypeError(
            f"{what}: Paddle reads a program variable from its scope; fleetfeed has no "
            f"program: pass the values (a numpy array, tensor or number), got {value!r}"
        )
    array = np.asarray(value.detach().cpu().numpy() if hasattr(value, "detach") else value)
    if array.dtype == object or not (
        np.issubdtype(array.dtype, np.number) or array.dtype == bool
    ):
        raise TypeError(f"{what}: expected numbers, got an array of {array.dtype}")
    if array.size == 0:
        raise ValueError(f"{what}: expected at least one value, got an empty array")
    # Reduced as int64 or float64 (a copy): gloo reduces no unsigned type, and
    # its sum of booleans is a logical or.
    if np.issubdtype(array.dtype, np.floating):
        return array.astype(np.float64)
    if array.dtype.kind == "u" and array.size and int(array.max()) >= 1 << 63:
        raise ValueError(f"{what}: a count of {int(array.max())} does not fit an int64")
    return array.astype(np.int64)


def _bucket_row(counts: np.ndarray, what: str) -> np.ndarray:
    """The bucket counts of Paddle's ``[1, buckets]`` statistics, or of ``[buckets]``."""
    if counts.ndim == 1:
        return counts
    if counts.ndim == 2 and counts.shape[0] == 1:
        return counts[0]
    raise ValueError(f"auc: {what} must have shape [buckets] or [1, buckets], got {counts.shape}")


def _no_scope(metric: str, scope: Any) -> None:
    if scope is not None:
        raise TypeError(
            f"fleet.metrics.{metric}: scope is Paddle's place for program variables; "
            "fleetfeed takes the values themselves: leave scope out"
        )
