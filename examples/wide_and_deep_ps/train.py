"""Wide & deep on Criteo-layout data as a parameter-server job (PaddleRec's quick start, in torch).

The same script runs in every role, as in Paddle: each process builds the model
and the distributed optimizer; servers then serve, workers train on their share
of the files with Executor.train_from_dataset. The 26 categorical ids go through
two SparseEmbedding tables whose rows live on the servers (a 1-wide "wide" table
and an 8-wide "deep" table, both keyed by the raw 64-bit ids, no vocabulary),
the 13 dense features through the MLP. Worker 0 prints the held-out AUC, and
the AUC of a model of the dense features alone for comparison.

Usage (1 server + 2 workers; see README.md):
    fleetrun --server_num=1 --worker_num=2 examples/wide_and_deep_ps/train.py \\
        [--mode async|sync|geo]
Without fleetrun it runs as one local process.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "examples", "criteo"))
sys.path.insert(0, ROOT)

from make_data import StaleDataError, ensure_files

from datafeed import InMemoryDataset, Ragged, Slot
from trainer import DistributedStrategy, Executor, StreamingAUC, fleet
from trainer.nn import SparseEmbedding

READER = os.path.join(HERE, "reader.py")
CATEGORICAL = [f"C{i}" for i in range(1, 27)]
SLOTS = (
    [Slot("dense_feature", "float32", (13,))]
    + [Slot(name, "uint64") for name in CATEGORICAL]
    + [Slot("label", "int64", (1,))]
)


def stack_slots(batch, names: list[str]) -> Ragged:
    """The slots' ids as one Ragged with a bag per (slot, record), slot-major,
    so that each table is pulled once per batch rather than once per slot.
    The offsets are built in numpy (half the time of the same work as 26x3
    small torch ops, measured)."""
    raggeds = [batch[name] for name in names]
    offsets = [np.zeros(1, dtype=np.int64)]
    shift = 0
    for ragged in raggeds:
        own = ragged.offsets.numpy()
        offsets.append(own[1:] + shift)
        shift += int(own[-1])
    return Ragged(torch.cat([r.values for r in raggeds]), torch.from_numpy(np.concatenate(offsets)))


class WideDeep(nn.Module):
    def __init__(
        self, dim: int = 8, hidden: tuple[int, ...] = (64, 32), sparse_optimizer: dict | None = None
    ) -> None:
        """``sparse_optimizer``: the tables' own optimizer (SparseEmbedding's
        ``optimizer``); None: the one given to fleet.distributed_optimizer."""
        super().__init__()
        self.wide = SparseEmbedding(1, "wide", optimizer=sparse_optimizer)
        self.deep = SparseEmbedding(dim, "deep", optimizer=sparse_optimizer)
        layers: list[nn.Module] = []
        width = dim * len(CATEGORICAL) + 13
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)

    def forward(self, batch) -> dict[str, torch.Tensor]:
        ids = stack_slots(batch, CATEGORICAL)
        size = batch.size
        wide = self.wide(ids).view(len(CATEGORICAL), size).sum(0)
        deep = self.deep(ids).view(len(CATEGORICAL), size, -1).transpose(0, 1).reshape(size, -1)
        logit = self.mlp(torch.cat([deep, batch["dense_feature"]], dim=1)).squeeze(1) + wide
        label = batch["label"].squeeze(1).float()
        loss = nn.functional.binary_cross_entropy_with_logits(logit, label)
        return {"loss": loss, "prob": torch.sigmoid(logit), "label": label}


class DenseOnly(nn.Module):
    """The comparison: the 13 dense features alone."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(13, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, batch) -> dict[str, torch.Tensor]:
        logit = self.mlp(batch["dense_feature"]).squeeze(1)
        label = batch["label"].squeeze(1).float()
        loss = nn.functional.binary_cross_entropy_with_logits(logit, label)
        return {"loss": loss, "prob": torch.sigmoid(logit), "label": label}


