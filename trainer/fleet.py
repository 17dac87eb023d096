"""The fleet API: module-level functions of one ``Fleet`` object, as Paddle's ``fleet``.

``from trainer import fleet``, then ``fleet.init()``, ``fleet.is_server()``,
``fleet.distributed_optimizer(opt)``, ... (reference §5.1). Three modes:

- parameter server (``fleet.init()`` with Paddle's PS environment, as set by
  ``fleetrun --server_num=1 --worker_num=2``): the calls that concern servers and
  workers go to ``trainer.ps.ParameterServerRuntime``;
- collective (``fleet.init(is_collective=True)`` under ``fleetrun
  --nproc_per_node=N`` or torchrun): a ``torch.distributed`` process group,
  ``distributed_model`` wraps the model in ``DistributedDataParallel``;
- non-distributed fallback (no role environment): one local worker;
  ``init_worker``/``stop_worker``/``init_server``/``run_server`` do nothing but
  log a line (Paddle warns), so the same script runs on a laptop.

The classes Paddle code reaches through its ``fleet`` module are here too:
``fleet.DistributedStrategy``, ``fleet.StrategyFactory`` (Paddle 1.x),
``fleet.PaddleCloudRoleMaker``, ``fleet.UserDefinedRoleMaker``, ``fleet.Role``,
``fleet.MultiSlotDataGenerator`` and ``fleet.MultiSlotStringDataGenerator``;
``fleet.util`` and ``fleet.metrics`` (``trainer.metrics.FleetMetrics``: metrics
reduced over every worker).
"""

from __future__ import annotations

import copy
import json
import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .job import restart
from .job.errors import TrainerError
from .job.role import ClusterRole, Role
from .job.role_maker import PaddleCloudRoleMaker, RoleMakerBase, UserDefinedRoleMaker
from .job.strategy import DistributedStrategy, StrategyFactory
from .metrics import FleetMetrics

if TYPE_CHECKING:  # loaded on first use (the module's __getattr__)
    from generators import MultiSlotDataGenerator, MultiSlotStringDataGenerator

__all__ = [
    "DistributedStrategy",
    "Fleet",
    "FleetUtil",
    "MultiSlotDataGenerator",
    "MultiSlotStringDataGenerator",
    "PaddleCloudRoleMaker",
    "Role",
    "StrategyFactory",
    "UserDefinedRoleMaker",
    "UtilBase",
    "barrier_worker",
    "current",
    "distributed_model",
    "distributed_optimizer",
    "init",
    "init_server",
    "init_worker",
    "is_first_worker",
    "is_server",
    "is_worker",
    "load_dataset_state",
    "load_persistables",
    "metrics",
    "run_server",
    "save_persistables",
    "server_endpoints",
    "server_index",
    "server_num",
    "set_pass",
    "shrink",
    "table_stats",
    "stop_worker",
    "util",
    "worker_endpoints",
    "worker_group",
    "worker_index",
    "worker_num",
]

logger = logging.getLogger("trainer.fleet")

DEFAULT_COLLECTIVE_TIMEOUT = 300.0
# Every worker's dataset state_dict(), beside the model (save_persistables(dataset=)).
DATASET_STATE_FILE = "dataset_state.json"


