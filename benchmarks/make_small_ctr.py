"""Write the small CTR data set of issue 14 as MultiSlot text.

Each line holds five slots, in this order::

    4 d1 d2 d3 d4   1 u   n i1 .. in   1 c   1 label

four dense floats (standard normal, 4 decimals); ``u``: one id of 3,000;
``i``: 1 to 3 ids of 5,000; ``c``: one id of 50; the label drawn from a
logistic truth: ``sigmoid(w_d . d + w_u[u] + sum w_i[i] + w_c[c] - 0.5)`` with
hidden weights fixed by the seed. Ids are offset per slot (u from 1, i from
10,001, c from 20,001) so that no two slots share an id. Output is a pure
function of ``(lines, files, seed)``; the held-out file uses the same truth
with other draws.

Usage: ``python benchmarks/make_small_ctr.py OUT_DIR [--lines 20000] [--files 4]
[--heldout 20000] [--seed 0]`` writes ``part-0.txt`` .. and ``heldout.txt``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

U_IDS, I_IDS, C_IDS = 3000, 5000, 50
U_BASE, I_BASE, C_BASE = 1, 10_001, 20_001


def _truth(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([seed, 7])
    return {
        "dense": rng.normal(0, 0.8, 4),
        "u": rng.normal(0, 0.8, U_IDS),
        "i": rng.normal(0, 0.6, I_IDS),
        "c": rng.normal(0, 0.8, C_IDS),
    }


def make_lines(lines: int, truth: dict[str, np.ndarray], rng: np.random.Generator) -> str:
    """``lines`` MultiSlot lines drawn with ``rng`` under the hidden weights ``truth``."""
    dense = rng.normal(0, 1, (lines, 4))
    u = rng.integers(0, U_IDS, lines)
    counts = rng.integers(1, 4, lines)
    i_ids = rng.integers(0, I_IDS, (lines, 3))
    c = rng.integers(0, C_IDS, lines)
    taken = np.arange(3)[None, :] < counts[:, None]
    logit = (
        dense @ truth["dense"] + truth["u"][u] + (truth["i"][i_ids] * taken).sum(1)
        + truth["c"][c] - 0.5
    )
    label = (rng.random(lines) < 1 / (1 + np.exp(-logit))).astype(int)
    out = []
    for n in range(lines):
        d = " ".join(f"{v:.4f}" for v in dense[n])
        items = " ".join(str(I_BASE + v) for v in i_ids[n, : counts[n]])
        out.append(
            f"4 {d} 1 {U_BASE + u[n]} {counts[n]} {items} 1 {C_BASE + c[n]} 1 {label[n]}\n"
        )
    return "".join(out)


def write(out_dir: Path, lines: int = 20000, files: int = 4, heldout: int = 20000,
          seed: int = 0) -> tuple[list[Path], Path]:
    """Writes the training files and the held-out file (kept when already there
    with these parameters); returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = out_dir / ".params"
    wanted = f"{lines} {files} {heldout} {seed}"
    parts = [out_dir / f"part-{f}.txt" for f in range(files)]
    held = out_dir / "heldout.txt"
    if stamp.exists() and stamp.read_text() == wanted and held.exists() and all(
        p.exists() for p in parts
    ):
        return parts, held
    truth = _truth(seed)
    for f, path in enumerate(parts):
        path.write_text(make_lines(lines, truth, np.random.default_rng([seed, f])))
    held.write_text(make_lines(heldout, truth, np.random.default_rng([seed, 10_000])))
    stamp.write_text(wanted)
    return parts, held


def main() -> None:
    """Command line: see the module's docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--lines", type=int, default=20000, help="lines per file")
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--heldout", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    parts, held = write(args.out_dir, args.lines, args.files, args.heldout, args.seed)
    print(" ".join(str(p) for p in [*parts, held]))


if __name__ == "__main__":
    main()
