"""fleetfeed end-to-end demo on generated data (no external services).

1. writes a Criteo-like raw data set (a few TSV files with a learnable label),
   or keeps the one an earlier run with the same --files and --lines wrote;
2. runs examples/criteo/reader.py (a generators.MultiSlotDataGenerator) over every
   file as a pipe command, 2 files at a time, into an InMemoryDataset;
3. shuffles the records with a seed and iterates them as batches of torch tensors;
4. prints the throughput of each stage and a few decoded records;
5. trains wide&deep as a parameter-server job (fleetrun: 1 server + 2 workers on
   this machine) and prints its held-out AUC.

Run with `make demo`, or `python examples/demo.py --help` for the options.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "criteo"))

import torch  # noqa: F401  # imported up front, as a training script does
from make_data import StaleDataError, ensure_files

from datafeed import InMemoryDataset, Ragged, Slot

READER = os.path.join(HERE, "criteo", "reader.py")
WIDE_AND_DEEP = os.path.join(HERE, "wide_and_deep_ps", "train.py")
SLOTS = (
    [Slot("dense_feature", "float32", (13,))]
    + [Slot(f"C{i}", "uint64") for i in range(1, 27)]
    + [Slot("label", "int64", (1,))]
)


def main() -> None:
    parser = argparse.ArgumentParser(description="fleetfeed end-to-end demo")
    parser.add_argument("--out", default="demo_output", help="where the generated data goes")
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--lines", type=int, default=25_000, help="lines per file")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--train-lines", type=int, default=10_000,
                        help="lines per file of the training job's data")
    parser.add_argument("--no-train", action="store_true", help="skip step 5")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    print(
        f"== 1. data: {args.files} raw Criteo-like files x {args.lines:,} lines in {args.out}/data"
    )
    started = time.perf_counter()
    try:  # kept from an earlier run with the same --files and --lines
        files = ensure_files(os.path.join(args.out, "data"), args.files, args.lines, seed=0)
    except StaleDataError as error:
        raise SystemExit(f"demo.py: {error}") from None
    print(f"   ready in {time.perf_counter() - started:.1f} s")

    print(f"== 2. load: pipe_command='python {os.path.relpath(READER)}', thread_num={args.threads}")
    dataset = InMemoryDataset()
    dataset.init(
        batch_size=args.batch_size,
        thread_num=args.threads,
        use_var=SLOTS,
        pipe_command=f"{sys.executable} {READER}",
    )
    dataset.set_filelist(files)
    dataset.load_into_memory()
    stats = dataset.stats()
    print(
        f"   {stats.records:,} records from {stats.files} files in {stats.seconds:.2f} s: "
        f"{stats.lines / stats.seconds:,.0f} lines/s, {stats.bytes / stats.seconds / 1e6:.1f} MB/s "
        f"of MultiSlot text; {stats.skipped_lines} lines skipped"
    )
    print(
        f"   in memory: {dataset.nbytes / 1e6:.1f} MB "
        f"({dataset.nbytes / stats.records:.0f} bytes/record)"
    )

    print(f"== 3. local_shuffle(seed={args.seed}) and one pass of batches of {args.batch_size}")
    started = time.perf_counter()
    dataset.local_shuffle(seed=args.seed)
    print(f"   shuffled in {time.perf_counter() - started:.3f} s")
    started = time.perf_counter()
    records = positives = 0
    for batch in dataset:
        records += batch.size
        positives += int(batch["label"].sum())
    seconds = time.perf_counter() - started
    print(
        f"   {records:,} records in {seconds:.3f} s: {records / seconds / 1e6:.2f} M records/s; "
        f"click rate {positives / records:.3f}"
    )

    print("== 4. the first 3 records after the shuffle")
    first = next(iter(dataset))
    for row in range(3):
        dense = first["dense_feature"][row]
        ids = [first[f"C{i}"] for i in range(1, 27)]
        print(
            f"   label={int(first['label'][row])} "
            f"dense=[{', '.join(f'{v:.2f}' for v in dense[:5].tolist())}, ...] "
            f"C1..C3={[hex(_record(r, row)[0] & (2**64 - 1)) for r in ids[:3]]}"
        )
    if not args.no_train:
        train_wide_and_deep(args.out, args.train_lines)
    print("demo finished")


def train_wide_and_deep(out: str, lines: int) -> None:
    """Runs examples/wide_and_deep_ps as a 1-server, 2-worker job and shows its result."""
    log_dir = os.path.join(out, "log")
    print("== 5. train: fleetrun --server_num=1 --worker_num=2 examples/wide_and_deep_ps/train.py")
    started = time.perf_counter()
    command = [
        sys.executable, "-m", "trainer.job.launch", "--server_num=1", "--worker_num=2",
        f"--log_dir={log_dir}", WIDE_AND_DEEP,
        "--data", os.path.join(out, "wide_and_deep_data"), "--lines", str(lines),
    ]
    finished = subprocess.run(command, timeout=900, check=False)
    with open(os.path.join(log_dir, "workerlog.0")) as log:
        results = [line.rstrip() for line in log if "AUC" in line]
    if finished.returncode != 0:
        raise SystemExit(
            f"the training job failed (exit status {finished.returncode}); see {log_dir}/"
        )
    for line in results:
        print(f"   {line}")
    print(f"   job finished in {time.perf_counter() - started:.1f} s; logs in {log_dir}/")


def _record(ragged: Ragged, row: int) -> list[int]:
    return ragged[row].tolist()


if __name__ == "__main__":
    main()
