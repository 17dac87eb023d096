"""Write synthetic Criteo-layout MultiSlot text files for the engine benchmark.

Each line has the shape of PaddleRec's preprocessed Criteo data
(``data/real/criteo_slots.txt``) in MultiSlot form::

    13 d1 .. d13  1 C1 .. 1 C26  1 label

The dense values are Criteo's integer features normalised as PaddleRec does,
``(raw - min) / (max - min)``, rounded to 12 significant digits (so ``str()``
prints ``0.00497512437811`` as the real file does); the 26 sparse ids lie in
``[0, 1e6)`` with per-slot vocabularies sized after Criteo's and a skewed
popularity; about a quarter of the labels are 1. Lines average ~310 bytes,
like the real sample. Output is a pure function of ``(lines, files, seed)``.

Generation is vectorised: every token is laid out in a fixed-width byte
matrix padded with NUL bytes, and the NULs are dropped in one pass, which
writes a million lines in a few seconds.

Usage: ``python benchmarks/make_criteo.py OUT_DIR [--lines N] [--files F] [--seed S]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

# Bump when the output for the same (lines, files, seed) changes, so that old
# data is regenerated rather than reused.
FORMAT_VERSION = 1
MANIFEST = ".make_criteo.json"

# PaddleRec's Criteo normalisation (models/rank/dnn/data/get_slot_data.py):
# value = (raw - min) / (max - min); values above 1 are kept, as there.
_DENSE_MIN = np.array([0, -3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
_DENSE_DIFF = np.array([20, 603, 100, 50, 64000, 500, 100, 50, 500, 10, 10, 10, 50])
# Fitted by eye to the real sample: share of raw zeros, median of the rest.
_DENSE_P0 = np.array(
    [0.72, 0.1, 0.25, 0.25, 0.05, 0.22, 0.19, 0.15, 0.04, 0.72, 0.19, 0.95, 0.29]
)
_DENSE_MEDIAN = np.array([2, 6, 3, 2, 3000, 20, 4, 6, 36, 1, 1, 1, 2])
# Criteo (Kaggle) categorical cardinalities, capped at the id range below.
_CARDINALITY = [
    1460,
    583,
    10131227,
    2202608,
    305,
    24,
    12517,
    633,
    3,
    93145,
    5683,
    8351593,
    3194,
    27,
    14992,
    5461306,
    10,
    5652,
    2173,
    4,
    7046547,
    18,
    15,
    286181,
    105,
    142572,
]
ID_RANGE = 1_000_000
_ID_DIGITS = 6  # ids < 1e6 have at most 6 decimal digits
_CHUNK = 1 << 17  # rows per generated block: bounds the byte matrix to ~64 MB


def _dense_tokens(raw: np.ndarray, col: int) -> np.ndarray:
    """Format one dense column as NUL-padded ``str()`` bytes, shape (n, width)."""
    # Format each distinct raw value once: a column has at most a few
    # thousand of them, so Python's own str() stays affordable and exact.
    uniq, inverse = np.unique(raw, return_inverse=True)
    values = (uniq - _DENSE_MIN[col]) / _DENSE_DIFF[col]
    table = np.array([str(float(f"{v:.12g}")).encode() for v in values])
    return table.view(np.uint8).reshape(len(uniq), -1)[inverse]


def _digit_tokens(ids: np.ndarray) -> np.ndarray:
    """Decimal digits of ids < 1e6 as bytes, leading zeros NUL, shape (n, 6)."""
    powers = 10 ** np.arange(_ID_DIGITS - 1, -1, -1, dtype=np.int64)
    digits = ids[:, None] // powers % 10
    # A digit is written once a non-zero digit precedes it, or it is the last.
    keep = np.maximum.accumulate(digits > 0, axis=1)
    keep[:, -1] = True
    return np.where(keep, digits + ord("0"), 0).astype(np.uint8)


def _block(rng: np.random.Generator, vocabs: list[np.ndarray], n: int) -> bytes:
    """Generate ``n`` lines as one bytes object."""
    parts: list[np.ndarray] = []

    def const(text: str) -> None:
        parts.append(
            np.broadcast_to(np.frombuffer(text.encode(), np.uint8), (n, len(text)))
        )

    const("13 ")
    for col in range(13):
        nonzero = np.maximum(
            1, np.round(rng.lognormal(np.log(_DENSE_MEDIAN[col]), 1.2, n))
        )
        raw = np.where(rng.random(n) < _DENSE_P0[col], 0, nonzero).astype(np.int64)
        parts.append(_dense_tokens(raw, col))
        const(" ")
    for vocab in vocabs:
        # u**3 skews the picks towards the head of the vocabulary, as real
        # categorical features are (a few ids hold most of the traffic).
        pick = (len(vocab) * rng.random(n) ** 3).astype(np.int64)
        const("1 ")
        parts.append(_digit_tokens(vocab[pick]))
        const(" ")
    const("1 ")
    parts.append((rng.random(n) < 0.256).astype(np.uint8)[:, None] + ord("0"))
    const("\n")
    matrix = np.concatenate(parts, axis=1)
    # Row-major order of the non-NUL bytes is exactly the text of the lines.
    return matrix[matrix != 0].tobytes()


def _manifest(lines: int, files: int, seed: int) -> dict[str, int]:
    return {"version": FORMAT_VERSION, "lines": lines, "files": files, "seed": seed}


def make_criteo(
    out_dir: str | os.PathLike[str], lines: int, files: int, seed: int = 0
) -> list[str]:
    """Write ``lines`` Criteo-layout MultiSlot lines split over ``files`` files.

    Files are ``part-00000.txt`` ...; lines are split as evenly as possible.
    When ``out_dir`` already holds the files written with the same parameters
    (checked against a small manifest and the file sizes) nothing is written.

    Args:
        out_dir: directory to write into; created if missing.
        lines: total number of lines (>= 1).
        files: number of files (1 <= files <= lines).
        seed: the output is a pure function of ``(lines, files, seed)``.

    Returns:
        The paths of the files, in order.

    Raises:
        ValueError: on a non-positive ``lines`` or ``files``, or more files
            than lines.
    """
    if lines < 1 or files < 1 or files > lines:
        raise ValueError(f"need 1 <= files <= lines, got lines={lines}, files={files}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"part-{i:05d}.txt" for i in range(files)]
    manifest_path = out / MANIFEST
    wanted = _manifest(lines, files, seed)
    try:
        old = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        old = {}
    if old.get("params") == wanted and all(
        p.is_file() and p.stat().st_size == old["sizes"].get(p.name) for p in paths
    ):
        return [str(p) for p in paths]

    # Remove files a previous, different run left, so a glob of the directory
    # never mixes two data sets; the manifest goes first so that an
    # interrupted run is never mistaken for a complete one.
    manifest_path.unlink(missing_ok=True)
    for stale in out.glob("part-*.txt"):
        stale.unlink()
    vocab_rng = np.random.default_rng([seed, 0])
    vocabs = [
        vocab_rng.choice(ID_RANGE, size=min(c, ID_RANGE), replace=False)
        for c in _CARDINALITY
    ]
    sizes: dict[str, int] = {}
    base, extra = divmod(lines, files)
    for i, path in enumerate(paths):
        rng = np.random.default_rng([seed, 1, i])  # per file: independent of the others
        remaining = base + (i < extra)
        with open(path, "wb") as f:
            while remaining:
                n = min(remaining, _CHUNK)
                f.write(_block(rng, vocabs, n))
                remaining -= n
        sizes[path.name] = path.stat().st_size
    manifest_path.write_text(json.dumps({"params": wanted, "sizes": sizes}, indent=1))
    return [str(p) for p in paths]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    paths = make_criteo(args.out_dir, args.lines, args.files, args.seed)
    total = sum(os.path.getsize(p) for p in paths)
    print(
        f"{len(paths)} files, {args.lines} lines, {total / 1e6:.1f} MB in {args.out_dir}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
