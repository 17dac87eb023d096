"""Writes days of hourly data slices as they would land: one folder per hour,
``<root>/<day>/<HH>/part-<k>.txt``, each marked complete by ``to.hadoop.done``
written after its files, one slice every ``--every`` seconds.

A record is MultiSlot text with its instance id first (``<day><HH>-<file>-<line>``,
read with ``parse_ins_id``): one user id (``user``), one to three item ids
(``item``), four dense floats (``dense``) and a 0/1 ``label`` drawn from a
fixed logistic model of them, so that a trained model's AUC says something.

Usage: python examples/online_training/make_slices.py ROOT [--day 20261127]
       [--days 1] [--hours 4] [--lines 2000] [--files 2] [--every 1.0] [--seed 0]
"""

from __future__ import annotations

import argparse
import datetime
import os
import time

import numpy as np

DONE_FILE = "to.hadoop.done"


def slice_lines(rng: np.random.Generator, count: int, weights: dict, prefix: str) -> str:
    lines = []
    for number in range(count):
        user = int(rng.integers(0, 3000))
        items = rng.integers(0, 5000, size=int(rng.integers(1, 4)))
        dense = rng.normal(size=4)
        score = weights["user"][user] + weights["item"][items].mean() + dense @ weights["dense"]
        label = int(rng.random() < 1 / (1 + np.exp(-score)))
        lines.append(
            f"1 {prefix}-{number} 1 {user} {len(items)} {' '.join(map(str, items))} 4 "
            f"{' '.join(f'{v:.4f}' for v in dense)} 1 {label}\n"
        )
    return "".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root")
    parser.add_argument("--day", default="20261127", help="the first day")
    parser.add_argument("--days", type=int, default=1, help="days of slices, from --day on")
    parser.add_argument("--hours", type=int, default=4, help="slices 00 .. hours-1")
    parser.add_argument("--lines", type=int, default=2000, help="lines per file")
    parser.add_argument("--files", type=int, default=2, help="files per slice")
    parser.add_argument("--every", type=float, default=1.0, help="seconds between slices")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    truth = np.random.default_rng(args.seed)
    weights = {"user": truth.normal(size=3000), "item": truth.normal(size=5000),
               "dense": truth.normal(size=4)}
    first = datetime.datetime.strptime(args.day, "%Y%m%d")
    slices = [((first + datetime.timedelta(days=d)).strftime("%Y%m%d"), hour)
              for d in range(args.days) for hour in range(args.hours)]
    for number, (day, hour) in enumerate(slices):
        folder = os.path.join(args.root, day, f"{hour:02}")
        os.makedirs(folder, exist_ok=True)
        rng = np.random.default_rng([args.seed, int(day), hour])
        for k in range(args.files):
            with open(os.path.join(folder, f"part-{k}.txt"), "w") as out:
                out.write(slice_lines(rng, args.lines, weights, f"{day}{hour:02}-{k}"))
        open(os.path.join(folder, DONE_FILE), "w").close()  # the slice is complete
        print(f"make_slices: {folder} complete", flush=True)
        if number + 1 < len(slices):
            time.sleep(args.every)

if __name__ == "__main__":
    main()
