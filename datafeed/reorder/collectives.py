"""The collectives the datasets and the global shuffle need, over ``torch.distributed``.

``distributed_world`` and ``all_reduce_count`` (a dataset's record and batch
counts among the workers); ``join_worker_group`` and ``worker_num`` (what a
``fleet`` says about the workers); and ``TimedCollectives``, collectives waited
for with a timeout whose failures name the ranks that stopped answering, for
datafeed/reorder/global_shuffle.py. While one runs in the main thread, SIGTERM is held
back for at most ``TERM_GRACE`` seconds (see ``TimedCollectives.run``). torch is
imported on use only: ``import datafeed`` stays torch-free.
"""

from __future__ import annotations

import datetime
import logging
import signal
import threading
import time
from typing import Any

import numpy as np

from ..config.errors import GlobalShuffleError

logger = logging.getLogger("datafeed")

# Seconds a collective may still take once SIGTERM arrived (see TimedCollectives.run).
TERM_GRACE = 2.0


def join_worker_group(fleet: Any) -> None:
    """Lets ``trainer.fleet`` form the workers' process group where it has none yet
    (a PS job); any other fleet-like object (or None) is used as it is."""
    join = getattr(fleet, "worker_group", None)
    if callable(join):
        join()


def worker_num(fleet: Any) -> int:
    """The workers of ``fleet`` (its ``worker_num()``), or 1 without one."""
    count = getattr(fleet, "worker_num", None)
    return int(count()) if callable(count) else 1


def all_reduce_count(
    count: int, timeout: float | None = None, group: Any = None, op: str = "sum"
) -> int:
    """The sum (or, with ``op="min"``, the least) of ``count`` over the ranks of
    ``group`` (default: the default group)."""
    import torch
    import torch.distributed as dist

    comm = TimedCollectives(dist, torch, host_group(dist, group), timeout, None)
    group = comm.group
    value = torch.tensor([count], dtype=torch.int64)
    reduce_op = dist.ReduceOp.MIN if op == "min" else dist.ReduceOp.SUM
    comm.run(
        lambda: dist.all_reduce(value, op=reduce_op, group=group, async_op=True),
        f"reducing the counts ({op})",
    )
    return int(value.item())


