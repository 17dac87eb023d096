"""The mlp_local CTR model as a collective (data-parallel) job: 2 processes, gloo.

Run: fleetrun --nproc_per_node=2 examples/collective_mlp/train.py
(or: python -m trainer.job.launch --nproc_per_node=2 examples/collective_mlp/train.py)

Each process reads its share of the files (fleet.util.get_file_shard), the model
is wrapped by fleet.distributed_model (DistributedDataParallel: gradients are
all-reduced), and the held-out AUC is computed from the histograms of every
process added up with fleet.util.all_reduce.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.dirname(HERE)
# The repository root goes in first, so that mlp_local's train.py comes before
# any train.py in the directory above examples/ (a user's own, next to it).
sys.path.insert(0, os.path.dirname(EXAMPLES))
sys.path.insert(0, os.path.join(EXAMPLES, "criteo"))
sys.path.insert(0, os.path.join(EXAMPLES, "mlp_local"))

from make_data import StaleDataError, ensure_files
from train import CtrMlp, make_dataset

from trainer import Executor, StreamingAUC, fleet


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="collective_mlp_data")
    parser.add_argument(
        "--files", type=int, default=4, help="training files (a multiple of the processes)"
    )
    parser.add_argument("--lines", type=int, default=20_000, help="lines per file")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--print-period", type=int, default=50)
    args = parser.parse_args()

    root = os.path.dirname(EXAMPLES)  # the reader (a pipe command) imports generators
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    fleet.init(is_collective=True)
    rank, workers = fleet.worker_index(), fleet.worker_num()
    # Train files plus one held-out file per worker, exactly these (never a
    # file of an earlier run with other flags): one process generates them, or
    # regenerates them if the flags changed; the others wait for it.
    try:
        files = ensure_files(args.data, args.files + workers, args.lines, seed=0)
    except StaleDataError as error:
        raise SystemExit(f"{os.path.basename(__file__)}: {error}") from None
    train_files = fleet.util.get_file_shard(files[: args.files])
    test_files = fleet.util.get_file_shard(files[args.files :])
    train = make_dataset(train_files, args.batch_size, threads=1)
    test = make_dataset(test_files, 1024, threads=1)
    print(f"rank {rank}/{workers}: training on {train_files}", flush=True)

    torch.manual_seed(0)  # the same initial model on every rank (DDP also broadcasts it)
    model = fleet.distributed_model(CtrMlp())
    optimizer = fleet.distributed_optimizer(torch.optim.Adam(model.parameters(), lr=args.lr))
    executor = Executor()
    for epoch in range(args.epochs):
        train.local_shuffle(seed=epoch * workers + rank)
        summary = executor.train_from_dataset(
            model, train, optimizer, thread=1, print_period=args.print_period,
            fetch_list=["loss"] if fleet.is_first_worker() else [],
        )
        metric = StreamingAUC()
        executor.infer_from_dataset(
            model.module, test, fetch_list=[],
            fetch_handler=lambda out, metric=metric: metric.update(out["label"], out["prob"]),
        )
        metric.load_state(fleet.util.all_reduce(metric.state()))  # every rank's counts
        mean_loss = fleet.util.all_reduce(summary.mean_loss, mode="mean")
        if fleet.is_first_worker():
            print(
                f"epoch {epoch}: mean loss {mean_loss:.4f} over {workers} workers, "
                f"held-out AUC {metric.compute():.4f} on {metric.count} records",
                flush=True,
            )
    fleet.stop_worker()


if __name__ == "__main__":
    main()
