import numpy as np

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
def pool_rows(
    rows: np.ndarray, inverse: np.ndarray, offsets: np.ndarray | None, mean: bool
) -> np.ndarray | None: ...
def unpool_rows(
    grad: np.ndarray, inverse: np.ndarray, offsets: np.ndarray | None, mean: bool, count: int
) -> np.ndarray: ...
def push_pooled(
    weights: np.ndarray,
    state_sum: np.ndarray | None,
    rows: np.ndarray,
    grad: np.ndarray,
    positions: np.ndarray,
    offsets: np.ndarray | None,
    mean: bool,
    lr: float,
    eps: float,
    weight_decay: float,
    records: np.ndarray,
) -> None: ...
def add_scaled_rows(
    weights: np.ndarray,
    rows: np.ndarray,
    deltas: np.ndarray,
    scale: float,
    out: np.ndarray,
    records: np.ndarray,
) -> int: ...
def take_changes(weights: np.ndarray, base: np.ndarray, rows: np.ndarray) -> np.ndarray: ...
def merge_rows(
    weights: np.ndarray,
    base: np.ndarray,
    rows: np.ndarray,
    merged: np.ndarray,
    records: np.ndarray,
) -> None: ...
