"""Online training as PaddleRec runs it, on hourly slices that arrive while the
job runs (examples/online_training/make_slices.py writes them).

The script keeps the model and the step (``train_pass``); the library's
driver (trainer.loop.online_loop.OnlineLoop) keeps the order around them:
wait for a pass's slices, load them (or take them preloaded during the
previous pass), train, dump each instance's prediction, save a delta and a
checkpoint and list them in the done files (donefile.txt,
xbox_patch_done.txt); at each day's end shrink the tables and save a base
(xbox_base_done.txt).

donefile.txt is the job's commit log: a pass is done once it lists it. A job
started again, by hand or by ``fleetrun --max_restarts`` after a process died,
starts its servers from the last listed save and goes on with the pass after
it, so each record reaches the listed saves once (docs/online_training.md).

Usage (1 server + 2 workers; see docs/online_training.md):
    python examples/online_training/make_slices.py online_data &
    fleetrun --server_num=1 --worker_num=2 --max_restarts=3 \\
        examples/online_training/train.py --data online_data --out online_out
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from datafeed import InMemoryDataset, Slot
from trainer import DistributedStrategy, Executor, StreamingAUC, fleet
from trainer.loop.online_loop import OnlineLoop, PassInfo
from trainer.nn import SparseEmbedding

SLOTS = [Slot("user", "uint64"), Slot("item", "uint64"), Slot("dense", "float32", (4,)),
         Slot("label", "int64", (1,))]


class Ctr(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.user = SparseEmbedding(4, "user")
        self.item = SparseEmbedding(4, "item")
        self.mlp = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, batch):
        x = torch.cat([self.user(batch["user"]), self.item(batch["item"]), batch["dense"]], 1)
        logit = self.mlp(x).squeeze(1)
        label = batch["label"].squeeze(1).float()
        loss = nn.functional.binary_cross_entropy_with_logits(logit, label)
        return {"loss": loss, "prob": torch.sigmoid(logit).unsqueeze(1),
                "label": batch["label"]}


def dataset_of(files: list[str]) -> InMemoryDataset:
    dataset = InMemoryDataset()
    dataset.init(batch_size=128, thread_num=1, use_var=SLOTS)
    dataset.update_settings(parse_ins_id=True)  # each line starts with its instance id
    dataset.set_filelist(files)
    return dataset


def strategy_for(mode: str) -> DistributedStrategy:
    strategy = DistributedStrategy()
    strategy.a_sync = mode != "sync"
    if mode == "geo":
        strategy.a_sync_configs = {"k_steps": 20}
    return strategy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="online_data")
    parser.add_argument("--out", default="online_out")
    parser.add_argument("--day", default="20261127", help="the first day")
    parser.add_argument("--days", type=int, default=1, help="days to train, from --day on")
    parser.add_argument("--hours", default="{0..3}", help="each day's hours, as Paddle's")
    parser.add_argument("--split-per-pass", type=int, default=1, help="hourly slices per pass")
    parser.add_argument("--mode", choices=["async", "sync", "geo"], default="async")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for a slice")
    args = parser.parse_args()
    fleet.init(strategy=strategy_for(args.mode))
    torch.manual_seed(0)
    model = Ctr()
    optimizer = fleet.distributed_optimizer(torch.optim.Adagrad(model.parameters(), lr=0.05))
    executor = Executor()

    def train_pass(dataset: InMemoryDataset, step: PassInfo) -> str:
        dataset.local_shuffle(seed=step.pass_id)
        metric = StreamingAUC()
        summary = executor.train_from_dataset(
            model, dataset, optimizer, fetch_list=[],
            fetch_handler=lambda out: metric.update(out["label"], out["prob"]),
        )
        auc = fleet.metrics.auc(metric)  # over every worker
        records = int(fleet.metrics.sum(summary.records))
        return f"{records} records, cluster AUC {auc:.4f}"

    loop = OnlineLoop(
        fleet, args.data, args.out, args.day, days=args.days, hours=args.hours,
        split_per_pass=args.split_per_pass, make_dataset=dataset_of,
        file_pattern="part-*.txt", dump_fields=["prob", "label"], poll_interval=0.2,
        timeout=args.timeout,
    )
    loop.run(train_pass)


if __name__ == "__main__":
    main()
