"""Parameter-server training throughput: 1 server + 2 workers on Criteo-layout data.

Each mode (async, GEO with k_steps 20, sync) runs as a real job on 127.0.0.1:
one server process and two worker processes of this script, each worker
training wide&deep (examples/wide_and_deep_ps, sparse tables of dim 4 and 1,
Adagrad) on its own file of raw Criteo lines (examples/criteo/make_data.py,
read through examples/wide_and_deep_ps/reader.py into an InMemoryDataset) for
the given epochs. Loading is not timed. Per worker it measures records/s over
the training loop, the wall time per batch spent in sparse pulls (the
SparseEmbedding forwards' row fetches) and in ``step()`` (the push: sparse and
dense gradients out, dense values back; GEO: the local update and, every k
steps, the delta sync), the CPU time per batch of the worker process (steadier
than records/s on a shared machine) and the RPCs it sends per batch.
Worker 0 then reports the held-out AUC on a third file.

Anchor (issue 3, Paddle 3.0.0's PS on this machine, same job shape):
async 21-34k records/s, GEO (k_steps 20) ~240k records/s, per worker.

Usage: python benchmarks/bench_ps.py [--modes async geo sync] [--records 40000]
       [--epochs 2] [--batch-size 512] [--repeats 1] [--no-write]
Results go to benchmarks/results/ps.md.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "benchmarks" / "data" / "ps"
RESULTS = REPO / "benchmarks" / "results" / "ps.md"
READER = REPO / "examples" / "wide_and_deep_ps" / "reader.py"
JOB_TIMEOUT = int(os.environ.get("BENCH_PS_TIMEOUT", "900"))
PADDLE = {"async": "21-34k", "geo": "~240k", "sync": "segfaults"}


def ensure_data(records: int, seed: int = 0) -> list[Path]:
    """Two training files of ``records`` lines and a held-out file of 10k (the
    held-out file is the same kind of data, written by a second call)."""
    sys.path.insert(0, str(REPO / "examples" / "criteo"))
    from make_data import make_files

    out = DATA / f"r{records}-s{seed}"
    names = [out / f"part-{i:05d}.tsv" for i in range(3)]
    if not all(n.exists() for n in names):
        out.mkdir(parents=True, exist_ok=True)
        make_files(str(out), 3, records, seed=seed)
    return names


# -- one process of a job -----------------------------------------------------------


def job_main(config: dict) -> None:
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "examples" / "wide_and_deep_ps"))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    import torch
    from train import SLOTS, WideDeep, evaluate

    from datafeed import InMemoryDataset
    from trainer import Executor
    from trainer.ps import ParameterServerRuntime, sparse
    from trainer.role import ClusterRole, Role

    torch.set_num_threads(1)
    role = ClusterRole(
        Role.SERVER if config["role"] == "server" else Role.WORKER, config["index"],
        config["workers"], tuple(config["servers"]),
    )

    # The two attributes the runtime reads from a DistributedStrategy.
    strategy = SimpleNamespace(mode=config["mode"], a_sync_configs={"k_steps": config["k"]})
    torch.manual_seed(0)
    model = WideDeep(dim=config["dim"])
    runtime = ParameterServerRuntime(role, strategy)
    opt = runtime.distributed_optimizer(torch.optim.Adagrad(model.parameters(), lr=config["lr"]))
    if role.is_server:
        runtime.init_server()
        runtime.run_server()
        return

    def load(files: list[str], batch_size: int) -> InMemoryDataset:
        dataset = InMemoryDataset()
        dataset.init(batch_size=batch_size, thread_num=1, use_var=SLOTS,
                     pipe_command=f"{sys.executable} {READER}")
        dataset.set_filelist(files)
        dataset.load_into_memory()
        return dataset

    train = load([config["files"][role.index]], config["batch_size"])
    runtime.init_worker()
    store = sparse.current_store()
    pull_time = [0.0]
    real_pull = store.pull

    def timed_pull(*args, **kwargs):
        t = time.perf_counter()
        try:
            return real_pull(*args, **kwargs)
        finally:
            pull_time[0] += time.perf_counter() - t

    store.pull = timed_pull  # type: ignore[method-assign]
    servers = runtime.servers
    assert servers is not None
    rpc_calls = [0]
    real_call = servers.call_async

    def counted_call(*args, **kwargs):
        rpc_calls[0] += 1
        return real_call(*args, **kwargs)

    servers.call_async = counted_call  # type: ignore[method-assign]
    push_time = 0.0
    batches = records = 0
    profiler = None
    if config.get("profile") and role.index == 0:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for epoch in range(config["epochs"]):
        train.local_shuffle(seed=100 * epoch + role.index)
        for batch in train:
            loss = model(batch)["loss"]
            loss.backward()
            t = time.perf_counter()
            opt.step()
            push_time += time.perf_counter() - t
            opt.zero_grad()
            batches += 1
            records += batch.size
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(config["profile"])
    out = {
        "records": records, "batches": batches, "seconds": wall, "cpu": cpu,
        "pull_ms": 1e3 * pull_time[0] / batches, "push_ms": 1e3 * push_time / batches,
        "cpu_ms": 1e3 * cpu / batches, "rpcs_per_batch": rpc_calls[0] / batches,
    }
    store.pull = real_pull  # type: ignore[method-assign]
    servers.call_async = real_call  # type: ignore[method-assign]
    runtime.refresh()
    runtime.barrier_worker()
    if role.index == 0:
        runtime.refresh()
        test = load([config["files"][2]], 1024)
        out["auc"] = evaluate(Executor(), model, test)
    runtime.stop_worker()
    Path(config["out"] + f".{role.index}").write_text(json.dumps(out))


# -- the driver -----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(mode: str, args: argparse.Namespace, files: list[Path], tmp: Path) -> list[dict]:
    config = {
        "mode": mode, "k": args.k_steps if mode == "geo" else 0, "workers": 2,
        "servers": [f"127.0.0.1:{free_port()}"], "files": [str(f) for f in files],
        "epochs": args.epochs, "batch_size": args.batch_size, "dim": args.dim, "lr": args.lr,
        "out": str(tmp / f"{mode}.result"),
        "profile": f"{args.profile}.{mode}" if args.profile else "",
    }
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    procs = []
    for role, index in (("server", 0), ("worker", 0), ("worker", 1)):
        log = open(tmp / f"{mode}.{role}{index}.log", "w")  # noqa: SIM115 - closed below
        # --profile: py-spy samples the server (its RPC handlers run on
        # TensorPipe's threads, out of cProfile's reach).
        spy = ["py-spy", "record", "-r", "250", "--nonblocking", "-f", "raw",
               "-o", f"{args.profile}.server.{mode}.txt", "--"]
        procs.append((subprocess.Popen(
            (spy if args.profile and role == "server" else [])
            + [sys.executable, __file__, "--job", json.dumps({**config, "role": role, "index": index})],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        ), log))
    timed_out = False
    try:
        deadline = time.monotonic() + JOB_TIMEOUT
        for proc, _ in procs:
            proc.wait(timeout=max(1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    if timed_out or any(proc.returncode for proc, _ in procs):
        tails = "\n".join(p.read_text()[-2000:] for p in sorted(tmp.glob(f"{mode}.*.log")))
        raise RuntimeError(f"{mode} job failed:\n{tails}")
    return [json.loads(Path(config["out"] + f".{i}").read_text()) for i in range(2)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", help=argparse.SUPPRESS)
    parser.add_argument("--modes", nargs="+", default=["async", "geo", "sync"],
                        choices=["async", "geo", "sync"])
    parser.add_argument("--records", type=int, default=40_000, help="records per worker")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--dim", type=int, default=4, help="width of the deep sparse table")
    parser.add_argument("--k-steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--profile", default="", help="cProfile worker 0's loop to PROFILE.<mode>")
    args = parser.parse_args()
    if args.job:
        job_main(json.loads(args.job))
        return

    files = ensure_data(args.records)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_ps-") as tmp:
        for mode in args.modes:
            runs = []
            for _ in range(args.repeats):
                workers = run_job(mode, args, files, Path(tmp))
                runs.append(workers)
                rate = [w["records"] / w["seconds"] for w in workers]
                print(f"{mode}: {', '.join(f'{r:,.0f}' for r in rate)} records/s per worker, "
                      f"AUC {workers[0]['auc']:.4f}", flush=True)
            every = [w for run in runs for w in run]
            rows.append({
                "mode": mode if mode != "geo" else f"geo (k={args.k_steps})",
                "rate": statistics.median(w["records"] / w["seconds"] for w in every),
                "pull_ms": statistics.median(w["pull_ms"] for w in every),
                "push_ms": statistics.median(w["push_ms"] for w in every),
                "cpu_ms": statistics.median(w["cpu_ms"] for w in every),
                "rpcs": statistics.median(w["rpcs_per_batch"] for w in every),
                "auc": statistics.median(run[0]["auc"] for run in runs),
                "paddle": PADDLE[mode],
            })
    header = (
        "| mode | records/s per worker | pull ms/batch | push ms/batch | worker CPU ms/batch "
        "| RPCs/batch | held-out AUC | Paddle 3.0.0 records/s |\n"
        "|---|---:|---:|---:|---:|---:|---:|---|\n"
    )
    table = header + "".join(
        f"| {r['mode']} | {r['rate']:,.0f} | {r['pull_ms']:.2f} | {r['push_ms']:.2f} | "
        f"{r['cpu_ms']:.2f} | {r['rpcs']:.2f} | {r['auc']:.4f} | {r['paddle']} |\n"
        for r in rows
    )
    print(table)
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(
            "# Parameter server: 1 server + 2 workers\n\n"
            f"wide&deep (sparse dim {args.dim} + 1, dense MLP, Adagrad lr {args.lr}), "
            f"{args.records:,} Criteo-layout records per worker x {args.epochs} epochs, "
            f"batch {args.batch_size}, median over {args.repeats} run(s) x 2 workers, "
            f"`python benchmarks/bench_ps.py`. The machine's 2 cores are shared by the "
            f"3 processes (and anything else running).\n\n" + table
        )


if __name__ == "__main__":
    main()
