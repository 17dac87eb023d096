"""Online training as PaddleRec runs it, on hourly slices that arrive while the
job runs (examples/online_training/make_slices.py writes them).

Every pass: wait for its slices' done files, load them (the next pass's
slices are preloaded while this one trains, when they are already complete),
train, report the cluster-wide AUC (fleet.metrics), dump each instance's
prediction (trainer_desc_configs), save a checkpoint and a delta, and list
them in the done files (FleetUtil: donefile.txt, xbox_patch_done.txt). At the
end of the day: shrink the tables and save a base (xbox_base_done.txt). A
restarted job reads donefile.txt and goes on after the last listed pass.

Usage (1 server + 2 workers; see docs/online_training.md):
    python examples/online_training/make_slices.py online_data &
    fleetrun --server_num=1 --worker_num=2 examples/online_training/train.py \\
        --data online_data --out online_out
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from datafeed import InMemoryDataset, Slot
from trainer import DistributedStrategy, Executor, StreamingAUC, fleet
from trainer.fleet import FleetUtil
from trainer.loop.online import wait_for_done_file
from trainer.nn import SparseEmbedding

SLOTS = [Slot("user", "uint64"), Slot("item", "uint64"), Slot("dense", "float32", (4,)),
         Slot("label", "int64", (1,))]
DONE_FILE = "to.hadoop.done"


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


def pass_files(data: str, day: str, slices: list[str]) -> list[str]:
    files = []
    for name in dict.fromkeys(slices):  # hourly folders repeat for splits under an hour
        files += sorted(glob.glob(os.path.join(data, day, name, "part-*.txt")))
    return fleet.util.get_file_shard(files)


def folders_of(data: str, day: str, slices: list[str]) -> list[str]:
    return [os.path.join(data, day, name) for name in dict.fromkeys(slices)]


def complete(data: str, day: str, slices: list[str]) -> bool:
    return all(os.path.exists(os.path.join(data, day, s, DONE_FILE)) for s in slices)


def dataset_of(files: list[str]) -> InMemoryDataset:
    dataset = InMemoryDataset()
    dataset.init(batch_size=128, thread_num=1, use_var=SLOTS)
    dataset.update_settings(parse_ins_id=True)  # each line starts with its instance id
    dataset.set_filelist(files)
    return dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="online_data")
    parser.add_argument("--out", default="online_out")
    parser.add_argument("--day", default="20261127")
    parser.add_argument("--hours", default="{0..3}", help="the day's hours, as Paddle's")
    parser.add_argument("--split-per-pass", type=int, default=1, help="hourly slices per pass")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for a slice")
    args = parser.parse_args()
    strategy = DistributedStrategy()
    fleet.init(strategy=strategy)
    torch.manual_seed(0)
    model = Ctr()
    optimizer = fleet.distributed_optimizer(torch.optim.Adagrad(model.parameters(), lr=0.05))
    util = FleetUtil()
    last_day, last_pass, last_path, key = util.get_last_save_model(args.out)
    if fleet.is_server():  # a restart: the servers start from the last listed save
        fleet.init_server(last_path if last_day != -1 else None)
        fleet.run_server()
        return
    fleet.init_worker()
    first = fleet.is_first_worker()
    passes = util.get_online_pass_interval(args.day, args.hours, 60, args.split_per_pass, True)
    day_done = last_day == int(args.day) and last_pass == -1  # its base is listed
    if last_day != -1:
        if first:
            print(f"resuming after day {last_day} pass {last_pass}", flush=True)
        # donefile.txt lists a save before xbox_patch_done.txt does (below): a job
        # that died between the two lists the delta now (a no-op when listed).
        folders = (args.data if last_pass == -1
                   else folders_of(args.data, str(last_day), passes[last_pass - 1]))
        util.write_xbox_donefile(args.out, last_day, last_pass, key, folders)
    xbox_key = key if last_day != -1 else int(time.time())
    if last_day == -1:
        # A first start: a full save, from which the first pass's delta counts
        # (a restart's servers loaded the last listed save, which does the same).
        if first:
            fleet.save_persistables(os.path.join(args.out, "start"))
        fleet.barrier_worker()
    executor = Executor()
    preloaded = None
    for pass_id, slices in enumerate(passes, 1):
        if day_done or (int(args.day), pass_id) <= (last_day, last_pass):
            continue  # listed in donefile.txt: trained and saved before the restart
        for name in slices:
            wait_for_done_file(os.path.join(args.data, args.day, name), DONE_FILE,
                               poll_interval=0.2, timeout=args.timeout)
        if preloaded is not None:
            dataset = preloaded
            dataset.wait_preload_done()
        else:
            dataset = dataset_of(pass_files(args.data, args.day, slices))
            dataset.load_into_memory()
        preloaded = None
        following = passes[pass_id] if pass_id < len(passes) else None
        if following is not None and complete(args.data, args.day, following):
            preloaded = dataset_of(pass_files(args.data, args.day, following))
            preloaded.preload_into_memory()  # read while this pass trains
        dataset.local_shuffle(seed=pass_id)
        fleet.set_pass(pass_id)
        strategy.trainer_desc_configs = {
            "dump_fields_path": os.path.join(args.out, "dump", args.day, str(pass_id)),
            "dump_fields": ["prob", "label"],
        }
        metric = StreamingAUC()
        summary = executor.train_from_dataset(
            model, dataset, optimizer, fetch_list=[],
            fetch_handler=lambda out, m=metric: m.update(out["label"], out["prob"]),
        )
        auc = fleet.metrics.auc(metric)
        records = int(fleet.metrics.sum(summary.records))
        dataset.release_memory()
        if first:
            print(f"day {args.day} pass {pass_id} ({','.join(slices)}): {records} records, "
                  f"cluster AUC {auc:.4f}", flush=True)
            # The delta first: a full save counts every row as saved, so a delta
            # after it would hold nothing.
            fleet.save_persistables(os.path.join(args.out, args.day, f"delta-{pass_id}"), mode=1)
            fleet.save_persistables(os.path.join(args.out, args.day, str(pass_id)))
        fleet.barrier_worker()  # both saves complete before they are listed
        # The pass is done once donefile.txt lists it; the serving side's line
        # follows (a restart adds it if the job died in between).
        util.write_model_donefile(args.out, args.day, pass_id, xbox_key)
        util.write_xbox_donefile(args.out, args.day, pass_id, xbox_key,
                                 folders_of(args.data, args.day, slices))
    if not day_done:
        fleet.shrink()  # the day's end: rows unseen for too long go
        if first:  # the day's model (donefile.txt's <day>/0/) and its base for serving
            fleet.save_persistables(os.path.join(args.out, args.day, "0"))
            fleet.save_persistables(os.path.join(args.out, args.day, "base"), mode=0)
        fleet.barrier_worker()
        util.write_model_donefile(args.out, args.day, -1, xbox_key)
        util.write_xbox_donefile(args.out, args.day, -1, xbox_key, args.data)
    fleet.stop_worker()


if __name__ == "__main__":
    main()
