"""How a worker's optimizer step reaches the tables: one class per training mode.

``ParameterServerRuntime`` picks the class once: ``LocalMode`` without a role
environment, else the strategy's mode (``distributed_mode``):

* ``LocalMode``: no servers; the step runs the optimizer and trains the
  in-process sparse tables.
* ``AsyncMode`` (``"async"``): the step sends its gradients and goes on; the
  servers apply each worker's push as it comes.
* ``SyncMode`` (``"sync"``): the step waits until every worker pushed; the
  servers apply the average once.
* ``GeoMode`` (``"geo"``): the worker trains its own copy; every k steps it
  sends each change since the last sync (deltas) and merges the servers' sum.

A distributed mode's step needs the servers: ``connect()`` (from
``init_worker``) hands it a ``WorkerLink``. The runtime's other calls wait for
what a mode sent through ``settle()`` (load) and ``flush()`` (barrier, refresh,
save, stop: GEO also sends what it has not synced yet), and tell it through
``reloaded()`` that the worker's values were replaced by the servers'.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ..embedding import pending, stores
from ..embedding.ahead import MAX_DEPTH, add_network_wait, thread_depth
from ..embedding.tables import TableConfig
from ..job.errors import TrainerError
from ..loop.dense_update import step_from_grads
from . import server as handlers
from . import transport
from .client import GeoStore, RemoteStore, copy_dense, dense_grads, shard_dense, shard_sparse
from .tables.table import SparseTable

__all__ = [
    "AsyncMode",
    "GeoMode",
    "LocalMode",
    "SyncMode",
    "TrainingMode",
    "WorkerLink",
    "distributed_mode",
]

NOT_CONNECTED = "call fleet.init_worker() before training a parameter-server model"


@dataclass(frozen=True)
class WorkerLink:
    """What a connected worker's mode works with.

    Attributes:
        index: this worker's index (the servers count pushes per worker).
        servers: the servers, with their call timeout.
        make_table: an empty local table for a config (GEO's local copy).
    """

    index: int
    servers: transport.ServerSet
    make_table: Callable[[TableConfig], SparseTable]


class TrainingMode:
    """The step of one mode and what the runtime's calls must wait for.

    Attributes:
        name: the strategy's mode name (``"local"`` for ``LocalMode``).
        servers_run_optimizer: whether the servers apply the optimizer to the
            pushed gradients (GEO: the workers do, the servers add deltas).
    """

    name: ClassVar[str]
    servers_run_optimizer: ClassVar[bool] = True

    def __init__(self) -> None:
        self.optimizer: torch.optim.Optimizer | None = None
        self.params: list[torch.Tensor] = []
        self._link: WorkerLink | None = None
        self._remote: RemoteStore | None = None  # async, sync: where forwards pull

    def use(self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> None:
        """The model's torch optimizer and its dense parameters, in server order."""
        self.optimizer = optimizer
        self.params = params

    def connect(self, link: WorkerLink) -> stores.RowStore:
        """Starts working with the servers; returns the store forwards pull from.
        The dense parameters already hold the servers' values."""
        self._link = link
        self._remote = RemoteStore(link.servers)
        return self._remote

    def disconnect(self) -> None:
        """Forgets the servers (the worker left the job)."""
        self._link = None
        self._remote = None

    def _sparse_parts(self) -> list[dict[str, tuple[torch.Tensor, torch.Tensor]]]:
        """This thread's sparse gradients per server, split as their pulls were."""
        remote = self._remote
        routing = None if remote is None else remote.routing
        return shard_sparse(pending.take_gradients(), len(self.link.servers), routing)

    @property
    def link(self) -> WorkerLink:
        """The servers (``TrainerError`` before ``connect``)."""
        if self._link is None:
            raise TrainerError(NOT_CONNECTED)
        return self._link

    def step(self) -> None:
        """One optimizer step of the thread that calls it (``DistributedOptimizer.step``)."""
        raise NotImplementedError

    def settle(self) -> None:
        """Waits for what this worker sent and takes the answers."""

    def flush(self) -> None:
        """Sends what this worker has not sent yet and waits for all of it."""
        self.settle()

    def reloaded(self) -> None:
        """The dense parameters now hold the servers' values (and sparse rows
        must be read from the servers again)."""

    def _set_dense(self, per_server: list[dict[int, torch.Tensor]]) -> None:
        copy_dense(self.params, per_server)

    def _torch_optimizer(self) -> torch.optim.Optimizer:
        if self.optimizer is None:
            raise TrainerError("call fleet.distributed_optimizer(optimizer) before a step")
        return self.optimizer


class LocalMode(TrainingMode):
    """No servers: the optimizer and the in-process sparse tables."""

    name = "local"

    def step(self) -> None:
        """Runs the optimizer, then each sparse table's on its pulled rows."""
        step_from_grads(self._torch_optimizer())
        stores.local_store().push_pending()


class AsyncMode(TrainingMode):
    """Each step sends its gradients and returns without waiting for them.

    A thread's pushes stay in flight while it trains the next batches, up to
    a bound: the depth its pulls are sent ahead (trainer/embedding/ahead.py;
    1 when they are not), at most ``max_pushes``. A step with that many in
    flight first waits for the oldest; each push answered gives the dense
    values after it, taken in the order sent. So the servers apply pushes
    while the worker computes, and a worker's dense parameters lag by at most
    that bound of its own steps, beyond what async mode's arrival order
    already allows. ``settle`` and ``flush`` wait for every push in flight; a
    push that failed raises there or at a later step.

    Args:
        pull_ahead: batches whose pulls are sent ahead of their forwards
            (None: from the measured round trip; 0: none).
        max_pushes: the most pushes of a thread in flight
            (``a_sync_configs["pushes_in_flight"]``, at most Paddle's
            ``send_queue_size``: the gradients a worker may hold unsent).
    """

    name = "async"

    def __init__(self, pull_ahead: int | None = None, max_pushes: int = 2) -> None:
        super().__init__()
        if pull_ahead is not None and not 0 <= pull_ahead <= MAX_DEPTH:
            raise TrainerError(
                f"a_sync_configs['pull_ahead'] must be -1 (from the round trip), 0 (off) or "
                f"at most {MAX_DEPTH} batches, got {pull_ahead}"
            )
        if max_pushes < 1:
            raise TrainerError(
                f"a_sync_configs['pushes_in_flight'] must be >= 1, got {max_pushes}"
            )
        self.pull_ahead = pull_ahead
        self.max_pushes = max_pushes
        self._lock = threading.Lock()
        # thread -> its pushes in flight, oldest first (each: one future per server)
        self._pushes: dict[int, collections.deque[list[Any]]] = {}

    def step(self) -> None:
        """Sends this thread's sparse and dense gradients to their servers."""
        link = self.link
        servers = link.servers
        thread = threading.get_ident()
        self._wait(thread, keep=self.pushes_in_flight() - 1)
        n = len(servers)
        sparse_parts = self._sparse_parts()
        # The gradients are sent while the caller goes on (zero_grad may reuse them).
        grads = {i: g.clone() for i, g in dense_grads(self.params).items()}
        dense_parts = shard_dense(grads, self.params, n)
        futures = [
            servers.call_async(s, handlers.push, link.index, sparse_parts[s], dense_parts[s])
            for s in range(n)
        ]
        with self._lock:
            self._pushes.setdefault(thread, collections.deque()).append(futures)

    def pushes_in_flight(self) -> int:
        """The most pushes the calling thread may have in flight now: the
        depth its pulls go ahead (1 outside such a pass), at most
        ``max_pushes``."""
        return max(1, min(self.max_pushes, thread_depth()))

    def connect(self, link: WorkerLink) -> stores.RowStore:
        """A ``RemoteStore`` whose training pulls name this worker: each server
        reuses the row numbers a pull found for the push of its gradients."""
        self._link = link
        self._remote = RemoteStore(link.servers, link.index, self.pull_ahead)
        return self._remote

    def settle(self) -> None:
        """Waits for every thread's pushes in flight (each thread's in the
        order sent: taken whole, so that no step of that thread takes one
        meanwhile)."""
        with self._lock:
            flights, self._pushes = list(self._pushes.values()), {}
        servers = self.link.servers
        for flight in flights:
            for futures in flight:
                started = time.perf_counter()
                answers = [servers.wait(s, f, "push") for s, f in enumerate(futures)]
                add_network_wait(time.perf_counter() - started)
                self._set_dense(answers)

    def _wait(self, thread: int, keep: int) -> None:
        """Takes the answered pushes of ``thread`` (oldest first), waiting for
        the oldest until at most ``keep`` are in flight; each answer's dense
        values replace the worker's."""
        servers = self.link.servers
        while True:
            with self._lock:
                flight = self._pushes.get(thread)
                if not flight:
                    return
                oldest = flight[0]
                if len(flight) <= keep and not all(f.done() for f in oldest):
                    return
                flight.popleft()
                if not flight:
                    del self._pushes[thread]
            started = time.perf_counter()
            answers = [servers.wait(s, f, "push") for s, f in enumerate(oldest)]
            add_network_wait(time.perf_counter() - started)
            self._set_dense(answers)


class SyncMode(TrainingMode):
    """Each step waits for every worker's push; the servers apply the average."""

    name = "sync"

    def step(self) -> None:
        """Pushes this step's gradients and takes the dense values of the round."""
        link = self.link
        servers = link.servers
        n = len(servers)
        sparse_parts = self._sparse_parts()
        dense_parts = shard_dense(dense_grads(self.params), self.params, n)
        args = [(link.index, sparse_parts[s], dense_parts[s]) for s in range(n)]
        # The step waits for the slowest worker: bounded by the start timeout.
        self._set_dense(
            servers.call_all(handlers.push_sync, args, timeout=transport.start_timeout())
        )


class GeoMode(TrainingMode):
    """Local training, with the changes sent to the servers every ``k_steps``.

    The sync every k steps returns once its push is sent: training goes on, and
    a later step merges the servers' answer when it has come. The next sync,
    ``settle`` and ``flush`` wait for it.

    Args:
        k_steps: steps (of all the worker's threads together) between syncs.
    """

    name = "geo"
    servers_run_optimizer = False

    def __init__(self, k_steps: int) -> None:
        super().__init__()
        if k_steps < 1:
            raise TrainerError(f"GEO mode needs a_sync_configs['k_steps'] >= 1, got {k_steps}")
        self.k_steps = k_steps
        self.store: GeoStore | None = None
        self._steps = 0
        self._lock = threading.Lock()  # the step count, the local copy vs. a sync
        self._flight = threading.Lock()  # one sync in flight at a time
        self._inflight: tuple[list[Any], list[Any]] | None = None
        self._dense_base: list[torch.Tensor] = []  # dense values as of the last sync

    def connect(self, link: WorkerLink) -> stores.RowStore:
        """A local copy of the rows, starting from the servers' dense values."""
        self._link = link
        self._dense_base = [p.detach().clone() for p in self.params]
        self.store = GeoStore(link.servers, link.make_table)
        return self.store

    def disconnect(self) -> None:
        """Forgets the servers and the local copy."""
        super().disconnect()
        self.store = None

    def step(self) -> None:
        """Trains the local copy; every ``k_steps``-th step sends a sync."""
        store = self._store()
        step_from_grads(self._torch_optimizer())
        store.push_pending()
        with self._lock:
            self._steps += 1
            due = self._steps % self.k_steps == 0
        if due:
            self.sync(wait=False)
        else:
            self._finish(block=False)

    def settle(self) -> None:
        """Merges the answer of the sync in flight, waiting for it."""
        self._finish(block=True)

    def flush(self) -> None:
        """Sends every change since the last sync and merges the answer."""
        self.sync(wait=True)

    def reloaded(self) -> None:
        """Reads the local rows again from the servers and takes the dense
        values as the new base."""
        self._store().reload()
        self._dense_base = [p.detach().clone() for p in self.params]

    def _store(self) -> GeoStore:
        if self.store is None:
            raise TrainerError(NOT_CONNECTED)
        return self.store

    def sync(self, wait: bool = True) -> None:
        """Pushes every change since the last sync (sparse rows and dense
        parameters) and merges the servers' answer into the local copy;
        ``wait=False`` returns once the push is sent."""
        link, store = self.link, self._store()
        servers = link.servers
        n = len(servers)
        with self._flight:
            self._finish_locked()
            with self._lock:
                deltas = store.deltas()
                with torch.no_grad():
                    sent = [p.detach().clone() for p in self.params]
                    dense_deltas = {i: v - self._dense_base[i] for i, v in enumerate(sent)}
                    self._dense_base = sent
            sparse_parts = shard_sparse(deltas, n)
            dense_parts = shard_dense(dense_deltas, self.params, n)
            futures = [
                servers.call_async(
                    s, handlers.geo_push, link.index, sparse_parts[s], dense_parts[s]
                )
                for s in range(n)
            ]
            self._inflight = (futures, sparse_parts)
            if wait:
                self._finish_locked()

    def _finish(self, block: bool) -> None:
        """Merges the answer of the sync in flight (``block=False``: only if it came)."""
        inflight = self._inflight
        if inflight is None or (not block and not all(f.done() for f in inflight[0])):
            return
        with self._flight:
            self._finish_locked()

    def _finish_locked(self) -> None:
        inflight, self._inflight = self._inflight, None
        if inflight is None:
            return
        futures, sparse_parts = inflight
        servers, store = self.link.servers, self._store()
        results = [servers.wait(s, f, "geo_push") for s, f in enumerate(futures)]
        with self._lock, torch.no_grad():
            for s, (rows, dense) in enumerate(results):
                for name, values in rows.items():
                    store.merge(name, sparse_parts[s][name][0].numpy(), values)
                for i, value in dense.items():
                    # The servers' value plus what local training changed since
                    # the sync was sent: exactly theirs when nothing did, so a
                    # second flush sends zeros, not rounding left by a merge.
                    param = self.params[i]
                    local = param - self._dense_base[i].view_as(param)
                    param.copy_(value.view_as(param) + local)
                    self._dense_base[i] = value.clone()


def distributed_mode(
    name: str, k_steps: int = 0, pull_ahead: int | None = None, max_pushes: int = 2
) -> TrainingMode:
    """A new mode object for a strategy's mode name (``"async"``, ``"sync"``,
    ``"geo"``, as ``trainer.job.strategy.parameter_server_mode`` returns it);
    ``pull_ahead`` and ``max_pushes``: async mode's (``AsyncMode``)."""
    if name == GeoMode.name:
        return GeoMode(k_steps)
    if name == AsyncMode.name:
        return AsyncMode(pull_ahead, max_pushes)
    if name == SyncMode.name:
        return SyncMode()
    raise TrainerError(f"strategy.mode must be one of ('async', 'sync', 'geo'), got {name!r}")
