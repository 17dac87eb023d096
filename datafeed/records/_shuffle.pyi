from typing import Any

import numpy as np

def gather_fixed(
    sources: list[np.ndarray],
    record_bytes: int,
    chunk_of: np.ndarray,
    row_of: np.ndarray,
    out: np.ndarray,
) -> None: ...
def gather_ragged(
    sources: list[np.ndarray],
    source_offsets: list[np.ndarray],
    offset_bytes: np.ndarray,
    widths: np.ndarray,
    item_bytes: int,
    chunk_of: np.ndarray,
    row_of: np.ndarray,
    out_offsets: np.ndarray,
    out: np.ndarray,
) -> None: ...

class RowGather:
    def __init__(self, chunks: list[Any], column_count: int) -> None: ...
    @property
    def rows(self) -> int: ...
    @property
    def column_count(self) -> int: ...
    def gather(
        self, rows: np.ndarray, first_column: int = 0, stop_column: int = -1
    ) -> list[tuple[np.ndarray, np.ndarray | None, int]]: ...

class GatherAhead:
    def __init__(self, source: RowGather, threads: int) -> None: ...
    def submit(self, rows: np.ndarray) -> None: ...
    def result(self) -> list[tuple[np.ndarray, np.ndarray | None, int]]: ...
    def close(self) -> None: ...

def gather_threads_running() -> int: ...