def make_dataset(files: list[str], batch_size: int) -> InMemoryDataset:
    dataset = InMemoryDataset()
    dataset.init(
        batch_size=batch_size, thread_num=1, use_var=SLOTS,
        pipe_command=f"{sys.executable} {READER}",
    )
    dataset.set_filelist(files)
    dataset.load_into_memory()
    return dataset


def evaluate(executor: Executor, model: nn.Module, dataset: InMemoryDataset) -> float:
    metric = StreamingAUC()
    executor.infer_from_dataset(
        model, dataset, fetch_list=[],
        fetch_handler=lambda out: metric.update(out["label"], out["prob"]),
    )
    return metric.compute()


def strategy_for(mode: str, k_steps: int) -> DistributedStrategy:
    strategy = DistributedStrategy()
    strategy.a_sync = mode != "sync"
    if mode == "geo":
        strategy.a_sync_configs = {"k_steps": k_steps}
    return strategy


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["async", "sync", "geo"], default="async")
    parser.add_argument("--k-steps", type=int, default=20, help="GEO: push deltas every k steps")
    parser.add_argument(
        "--data", default="wide_and_deep_data", help="where the generated data goes"
    )
    parser.add_argument(
        "--files", type=int, default=5, help="files to generate (the last is held out)"
    )
    parser.add_argument("--lines", type=int, default=20_000, help="lines per file")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--print-period", type=int, default=50)
    parser.add_argument(
        "--save", default="", help="worker 0 saves the model here (save_persistables)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    # The reader is a pipe command: its process must find the repository's packages.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    )

    fleet.init(strategy=strategy_for(args.mode, args.k_steps))
    torch.manual_seed(args.seed)
    model = WideDeep()
    # Adagrad, as PaddleRec's wide&deep: the dense MLP on the servers and every
    # sparse table (tables may override with SparseEmbedding(optimizer=...)).
    optimizer = fleet.distributed_optimizer(torch.optim.Adagrad(model.parameters(), lr=args.lr))

    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()
        return {}

    fleet.init_worker()
    # Every worker asks; one generates (or regenerates, if --files, --lines or
    # --seed changed since the data was written), the others wait for it.
    try:
        files = ensure_files(args.data, args.files, args.lines, args.seed)
    except StaleDataError as error:
        raise SystemExit(f"{os.path.basename(__file__)}: {error}") from None
    mine = files[:-1][fleet.worker_index() :: fleet.worker_num()]
    train = make_dataset(mine, args.batch_size)
    executor = Executor()
    result: dict[str, float] = {}
    for epoch in range(args.epochs):
        train.local_shuffle(seed=args.seed + 100 * epoch + fleet.worker_index())
        summary = executor.train_from_dataset(
            model, train, optimizer, thread=1, fetch_info=["loss"], print_period=args.print_period
        )
        print(
            f"worker {fleet.worker_index()} epoch {epoch}: mean loss {summary.mean_loss:.4f}, "
            f"{summary.records_per_second:,.0f} records/s",
            flush=True,
        )
    fleet.barrier_worker()  # every worker's training is on the servers
    if fleet.is_first_worker():
        test = make_dataset(files[-1:], 1024)
        result["auc"] = evaluate(executor, model, test)
        # The comparison: the dense features alone, trained locally on the same files.
        torch.manual_seed(args.seed)
        dense = DenseOnly()
        dense_opt = torch.optim.Adam(dense.parameters(), lr=0.01)
        for epoch in range(args.epochs):
            train.local_shuffle(seed=args.seed + epoch)
            executor.train_from_dataset(dense, train, dense_opt, thread=1, fetch_list=[])
        result["dense_only_auc"] = evaluate(executor, dense, test)
        print(
            f"held-out AUC: wide&deep {result['auc']:.4f} ({args.mode} mode), "
            f"dense features only {result['dense_only_auc']:.4f}",
            flush=True,
        )
        if args.save:
            fleet.save_persistables(args.save)
            print(f"saved the model to {args.save}", flush=True)
    fleet.stop_worker()
    return result


if __name__ == "__main__":
    main()
