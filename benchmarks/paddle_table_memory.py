"""Paddle 3.0.0's sparse table memory per row: one server, one worker, N ids.

Runs under Paddle 3.0.0's interpreter (``make bench-paddle-ps``). The driver
starts a server and a worker of this script on 127.0.0.1 (roles as in
paddle_ps.py). The worker's program is one sparse embedding of dim 8 (a
``memory_sparse_table`` with ``SparseAccessor`` and ``SparseAdaGradSGDRule``
for both embed and embedx, Paddle's ``sparse_optimizer: "adagrad"``) summed
into a loss; it trains on ids 0..N-1, 100,000 distinct ids per step, so each id
is pulled and pushed once (the push creates the row on the server). The worker
flushes its client after every step (its pushes are queued and merged in the
background: unflushed ones are lost when it stops, and a merged message past
brpc's 64 MB limit is refused) and then asks the server for the table's size
(``print_table_stat``: "feasign size"). The driver reads the server's VmRSS
once the worker is connected and again once every id went through, checks
that the table holds exactly N rows (else it fails), and prints one JSON line:
rows, rows held, RSS growth, seconds, accessor.

Usage (bench_table_lifecycle.py --paddle-python does this):
    .venv-paddle30/bin/python benchmarks/paddle_table_memory.py 10000000
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

from process_memory import read_status_kb  # a sibling script

DIM = 8
STEP = 100_000


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(path: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the worker exited ({proc.returncode}) or timed out before {path}")
        time.sleep(0.2)


def rows_held(worker_log: str) -> int | None:
    """The table's size as the worker's ``print_table_stat`` printed it."""
    with open(worker_log, errors="replace") as log:
        sizes = re.findall(r"feasign size: (\d+)", log.read())
    return int(sizes[-1]) if sizes else None


def role(config: dict) -> None:
    """A server or the worker."""
    server, worker = config["server"], config["worker"]
    os.environ.update({
        "PADDLE_PSERVERS_IP_PORT_LIST": server, "PADDLE_TRAINERS_NUM": "1",
        "PADDLE_TRAINER_ENDPOINTS": worker, "FLAGS_enable_pir_api": "0",
    })
    host, port = (server if config["role"] == "server" else worker).rsplit(":", 1)
    os.environ.update({"POD_IP": host, "PADDLE_PORT": port})
    if config["role"] == "server":
        os.environ["TRAINING_ROLE"] = "PSERVER"
    else:
        os.environ.update({"TRAINING_ROLE": "TRAINER", "PADDLE_TRAINER_ID": "0"})
    import numpy as np
    import paddle
    from paddle.distributed import fleet

    paddle.enable_static()
    fleet.init(fleet.PaddleCloudRoleMaker())
    strategy = fleet.DistributedStrategy()
    strategy.a_sync = True
    prefix = "table_parameters.emb.accessor"
    table = {f"{prefix}.accessor_class": "SparseAccessor"}
    for part in ("embed_sgd_param", "embedx_sgd_param"):
        table.update({f"{prefix}.{part}.name": "SparseAdaGradSGDRule",
                      f"{prefix}.{part}.adagrad.learning_rate": 0.05,
                      f"{prefix}.{part}.adagrad.initial_g2sum": 3.0,
                      f"{prefix}.{part}.adagrad.initial_range": 0.01})
    strategy.sparse_table_configs = {"emb": table}
    ids = paddle.static.data("ids", shape=[-1, 1], dtype="int64")
    rows = paddle.static.nn.embedding(input=ids, size=[config["rows"], DIM], is_sparse=True,
                                      param_attr=paddle.ParamAttr(name="emb"))
    loss = paddle.mean(paddle.sum(rows * rows, axis=-1))
    optimizer = fleet.distributed_optimizer(paddle.optimizer.SGD(0.01), strategy)
    optimizer.minimize(loss)
    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()
        return
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(paddle.static.default_startup_program())
    host, port = server.rsplit(":", 1)
    for _ in range(300):
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            break
        except OSError:
            time.sleep(0.2)
    fleet.init_worker()
    open(config["ready"], "w").close()
    while not os.path.exists(config["go"]):
        time.sleep(0.1)
    program = paddle.static.default_main_program()
    from paddle.distributed.ps.the_one_ps import get_the_one_recv_context

    runtime = fleet.fleet._runtime_handle  # the_one_ps: no public flush or table size
    start = time.perf_counter()
    for first in range(0, config["rows"], STEP):
        batch = np.arange(first, min(first + STEP, config["rows"]), dtype=np.int64)
        exe.run(program, feed={"ids": batch.reshape(-1, 1)}, fetch_list=[loss])
        # The client queues pushes and merges the queue into one message: on a busy
        # machine that grew past brpc's 64 MB max_body_size, the server closed the
        # connection and 3.6M of 10M rows were never created. A flush per step keeps
        # each message to one step's 100,000 ids.
        runtime._worker.client_flush()
    seconds = time.perf_counter() - start
    runtime._worker.client_flush()
    # The sparse table's id, found as the_one_ps's own shrink finds it.
    table_id = min(get_the_one_recv_context(runtime.context, is_dense=False))
    # Prints "table id: T, feasign size: N, mf size: M" to this process's stdout (C++).
    runtime._worker.print_table_stat(table_id, 0, 0)
    sys.stdout.flush()
    with open(config["done"], "w") as out:
        json.dump({"seconds": seconds, "table_id": table_id}, out)
    time.sleep(3600)  # the driver reads the server's memory, then ends both


def main(rows: int) -> None:
    work = tempfile.mkdtemp(prefix="paddle-table-")
    config = {"rows": rows, "server": f"127.0.0.1:{free_port()}",
              "worker": f"127.0.0.1:{free_port()}", "ready": f"{work}/ready",
              "go": f"{work}/go", "done": f"{work}/done"}
    procs = []
    try:
        for name in ("server", "worker"):
            with open(f"{work}/{name}.log", "w") as log:  # the child keeps its own copy
                procs.append(subprocess.Popen(
                    [sys.executable, __file__, json.dumps({**config, "role": name})],
                    stdout=log, stderr=subprocess.STDOUT))
        server, worker = procs
        wait_for(config["ready"], worker, 600)
        time.sleep(2)
        before = read_status_kb("VmRSS", server.pid)
        open(config["go"], "w").close()
        wait_for(config["done"], worker, 3600)
        time.sleep(2)
        after = read_status_kb("VmRSS", server.pid)
        with open(config["done"]) as done:
            seconds = json.load(done)["seconds"]
        held = rows_held(f"{work}/worker.log")
        if held != rows:
            raise RuntimeError(f"Paddle's table holds {held} rows, not the {rows} trained")
        print(json.dumps({"rows": rows, "rows_held": held, "growth": after - before,
                          "before": before, "seconds": seconds,
                          "accessor": "SparseAccessor"}))
    except RuntimeError:
        for name in ("server", "worker"):
            with open(f"{work}/{name}.log") as log:
                sys.stderr.write(f"--- {name}\n{log.read()[-3000:]}\n")
        raise
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    if sys.argv[1].startswith("{"):
        role(json.loads(sys.argv[1]))
    else:
        main(int(sys.argv[1]))
