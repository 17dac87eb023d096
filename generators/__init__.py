"""Base classes for ``reader.py`` generator scripts (Paddle Fleet's data generators).

A generator script turns each line of its stdin into samples and writes them
to stdout as MultiSlot text, byte-identical to Paddle's. This package is
imported once per input file by every generator process, so it imports
nothing heavy: no torch, numpy or pyarrow.

``SampleFormatter`` is the compiled formatter behind the MultiSlot classes,
for code that checks and formats samples itself (datafeed's in-process path).
"""

from ._format import SampleFormatter
from ._sample_checks import SampleError
from .data_generator import DataGenerator, MultiSlotDataGenerator, MultiSlotStringDataGenerator

__all__ = [
    "DataGenerator",
    "MultiSlotDataGenerator",
    "MultiSlotStringDataGenerator",
    "SampleError",
    "SampleFormatter",
]
