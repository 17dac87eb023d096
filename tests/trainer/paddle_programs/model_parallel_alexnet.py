"""Paddle's model-parallel AlexNet (its low-level distributed API page), ported as
a Paddle user ports it: ``paddle`` -> ``torch``, ``paddle.distributed.fleet`` ->
``trainer.fleet``, ``paddle.distributed.all_gather`` -> ``trainer.collective.all_gather``.
The convolutions are data-parallel; each fully connected layer holds a slice of
its output features on each rank (``is_distributed = True``), gathers every
rank's input and gives each rank back its own rows.

Narrower than Paddle's (the channel counts and the classifier's width are
arguments; the layer sequence, kernels, strides and the 224x224 input are
Paddle's), so that it runs in the suite on a CPU.

Run: fleetrun --nproc_per_node=2 model_parallel_alexnet.py OUT_DIR [STEPS]
Writes, for the test to replay, OUT_DIR/rank{r}.npz: the parameters before the
first step, the first step's inputs, outputs and gradients, and the parameters
after the last step.
"""

import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from trainer import collective, fleet


class ModelParallelLinear(nn.Module):
    def __init__(self, in_dim, rank_num, rank_id, class_num):
        super().__init__()
        if class_num % rank_num:
            raise ValueError("Number of classes must be divisible the number of ranks.")
        shard_dims = class_num // rank_num
        self.linear = nn.Linear(in_dim, shard_dims)
        self.rank_num = rank_num
        self.rank_id = rank_id
        for parameter in self.linear.parameters():
            parameter.is_distributed = True

    def forward(self, x):
        global_x = collective.all_gather(x, dim=0)
        out = self.linear(global_x)
        all_outs = collective.all_gather(out, dim=1)
        return torch.chunk(all_outs, self.rank_num)[self.rank_id]


class SimpleModelParallelClassifierNet(nn.Module):
    def __init__(self, class_num, rank_num, rank_id, channels=(16, 48, 96, 64, 64), hidden=256):
        super().__init__()
        c1, c2, c3, c4, c5 = channels
        self.conv1 = nn.Conv2d(3, c1, kernel_size=11, stride=4, padding=2)
        self.max_pool1 = nn.MaxPool2d(kernel_size=3, stride=2)
        self.conv2 = nn.Conv2d(c1, c2, kernel_size=5, padding=2)
        self.max_pool2 = nn.MaxPool2d(kernel_size=3, stride=2)
        self.conv3 = nn.Conv2d(c2, c3, kernel_size=3)
        self.conv4 = nn.Conv2d(c3, c4, kernel_size=3)
        self.conv5 = nn.Conv2d(c4, c5, kernel_size=3)
        self.max_pool5 = nn.MaxPool2d(kernel_size=3, stride=2)
        self.model_parallel_linear1 = ModelParallelLinear(c5 * 9, rank_num, rank_id, hidden)
        self.model_parallel_linear2 = ModelParallelLinear(hidden, rank_num, rank_id, hidden)
        self.model_parallel_linear3 = ModelParallelLinear(hidden, rank_num, rank_id, class_num)
        self.relu = nn.ReLU()

    def forward(self, x):
        x = self.max_pool1(self.relu(self.conv1(x)))
        x = self.max_pool2(self.relu(self.conv2(x)))
        x = self.relu(self.conv3(x))
        x = self.relu(self.conv4(x))
        x = self.max_pool5(self.relu(self.conv5(x)))
        x = F.dropout(x, 0.5)
        x = torch.reshape(x, [x.shape[0], -1])
        x = self.model_parallel_linear1(x)
        x = F.dropout(x, 0.5)
        x = self.model_parallel_linear2(x)
        out = self.model_parallel_linear3(x)
        return out


def batch(step, rank):
    """Paddle's program draws random images and labels; seeded here so the test
    can replay them."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn([2, 3, 224, 224], generator=g), torch.randint(0, 10, (2,), generator=g)


def snapshot(prefix, named):
    return {f"{prefix}/{name}": t.detach().numpy().copy() for name, t in named}


def main():
    out_dir, steps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 20
    torch.set_num_threads(1)
    fleet.init(is_collective=True)
    rank = fleet.worker_index()
    torch.manual_seed(10 + rank)  # as in Paddle's program, each rank starts its own way

    layer = SimpleModelParallelClassifierNet(
        class_num=10, rank_num=fleet.worker_num(), rank_id=fleet.worker_index()
    )
    adam = torch.optim.Adam(layer.parameters(), lr=0.001)
    adam = fleet.distributed_optimizer(adam)
    dp_layer = fleet.distributed_model(layer)

    saved = snapshot("start", layer.named_parameters())
    for step in range(steps):
        image, label = batch(step, rank)
        torch.manual_seed(7 + 100 * step + rank)  # the dropout masks, replayed by the test
        output = dp_layer(image)
        loss = F.cross_entropy(output, label)
        print(f"step:{step}\tloss:{loss.item()}", flush=True)
        loss.backward()
        if step == 0:
            saved["output"] = output.detach().numpy().copy()
            saved.update(snapshot("grad", ((n, p.grad) for n, p in layer.named_parameters())))
        adam.step()
        adam.clear_grad()
    saved.update(snapshot("end", layer.named_parameters()))
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **saved)
    fleet.stop_worker()


if __name__ == "__main__":
    main()
