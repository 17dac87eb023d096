"""The parameter-server runtime: sparse tables and dense parameters on servers,
over ``torch.distributed.rpc``.

The fleet API delegates to one ``ParameterServerRuntime(role, strategy)`` per
process. The same script runs in every role, in Paddle's order::

    model = Model()                                # builds its SparseEmbedding tables
    opt = fleet.distributed_optimizer(torch.optim.Adagrad(model.parameters(), lr=0.05))
    if fleet.is_server():
        fleet.init_server(); fleet.run_server()    # blocks until every worker stopped
    else:
        fleet.init_worker()
        ... for batch in dataset: loss.backward(); opt.step(); opt.zero_grad()
        fleet.stop_worker()

API (what fleet.py calls):
  ``distributed_optimizer(optimizer) -> DistributedOptimizer``: records the torch
      optimizer (its parameters, in order, are the dense parameters, named by
      index on the servers; its class and first param group's hyper-parameters
      are every sparse table's optimizer unless the ``SparseEmbedding`` gives its
      own) and the live ``SparseEmbedding`` tables. Call it before init_server /
      init_worker. The wrapper's ``step()`` pushes this thread's sparse
      gradients and the dense gradients (local mode: applies them in process).
  ``init_server(model_dir=None)``: builds this server's shard of every table and
      its dense parameters; loads ``model_dir`` (a checkpoint) when given.
  ``run_server()``: joins the RPC group and serves until every worker called
      ``stop_worker()``.
  ``init_worker()``: waits (bounded) for the servers' ports, joins the RPC
      group, checks that the servers hold the same tables and dense shapes,
      pulls the dense parameters. Local mode: nothing.
  ``stop_worker()``: GEO: pushes what is left; tells every server this worker is
      done; leaves the group.
  ``barrier_worker()``: waits for every worker still running (through server 0).
  ``save_persistables(dirname)`` / ``load_persistables(dirname)``: see
      ``trainer.ps.checkpoint``; in PS mode call them from one worker (the
      servers write/read the files, so dirname must be visible to them).
  ``load_local(model, dirname)`` (module function): a checkpoint into a local
      model for inference, without fleet.

Local mode (``role.distributed`` false): tables live in this process; the same
calls work, so a script runs unchanged on a laptop.

Modes (``strategy.mode``): ``"async"`` (default), ``"sync"``, ``"geo"``
(``strategy.a_sync_configs["k_steps"]``). Timeouts: ``FLEETFEED_PS_TIMEOUT``
(seconds, default 30) bounds every call to a server and the wait for a server's
port; a server that does not answer raises ``ServerUnavailableError`` naming its
endpoint. ``FLEETFEED_PS_START_TIMEOUT`` (default 300) bounds the wait for the
whole job to join the RPC group.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import Any

import torch

from ..errors import TrainerError
from ..role import ClusterRole
from . import checkpoint, sparse, transport
from . import server as handlers
from .client import (
    DistributedOptimizer,
    GeoStore,
    RemoteStore,
    dense_grads,
    dense_params,
    shard_dense,
    shard_sparse,
)
from .optim import OptimizerSpec
from .server import ParameterServer
from .sparse import TableConfig
from .table import SparseTable

__all__ = [
    "DistributedOptimizer",
    "OptimizerSpec",
    "ParameterServerRuntime",
    "SparseTable",
    "TableConfig",
    "load_local",
]

log = logging.getLogger(__name__)

_MODES = ("async", "sync", "geo")


def _strategy_mode(strategy: Any) -> tuple[str, int]:
    """(mode, k_steps) from a DistributedStrategy, read defensively."""
    if strategy is None:
        return "async", 0
    configs = getattr(strategy, "a_sync_configs", None) or {}
    try:
        k_steps = int(configs.get("k_steps") or 0)
    except (TypeError, ValueError, AttributeError):
        k_steps = 0
    mode = getattr(strategy, "mode", None)
    if mode is None:
        a_sync = getattr(strategy, "a_sync", True)
        mode = "sync" if not a_sync else ("geo" if k_steps > 0 else "async")
    mode = str(mode).lower()
    if mode not in _MODES:
        raise TrainerError(f"strategy.mode must be one of {_MODES}, got {mode!r}")
    if mode == "geo" and k_steps < 1:
        raise TrainerError(f"GEO mode needs a_sync_configs['k_steps'] >= 1, got {k_steps}")
    return mode, k_steps


class ParameterServerRuntime:
    """One process's part of a parameter-server job (or the local fallback).

    Args:
        role: this process's place in the job (``ClusterRole.local()``: local mode).
        strategy: a DistributedStrategy (``mode``, ``a_sync_configs``); None: async.
    """

    def __init__(self, role: ClusterRole, strategy: Any = None) -> None:
        self.role = role
        self.mode, self.k_steps = _strategy_mode(strategy)
        self.local = not role.distributed
        if not self.local and role.server_num == 0:
            raise TrainerError("a parameter-server job needs at least one server endpoint")
        self.optimizer: torch.optim.Optimizer | None = None
        self.params: list[torch.Tensor] = []
        self.configs: dict[str, TableConfig] = {}
        self.default_spec: OptimizerSpec | None = None
        self.servers: transport.ServerSet | None = None
        self.server: ParameterServer | None = None
        self._store: RemoteStore | GeoStore | None = None
        self._steps = 0
        self._geo_lock = threading.Lock()
        self._dense_base: list[torch.Tensor] = []
        self._presence: transport.PresenceListener | None = None
        self._push_lock = threading.Lock()
        self._geo_flight = threading.Lock()  # one GEO sync in flight at a time
        self._geo_inflight: tuple[list[Any], list[Any]] | None = None
        self._pushes: dict[int, list[Any]] = {}  # thread -> its async push's futures

    # -- model -------------------------------------------------------------------

    def distributed_optimizer(self, optimizer: torch.optim.Optimizer) -> DistributedOptimizer:
        """Wraps ``optimizer``; learns the model's tables and dense parameters."""
        if isinstance(optimizer, DistributedOptimizer):
            optimizer = optimizer.optimizer
        self.optimizer = optimizer
        self.params = dense_params(optimizer)
        self.configs = sparse.table_configs()
        try:
            self.default_spec = OptimizerSpec.from_torch(optimizer)
        except ValueError:
            self.default_spec = None
            uncovered = [n for n, c in self.configs.items() if c.optimizer is None]
            if uncovered:
                raise
        if self.local:
            if self.default_spec is not None:
                sparse.local_store().set_default_optimizer(self.default_spec)
            return DistributedOptimizer(optimizer, self._step_local)
        step = {"async": self._step_async, "sync": self._step_sync, "geo": self._step_geo}
        return DistributedOptimizer(optimizer, step[self.mode])

    def _require_optimizer(self, what: str) -> torch.optim.Optimizer:
        if self.optimizer is None:
            raise TrainerError(f"call fleet.distributed_optimizer(optimizer) before {what}")
        return self.optimizer

    # -- server ------------------------------------------------------------------

    def init_server(self, model_dir: str | None = None) -> None:
        """Builds this server's shard of the tables and its dense parameters."""
        if self.local:
            log.info("init_server() does nothing in a non-distributed job")
            return
        if not self.role.is_server:
            raise TrainerError(f"init_server() called in a {self.role.role.name} process")
        optimizer = self._require_optimizer("init_server()")
        tables = {name: c.make_table(self.default_spec) for name, c in self.configs.items()}
        # GEO servers only add deltas: the workers run the optimizer.
        dense_optimizer = None if self.mode == "geo" else optimizer
        self.server = ParameterServer(
            self.role.index, self.role.server_num, self.role.worker_num, self.mode,
            tables, self.params, dense_optimizer,
        )
        if model_dir:
            self.server.load(model_dir)

    def run_server(self) -> None:
        """Serves until every worker called stop_worker()."""
        if self.local:
            log.info("run_server() does nothing in a non-distributed job")
            return
        if self.server is None:
            self.init_server()
        assert self.server is not None
        role = self.role
        endpoint = role.server_endpoints[role.index]
        if "OMP_NUM_THREADS" not in os.environ:
            # A server's work is many small numpy/torch calls on RPC threads: one
            # intra-op thread each; more only contend with the workers beside it
            # (what torchrun does for several processes on one machine).
            torch.set_num_threads(1)
        if role.index > 0:
            self._presence = transport.PresenceListener(endpoint)
        transport.set_server_secret(role.job_secret)
        handlers.install(self.server)
        try:
            transport.init_group(
                transport.server_name(role.index), role.index, role.server_num + role.worker_num,
                role.server_endpoints, _start_timeout(),
            )
            log.info(
                "parameter server %d serving at %s (%s mode, tables %s, %d dense parameters)",
                role.index, endpoint, self.mode, sorted(self.server.tables), len(self.server.owned),
            )
            self.server.all_done.wait()
        except BaseException:
            transport.shutdown_group()
            raise
        else:
            transport.shutdown_group(graceful=True, timeout=_start_timeout())
        finally:
            handlers.install(None)
            if self._presence is not None:
                self._presence.close()
        log.info("parameter server %d: every worker stopped", role.index)

    # -- worker ------------------------------------------------------------------

    def init_worker(self) -> None:
        """Connects to the servers and pulls the dense parameters."""
        if self.local:
            log.info("init_worker() does nothing in a non-distributed job")
            return
        role = self.role
        if not role.is_worker:
            raise TrainerError(f"init_worker() called in a {role.role.name} process")
        self._require_optimizer("init_worker()")
        timeout = transport.call_timeout()
        for endpoint in role.server_endpoints:
            transport.wait_for_port(endpoint, timeout)
        transport.init_group(
            transport.worker_name(role.index), role.server_num + role.index,
            role.server_num + role.worker_num, role.server_endpoints, _start_timeout(),
        )
        self.servers = transport.ServerSet(role.server_endpoints, role.job_secret, timeout)
        try:
            self._check_servers()
            self._set_dense(self.servers.call_all(handlers.pull_dense))
        except BaseException:
            transport.shutdown_group()
            raise
        self._dense_base = [p.detach().clone() for p in self.params]
        if self.mode == "geo":
            self._store = GeoStore(self.servers, lambda c: c.make_table(self.default_spec))
        else:
            self._store = RemoteStore(self.servers)
        sparse.install_store(self._store)
        atexit.register(self._leave_at_exit)
        log.info("worker %d connected to %d servers (%s mode)", role.index, role.server_num, self.mode)

    def _leave_at_exit(self) -> None:
        """A worker that ends without stop_worker() (an exception escaped the
        script) leaves the RPC group before the interpreter shuts down: with the
        group up, TensorPipe's threads can abort the process (SIGABRT, "FATAL:
        exception not rethrown") instead of letting it exit with status 1."""
        if self.servers is not None:
            transport.shutdown_group()

    def _check_servers(self) -> None:
        assert self.servers is not None
        want_tables = {n: c.dim for n, c in self.configs.items()}
        want_dense = [list(p.shape) for p in self.params]
        for index, info in enumerate(self.servers.call_all(handlers.describe)):
            tables = {n: v[0] for n, v in info["tables"].items()}
            if tables != want_tables or info["dense"] != want_dense or info["mode"] != self.mode:
                raise TrainerError(
                    f"parameter server {index} at {self.servers.endpoints[index]} serves "
                    f"tables {tables}, dense shapes {info['dense']}, mode {info['mode']}; "
                    f"this worker's model has tables {want_tables}, dense shapes "
                    f"{want_dense}, mode {self.mode} (every role must build the same model)"
                )

    def refresh(self) -> None:
        """Brings this worker's copy of the model up to date with the servers,
        e.g. before an evaluation: in async mode the dense parameters lag the
        other workers' pushes; in GEO mode cached rows do too (GEO first pushes
        its pending deltas, then drops its row cache)."""
        if self.local:
            return
        servers = self._connected()
        self._wait_pushes()
        if self.mode == "geo":
            assert isinstance(self._store, GeoStore)
            self._geo_sync()
            self._store.clear()
        self._set_dense(servers.call_all(handlers.pull_dense))
        self._dense_base = [p.detach().clone() for p in self.params]

    def _set_dense(self, per_server: list[dict[int, torch.Tensor]]) -> None:
        with torch.no_grad():
            for values in per_server:
                for i, value in values.items():
                    self.params[i].copy_(value)

    def stop_worker(self) -> None:
        """Flushes GEO deltas, tells the servers this worker is done, leaves."""
        if self.local:
            log.info("stop_worker() does nothing in a non-distributed job")
            return
        if self.servers is None:
            return
        try:
            self._wait_pushes()
            if self.mode == "geo":
                self._geo_sync()
            self.servers.call_all(handlers.worker_done, [(self.role.index,)] * len(self.servers))
        except BaseException:
            transport.shutdown_group()
            raise
        else:
            # Waits for the other workers to stop too (as Paddle's stop_worker).
            transport.shutdown_group(graceful=True, timeout=_start_timeout())
        finally:
            sparse.install_store(None)
            self.servers = None

    def barrier_worker(self) -> None:
        """Returns once every running worker called barrier_worker()."""
        if self.local or self.servers is None:
            return
        self._wait_pushes()
        self._geo_finish()
        self.servers.call(0, handlers.barrier, self.role.index, timeout=_start_timeout())

    # -- steps -------------------------------------------------------------------

    def _step_local(self) -> None:
        assert self.optimizer is not None
        self.optimizer.step()
        sparse.local_store().push(sparse.take_gradients())

    def _connected(self) -> transport.ServerSet:
        if self.servers is None:
            raise TrainerError("call fleet.init_worker() before training a parameter-server model")
        return self.servers

    def _step_async(self) -> None:
        """Sends this step's push and returns without waiting for it: the next
        step (of this thread) first waits for it and takes the dense values it
        returned. So the servers apply a push while the worker computes the
        next batch, and a worker's dense parameters lag by one step at most
        more than async mode's arrival order already allows. refresh(),
        barrier_worker(), save_persistables() and stop_worker() wait for every
        push in flight; a push that failed raises at the next of those calls."""
        servers = self._connected()
        self._wait_pushes(threading.get_ident())
        n = len(servers)
        sparse_parts = shard_sparse(sparse.take_gradients(), n)
        # The gradients are sent while the caller goes on (zero_grad may reuse them).
        grads = {i: g.clone() for i, g in dense_grads(self.params).items()}
        dense_parts = shard_dense(grads, n)
        futures = [
            servers.call_async(s, handlers.push, self.role.index, sparse_parts[s], dense_parts[s])
            for s in range(n)
        ]
        with self._push_lock:
            self._pushes[threading.get_ident()] = futures

    def _wait_pushes(self, thread: int | None = None) -> None:
        """Waits for the async push in flight of ``thread`` (None: of every
        thread) and takes the dense values it returned."""
        with self._push_lock:
            if thread is None:
                pending = list(self._pushes.values())
                self._pushes.clear()
            else:
                futures = self._pushes.pop(thread, None)
                pending = [] if futures is None else [futures]
        if not pending:
            return
        servers = self._connected()
        for futures in pending:
            self._set_dense([servers.wait(s, f, "push") for s, f in enumerate(futures)])

    def _step_sync(self) -> None:
        servers = self._connected()
        n = len(servers)
        sparse_parts = shard_sparse(sparse.take_gradients(), n)
        dense_parts = shard_dense(dense_grads(self.params), n)
        args = [(self.role.index, sparse_parts[s], dense_parts[s]) for s in range(n)]
        # The step waits for the slowest worker: bounded by the start timeout.
        self._set_dense(servers.call_all(handlers.push_sync, args, timeout=_start_timeout()))

    def _step_geo(self) -> None:
        assert self.optimizer is not None and isinstance(self._store, GeoStore)
        self.optimizer.step()
        self._store.apply(sparse.take_gradients())
        with self._geo_lock:
            self._steps += 1
            due = self._steps % self.k_steps == 0
        if due:
            self._geo_sync(wait=False)
        else:
            self._geo_finish(block=False)

    def _geo_sync(self, wait: bool = True) -> None:
        """Pushes every change since the last sync (sparse rows and dense
        parameters) and merges the servers' answer into the local copy.
        ``wait=False`` (the sync every k steps) returns once the push is sent:
        training goes on, and a later step merges the answer when it has come
        (``_geo_finish``); the next sync, refresh(), barrier/stop and saves
        wait for it."""
        servers = self._connected()
        store = self._store
        assert isinstance(store, GeoStore)
        n = len(servers)
        with self._geo_flight:
            self._geo_finish_locked()
            with self._geo_lock:
                deltas = store.deltas()
                with torch.no_grad():
                    sent = [p.detach().clone() for p in self.params]
                    dense_deltas = {i: v - self._dense_base[i] for i, v in enumerate(sent)}
                    self._dense_base = sent
            sparse_parts = shard_sparse(deltas, n)
            dense_parts = shard_dense(dense_deltas, n)
            futures = [
                servers.call_async(s, handlers.geo_push, self.role.index, sparse_parts[s], dense_parts[s])
                for s in range(n)
            ]
            self._geo_inflight = (futures, sparse_parts)
            if wait:
                self._geo_finish_locked()

    def _geo_finish(self, block: bool = True) -> None:
        """Merges the answer of the sync in flight (``block=False``: only if it came)."""
        inflight = self._geo_inflight
        if inflight is None or (not block and not all(f.done() for f in inflight[0])):
            return
        with self._geo_flight:
            self._geo_finish_locked()

    def _geo_finish_locked(self) -> None:
        inflight, self._geo_inflight = self._geo_inflight, None
        if inflight is None:
            return
        futures, sparse_parts = inflight
        servers = self._connected()
        store = self._store
        assert isinstance(store, GeoStore)
        results = [servers.wait(s, f, "geo_push") for s, f in enumerate(futures)]
        with self._geo_lock, torch.no_grad():
            for s, (rows, dense) in enumerate(results):
                for name, values in rows.items():
                    store.merge(name, sparse_parts[s][name][0].numpy(), values)
                for i, value in dense.items():
                    # Keep what local training changed since the sync was sent.
                    change = value - self._dense_base[i]
                    self.params[i].add_(change.view_as(self.params[i]))
                    self._dense_base[i] = value.clone()

    # -- checkpoints -------------------------------------------------------------

    def save_persistables(self, dirname: str) -> None:
        """Writes every sparse table shard and the dense parameters to ``dirname``."""
        self._require_optimizer("save_persistables()")
        staging = checkpoint.staging_dir(dirname)
        try:
            if self.local:
                server_num = 1
                for name, config in self.configs.items():
                    table = sparse.local_store().table(config)
                    checkpoint.save_file(table.state_dict(), checkpoint.sparse_file(staging, name, 0))
                assert self.optimizer is not None
                checkpoint.save_file(
                    {
                        "indices": torch.arange(len(self.params)),
                        "params": [p.detach().clone() for p in self.params],
                        "optimizer": self.optimizer.state_dict(),
                    },
                    checkpoint.dense_file(staging, 0),
                )
            else:
                servers = self._connected()
                self._wait_pushes()
                if self.mode == "geo":
                    self._geo_sync()
                server_num = len(servers)
                servers.call_all(handlers.save, [(staging,)] * server_num)
            meta = {
                "format": checkpoint.FORMAT,
                "server_num": server_num,
                "mode": "local" if self.local else self.mode,
                "tables": {n: c.as_dict() for n, c in self.configs.items()},
                "dense": [list(p.shape) for p in self.params],
            }
            checkpoint.commit(staging, dirname, meta)
        except BaseException:
            import shutil

            shutil.rmtree(staging, ignore_errors=True)
            raise

    def load_persistables(self, dirname: str) -> None:
        """Loads a checkpoint written by save_persistables (any server count)."""
        self._require_optimizer("load_persistables()")
        if self.local:
            meta = checkpoint.read_meta(dirname)
            checkpoint.check_dense_shapes(meta, self.params, dirname)
            _load_tables(dirname, self.configs)
            values = checkpoint.dense_values(dirname)
            with torch.no_grad():
                for i, p in enumerate(self.params):
                    p.copy_(values[i])
            return
        servers = self._connected()
        self._wait_pushes()
        self._geo_finish()
        servers.call_all(handlers.load, [(os.path.abspath(dirname),)] * len(servers))
        self._set_dense(servers.call_all(handlers.pull_dense))
        if self.mode == "geo":
            assert isinstance(self._store, GeoStore)
            self._store.clear()
            self._dense_base = [p.detach().clone() for p in self.params]