class Fleet:
    """The state behind the module-level functions; one per process (``current()``)."""

    def __init__(self) -> None:
        self._role_maker: RoleMakerBase | None = None
        self._role: ClusterRole | None = None
        self._strategy = DistributedStrategy()
        self._runtime: Any = None
        self.optimizer: Any = None
        self.model: Any = None
        self._timeout = DEFAULT_COLLECTIVE_TIMEOUT
        # PS mode: whether this worker joined the workers' own gloo group.
        self._ps_worker_group = False

    # -- init --------------------------------------------------------------------------

    def init(
        self,
        role_maker: RoleMakerBase | None = None,
        is_collective: bool = False,
        strategy: DistributedStrategy | None = None,
        *,
        timeout: float = DEFAULT_COLLECTIVE_TIMEOUT,
    ) -> None:
        """Works out this process's role and, in collective mode, joins the group.

        Args:
            role_maker: default ``PaddleCloudRoleMaker(is_collective)``.
            is_collective: a collective job (ignored when ``role_maker`` is given:
                the role maker says).
            strategy: default ``DistributedStrategy()``.
            timeout: seconds for the collective rendezvous and every collective
                call (fleetfeed's; Paddle waits for hours).

        Raises:
            TypeError: arguments of the wrong type.
            RoleError: the role environment is missing or malformed.
            WorkerFailedError: the collective group did not form in time.
        """
        if not isinstance(is_collective, bool):
            raise TypeError(
                f"is_collective must be a bool, got {is_collective!r} "
                f"({type(is_collective).__name__})"
            )
        if role_maker is None:
            role_maker = PaddleCloudRoleMaker(is_collective=is_collective)
        elif not isinstance(role_maker, RoleMakerBase):
            raise TypeError(
                f"role_maker must be a trainer role maker (PaddleCloudRoleMaker, "
                f"UserDefinedRoleMaker), got {type(role_maker).__name__}"
            )
        strategy = DistributedStrategy() if strategy is None else _checked(strategy)
        self._shutdown_collective()
        role = role_maker.generate_role()
        self._role_maker, self._role, self._strategy = role_maker, role, strategy
        self._timeout = timeout
        self._runtime, self.optimizer, self.model = None, None, None
        if role.is_collective and role.distributed:
            from .collective import process_group as collective

            assert role_maker.master_endpoint is not None  # set by every collective role
            collective.init_collective(
                role.index, role.worker_num, role_maker.master_endpoint,
                timeout=timeout, local_rank=role_maker.local_rank, job_key=role.job_secret,
            )
        logger.info("fleet.init: %s", role)

    def _shutdown_collective(self, wait_for_peers: bool = False) -> None:
        role = self._role
        collective_job = role is not None and role.is_collective and role.distributed
        if collective_job or self._ps_worker_group:
            from .collective import process_group as collective

            self._ps_worker_group = False
            collective.destroy(wait_for_peers)

    def worker_group(self) -> bool:
        """Makes sure the workers share a ``torch.distributed`` process group.

        Dataset collectives (``global_shuffle``, ``get_memory_data_size(fleet)``)
        and ``fleet.util.all_reduce`` run over the default process group. A
        collective job has one from ``init``. In a PS job the workers have none
        (they talk to the servers over the PS transport), so the first call forms a gloo group of
        the workers alone, with worker 0's endpoint as the rendezvous; every
        worker must make the call (each of those operations is collective
        anyway). ``stop_worker`` leaves it.

        Returns:
            True when there is a group of several workers, False for one worker.

        Raises:
            TrainerError: called on a server, or the role lacks the workers'
                endpoints.
            WorkerFailedError: the group did not form within ``init``'s timeout.
        """
        role = self.role
        if role.is_server:
            raise TrainerError(
                f"server {role.index}: worker_group() is for workers; servers take no "
                "part in dataset collectives"
            )
        if not role.distributed or role.worker_num <= 1:
            return False
        if role.is_collective or self._ps_worker_group:
            return True
        if len(role.worker_endpoints) != role.worker_num:
            raise TrainerError(
                f"worker {role.index}: forming the workers' process group needs one "
                f"endpoint per worker ({role.worker_num}), found {list(role.worker_endpoints)}; "
                "fleetrun sets PADDLE_TRAINER_ENDPOINTS, a UserDefinedRoleMaker takes "
                "worker_endpoints="
            )
        from .collective import process_group as collective

        collective.init_collective(
            role.index, role.worker_num, role.worker_endpoints[0],
            timeout=self._timeout, backend="gloo", job_key=role.job_secret,
        )
        self._ps_worker_group = True
        return True

    @property
    def role(self) -> ClusterRole:
        """This process's role (``TrainerError`` before ``fleet.init()``)."""
        if self._role is None:
            raise TrainerError("fleet.init() has not been called")
        return self._role

    @property
    def _ps_mode(self) -> bool:
        return not self.role.is_collective and self.role.distributed

    def _get_runtime(self) -> Any:
        """The parameter-server runtime, created on first use with the strategy then
        in force (``trainer.ps`` is imported only here)."""
        if self._runtime is None:
            from .ps import ParameterServerRuntime

            self._runtime = ParameterServerRuntime(self.role, self._strategy)
        return self._runtime

    def _local_note(self, what: str) -> None:
        # The same script runs locally by design: INFO there. In a collective job
        # a PS call is more likely a mistake: WARNING.
        if self.role.is_collective and self.role.distributed:
            logger.warning("%s() does nothing in collective fleet mode", what)
        else:
            logger.info("%s() does nothing in non-distributed fleet mode", what)

    # -- role queries ------------------------------------------------------------------

    def is_worker(self) -> bool:
        """Whether this process is a worker (trainer)."""
        return self.role.is_worker

    def is_server(self) -> bool:
        """Whether this process is a parameter server."""
        return self.role.is_server

    def is_first_worker(self) -> bool:
        """Whether this process is worker 0 (the one that saves and prints)."""
        return self.role.is_worker and self.role.index == 0

    def worker_index(self) -> int:
        """This worker's index (Paddle returns the process's own index, also on a server)."""
        return self.role.index

    def server_index(self) -> int:
        """This server's index (Paddle returns the process's own index, also on a
        worker)."""
        return self.role.index

    def worker_num(self) -> int:
        """The number of workers in the job (1 in a local run)."""
        return self.role.worker_num

    def server_num(self) -> int:
        """The number of parameter servers (0 in a collective or local job)."""
        return self.role.server_num

    def worker_endpoints(self, to_string: bool = False) -> list[str] | str:
        """The workers' ``ip:port`` endpoints, as a list or (``to_string``) joined by
        commas."""
        endpoints = list(self.role.worker_endpoints)
        return ",".join(endpoints) if to_string else endpoints

    def server_endpoints(self, to_string: bool = False) -> list[str] | str:
        """The servers' ``ip:port`` endpoints, as a list or (``to_string``) joined by
        commas."""
        endpoints = list(self.role.server_endpoints)
        return ",".join(endpoints) if to_string else endpoints

    # -- runtime -----------------------------------------------------------------------

    def init_worker(self) -> None:
        """PS mode: connects this worker to the servers; elsewhere it does nothing."""
        if not self._ps_mode:
            return self._local_note("init_worker")
        self._get_runtime().init_worker()

    def init_server(self, model_dir: str | None = None) -> None:
        """PS mode: creates this server's tables (loaded from ``model_dir`` if given);
        elsewhere it does nothing."""
        if not self._ps_mode:
            return self._local_note("init_server")
        self._get_runtime().init_server(model_dir)

    def run_server(self) -> None:
        """PS mode: serves until every worker has called ``stop_worker()``; elsewhere
        it does nothing."""
        if not self._ps_mode:
            return self._local_note("run_server")
        self._get_runtime().run_server()

    def stop_worker(self) -> None:
        """PS mode: tells the servers this worker is done. Collective mode: waits
        for every rank (bounded by the group's timeout), then leaves the process
        group. Otherwise nothing."""
        if self._ps_mode:
            self._get_runtime().stop_worker()
            self._shutdown_collective(wait_for_peers=True)
        elif self.role.is_collective and self.role.distributed:
            self._shutdown_collective(wait_for_peers=True)
            self.model = None  # its DistributedDataParallel wrapper is dead now
        else:
            self._local_note("stop_worker")

    def barrier_worker(self) -> None:
        """Waits until every worker arrives (a no-op with one local worker).
        PS mode: each worker first sends what it has not sent (GEO: its steps
        since the last sync), so every update made before the barrier is on
        the servers after it."""
        if self._ps_mode:
            self._get_runtime().barrier_worker()
        elif self.role.is_collective and self.role.distributed:
            from .collective import process_group as collective

            collective.barrier()

    def distributed_optimizer(
        self, optimizer: Any, strategy: DistributedStrategy | None = None, *, model: Any = None
    ) -> Any:
        """Wraps ``optimizer`` for the job's mode and returns what to call ``step()`` on.

        PS mode: the runtime's optimizer (its ``step()`` pushes sparse and dense
        gradients); servers call this too, which is how they learn the model.
        Collective mode: a ``CollectiveOptimizer``, whose ``step()`` (and
        ``minimize(loss)``) averages the gradients of the replicated parameters
        over the ranks, with or without ``distributed_model``, and starts every
        rank from rank 0's parameters; ``is_distributed`` shards are left alone
        (trainer/collective/data_parallel.py). Non-distributed: the PS runtime's local mode
        (its ``step()`` also updates the in-process sparse tables).

        The sparse tables are those of the model holding the optimizer's
        parameters, not every SparseEmbedding alive in the process.

        Args:
            strategy: replaces the strategy given to ``init``.
            model: the ``torch.nn.Module`` whose SparseEmbedding tables the job
                trains (PS and local mode); needed only when no module holds the
                optimizer's parameters (SparseEmbedding modules and a placeholder).
        """
        if strategy is not None:
            strategy = _checked(strategy)
            if self._runtime is not None:
                raise TrainerError(
                    "distributed_optimizer(strategy=...) after the parameter-server "
                    "runtime started: give the strategy to the first call or to init()"
                )
            if self.role.is_collective:
                logger.warning("the strategy given to distributed_optimizer replaces init()'s")
            self._strategy = strategy
        if self._ps_mode or (not self.role.is_collective and _ps_available()):  # PS or local
            wrapped = self._get_runtime().distributed_optimizer(optimizer, model)
        elif self.role.is_collective and self.role.distributed:
            # Paddle's minimize() inserts the gradient all-reduce: so does this
            # step(), with or without distributed_model.
            from .collective.data_parallel import CollectiveOptimizer

            is_wrapped = isinstance(optimizer, CollectiveOptimizer)
            wrapped = optimizer if is_wrapped else CollectiveOptimizer(optimizer, model)
        else:
            wrapped = optimizer
        self.optimizer = wrapped
        return wrapped

    def distributed_model(self, model: Any) -> Any:
        """Collective mode: ``DistributedDataParallel(model)``, which neither
        broadcasts nor averages the parameters marked ``is_distributed=True``
        (model-parallel shards); otherwise ``model``."""
        self.model = model
        if self.role.is_collective and self.role.distributed:
            from .collective import data_parallel

            wrapped = data_parallel.distributed_model(
                model, find_unused_parameters=self._strategy.find_unused_parameters
            )
            self.model = wrapped
            return wrapped
        return model

    def save_persistables(
        self, dirname: str, model: Any = None, dataset: Any = None, **kwargs: Any
    ) -> None:
        """Saves what a job needs to continue.

        PS mode, and the local mode after ``distributed_optimizer`` (no ``model``
        given): the sparse tables (shards) of the optimizer's model and the dense
        parameters, through the parameter-server runtime. Otherwise ``model``'s
        ``state_dict`` (default: the model given to ``distributed_model``) in
        ``dirname/model.pt``, by the first worker (a PS delta: worker 0's too).

        With ``dataset`` (an InMemoryDataset or QueueDataset), one call
        checkpoints the whole job: every worker must then make it; each first
        sends what it has not sent to the servers (GEO: its pending deltas),
        their datasets' ``state_dict()`` are gathered to the first worker, which
        writes them to ``dirname/dataset_state.json`` (PS: in the same atomic
        checkpoint as the model; else naming ``model.pt``'s digest, so that a
        torn pair is refused), and no worker returns before it is complete.
        ``load_persistables`` / ``load_dataset_state`` with a dataset resume
        each worker where it was.
        Under ``fleetrun --max_restarts`` the first worker then records
        ``dirname`` as the checkpoint a restart resumes from (docs/restarts.md);
        a save without ``dataset``, or a delta, is never recorded.

        ``mode`` (PS runtime): 0 base, 1 delta (docs/table_lifecycle.md); executor= ignored.
        """
        _ignore_paddle_kwargs("save_persistables", kwargs)
        states = None
        if dataset is not None:
            if self._ps_mode:  # the checkpoint holds every update of the batches counted
                self._get_runtime().finish_steps()
            states = self._gather_dataset_states(dataset)
        if self._ps_mode or (self._runtime is not None and model is None):
            if dataset is None or self.is_first_worker():
                from datafeed.iterate.state import worker_states_file

                extra = {} if states is None else {DATASET_STATE_FILE: worker_states_file(states)}
                self._get_runtime().save_persistables(dirname, extra, kwargs.get("mode", 0))
        elif self.is_first_worker():
            _local_persistables("save", dirname, self._target_model(model), states)
        # Only a full save with the workers' positions can resume a job: from a
        # delta, or without positions, a restart would lose or repeat records.
        if self.is_first_worker() and dataset is not None and kwargs.get("mode", 0) in (0, "base"):
            restart.record_checkpoint(dirname)
        if dataset is not None:
            self.barrier_worker()  # nobody goes on with a half-written checkpoint

    def load_persistables(
        self, dirname: str, model: Any = None, dataset: Any = None, **kwargs: Any
    ) -> None:
        """Loads what ``save_persistables`` wrote (PS mode: through the runtime).

        A PS job of several workers: every worker calls it, worker 0 loads (as in Paddle).
        With ``dataset``, also this worker's dataset position (see
        ``load_dataset_state``, which says what it raises); every worker must
        then make the call.
        """
        _ignore_paddle_kwargs("load_persistables", kwargs)
        if self._ps_mode or (self._runtime is not None and model is None):
            self._get_runtime().load_persistables(dirname)
        else:
            _local_persistables("load", dirname, self._target_model(model))
        if dataset is not None:
            self.load_dataset_state(dataset, dirname)

    # The sparse-table lifecycle (docs/table_lifecycle.md): each call goes to the
    # parameter-server runtime, which works on the optimizer's model's tables: in
    # this process in local mode, on every server in a PS job (trainer.ps.lifecycle).

    def _table_runtime(self, what: str) -> Any:
        if self.role.is_collective and self.role.distributed:
            raise TrainerError(
                f"fleet.{what}() concerns SparseEmbedding tables, which a collective job "
                f"does not have (they live in a parameter-server job, or in local mode)"
            )
        return self._get_runtime()

    def set_pass(self, pass_id: int) -> None:
        """Starts pass (day) ``pass_id`` of every sparse table: rows pulled from
        now on were seen in it; ``shrink`` counts unseen passes from it. Passes
        only go forward; setting the current one again does nothing, so every
        worker may call it with the same number (PS mode: every server's
        tables; each server logs their rows and bytes).

        Raises:
            ValueError: ``pass_id`` is before the current pass.
        """
        self._table_runtime("set_pass").set_pass(pass_id)

    def shrink(self) -> dict[str, dict[str, int]]:
        """Paddle's ``fleet.shrink()``: every sparse table, on every server,
        decays its rows' show and click and drops the rows its
        ``CtrAccessorParam`` rule selects: worker 0 does (another worker's call
        returns ``{}``, as in Paddle). Returns name -> ``{"dropped", "kept"}``."""
        return self._table_runtime("shrink").shrink()

    def table_stats(self) -> dict[str, dict[str, int]]:
        """Per sparse table, summed over the servers: ``rows``, ``pending``
        (ids waiting for admission), ``bytes`` (memory held), ``evicted`` (by
        its ``max_rows`` budget, in all), ``max_rows``, ``pass`` and
        ``servers``."""
        return self._table_runtime("table_stats").table_stats()

    def load_dataset_state(self, dataset: Any, dirname: str | None = None) -> bool:
        """Puts ``dataset`` (loaded with the same files, not yet shuffled) where
        this worker's was when ``save_persistables(dirname, dataset=...)`` ran:
        its next pass trains only the records it had not trained then. Every
        worker must make the call (a global shuffle is replayed among them).

        Args:
            dirname: the checkpoint; None: the one fleetrun restarts the job
                from (``FLEETFEED_RESUME_DIR``), if any.

        Returns:
            Whether a position was loaded (False: ``dirname`` is None and the
            job is not a restart; ``dataset`` is left as it was).

        Raises:
            FileNotFoundError: ``dirname`` holds no dataset state.
            ValueError: the dataset state was saved by another number of workers,
                or does not fit the dataset.
        """
        dirname = dirname if dirname is not None else restart.resume_dir()
        if dirname is None:
            return False
        path = os.path.join(dirname, DATASET_STATE_FILE)
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"worker {self.worker_index()}: {path} does not exist; the checkpoint "
                "was saved without a dataset"
            )
        from datafeed.iterate.state import read_worker_states

        model_path = os.path.join(dirname, "model.pt")  # a local checkpoint's model
        states = read_worker_states(path, model_path if os.path.exists(model_path) else None)
        if len(states) != self.worker_num():
            raise ValueError(
                f"worker {self.worker_index()}: {path} holds the dataset states of "
                f"{len(states)} workers, this job has {self.worker_num()}"
            )
        self.worker_group()  # a replayed global shuffle runs among the workers
        dataset.load_state_dict(states[self.worker_index()])
        return True

    def _gather_dataset_states(self, dataset: Any) -> list[dict[str, Any]]:
        """Every worker's ``dataset.state_dict()``, in worker order (JSON on the wire)."""
        if not callable(getattr(dataset, "state_dict", None)):
            raise TypeError(
                f"dataset must be an InMemoryDataset or QueueDataset, got {type(dataset).__name__}"
            )
        mine = json.dumps(dataset.state_dict()).encode()
        if not self.worker_group():
            return [json.loads(mine)]
        from .collective import process_group as collective

        return [json.loads(part) for part in collective.all_gather_bytes(mine)]

    def _target_model(self, model: Any) -> Any:
        target = model if model is not None else self.model
        return getattr(target, "module", target)  # unwrap DistributedDataParallel

    @property
    def strategy(self) -> DistributedStrategy:
        """The strategy in force (from ``init`` or ``distributed_optimizer``)."""
        return self._strategy


