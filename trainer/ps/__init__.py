"""The parameter server: sparse tables and dense parameters on servers, over
ZeroMQ with CURVE authentication, behind the fleet API (``trainer.fleet``).

Modules, from the bottom up:

- ``_rows.pyx`` (id -> row hash index, the optimizers' row loops), ``optim``
  (optimizer settings), ``table`` (``SparseTable``), ``checkpoint`` (files);
- ``sparse``: the registry of ``SparseEmbedding`` tables, the row store a
  forward pulls from, and the gradients a step pushes;
- ``wire`` (the messages: JSON header and raw array frames, never pickle),
  ``transport`` (sockets, authentication by the job key, timeouts), ``server``
  (a server's state and its handlers), ``client`` (a worker's row stores, the
  optimizer wrapper);
- ``modes``: what a step does, one class per mode: ``"async"`` (default),
  ``"sync"``, ``"geo"`` (``strategy.a_sync_configs["k_steps"]``), and local;
- ``runtime``: ``ParameterServerRuntime``, one process's part of the job, and
  ``load_local`` (a checkpoint into a local model for inference, without fleet).

Without a role environment the tables live in the process and the same calls
work, so a script runs unchanged on a laptop. Timeouts: ``FLEETFEED_PS_TIMEOUT``
(seconds, default 30) bounds every call to a server and the wait for a server's
port; a server that does not answer raises ``ServerUnavailableError`` naming its
endpoint. ``FLEETFEED_PS_START_TIMEOUT`` (default 300) bounds the waits for the
whole job: a synchronous round, a barrier, the other workers at stop.
"""

from __future__ import annotations

from .client import DistributedOptimizer
from .optim import OptimizerSpec
from .runtime import ParameterServerRuntime, load_local
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
