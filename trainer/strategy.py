"""``DistributedStrategy`` (defined in ``trainer.job.strategy``, below the
parameter-server package that reads it too); ``from trainer.strategy import ...``
keeps working."""

from __future__ import annotations

from .job.strategy import DistributedStrategy

__all__ = ["DistributedStrategy"]
