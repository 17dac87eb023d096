"""Collective mode on ``torch.distributed``: the process group and the byte and
tensor collectives the fleet API needs.

gloo on CPU, NCCL when CUDA is present. Every blocking call has a timeout and an
error that names this rank (and, where torch says, the ranks that did not answer).
"""

from __future__ import annotations

import atexit
import datetime
import gc
import logging
import os
from typing import Any

import torch
import torch.distributed as dist

from ..job import bind, hosts
from ..job.errors import TrainerError, WorkerFailedError
from ..job.keys import require_key_or_insecure

__all__ = [
    "all_gather_bytes",
    "all_reduce_tensor",
    "barrier",
    "destroy",
    "init_collective",
    "rank",
    "wait_for",
    "world_size",
]

logger = logging.getLogger("trainer.collective")

DEFAULT_TIMEOUT = 300.0
_timeout = datetime.timedelta(seconds=DEFAULT_TIMEOUT)
# The group's store, held here: a store written in Python (CurveStore) is only
# reachable from torch's C++ side while its Python object lives.
_store: dist.Store | None = None


def init_collective(
    rank: int,
    world_size: int,
    master_endpoint: str,
    timeout: float = DEFAULT_TIMEOUT,
    local_rank: int = 0,
    backend: str | None = None,
    job_key: str | None = None,
) -> str:
    """Joins (or creates, on rank 0) the job's default process group.

    Args:
        rank, world_size: this process's rank and the number of processes.
        master_endpoint: ``host:port`` of the rendezvous store (rank 0 listens).
        timeout: seconds for the rendezvous and for every later collective.
        local_rank: the GPU this process uses (NCCL only).
        backend: ``"gloo"`` or ``"nccl"``; default NCCL when CUDA is available,
            else gloo.
        job_key: the job's key: the rendezvous store (``trainer.job.store``)
            then admits only the job's processes. Without one, the group needs
            ``FLEETFEED_INSECURE=1``.

    Returns:
        The backend used.

    Raises:
        WorkerFailedError: the group did not form within ``timeout`` (naming
            this rank and the endpoint).
    """
    global _timeout, _store
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank % max(torch.cuda.device_count(), 1))
    if dist.is_initialized():
        dist.destroy_process_group()
    _timeout = datetime.timedelta(seconds=timeout)
    host, _, port = master_endpoint.rpartition(":")
    require_key_or_insecure(job_key, [master_endpoint], f"rank {rank}'s process group")
    # gloo listens on GLOO_SOCKET_IFNAME's address, else on whatever the hostname
    # resolves to: pin the interface this machine reaches the rendezvous through
    # (its own address on the job's network; lo for 127.x).
    if backend == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ:
        interface = hosts.interface_toward(host)
        if interface:
            os.environ["GLOO_SOCKET_IFNAME"] = interface
    try:
        # The store listens on its host only, and holds the job's entries keyed.
        store = bind.rendezvous_store(host, int(port), rank, world_size, _timeout, job_key)
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size, timeout=_timeout
        )
        _store = store
        atexit.register(_leave_at_exit)  # once per group; a no-op after destroy()
    except Exception as error:  # torch raises several types (DistStoreError, RuntimeError)
        raise WorkerFailedError(
            f"rank {rank} of {world_size}: the process group at {master_endpoint} did "
            f"not form within {timeout:g}s ({type(error).__name__}: {error})",
            rank=rank,
        ) from error
    logger.info("rank %d/%d joined the %s group at %s", rank, world_size, backend, master_endpoint)
    return backend


def destroy(wait_for_peers: bool = True) -> None:
    """Leaves the process group (no-op when there is none).

    Args:
        wait_for_peers: first wait (bounded by the group's timeout) until every
            rank leaves too: rank 0 hosts the rendezvous store, and a rank that
            tears it down while the others still use it makes them (or itself,
            at exit) abort.
    """
    global _store
    if not dist.is_initialized():
        return
    try:
        if wait_for_peers:
            barrier()
    finally:
        dist.destroy_process_group()
        if hasattr(_store, "close"):
            _store.close()
        _store = None
        # Free finished work objects and dead wrappers now: gloo objects that
        # outlive the interpreter's finalization abort the process at exit.
        gc.collect()