class UtilBase:
    """Paddle's ``fleet.util``: small collective helpers among the workers."""

    def __init__(self, owner: Fleet) -> None:
        self._fleet = owner

    def all_reduce(self, input: Any, mode: str = "sum", comm_world: str = "worker") -> Any:
        """Reduces ``input`` (number, numpy array or tensor) over the workers:
        ``mode`` is sum, mean, max or min. Returns a tensor for a tensor, a
        numpy array for an array or a list, a number for a number.

        A ``torch.distributed`` all-reduce over the workers (in PS mode over the
        workers' own group, see ``Fleet.worker_group``). One local worker: the
        input itself.
        """
        import numpy as np
        import torch

        if comm_world != "worker":
            raise ValueError(f"comm_world must be 'worker', got {comm_world!r}")
        role = self._fleet.role
        if role.worker_num == 1 and not role.distributed:
            return input
        from .collective import process_group as collective

        self._fleet.worker_group()  # PS mode: the workers' own group, formed on first use
        tensor = input if isinstance(input, torch.Tensor) else torch.as_tensor(np.asarray(input))
        result = collective.all_reduce_tensor(tensor, mode)
        if isinstance(input, torch.Tensor):
            return result
        if isinstance(input, (np.ndarray, list, tuple)):
            return result.numpy()  # Paddle returns a numpy array for sequences too
        return result.item()

    def barrier(self, comm_world: str = "worker") -> None:
        """Waits until every worker reaches this call (``fleet.barrier_worker()``)."""
        self._fleet.barrier_worker()

    def get_file_shard(self, files: Sequence[str]) -> list[str]:
        """This worker's share of ``files``: contiguous blocks, the first
        ``len(files) % worker_num`` workers taking one more (Paddle's split)."""
        if not isinstance(files, (list, tuple)):
            raise TypeError(f"files must be a list of paths, got {type(files).__name__}")
        workers, index = self._fleet.worker_num(), self._fleet.worker_index()
        block, remainder = divmod(len(files), workers)
        begin = index * block + min(index, remainder)
        return list(files[begin : begin + block + (1 if index < remainder else 0)])


