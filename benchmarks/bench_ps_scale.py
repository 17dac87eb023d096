"""The parameter server at ten times the processes (issue 28): 8 servers + 16
workers on this machine, against 1 server + 16 workers, then the checkpoint
re-sharded to 4 servers.

Every job is started by fleetrun (``python -m trainer.job.launch``), which
gives it a job key, and trains the small CTR model (bench_small_ctr.py's, async,
Adagrad) on 16 tiny files, one a worker, two epochs of ``train_from_dataset``:

1. ``1 + 16``: one server, the reference AUC.
2. ``8 + 16``: eight servers; worker 0 saves a checkpoint (``save_persistables``).
3. ``4 + 16``: four servers load that checkpoint (``fleet.init_server(dir)``,
   each its rows by id), train nothing and save it again; every table's rows
   (ids, weights, Adagrad sums, show, click, last-seen pass) must be identical
   in the two checkpoints, or the run fails.
4. ``4 + 8``: the job restarts from the re-sharded checkpoint with half the
   workers. Worker 0 reads the held-out AUC before any training, which must be
   the ``8 + 16`` job's last (the model came back whole, dense values
   included), then all 8 train one more epoch over the 16 files.

Each process writes when it reached each stage (the clock of this machine):
started (the script's first line), imported (torch and fleetfeed), fleet.init
done, then servers: listening; workers: connected (``init_worker``) and ready
(after ``barrier_worker``: every worker connected, so every server was). Start-up
is from the launch to the last worker ready, split into those stages (the
slowest process of each). Stop is from the first worker done training to the
launcher's exit. A sampler thread in each server reads its threads, sockets and
resident memory every 0.1 s; the cost of a worker to a server is the growth from
before the first worker connected to when all were ready, over the 16 workers.

``--push-bound``: instead, 1 + 16 jobs with pulls sent ahead and 1, 2, 3 or 16
pushes in flight, beside pulls not sent ahead, and their AUC
(``results/ps_push_bound.md``: why ``pushes_in_flight`` defaults to 2).

Writes ``benchmarks/results/ps_scale.md`` (``--no-write``: print only).

    python benchmarks/bench_ps_scale.py [--lines 20000] [--servers 8] [--workers 16]
    python benchmarks/bench_ps_scale.py --lines 20000 --push-bound
"""

from __future__ import annotations

import time

STARTED = time.time()  # before the imports: how long they take is a stage

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "ps_scale.md"
JOB_TIMEOUT = 900


# -- one process of a job (run by fleetrun) --------------------------------------------


def server_sampler(out: list, stop: threading.Event) -> None:
    """Every 0.1 s: (time, threads, sockets, resident bytes) of this process."""
    while not stop.is_set():
        sockets = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                sockets += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
            except OSError:
                continue
        with open("/proc/self/status") as status:
            fields = dict(line.split(":", 1) for line in status if ":" in line)
        out.append((time.time(), int(fields["Threads"]), sockets,
                    int(fields["VmRSS"].split()[0]) * 1024))
        stop.wait(0.1)


