"""Parameter-server training throughput: 1 server + 2 workers on Criteo-layout data.

Each mode (async, GEO with k_steps 20, sync) runs as a real job on 127.0.0.1:
one server process and two worker processes of this script, each worker
training wide&deep (examples/wide_and_deep_ps, sparse tables of dim 4 and 1
with Adagrad, the dense MLP with Adam) on its own file of raw Criteo lines
(examples/criteo/make_data.py, read through examples/wide_and_deep_ps/reader.py
into an InMemoryDataset) for the given epochs. Loading is not timed. Per worker
it measures records/s over the training loop, the wall time per batch spent in
sparse pulls (the SparseEmbedding forwards' row fetches) and in ``step()`` (the
push: sparse and dense gradients out, dense values back; GEO: the local update
and, every k steps, the delta sync), the CPU time per batch of the worker
process (steadier than records/s on a shared machine) and the RPCs it sends
per batch. Worker 0 then reports the held-out AUC on a third file.

``--paddle`` runs the same job on Paddle 3.0.0's own parameter server
(benchmarks/paddle_ps.py, in the interpreter of ``make bench-paddle-ps``) on
the same records, alternating with fleetfeed's job in every repeat, and adds
its records/s per worker, held-out AUC and the ratio to the table. A Paddle
job that fails (its sync mode segfaults) is reported as such and not retried.

Usage: python benchmarks/bench_ps.py [--paddle] [--modes async geo sync]
       [--records 40000] [--epochs 2] [--batch-size 512] [--repeats 1] [--no-write]
Results go to benchmarks/results/ps.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import results_file

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "benchmarks" / "data" / "ps"
RESULTS = REPO / "benchmarks" / "results" / "ps.md"
READER = REPO / "examples" / "wide_and_deep_ps" / "reader.py"
JOB_TIMEOUT = int(os.environ.get("BENCH_PS_TIMEOUT", "900"))
PADDLE_PYTHON = REPO / ".venv-paddle30" / "bin" / "python"


def paddle_data(files: list[Path]) -> tuple[list[Path], int]:
    """The same records as MultiSlot text for Paddle, each distinct id renumbered
    0..V-1 in order of first appearance (a bijection: the same learning
    problem); returns the files and V. Paddle's GEO mode keeps a dense local
    copy of each table sized by the vocabulary, so its ids must be below it."""
    out = files[0].parent / "paddle"
    names = [out / (f.stem + ".slots") for f in files]
    vocab_file = out / "vocab_size"
    if vocab_file.exists() and all(n.exists() for n in names):
        return names, int(vocab_file.read_text())
    out.mkdir(exist_ok=True)
    numbers: dict[str, str] = {}
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for source, target in zip(files, names, strict=True):
        with open(source, "rb") as stdin:
            text = subprocess.run([sys.executable, str(READER)], stdin=stdin, env=env,
                                  capture_output=True, text=True, check=True).stdout
        lines = []
        for line in text.splitlines():
            tokens = line.split()
            # 13 dense values, then 26 slots of "1 <id>", then "1 <label>".
            for position in range(15, 15 + 2 * 26, 2):
                tokens[position] = numbers.setdefault(tokens[position], str(len(numbers)))
            lines.append(" ".join(tokens) + "\n")
        target.write_text("".join(lines))
    vocab_file.write_text(str(len(numbers)))
    return names, len(numbers)


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
    from trainer.embedding import stores
    from trainer.job.role import ClusterRole, Role
    from trainer.ps import ParameterServerRuntime

    torch.set_num_threads(1)
    role = ClusterRole(
        Role.SERVER if config["role"] == "server" else Role.WORKER, config["index"],
        config["workers"], tuple(config["servers"]), job_secret=config.get("key"),
    )

    # The two attributes the runtime reads from a DistributedStrategy.
    strategy = SimpleNamespace(mode=config["mode"], a_sync_configs={"k_steps": config["k"]})
    torch.manual_seed(0)
    # Adagrad on the sparse tables, Adam on the dense parameters: what Paddle's
    # PS can run too (its servers take only SGD or Adam for dense parameters).
    model = WideDeep(dim=config["dim"], sparse_optimizer={"type": "adagrad", "lr": config["lr"]})
    runtime = ParameterServerRuntime(role, strategy)
    # foreach: one multi-tensor update instead of torch's per-tensor loop, its CPU default.
    opt = runtime.distributed_optimizer(
        torch.optim.Adam(model.parameters(), lr=config["dense_lr"], foreach=True)
    )
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
    store = stores.current_store()
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


# What fleetrun gives a job: its processes authenticate with keys derived from it.
JOB_KEY = "bench-ps-job-key-0123456789abcdef"


def run_job(
    mode: str, args: argparse.Namespace, files: list[Path], tmp: Path,
    key: str | None = JOB_KEY, servers: int = 1, delay: float | None = None,
) -> list[dict]:
    """One fleetfeed job (``servers`` servers + 2 workers of this script); the
    workers' results. ``key``: the job key (None: the transport's
    unauthenticated NULL mechanism). ``delay``: the workers reach the servers
    through a relay adding that many seconds each way (tests/helpers/latency_relay.py)."""
    out = str(tmp / f"{mode}.result")

    def attempt() -> None:
        config = {
            "key": key,
            "mode": mode, "k": args.k_steps if mode == "geo" else 0, "workers": 2,
            "servers": [f"127.0.0.1:{free_port()}" for _ in range(servers)],
            "files": [str(f) for f in files],
            "epochs": args.epochs, "batch_size": args.batch_size, "dim": args.dim,
            "lr": args.lr, "dense_lr": args.dense_lr, "out": out,
            "profile": f"{args.profile}.{mode}" if args.profile else "",
        }
        with relayed(config["servers"], delay) as seen_by_workers:
            commands = []
            roles = [("server", i) for i in range(servers)] + [("worker", 0), ("worker", 1)]
            for role, index in roles:
                # --profile: py-spy samples the server (its handlers run on the
                # transport's threads, out of cProfile's reach).
                spy = ["py-spy", "record", "-r", "250", "--nonblocking", "-f", "raw",
                       "-o", f"{args.profile}.server.{mode}.txt", "--"]
                own = {**config, "role": role, "index": index}
                if role == "worker":
                    own["servers"] = seen_by_workers
                commands.append((f"{mode}.{role}{index}",
                                 (spy if args.profile and role == "server" else [])
                                 + [sys.executable, __file__, "--job", json.dumps(own)]))
            run_processes(commands, tmp, server_stops_itself=True, servers=servers)

    with_fresh_ports(attempt, f"fleetfeed {mode} job")
    return [json.loads(Path(out + f".{i}").read_text()) for i in range(2)]


# The bytes each relayed job's relay carried, in the order the jobs ran: shows
# that the workers' traffic went through it.
RELAYED_BYTES: list[int] = []


@contextlib.contextmanager
def relayed(servers: list[str], delay: float | None) -> Iterator[list[str]]:
    """The server endpoints the workers are given: the servers' own, or with
    ``delay``, those of a relay adding it each way, for the length of the job."""
    if delay is None:
        yield servers
        return
    sys.path.insert(0, str(REPO / "tests" / "helpers"))
    from latency_relay import LatencyRelay

    with LatencyRelay(servers, delay) as relay:
        yield relay.endpoints
    RELAYED_BYTES.append(relay.relayed_bytes)


def run_paddle_job(mode: str, args: argparse.Namespace, files: list[Path], vocab: int,
                   tmp: Path, delay: float | None = None) -> list[dict]:
    """The same job on Paddle's parameter server (benchmarks/paddle_ps.py);
    ``delay``: through a relay, as ``run_job``."""
    out = str(tmp / f"paddle-{mode}.result")
    script = str(REPO / "benchmarks" / "paddle_ps.py")

    def attempt() -> None:
        config = {
            "mode": mode, "k": args.k_steps if mode == "geo" else 0, "workers": 2,
            "servers": [f"127.0.0.1:{free_port()}"],
            "worker_endpoints": [f"127.0.0.1:{free_port()}" for _ in range(2)],
            "files": [str(f) for f in files], "vocab": vocab, "epochs": args.epochs,
            "batch_size": args.batch_size, "dim": args.dim, "lr": args.lr,
            "dense_lr": args.dense_lr, "init_scale": 0.01,
            "paddle_sparse_lr": args.paddle_sparse_lr,
            "paddle_initial_g2sum": args.paddle_initial_g2sum, "out": out,
        }
        with relayed(config["servers"], delay) as seen_by_workers:
            commands = []
            for role, index in (("server", 0), ("worker", 0), ("worker", 1)):
                own = {**config, "role": role, "index": index}
                if role == "worker":
                    own["servers"] = seen_by_workers  # a relay answers before its server
                    own["server_listening"] = config["servers"][0]
                commands.append((f"paddle-{mode}.{role}{index}",
                                 [args.paddle_python, script, json.dumps(own)]))
            run_processes(commands, tmp, server_stops_itself=False)

    with_fresh_ports(attempt, f"Paddle {mode} job")
    return [json.loads(Path(out + f".{i}").read_text()) for i in range(2)]


class PortTaken(RuntimeError):
    """A job's process could not listen: the port ``free_port`` chose was given
    to another socket before the process bound it (free_port's race: between
    its close and the bind, any process may be given that port, as its own
    bind(0) or as a connection's local port). The job trained nothing."""


def with_fresh_ports(attempt: Callable[[], None], what: str, attempts: int = 3) -> None:
    """Runs ``attempt`` (one job, choosing its ports with ``free_port``) again,
    on fresh ports, when a port was taken (``PortTaken``), up to ``attempts`` times."""
    for tried in range(1, attempts + 1):
        try:
            attempt()
            return
        except PortTaken as taken:
            if tried == attempts:
                raise
            print(f"{what}: {taken.args[0].splitlines()[0]}; a port chosen free was taken "
                  "before the job bound it: running the job again on fresh ports", flush=True)


def run_processes(
    commands: list[tuple[str, list[str]]], tmp: Path, server_stops_itself: bool,
    servers: int = 1,
) -> None:
    """Runs a job's processes (the ``servers`` servers first) until the workers
    end, then stops the servers if they do not stop by themselves (Paddle's). Raises
    RuntimeError with every log's tail when a process fails or the job
    exceeds BENCH_PS_TIMEOUT; every process is gone on return."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    procs = []
    try:
        for name, command in commands:
            with open(tmp / f"{name}.log", "w") as log:
                # cwd: Paddle's train_from_dataset writes <id>_train_desc.prototxt there.
                procs.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                              env=env, cwd=tmp))
        server_procs, workers = procs[:servers], procs[servers:]
        deadline = time.monotonic() + JOB_TIMEOUT
        failed = ""
        while True:
            codes = [p.poll() for p in procs]
            if any(c not in (None, 0) for c in codes):
                failed = ", ".join(
                    f"{name} exited with status {c}"
                    for (name, _), c in zip(commands, codes, strict=True)
                    if c not in (None, 0)
                )
                break
            workers_done = all(w.poll() == 0 for w in workers)
            servers_done = all(p.poll() == 0 for p in server_procs)
            if workers_done and (not server_stops_itself or servers_done):
                break
            if time.monotonic() > deadline:
                failed = f"the job did not end within {JOB_TIMEOUT}s (BENCH_PS_TIMEOUT)"
                break
            time.sleep(0.2)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if failed:
        tails = "\n".join(f"--- {name}.log:\n" + (tmp / f"{name}.log").read_text()[-2000:]
                          for name, _ in commands)
        error = PortTaken if "Address already in use" in tails else RuntimeError
        raise error(f"{commands[0][0].split('.')[0]} job failed: {failed}\n{tails}")


def summarize(runs: list[list[dict]]) -> dict:
    """Medians over every worker of every run (AUC: over the runs' worker 0)."""
    every = [w for run in runs for w in run]

    def median(key: str) -> float | None:
        values = [w[key] for w in every if key in w]
        return statistics.median(values) if values else None

    return {
        "rate": statistics.median(w["records"] / w["seconds"] for w in every),
        "pull_ms": median("pull_ms"), "push_ms": median("push_ms"), "cpu_ms": median("cpu_ms"),
        "rpcs": median("rpcs_per_batch"),
        "auc": statistics.median(run[0]["auc"] for run in runs),
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", help=argparse.SUPPRESS)
    parser.add_argument("--modes", nargs="+", default=["async", "geo", "sync"],
                        choices=["async", "geo", "sync"])
    parser.add_argument("--records", type=int, default=40_000, help="records per worker")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--dim", type=int, default=4, help="width of the deep sparse table")
    parser.add_argument("--k-steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.05, help="the sparse tables' Adagrad lr")
    parser.add_argument("--dense-lr", type=float, default=0.001,
                        help="the dense parameters' Adam lr")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--paddle", action="store_true",
                        help="also run Paddle 3.0.0's PS on the same job, "
                             "alternating with fleetfeed")
    parser.add_argument("--paddle-python", default=str(PADDLE_PYTHON),
                        help="the interpreter with paddlepaddle 3.0.0 (make bench-paddle-ps)")
    parser.add_argument("--paddle-sparse-lr", type=float, default=0.2,
                        help="Paddle's sparse Adagrad lr "
                             "(its rule differs from torch's: see paddle_ps.py)")
    parser.add_argument("--paddle-initial-g2sum", type=float, default=0.1)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--profile", default="", help="cProfile worker 0's loop to PROFILE.<mode>")
    return parser


def default_job_args(**overrides: object) -> argparse.Namespace:
    """The job settings of a run with no options, with ``overrides`` (for other benchmarks)."""
    args = _parser().parse_args([])
    for name, value in overrides.items():
        setattr(args, name, value)
    return args


def main() -> None:
    parser = _parser()
    args = parser.parse_args()
    if args.job:
        job_main(json.loads(args.job))
        return
    if args.paddle and not Path(args.paddle_python).exists():
        parser.error(f"--paddle needs Paddle 3.0.0's interpreter at {args.paddle_python} "
                     "(make bench-paddle-ps builds it)")

    load_before = results_file.load_average()
    files = ensure_data(args.records)
    paddle_files, vocab = paddle_data(files) if args.paddle else ([], 0)
    runs: dict[tuple[str, str], list[list[dict]]] = {}
    paddle_failures: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bench_ps-") as tmp:
        # Contenders alternate within each repeat, so load on the shared
        # machine hits both alike.
        for repeat in range(args.repeats):
            for mode in args.modes:
                with_paddle = args.paddle and mode not in paddle_failures
                contenders = ["fleetfeed"] + (["paddle"] if with_paddle else [])
                if repeat % 2:
                    contenders.reverse()
                for who in contenders:
                    job_dir = Path(tmp) / f"{who}-{mode}-{repeat}"
                    job_dir.mkdir()
                    try:
                        workers = (run_job(mode, args, files, job_dir) if who == "fleetfeed"
                                   else run_paddle_job(mode, args, paddle_files, vocab, job_dir))
                    except RuntimeError as error:
                        if who == "fleetfeed":
                            raise
                        paddle_failures[mode] = paddle_failure(str(error))
                        print(f"paddle {mode}: failed ({paddle_failures[mode]})", flush=True)
                        continue
                    runs.setdefault((who, mode), []).append(workers)
                    rate = [w["records"] / w["seconds"] for w in workers]
                    print(f"{who} {mode}: {', '.join(f'{r:,.0f}' for r in rate)} "
                          f"records/s per worker, AUC {workers[0]['auc']:.4f}", flush=True)
    table = results_table(args, runs, paddle_failures)
    print(table)
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        paddle_note = (
            f" Paddle: paddlepaddle 3.0.0, `benchmarks/paddle_ps.py`, the same records "
            f"(ids renumbered), alternating with fleetfeed in each repeat; its sparse "
            f"Adagrad rule lr {args.paddle_sparse_lr}, initial_g2sum {args.paddle_initial_g2sum}."
            if args.paddle else ""
        )
        RESULTS.write_text(
            "# Parameter server: 1 server + 2 workers\n\n"
            f"wide&deep (sparse dim {args.dim} + 1, Adagrad lr {args.lr} on the sparse tables, "
            f"dense MLP with Adam lr {args.dense_lr}), {args.records:,} Criteo-layout records "
            f"per worker x {args.epochs} epochs, batch {args.batch_size}, median over "
            f"{args.repeats} run(s) x 2 workers, `{results_file.command()}` at "
            f"{results_file.commit()}, 1-minute load average {load_before:.2f} before the "
            f"runs. The machine's 2 cores are shared by the 3 processes "
            f"(and anything else running).{paddle_note}\n\n" + table + "\n\n"
            + ("## How Paddle's side is set up\n\n" + PADDLE_METHOD + "\n" if args.paddle else "")
        )


# What the Paddle job is (benchmarks/paddle_ps.py), written with every run.
PADDLE_METHOD = """\
The same model as a static graph (old IR, `FLAGS_enable_pir_api=0`),
`paddle.static.nn.embedding(is_sparse=True)` tables on the server,
`exe.train_from_dataset` timed per epoch, 1 server + 2 workers started with
Paddle's environment variables; the workers wait for the server's port
themselves before `init_worker()` (Paddle 3.0.0's do not), and the driver stops
the server once both workers are done (it never stops on its own). Optimizers:
Adam on the dense parameters on both sides (Paddle's servers take only SGD or
Adam there); Adagrad on the sparse tables: torch's per-coordinate Adagrad in
fleetfeed, Paddle's `SparseAdaGradSGDRule` (one g2sum per row) in Paddle, whose
lr and initial_g2sum were picked by held-out AUC after async training. Paddle's
GEO workers train their local copies with the program's own optimizer (Adam),
fleetfeed's with the tables' Adagrad. Paddle's sync mode crashes (`SIGSEGV` in
`SendBarrierOp::RunImpl`, from `HogwildWorker::TrainFiles`) during the first
`train_from_dataset`; the benchmark stops trying it after the first failure.
"""


def paddle_failure(message: str) -> str:
    """A short reason from a failed Paddle job's logs (the operator a crash was in)."""
    if "Segmentation fault" in message or "SIGSEGV" in message:
        op = re.search(r"paddle::operators::(\w+)::RunImpl", message)
        return "segfault" + (f" in {op.group(1)}" if op else "")
    return message.splitlines()[0][:200]


def results_table(args: argparse.Namespace, runs: dict, paddle_failures: dict[str, str]) -> str:
    paddle = args.paddle
    header = ("| mode | fleetfeed records/s per worker | pull ms/batch | push ms/batch "
              "| worker CPU ms/batch | RPCs/batch | fleetfeed AUC |")
    rule = "|---|---:|---:|---:|---:|---:|---:|"
    if paddle:
        header += (" Paddle 3.0.0 records/s per worker | Paddle AUC | fleetfeed / Paddle "
                   "| fleetfeed / Paddle, paired by repeat (median, range) |")
        rule += "---:|---:|---:|---|"
    lines = [header, rule]
    for mode in args.modes:
        ours = summarize(runs[("fleetfeed", mode)])
        label = mode if mode != "geo" else f"geo (k={args.k_steps})"
        line = (f"| {label} | {ours['rate']:,.0f} | {ours['pull_ms']:.2f} | "
                f"{ours['push_ms']:.2f} | {ours['cpu_ms']:.2f} | {ours['rpcs']:.2f} | "
                f"{ours['auc']:.4f} |")
        if paddle:
            if ("paddle", mode) in runs:
                theirs = summarize(runs[("paddle", mode)])
                # Each repeat ran both back to back: their ratio is the least
                # affected by the shared machine's load changing between repeats.
                # Paddle's runs stop at its first failure: pair the repeats it finished.
                pairs = zip(runs[("fleetfeed", mode)], runs[("paddle", mode)], strict=False)
                paired = sorted(summarize([a])["rate"] / summarize([b])["rate"] for a, b in pairs)
                line += (f" {theirs['rate']:,.0f} | {theirs['auc']:.4f} | "
                         f"{ours['rate'] / theirs['rate']:.2f}x | {statistics.median(paired):.2f}x "
                         f"({paired[0]:.2f}-{paired[-1]:.2f}) |")
            else:
                line += f" {paddle_failures.get(mode, 'not run')} | - | - | - |"
        lines.append(line)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
