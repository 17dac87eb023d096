"""The user-facing datasets: ``InMemoryDataset``, ``QueueDataset``, ``DatasetFactory``.

They keep Paddle's method names and meanings (see DESIGN.md for where fleetfeed
differs on purpose: errors instead of silent loss, seeded shuffles, strict settings).
Each kind lives in its own module: ``DatasetBase`` (settings, files, readers) in
datafeed/datasets/dataset_base.py, ``InMemoryDataset`` in datafeed/datasets/inmemory.py,
``QueueDataset`` in datafeed/datasets/queue_dataset.py; both batch through
datafeed/iterate/batcher.py and keep their position in datafeed/iterate/position.py.
"""

from __future__ import annotations

from typing import ClassVar

from .dataset_base import DatasetBase
from .inmemory import InMemoryDataset
from .queue_dataset import QUEUE_STATE_VERSION, QueueDataset

__all__ = [
    "QUEUE_STATE_VERSION",
    "DatasetBase",
    "DatasetFactory",
    "InMemoryDataset",
    "QueueDataset",
]


# Paddle's other dataset kinds, which need its C++ feeds.
_ONLY_IN_PADDLE = {
    "FileInstantDataset": "reads Paddle's binary instant-feed files (GPU builds of Paddle only)",
    "BoxPSDataset": "needs Paddle's BoxPS",
}


class DatasetFactory:
    """Paddle's factory: ``DatasetFactory().create_dataset("InMemoryDataset")``."""

    _classes: ClassVar[dict[str, type[DatasetBase]]] = {
        "InMemoryDataset": InMemoryDataset,
        "QueueDataset": QueueDataset,
    }

    def create_dataset(self, datafeed_class: str = "QueueDataset") -> DatasetBase:
        """A new ``InMemoryDataset`` or ``QueueDataset``, by class name (``ValueError``
        for another; ``NotImplementedError`` for Paddle's C++-only kinds)."""
        if datafeed_class in _ONLY_IN_PADDLE:
            raise NotImplementedError(
                f"{datafeed_class} {_ONLY_IN_PADDLE[datafeed_class]}; use InMemoryDataset "
                "or QueueDataset"
            )
        try:
            return self._classes[datafeed_class]()
        except KeyError:
            raise ValueError(
                f"datafeed class {datafeed_class!r} does not exist; "
                f"choose one of {', '.join(sorted(self._classes))}"
            ) from None