def _ignore_paddle_kwargs(what: str, kwargs: dict[str, Any]) -> None:
    unknown = set(kwargs) - {"executor", "main_program", "mode"}
    if unknown:
        raise TypeError(f"{what}() got unexpected keyword arguments {sorted(unknown)}")


def _ps_available() -> bool:
    """Whether ``trainer.ps`` (the parameter-server runtime) can be imported."""
    try:
        import trainer.ps  # noqa: F401
    except ImportError:
        return False
    return True


def _checked(strategy: Any) -> DistributedStrategy:
    if not isinstance(strategy, DistributedStrategy):
        raise TypeError(f"strategy must be a DistributedStrategy, got {type(strategy).__name__}")
    return copy.deepcopy(strategy)  # as Paddle's: the caller's later changes change nothing


def _local_persistables(
    action: str, dirname: str, model: Any, states: list[Any] | None = None
) -> None:
    import io

    import torch

    path = os.path.join(dirname, "model.pt")
    if model is None:
        raise TrainerError(
            f"{action}_persistables needs the model outside PS mode: pass model=..., "
            "or give it to fleet.distributed_model first"
        )
    if action == "save":
        from datafeed.iterate.state import worker_states_file
        from datafeed.source.fs import write_atomically  # pyarrow: not at import trainer

        buffer = io.BytesIO()
        torch.save(model.state_dict(), buffer)
        os.makedirs(dirname, exist_ok=True)
        if states is not None:  # the positions name the model: a torn pair is refused
            write_atomically(os.path.join(dirname, DATASET_STATE_FILE),
                             worker_states_file(states, buffer.getvalue()))
        write_atomically(path, buffer.getvalue())
    else:
        if not os.path.exists(path):
            raise FileNotFoundError(f"load_persistables: {path} does not exist")
        model.load_state_dict(torch.load(path, weights_only=True))


