"""Type stubs for the compiled sample-to-column builder (datafeed/parse/samples.pyx)."""

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

class ColumnBuilder:
    """Appends generator samples to per-slot buffers, handed out as columns."""

    @property
    def rows(self) -> int: ...
    def __init__(self, schema: tuple[Any, ...]) -> None: ...
    def set_names(self, names: Iterable[str]) -> None: ...
    def add(self, sample: Any) -> bool: ...
    def add_columns(self, rows: int, columns: Sequence[Any]) -> None: ...
    def take(
        self,
    ) -> tuple[int, list[tuple[np.ndarray, np.ndarray | None, int]]] | None: ...

def run_samples(
    lines: Iterable[Any],
    generate_sample: Callable[[Any], Callable[[], Iterable[Any]]],
    builder: ColumnBuilder,
    slow: Callable[[Any, int], None],
    flush: Callable[[], None],
    chunk_rows: int,
    where: str,
) -> tuple[int, int]: ...
