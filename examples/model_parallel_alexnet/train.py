"""AlexNet with a model-parallel classifier: 2 processes, gloo, synthetic images.

Run: fleetrun --nproc_per_node=2 examples/model_parallel_alexnet/train.py

The convolutional features are replicated; the classifier's weights are split
across the processes (Paddle's paddle.distributed.split): a column-split layer,
a row-split layer (partial products summed by an all-reduce), and a column-split
output layer whose slices are joined by all_gather with autograd. Both processes
see the same batches; fleet.distributed_optimizer averages the replicated
parameters' gradients, so they stay identical; the script checks that at the end.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from trainer import Executor, fleet
from trainer.collective import ColumnParallelLinear, RowParallelLinear, all_gather

CLASSES = 10


class AlexNet(nn.Module):
    """A small AlexNet for 3x32x32 images; the classifier is split across ranks."""

    def __init__(self, width: int = 16, hidden: int = 256) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),  # 16x16
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 8x8
            nn.Conv2d(2 * width, 3 * width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(3 * width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 4x4
        )
        self.classifier = nn.Sequential(
            ColumnParallelLinear(2 * width * 16, hidden, gather_output=False, seed=1),
            nn.ReLU(),
            RowParallelLinear(hidden, hidden, input_is_parallel=True, seed=2),
            nn.ReLU(),
            ColumnParallelLinear(hidden, CLASSES, gather_output=True, seed=3),  # all_gather
        )

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        logits = self.classifier(self.features(batch["image"]).flatten(1))
        loss = nn.functional.cross_entropy(logits, batch["label"])
        correct = (logits.argmax(1) == batch["label"]).sum()
        return {"loss": loss, "correct": correct}


def synthetic_images(
    count: int, seed: int, noise: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Images of 10 classes: a fixed random pattern per class, shifted and noisy."""
    prototypes = torch.randn(CLASSES, 3, 32, 32, generator=torch.Generator().manual_seed(1234))
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (count,), generator=generator)
    shifts = torch.randint(-2, 3, (count, 2), generator=generator)
    images = torch.stack([
        torch.roll(prototypes[label], (int(dy), int(dx)), dims=(1, 2))
        for label, (dy, dx) in zip(labels.tolist(), shifts, strict=True)
    ])
    images += noise * torch.randn(images.shape, generator=generator)
    return images, labels


def batches(images: torch.Tensor, labels: torch.Tensor, size: int, seed: int) -> list[dict]:
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    return [
        {"image": images[order[i : i + size]], "label": labels[order[i : i + size]]}
        for i in range(0, len(labels), size)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=2048, help="training images")
    parser.add_argument("--test", type=int, default=512, help="held-out images")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.002)
    args = parser.parse_args()

    torch.set_num_threads(1)
    fleet.init(is_collective=True)
    torch.manual_seed(0)  # the replicated layers start equal on every rank
    model = AlexNet()
    optimizer = fleet.distributed_optimizer(torch.optim.Adam(model.parameters(), lr=args.lr))
    train_images, train_labels = synthetic_images(args.train, seed=1)
    test_images, test_labels = synthetic_images(args.test, seed=2)
    executor = Executor()
    first = fleet.is_first_worker()
    for epoch in range(args.epochs):
        summary = executor.train_from_dataset(
            model, batches(train_images, train_labels, args.batch_size, seed=epoch),
            optimizer, thread=1, fetch_list=["loss"] if first else [], print_period=10,
        )
        correct = 0

        def count(outputs: dict[str, torch.Tensor]) -> None:
            nonlocal correct
            correct += int(outputs["correct"])

        executor.infer_from_dataset(
            model, batches(test_images, test_labels, 256, seed=0), thread=1,
            fetch_list=[], fetch_handler=count,
        )
        if first:
            print(
                f"epoch {epoch}: mean loss {summary.mean_loss:.4f}, "
                f"held-out accuracy {correct / args.test:.3f}",
                flush=True,
            )
    # The replicated parameters must be identical on every rank.
    flat = torch.cat([p.detach().reshape(-1) for p in model.features.parameters()])
    gathered = all_gather(flat, dim=0).reshape(fleet.worker_num(), -1)
    in_sync = bool((gathered == gathered[0]).all())
    if first:
        print(
            f"replicated parameters in sync across {fleet.worker_num()} ranks: {in_sync}",
            flush=True,
        )
    fleet.stop_worker()
    if not in_sync:
        sys.exit(1)


if __name__ == "__main__":
    main()