class FleetUtil:
    """Paddle's ``FleetUtil`` (``paddle.incubate.distributed.fleet.fleet_util``):
    the online loop's passes and done files, as PaddleRec's online trainer calls
    them (trainer/loop/online.py says what each writes). Worker 0 writes a done
    file and every worker of a distributed job then waits for it
    (``barrier_worker``), as in Paddle; ``hadoop_*`` arguments are accepted for
    Paddle's signatures (paths are URIs or local, through ``pyarrow.fs``)."""

    def __init__(self, mode: str = "pscore") -> None:
        self.mode = mode

    @staticmethod
    def get_online_pass_interval(
        days: Any, hours: Any, split_interval: Any, split_per_pass: Any,
        is_data_hourly_placed: bool,
    ) -> list[list[str]]:
        """A day's passes, each the folder names of its slices."""
        from .loop import online

        return online.online_pass_interval(
            days, hours, split_interval, split_per_pass, is_data_hourly_placed
        )

    def write_model_donefile(
        self, output_path: str, day: Any, pass_id: Any, xbox_base_key: Any,
        hadoop_fs_name: str = "", hadoop_fs_ugi: str = "", hadoop_home: str = "$HADOOP_HOME",
        donefile_name: str = "donefile.txt",
    ) -> None:
        """Lists a completed save in ``output_path/donefile_name`` (once)."""
        from .loop import online

        path = _paddle_path(output_path, hadoop_fs_name)
        self._on_worker_0(lambda: online.write_model_donefile(
            path, day, pass_id, xbox_base_key, donefile_name))

    def write_xbox_donefile(
        self, output_path: str, day: Any, pass_id: Any, xbox_base_key: Any, data_path: Any,
        hadoop_fs_name: str = "", hadoop_fs_ugi: str = "", monitor_data: Any = None,
        hadoop_home: str = "$HADOOP_HOME", donefile_name: str | None = None,
    ) -> None:
        """Lists a completed delta (or, for pass -1, base) for the serving side (once)."""
        from .loop import online

        workers = worker_num() if _FLEET._role is not None else 1
        path = _paddle_path(output_path, hadoop_fs_name)
        self._on_worker_0(lambda: online.write_xbox_donefile(
            path, day, pass_id, xbox_base_key, data_path, fs_name=hadoop_fs_name,
            worker_num=workers, donefile_name=donefile_name,
            job_id=os.environ.get("JOB_ID", "")))

    @staticmethod
    def get_last_save_model(
        output_path: str, hadoop_fs_name: str = "", hadoop_fs_ugi: str = "",
        hadoop_home: str = "$HADOOP_HOME",
    ) -> list[Any]:
        """``[day, pass_id, model_path, xbox_base_key]`` of the last listed save;
        Paddle's ``[-1, -1, "", <now>]`` when none."""
        from .loop import online

        day, pass_id, path, key = online.last_saved_model(
            _paddle_path(output_path, hadoop_fs_name))
        if day == -1:
            import time

            return [-1, -1, "", int(time.time())]
        return [day, pass_id, path, key]

    @staticmethod
    def _on_worker_0(write: Any) -> None:
        role = _FLEET._role
        if role is None or not role.distributed:
            write()
            return
        if role.is_worker and role.index == 0:
            write()
        _FLEET.barrier_worker()


