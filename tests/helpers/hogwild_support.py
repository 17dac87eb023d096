"""What the Hogwild tests share (test_hogwild.py: threads; test_hogwild_processes.py):
a small CTR model with one SparseEmbedding, the local-mode optimizer wrapper,
and the cleanup of the process's local tables."""

from __future__ import annotations

import itertools

import torch
from torch import nn

from trainer.embedding import pending, stores
from trainer.job.role import ClusterRole
from trainer.nn import SparseEmbedding
from trainer.ps import ParameterServerRuntime

_names = itertools.count()


def clear_local_tables() -> None:
    """Drops the local tables and this thread's pending pulls (after a test)."""
    stores.local_store().clear()
    pending.clear_pending()


class CtrModel(nn.Module):
    """A sparse slot embedded at dim 4 (summed per record) and a dense feature,
    through a small MLP. The label may be [size] or [size, 1] (a dataset's slot)."""

    def __init__(self, seed: int = 0, name: str | None = None, entry=None) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.emb = SparseEmbedding(4, name or f"hog{next(_names)}", seed=seed, entry=entry)
        self.mlp = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, batch):
        features = torch.cat([self.emb(batch["ids"]), batch["dense"]], dim=1)
        logit = self.mlp(features).squeeze(1)
        label = batch["label"].reshape(-1)
        loss = nn.functional.binary_cross_entropy_with_logits(logit, label)
        return {"loss": loss, "prob": torch.sigmoid(logit), "label": label}


def local_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer):
    """fleet.distributed_optimizer's wrapper in local mode (sparse tables in process)."""
    return ParameterServerRuntime(ClusterRole.local(), None).distributed_optimizer(optimizer)
