"""fleetfeed's sparse table memory per row as a server process: one server, one
worker, N ids, as paddle_table_memory.py measures Paddle 3.0.0's.

The driver starts a server and a worker of this script on 127.0.0.1 (async, a
job key, the parameter server's own transport). The worker's model is one
``SparseEmbedding`` of dim 8 with Adagrad (lr 0.05) whose rows' squares are
summed into the loss; it trains on ids 0..N-1, 100,000 distinct ids per step,
so each id is pulled (the pull creates the row) and pushed once, then waits
for every push (``barrier_worker``) and asks the server for the table's size.
The driver reads the server's VmRSS once the worker is connected and again
once every id went through, checks that the table holds exactly N rows (else it
fails), and prints one JSON line: rows, rows held, RSS growth, seconds.

Usage (bench_table_lifecycle.py --paddle-python and bench_table_storage.py run it):
    python benchmarks/fleetfeed_table_memory.py 10000000 [float16]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from process_memory import read_status_kb  # a sibling script

REPO = Path(__file__).resolve().parent.parent
DIM = 8
STEP = 100_000
JOB_KEY = "fleetfeed-table-memory-0123456789abcdef"


def role(config: dict) -> None:
    """The server or the worker."""
    sys.path.insert(0, str(REPO))
    import torch

    from trainer.job.role import ClusterRole, Role
    from trainer.nn import SparseEmbedding
    from trainer.ps import ParameterServerRuntime
    from trainer.ps import server as handlers

    torch.set_num_threads(1)
    is_server = config["role"] == "server"
    cluster = ClusterRole(Role.SERVER if is_server else Role.WORKER, 0, 1,
                          (config["server"],), job_secret=JOB_KEY)
    model = torch.nn.Module()
    model.emb = SparseEmbedding(DIM, "emb", optimizer={"type": "adagrad", "lr": 0.05},
                                storage=config["storage"])
    model.bias = torch.nn.Parameter(torch.zeros(1))
    runtime = ParameterServerRuntime(cluster, None)
    optimizer = runtime.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                              model)
    if is_server:
        runtime.init_server()
        runtime.run_server()
        return
    runtime.init_worker()
    Path(config["ready"]).touch()
    while not os.path.exists(config["go"]):
        time.sleep(0.1)
    start = time.perf_counter()
    for first in range(0, config["rows"], STEP):
        ids = torch.arange(first, min(first + STEP, config["rows"]), dtype=torch.int64)
        rows = model.emb(ids)
        loss = (rows * rows).sum(-1).mean() + model.bias.sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    runtime.barrier_worker()  # every push applied
    seconds = time.perf_counter() - start
    held = runtime.servers.call(0, handlers.table_size, "emb")
    Path(config["done"]).write_text(json.dumps({"seconds": seconds, "rows_held": held}))
    while not os.path.exists(config["stop"]):
        time.sleep(0.1)
    runtime.stop_worker()


def wait_for(path: str, procs: list[subprocess.Popen], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            raise RuntimeError(f"a process exited or timed out before {path}")
        time.sleep(0.2)


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    if len(sys.argv) > 2 and sys.argv[2].startswith("{"):
        role(json.loads(sys.argv[2]))
        return
    storage = sys.argv[2] if len(sys.argv) > 2 else "float32"
    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_ps import free_port

    with tempfile.TemporaryDirectory(prefix="table-memory-") as tmp:
        config = {"rows": rows, "server": f"127.0.0.1:{free_port()}", "storage": storage,
                  **{k: os.path.join(tmp, k) for k in ("ready", "go", "done", "stop")}}
        env = dict(os.environ, FLEETFEED_CHECKPOINT_ROOT=tmp)
        procs = []
        logs = []
        try:
            for name in ("server", "worker"):
                log = open(os.path.join(tmp, f"{name}.log"), "w")  # noqa: SIM115 - closed below
                logs.append(log)
                procs.append(subprocess.Popen(
                    [sys.executable, __file__, str(rows), json.dumps({**config, "role": name})],
                    stdout=log, stderr=subprocess.STDOUT, env=env,
                ))
            wait_for(config["ready"], procs, 300)
            time.sleep(1.0)  # the connection settled
            before = read_status_kb("VmRSS", procs[0].pid)
            Path(config["go"]).touch()
            wait_for(config["done"], procs, 3600)
            after = read_status_kb("VmRSS", procs[0].pid)
            done = json.loads(Path(config["done"]).read_text())
            Path(config["stop"]).touch()
            for proc in procs:
                proc.wait(timeout=120)
        except BaseException:
            for proc in procs:
                proc.kill()
            for name in ("server", "worker"):
                path = os.path.join(tmp, f"{name}.log")
                if os.path.exists(path):
                    print(f"--- {name}\n{Path(path).read_text()[-3000:]}", file=sys.stderr)
            raise
        finally:
            for log in logs:
                log.close()
    if done["rows_held"] != rows:
        raise SystemExit(f"the server holds {done['rows_held']} rows, not {rows}")
    print(json.dumps({"rows": rows, "rows_held": done["rows_held"], "growth": after - before,
                      "seconds": done["seconds"], "storage": storage}))


if __name__ == "__main__":
    main()
