"""Single-machine MLP on Criteo-layout data, trained with Executor.train_from_dataset.

The port of Paddle's single-machine CTR trainer: a reader.py generator turns raw
Criteo TSV lines into MultiSlot records (examples/criteo/reader.py), an
InMemoryDataset loads and shuffles them, and the model is embeddings of the 26
categorical ids (an nn.EmbeddingBag over the ids modulo a bucket count) plus the
13 dense features, through an MLP, to a click logit. Prints the loss every
--print-period batches and the held-out AUC after each epoch.

Usage: python examples/mlp_local/train.py [--data DIR] [--files 4] [--lines 25000]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
CRITEO = os.path.join(os.path.dirname(HERE), "criteo")
sys.path.insert(0, CRITEO)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repository root

from make_data import StaleDataError, ensure_files

from datafeed import InMemoryDataset, Slot
from trainer import Executor, StreamingAUC

READER = os.path.join(CRITEO, "reader.py")
CATEGORICAL = [f"C{i}" for i in range(1, 27)]
SLOTS = (
    [Slot("dense_feature", "float32", (13,))]
    + [Slot(name, "uint64") for name in CATEGORICAL]
    + [Slot("label", "int64", (1,))]
)


class CtrMlp(nn.Module):
    """Hashed categorical embeddings + dense features -> MLP -> click logit."""

    def __init__(self, buckets: int = 100_003, dim: int = 8, hidden: tuple[int, ...] = (64, 32)):
        super().__init__()
        self.buckets = buckets
        self.embedding = nn.EmbeddingBag(buckets, dim, mode="sum")
        nn.init.normal_(self.embedding.weight, std=0.01)
        layers: list[nn.Module] = []
        width = dim * len(CATEGORICAL) + 13
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)

    def forward(self, batch) -> dict[str, torch.Tensor]:
        pooled = []
        for name in CATEGORICAL:
            ids = batch[name]  # Ragged: values (int64 bits of uint64 ids), offsets
            pooled.append(
                self.embedding(torch.remainder(ids.values, self.buckets), ids.offsets[:-1])
            )
        features = torch.cat(pooled + [batch["dense_feature"]], dim=1)
        logit = self.mlp(features).squeeze(1)
        label = batch["label"].squeeze(1).float()
        loss = nn.functional.binary_cross_entropy_with_logits(logit, label)
        return {"loss": loss, "prob": torch.sigmoid(logit), "label": label}


def make_dataset(files: list[str], batch_size: int, threads: int) -> InMemoryDataset:
    dataset = InMemoryDataset()
    dataset.init(
        batch_size=batch_size,
        thread_num=threads,
        use_var=SLOTS,
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


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="mlp_local_data", help="where the generated data goes")
    parser.add_argument(
        "--files", type=int, default=4, help="files to generate (the last is held out)"
    )
    parser.add_argument("--lines", type=int, default=25_000, help="lines per file")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--print-period", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.files < 2:
        parser.error("--files must be at least 2 (one is held out)")

    # The reader is a pipe command: its process must find the repository's packages.
    root = os.path.dirname(os.path.dirname(HERE))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    torch.manual_seed(args.seed)
    try:  # generated once; again when --files, --lines or --seed change
        files = ensure_files(args.data, args.files, args.lines, seed=args.seed)
    except StaleDataError as error:
        raise SystemExit(f"{os.path.basename(__file__)}: {error}") from None
    train = make_dataset(files[:-1], args.batch_size, args.threads)
    test = make_dataset(files[-1:], 1024, args.threads)
    print(f"train: {train.get_memory_data_size()} records, held out: {test.get_memory_data_size()}")

    model = CtrMlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    executor = Executor()
    result: dict[str, float] = {}
    for epoch in range(args.epochs):
        train.local_shuffle(seed=args.seed + epoch)
        summary = executor.train_from_dataset(
            model, train, optimizer, thread=args.threads,
            fetch_info=["loss"], print_period=args.print_period,
        )
        auc = evaluate(executor, model, test)
        print(
            f"epoch {epoch}: mean loss {summary.mean_loss:.4f}, "
            f"{summary.records_per_second:,.0f} records/s, held-out AUC {auc:.4f}",
            flush=True,
        )
        result[f"loss{epoch}"] = summary.mean_loss
        result["auc"] = auc
    return result


if __name__ == "__main__":
    main()
