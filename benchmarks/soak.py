"""Soak: 20 epochs of release -> load -> local_shuffle -> iterate on 1M Criteo lines,
then 3 successive train_from_dataset calls on the dataset.

Peak RSS must stay flat after the first epoch and after the first training
call (Paddle has open reports of leaks here: #23887, #72527) and
release_memory must give the memory back. Writes the
"soak" section of benchmarks/RESULTS.md.

Usage: python benchmarks/soak.py [--epochs 20] [--lines 1000000]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
from pathlib import Path

from make_criteo import make_criteo  # sibling scripts
from results_file import write_section

HERE = Path(__file__).resolve().parent

RUN = """
import json, sys, time
sys.path.insert(0, {repo!r})
import torch  # as a training script would
from datafeed import InMemoryDataset, Slot

def rss():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024

slots = ([Slot("dense_input", "float32", (13,))] + [Slot(f"C{{i}}", "uint64") for i in range(1, 27)]
         + [Slot("label", "int64", (1,))])
ds = InMemoryDataset()
ds.init(batch_size=512, thread_num=2, use_var=slots, progress=False)
ds.set_filelist(sys.argv[1:])
base = rss()
epochs = []
for epoch in range({epochs}):
    ds.release_memory()
    released = rss() - base
    started = time.perf_counter()
    ds.load_into_memory()
    ds.local_shuffle(seed=epoch)
    records = sum(batch.size for batch in ds)
    epochs.append(dict(epoch=epoch, records=records, loaded=rss() - base, released=released,
                       seconds=time.perf_counter() - started))
# Then 3 successive train_from_dataset calls on the dataset in memory.
from trainer import Executor

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.EmbeddingBag(1 << 16, 8, mode="sum")
        self.out = torch.nn.Linear(13 + 8, 1)

    def forward(self, batch):
        bags = sum(self.emb(batch[f"C{{i}}"].values % (1 << 16), batch[f"C{{i}}"].offsets[:-1])
                   for i in range(1, 9))
        x = torch.cat([batch["dense_input"], bags], dim=1)
        logit = self.out(x).squeeze(1)
        return {{"loss": torch.nn.functional.binary_cross_entropy_with_logits(
            logit, batch["label"].squeeze(1).float())}}

def peak():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024

torch.manual_seed(0)
model = Model()
optimizer = torch.optim.Adagrad(model.parameters(), lr=0.05)
base_peak = peak()
train = []
for call in range(3):
    summary = Executor().train_from_dataset(model, ds, optimizer, thread=2, fetch_list=[])
    train.append(dict(records=summary.records, seconds=summary.seconds, rss=rss() - base,
                      peak=peak() - base, loss=summary.mean_loss))
print(json.dumps(dict(epochs=epochs, store=ds.nbytes, train=train)))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=8)
    args = parser.parse_args()
    paths = make_criteo(HERE / "data" / "criteo", args.lines, args.files, 0)
    done = subprocess.run(
        [
            sys.executable, "-c", RUN.format(repo=str(HERE.parent), epochs=args.epochs),
            *map(str, paths),
        ],
        capture_output=True, text=True, timeout=3600, check=False,
    )
    if done.returncode != 0:
        sys.exit(f"the soak run failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    epochs, store = result["epochs"], result["store"]
    mib = 1 << 20
    first, later = epochs[0]["loaded"], [e["loaded"] for e in epochs[1:]]
    released = [e["released"] for e in epochs[1:]]
    lost = sum(1 for e in epochs if e["records"] != args.lines)
    lines = [
        "## Soak: release -> load -> shuffle -> iterate",
        "",
        (
            f"`python benchmarks/soak.py --epochs {args.epochs} --lines {args.lines}` on "
            f"{datetime.date.today()} (torch imported first, as in a training script). RSS is "
            "measured against the process before the first load."
        ),
        "",
        "| epochs | records per epoch | store MiB | RSS after epoch 1 MiB "
        "| RSS after later epochs MiB (min / median / max) "
        "| RSS after release_memory MiB (median) | epochs with a wrong record count |",
        "|---:|---:|---:|---:|---|---:|---:|",
        (
            f"| {len(epochs)} | {epochs[0]['records']:,} | {store / mib:.0f} | {first / mib:.0f} | "
            f"{min(later) / mib:.0f} / {statistics.median(later) / mib:.0f} / "
            f"{max(later) / mib:.0f} | "
            f"{statistics.median(released) / mib:.0f} | {lost} |"
        ),
        "",
        f"Seconds per epoch (median): {statistics.median(e['seconds'] for e in epochs):.2f}.",
        "",
        (
            "Then 3 successive `Executor().train_from_dataset` calls (2 threads, a small model "
            "with an EmbeddingBag over 8 of the id slots) on the same dataset in memory:"
        ),
        "",
        "| call | records | seconds | RSS MiB | peak RSS (VmHWM) MiB | mean loss |",
        "|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {i + 1} | {t['records']:,} | {t['seconds']:.1f} | {t['rss'] / mib:.0f} | "
            f"{t['peak'] / mib:.0f} | {t['loss']:.4f} |"
            for i, t in enumerate(result["train"])
        ),
        "",
        (
            "Peak RSS growth from call 1 to call 3: "
            f"{(result['train'][2]['peak'] - result['train'][0]['peak']) / mib:.1f} MiB; "
            "calls with a wrong record count: "
            f"{sum(1 for t in result['train'] if t['records'] != args.lines)}."
        ),
    ]
    write_section("soak", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
