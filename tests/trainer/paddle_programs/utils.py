"""Fleet's quick start ``utils.py``: ``gen_data`` makes a batch of 128 random
records in memory. Seeded by step and worker here, so that the three forms of
the quick start can be compared: the local form trains on what both workers of a
distributed form see in a step, as one batch."""

import torch


def gen_data(step, workers):
    xs, ys = [], []
    for worker in workers:
        g = torch.Generator().manual_seed(1000 * step + worker)
        xs.append(torch.rand(128, 32, generator=g))
        ys.append(torch.randint(0, 2, (128,), generator=g))
    return torch.cat(xs), torch.cat(ys)
