"""Type stub of the compiled MultiSlot parser (datafeed/parse/_parse.pyx)."""

from typing import Any

import numpy as np

from .slots import Slot

# Keys of ``Engine.skipped_reasons``, indexed by the loop's status codes.
REASONS: tuple[str, ...]

class Engine:
    """Parser state for one stream; use it through ``datafeed.parse.parsing.ChunkParser``."""

    def __init__(
        self,
        schema: tuple[Slot, ...],
        source: str,
        skip_bad_lines: bool,
        max_line_bytes: int,
        max_messages: int,
    ) -> None: ...
    @property
    def lines(self) -> int: ...
    @property
    def records(self) -> int: ...
    @property
    def skipped_lines(self) -> int: ...
    @property
    def pending_rows(self) -> int: ...
    @property
    def skipped_reasons(self) -> dict[str, int]: ...
    @property
    def bad_line_messages(self) -> list[str]: ...
    def feed(self, data: Any, final: bool = False) -> int: ...
    def take(
        self,
    ) -> tuple[int, list[tuple[np.ndarray, np.ndarray | None, int]]] | None: ...