def distributed_world(group: Any = None) -> int:
    """Ranks in ``group`` (default group), or 1 when torch.distributed is not initialised."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a dependency
        return 1
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


_gloo_group: Any = None  # made once, when the default group cannot carry CPU tensors


def host_group(dist: Any, group: Any) -> Any:
    """``group``, or a gloo group of every rank when the default group is NCCL
    (which carries only GPU tensors). Every rank gets here together."""
    global _gloo_group
    if group is not None or not dist.is_initialized() or dist.get_backend() == "gloo":
        return group
    if _gloo_group is None:
        _gloo_group = dist.new_group(backend="gloo")
    return _gloo_group


class TimedCollectives:
    """Blocking collectives waited for with a timeout; failures name the ranks."""

    def __init__(
        self,
        dist: Any,
        torch: Any,
        group: Any,
        timeout: float | None,
        call: int | None,
        held: HeldTermination | None = None,
    ) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            raise GlobalShuffleError(
                "global_shuffle across workers needs an initialised torch.distributed "
                "process group (fleet.init(is_collective=True), torchrun, or "
                "torch.distributed.init_process_group)",
                rank=0,
            )
        self.dist, self.torch, self.group, self.call = dist, torch, group, call
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.timeout = None if timeout is None else datetime.timedelta(seconds=timeout)
        self.held = held

    def run(self, start: Any, what: str) -> None:
        """Starts a collective (``start()`` returns its work handle) and waits for it;
        a failure or a timeout raises ``GlobalShuffleError`` naming ``what``."""
        # SIGTERM is held back during a global shuffle: a launcher (torchrun
        # under fleetrun) stops every rank as soon as one dies, usually before
        # the survivors' collectives have reported the death. A held SIGTERM
        # gives the shuffle TERM_GRACE more seconds in its collectives (and a
        # failure its peer probe), so that a failure reaches this rank's log;
        # then it stops the process as it would have.
        held = self.held if self.held is not None else HeldTermination()
        with held if self.held is None else _NoHold():
            self._stop_if_expired(held, what)
            try:
                work = start()
                self._wait(work, held, what)
            except GlobalShuffleError:
                raise
            except Exception as error:  # noqa: BLE001 - torch raises several types
                self._fail(what, error, held)

    def _stop_if_expired(self, held: HeldTermination, what: str) -> None:
        if held.expired(TERM_GRACE):
            logger.error(
                "rank %d of %d: global_shuffle stopped by %s while %s", self.rank, self.world,
                signal.Signals(held.received).name, what,  # type: ignore[arg-type]
            )
            held.redeliver()

    def _wait(self, work: Any, held: HeldTermination, what: str) -> None:
        """``work.wait()`` within the timeout; in the main thread, a polling wait
        during which a held SIGTERM is seen (a blocking wait defers handlers)."""
        if not held.active:
            work.wait() if self.timeout is None else work.wait(self.timeout)
            return
        deadline = None if self.timeout is None else time.monotonic() + self.timeout.total_seconds()
        pause = 0.0002
        while not work.is_completed():
            if deadline is not None and time.monotonic() > deadline:
                break  # the wait below times out
            self._stop_if_expired(held, what)
            time.sleep(pause)
            pause = min(pause * 2, 0.002)
        work.wait() if self.timeout is None else work.wait(datetime.timedelta(milliseconds=1))

    def exchange(
        self, send: np.ndarray, send_sizes: list[int], what: str,
        limits: list[int] | None = None,
    ) -> list[tuple[int, np.ndarray]]:
        """Sends ``send_sizes[d]`` bytes of ``send`` (in rank order) to rank ``d``;
        returns (source, bytes) for each rank that sent any.

        ``limits[s]``: the most bytes rank ``s`` may send; a rank that announces
        more (or a negative size) is refused before anything is allocated for it.
        """
        torch = self.torch
        sizes = torch.tensor(send_sizes, dtype=torch.int64)
        incoming = torch.empty(self.world, dtype=torch.int64)
        self.run(
            lambda: self.dist.all_to_all_single(
                incoming, sizes, group=self.group, async_op=True
            ),
            f"{what}: exchanging sizes",
        )
        for source, announced in enumerate(incoming.tolist()):
            limit = None if limits is None else limits[source]
            if announced < 0 or (limit is not None and announced > limit):
                raise GlobalShuffleError(
                    f"rank {self.rank}: global_shuffle {what}: rank {source} announced a "
                    f"payload of {announced} bytes, expected 0 to {limit} bytes",
                    rank=self.rank, peers=(source,),
                )
        recv = torch.empty(int(incoming.sum()), dtype=torch.uint8)
        self.run(
            lambda: self.dist.all_to_all_single(
                recv,
                torch.from_numpy(send),
                output_split_sizes=incoming.tolist(),
                input_split_sizes=sizes.tolist(),
                group=self.group,
                async_op=True,
            ),
            f"{what}: exchanging records",
        )
        data = recv.numpy()
        out = []
        at = 0
        for source, n in enumerate(incoming.tolist()):
            if n:
                out.append((source, data[at : at + n]))
            at += n
        return out

    def _fail(self, what: str, error: Exception, held: HeldTermination) -> None:
        peers = self._silent_peers()  # SIGTERM still held (see run())
        who = (
            "; not answering: " + ", ".join(f"rank {p}" for p in peers)
            if peers
            else "; a peer died or stopped answering"
        )
        limit = f" (timeout {self.timeout.total_seconds():g}s)" if self.timeout else ""
        failure = GlobalShuffleError(
            f"rank {self.rank} of {self.world}: global_shuffle failed while {what}{limit}{who} "
            f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})",
            rank=self.rank,
            peers=peers,
        )
        if held.received is not None:
            logger.error("%s: %s (stopping: %s received)", type(failure).__name__, failure,
                         signal.Signals(held.received).name)
            held.redeliver()  # stops the process as asked (unless a handler says otherwise)
        raise failure from error

    def _silent_peers(self, wait: float = 3.0) -> tuple[int, ...]:
        """Ranks that do not check in to the rendezvous store within ``wait`` seconds.

        Every surviving rank that fails writes its key, then looks for the others'.
        When the store itself is gone (its host, rank 0, died), rank 0 is named.
        """
        if self.call is None or self.world != self.dist.get_world_size():
            return ()  # keys are per rank of the default group
        try:
            store = self.dist.distributed_c10d._get_default_store()
            prefix = f"fleetfeed/global_shuffle/{self.call}/alive/"
            store.set(f"{prefix}{self.rank}", b"1")
            deadline = time.monotonic() + wait
            missing = [r for r in range(self.world) if r != self.rank]
            while missing and time.monotonic() < deadline:
                missing = [r for r in missing if not store.check([f"{prefix}{r}"])]
                if missing:
                    time.sleep(0.1)
            return tuple(missing)
        except Exception:  # noqa: BLE001 - any failure: the store is gone with its host
            return (0,) if self.rank != 0 else ()


class _NoHold:
    """A ``with`` block that does nothing (the caller already holds SIGTERM)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> None:
        return None


class HeldTermination:
    """Holds back SIGTERM in a ``with`` block (main thread only; elsewhere a no-op).

    ``received`` is the signal that arrived meanwhile (or None). Leaving the
    block (or ``redeliver()``) puts the previous handler back and sends a held
    signal again, so it takes effect as it would have, only later.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self.since = 0.0
        self._previous: Any = None
        self._held = False

    @property
    def active(self) -> bool:
        """Whether SIGTERM is being held (only the main thread can)."""
        return self._held

    def expired(self, grace: float) -> bool:
        """Whether a signal was held for more than ``grace`` seconds."""
        return self.received is not None and time.monotonic() - self.since > grace

    def __enter__(self) -> HeldTermination:  # noqa: PYI034 - a final class
        if threading.current_thread() is threading.main_thread():
            try:
                self._previous = signal.signal(signal.SIGTERM, self._hold)
                self._held = True
            except (ValueError, OSError):  # pragma: no cover - no signals here
                self._held = False
        return self

    def _hold(self, signum: int, _frame: Any) -> None:
        if self.received is None:
            self.received, self.since = signum, time.monotonic()

    def __exit__(self, *exc_info: object) -> None:
        self.redeliver()

    def redeliver(self) -> None:
        """Puts the previous handler back and sends the held signal again."""
        if self._held:
            # None: a handler installed outside Python; the default is the best guess.
            previous = self._previous if self._previous is not None else signal.SIG_DFL
            signal.signal(signal.SIGTERM, previous)
            self._held = False
        signum, self.received = self.received, None
        if signum is not None:
            signal.raise_signal(signum)
