"""The parameter server: sparse tables and dense parameters on servers, over
ZeroMQ with CURVE authentication, behind the fleet API (``trainer.fleet``).

In: the model and optimizer a script built (every role builds them, which is
how servers learn each table), the role and the strategy. Out: trained sparse
rows and dense parameters, on servers or in the process. From the bottom up:

- ``tables/``: ``SparseTable`` and its C kernels, optimizers, admission and
  eviction; ``checkpoint/``: the files of a checkpoint; ``placement``: which
  server holds a row or a dense parameter;
- ``wire`` (the messages: JSON header and raw array frames, never pickle),
  ``transport`` (sockets, authentication by the job key, timeouts), ``server``
  (a server's state and its handlers), ``client`` (a worker's row stores, the
  optimizer wrapper), ``lifecycle`` (passes, shrink and statistics across servers);
- ``modes``: what a step does, one class per mode: ``"async"`` (default),
  ``"sync"``, ``"geo"`` (``strategy.a_sync_configs["k_steps"]``), and local;
- ``runtime``: ``ParameterServerRuntime``, one process's part of the job, and
  ``load_local`` (a checkpoint into a local model for inference, without fleet).

Several servers (``fleetrun --server_num N``): each sparse row lives on one
server, chosen by a hash of its id (``table.shard_of``); each dense parameter
on one server, chosen by size (``placement.dense_owners``: largest first onto
the server with the fewest elements so far, computed alike by every process
from the shapes). By index, the rule before, every weight matrix of an MLP
(parameters alternate weight, bias) landed on the even servers: 16,224 of the
wide&deep example's 16,321 dense floats on server 0 of two; by size 14,144
(one matrix, never split) and 2,177. A checkpoint holds one file per server
and table, each naming the ids or parameter indices it holds, and loads into
any number of servers or a local model: every server reads every file, keeps
what it owns, and takes each row's and each dense parameter's optimizer state
with it (``checkpoint``). Every file is checked before anything changes.

Without a role environment the tables live in the process and the same calls
work, so a script runs unchanged on a laptop. Timeouts: ``FLEETFEED_PS_TIMEOUT``
(seconds, default 30) bounds every call to a server and the wait for a server's
port; a server that does not answer raises ``ServerUnavailableError`` naming its
endpoint. ``FLEETFEED_PS_START_TIMEOUT`` (default 300) bounds the waits for the
whole job: a synchronous round, a barrier, the other workers at stop.
"""

from __future__ import annotations

import importlib
from typing import Any

# The public names, each from the module that defines it, imported on first use:
# the tables and checkpoints below import nothing of the runtime above them.
_DEFINED_IN = {
    "DistributedOptimizer": "client",
    "OptimizerSpec": "tables.optim",
    "ParameterServerRuntime": "runtime",
    "SparseTable": "tables.table",
    "load_local": "runtime",
}

__all__ = sorted(_DEFINED_IN)


def __getattr__(name: str) -> Any:
    if name in _DEFINED_IN:
        return getattr(importlib.import_module(f".{_DEFINED_IN[name]}", __name__), name)
    raise AttributeError(f"module 'trainer.ps' has no attribute {name!r}")
