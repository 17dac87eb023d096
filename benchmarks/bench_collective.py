"""Gradient averaging of a collective job: fleet's optimizer against DDP.

Two ranks on gloo over 127.0.0.1 train the same MLP for ``--steps`` steps, three
ways, alternating in fresh process pairs (ABBA-like rounds):

* ``ddp``: ``fleet.distributed_model`` (DDP: buckets all-reduced while the
  backward runs) and the plain step of ``fleet.distributed_optimizer``'s
  optimizer (DDP's parameters are not averaged twice);
* ``optimizer``: no ``distributed_model``; ``distributed_optimizer``'s step
  averages the gradients in buckets after the backward;
* ``none``: no averaging at all (the lower bound: compute only).

Prints the median milliseconds per step and writes benchmarks/results/collective.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results" / "collective.md"
WAYS = ("ddp", "optimizer", "none")

RANK = r'''
import json, os, sys, time
import torch
from torch import nn
from trainer import fleet

way, steps, width, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rank = int(os.environ["RANK"])
torch.set_num_threads(1)
fleet.init(is_collective=True)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                      nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
if way == "ddp":
    net = fleet.distributed_model(model)
    optimizer = fleet.distributed_optimizer(optimizer)
elif way == "optimizer":
    net = model
    optimizer = fleet.distributed_optimizer(optimizer)
else:
    net = model
g = torch.Generator().manual_seed(rank)
x, y = torch.randn(64, 256, generator=g), torch.randint(0, 2, (64,), generator=g)
times = []
for step in range(steps):
    started = time.perf_counter()
    loss = nn.functional.cross_entropy(net(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    times.append(time.perf_counter() - started)
params = sum(p.numel() for p in model.parameters())
json.dump({"ms": 1000 * sorted(times[3:])[len(times[3:]) // 2], "params": params},
          open(os.path.join(out, f"{way}.{rank}.json"), "w"))
fleet.stop_worker()
'''


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_pair(way: str, steps: int, width: int, tmp: Path) -> dict:
    """One 2-rank run of ``way``; rank 0's median step (ms) and the model size."""
    script = tmp / "rank.py"
    script.write_text(RANK)
    port = free_port()
    processes = []
    try:
        for rank in (0, 1):
            env = dict(os.environ, PYTHONPATH=str(REPO), RANK=str(rank), WORLD_SIZE="2",
                       LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       OMP_NUM_THREADS="1")
            processes.append(subprocess.Popen(
                [sys.executable, str(script), way, str(steps), str(width), str(tmp)],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outputs = [p.communicate(timeout=600)[0] for p in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()
    for process, output in zip(processes, outputs, strict=True):
        if process.returncode:
            sys.exit(f"{way}: a rank failed (exit {process.returncode}):\n{output[-3000:]}")
    return json.loads((tmp / f"{way}.0.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--width", type=int, default=1024, help="hidden width of the MLP")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    runs: dict[str, list[float]] = {way: [] for way in WAYS}
    params = 0
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            order = WAYS if round_ % 2 == 0 else tuple(reversed(WAYS))
            for way in order:
                result = run_pair(way, args.steps, args.width, Path(tmp))
                runs[way].append(result["ms"])
                params = result["params"]
                print(f"  round {round_}: {way:9s} {result['ms']:.2f} ms/step", flush=True)
    medians = {way: statistics.median(values) for way, values in runs.items()}
    lines = [
        "# Gradient averaging: fleet's collective optimizer against DDP",
        "",
        f"`python benchmarks/bench_collective.py --steps {args.steps} --width {args.width} "
        f"--rounds {args.rounds}` on {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, "
        f"2 ranks on gloo over 127.0.0.1, an MLP of {params:,} float32 parameters, batch 64: "
        "median milliseconds per step of rank 0 (each run's median over its steps, "
        "then the median over the rounds).",
        "",
        "| way | ms/step | runs | vs ddp |",
        "|---|---:|---|---:|",
    ]
    for way in WAYS:
        lines.append(
            f"| {way} | {medians[way]:.2f} | {', '.join(f'{v:.2f}' for v in runs[way])} | "
            f"{medians[way] / medians['ddp']:.2f}x |"
        )
    report = "\n".join(lines)
    print(report)
    if not args.no_write:
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(report + "\n")


if __name__ == "__main__":
    main()
