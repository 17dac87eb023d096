"""Fleet's quick start, local form: one process, SGD(0.01), printing the cost.

Run: python quick_start_local.py OUT_DIR STEPS
Writes OUT_DIR/local.npz: the parameters after the last step.
"""

import os
import sys

import numpy as np
import torch
from nets import MLP
from utils import gen_data

out_dir, step = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
model = MLP()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(step):
    input_x, input_y = gen_data(i, workers=[0, 1])
    cost = model(input_x, input_y)
    optimizer.zero_grad()
    cost.backward()
    optimizer.step()
    print(f"step{i} cost={cost.item():f}")
np.savez(os.path.join(out_dir, "local.npz"),
         **{n: p.detach().numpy() for n, p in model.named_parameters()})