def _paddle_path(path: str, fs_name: str) -> str:
    """Paddle's done-file paths: a path on ``hadoop_fs_name`` ("hdfs://nn:9000")
    as a URI (``hdfs:/x`` or ``/x`` on it); a URI or, without a file system
    name, a local path as it is."""
    if "://" in path:
        return path
    bare = path.split(":", 1)[1] if path.startswith(("hdfs:", "afs:")) else path
    if fs_name:
        return fs_name.rstrip("/") + "/" + bare.lstrip("/")
    if bare != path:
        raise ValueError(
            f"{path!r} is a path on a Hadoop file system, but hadoop_fs_name is empty: "
            "give the file system's name (hdfs://namenode:port), or a full URI"
        )
    return path


_FLEET = Fleet()
util = UtilBase(_FLEET)
metrics = FleetMetrics(util)


def current() -> Fleet:
    """This process's ``Fleet``, the object behind the module-level functions: its
    ``optimizer`` and ``model`` are what ``distributed_optimizer`` and
    ``distributed_model`` last returned."""
    return _FLEET


def __getattr__(name: str) -> Any:
    # Paddle's fleet module carries the generator base classes (PaddleRec's
    # reader.py subclasses fleet.MultiSlotDataGenerator): loaded on first use,
    # so a training process never loads the generators' compiled formatter.
    if name in ("MultiSlotDataGenerator", "MultiSlotStringDataGenerator"):
        import generators

        return getattr(generators, name)
    raise AttributeError(f"module 'trainer.fleet' has no attribute {name!r}")


init = _FLEET.init
is_worker = _FLEET.is_worker
is_server = _FLEET.is_server
is_first_worker = _FLEET.is_first_worker
worker_index = _FLEET.worker_index
worker_num = _FLEET.worker_num
server_index = _FLEET.server_index
server_num = _FLEET.server_num
worker_endpoints = _FLEET.worker_endpoints
server_endpoints = _FLEET.server_endpoints
init_worker = _FLEET.init_worker
init_server = _FLEET.init_server
run_server = _FLEET.run_server
stop_worker = _FLEET.stop_worker
barrier_worker = _FLEET.barrier_worker
distributed_optimizer = _FLEET.distributed_optimizer
distributed_model = _FLEET.distributed_model
save_persistables = _FLEET.save_persistables
load_persistables = _FLEET.load_persistables
load_dataset_state = _FLEET.load_dataset_state
worker_group = _FLEET.worker_group
set_pass = _FLEET.set_pass
shrink = _FLEET.shrink
table_stats = _FLEET.table_stats
