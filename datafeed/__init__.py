"""datafeed: the engine behind fleetfeed's datasets.

Pipe commands turn input files into MultiSlot text; a Cython parser turns the
text into column chunks; ``InMemoryDataset`` keeps them in memory and shuffles
them, ``QueueDataset`` streams them; both hand out ``Batch`` objects of torch
tensors. ``import datafeed`` does not import torch (the batch stage does, on use).
"""

from .batch import Batch, Ragged
from .dataset import DatasetBase, DatasetFactory, InMemoryDataset, QueueDataset
from .errors import (
    AccountingError,
    CacheError,
    DatafeedError,
    GlobalShuffleError,
    ParseError,
    ReaderError,
    SchemaError,
    StateError,
)
from .fs import list_files
from .slots import Slot, SlotSchema
from .spec import format_slots, parse_slots
from .stats import FileStats, LoadStats

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
