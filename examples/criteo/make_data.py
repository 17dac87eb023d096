"""Writes raw Criteo-format TSV files with a label a model can learn.

The real Criteo click log cannot be downloaded here, so the demo and the
examples train on data of the same shape: a label, 13 integer features (empty
in ~20% of rows, as in the real log) and 26 categorical features written as
8-digit hex strings (empty in ~5% of rows). The label is drawn from a logistic
model over a few dense features and per-category weights of a few categorical
features, so both kinds of feature carry signal.

Usage: python examples/criteo/make_data.py OUT_DIR [--files 4] [--lines 50000] [--seed 0]
"""

from __future__ import annotations

import argparse
import os

import numpy as np

DENSE = 13
CATEGORICAL = 26
# Categories per categorical column: a mix of small and large vocabularies.
VOCAB_SIZES = [50, 500, 5000, 20000] * 6 + [100, 1000]


def make_files(out_dir: str, files: int = 4, lines: int = 50_000, seed: int = 0) -> list[str]:
    """Writes ``files`` files of ``lines`` rows each; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    # The "true" model, shared by every file.
    dense_weights = rng.normal(0, 0.6, DENSE) * (rng.random(DENSE) < 0.5)
    category_weights = [rng.normal(0, 1.0, size) for size in VOCAB_SIZES]
    category_codes = [rng.integers(0, 2**32, size, dtype=np.uint64) for size in VOCAB_SIZES]
    paths = []
    for index in range(files):
        path = os.path.join(out_dir, f"part-{index:05d}.tsv")
        _write_file(path, lines, rng, dense_weights, category_weights, category_codes)
        paths.append(path)
    return paths


def _write_file(path, lines, rng, dense_weights, category_weights, category_codes) -> None:
    # Counts-like dense features: heavy-tailed, non-negative (a few -1 as in Criteo).
    dense = np.floor(rng.lognormal(1.0, 1.5, (lines, DENSE))).astype(np.int64)
    dense[:, 1] -= rng.integers(0, 2, lines)  # column 2 of Criteo has small negatives
    dense_missing = rng.random((lines, DENSE)) < 0.2
    # Zipf-like category choice: popular categories dominate, as in click logs.
    picks = [np.minimum(rng.zipf(1.3, lines) - 1, size - 1) for size in VOCAB_SIZES]
    cat_missing = rng.random((lines, CATEGORICAL)) < 0.05

    logit = np.log1p(np.where(dense_missing, 0, np.maximum(dense, 0))) @ dense_weights
    logit -= logit.mean()
    for column in range(0, CATEGORICAL, 3):  # every third categorical feature matters
        logit += np.where(cat_missing[:, column], 0.0, category_weights[column][picks[column]])
    label = (rng.random(lines) < 1 / (1 + np.exp(-(logit - 1.0)))).astype(np.int64)

    with open(path, "w") as out:
        for row in range(lines):
            fields = [str(label[row])]
            fields += [
                "" if dense_missing[row, c] else str(dense[row, c]) for c in range(DENSE)
            ]
            fields += [
                "" if cat_missing[row, c] else f"{int(category_codes[c][picks[c][row]]):08x}"
                for c in range(CATEGORICAL)
            ]
            out.write("\t".join(fields) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for path in make_files(args.out_dir, args.files, args.lines, args.seed):
        print(path)


if __name__ == "__main__":
    main()
