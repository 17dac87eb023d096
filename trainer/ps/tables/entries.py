"""Admission and eviction rules of a sparse table, with Paddle's names.

Admission (``SparseEmbedding(..., entry=...)``, Paddle's ``paddle.distributed``
entries): an id gets a trained row only once its entry admits it.

* ``CountFilterEntry(count_filter)``: once the id was seen in ``count_filter``
  training pulls (0 and 1: at once);
* ``ProbabilityEntry(probability)``: at each training pull of an id not yet
  admitted, with probability ``probability``; the draw is a hash of (the
  table's seed, the id, how many times it was seen), so a job that sees the
  same ids in the same order admits the same ones;
* ``ShowClickEntry(show_name, click_name)``: every id, at once; it names the
  batch's show and click slots (Paddle feeds its accessor from them; here the
  forward is given the click slot: ``emb(x, click=batch[entry.click_name])``).

Until admitted an id reads as a zero vector (training and evaluation alike),
and the gradients pushed for it are dropped, not stored, as in Paddle; the
table keeps only its sighting count (``rowstats.PendingIds``), not a row.

Eviction (``CtrAccessorParam``, the fields of Paddle's ``ctr_accessor_param``
that ``CtrCommonAccessor::Shrink`` reads): ``fleet.shrink()`` first decays every
row's show and click by ``show_click_decay_rate``, then drops the rows whose
score ``(show - click) * nonclk_coeff + click * click_coeff`` is below
``delete_threshold`` or that were unseen for more than
``delete_after_unseen_days`` passes. The defaults are the_one_ps's when the
strategy sets none: 30 passes, decay 1, threshold 0 (so by default only unseen
rows go).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np

from .ids import mix64

__all__ = [
    "CountFilterEntry",
    "CtrAccessorParam",
    "EntryAttr",
    "ProbabilityEntry",
    "ShowClickEntry",
    "entry_from_attr",
]

_U64 = np.uint64


class EntryAttr:
    """The admission rule of a table (Paddle's ``paddle.distributed.EntryAttr``)."""

    name: ClassVar[str] = ""

    def _to_attr(self) -> str:
        """Paddle's string for the rule, e.g. ``"count_filter_entry:5"``."""
        raise NotImplementedError

    def admits(self, ids: np.ndarray, sightings: np.ndarray, seed: np.uint64) -> np.ndarray:
        """Which of ``ids`` (uint64, not admitted yet) are admitted now, given
        how many training pulls saw each one, this one included."""
        raise NotImplementedError


@dataclass(frozen=True)
class CountFilterEntry(EntryAttr):
    """Admits an id once ``count_filter`` training pulls saw it.

    Raises:
        ValueError: ``count_filter`` is not an int >= 0 (Paddle's check).
    """

    count_filter: int
    name: ClassVar[str] = "count_filter_entry"

    def __post_init__(self) -> None:
        if not isinstance(self.count_filter, int) or isinstance(self.count_filter, bool):
            raise ValueError(
                f"CountFilterEntry: count_filter must be an int >= 0, got {self.count_filter!r}"
            )
        if self.count_filter < 0:
            raise ValueError(
                f"CountFilterEntry: count_filter must be >= 0, got {self.count_filter}"
            )

    def _to_attr(self) -> str:
        return f"{self.name}:{self.count_filter}"

    def admits(self, ids: np.ndarray, sightings: np.ndarray, seed: np.uint64) -> np.ndarray:
        """Ids seen at least ``count_filter`` times."""
        return sightings >= self.count_filter


@dataclass(frozen=True)
class ProbabilityEntry(EntryAttr):
    """Admits an id at each training pull with probability ``probability``.

    Raises:
        ValueError: ``probability`` is not a float in (0, 1) (Paddle's check).
    """

    probability: float
    name: ClassVar[str] = "probability_entry"

    def __post_init__(self) -> None:
        p = self.probability
        if not isinstance(p, float) or not 0.0 < p < 1.0:
            raise ValueError(f"ProbabilityEntry: probability must be a float in (0, 1), got {p!r}")

    def _to_attr(self) -> str:
        return f"{self.name}:{self.probability}"

    def admits(self, ids: np.ndarray, sightings: np.ndarray, seed: np.uint64) -> np.ndarray:
        """A draw per (seed, id, sighting): deterministic for a given order of pulls."""
        nth = mix64(sightings.astype(np.int64).view(_U64) + _U64(0x632BE59BD9B4E019))
        bits = mix64(mix64(ids ^ seed) ^ nth)
        unit = (bits >> _U64(11)).astype(np.float64) * (1.0 / (1 << 53))
        return unit < self.probability


@dataclass(frozen=True)
class ShowClickEntry(EntryAttr):
    """Admits every id; names the show and click slots of a batch.

    Raises:
        ValueError: a name is not a str (Paddle's check).
    """

    show_name: str
    click_name: str
    name: ClassVar[str] = "show_click_entry"

    def __post_init__(self) -> None:
        if not isinstance(self.show_name, str) or not isinstance(self.click_name, str):
            raise ValueError(
                f"ShowClickEntry: show_name and click_name must be str, got "
                f"{self.show_name!r}, {self.click_name!r}"
            )

    def _to_attr(self) -> str:
        return f"{self.name}:{self.show_name}:{self.click_name}"

    def admits(self, ids: np.ndarray, sightings: np.ndarray, seed: np.uint64) -> np.ndarray:
        """Every id."""
        return np.ones(ids.shape[0], dtype=bool)


def entry_from_attr(text: str | None) -> EntryAttr | None:
    """The entry that Paddle's string ``text`` (``EntryAttr._to_attr``) names.

    Raises:
        ValueError: ``text`` names no entry this module has.
    """
    if text is None:
        return None
    name, _, rest = str(text).partition(":")
    try:
        if name == CountFilterEntry.name:
            return CountFilterEntry(int(rest))
        if name == ProbabilityEntry.name:
            return ProbabilityEntry(float(rest))
        if name == ShowClickEntry.name:
            show, sep, click = rest.partition(":")
            if sep:
                return ShowClickEntry(show, click)
    except ValueError as error:
        raise ValueError(f"entry {text!r:.80}: {error}") from None
    raise ValueError(
        f"expected an entry such as 'count_filter_entry:5', 'probability_entry:0.1' or "
        f"'show_click_entry:show:click', found {text!r:.80}"
    )


@dataclass(frozen=True)
class CtrAccessorParam:
    """When ``fleet.shrink()`` drops a row (Paddle's ``ctr_accessor_param``).

    Attributes:
        delete_after_unseen_days: drop rows unseen for more than this many
            passes (``fleet.set_pass``; a pass is a day in Paddle's jobs).
        delete_threshold: drop rows whose decayed score is below this.
        show_click_decay_rate: each shrink first multiplies show and click by it.
        nonclk_coeff, click_coeff: the score is
            ``(show - click) * nonclk_coeff + click * click_coeff``.

    Raises:
        ValueError: a value out of range.
    """

    delete_after_unseen_days: int = 30
    delete_threshold: float = 0.0
    show_click_decay_rate: float = 1.0
    nonclk_coeff: float = 0.1
    click_coeff: float = 1.0

    def __post_init__(self) -> None:
        days = self.delete_after_unseen_days
        if not isinstance(days, int) or isinstance(days, bool) or days < 0:
            raise ValueError(
                f"CtrAccessorParam: delete_after_unseen_days must be an int >= 0, got {days!r}"
            )
        for key in ("delete_threshold", "show_click_decay_rate", "nonclk_coeff", "click_coeff"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
                value
            ):
                raise ValueError(f"CtrAccessorParam: {key} must be a finite number, got {value!r}")
            object.__setattr__(self, key, float(value))
        if not 0.0 <= self.show_click_decay_rate <= 1.0:
            raise ValueError(
                f"CtrAccessorParam: show_click_decay_rate must be in [0, 1], "
                f"got {self.show_click_decay_rate}"
            )

    def score(self, show: np.ndarray, click: np.ndarray) -> np.ndarray:
        """Paddle's show/click score of each row."""
        return (show - click) * np.float32(self.nonclk_coeff) + click * np.float32(
            self.click_coeff
        )

    def decay_and_drop(
        self, show: np.ndarray, click: np.ndarray, unseen: np.ndarray
    ) -> np.ndarray:
        """Decays ``show`` and ``click`` in place; returns which rows to drop."""
        if self.show_click_decay_rate != 1.0:
            show *= np.float32(self.show_click_decay_rate)
            click *= np.float32(self.show_click_decay_rate)
        drop = unseen > self.delete_after_unseen_days
        # Always tested, as Paddle's shrink does: with a negative coefficient a
        # score falls below a threshold of 0.
        drop |= self.score(show, click) < np.float32(self.delete_threshold)
        return drop

    def as_dict(self) -> dict[str, Any]:
        """The settings as plain JSON values."""
        return asdict(self)
