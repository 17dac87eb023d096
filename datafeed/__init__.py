"""datafeed: the engine behind fleetfeed's datasets.

Pipe commands turn input files into MultiSlot text; a Cython parser turns the
text into column chunks; ``InMemoryDataset`` keeps them in memory and shuffles
them, ``QueueDataset`` streams them; both hand out ``Batch`` objects of torch
tensors. ``import datafeed`` does not import torch (the batch stage does, on use).
"""

from .config.errors import (
    AccountingError,
    CacheError,
    DatafeedError,
    GlobalShuffleError,
    ParseError,
    ReaderError,
    SchemaError,
    StateError,
)
from .config.slots import Slot, SlotSchema
from .config.spec import format_slots, parse_slots
from .datasets.dataset_base import DatasetBase
from .datasets.factory import DatasetFactory
from .datasets.inmemory import InMemoryDataset
from .datasets.queue_dataset import QueueDataset
from .iterate.batch import Batch, Ragged
from .records.stats import FileStats, LoadStats
from .source.fs import list_files

__all__ = [
    "AccountingError",
    "Batch",
    "CacheError",
    "DatafeedError",
    "DatasetBase",
    "DatasetFactory",
    "FileStats",
    "GlobalShuffleError",
    "InMemoryDataset",
    "LoadStats",
    "ParseError",
    "QueueDataset",
    "Ragged",
    "ReaderError",
    "SchemaError",
    "Slot",
    "SlotSchema",
    "StateError",
    "format_slots",
    "list_files",
    "parse_slots",
]
