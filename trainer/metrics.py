"""Area under the ROC curve: exact (rank-based) and streaming (bucketed).

``auc(labels, scores)`` is the exact value, the Mann-Whitney statistic with tied
scores given their average rank (so a tie between a positive and a negative
counts one half). ``StreamingAUC`` keeps two histograms of scores, as Paddle's
``auc`` op does (``num_thresholds`` buckets over [0, 1]), so an evaluation of any
size takes fixed memory, several threads can feed it, and workers can add up
their histograms (``merge`` or an all-reduce of ``state()``).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

__all__ = ["StreamingAUC", "auc"]


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

    Scores are probabilities: a score ``s`` falls in bucket
    ``floor(s * num_thresholds)`` (values outside [0, 1] are clipped), and scores
    in the same bucket count as ties. With the default 4095 thresholds the result
    is within about 1e-3 of the exact AUC for well-spread scores.

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
            ValueError: on mismatched lengths, non-binary labels or NaN scores.
        """
        positive, score = _labels_and_scores(labels, scores)
        bucket = np.clip(score * self.num_thresholds, 0, self.num_thresholds).astype(np.int64)
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
