"""Paddle 3.0.0's sparse table memory per row: one server, one worker, N ids.

Runs under Paddle 3.0.0's interpreter (``make bench-paddle-ps``). The driver
starts a server and a worker of this script on 127.0.0.1 (roles as in
paddle_ps.py). The worker's program is one sparse embedding of dim 8 (a
``memory_sparse_table`` with ``SparseAccessor`` and ``SparseAdaGradSGDRule``
for both embed and embedx, Paddle's ``sparse_optimizer: "adagrad"``) summed
into a loss; it trains on ids 0..N-1, 100,000 distinct ids per step, so each id
is pulled (the server creates its row) and pushed once. The driver reads the
server's VmRSS once the worker is connected and again once every id went
through, and prints one JSON line: rows, RSS growth, seconds, accessor.

Usage (bench_table_lifecycle.py --paddle-python does this):
    .venv-paddle30/bin/python benchmarks/paddle_table_memory.py 10000000
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time

DIM = 8
STEP = 100_000


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


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
    start = time.perf_counter()
    for first in range(0, config["rows"], STEP):
        batch = np.arange(first, min(first + STEP, config["rows"]), dtype=np.int64)
        exe.run(program, feed={"ids": batch.reshape(-1, 1)}, fetch_list=[loss])
    with open(config["done"], "w") as out:
        json.dump({"seconds": time.perf_counter() - start}, out)
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
        before = rss(server.pid)
        open(config["go"], "w").close()
        wait_for(config["done"], worker, 3600)
        time.sleep(2)
        after = rss(server.pid)
        with open(config["done"]) as done:
            seconds = json.load(done)["seconds"]
        print(json.dumps({"rows": rows, "growth": after - before, "before": before,
                          "seconds": seconds, "accessor": "SparseAccessor"}))
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