def _load_tables(dirname: str, configs: dict[str, TableConfig]) -> None:
    store = sparse.local_store()
    for name, config in configs.items():
        table = store.table(config)
        for shard in checkpoint.sparse_shards(dirname, name):
            table.load_state_dict(shard)


def load_local(model: torch.nn.Module, dirname: str) -> None:
    """Loads a checkpoint into a local model (inference, no fleet needed).

    Dense parameters go into ``model.parameters()`` in order (the order of the
    optimizer that trained it, when it was built from ``model.parameters()``);
    the model's SparseEmbedding tables get every saved row.
    """
    from ..nn import SparseEmbedding

    meta = checkpoint.read_meta(dirname)
    params = list(model.parameters())
    checkpoint.check_dense_shapes(meta, params, dirname)
    values = checkpoint.dense_values(dirname)
    with torch.no_grad():
        for i, p in enumerate(params):
            p.copy_(values[i])
    configs = {m.name: m.config for m in model.modules() if isinstance(m, SparseEmbedding)}
    _load_tables(dirname, configs)


def _start_timeout() -> float:
    value = os.environ.get("FLEETFEED_PS_START_TIMEOUT")
    try:
        return float(value) if value else transport.DEFAULT_START_TIMEOUT
    except ValueError:
        raise TrainerError(
            f"FLEETFEED_PS_START_TIMEOUT must be a number of seconds, got {value!r}"
        ) from None