def _leave_at_exit() -> None:
    """A group still formed when the interpreter exits (the script never called
    ``destroy``/``stop_worker``) is destroyed first, without waiting for peers:
    left to interpreter shutdown, gloo's and the store's threads can abort the
    process ("terminate called without an active exception")."""
    if dist.is_initialized():
        try:
            destroy(wait_for_peers=False)
        except Exception as error:  # noqa: BLE001 - exiting anyway; say why, do not mask
            logger.debug("destroying the process group at exit failed: %s", error)


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def wait_for(work: Any, what: str) -> None:
    try:
        work.wait(_timeout)
    except Exception as error:
        raise WorkerFailedError(
            f"rank {rank()}: {what} failed (timeout {_timeout.total_seconds():g}s): a "
            f"peer failed or stopped answering ({type(error).__name__}: {error})",
            rank=rank(),
        ) from error


def barrier() -> None:
    """Waits for every rank; on gloo, the error names the ranks that did not arrive."""
    if not dist.is_initialized():
        return
    if dist.get_backend() == "gloo":
        try:
            dist.monitored_barrier(timeout=_timeout, wait_all_ranks=True)
        except Exception as error:
            raise WorkerFailedError(
                f"rank {rank()}: barrier failed within {_timeout.total_seconds():g}s: "
                f"{error}",
                rank=rank(),
            ) from error
    else:
        wait_for(dist.barrier(async_op=True), "barrier")


def all_reduce_tensor(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Reduces a copy of ``tensor`` over all ranks (no autograd): sum, max, min or mean."""
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    if op not in ops and op != "mean":
        raise ValueError(f"mode must be one of sum, mean, max, min; got {op!r}")
    result = tensor.detach().clone()
    if not dist.is_initialized():
        return result
    if dist.get_backend() == "nccl" and not result.is_cuda:  # NCCL reduces CUDA tensors only
        on_device = result.to(torch.device("cuda", torch.cuda.current_device()))
        wait_for(
            dist.all_reduce(on_device, ops.get(op, dist.ReduceOp.SUM), async_op=True),
            "all_reduce",
        )
        result = on_device.to(tensor.device)
    else:
        wait_for(
            dist.all_reduce(result, ops.get(op, dist.ReduceOp.SUM), async_op=True), "all_reduce"
        )
    if op == "mean":
        result = result / world_size()
    return result


MAX_GATHERED_BYTES = 64 << 20


def all_gather_bytes(data: bytes, limit: int = MAX_GATHERED_BYTES) -> list[bytes]:
    """Every rank's ``data``, in rank order (plain bytes: nothing is unpickled).

    Raises:
        TrainerError: a rank's ``data`` (this one's too) is longer than
            ``limit`` bytes: refused by every rank after the sizes are gathered,
            before anything is allocated for them (each rank holds every rank's
            bytes).
    """
    if not dist.is_initialized():
        if len(data) > limit:
            raise TrainerError(f"at most {limit} bytes are gathered, got {len(data)}")
        return [data]
    size = torch.tensor([len(data)], dtype=torch.int64)
    sizes = [torch.zeros_like(size) for _ in range(world_size())]
    wait_for(dist.all_gather(sizes, size, async_op=True), "all_gather of sizes")
    for peer, announced in enumerate(int(s.item()) for s in sizes):
        if not 0 <= announced <= limit:
            raise TrainerError(
                f"rank {rank()}: rank {peer} announced {announced} bytes to gather; expected "
                f"0 to {limit}"
            )
    longest = max(int(s.item()) for s in sizes)
    mine = torch.zeros(longest, dtype=torch.uint8)
    mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else mine[:0]
    parts = [torch.empty_like(mine) for _ in range(world_size())]
    wait_for(dist.all_gather(parts, mine, async_op=True), "all_gather of bytes")
    return [bytes(part[: int(s.item())].numpy()) for part, s in zip(parts, sizes, strict=True)]
