"""Fleet's quick start, parameter-server form: the same script on the servers
and the workers, a synchronous strategy (every step waits for both workers).

Run: fleetrun --server_num=1 --worker_num=2 quick_start_ps.py OUT_DIR STEPS
Writes OUT_DIR/ps_worker{i}.npz: worker i's parameters after the last step.
"""

import os
import sys

import numpy as np
import torch
from nets import MLP
from utils import gen_data

import trainer.fleet as fleet

out_dir, step = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
model = MLP()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
fleet.init()
strategy = fleet.DistributedStrategy()
strategy.a_sync = False
optimizer = fleet.distributed_optimizer(optimizer, strategy)

if fleet.is_server():
    fleet.init_server()
    fleet.run_server()
elif fleet.is_worker():
    fleet.init_worker()
    for i in range(step):
        input_x, input_y = gen_data(i, workers=[fleet.worker_index()])
        cost = model(input_x, input_y)
        optimizer.minimize(cost)
        print(f"worker_index: {fleet.worker_index()}, step{i} cost = {cost.item():f}")
    np.savez(os.path.join(out_dir, f"ps_worker{fleet.worker_index()}.npz"),
             **{n: p.detach().numpy() for n, p in model.named_parameters()})
    fleet.stop_worker()