def job(config: dict) -> None:
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(HERE))
    import torch
    from bench_small_ctr import heldout_auc, load, small_ctr_model

    from trainer import DistributedStrategy, Executor, fleet

    stages = {"started": STARTED, "imported": time.time()}
    torch.set_num_threads(1)
    strategy = DistributedStrategy()
    strategy.a_sync = True
    strategy.a_sync_configs = {"pull_ahead": config.get("pull_ahead", -1),
                               "pushes_in_flight": config.get("pushes_in_flight", 2)}
    fleet.init(strategy=strategy)
    torch.manual_seed(0)
    model = small_ctr_model({"type": "adagrad", "lr": 0.1})
    optimizer = fleet.distributed_optimizer(torch.optim.Adagrad(model.parameters(), lr=0.1))
    stages["fleet_init"] = time.time()
    out_dir = Path(config["out"])
    if fleet.is_server():
        samples: list = []
        stop = threading.Event()
        sampler = threading.Thread(target=server_sampler, args=(samples, stop), daemon=True)
        sampler.start()
        fleet.init_server(config["load"] or None)
        stages["listening"] = time.time()
        fleet.run_server()
        stages["stopped"] = time.time()
        stop.set()
        sampler.join()
        name = f"server{fleet.server_index()}.json"
        (out_dir / name).write_text(json.dumps({"stages": stages, "samples": samples}))
        return
    fleet.init_worker()
    stages["connected"] = time.time()
    index = fleet.worker_index()
    files = config["files"][index::fleet.worker_num()]
    fleet.barrier_worker()
    stages["ready"] = time.time()
    records = 0
    auc_at_start = None
    if config["load"]:
        if fleet.is_first_worker():
            auc_at_start = heldout_auc(model, config["heldout"])
        fleet.barrier_worker()  # nobody trains before worker 0 has read the loaded model
    stages["training"] = time.time()
    if config["epochs"]:
        train = load(files, 256, 1)
        for epoch in range(config["epochs"]):
            train.local_shuffle(seed=100 * index + epoch)
            summary = Executor().train_from_dataset(model, train, optimizer, thread=1,
                                                    fetch_list=[])
            records += summary.records
    stages["trained"] = time.time()
    fleet.barrier_worker()  # every worker's pushes applied; the servers' dense values here
    auc = None
    if fleet.is_first_worker():
        if config["epochs"]:
            auc = heldout_auc(model, config["heldout"])
        fleet.save_persistables(config["save"])
    stages["saved"] = time.time()
    fleet.stop_worker()
    stages["stopped"] = time.time()
    (out_dir / f"worker{index}.json").write_text(
        json.dumps({"stages": stages, "records": records, "auc": auc,
                    "auc_at_start": auc_at_start})
    )


# -- the driver ------------------------------------------------------------------------


def run_job(servers: int, workers: int, config: dict, directory: Path) -> dict:
    """One fleetrun job; every process's figures and the launch's times."""
    directory.mkdir(parents=True)
    config = {**config, "out": str(directory)}
    env = dict(os.environ, FLEETFEED_CHECKPOINT_ROOT=config["root"],
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, "-m", "trainer.job.launch", f"--server_num={servers}",
               f"--worker_num={workers}", f"--log_dir={directory / 'logs'}", __file__,
               "--job", json.dumps(config)]
    launched = time.time()
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=JOB_TIMEOUT, check=False)
    ended = time.time()
    if result.returncode:
        logs = "".join(
            f"\n--- {log.name}\n{log.read_text()[-1500:]}"
            for log in sorted((directory / "logs").glob("*"))
        ) if (directory / "logs").is_dir() else ""
        raise SystemExit(f"the {servers} + {workers} job failed (exit {result.returncode}):\n"
                         f"{result.stderr[-3000:]}{logs}")
    found = {p.stem: json.loads(p.read_text()) for p in directory.glob("*.json")}
    found_servers = [k for k in found if k.startswith("server")]
    if len(found_servers) != servers or len(found) != servers + workers:
        raise SystemExit(f"the {servers} + {workers} job left {sorted(found)}")
    return {"processes": found, "launched": launched, "ended": ended}


def startup(run: dict) -> dict:
    """Seconds from the launch to the last worker ready, and the slowest
    process's time in each stage."""
    procs = run["processes"].values()
    workers = [p["stages"] for name, p in run["processes"].items() if name.startswith("worker")]
    servers = [p["stages"] for name, p in run["processes"].items() if name.startswith("server")]
    t0 = run["launched"]
    return {
        "total": max(w["ready"] for w in workers) - t0,
        "spawn": max(p["stages"]["started"] for p in procs) - t0,
        "imports": max(p["stages"]["imported"] - p["stages"]["started"] for p in procs),
        "fleet_init": max(p["stages"]["fleet_init"] - p["stages"]["imported"] for p in procs),
        "listening": max(s["listening"] - s["fleet_init"] for s in servers),
        "connect": max(w["connected"] - w["fleet_init"] for w in workers),
        "barrier": max(w["ready"] - w["connected"] for w in workers),
        "stop": run["ended"] - min(w["trained"] for w in workers),
        "train": max(w["trained"] for w in workers) - max(w["training"] for w in workers),
    }


