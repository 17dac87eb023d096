"""The worker side of the parameter server: where rows are pulled from and how a
step is pushed, per mode.

* ``RemoteStore`` (async, sync): a forward pulls its table's distinct ids from
  the servers that own them, all servers in parallel.
* ``GeoStore`` (GEO): a forward reads a local copy of the rows; a row it has not
  seen starts from its initial value. Training updates the local copy; every
  k steps the worker pushes each touched row's change since its last sync
  (delta) and takes the servers' merged value back.
* ``DistributedOptimizer``: what ``fleet.distributed_optimizer`` returns; its
  ``step()`` does the mode's push.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ..embedding import stores
from ..embedding.pending import merge_gradients
from ..embedding.tables import TableConfig
from ..loop.dense_update import clear_grads
from . import server as handlers
from .placement import dense_owners
from .tables.table import SparseTable, as_u64, shard_of
from .transport import ServerSet


def split_by_server(ids: np.ndarray, server_num: int) -> list[np.ndarray]:
    """Positions of ``ids`` owned by each server."""
    if server_num == 1:
        return [np.arange(ids.shape[0])]
    owners = shard_of(ids, server_num)
    return [np.flatnonzero(owners == s) for s in range(server_num)]


def _int64(ids: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(ids).view(np.int64))


class Routing:
    """One step's distinct ids of a table, split by server once: the pull sends
    each server its part, and the push of their gradients reuses the split.

    Attributes:
        ids: the distinct ids (uint64), as pulled.
        index: per server, the positions of its ids (None: it owns none; with
            one server, a single None entry stands for all of them).
        parts: per server, its ids as the int64 tensor sent (None: none).
    """

    __slots__ = ("ids", "index", "parts")

    def __init__(self, ids: np.ndarray, server_num: int) -> None:
        self.ids = ids
        if server_num == 1:
            self.index: list[torch.Tensor | None] = [None]
            self.parts: list[torch.Tensor | None] = [_int64(ids)]
            return
        positions = split_by_server(ids, server_num)
        self.index = [torch.from_numpy(p) if p.size else None for p in positions]
        self.parts = [_int64(ids[p]) if p.size else None for p in positions]

    def holds(self, ids: np.ndarray) -> bool:
        """Whether ``ids`` is the very array routed (its memory: the routing
        keeps it alive, and distinct ids are never changed in place)."""
        return ids.shape == self.ids.shape and (
            ids.__array_interface__["data"][0] == self.ids.__array_interface__["data"][0]
        )


class RemoteStore:
    """Rows pulled from the servers on every forward.

    Tables pulled with the same ids tensor in one step (wide&deep's tables
    share their ids; ``SparseEmbedding`` hands every table of one input the
    same tensor of distinct ids) are learned as a group: from the next step on,
    the first table's pull fetches the whole group in one round trip per
    server, and the others take their rows from that prefetch.

    A training pull remembers (per thread and table) how it split the ids
    among the servers: the step's push takes it back (``routing``) instead of
    hashing the ids again. With ``worker`` given, training pulls name the
    worker, so that each server reuses the row numbers it found for the
    worker's push of the same ids (``server.pull_step``).

    ``send_pull`` sends a training pull now and hands its rows later: the
    training loop sends the pulls of the batches to come (``pull_ahead``:
    None, as many batches ahead as the round trip needs; 0, none; n, n
    batches), see ``trainer.embedding.ahead``.
    """

    def __init__(
        self, servers: ServerSet, worker: int | None = None, pull_ahead: int | None = 0
    ) -> None:
        self.servers = servers
        self.worker = worker
        # Training pulls sent ahead of their forwards (trainer.embedding.ahead):
        # None: as deep as the round trip needs, 0: never, n: n batches.
        self.pull_ahead = pull_ahead
        self._followers: dict[str, tuple[TableConfig, ...]] = {}
        self._lock = threading.Lock()
        # Per thread: the last pull, prefetched rows, routings of training pulls.
        self._local = threading.local()

    def pull(self, config: TableConfig, ids: torch.Tensor, training: bool) -> torch.Tensor:
        local = self._local
        prefetched = getattr(local, "prefetched", None)
        if prefetched:
            hit = prefetched.pop(config.name, None)
            if hit is not None and hit[0] is ids and hit[1] == training:
                local.last = (config, ids)
                return hit[2]
        last = getattr(local, "last", None)
        if last is not None and last[1] is ids and last[0].name != config.name:
            lead = last[0].name
            with self._lock:
                group = self._followers.get(lead, ())
                if config.name not in {c.name for c in group}:
                    self._followers[lead] = (*group, config)
        local.last = (config, ids)
        followers = self._followers.get(config.name, ())
        rows = self._fetch((config, *followers), ids, training)
        if followers:
            local.prefetched = {
                c.name: (ids, training, r) for c, r in zip(followers, rows[1:], strict=True)
            }
        return rows[0]

    def routing(self, name: str, ids: np.ndarray) -> Routing | None:
        """The routing of this thread's last training pull of table ``name``
        if it pulled ``ids`` (the same array); taken: a step pushes once."""
        routes = getattr(self._local, "routes", None)
        route = routes.pop(name, None) if routes else None
        return route if route is not None and route.holds(ids) else None

    def _fetch(
        self, configs: Sequence[TableConfig], ids: torch.Tensor, training: bool
    ) -> list[torch.Tensor]:
        return self._send(configs, ids, training).rows()

    def send_pull(self, configs: Sequence[TableConfig], ids: torch.Tensor) -> SentPull:
        """Sends the training pull of distinct ``ids`` from each table of
        ``configs`` now; its ``rows()`` later (``trainer.embedding.ahead``)."""
        return self._send(configs, ids, training=True)

    def _send(
        self, configs: Sequence[TableConfig], ids: torch.Tensor, training: bool
    ) -> SentPull:
        names = [c.name for c in configs]
        route = Routing(as_u64(ids), len(self.servers))
        if training and self.worker is not None:
            op, lead = handlers.pull_step, (self.worker, names)
        else:
            op, lead = handlers.pull_tables, (names,)
        tail = (training,) if op is handlers.pull_tables else ()
        futures = [
            (s, index, self.servers.call_async(s, op, *lead, part, *tail))
            for s, (index, part) in enumerate(zip(route.index, route.parts, strict=True))
            if part is not None
        ]
        return SentPull(self, configs, route, op.__name__, futures, training)

    def _keep_route(self, names: Sequence[str], route: Routing) -> None:
        """This thread's push of these tables' gradients reuses ``route``."""
        routes = getattr(self._local, "routes", None)
        if routes is None:
            routes = self._local.routes = {}
        for name in names:
            routes[name] = route


class SentPull:
    """A pull sent to the servers: ``rows()`` waits for its answers (once)
    and, for a training pull, keeps its routing for the push of the
    gradients of the thread that takes the rows.

    Attributes:
        sent_at: ``time.perf_counter()`` when it was sent.
        done_at: when its last answer came, or None.
    """

    __slots__ = (
        "_futures", "_op", "_rows", "_store", "_training", "configs", "done_at", "route",
        "sent_at",
    )

    def __init__(
        self, store: RemoteStore, configs: Sequence[TableConfig], route: Routing, op: str,
        futures: list[tuple[int, torch.Tensor | None, Any]], training: bool,
    ) -> None:
        self._store = store
        self.configs = tuple(configs)
        self.route = route
        self._op = op
        self._futures = futures
        self._training = training
        self._rows: list[torch.Tensor] | None = None
        self.sent_at = time.perf_counter()
        self.done_at: float | None = None
        remaining = [len(futures)]
        lock = threading.Lock()

        def answered(_: Any) -> None:
            with lock:
                remaining[0] -= 1
                if remaining[0] == 0:
                    self.done_at = time.perf_counter()

        for _, _, future in futures:
            future.add_done_callback(answered)

    def rows(self) -> list[torch.Tensor]:
        """The rows of each table, in order (``ServerUnavailableError`` or
        ``ServerCallError`` when a server did not answer)."""
        if self._rows is not None:
            return self._rows
        servers = self._store.servers
        if len(self._futures) == 1 and self.route.index[self._futures[0][0]] is None:
            s, _, future = self._futures[0]
            outs = servers.wait(s, future, self._op)
        else:
            outs = [
                torch.empty(self.route.ids.shape[0], c.dim, dtype=torch.float32)
                for c in self.configs
            ]
            for s, index, future in self._futures:
                for out, part in zip(outs, servers.wait(s, future, self._op), strict=True):
                    out[index] = part
        if self.done_at is None:  # the waiter can wake before the future's callbacks run
            self.done_at = time.perf_counter()
        if self._training:
            self._store._keep_route([c.name for c in self.configs], self.route)
        self._rows = outs
        return outs

    def drop(self) -> None:
        """Stops waiting for the answers not come yet: the transport forgets
        their calls (a server that never answers holds nothing here)."""
        forget = getattr(self._store.servers, "forget", None)
        for _, _, future in self._futures:
            if not future.done() and forget is not None:
                forget(future)


def shard_sparse(
    gradients: dict[str, tuple[np.ndarray, torch.Tensor]], server_num: int,
    routing: Callable[[str, np.ndarray], Routing | None] | None = None,
) -> list[dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """Per server: table -> (int64 ids, values) of the rows it owns.

    ``routing(name, ids)``: the split of the pull that fetched those ids, if
    known (``RemoteStore.routing``); the others are routed here.
    """
    out: list[dict[str, tuple[torch.Tensor, torch.Tensor]]] = [{} for _ in range(server_num)]
    for name, (ids, values) in gradients.items():
        route = routing(name, ids) if routing is not None else None
        if route is None:
            route = Routing(ids, server_num)
        if server_num == 1:
            out[0][name] = (route.parts[0], values)
            continue
        for s, (index, part) in enumerate(zip(route.index, route.parts, strict=True)):
            if part is not None:
                out[s][name] = (part, values.index_select(0, index))
    return out


def shard_dense(
    values: dict[int, torch.Tensor], params: Sequence[torch.Tensor], server_num: int
) -> list[dict[int, torch.Tensor]]:
    """Per server: the dense values (by parameter index) it owns; ``params``, all
    the dense parameters in order, decide the placement (``placement.dense_owners``)."""
    out: list[dict[int, torch.Tensor]] = [{} for _ in range(server_num)]
    owners = dense_owners([p.shape for p in params], server_num)
    for i, value in values.items():
        out[owners[i]][i] = value
    return out


class _GeoTable:
    """One table's local copy on a GEO worker: the rows as trained here and,
    aligned by row number, ``base`` (the rows as of the last sync), ``ids``
    (each row's id), ``touched`` (trained since the last sync) and ``used``
    (trained since the copy was made: what a reload keeps)."""

    def __init__(self, config: TableConfig, table: SparseTable) -> None:
        if table.entry is not None or table.max_rows is not None:
            # Rows are numbered once, in order of creation, and never dropped:
            # base, ids and touched are aligned with them.
            raise ValueError(
                f"GEO table '{table.name}': a worker's local copy admits and evicts "
                f"nothing (TableConfig.make_table(..., lifecycle=False)), got entry "
                f"{table.entry!r}, max_rows {table.max_rows!r}"
            )
        self.config = config
        self.table = table
        self.base = np.zeros((0, table.dim), dtype=np.float32)
        self.ids = np.zeros(0, dtype=np.uint64)
        self.touched = np.zeros(0, dtype=bool)
        self.used = np.zeros(0, dtype=bool)

    def add_rows(self, before: int, ids: np.ndarray, rows: np.ndarray) -> None:
        """Notes the rows created since the table had ``before``: those of
        ``rows`` (the row numbers found for ``ids``) from ``before`` on."""
        after = len(self.table)
        if after == before:
            return
        # New rows are numbered in order of first appearance.
        new = rows >= before
        new_ids = np.empty(after - before, dtype=np.uint64)
        new_ids[rows[new] - before] = ids[new]
        if after > self.base.shape[0]:
            size = max(after, 2 * self.base.shape[0])
            self.base = _grown(self.base, size)
            self.ids = _grown(self.ids, size)
            self.touched = _grown(self.touched, size)
            self.used = _grown(self.used, size)
        self.base[before:after] = self.table.read_rows(np.arange(before, after))
        self.ids[before:after] = new_ids


def _grown(array: np.ndarray, size: int) -> np.ndarray:
    out = np.zeros((size, *array.shape[1:]), dtype=array.dtype)
    out[: array.shape[0]] = array
    return out


class GeoStore:
    """The worker's local copy of the rows it uses (GEO mode).

    Between syncs everything is local: a row this worker has not seen starts
    from its initial value (a function of the table's seed and the id, the
    value every server gives an unwritten row), training updates the local
    rows, and each sync pushes every touched row's change since the last sync
    and takes the servers' merged rows back (rows other workers trained reach
    this worker at its next sync after it touches them, as in Paddle's GEO).
    Evaluation (``training`` false) reads rows this worker lacks from the
    servers and creates nothing.
    """

    def __init__(
        self, servers: ServerSet, make_table: Callable[[TableConfig], SparseTable]
    ) -> None:
        self.servers = servers
        self.remote = RemoteStore(servers)
        self._make_table = make_table
        self._lock = threading.Lock()
        self._tables: dict[str, _GeoTable] = {}

    @property
    def local(self) -> dict[str, SparseTable]:
        return {name: t.table for name, t in self._tables.items()}

    def _geo(self, config: TableConfig) -> _GeoTable:
        geo = self._tables.get(config.name)
        if geo is None:
            with self._lock:
                geo = self._tables.get(config.name)
                if geo is None:
                    geo = self._tables[config.name] = _GeoTable(
                        config, self._make_table(config))
        return geo

    def pull(self, config: TableConfig, ids: torch.Tensor, training: bool) -> torch.Tensor:
        geo = self._geo(config)
        table = geo.table
        u64 = as_u64(ids)
        if not training:
            rows = table.rows(u64, create=False)
            missing = rows < 0
            out = np.empty((u64.shape[0], table.dim), dtype=np.float32)
            out[~missing] = table.read_rows(rows[~missing])
            if missing.any():
                out[missing] = self.remote.pull(config, _int64(u64[missing]), False).numpy()
            return torch.from_numpy(out)
        rows = self._create(geo, u64)
        # The step's push reuses the row numbers instead of a lookup (_rows_of).
        stores.keep_rows(table, u64, rows)
        return torch.from_numpy(table.read_rows(rows))

    def _create(self, geo: _GeoTable, ids: np.ndarray) -> np.ndarray:
        """Row numbers of ``ids``, creating absent rows (base: their initial value)."""
        with self._lock:
            before = len(geo.table)
            rows = geo.table.rows(ids, create=True)
            geo.add_rows(before, ids, rows)
        return rows

    def pull_values(
        self, config: TableConfig, values: torch.Tensor
    ) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
        """A training pull of a batch's ids as they come, repeats included, from
        the local copy (``stores.pull_batch_values``: made distinct in the same
        pass), absent rows created as ``pull`` creates them: the distinct ids,
        their rows and each value's position among them."""
        geo = self._geo(config)
        with self._lock:
            before = len(geo.table)
            pull = stores.pull_batch_values(geo.table, values)
            geo.add_rows(before, pull.pulled.ids, pull.pulled.rows)
        return pull.source, pull.values, pull.positions

    def _rows_of(self, name: str, ids: np.ndarray) -> np.ndarray:
        geo = self._tables[name]
        kept = stores.kept_rows(geo.table, ids)  # this thread's pull of these ids
        return kept if kept is not None else self._create(geo, ids)

    def push_pending(self) -> None:
        """Trains the local rows on this thread's pending gradients: at the row
        numbers of their pulls where it can (``stores.push_pulls_numbered``),
        the rest through ``apply``; notes what changed."""
        tables = dict(self._tables)
        pushed, rest = stores.push_pulls_numbered({n: g.table for n, g in tables.items()})
        if pushed:
            with self._lock:
                for name, pulled in pushed.items():
                    tables[name].touched[pulled.rows] = True
                    tables[name].used[pulled.rows] = True
        if rest:
            self.apply(merge_gradients(rest))

    def apply(self, gradients: dict[str, tuple[np.ndarray, torch.Tensor]]) -> None:
        """Trains the local rows (the table's optimizer) and notes what changed."""
        for name, (ids, grads) in gradients.items():
            rows = self._rows_of(name, ids)
            geo = self._tables[name]
            geo.table.push_rows(rows, grads)
            with self._lock:
                geo.touched[rows] = True
                geo.used[rows] = True

    def deltas(self) -> dict[str, tuple[np.ndarray, torch.Tensor]]:
        """Per table: the rows trained since the last sync and their change.
        What was sent becomes the rows' base: changes from here on are the
        next sync's delta (merge() adds the servers' answer on top)."""
        out = {}
        with self._lock:
            for name, geo in self._tables.items():
                rows = np.flatnonzero(geo.touched)
                if not rows.size:
                    continue
                geo.touched[rows] = False
                changes = geo.table.take_changes(geo.base, rows)
                out[name] = (geo.ids[rows], torch.from_numpy(changes))
        return out

    def clear(self) -> None:
        """Forgets every local row: rows pulled from now on start again from
        their initial values."""
        with self._lock:
            # Pulls this copy's threads kept die with its tables (kept weakly).
            self._tables.clear()

    def reload(self, chunk: int = 1 << 20) -> None:
        """Makes the copy again from the servers (after they loaded a
        checkpoint, or to catch up with the other workers): the rows trained
        since the copy was made, each and its base at the servers' value, and
        nothing to send; the rest is dropped, so the copy holds about one
        pass's rows, as a cleared one would. Without it, the rows would start
        over from their initial values, which the servers' no longer are. One
        pull of ``chunk`` ids at a time. Not while this worker trains."""
        with self._lock:
            old = dict(self._tables)
            self._tables.clear()  # pulls its threads kept die with the old tables
        for geo in old.values():
            kept = geo.ids[np.flatnonzero(geo.used[: len(geo.table)])]
            fresh = self._geo(geo.config)
            for start in range(0, kept.shape[0], chunk):
                ids = kept[start : start + chunk]
                values = _as_rows(self.remote._fetch((geo.config,), _int64(ids), False)[0])
                numbers = self._create(fresh, ids)
                with self._lock:
                    # Two merges (row += merged - base, base = the row now) set
                    # each row and its base to the servers' value exactly: to 0
                    # first (x + (0 - x) is 0), then from 0.
                    fresh.table.merge_rows(fresh.base, numbers, np.zeros_like(values))
                    fresh.table.merge_rows(fresh.base, numbers, values)

    def merge(self, name: str, ids: np.ndarray, rows: torch.Tensor) -> None:
        """Takes the servers' merged values of rows sent by ``deltas()``: they
        become the base, and the local rows keep what training changed since
        the sync was sent (local = merged + (local - sent))."""
        geo = self._tables.get(name)
        if geo is None:  # cleared meanwhile: the next pull reads the servers
            return
        merged = _as_rows(rows)
        numbers = self._create(geo, ids)
        with self._lock:
            geo.table.merge_rows(geo.base, numbers, merged)


def _as_rows(values: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().numpy()
    return np.ascontiguousarray(values, dtype=np.float32)


class DistributedOptimizer:
    """A torch optimizer whose ``step()`` also moves sparse rows (and, in PS
    mode, dense parameters) through the parameter-server runtime.

    Everything else (``param_groups``, ``state_dict()``, ``zero_grad()``,
    lr schedulers) is the wrapped optimizer's.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, step: Callable[[], None]) -> None:
        self.optimizer = optimizer
        self._step = step

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = closure() if closure is not None else None
        self._step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The wrapped optimizer's ``zero_grad`` (``dense_update.clear_grads``
        for ``set_to_none``: the same, without its machinery)."""
        if set_to_none:
            clear_grads(self.optimizer)
        else:
            self.optimizer.zero_grad(set_to_none=False)

    @property
    def mode_name(self) -> str | None:
        """The name of the training mode whose step this runs (``"local"``,
        ``"async"``, ``"sync"``, ``"geo"``); None for another step function."""
        return getattr(getattr(self._step, "__self__", None), "name", None)

    def minimize(self, loss: torch.Tensor) -> None:
        """Paddle's spelling: backward, step, zero_grad."""
        loss.backward()
        self.step()
        self.zero_grad()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)

    def __repr__(self) -> str:
        return f"DistributedOptimizer({self.optimizer!r})"


def dense_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer's parameters in order: their index is their name on the servers."""
    seen: set[int] = set()
    out = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


def dense_grads(params: Sequence[torch.Tensor]) -> dict[int, torch.Tensor]:
    """The gradients of ``params`` that have one, by index."""
    return {i: p.grad.detach() for i, p in enumerate(params) if p.grad is not None}



def copy_dense(
    params: Sequence[torch.Tensor], per_server: Sequence[dict[int, torch.Tensor]]
) -> None:
    """Copies the dense values the servers sent (each server's, by index) into ``params``."""
    with torch.no_grad():
        for values in per_server:
            for i, value in values.items():
                params[i].copy_(value)
