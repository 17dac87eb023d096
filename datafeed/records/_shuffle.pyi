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