def worker_cost(run: dict, workers: int) -> dict:
    """Per worker, what a server's threads, sockets and memory grew by from
    before the first worker connected to all being ready (median over servers)."""
    stages = [p["stages"] for name, p in run["processes"].items() if name.startswith("worker")]
    first, ready = min(w["fleet_init"] for w in stages), max(w["ready"] for w in stages)
    per_server = []
    for name, proc in run["processes"].items():
        if not name.startswith("server"):
            continue
        samples = proc["samples"]
        before = [s for s in samples if s[0] <= first] or samples[:1]
        after = [s for s in samples if s[0] >= ready] or samples[-1:]
        per_server.append([(after[0][k] - before[-1][k]) / workers for k in (1, 2, 3)]
                          + [after[0][k] for k in (1, 2, 3)])
    columns = list(zip(*per_server, strict=True))
    keys = ("threads", "sockets", "bytes", "threads_total", "sockets_total", "rss_total")
    return {k: statistics.median(c) for k, c in zip(keys, columns, strict=True)}


def identical_rows(left: str, right: str) -> dict[str, int]:
    """Every table's rows in both checkpoints, compared by id; rows per table."""
    import numpy as np

    from trainer.ps.checkpoint import directory as checkpoint
    from trainer.ps.checkpoint.table_files import read_table

    def rows(dirname: str, name: str) -> dict[str, np.ndarray]:
        parts: dict[str, list] = {}
        for batch in read_table(dirname, name):
            for key, values in batch.items():
                values = np.asarray(values)
                if values.ndim:  # columns (a batch also names its pass)
                    parts.setdefault(key, []).append(values)
        merged = {k: np.concatenate(v) for k, v in parts.items()}
        order = np.argsort(merged["ids"], kind="stable")
        return {k: v[order] for k, v in merged.items()}

    tables = sorted(checkpoint.read_meta(left)["tables"])
    if tables != sorted(checkpoint.read_meta(right)["tables"]):
        raise SystemExit(f"the checkpoints hold different tables: {left}, {right}")
    counts = {}
    for name in tables:
        a, b = rows(left, name), rows(right, name)
        if sorted(a) != sorted(b):
            raise SystemExit(f"table {name}: columns {sorted(a)} against {sorted(b)}")
        for key in a:
            if not np.array_equal(a[key], b[key]):
                raise SystemExit(f"table {name}: column {key} differs after the re-shard")
        counts[name] = int(a["ids"].shape[0])
    return counts


