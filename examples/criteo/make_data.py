"""Writes raw Criteo-format TSV files with a label a model can learn.

The real Criteo click log cannot be downloaded here, so the demo and the
examples train on data of the same shape: a label, 13 integer features (empty
in ~20% of rows, as in the real log) and 26 categorical features written as
8-digit hex strings (empty in ~5% of rows). The label is drawn from a logistic
model over a few dense features and per-category weights of a few categorical
features, so both kinds of feature carry signal.

Usage: python examples/criteo/make_data.py OUT_DIR [--files 4] [--lines 50000] [--seed 0]

OUT_DIR keeps its files (``part-00000.tsv``, ...) while the parameters stay
the same: a stamp beside them, ``OUT_DIR/.params``, holds the parameters they
were made with. Other parameters regenerate the directory (its earlier
``part-*.tsv`` files removed, so that a ``part-*.tsv`` glob finds no file of an
earlier run); a directory of ``part-*.tsv`` files without a stamp is refused.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import re

import numpy as np

DENSE = 13
CATEGORICAL = 26
# Categories per categorical column: a mix of small and large vocabularies.
VOCAB_SIZES = [50, 500, 5000, 20000] * 6 + [100, 1000]
# Beside the files: the parameters they were generated with.
STAMP = ".params"
FILE_NAME = re.compile(r"part-\d{5}\.tsv")


class StaleDataError(RuntimeError):
    """A data directory holds files that make_data.py cannot vouch for."""


def ensure_files(out_dir: str, files: int = 4, lines: int = 50_000, seed: int = 0) -> list[str]:
    """The paths of ``files`` files of ``lines`` rows in ``out_dir``, generated
    unless its stamp says they already are, for these parameters.

    Processes that ask at the same time (the workers of one job) wait for each
    other: one generates, the others find its stamp.

    Raises:
        StaleDataError: ``out_dir`` holds ``part-*.tsv`` files but no stamp
            (files of another program, or of make_data.py before it stamped).
    """
    wanted = f"files={files} lines={lines} seed={seed}\n"
    paths = [os.path.join(out_dir, f"part-{index:05d}.tsv") for index in range(files)]
    os.makedirs(out_dir, exist_ok=True)
    stamp = os.path.join(out_dir, STAMP)
    directory = os.open(out_dir, os.O_RDONLY)
    try:
        fcntl.flock(directory, fcntl.LOCK_EX)  # released when closed
        found = _read_stamp(stamp)
        if found == wanted and all(os.path.exists(path) for path in paths):
            return paths
        earlier = sorted(name for name in os.listdir(out_dir) if FILE_NAME.fullmatch(name))
        if found is None and earlier:
            raise StaleDataError(
                f"{out_dir} holds {len(earlier)} part-*.tsv file(s) ({earlier[0]}, ...) but no "
                f"{STAMP} stamp, so they may be another program's or an older run's: expected "
                f"an empty directory or one make_data.py stamped; remove them or choose "
                f"another directory"
            )
        # Marked unfinished first: a run stopped half-way is regenerated next time.
        _write_atomically(stamp, "unfinished\n")
        for name in earlier:
            os.unlink(os.path.join(out_dir, name))
        make_files(out_dir, files, lines, seed)
        _write_atomically(stamp, wanted)
        return paths
    finally:
        os.close(directory)


def _read_stamp(path: str) -> str | None:
    try:
        with open(path) as stamp:
            return stamp.read()
    except FileNotFoundError:
        return None


def _write_atomically(path: str, text: str) -> None:
    staging = f"{path}.{os.getpid()}"
    with open(staging, "w") as out:
        out.write(text)
    os.replace(staging, path)


def make_files(out_dir: str, files: int = 4, lines: int = 50_000, seed: int = 0) -> list[str]:
    """Writes ``files`` files of ``lines`` rows each, always, and no stamp
    (``ensure_files`` is the one that keeps a directory consistent); returns
    their paths."""
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
    try:
        paths = ensure_files(args.out_dir, args.files, args.lines, args.seed)
    except StaleDataError as error:
        raise SystemExit(f"make_data.py: {error}") from None
    for path in paths:
        print(path)


if __name__ == "__main__":
    main()
