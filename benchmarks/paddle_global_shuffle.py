"""Paddle's own ``global_shuffle`` on the job of bench_global_shuffle.py: one process.

Runs under Paddle 3.0.0's interpreter (``make bench-paddle-ps`` builds
``.venv-paddle30``): Paddle's global shuffle sends records from worker to
worker through its parameter-server client, which the registry's CPU builds
lack from 3.1 on. bench_global_shuffle.py (``--paddle``) starts one server and
two workers of this script on 127.0.0.1, as bench_ps.py starts paddle_ps.py,
and stops the server once the workers are done.

Each worker loads its own Criteo-layout MultiSlot files into an
``InMemoryDataset`` (``pipe_command="cat"``, the slots of paddle_engine.py),
waits for the other worker, then times ``global_shuffle(fleet)`` and reads
the resident memory before it and the peak during it (VmHWM, reset before
it). The program is the smallest a parameter-server worker needs (one sparse
embedding and a loss): the shuffle does not train. Results go to
``<out>.<worker index>`` as JSON.

Usage (bench_global_shuffle.py does this): paddle_global_shuffle.py '<json config>'
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paddle_ps import set_role_environment, wait_for_files, wait_for_port  # sibling scripts
from process_memory import read_status_kb


def main(config: dict) -> None:
    set_role_environment(config)
    import paddle
    from paddle.distributed import fleet

    paddle.enable_static()
    fleet.init(fleet.PaddleCloudRoleMaker())
    dense = paddle.static.data("dense_input", shape=[-1, 13], dtype="float32")
    sparse = [
        paddle.static.data(f"C{i}", shape=[-1, 1], dtype="int64", lod_level=1)
        for i in range(1, 27)
    ]
    label = paddle.static.data("label", shape=[-1, 1], dtype="int64")
    rows = paddle.static.nn.embedding(input=sparse[0], size=[2**20, 1], is_sparse=True)
    logit = paddle.reshape(rows, [-1, 1]) + paddle.static.nn.fc(dense, 1)
    loss = paddle.mean(paddle.nn.functional.binary_cross_entropy_with_logits(
        logit, paddle.cast(label, "float32")
    ))
    strategy = fleet.DistributedStrategy()
    strategy.a_sync = True
    optimizer = fleet.distributed_optimizer(paddle.optimizer.SGD(0.01), strategy)
    optimizer.minimize(loss)
    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()  # returns only when stopped: bench_global_shuffle.py kills it
        return

    index = config["index"]
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(paddle.static.default_startup_program())
    wait_for_port(config["servers"][0], 60)
    fleet.init_worker()
    dataset = paddle.distributed.InMemoryDataset()
    dataset.init(
        batch_size=512, thread_num=config["threads"], use_var=[dense, *sparse, label],
        pipe_command="cat",
    )
    dataset.set_filelist(config["files"][index])
    dataset.load_into_memory()
    records_in = int(dataset.get_memory_data_size())
    loaded = [f"{config['out']}.loaded.{i}" for i in range(config["workers"])]
    open(loaded[index], "w").close()
    wait_for_files(loaded, 600)  # both loaded: the shuffles start together
    resident = read_status_kb("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:  # VmHWM from here (Linux 4.0+)
        f.write("5")
    started = time.perf_counter()
    # Paddle 3.0.0's global_shuffle(fleet) reads fleet._role_maker.barrier_worker(),
    # which neither the fleet module (no _role_maker) nor the Fleet singleton's
    # PaddleCloudRoleMaker (its barrier is _barrier("worker")) has: the
    # singleton gets the barrier its role maker does have.
    singleton = fleet.fleet
    role_maker = singleton._role_maker
    role_maker.barrier_worker = lambda: role_maker._barrier("worker")
    dataset.global_shuffle(singleton, config["threads"])
    seconds = time.perf_counter() - started
    peak = read_status_kb("VmHWM")
    records_out = int(dataset.get_shuffle_data_size())
    time.sleep(3)  # records still in flight would arrive meanwhile
    out = {
        "records_in": records_in,
        # This worker's records after the shuffle (no fleet: not summed).
        "records_out": records_out,
        "records_out_later": int(dataset.get_shuffle_data_size()),
        "seconds": seconds,
        "resident": resident,
        "peak": peak,
        "version": paddle.__version__,
    }
    fleet.stop_worker()
    with open(f"{config['out']}.{index}", "w") as f:
        json.dump(out, f)
    os._exit(0)  # Paddle 3.0.0's worker can hang in its teardown


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