def report(args: argparse.Namespace, runs: tuple[dict, dict, dict, dict],
           rows: dict[str, int], load: float, commit: str) -> str:
    import results_file

    one, many, reshard, restart = runs
    auc_one, auc_many = auc_of(one), auc_of(many)
    cost = worker_cost(many, args.workers)
    lines = [
        "# The parameter server at ten times the processes",
        "",
        f"`{results_file.command()}` at {commit}, {os.cpu_count()} cores shared by every "
        f"process, 1-minute load average {load:.2f} before the runs. Each job started by "
        f"fleetrun (`python -m trainer.job.launch`, a job key), {args.workers} workers "
        f"training the small CTR model (async, Adagrad lr 0.1, batch 256) for "
        f"{args.epochs} epochs on a file of {args.lines:,} lines each; AUC on the held-out "
        f"file (10,000 lines), by worker 0 after `barrier_worker`.",
        "",
        "| job | start-up (s) | spawn | imports | fleet.init | servers listening "
        "| workers connected | barrier | training (s) | stop (s) | AUC |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, run in ((f"1 + {args.workers}", one),
                      (f"{args.servers} + {args.workers}", many),
                      (f"{args.reshard} + {args.workers}, loads the checkpoint and saves it",
                       reshard),
                      (f"{args.reshard} + {args.restart_workers}, restarts from the re-sharded "
                       "checkpoint, 1 epoch", restart)):
        auc, s = auc_of(run), startup(run)
        lines.append(
            f"| {name} | {s['total']:.1f} | {s['spawn']:.1f} | {s['imports']:.1f} "
            f"| {s['fleet_init']:.1f} | {s['listening']:.1f} | {s['connect']:.1f} "
            f"| {s['barrier']:.1f} | {s['train']:.1f} | {s['stop']:.1f} "
            f"| {'-' if auc is None else f'{auc:.4f}'} |"
        )
    lines += [
        "",
        "Start-up: from the launch to the last worker ready (every worker connected to "
        "every server); the stages are each the slowest process's: spawn (launch to the "
        "script's first line), imports (torch, fleetfeed), fleet.init (role, model, "
        "optimizer), servers listening (`init_server`, with the load), workers connected "
        "(`init_worker`), barrier (`barrier_worker`: waiting for the slowest). Stop: from "
        "the first worker done training to fleetrun's exit (the save included).",
        "",
        f"- **AUC**: {args.servers} servers {auc_many:.4f} against one server {auc_one:.4f}, "
        f"a difference of {auc_many - auc_one:+.4f}.",
        f"- **Re-shard {args.servers} -> {args.reshard}**: the {args.reshard} servers loaded "
        f"the {args.servers} servers' checkpoint and saved it again; every row of every "
        f"table identical by id ("
        + ", ".join(f"{name}: {count:,} rows" for name, count in rows.items()) + ").",
        f"- **Restart**: {args.reshard} servers and {args.restart_workers} workers started "
        f"from the re-sharded checkpoint; before any training worker 0 read AUC "
        f"{restarted_auc(restart):.4f}, the {args.servers} + {args.workers} job's last "
        f"({auc_many:.4f}): the model came back whole. One more epoch over the "
        f"{args.workers} files then reached {auc_of(restart):.4f}.",
        f"- **What a worker costs a server** ({args.servers} + {args.workers}, median over "
        f"the servers, from before the first worker connected to all ready): "
        f"{cost['threads']:.2f} threads, {cost['sockets']:.2f} sockets and "
        f"{cost['bytes'] / 1024:,.0f} KiB resident; a server then ran {cost['threads_total']:.0f} "
        f"threads and {cost['sockets_total']:.0f} sockets in {cost['rss_total'] / 2**20:,.0f} "
        "MiB.",
    ]
    return "\n".join(lines) + "\n"


def push_bound(args: argparse.Namespace, base: dict, tmp: str) -> str:
    """1 + ``workers`` jobs with pulls sent ahead and 1, 2, 3 or 16 pushes in
    flight, beside pulls not sent ahead: the held-out AUC of each (why
    ``a_sync_configs["pushes_in_flight"]`` defaults to 2)."""
    import results_file

    rows = []
    for ahead, pushes in ((0, 1), (-1, 1), (-1, 2), (-1, 3), (-1, 16)):
        config = {**base, "pull_ahead": ahead, "pushes_in_flight": pushes,
                  "save": str(Path(tmp) / f"ckpt-{ahead}-{pushes}")}
        run = run_job(1, args.workers, config, Path(tmp) / f"push-{ahead}-{pushes}")
        print(f"pull_ahead {ahead}, pushes_in_flight {pushes}: AUC {auc_of(run):.4f}", flush=True)
        rows.append(f"| {'off (0)' if ahead == 0 else 'automatic (-1)'} | {pushes} "
                    f"| {auc_of(run):.4f} | {startup(run)['train']:.1f} |")
    return (
        "# Pushes in flight and the AUC of 16 async workers on one server\n\n"
        f"`{results_file.command()}` at {results_file.commit()}: 1 server + {args.workers} "
        f"workers started by fleetrun, the small CTR model (async, Adagrad lr 0.1, batch 256), "
        f"{args.epochs} epochs on a file of {args.lines:,} lines each, held-out AUC by worker 0 "
        "after `barrier_worker`. Each push in flight more lets a worker's dense parameters "
        "lag a step more.\n\n"
        "| pull_ahead | pushes_in_flight | AUC | training (s) |\n|---|---:|---:|---:|\n"
        + "\n".join(rows) + "\n"
    )


