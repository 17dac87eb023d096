"""``ParameterServerRuntime``: one process's part of a parameter-server job.

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

What a step does is the training mode's (``trainer.ps.modes``, one class per
mode, chosen once here); this module runs the rest of the job: a server's
tables and its listening socket, a worker's connections, barriers and checkpoints.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import uuid
from typing import Any

import torch

from datafeed.records.memory import return_large_blocks
from datafeed.source.fs import write_atomically

from ..embedding import stores, tables
from ..embedding.tables import TableConfig
from ..job import restart
from ..job.errors import CheckpointError, ServerCallError, ServerUnavailableError, TrainerError
from ..job.keys import require_key_or_insecure
from ..job.role import ClusterRole
from ..job.strategy import async_settings, parameter_server_mode
from . import lifecycle, transport
from . import server as handlers
from .checkpoint import directory as checkpoint
from .checkpoint import table_files
from .client import DistributedOptimizer, copy_dense, dense_params
from .modes import LocalMode, TrainingMode, WorkerLink, distributed_mode
from .server import ParameterServer
from .tables.optim import OptimizerSpec
from .tables.table import SparseTable

__all__ = ["ParameterServerRuntime", "load_local", "model_configs", "one_intra_op_thread"]

log = logging.getLogger(__name__)


def one_intra_op_thread(who: str) -> None:
    """Gives torch one intra-op thread unless ``OMP_NUM_THREADS`` chooses (a
    non-empty value).

    A PS job's processes share the machine's cores, and a step is many small
    torch and numpy calls: torch's default pool (a thread per core) only adds
    threads that spin between calls (OpenMP's wait policy). On this 2-core
    machine, small CTR model, GEO, 1 server + 2 workers: 25k records/s at
    19 ms of worker CPU per batch with the default pool, 347k at 1.3 ms with
    one thread. fleetrun sets ``OMP_NUM_THREADS=1``; this covers the jobs other
    launchers start.
    """
    if os.environ.get("OMP_NUM_THREADS", "").strip():
        return
    if torch.get_num_threads() != 1:
        log.info(
            "%s: one torch intra-op thread (set OMP_NUM_THREADS to choose another count)", who
        )
        torch.set_num_threads(1)


class ParameterServerRuntime:
    """One process's part of a parameter-server job (or the local fallback).

    Args:
        role: this process's place in the job (``ClusterRole.local()``: local mode).
        strategy: a DistributedStrategy, or any object with its ``mode`` and
            ``a_sync_configs`` (see ``parameter_server_mode``); None: async.

    Attributes:
        mode: the strategy's mode name (``"async"``, ``"sync"``, ``"geo"``).
        k_steps: GEO's steps between syncs, as configured.
        training: the step and its waits (``LocalMode`` in local mode).
        servers: a connected worker's view of the servers, else None.
    """

    def __init__(self, role: ClusterRole, strategy: Any = None) -> None:
        self.role = role
        self.mode, self.k_steps = parameter_server_mode(strategy)
        self.local = not role.distributed
        if not self.local and role.server_num == 0:
            raise TrainerError("a parameter-server job needs at least one server endpoint")
        self.training: TrainingMode = (
            LocalMode() if self.local
            else distributed_mode(self.mode, self.k_steps, *async_settings(strategy))
        )
        self.optimizer: torch.optim.Optimizer | None = None
        self.params: list[torch.Tensor] = []
        self.configs: dict[str, TableConfig] = {}
        self.default_spec: OptimizerSpec | None = None
        self.servers: transport.ServerSet | None = None
        self.server: ParameterServer | None = None
        self._save_failed = False
        self._left_to_worker_0: set[str] = set()  # calls said to do nothing here
        self._checkpoint = checkpoint.CheckpointState()  # local mode's (servers keep theirs)

    # -- model -------------------------------------------------------------------

    def distributed_optimizer(
        self, optimizer: torch.optim.Optimizer, model: torch.nn.Module | None = None
    ) -> DistributedOptimizer:
        """Wraps ``optimizer``; learns the model's tables and dense parameters.

        Its parameters, in order, are the dense parameters (named by index on
        the servers); its class and first param group's hyper-parameters are
        every sparse table's optimizer unless the ``SparseEmbedding`` gives its
        own. The sparse tables are those of ``model``'s SparseEmbedding modules;
        ``model`` None: of the model holding the optimizer's parameters
        (``model_configs``). Saves, loads, ``set_pass``, ``shrink`` and
        ``table_stats`` work on these tables only. Call it before init_server /
        init_worker.

        Raises:
            ValueError: ``optimizer`` has no sparse equivalent and some table
                has no optimizer of its own.
            TypeError: ``model`` is not a ``torch.nn.Module``.
            TrainerError: no ``model`` given, and no module holds the
                optimizer's parameters.
        """
        if isinstance(optimizer, DistributedOptimizer):
            optimizer = optimizer.optimizer
        params = dense_params(optimizer)
        configs = model_configs(params, model)
        self.optimizer = optimizer
        self.params = params
        self.configs = configs
        try:
            self.default_spec = OptimizerSpec.from_torch(optimizer)
        except ValueError:
            self.default_spec = None
            uncovered = [n for n, c in self.configs.items() if c.optimizer is None]
            if uncovered:
                raise
        if self.local and self.default_spec is not None:
            stores.local_store().set_default_optimizer(self.default_spec)
        self.training.use(optimizer, self.params)
        return DistributedOptimizer(optimizer, self.training.step)

    def _require_optimizer(self, what: str) -> torch.optim.Optimizer:
        if self.optimizer is None:
            raise TrainerError(f"call fleet.distributed_optimizer(optimizer) before {what}")
        return self.optimizer

    def _local_tables(self, what: str) -> dict[str, SparseTable]:
        """The model's tables in this process (local mode), made now if new:
        not the other tables of the process's store, which other models own."""
        self._require_optimizer(what)
        store = stores.local_store()
        return {name: store.table(config) for name, config in self.configs.items()}

    # -- server ------------------------------------------------------------------

    def init_server(self, model_dir: str | None = None) -> None:
        """Builds this server's shard of the tables and its dense parameters;
        loads ``model_dir`` (a checkpoint) when given. A job that fleetrun
        restarted (``FLEETFEED_RESUME_DIR``) loads its last checkpoint instead,
        which is newer than any ``model_dir`` the job started from."""
        if self.local:
            log.info("init_server() does nothing in a non-distributed job")
            return
        if not self.role.is_server:
            raise TrainerError(f"init_server() called in a {self.role.role.name} process")
        optimizer = self._require_optimizer("init_server()")
        # A server's requests free blocks of megabytes on many threads: glibc
        # would keep them (11 bytes a row of a 10M-row table, measured).
        return_large_blocks()
        tables = {
            name: c.make_table(self.default_spec, shards=self.role.server_num)
            for name, c in self.configs.items()
        }
        dense_optimizer = optimizer if self.training.servers_run_optimizer else None
        self.server = ParameterServer(
            self.role.index, self.role.server_num, self.role.worker_num, self.mode,
            tables, self.params, dense_optimizer,
        )
        resume = restart.resume_dir()
        if resume:
            log.info(
                "parameter server %d: restart %d resumes from %s", self.role.index,
                restart.restart_count(), resume,
            )
            model_dir = resume
        if model_dir:
            self.server.load(model_dir)

    def run_server(self) -> None:
        """Listens on this server's endpoint and serves until every worker called
        stop_worker()."""
        if self.local:
            log.info("run_server() does nothing in a non-distributed job")
            return
        if self.server is None:
            self.init_server()
        server = self.server
        if server is None:  # init_server() raises rather than leave it unset
            raise TrainerError("run_server(): this server has no tables")
        role = self.role
        endpoint = role.server_endpoints[role.index]
        require_key_or_insecure(
            role.job_secret, [*role.server_endpoints, *role.worker_endpoints],
            f"parameter server {role.index}",
        )
        one_intra_op_thread(f"parameter server {role.index}")
        handlers.install(server)
        try:
            listening = transport.ServerEndpoint(
                endpoint, transport.CurveKeys.from_job_key(role.job_secret), handlers.HANDLERS,
                threads=max(4, 2 * role.worker_num), name=f"parameter server {role.index}",
                worker_ops=handlers.WORKER_OPS, worker_num=role.worker_num,
            )
            try:
                log.info(
                    "parameter server %d serving at %s (%s mode, tables %s, %d dense "
                    "parameters, %s)",
                    role.index, endpoint, self.mode, sorted(server.tables), len(server.owned),
                    "authenticated" if role.job_secret else "no job key",
                )
                server.all_done.wait()
            finally:
                listening.close()
        finally:
            handlers.install(None)
        log.info("parameter server %d: every worker stopped", role.index)

    # -- worker ------------------------------------------------------------------

    def init_worker(self) -> None:
        """Waits (bounded) for the servers' ports, connects to every server,
        checks that the servers hold this model's tables and dense shapes, and
        pulls the dense parameters. Local mode: nothing."""
        if self.local:
            log.info("init_worker() does nothing in a non-distributed job")
            return
        role = self.role
        if not role.is_worker:
            raise TrainerError(f"init_worker() called in a {role.role.name} process")
        self._require_optimizer("init_worker()")
        require_key_or_insecure(
            role.job_secret, [*role.server_endpoints, *role.worker_endpoints],
            f"worker {role.index}",
        )
        one_intra_op_thread(f"worker {role.index}")
        timeout = transport.call_timeout()
        for endpoint in role.server_endpoints:
            transport.wait_for_port(endpoint, timeout)
        servers = transport.ServerSet(
            role.server_endpoints, transport.CurveKeys.from_job_key(role.job_secret), timeout
        )
        try:
            self._check_servers(servers)
            copy_dense(self.params, servers.call_all(handlers.pull_dense))
        except BaseException:
            servers.close()
            raise
        self.servers = servers
        link = WorkerLink(
            role.index, self.servers, lambda c: c.make_table(self.default_spec, lifecycle=False)
        )
        stores.install_store(self.training.connect(link))
        stores.install_click_sink(lifecycle.ClickSender(self.servers, handlers.add_clicks))
        atexit.register(self._leave_at_exit)
        log.info(
            "worker %d connected to %d servers (%s mode)", role.index, role.server_num, self.mode
        )
        if restart.resume_dir():
            log.info(
                "worker %d: restart %d, the servers resumed from %s (fleet.load_dataset_state "
                "puts a dataset where it was)", role.index, restart.restart_count(),
                restart.resume_dir(),
            )

    def _leave_at_exit(self) -> None:
        """A worker that ends without stop_worker() (an exception escaped the
        script) closes its connections before the interpreter shuts down."""
        if self.servers is not None:
            self.servers.close()

    def _check_servers(self, servers: transport.ServerSet) -> None:
        want_tables = {n: c.dim for n, c in self.configs.items()}
        want_dense = [list(p.shape) for p in self.params]
        for index, info in enumerate(servers.call_all(handlers.describe)):
            # Rows go to the server at their shard's place in the endpoint
            # list: a worker whose list has another order or length (a launch
            # configured by hand) would train rows on servers that do not own
            # them, and nothing would ever say so.
            place = (info["index"], info["server_num"], info["worker_num"])
            if place != (index, len(servers), self.role.worker_num):
                raise TrainerError(
                    f"parameter server {index} at {servers.endpoints[index]} is server "
                    f"{info['index']} of {info['server_num']} in a job of "
                    f"{info['worker_num']} workers; this worker lists it as server {index} of "
                    f"{len(servers)} in a job of {self.role.worker_num} workers (every role "
                    f"must be given the same server endpoints, in the same order, and the "
                    f"same worker count)"
                )
            tables = {n: v[0] for n, v in info["tables"].items()}
            if tables != want_tables or info["dense"] != want_dense or info["mode"] != self.mode:
                raise TrainerError(
                    f"parameter server {index} at {servers.endpoints[index]} serves "
                    f"tables {tables}, dense shapes {info['dense']}, mode {info['mode']}; "
                    f"this worker's model has tables {want_tables}, dense shapes "
                    f"{want_dense}, mode {self.mode} (every role must build the same model)"
                )

    def _connected(self) -> transport.ServerSet:
        if self.servers is None:
            raise TrainerError("call fleet.init_worker() before training a parameter-server model")
        return self.servers

    def refresh(self) -> None:
        """Brings this worker's copy of the model up to date with the servers,
        e.g. before an evaluation: in async mode the dense parameters lag the
        other workers' pushes; in GEO mode cached rows do too (GEO first pushes
        its pending deltas, then reads its rows again)."""
        if self.local:
            return
        servers = self._connected()
        self.training.flush()
        copy_dense(self.params, servers.call_all(handlers.pull_dense))
        self.training.reloaded()

    def stop_worker(self) -> None:
        """GEO: pushes what is left; tells every server this worker is done;
        waits (up to ``start_timeout()``) for the other workers to stop too, as
        Paddle's does, and closes its connections."""
        if self.local:
            log.info("stop_worker() does nothing in a non-distributed job")
            return
        if self.servers is None:
            return
        servers = self.servers
        try:
            self.training.flush()
            done = [(self.role.index,)] * len(servers)
            servers.call_all(handlers.worker_done, done, timeout=transport.start_timeout())
        finally:
            stores.install_store(None)
            stores.install_click_sink(None)
            self.training.disconnect()
            self.servers = None
            servers.close()

    def barrier_worker(self) -> None:
        """Returns once every running worker called barrier_worker() (on
        every server), with this worker's copy of the model brought up to date
        (``refresh``): each worker first sends what it has not sent (GEO: its
        steps since the last sync) and waits for it, so every update made
        before the barrier is on the servers then, and a save or an evaluation
        after it (async mode: the dense parameters lagged the other workers'
        last pushes) sees all of them."""
        if self.local or self.servers is None:
            return
        self.training.flush()
        self._meet_the_others()
        self.refresh()

    def finish_steps(self) -> None:
        """Sends what this worker has not sent and waits for it (``flush``),
        before it waits for the other workers (``save_persistables`` with a
        dataset gathers their positions). Sync mode meets them at the barrier
        first: a worker out of batches first would otherwise hold up their
        last rounds, and they its gather, until the timeout."""
        self.training.flush()
        if self.mode == "sync" and self.servers is not None:
            self._meet_the_others()

    def _meet_the_others(self) -> None:
        """The barrier, on every server: each one's sync rounds go on without
        the workers waiting here, and all of them are released before anyone
        steps again."""
        servers = self._connected()
        servers.call_all(handlers.barrier, [(self.role.index,)] * len(servers),
                         timeout=transport.start_timeout())

    # -- table lifecycle (trainer.ps.lifecycle) ------------------------------------

    def set_pass(self, pass_id: int) -> None:
        """Starts pass ``pass_id`` in every table (every server)."""
        if self.local:
            own_tables = self._local_tables("set_pass()")
            stores.local_store().set_pass(pass_id)
            lifecycle.set_pass(own_tables, pass_id, "local")
            return
        self._connected().call_all(handlers.set_pass, [(pass_id,)] * len(self._connected()))

    def _left_to_first_worker(self, what: str) -> bool:
        """Whether this worker leaves ``what`` to worker 0, as Paddle's shrink
        and save_persistables do: a program ported from Paddle calls them on
        every worker, where each call would decay the rows' statistics again,
        or write a delta that replaces the one before it. Said once. Its own
        updates are sent first (GEO: its pending deltas), as its save did."""
        if self.local or not self.role.is_worker or self.role.index == 0:
            return False
        if self.servers is not None:
            self.training.flush()  # what this worker trained reaches worker 0's call
        if what not in self._left_to_worker_0:
            self._left_to_worker_0.add(what)
            log.warning(
                "%s on worker %d does nothing: worker 0 does it for the whole job, as in "
                "Paddle, where every worker calls it (call it on worker 0)", what,
                self.role.index,
            )
        return True

    def shrink(self) -> dict[str, dict[str, int]]:
        """Shrinks every table on every server: name -> {"dropped", "kept"} rows
        (on worker 0; another worker's call does nothing and returns {})."""
        if self._left_to_first_worker("fleet.shrink()"):
            return {}
        if self.local:
            own_tables = self._local_tables("shrink()")
            return lifecycle.merge_shrinks([lifecycle.shrink(own_tables, "local")])
        servers = self._connected()
        self.training.flush()
        # A shrink, save or load of a large table takes longer than one call:
        # bounded as the job's slowest member (the others wait at a barrier).
        return lifecycle.merge_shrinks(
            servers.call_all(handlers.shrink, timeout=transport.start_timeout()))

    def table_stats(self) -> dict[str, dict[str, int]]:
        """Rows, bytes, pending ids, ... per table, summed over the servers."""
        if self.local:
            return lifecycle.merge_stats([lifecycle.stats(self._local_tables("table_stats()"))])
        return lifecycle.merge_stats(self._connected().call_all(handlers.table_stats))

    # -- checkpoints -------------------------------------------------------------

    def save_persistables(
        self, dirname: str, extra_files: dict[str, bytes] | None = None, mode: Any = 0
    ) -> None:
        """Writes the sparse tables and the dense parameters to ``dirname``
        (``trainer.ps.checkpoint``): ``mode`` 0 ("base") every row, 1 ("delta")
        the rows changed since the last save and the ids dropped since. In PS
        mode call it from one worker; a delta is worker 0's (another worker's
        call sends its updates and returns, as Paddle's programs call it on
        every worker): the servers write the files, so
        ``dirname`` must be visible to them. ``extra_files`` (name: bytes) go
        into the same checkpoint, which appears whole or not at all (the
        workers' dataset positions). After a failed save the next delta is
        written as a base (the failed one may have marked rows saved)."""
        kind = checkpoint.save_kind(mode)
        # A delta from every worker would replace the one before it (its rows
        # lost); a base from every worker is whole each time (the last stands).
        if kind == "delta" and self._left_to_first_worker("fleet.save_persistables(mode=1)"):
            return
        optimizer = self._require_optimizer("save_persistables()")
        if kind == "delta" and self._save_failed:
            log.warning("save_persistables(%s): the last save failed; writing a base", dirname)
            kind = "base"
        staging = checkpoint.staging_dir(dirname, list(extra_files or ()))
        save_id = uuid.uuid4().hex
        try:
            if self.local:
                server_num = 1
                token, before = self._checkpoint.begin()
                unchanged_tables = [
                    table_files.write_shard(table, staging, 0, delta=kind == "delta")
                    for table in self._local_tables("save_persistables()").values()
                ]
                params = [p.detach().clone() for p in self.params]
                same = self._checkpoint.written(token, all(unchanged_tables), params)
                replies = [[same, before, token]]
                checkpoint.save_file(
                    {
                        "indices": torch.arange(len(self.params)),
                        "params": params,
                        "optimizer": optimizer.state_dict(),
                    },
                    checkpoint.dense_file(staging, 0),
                )
            else:
                servers = self._connected()
                self.training.flush()
                server_num = len(servers)
                replies = servers.call_all(handlers.save, [(staging, kind)] * server_num,
                                           timeout=transport.start_timeout())
            # Each server: [nothing changed since its last save or load, the
            # state that left its rows at, its commit token]; they agree unless
            # a save failed or a server was restarted.
            states = {before for _, before, _ in replies}
            before = states.pop() if len(states) == 1 else None
            if kind == "delta" and before is None:
                # Its rows may have been marked saved by a save that never
                # committed: a delta could not say what it follows.
                log.warning(
                    "save_persistables(%s): the tables' last save is not known (a save "
                    "failed, the servers were restarted, or a delta was loaded over rows "
                    "of unknown state); writing a base", dirname,
                )
                shutil.rmtree(staging, ignore_errors=True)
                self.save_persistables(dirname, extra_files, "base")
                return
            unchanged = before is not None and all(same for same, _, _ in replies)
            state = before if unchanged else save_id
            for name, data in (extra_files or {}).items():
                write_atomically(os.path.join(staging, name), data)
            meta = {
                "format": checkpoint.FORMAT,
                "kind": kind,
                "save_id": save_id,
                "state": state,
                "after": before if kind == "delta" else None,
                "server_num": server_num,
                "mode": "local" if self.local else self.mode,
                "tables": {n: c.as_dict() for n, c in self.configs.items()},
                "dense": [list(p.shape) for p in self.params],
            }
            checkpoint.commit(staging, dirname, meta)
            if self.local:
                self._checkpoint.committed(token, state)
            else:
                servers.call_all(handlers.commit_save, [(t, state) for _, _, t in replies])
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            self._save_failed = True
            raise
        self._save_failed = False

    def load_persistables(self, dirname: str) -> None:
        """Loads a checkpoint written by save_persistables (any server count):
        sparse rows and their optimizer state, dense parameters, and (local
        mode, or on servers that run the optimizer) the dense optimizer's state,
        re-sharded by parameter (``checkpoint.dense_optimizer_state``). Every
        file is read and checked before anything changes.

        A PS job of several workers loads as Paddle's does: every worker calls
        it, worker 0 loads for the job between two barriers, and each worker
        then reads the loaded values (``_load_for_the_job``).

        Raises:
            FileNotFoundError: ``dirname`` has no ``meta.json``.
            CheckpointError: a file is malformed or does not fit the model
                (PS mode: each server refuses it, and the call fails naming it).
            TrainerError: (several workers) not every worker called it within
                ``FLEETFEED_PS_START_TIMEOUT``, or worker 0's load failed.
        """
        optimizer = self._require_optimizer("load_persistables()")
        meta = checkpoint.read_meta(dirname)
        if self.local:
            checkpoint.check_follows(meta, self._checkpoint.state, dirname)
            checkpoint.check_dense_shapes(meta, self.params, dirname)
            values = checkpoint.dense_values(dirname, meta)
            optimizer_state = checkpoint.dense_optimizer_state(
                dirname, meta, optimizer, who="local load_persistables"
            )
            files = table_files.read_tables(
                dirname, meta, self._local_tables("load_persistables()")
            )
            exact = self._checkpoint.loads_exactly(meta)
            # Everything is checked: from here on nothing is refused.
            table_files.load_tables(files)
            with torch.no_grad():
                for i, p in enumerate(self.params):
                    p.copy_(values[i])
            if optimizer_state is not None:
                optimizer.load_state_dict(optimizer_state)
            self._checkpoint.loaded(meta, self.params, exact)
            return
        servers = self._connected()
        self.training.settle()
        if self.role.worker_num > 1:
            self._load_for_the_job(servers, dirname, meta)
        else:
            self._load_on_servers(servers, dirname, meta)
        copy_dense(self.params, servers.call_all(handlers.pull_dense))
        self.training.reloaded()

    def _load_for_the_job(self, servers: Any, dirname: str, meta: dict[str, Any]) -> None:
        """Paddle's order: a barrier, worker 0 loads, a barrier. A load by every
        worker would be a race: a late worker's base would undo the first
        steps of the others, and its delta would be refused (the servers are
        past it). The other workers learn that the load landed from the
        servers' count of loads, which went up on every server."""
        loads = [info.get("loads") for info in servers.call_all(handlers.describe)]
        self._meet_for_load(dirname)
        if self.role.index == 0:
            try:
                self._load_on_servers(servers, dirname, meta)
            except BaseException:
                try:  # the others learn of the failure from the servers' counts
                    self._meet_for_load(dirname)
                except Exception:  # noqa: BLE001 - worker 0's own error is the one to raise
                    log.warning("load_persistables(%s): the other workers did not meet "
                                "worker 0 after its failed load", dirname)
                raise
            self._meet_for_load(dirname)
            return
        self._meet_for_load(dirname)
        after = [info.get("loads") for info in servers.call_all(handlers.describe)]
        if any(now == before for now, before in zip(after, loads, strict=True)):
            raise TrainerError(
                f"load_persistables({dirname!r}) on worker {self.role.index}: worker 0's "
                "load of it did not reach every server (worker 0 raised why); this "
                "worker's model is as it was"
            )

    def _meet_for_load(self, dirname: str) -> None:
        try:
            self._meet_the_others()
        except ServerUnavailableError as error:
            raise TrainerError(
                f"load_persistables({dirname!r}) on worker {self.role.index}: not every "
                "worker reached it: in a parameter-server job of several workers every "
                f"worker calls load_persistables, as in Paddle (worker 0 loads) ({error})"
            ) from error

    def _load_on_servers(self, servers: Any, dirname: str, meta: dict[str, Any]) -> None:
        """Every server loads its part of the checkpoint, or none does."""
        if meta["kind"] == "delta":
            # Checked here, before any server loads: a delta some servers took
            # and others refused would leave the tables mixed.
            states = {info.get("checkpoint_state") for info in servers.call_all(handlers.describe)}
            if len(states) > 1:
                raise CheckpointError(
                    f"checkpoint {dirname!r} is a delta, but the servers' rows are at "
                    f"different checkpoints ({sorted(map(str, states))}): load a base first",
                    path=dirname,
                )
            checkpoint.check_follows(meta, states.pop(), dirname)
        try:
            servers.call_all(handlers.load, [(os.path.abspath(dirname),)] * len(servers),
                             timeout=transport.start_timeout())
        except ServerCallError as error:
            # Every server reads and checks every file before it changes
            # anything: a refused checkpoint is refused by all, and none changed.
            if error.remote_type != "CheckpointError":
                raise
            raise CheckpointError(str(error), path=dirname) from error


def model_configs(
    params: list[torch.Tensor], model: torch.nn.Module | None = None
) -> dict[str, TableConfig]:
    """The sparse tables an optimizer over ``params`` trains, by name (sorted):
    those of ``model``'s SparseEmbedding modules, or (``model`` None) of the
    outermost modules holding ``params`` (``tables.models_holding``), never
    those of another model alive in the process.

    Raises:
        TypeError: ``model`` is not a ``torch.nn.Module``.
        TrainerError: ``model`` is None and no module holds any of ``params``
            (e.g. a model of SparseEmbedding modules only, trained with a
            placeholder parameter): which tables are the model's is unknown.
    """
    if model is not None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(
                f"model must be the torch.nn.Module holding the SparseEmbedding modules, "
                f"got {type(model).__name__}"
            )
        models = [model]
    else:
        models = tables.models_holding(params)
    if not models:
        shapes = [list(p.shape) for p in params[:4]] + (["..."] if len(params) > 4 else [])
        found = f"{len(params)} parameter{'' if len(params) == 1 else 's'} (shapes {shapes})"
        raise TrainerError(
            f"distributed_optimizer: expected the optimizer's parameters to belong to the "
            f"model (a torch.nn.Module holding its SparseEmbedding modules), found {found} "
            f"in no module; build the optimizer from model.parameters(), or name the "
            f"model: fleet.distributed_optimizer(optimizer, model=model)"
        )
    configs: dict[str, TableConfig] = {}
    for each in models:
        configs.update(tables.model_tables(each))
    return dict(sorted(configs.items()))


def load_local(model: torch.nn.Module, dirname: str) -> None:
    """Loads a checkpoint into a local model (inference, no fleet needed).

    Dense parameters go into ``model.parameters()`` in order (the order of the
    optimizer that trained it, when it was built from ``model.parameters()``);
    the model's SparseEmbedding tables get every saved row. Every file is read
    and checked before the model or a table changes.

    Raises:
        FileNotFoundError: ``dirname`` holds no ``meta.json``.
        CheckpointError: a file is malformed, or does not fit the model
            (the model and its tables are left as they were).
    """
    meta = checkpoint.read_meta(dirname)
    params = list(model.parameters())
    checkpoint.check_dense_shapes(meta, params, dirname)
    values = checkpoint.dense_values(dirname, meta)
    store = stores.local_store()
    own_tables = {name: store.table(c) for name, c in tables.model_tables(model).items()}
    files = table_files.read_tables(dirname, meta, own_tables)
    with torch.no_grad():
        for i, p in enumerate(params):
            p.copy_(values[i])
    table_files.load_tables(files)
