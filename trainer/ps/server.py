"""A parameter server: its shard of every sparse table, its dense parameters,
and the handlers workers call (over ``trainer.ps.transport``).

Sparse rows are sharded by a hash of the id (``table.shard_of``), dense
parameters by size (``placement.dense_owners``, from the shapes every process
knows). The handlers are
module-level functions named by the operations of ``trainer.ps.wire`` (workers
name the function, the transport sends the name); each works on the process's
one ``ParameterServer``. Who may call them is settled before: the transport
admits only peers that proved the job key.

Modes:
  async  a push is applied when it arrives;
  sync   pushes wait until every active worker pushed its step (but one
         waiting at the barrier: out of batches first); the averaged
         gradients are applied once and every push returns the new values;
  geo    workers push deltas of their local rows/params every k steps; the server
         adds delta / worker_num (Paddle's GEO-SGD) and returns the new values.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch

from ..embedding.ahead import MAX_DEPTH
from ..job.errors import CheckpointError
from . import lifecycle
from .checkpoint import directory as checkpoint
from .checkpoint import table_files
from .checkpoint.confined import checkpoint_root, confined_directory
from .placement import dense_owners
from .tables.ids import first_not_owned
from .tables.step_rows import PulledRows, pull_numbered, push_numbered
from .tables.table import SparseTable, as_u64, shard_of

log = logging.getLogger(__name__)

SparsePart = Mapping[str, tuple[torch.Tensor, torch.Tensor]]  # table -> (ids int64, values)
DensePart = Mapping[int, torch.Tensor]  # dense index -> values
# Training pulls remembered per (worker, table) for the push of their
# gradients: an async worker sends pulls up to MAX_DEPTH batches ahead of
# the push (trainer/embedding/ahead.py), and its next pull may overtake the
# push (the handler pool runs both at once).
_PULLS_KEPT = MAX_DEPTH + 2


class ParameterServer:
    """Server ``index`` of ``server_num``: the state behind the handlers."""

    def __init__(
        self,
        index: int,
        server_num: int,
        worker_num: int,
        mode: str,
        tables: Mapping[str, SparseTable],
        dense: Sequence[torch.Tensor],
        dense_optimizer: torch.optim.Optimizer | None,
    ) -> None:
        self.index = index
        self.server_num = server_num
        self.worker_num = worker_num
        self.mode = mode
        self.tables = dict(tables)
        self.dense = list(dense)
        owners = dense_owners([p.shape for p in self.dense], server_num)
        self.owned = [i for i, owner in enumerate(owners) if owner == index]
        self._owned_set = frozenset(self.owned)
        self.dense_optimizer = dense_optimizer
        # Where a save or a load that a message names must lie (read once: the
        # working directory may change later).
        self.checkpoint_root = checkpoint_root()
        self._dense_lock = threading.Lock()
        self._lock = threading.Lock()
        self._active = set(range(worker_num))
        self.all_done = threading.Event()
        if worker_num == 0:
            self.all_done.set()
        self._round: list[tuple[int, SparsePart, DensePart, Future]] = []
        self._barrier: dict[int, Future] = {}
        self._stopped: list[Future] = []  # worker_done calls waiting for the others
        self._pulled: dict[tuple[int, str], list[PulledRows]] = {}
        self._pulled_lock = threading.Lock()
        self._checkpoint = checkpoint.CheckpointState()
        self._loads = 0  # checkpoints loaded: the other workers see worker 0's load land

    # -- description -----------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "server_num": self.server_num,
            "worker_num": self.worker_num,
            "mode": self.mode,
            "tables": {n: [t.dim, t.optimizer.kind] for n, t in sorted(self.tables.items())},
            "dense": [list(p.shape) for p in self.dense],
            "checkpoint_state": self._checkpoint.state,
            "loads": self._loads,
        }

    def check_worker(self, worker: int) -> int:
        """``worker`` if it is one of this job's worker indices.

        Raises:
            ValueError: it is not (a peer of another job, or a bad index).
        """
        if not 0 <= worker < self.worker_num:
            raise ValueError(
                f"server {self.index}: expected a worker index in [0, {self.worker_num}), "
                f"found {worker}"
            )
        return worker

    def check_ids(self, ids: np.ndarray, what: str) -> None:
        """Refuses ids this server does not own (``ids.shard_of``): their rows
        would live beside the owner's, and a load of the checkpoint would keep
        one of the two, so the model would change without a word.

        Raises:
            ValueError: naming the first such id and its server; nothing was applied.
        """
        foreign = first_not_owned(ids, self.server_num, self.index)
        if foreign >= 0:
            bad = ids[foreign : foreign + 1]
            raise ValueError(
                f"server {self.index} of {self.server_num}: {what}: expected ids this server "
                f"owns, found id {int(bad[0])}, which server "
                f"{int(shard_of(bad, self.server_num)[0])} owns (is the sender's server list "
                "this job's, in this order?)"
            )

    def check_gradients(self, sparse: SparsePart, dense: DensePart, what: str) -> None:
        """Refuses a push that would corrupt the model rather than apply it: a
        dense index this server does not own (-1 would reach the last
        parameter), values that do not fit the parameter or the table's rows,
        and values that are not finite (a diverged or hostile worker).

        Raises:
            ValueError: naming the part at fault; nothing was applied.
        """
        where = f"server {self.index}: {what}"
        for i, values in dense.items():
            if isinstance(i, bool) or not isinstance(i, int) or i not in self._owned_set:
                raise ValueError(
                    f"{where}: expected dense indices among this server's {self.owned}, found {i!r}"
                )
            if values.numel() != self.dense[i].numel():
                raise ValueError(
                    f"{where}: dense parameter {i} has {self.dense[i].numel()} values, "
                    f"found {values.numel()}"
                )
            # As stored: a finite float64 may not be a finite float32.
            stored = self.dense[i].dtype
            _require_finite(values if values.dtype == stored else values.to(stored),
                            f"{where}: dense parameter {i}")
        for name, (ids, values) in sparse.items():
            table = self.table(name)
            self.check_ids(as_u64(ids), f"{where}: table {name!r}")
            if values.dim() != 2 or values.shape != (ids.shape[0], table.dim):
                raise ValueError(
                    f"{where}: table {name!r} expected values of shape ({ids.shape[0]}, "
                    f"{table.dim}), found {tuple(values.shape)}"
                )
            _require_finite(values if values.dtype == torch.float32 else values.to(
                torch.float32), f"{where}: table {name!r}")

    def table(self, name: str) -> SparseTable:
        table = self.tables.get(name)
        if table is None:
            raise KeyError(
                f"server {self.index} has no sparse table {name!r}; it has "
                f"{sorted(self.tables)} (does every role build the same model?)"
            )
        return table

    # -- dense -------------------------------------------------------------------

    def dense_values(self) -> dict[int, torch.Tensor]:
        with self._dense_lock:
            return {i: self.dense[i].detach().clone() for i in self.owned}

    def apply_dense(self, grads: DensePart) -> None:
        if not grads:
            return
        if self.dense_optimizer is None:
            raise ValueError("server has dense gradients but no optimizer")
        with self._dense_lock:
            for i, grad in grads.items():
                self.dense[i].grad = grad.to(self.dense[i].dtype).view_as(self.dense[i])
            self.dense_optimizer.step()
            for i in grads:
                self.dense[i].grad = None

    def add_dense(self, deltas: DensePart, scale: float) -> None:
        """Adds ``deltas * scale`` to the dense values this server owns, all or
        none: a sum that would not be finite (finite deltas can overflow)
        raises ValueError and changes nothing."""
        if not deltas:
            return
        params = [self.dense[i] for i in deltas]
        with self._dense_lock, torch.no_grad():
            sums = [param.add(delta.view_as(param), alpha=scale)
                    for param, delta in zip(params, deltas.values(), strict=True)]
            if not _all_finite(sums):
                bad = next(i for i, value in zip(deltas, sums, strict=True)
                           if not bool(value.isfinite().all()))
                raise ValueError(
                    f"server {self.index}: GEO push: dense parameter {bad} plus its delta "
                    "would not be finite; nothing was added")
            torch._foreach_copy_(params, sums)

    # -- pushes ------------------------------------------------------------------

    def pull_step(
        self, worker: int, names: Sequence[str], ids: torch.Tensor
    ) -> list[torch.Tensor]:
        """A training pull of worker ``worker``: the rows of the same distinct
        ``ids`` in each table of ``names``, remembering the row numbers found
        for the push of their gradients (``step_rows``)."""
        self.check_worker(worker)
        u64 = as_u64(ids)
        self.check_ids(u64, f"worker {worker}'s pull")
        out = []
        for name in names:
            rows, pulled = pull_numbered(self.table(name), u64)
            with self._pulled_lock:
                recent = self._pulled.setdefault((worker, name), [])
                recent.append(pulled)
                del recent[:-_PULLS_KEPT]
            out.append(rows)
        return out

    def _pulled_rows(self, worker: int, name: str, ids: np.ndarray) -> PulledRows | None:
        """The remembered pull of ``ids`` by ``worker`` from table ``name``,
        taken (a pull's gradients are pushed once), or None."""
        with self._pulled_lock:
            recent = self._pulled.get((worker, name))
            for i, pulled in enumerate(recent or ()):
                if pulled.matches(ids):
                    del recent[i]
                    return pulled
        return None

    def push(
        self, sparse: SparsePart, dense: DensePart, worker: int | None = None
    ) -> dict[int, torch.Tensor]:
        """Applies gradients (async); rows that ``worker``'s ``pull_step``
        found are updated at the row numbers it found. Returns the dense values."""
        self.check_gradients(sparse, dense, "push")
        for name, (ids, grads) in sparse.items():
            table = self.table(name)
            u64 = as_u64(ids)
            pulled = None if worker is None else self._pulled_rows(worker, name, u64)
            if pulled is None:
                table.push(u64, grads)
            else:
                push_numbered(table, grads, pulled)
        self.apply_dense(dense)
        return self.dense_values()

    def push_sync(self, worker: int, sparse: SparsePart, dense: DensePart) -> Future:
        future: Future = Future()
        self.check_worker(worker)
        self.check_gradients(sparse, dense, f"worker {worker}'s synchronous push")
        with self._lock:
            if any(w == worker for w, *_ in self._round):
                future.set_exception(
                    ValueError(f"worker {worker} pushed twice in one synchronous step")
                )
                return future
            self._round.append((worker, sparse, dense, future))
            ready = self._take_round_if_complete()
        if ready:
            self._apply_round(ready)
        return future

    def _take_round_if_complete(self) -> list:
        # Caller holds self._lock. A worker waiting at the barrier (it ran out
        # of batches first: workers seldom hold the same number) has no push
        # to come before it: the round completes without it, averaged over
        # the workers that pushed, as once it stops.
        pushed = {worker for worker, *_ in self._round}
        if self._round and pushed >= self._active - self._barrier.keys():
            ready, self._round = self._round, []
            return ready
        return []

    def _apply_round(self, ready: list) -> None:
        n = len(ready)
        try:
            merged_sparse: dict[str, tuple[list, list]] = {}
            merged_dense: dict[int, torch.Tensor] = {}
            for _, sparse, dense, _ in ready:
                for name, (ids, grads) in sparse.items():
                    parts = merged_sparse.setdefault(name, ([], []))
                    parts[0].append(ids)
                    parts[1].append(grads)
                for i, grad in dense.items():
                    merged_dense[i] = merged_dense[i] + grad if i in merged_dense else grad.clone()
            for name, (id_parts, grad_parts) in merged_sparse.items():
                ids, inverse = torch.unique(torch.cat(id_parts), return_inverse=True)
                grads = torch.cat(grad_parts)
                total = torch.zeros(ids.shape[0], grads.shape[1], dtype=torch.float32)
                total.index_add_(0, inverse, grads.to(torch.float32))
                self.table(name).push(ids, total / n)
            self.apply_dense({i: g / n for i, g in merged_dense.items()})
            values = self.dense_values()
        except Exception as err:  # noqa: BLE001 - handed to every waiting worker
            for *_, future in ready:
                future.set_exception(err)
            return
        for *_, future in ready:
            future.set_result(values)

    def geo_push(
        self, sparse: SparsePart, dense: DensePart
    ) -> tuple[dict[str, torch.Tensor], dict[int, torch.Tensor]]:
        """Adds a worker's changes, each scaled by 1/worker_num; returns the rows
        and dense values after them. Refused values (``check_gradients``) change
        nothing; a sum that would overflow is refused for its dense values or
        its table, before either changes."""
        self.check_gradients(sparse, dense, "GEO push")
        scale = 1.0 / max(1, self.worker_num)
        self.add_dense(dense, scale)
        rows = {
            name: self.table(name).add(ids, deltas, scale)
            for name, (ids, deltas) in sparse.items()
        }
        return rows, self.dense_values()

    # -- membership -------------------------------------------------------------

    def worker_done(self, worker: int) -> Future:
        """Worker ``worker`` stopped; the future completes once every worker has."""
        future: Future = Future()
        self.check_worker(worker)
        with self._lock:
            self._active.discard(worker)
            self._stopped.append(future)
            ready = self._take_round_if_complete()
            barrier = self._take_barrier_if_complete()
            # Taken once every worker is done: a later call (a worker that
            # stops twice, or a hostile one) completes at once and holds nothing.
            stopped: list[Future] = []
            if not self._active:
                stopped, self._stopped = self._stopped, []
        if ready:
            self._apply_round(ready)
        for waiting in barrier:
            waiting.set_result(None)
        for waiting in stopped:
            waiting.set_result(None)
        if stopped:
            self.all_done.set()
        return future

    def barrier(self, worker: int) -> Future:
        future: Future = Future()
        self.check_worker(worker)
        with self._lock:
            self._barrier[worker] = future
            ready = self._take_barrier_if_complete()
            round_ready = self._take_round_if_complete()  # the others' last rounds
        if round_ready:
            self._apply_round(round_ready)
        for f in ready:
            f.set_result(None)
        return future

    def _take_barrier_if_complete(self) -> list[Future]:
        if self._barrier and set(self._barrier) >= self._active:
            ready, self._barrier = list(self._barrier.values()), {}
            return ready
        return []

    # -- persistence -------------------------------------------------------------

    def save(self, dirname: str, kind: str = "base") -> list[Any]:
        """Writes this server's shards into ``dirname``: every table's rows
        (``kind`` "delta": only those changed since the last save, and the ids
        dropped since; ``table_files``) and the dense parameters it owns.
        Returns ``[unchanged, state, token]``: whether nothing changed since
        the last committed save or the load, whose checkpoint state is
        ``state`` (None: unknown), and the token ``commit_save`` takes with the
        new one."""
        token, before = self._checkpoint.begin()
        unchanged_tables = [
            table_files.write_shard(table, dirname, self.index, delta=kind == "delta")
            for table in self.tables.values()
        ]
        with self._dense_lock:
            params = [self.dense[i].detach().clone() for i in self.owned]
            state = {
                "indices": torch.tensor(self.owned, dtype=torch.int64),
                "params": params,
                # A copy: the state's tensors are the optimizer's own, which the
                # next push changes while the file is written.
                "optimizer": (
                    None if self.dense_optimizer is None
                    else copy.deepcopy(self.dense_optimizer.state_dict())
                ),
            }
        unchanged = self._checkpoint.written(token, all(unchanged_tables), params)
        checkpoint.save_file(state, checkpoint.dense_file(dirname, self.index))
        return [unchanged, before, token]

    def commit_save(self, token: str, state: str) -> None:
        """The save that returned ``token`` is committed, holding the
        checkpoint state ``state``.

        Raises:
            ValueError: ``token`` is not the save in progress (nothing changes).
        """
        if not self._checkpoint.committed(token, state):
            raise ValueError(
                f"server {self.index}: no save in progress has the commit token {token!r:.80}"
            )

    def load(self, dirname: str) -> None:
        """Takes this server's part of the checkpoint at ``dirname`` (written by
        any number of servers): the rows it owns by id, the dense parameters it
        owns and their optimizer state (``checkpoint.dense_optimizer_state``).

        Every file is read and checked before anything changes; every server
        reads every file, so a bad file is refused by all of them alike.

        Raises:
            FileNotFoundError: ``dirname`` has no ``meta.json``.
            CheckpointError: a file is malformed or does not fit the model.
        """
        meta = checkpoint.read_meta(dirname)
        checkpoint.check_follows(meta, self._checkpoint.state, dirname)
        checkpoint.check_dense_shapes(meta, self.dense, dirname)
        values = checkpoint.dense_values(dirname, meta)
        optimizer_state = None
        if self.dense_optimizer is not None:
            optimizer_state = checkpoint.dense_optimizer_state(
                dirname, meta, self.dense_optimizer, who=f"server {self.index}"
            )
        files = table_files.read_tables(dirname, meta, self.tables)
        exact = self._checkpoint.loads_exactly(meta)
        # Everything is checked: from here on nothing is refused.
        table_files.load_tables(
            files, owns=lambda ids: shard_of(ids, self.server_num) == self.index
        )
        with self._dense_lock, torch.no_grad():
            for i in self.owned:
                self.dense[i].copy_(values[i])
            if self.dense_optimizer is not None and optimizer_state is not None:
                self.dense_optimizer.load_state_dict(optimizer_state)
            self._checkpoint.loaded(meta, [self.dense[i] for i in self.owned], exact)
            self._loads += 1
        log.info("server %d loaded %s", self.index, dirname)


_server: ParameterServer | None = None


def install(server: ParameterServer | None) -> None:
    global _server
    _server = server


# Float dtypes numpy checks in one vectorized pass; torch.isfinite is four
# kernels and costs about ten times as much on a push's values.
_NUMPY_FLOATS = (torch.float32, torch.float64, torch.float16)


def _all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every value of the (few, small) dense ``tensors`` is finite: one
    numpy pass where numpy can view them, which costs less than torch's ops."""
    if all(t.dtype in _NUMPY_FLOATS for t in tensors):
        return bool(np.isfinite(np.concatenate([t.numpy().ravel() for t in tensors])).all())
    return all(bool(t.isfinite().all()) for t in tensors)


def _require_finite(values: torch.Tensor, what: str) -> None:
    if not values.is_floating_point():
        return
    numpy_viewable = (
        values.device.type == "cpu" and values.layout == torch.strided and not values.is_neg()
    )
    if values.dtype in _NUMPY_FLOATS and numpy_viewable:
        finite: Any = np.isfinite(values.detach().numpy())
    else:
        finite = torch.isfinite(values)
    if not bool(finite.all()):
        bad = int((~finite).sum())
        raise ValueError(f"{what}: expected finite values, found {bad} NaN or infinite")


# A checkpoint state is a save's uuid4 hex (32 characters).
MAX_STATE_CHARS = 64

# A pass is a day or an hour number (Paddle's 20261127): anything beyond this is
# a mistake, and would not fit the int64 a save records it in.
MAX_PASS_ID = 2**62


def _current() -> ParameterServer:
    if _server is None:
        raise ValueError(f"process {os.getpid()} is not serving: init_server() was not called")
    return _server


# -- handlers (one per operation of trainer.ps.wire.OPS) ---------------------------


def describe() -> dict[str, Any]:
    """This server's tables, dense shapes and mode (a worker checks its model)."""
    return _current().describe()


def pull_tables(names: Sequence[str], ids: torch.Tensor, create: bool) -> list[torch.Tensor]:
    """The rows of the same distinct ids from several tables (one round trip)."""
    server = _current()
    server.check_ids(as_u64(ids), "pull")
    return [server.table(name).pull(ids, create=create) for name in names]


def pull_step(worker: int, names: Sequence[str], ids: torch.Tensor) -> list[torch.Tensor]:
    """A worker's training pull of several tables' rows for the same distinct
    ids; the server keeps the row numbers for the push of their gradients."""
    return _current().pull_step(worker, names, ids)


def pull_dense() -> dict[int, torch.Tensor]:
    """The dense parameters this server owns."""
    return _current().dense_values()


def push(worker: int, sparse: SparsePart, dense: DensePart) -> dict[int, torch.Tensor]:
    """Applies a worker's gradients (async); returns the dense values after."""
    server = _current()
    server.check_worker(worker)
    return server.push(sparse, dense, worker)


def push_sync(worker: int, sparse: SparsePart, dense: DensePart) -> Future:
    """A worker's part of a synchronous round; completes with the round's values."""
    return _current().push_sync(worker, sparse, dense)


def geo_push(worker: int, sparse: SparsePart, dense: DensePart) -> tuple:
    """Adds a worker's GEO deltas; returns the merged rows and dense values."""
    server = _current()
    server.check_worker(worker)
    return server.geo_push(sparse, dense)


def worker_done(worker: int) -> Future:
    """A worker stopped; completes once every worker has."""
    return _current().worker_done(worker)


def barrier(worker: int) -> Future:
    """Completes once every running worker called it."""
    return _current().barrier(worker)


def save(dirname: str, kind: str) -> list[Any]:
    """Writes this server's shards (``kind``: "base" or "delta") into ``dirname``,
    which must lie under the server's checkpoint root (``confined``);
    ``[unchanged, state, token]`` (``ParameterServer.save``)."""
    if kind not in ("base", "delta"):
        raise CheckpointError(
            f"expected a save of kind 'base' or 'delta', found {kind!r:.100}", path=str(dirname)
        )
    server = _current()
    return server.save(confined_directory(dirname, server.checkpoint_root, create=True), kind)


def commit_save(token: str, state: str) -> None:
    """The save that returned ``token`` is committed with the checkpoint state ``state``."""
    if not 0 < len(state) <= MAX_STATE_CHARS:
        raise ValueError(f"expected a checkpoint state id of 1 to {MAX_STATE_CHARS} characters")
    _current().commit_save(token, state)


def load(dirname: str) -> None:
    """Loads this server's part of the checkpoint at ``dirname``, which must lie
    under the server's checkpoint root (``confined``)."""
    server = _current()
    server.load(confined_directory(dirname, server.checkpoint_root, create=False))


def table_size(name: str) -> int:
    """The number of rows of table ``name`` on this server."""
    return len(_current().table(name))


def set_pass(pass_id: int) -> None:
    """Starts pass ``pass_id`` in every table of this server (logs their statistics)."""
    if isinstance(pass_id, bool) or not isinstance(pass_id, int) or not 0 <= pass_id <= MAX_PASS_ID:
        raise ValueError(f"expected a pass id in [0, 2**62], found {pass_id!r:.100}")
    server = _current()
    lifecycle.set_pass(server.tables, pass_id, f"server {server.index}")


def shrink() -> dict[str, list[int]]:
    """Shrinks every table of this server: name -> [rows dropped, rows kept]."""
    server = _current()
    return lifecycle.shrink(server.tables, f"server {server.index}")


def table_stats() -> dict[str, dict[str, int]]:
    """Rows, pending ids, bytes, ... of every table of this server."""
    return lifecycle.stats(_current().tables)


def add_clicks(name: str, ids: torch.Tensor, clicks: torch.Tensor) -> None:
    """Adds clicks to rows of table ``name`` (one per distinct id)."""
    server = _current()
    server.check_ids(as_u64(ids), f"clicks of table {name!r}")
    server.table(name).add_clicks(ids, clicks.numpy())


HANDLERS = {
    f.__name__: f
    for f in (describe, pull_tables, pull_step, pull_dense, push, push_sync, geo_push, worker_done,
              barrier, save, commit_save, load, table_size, set_pass, shrink, table_stats,
              add_clicks)
}
# The operations whose first argument is the calling worker's index: each
# server ties an index to the connection that names it first.
WORKER_OPS = frozenset(
    f.__name__ for f in (pull_step, push, push_sync, geo_push, worker_done, barrier)
)


__all__ = ["HANDLERS", "WORKER_OPS", "ParameterServer", "install"]
