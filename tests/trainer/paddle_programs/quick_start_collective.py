"""Fleet's quick start, collective form: the role maker from the launcher's
environment, ``distributed_optimizer(...).minimize(cost)`` and nothing else
(Paddle's program never wraps its model).

Run: fleetrun --nproc_per_node=2 quick_start_collective.py OUT_DIR STEPS
Writes OUT_DIR/collective{i}.npz: worker i's parameters after the last step.
"""

import os
import sys

import numpy as np
import torch
from nets import MLP
from utils import gen_data

import trainer.fleet as fleet
import trainer.job.role_maker as role_maker

out_dir, step = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
model = MLP()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
role = role_maker.PaddleCloudRoleMaker(is_collective=True)
fleet.init(role)
optimizer = fleet.distributed_optimizer(optimizer)
for i in range(step):
    input_x, input_y = gen_data(i, workers=[fleet.worker_index()])
    cost = model(input_x, input_y)
    optimizer.minimize(cost)
    print(f"worker_index: {fleet.worker_index()}, step{i} cost = {cost.item():f}")
np.savez(os.path.join(out_dir, f"collective{fleet.worker_index()}.npz"),
         **{n: p.detach().numpy() for n, p in model.named_parameters()})
fleet.stop_worker()
