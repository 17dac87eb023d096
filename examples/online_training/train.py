"""Online training as PaddleRec runs it, on hourly slices that arrive while the
job runs (examples/online_training/make_slices.py writes them).

Every pass: wait for its slices' done files, load them (the next pass's
slices are preloaded while this one trains, when they are already complete),
train, report the cluster-wide AUC (fleet.metrics), dump each instance's
prediction (trainer_desc_configs), save a delta and a checkpoint, and list
them in the done files (FleetUtil: donefile.txt, xbox_patch_done.txt). At the
end of each day: shrink the tables and save a base (xbox_base_done.txt).

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
import datetime
import glob
import os
import sys
import time
from dataclasses import dataclass

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
DAY_END = -1  # donefile.txt's pass number of a day's base


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


@dataclass(frozen=True)
class Step:
    """One pass of a day (``pass_id`` >= 1), or the day's end (``DAY_END``)."""

    day: str
    day_number: int  # 1 for the first day: the tables' pass (shrink counts days unseen)
    pass_id: int
    slices: tuple[str, ...] = ()

    def order(self) -> tuple[int, int]:
        return int(self.day), self.pass_id if self.pass_id != DAY_END else 1 << 30


def schedule(first_day: str, days: int, passes: list[list[str]]) -> list[Step]:
    start = datetime.datetime.strptime(first_day, "%Y%m%d")
    steps = []
    for number in range(1, days + 1):
        day = (start + datetime.timedelta(days=number - 1)).strftime("%Y%m%d")
        # Hourly folders repeat in the passes of splits under an hour: each is read once.
        steps += [Step(day, number, pass_id, tuple(dict.fromkeys(slices)))
                  for pass_id, slices in enumerate(passes, 1)]
        steps.append(Step(day, number, DAY_END))
    return steps


def folders_of(data: str, step: Step) -> list[str]:
    return [os.path.join(data, step.day, name) for name in step.slices]


def serving_inputs(data: str, step: Step) -> list[str] | str:
    """The data a save was trained on, for the serving side's done file."""
    return os.path.join(data, step.day) if step.pass_id == DAY_END else folders_of(data, step)


def complete(data: str, step: Step) -> bool:
    return all(os.path.exists(os.path.join(folder, DONE_FILE)) for folder in folders_of(data, step))


def dataset_of(data: str, step: Step) -> InMemoryDataset:
    files = []
    for folder in folders_of(data, step):
        files += sorted(glob.glob(os.path.join(folder, "part-*.txt")))
    dataset = InMemoryDataset()
    dataset.init(batch_size=128, thread_num=1, use_var=SLOTS)
    dataset.update_settings(parse_ins_id=True)  # each line starts with its instance id
    dataset.set_filelist(fleet.util.get_file_shard(files))
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
    strategy = strategy_for(args.mode)
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
    # The workers' own group, which fleet.metrics reduces over, forms now rather
    # than at the end of the first pass (a few hundred ms there).
    fleet.worker_group()
    first = fleet.is_first_worker()
    passes = util.get_online_pass_interval(args.day, args.hours, 60, args.split_per_pass, True)
    steps = schedule(args.day, args.days, passes)
    listed = Step(str(last_day), 0, last_pass).order()
    if last_day != -1:
        if first:
            print(f"resuming after day {last_day} pass {last_pass}", flush=True)
        # donefile.txt lists a save before xbox_patch_done.txt does (below): a job
        # that died between the two lists the delta now (a no-op when listed).
        done = next((s for s in steps if s.order() == listed), None)
        inputs = serving_inputs(args.data, done) if done is not None else args.data
        util.write_xbox_donefile(args.out, last_day, last_pass, key, inputs)
    else:
        # A first start: a full save, from which the first pass's delta counts
        # (a restart's servers loaded the last listed save, which does the same).
        if first:
            fleet.save_persistables(os.path.join(args.out, "start"))
        fleet.barrier_worker()
    xbox_key = key if last_day != -1 else int(time.time())
    todo = [step for step in steps if step.order() > listed]
    executor = Executor()
    preloaded = None
    trained_until = None  # when the previous pass's training ended on every worker
    for index, step in enumerate(todo):
        if step.pass_id == DAY_END:
            end_day(args, util, step, xbox_key, first)
            continue
        for folder in folders_of(args.data, step):
            wait_for_done_file(folder, DONE_FILE, poll_interval=0.2, timeout=args.timeout)
        was_preloaded = preloaded is not None
        if preloaded is not None:
            dataset = preloaded
            dataset.wait_preload_done()
        else:
            dataset = dataset_of(args.data, step)
            dataset.load_into_memory()
        following = next((s for s in todo[index + 1:] if s.pass_id != DAY_END), None)
        preloaded = None
        if following is not None and complete(args.data, following):
            preloaded = dataset_of(args.data, following)
            preloaded.preload_into_memory()  # read while this pass trains
        dataset.local_shuffle(seed=step.pass_id)
        fleet.set_pass(step.day_number)
        strategy.trainer_desc_configs = {
            "dump_fields_path": os.path.join(args.out, "dump", step.day, str(step.pass_id)),
            "dump_fields": ["prob", "label"],
        }
        metric = StreamingAUC()
        started = time.time()  # one clock for the processes of this machine
        summary = executor.train_from_dataset(
            model, dataset, optimizer, fetch_list=[],
            fetch_handler=lambda out, m=metric: m.update(out["label"], out["prob"]),
        )
        # The pass trained from its first worker's start to its last worker's end.
        ended, first_start = fleet.util.all_reduce([time.time(), -started], "max")
        started = -first_start
        auc = fleet.metrics.auc(metric)
        records = int(fleet.metrics.sum(summary.records))
        dataset.release_memory()
        if first:
            gap = "" if trained_until is None else (
                f", {started - trained_until:.3f} s after the previous pass"
                f"{' (preloaded)' if was_preloaded else ''}")
            print(f"day {step.day} pass {step.pass_id} ({','.join(step.slices)}): {records} "
                  f"records, cluster AUC {auc:.4f}, trained in {ended - started:.3f} s{gap}",
                  flush=True)
            # The delta first: a full save counts every row as saved, so a delta
            # after it would hold nothing.
            fleet.save_persistables(
                os.path.join(args.out, step.day, f"delta-{step.pass_id}"), mode=1)
            fleet.save_persistables(os.path.join(args.out, step.day, str(step.pass_id)))
        fleet.barrier_worker()  # both saves complete before they are listed
        # The pass is done once donefile.txt lists it; the serving side's line
        # follows (a restart adds it if the job died in between).
        util.write_model_donefile(args.out, step.day, step.pass_id, xbox_key)
        util.write_xbox_donefile(args.out, step.day, step.pass_id, xbox_key,
                                 serving_inputs(args.data, step))
        trained_until = ended
    fleet.stop_worker()


def end_day(args: argparse.Namespace, util: FleetUtil, step: Step, xbox_key: int,
            first: bool) -> None:
    """The day's end: rows unseen for too long go, and the day's model
    (donefile.txt's ``<day>/0/``) and its base for serving are saved and listed."""
    if first:
        fleet.shrink()  # once per day: each call decays the rows' statistics again
        fleet.save_persistables(os.path.join(args.out, step.day, "0"))
        fleet.save_persistables(os.path.join(args.out, step.day, "base"), mode=0)
    fleet.barrier_worker()
    util.write_model_donefile(args.out, step.day, DAY_END, xbox_key)
    util.write_xbox_donefile(args.out, step.day, DAY_END, xbox_key,
                             serving_inputs(args.data, step))


if __name__ == "__main__":
    main()
