"""What Paddle's per-instance dumps cost a training pass.

``train_from_dataset(thread=1)`` on the small CTR model (benchmarks/make_small_ctr.py's
data: 4 files x 20,000 lines, batch 256) without dumps, and with
``trainer_desc_configs`` dumping the model's ``prob`` and ``label`` per instance
(trainer/loop/dumps.py: a child process formats and writes them), alternating in
one process, each run checked to have dumped every record. Prints and writes
``benchmarks/results/dumps.md``: records/s, medians and the paired ratio.

Usage: python benchmarks/bench_dumps.py [--repeats 5] [--lines 20000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import results_file  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from datafeed import InMemoryDataset, Slot  # noqa: E402
from trainer import DistributedStrategy, Executor, fleet  # noqa: E402
from trainer.nn import SparseEmbedding  # noqa: E402

RESULTS = HERE / "results" / "dumps.md"
SLOTS = [Slot("dense", "float32", (4,)), Slot("u", "int64"), Slot("i", "int64"),
         Slot("c", "int64"), Slot("label", "int64", (1,))]


class SmallCtr(nn.Module):
    """bench_small_ctr.py's model: three sparse slots at dim 4 and a 16-16-1 MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.u, self.i, self.c = (SparseEmbedding(4, f"dump_bench_{s}") for s in "uic")
        self.mlp = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, batch):
        x = torch.cat(
            [batch["dense"], self.u(batch["u"]), self.i(batch["i"]), self.c(batch["c"])], 1)
        logit = self.mlp(x).squeeze(1)
        label = batch["label"].squeeze(1).float()
        loss = nn.functional.binary_cross_entropy_with_logits(logit, label)
        return {"loss": loss, "prob": torch.sigmoid(logit), "label": batch["label"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--lines", type=int, default=20_000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    import make_small_ctr

    parts, _ = make_small_ctr.write(HERE / "data" / f"small_ctr-{args.lines}", args.lines, 4)
    files = [str(p) for p in parts]
    dataset = InMemoryDataset()
    dataset.init(batch_size=256, thread_num=1, use_var=SLOTS)
    dataset.set_filelist(files)
    dataset.load_into_memory()
    records = dataset.get_memory_data_size()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    loads, runs = [], {"without dumps": [], "with dumps": []}
    with tempfile.TemporaryDirectory() as folder:
        for repeat in range(args.repeats):
            loads.append(results_file.load_average())
            order = list(runs) if repeat % 2 == 0 else list(reversed(runs))
            for kind in order:
                strategy = DistributedStrategy()
                if kind == "with dumps":
                    strategy.trainer_desc_configs = {
                        "dump_fields_path": folder, "dump_fields": ["prob", "label"],
                    }
                fleet.init(strategy=strategy)
                torch.manual_seed(repeat)
                model = SmallCtr()
                optimizer = fleet.distributed_optimizer(
                    torch.optim.Adagrad(model.parameters(), lr=0.1))
                dataset.local_shuffle(seed=repeat)
                summary = Executor().train_from_dataset(model, dataset, optimizer, thread=1)
                if summary.records != records:
                    raise SystemExit(f"{kind}: trained {summary.records} of {records} records")
                if kind == "with dumps":
                    lines = (Path(folder) / "part-000-00000").read_text().count("\n")
                    if lines != records:
                        raise SystemExit(f"dumped {lines} lines for {records} records")
                runs[kind].append(records / summary.seconds)
                print(f"repeat {repeat + 1}: {kind}: {runs[kind][-1]:,.0f} records/s", flush=True)
    fleet.init()
    base, dumped = runs["without dumps"], runs["with dumps"]
    paired = sorted(d / b for d, b in zip(dumped, base, strict=True))
    lines = [
        "# What per-instance dumps cost a training pass",
        "",
        f"`{results_file.command()}` at {results_file.commit()}, started {started}: the "
        f"small CTR model, `train_from_dataset(thread=1)` over {records:,} records (batch "
        f"256), without dumps and with `dump_fields=['prob', 'label']` (one line per record, "
        f"checked), alternating, {args.repeats} repeat(s), `torch.set_num_threads(1)`. "
        f"1-minute load average at each repeat: {', '.join(f'{v:.2f}' for v in loads)}.",
        "",
        "| run | records/s (median) | runs |",
        "|---|---:|---|",
        *(f"| {kind} | {statistics.median(v):,.0f} | {', '.join(f'{x:,.0f}' for x in v)} |"
          for kind, v in runs.items()),
        "",
        f"With dumps / without, paired by repeat: median {statistics.median(paired):.2f}x "
        f"(range {paired[0]:.2f}-{paired[-1]:.2f}x).",
    ]
    text = "\n".join(lines) + "\n"
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
