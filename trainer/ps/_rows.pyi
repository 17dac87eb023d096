import numpy as np

ROW_STATS_DTYPE: np.dtype

class IdIndex:
    size: int
    def __init__(self, capacity: int = ...) -> None: ...
    @property
    def capacity(self) -> int: ...
    def lookup(self, ids: np.ndarray) -> np.ndarray: ...
    def lookup_or_insert(self, ids: np.ndarray) -> np.ndarray: ...
    def insert_new(self, ids: np.ndarray) -> np.ndarray: ...
    def ids_in_row_order(self) -> np.ndarray: ...
    def rebuild(self, ids: np.ndarray) -> None: ...

def unique_inverse(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...
def adagrad_rows(
    weights: np.ndarray,
    state_sum: np.ndarray,
    rows: np.ndarray,
    grads: np.ndarray,
    lr: float,
    eps: float,
    weight_decay: float,
    records: np.ndarray | None = ...,
) -> None: ...
def sgd_rows(
    weights: np.ndarray,
    rows: np.ndarray,
    grads: np.ndarray,
    lr: float,
    weight_decay: float,
    records: np.ndarray | None = ...,
) -> None: ...
def pull_rows(
    index: IdIndex,
    ids: np.ndarray,
    weights: np.ndarray,
    out: np.ndarray | None,
    records: np.ndarray | None,
    tick: int,
) -> tuple[np.ndarray, int]: ...
def touch_rows(records: np.ndarray, rows: np.ndarray, tick: int) -> None: ...
def add_clicks_rows(records: np.ndarray, rows: np.ndarray, clicks: np.ndarray) -> None: ...
