"""Base classes for ``reader.py`` generator scripts (Paddle Fleet's data generators).

A generator script turns each line of its stdin into samples and writes them
to stdout as MultiSlot text, byte-identical to Paddle's. This package is
imported once per input file by every generator process, so it imports
nothing heavy: no torch, numpy or pyarrow.
"""

from generators._format import SampleError
from generators.data_generator import (
    DataGenerator,
    MultiSlotDataGenerator,
    MultiSlotStringDataGenerator,
)

__all__ = [
    "DataGenerator",
    "MultiSlotDataGenerator",
    "MultiSlotStringDataGenerator",
    "SampleError",
]
