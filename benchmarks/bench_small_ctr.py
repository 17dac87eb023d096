"""The small CTR model of issue 14, fleetfeed and Paddle side by side in one run.

The model (benchmarks/make_small_ctr.py writes its data): dense 4 floats plus
three sparse slots embedded at dim 4 (u: 1 id of 3,000; i: 1-3 ids of 5,000,
summed; c: 1 id of 50), concatenated (16 wide) into a 16-16-1 ReLU MLP,
logistic loss; 4 files x 20,000 lines, batch 256, 2 epochs, each a
``local_shuffle`` (not timed) and a timed ``train_from_dataset``; held-out AUC
on heldout.txt (20,000 lines).

Rows:
* local thread=1, thread=2: one process, Adagrad lr 0.1 on every parameter.
  fleetfeed: ``train_from_dataset(thread=N, hogwild=N > 1)`` (Hogwild
  processes on the InMemoryDataset: trainer/loop/hogwild_processes.py) with
  ``torch.set_num_threads(1)`` (as bench_hogwild.py: torch's intra-op pool on
  2 busy cores costs 17x CPU per batch); the sparse tables in process through
  ``fleet.distributed_optimizer``. Paddle 3.3.1 (.venv-paddle, ``make bench-paddle``):
  ``Executor.train_from_dataset(thread=N)`` on ``InMemoryDataset``
  (benchmarks/paddle_small_ctr.py).
* async, geo (k_steps 20), sync: 1 server + 2 workers on 127.0.0.1, worker w
  training on part-2w and part-2w+1 with ``train_from_dataset(thread=1)``.
  fleetfeed: Adagrad lr 0.1 on the dense parameters and on the tables (their
  own ``{"type": "adagrad"}``), the job key set as fleetrun sets it (CURVE).
  Paddle 3.0.0 (.venv-paddle30, ``make bench-paddle-ps``; the last CPU build
  with the PS runtime):
  Adam on the dense parameters (its PS takes only SGD or Adam), its row-wise
  ``SparseAdaGradSGDRule`` on the tables (lr and initial_g2sum set apart:
  paddle_ps.py's notes). Records/s: both workers' records over the slower
  worker's timed seconds.

Each run is a fresh process (a fresh job); within every repeat the contenders
alternate (the first one swaps each repeat), and the table gives medians.
Conditions: ``quiet`` (whatever else runs on the machine: its load average is
reported) and ``loaded`` (one ``python -c 'while True: pass'`` per core
started beside the runs, stopped after, also when a run fails).

The per-step split (fleetfeed, ms per batch, summed over threads): data
wait, forward (including the sparse pull), pull, backward, step = optimizer
(the dense update) + push (sparse gradients to the tables or the servers;
GEO: the local tables' update and a sync every k steps), from the
RunSummary's timings; a trainer whose RunSummary lacks pull/optimizer/push
gets them from wrappers around the row store's ``pull`` and ``push``
(``GeoStore.apply``), with optimizer = step - push.

Every run is checked to have trained all its records (epochs x 4 files x
lines; PS: both workers together) before it counts.

Usage: python benchmarks/bench_small_ctr.py [--repeats 3] [--only local|ps]
       [--conditions quiet loaded] [--lines 20000] [--no-write]
Results go to benchmarks/results/small_ctr.md, rewritten whole by each run
(every figure and note in it comes from the run, with its commit and loads).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
import bench_ps  # noqa: E402  (its job runner: run_processes, free_port, JOB_KEY)
import results_file  # noqa: E402  (the commit and command every figure carries)

DATA = REPO / "benchmarks" / "data" / "small_ctr"
RESULTS = REPO / "benchmarks" / "results" / "small_ctr.md"
PADDLE_SCRIPT = REPO / "benchmarks" / "paddle_small_ctr.py"
PADDLE_LOCAL = REPO / ".venv-paddle" / "bin" / "python"  # the Makefile's bench-paddle
PADDLE_PS = REPO / ".venv-paddle30" / "bin" / "python"
RUN_TIMEOUT = 900
LOCAL_ROWS = ("local1", "local2")
PS_ROWS = ("async", "geo", "sync")
ROW_LABEL = {"local1": "local thread=1", "local2": "local thread=2", "async": "PS async",
             "geo": "PS GEO (k=20)", "sync": "PS sync"}
# Issue 14's acceptance: fleetfeed / Paddle at least this (local thread=1: none).
TARGET = {"local2": 1.0, "async": 2.0, "geo": 1.2}
PHASES = ("data_wait", "forward", "pull", "backward", "step", "optimizer", "push")


# -- fleetfeed's side (in its own process) ------------------------------------------


def cpu_seconds() -> float:
    """CPU time of this process and of its children: those reaped, and the
    Hogwild trainer processes waiting between passes (trainer/loop/hogwild_processes.py),
    all threads."""
    from trainer.loop import hogwild_processes

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = time.process_time() + children.ru_utime + children.ru_stime
    for pid in hogwild_processes.worker_pids():
        with open(f"/proc/{pid}/stat") as stat:  # utime and stime, in clock ticks
            fields = stat.read().rsplit(")", 1)[1].split()
        seconds += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return seconds


def small_ctr_model(table_optimizer: dict | None, storage: str = "float32"):
    """The model; ``table_optimizer``: the tables' own optimizer (None: the
    torch optimizer given to the distributed optimizer); ``storage``: the
    tables' (SparseEmbedding's ``storage``)."""
    import torch
    from torch import nn

    from trainer.nn import SparseEmbedding

    class SmallCtr(nn.Module):
        """Dense 4 + three pooled embeddings of dim 4 into a 16-16-1 MLP."""

        def __init__(self) -> None:
            super().__init__()
            self.u = SparseEmbedding(4, "u", optimizer=table_optimizer, storage=storage)
            self.i = SparseEmbedding(4, "i", optimizer=table_optimizer, storage=storage)
            self.c = SparseEmbedding(4, "c", optimizer=table_optimizer, storage=storage)
            self.mlp = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))

        def forward(self, batch):
            """Loss, probability and label of one batch."""
            x = torch.cat(
                [batch["dense"], self.u(batch["u"]), self.i(batch["i"]), self.c(batch["c"])],
                dim=1,
            )
            logit = self.mlp(x).squeeze(1)
            label = batch["label"].squeeze(1).float()
            loss = nn.functional.binary_cross_entropy_with_logits(logit, label)
            return {"loss": loss, "prob": torch.sigmoid(logit), "label": label}

    return SmallCtr()


def load(files: list[str], batch_size: int, threads: int):
    """A loaded fleetfeed InMemoryDataset of the small CTR files."""
    from datafeed import InMemoryDataset, Slot

    slots = [
        Slot("dense", "float32", (4,)), Slot("u", "int64"), Slot("i", "int64"),
        Slot("c", "int64"), Slot("label", "int64", (1,)),
    ]
    data = InMemoryDataset()
    data.init(batch_size=batch_size, thread_num=threads, use_var=slots, pipe_command="cat")
    data.set_filelist(files)
    data.load_into_memory()
    return data


def timed_method(owner, name: str, totals: dict, key: str) -> None:
    """Wraps ``owner.name`` (when it has one) to add its wall time to ``totals[key]``."""
    real = getattr(owner, name, None)
    if real is None:
        return

    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            totals[key] += time.perf_counter() - started

    setattr(owner, name, timed)


def train_epochs(model, dataset, optimizer, config: dict, threads: int, seed: int) -> dict:
    """``epochs`` passes (untimed local_shuffle + timed train_from_dataset); the figures."""
    from trainer import Executor
    from trainer.embedding import stores

    totals = dict.fromkeys(PHASES, 0.0)
    # Fallbacks for a RunSummary without pull/optimizer/push timings (before
    # trainer/loop/step_clock.py): the row store's calls, timed from outside.
    wrapped = {"pull": 0.0, "push": 0.0}
    store = stores.current_store()
    timed_method(store, "pull", wrapped, "pull")
    if store is stores.local_store():
        timed_method(store, "push", wrapped, "push")
    else:
        timed_method(store, "apply", wrapped, "push")  # GEO's local copy
    executor = Executor()
    records = batches = 0
    seconds = cpu = 0.0
    for epoch in range(config["epochs"]):
        dataset.local_shuffle(seed=seed + epoch)
        wall0, cpu0 = time.perf_counter(), cpu_seconds()
        summary = executor.train_from_dataset(
            model, dataset, optimizer, thread=threads, fetch_list=[], hogwild=threads > 1,
        )
        seconds += time.perf_counter() - wall0
        cpu += cpu_seconds() - cpu0
        records += summary.records
        batches += summary.batches
        for phase in PHASES:
            totals[phase] += summary.timings.get(phase, 0.0)
    source = "RunSummary" if "push" in summary.timings else "wrappers"
    if source == "wrappers":
        totals.update(wrapped, optimizer=totals["step"] - wrapped["push"])
    return {
        "split_source": source,
        "records": records, "seconds": seconds, "records_per_s": records / seconds,
        "cpu_ms": 1e3 * cpu / batches,
        "phase_ms": {k: 1e3 * v / batches for k, v in totals.items()},
        "pulls_ahead": getattr(summary, "pulls_ahead", None),  # the last epoch's
    }


def heldout_auc(model, path: str) -> float:
    """Exact AUC of ``model`` over the held-out file."""
    import numpy as np

    from trainer import Executor, auc

    probs, labels = [], []
    Executor().infer_from_dataset(
        model, load([path], 1024, 1), fetch_list=[], thread=1,
        fetch_handler=lambda out: (probs.append(out["prob"]), labels.append(out["label"])),
    )
    return auc(np.concatenate([p.numpy() for p in labels]),
               np.concatenate([p.numpy() for p in probs]))


def local_child(config: dict) -> dict:
    """One local fleetfeed run (bench_hogwild.py's setting): its figures."""
    import torch

    from trainer import fleet

    torch.set_num_threads(1)
    fleet.init()
    torch.manual_seed(config["seed"])
    model = small_ctr_model(None, config.get("storage", "float32"))
    optimizer = fleet.distributed_optimizer(torch.optim.Adagrad(model.parameters(), lr=0.1))
    train = load(config["files"], config["batch_size"], 2)
    out = train_epochs(model, train, optimizer, config, config["threads"], config["seed"])
    out["auc"] = heldout_auc(model, config["heldout"])
    return out


def ps_job(config: dict) -> None:
    """One process (server or worker) of fleetfeed's small-model PS job."""
    import torch

    from trainer.job.role import ClusterRole, Role
    from trainer.ps import ParameterServerRuntime

    torch.set_num_threads(1)
    role = ClusterRole(
        Role.SERVER if config["role"] == "server" else Role.WORKER, config["index"],
        config["workers"], tuple(config["servers"]), job_secret=config["key"],
    )
    # The two attributes the runtime reads from a DistributedStrategy.
    strategy = SimpleNamespace(mode=config["mode"], a_sync_configs={
        "k_steps": config["k"], "pull_ahead": config.get("pull_ahead", -1),
    })
    torch.manual_seed(config["seed"])
    model = small_ctr_model({"type": "adagrad", "lr": config["lr"]})
    runtime = ParameterServerRuntime(role, strategy)
    optimizer = runtime.distributed_optimizer(
        torch.optim.Adagrad(model.parameters(), lr=config["lr"])
    )
    if role.is_server:
        runtime.init_server()
        runtime.run_server()
        return
    train = load(config["worker_files"][role.index], config["batch_size"], 1)
    runtime.init_worker()
    out = train_epochs(model, train, optimizer, config, 1, 100 * role.index)
    runtime.refresh()
    runtime.barrier_worker()
    if role.index == 0:
        runtime.refresh()
        out["auc"] = heldout_auc(model, config["heldout"])
    runtime.stop_worker()
    Path(config["out"] + f".{role.index}").write_text(json.dumps(out))


# -- the driver ----------------------------------------------------------------------


def run_local(who: str, threads: int, args: argparse.Namespace, files: list[Path],
              held: Path, tmp: Path) -> dict:
    """One local run of ``who`` in a fresh process; its figures."""
    config = {"mode": "local", "threads": threads, "files": [str(f) for f in files],
              "heldout": str(held), "batch_size": 256, "epochs": args.epochs, "seed": 0,
              "lr": 0.1, "init_scale": 0.01}
    if who == "fleetfeed":
        command = [sys.executable, __file__, "--child", json.dumps(config)]
    else:
        command = [args.paddle_local, str(PADDLE_SCRIPT), json.dumps(config)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # cwd: Paddle's train_from_dataset writes <id>_train_desc.prototxt there.
    done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT,
                          env=env, cwd=tmp, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{who} local thread={threads} run failed with exit status "
                           f"{done.returncode}: {done.stderr[-3000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    check_records(f"{who} local thread={threads}", figures["records"], args)
    return figures


def check_records(run: str, records: int, args: argparse.Namespace) -> None:
    """Fails unless ``run`` trained every record of every epoch."""
    expected = args.epochs * 4 * args.lines
    if records != expected:
        raise RuntimeError(f"{run} trained {records} records, not {expected}")


def run_ps(who: str, mode: str, args: argparse.Namespace, files: list[Path], held: Path,
           tmp: Path, delay: float | None = None, pull_ahead: int = -1) -> dict:
    """One 1 server + 2 workers job of ``who``; the job's figures (records/s over
    both workers, worker 0's AUC, each worker's figures). ``delay``: the
    workers reach the server through a relay adding that many seconds each way
    (``bench_ps.relayed``). ``pull_ahead``: fleetfeed's
    ``a_sync_configs["pull_ahead"]`` (-1: from the round trip; 0: off)."""
    result_path = str(tmp / f"{who}-{mode}.result")

    def attempt() -> None:
        config = {
            "pull_ahead": pull_ahead,
            "mode": mode, "k": args.k_steps if mode == "geo" else 0, "workers": 2,
            "servers": [f"127.0.0.1:{bench_ps.free_port()}"],
            "worker_files": [[str(f) for f in files[0:2]], [str(f) for f in files[2:4]]],
            "heldout": str(held), "batch_size": 256, "epochs": args.epochs, "seed": 0,
            "lr": 0.1, "init_scale": 0.01, "out": result_path,
        }
        roles = (("server", 0), ("worker", 0), ("worker", 1))
        with bench_ps.relayed(config["servers"], delay) as seen_by_workers:

            def own(role: str, index: int) -> str:
                mine = {**config, "role": role, "index": index}
                if role == "worker":
                    mine["servers"] = seen_by_workers  # a relay answers before its server
                    mine["server_listening"] = config["servers"][0]
                return json.dumps(mine)

            if who == "fleetfeed":
                config["key"] = bench_ps.JOB_KEY  # what fleetrun gives a job
                commands = [(f"{mode}.{r}{i}", [sys.executable, __file__, "--job", own(r, i)])
                            for r, i in roles]
                bench_ps.run_processes(commands, tmp, server_stops_itself=True)
            else:
                config.update({
                    "worker_endpoints": [f"127.0.0.1:{bench_ps.free_port()}" for _ in range(2)],
                    "dense_lr": args.paddle_dense_lr, "paddle_sparse_lr": args.paddle_sparse_lr,
                    "paddle_initial_g2sum": args.paddle_initial_g2sum,
                })
                commands = [
                    (f"paddle-{mode}.{r}{i}", [args.paddle_ps, str(PADDLE_SCRIPT), own(r, i)])
                    for r, i in roles
                ]
                bench_ps.run_processes(commands, tmp, server_stops_itself=False)

    bench_ps.with_fresh_ports(attempt, f"{who} {mode} job")
    workers = [json.loads(Path(result_path + f".{i}").read_text()) for i in range(2)]
    check_records(f"{who} PS {mode}", sum(w["records"] for w in workers), args)
    out = {
        "records_per_s": sum(w["records"] for w in workers) / max(w["seconds"] for w in workers),
        "auc": workers[0]["auc"], "workers": workers,
    }
    if who == "fleetfeed":
        out["cpu_ms"] = statistics.mean(w["cpu_ms"] for w in workers)
        out["split_source"] = workers[0]["split_source"]
        out["phase_ms"] = {k: statistics.mean(w["phase_ms"][k] for w in workers)
                           for k in PHASES}
    return out


class Spinners:
    """One busy-looping Python process per core while in the block (``loaded``)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> Spinners:
        for _ in range(self.count):
            self.procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()
        self.procs.clear()


def run_all(args: argparse.Namespace, files: list[Path], held: Path) -> dict:
    """Every (condition, row, contender) run; results[condition][row][who] is a
    list of run figures, or the text of Paddle's failure."""
    rows = [r for r in (*LOCAL_ROWS, *PS_ROWS)
            if args.only is None or (r in LOCAL_ROWS) == (args.only == "local")]
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench_small_ctr-") as scratch:
        for condition in args.conditions:
            results[condition] = {row: {"fleetfeed": [], "paddle": []} for row in rows}
            results[condition]["load"] = []
            with Spinners((os.cpu_count() or 1) if condition == "loaded" else 0):
                for repeat in range(args.repeats):
                    results[condition]["load"].append(os.getloadavg()[0])
                    for row in rows:
                        contenders = ["fleetfeed", "paddle"]
                        if repeat % 2:
                            contenders.reverse()
                        for who in contenders:
                            cell = results[condition][row]
                            if isinstance(cell[who], str):
                                continue  # a Paddle failure: not retried
                            tmp = Path(scratch) / f"{condition}-{row}-{who}-{repeat}"
                            tmp.mkdir()
                            try:
                                if row in LOCAL_ROWS:
                                    figures = run_local(who, int(row[-1]), args, files, held, tmp)
                                else:
                                    figures = run_ps(who, row, args, files, held, tmp)
                            except RuntimeError as error:
                                if who == "fleetfeed":
                                    raise
                                failure = bench_ps.paddle_failure(str(error))
                                print(f"{condition} {row} paddle: FAILED: {failure}\n"
                                      f"{str(error)[-1500:]}", flush=True)
                                # Sync fails every time (not retried); another
                                # mode's failure is noted and the next repeat retries.
                                if row == "sync":
                                    cell[who] = failure
                                else:
                                    cell.setdefault("paddle_failures", []).append(failure)
                                continue
                            cell[who].append(figures)
                            print(f"{condition} repeat {repeat} {row} {who}: "
                                  f"{figures['records_per_s']:,.0f} records/s, "
                                  f"AUC {figures['auc']:.4f} (load {os.getloadavg()[0]:.2f})",
                                  flush=True)
    return results


def median(runs: list[dict], key: str) -> float:
    """The median of ``key`` over the runs."""
    return statistics.median(r[key] for r in runs)


def report(args: argparse.Namespace, results: dict, started: str) -> str:
    """The results as markdown."""
    lines = [
        "# The small CTR model of issue 14: fleetfeed vs Paddle, side by side",
        "",
        f"`{results_file.command()}` at {results_file.commit()}, started {started}: "
        f"{args.lines:,} lines x 4 files, batch 256, "
        f"{args.epochs} epochs (local_shuffle not timed + timed train_from_dataset), medians "
        f"of {args.repeats} alternating run(s) per contender. Local: Paddle 3.3.1; PS "
        f"(1 server + 2 workers, records/s over both workers): Paddle 3.0.0, its sparse "
        f"Adagrad rule lr {args.paddle_sparse_lr}, initial_g2sum {args.paddle_initial_g2sum}, "
        f"dense Adam lr {args.paddle_dense_lr}. fleetfeed: torch.set_num_threads(1), Adagrad "
        f"lr 0.1 everywhere, PS jobs with a job key. Machine: {os.cpu_count()} cores, shared "
        "with other work; load average (1 min) at each repeat's start is given per condition.",
        "",
        "| condition | row | fleetfeed records/s | Paddle records/s | ratio (medians) "
        "| ratio paired by repeat (median, range) | target | met | fleetfeed AUC | Paddle AUC "
        "| fleetfeed runs | Paddle runs |",
        "|---|---|---:|---:|---:|---|---:|---|---:|---:|---|---|",
    ]
    for condition, rows in results.items():
        for row, cell in rows.items():
            if row == "load":
                continue
            ours, theirs = cell["fleetfeed"], cell["paddle"]
            rate = median(ours, "records_per_s")
            each = ", ".join(f"{r['records_per_s']:,.0f}" for r in ours)
            target = TARGET.get(row)
            target_text = f">= {target:.1f}x" if target else "-"
            if row == "sync":
                target_text = "works"
            if isinstance(theirs, str) or not theirs:
                failure = theirs or "; ".join(cell.get("paddle_failures", [])) or "not run"
                met = "yes (Paddle fails)" if row == "sync" and ours else "-"
                lines.append(
                    f"| {condition} | {ROW_LABEL[row]} | {rate:,.0f} | {failure} | - | - | "
                    f"{target_text} | {met} | {median(ours, 'auc'):.4f} | - | {each} | - |"
                )
                continue
            paddle_rate = median(theirs, "records_per_s")
            ratio = rate / paddle_rate
            paired = sorted(a["records_per_s"] / b["records_per_s"]
                            for a, b in zip(ours, theirs, strict=False))
            met = "-" if not target else ("yes" if ratio >= target else "**no**")
            if row == "sync":
                met = "yes"
            lines.append(
                f"| {condition} | {ROW_LABEL[row]} | {rate:,.0f} | {paddle_rate:,.0f} | "
                f"{ratio:.2f}x | {statistics.median(paired):.2f}x ({paired[0]:.2f}-"
                f"{paired[-1]:.2f}) | {target_text} | {met} | {median(ours, 'auc'):.4f} | "
                f"{median(theirs, 'auc'):.4f} | {each} | "
                + ", ".join(f"{r['records_per_s']:,.0f}" for r in theirs)
                + "".join(f"; failed: {f}" for f in cell.get("paddle_failures", [])) + " |"
            )
    lines += [
        "",
        "Load average (1 min) at each repeat's start: "
        + "; ".join(f"{c}: " + ", ".join(f"{v:.2f}" for v in rows["load"])
                    for c, rows in results.items()) + ".",
        "",
        "## fleetfeed's time per batch, split (ms, medians over runs; PS: mean of the "
        "2 workers)",
        "",
        "Summed over threads (thread=2 overlaps). forward includes pull; step = optimizer "
        "(the dense update) + push (sparse gradients to the tables or servers; GEO: the "
        "local tables' update and the sync every k steps). Source: the RunSummary's "
        "timings, or where it has no push/optimizer split, wrappers around the row store's "
        "`pull` and `push` (`GeoStore.apply` in GEO) with optimizer = step - push. "
        "CPU: the process's CPU time (all threads, and its Hogwild trainer processes) per batch.",
        "",
        "| condition | row | data wait | forward | of which pull | backward | step "
        "| of which optimizer | of which push | CPU | source |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for condition, rows in results.items():
        for row, cell in rows.items():
            if row == "load" or not cell["fleetfeed"]:
                continue
            ours = cell["fleetfeed"]
            phase = {k: statistics.median(r["phase_ms"][k] for r in ours) for k in PHASES}
            lines.append(
                f"| {condition} | {ROW_LABEL[row]} | " + " | ".join(
                    f"{phase[k]:.3f}" for k in PHASES) + f" | {median(ours, 'cpu_ms'):.3f} | "
                + ", ".join(sorted({r["split_source"] for r in ours})) + " |"
            )
    lines += ["", "## How the two sides are set up", "", *METHOD_NOTES]
    return "\n".join(lines) + "\n"


def summary(args: argparse.Namespace, results: dict, started: str) -> str:
    """The section of benchmarks/RESULTS.md: fleetfeed / Paddle per row and condition."""
    conditions = list(results)
    lines = [
        f"## Issue 14's small CTR model, fleetfeed vs Paddle (bench_small_ctr.py, "
        f"{args.repeats} repeats, medians)",
        "",
        f"`{results_file.command()}` at {results_file.commit()}, started {started}; 1-minute "
        "load average at each repeat's start: "
        + "; ".join(f"{c}: " + ", ".join(f"{v:.2f}" for v in results[c]["load"])
                    for c in conditions)
        + f". {args.lines:,} lines x 4 files, batch 256, {args.epochs} epochs; local rows "
        "against Paddle 3.3.1, PS rows (1 server + 2 workers) against Paddle 3.0.0; "
        "\"loaded\": one busy loop per core beside the job. Full tables: "
        "`results/small_ctr.md`.",
        "",
        "| row | " + " | ".join(conditions) + " | target |",
        "|---|" + "---:|" * len(conditions) + "---|",
    ]
    rows = [r for r in results[conditions[0]] if r != "load"]
    for row in rows:
        cells, met = [], []
        for condition in conditions:
            cell = results[condition][row]
            ours, theirs = cell["fleetfeed"], cell["paddle"]
            if isinstance(theirs, str) or not theirs:
                failure = theirs or "; ".join(cell.get("paddle_failures", [])) or "not run"
                cells.append(f"{median(ours, 'records_per_s'):,.0f} records/s "
                             f"(Paddle: {failure})")
                met.append(row == "sync" and bool(ours))
                continue
            ratio = median(ours, "records_per_s") / median(theirs, "records_per_s")
            cells.append(f"{ratio:.2f}x")
            met.append(row in TARGET and ratio >= TARGET[row])
        if row == "sync":
            target = "works: " + ("met" if all(met) else "**not met**")
        elif row in TARGET:
            target = f">= {TARGET[row]:.1f}x: " + ("met" if all(met) else "**not met**")
        else:
            target = "-"
        lines.append(f"| {ROW_LABEL[row]} | " + " | ".join(cells) + f" | {target} |")
    return "\n".join(lines) + "\n"


# What the tables above cannot say and no run changes: no figures here.
METHOD_NOTES = [
    "- Every run trained all its records (checked before it counts); each run is a fresh "
    "process (a fresh job), the contenders alternate within every repeat.",
    "- Paddle's local dataset gets `thread_num` = the trainer threads (its executor wants "
    "one reader per thread); fleetfeed loads with 2 reader threads. Loading is not timed "
    "on either side, nor is `local_shuffle`.",
    "- Paddle reads the same files as fleetfeed: its embedding tables have max id + 1 rows "
    "(ids are offset per slot), rows below an offset are never touched. Paddle 3.3.1's "
    "`paddle.nn.functional.sigmoid` refuses old-IR variables even under `OldIrGuard`, so "
    "paddle_small_ctr.py appends the `sigmoid` op itself.",
    "- Paddle's PS servers take only SGD or Adam for dense parameters (Adam here) and its "
    "sparse Adagrad rule keeps one sum per row: its lr and initial_g2sum are set apart "
    "(paddle_ps.py's notes). Paddle's sync job is not retried after it fails.",
]


def parser_of_options() -> argparse.ArgumentParser:
    """The command line's options (their defaults serve other benchmarks too)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=["local", "ps"])
    parser.add_argument("--conditions", nargs="+", default=["quiet", "loaded"],
                        choices=["quiet", "loaded"])
    parser.add_argument("--lines", type=int, default=20000, help="lines per training file")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--k-steps", type=int, default=20)
    parser.add_argument("--paddle-local", default=str(PADDLE_LOCAL),
                        help="the interpreter with paddlepaddle 3.3.1")
    parser.add_argument("--paddle-ps", default=str(PADDLE_PS),
                        help="the interpreter with paddlepaddle 3.0.0 (PS runtime)")
    parser.add_argument("--paddle-sparse-lr", type=float, default=0.2,
                        help="Paddle's row-wise sparse Adagrad lr (paddle_ps.py's notes)")
    parser.add_argument("--paddle-initial-g2sum", type=float, default=0.1)
    parser.add_argument("--paddle-dense-lr", type=float, default=0.03,
                        help="Paddle PS's dense Adam lr")
    parser.add_argument("--no-write", action="store_true")
    return parser


def main() -> None:
    """Command line: see the module's docstring."""
    parser = parser_of_options()
    args = parser.parse_args()
    if args.child:
        print(json.dumps(local_child(json.loads(args.child))), flush=True)
        return
    if args.job:
        ps_job(json.loads(args.job))
        return
    for name in ("paddle_local", "paddle_ps"):
        if not Path(getattr(args, name)).exists():
            parser.error(f"no Paddle interpreter at {getattr(args, name)}")
    import make_small_ctr

    # A SIGTERM unwinds like Ctrl-C, so the loaded condition's spinners are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    data = DATA if args.lines == 20000 else DATA.parent / f"small_ctr-{args.lines}"
    files, held = make_small_ctr.write(data, args.lines, 4)
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    results = run_all(args, files, held)
    text = report(args, results, started)
    print(text)
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(text)
        results_file.write_section("small_ctr", summary(args, results, started))


if __name__ == "__main__":
    main()