def restarted_auc(run: dict) -> float:
    """Worker 0's held-out AUC of the model as loaded, before training."""
    return run["processes"]["worker0"]["auc_at_start"]


def auc_of(run: dict) -> float | None:
    aucs = [p["auc"] for name, p in run["processes"].items()
            if name.startswith("worker") and p.get("auc") is not None]
    return aucs[0] if aucs else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", help=argparse.SUPPRESS)
    parser.add_argument("--lines", type=int, default=5000, help="lines per worker's file")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--servers", type=int, default=8)
    parser.add_argument("--reshard", type=int, default=4)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--restart-workers", type=int, default=8,
                        help="workers of the job that restarts from the re-sharded checkpoint")
    parser.add_argument("--push-bound", action="store_true",
                        help="only 1 + workers jobs with 1, 2, 3 and 16 pushes in flight "
                             "(results/ps_push_bound.md)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if args.job:
        job(json.loads(args.job))
        return
    sys.path.insert(0, str(HERE))
    import make_small_ctr
    import results_file

    load, commit = results_file.load_average(), results_file.commit()
    files, held = make_small_ctr.write(HERE / "data" / f"small_ctr_scale-{args.lines}",
                                       args.lines, args.workers, heldout=10_000)
    with tempfile.TemporaryDirectory(prefix="bench_ps_scale-") as tmp:
        base = {"files": [str(f) for f in files], "heldout": str(held), "root": tmp,
                "load": "", "epochs": args.epochs}
        if args.push_bound:
            text = push_bound(args, base, tmp)
            print(text)
            if not args.no_write:
                (HERE / "results" / "ps_push_bound.md").write_text(text)
            return
        saved = str(Path(tmp) / "ckpt-many")
        resaved = str(Path(tmp) / "ckpt-reshard")
        one = run_job(1, args.workers, {**base, "save": str(Path(tmp) / "ckpt-one")},
                      Path(tmp) / "one")
        print(f"1 + {args.workers}: {startup(one)}, AUC {auc_of(one):.4f}", flush=True)
        many = run_job(args.servers, args.workers, {**base, "save": saved}, Path(tmp) / "many")
        print(f"{args.servers} + {args.workers}: {startup(many)}, AUC {auc_of(many):.4f}",
              flush=True)
        reshard = run_job(args.reshard, args.workers,
                          {**base, "save": resaved, "load": saved, "epochs": 0},
                          Path(tmp) / "reshard")
        rows = identical_rows(saved, resaved)
        print(f"re-shard {args.servers} -> {args.reshard}: identical rows {rows}", flush=True)
        restart = run_job(args.reshard, args.restart_workers,
                          {**base, "save": str(Path(tmp) / "ckpt-restart"), "load": resaved,
                           "epochs": 1}, Path(tmp) / "restart")
        at_start = restarted_auc(restart)
        print(f"{args.reshard} + {args.restart_workers} from the re-sharded checkpoint: "
              f"AUC {at_start:.4f} at the restart, {auc_of(restart):.4f} after an epoch",
              flush=True)
        if abs(at_start - auc_of(many)) > 1e-6:
            raise SystemExit(f"the restarted job's model reads AUC {at_start:.6f}, the "
                             f"saved one's {auc_of(many):.6f}: the checkpoint came back changed")
        for name, run, epochs in (("one", one, args.epochs), ("many", many, args.epochs),
                                  ("restart", restart, 1)):
            trained = sum(p.get("records", 0) for p in run["processes"].values())
            if trained != epochs * args.workers * args.lines:
                raise SystemExit(f"the {name} job trained {trained} records, not "
                                 f"{epochs * args.workers * args.lines}")
        text = report(args, (one, many, reshard, restart), rows, load, commit)
    print(text)
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(text)


if __name__ == "__main__":
    main()
