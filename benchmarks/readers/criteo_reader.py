"""A Criteo ``reader.py``: raw Criteo TSV lines in, MultiSlot samples out.

Input lines are Criteo's raw click log (``data/real/criteo_raw.tsv``): a label,
13 integer features (possibly empty or negative) and 26 categorical features
as 8-digit hex strings (possibly empty), tab separated. Each line becomes one
sample:

* ``dense_feature``: 13 floats, ``log(1 + max(x, 0))`` as in DLRM's
  preprocessing, 0.0 for an empty field;
* ``C1`` .. ``C26``: one id each, the hex value placed in its slot's own
  range of a 64-bit id space (``slot << 32 | value``), 0 for an empty field;
* ``label``: one int.

The body is the same for every contender of ``bench_generator.py``; the base
class comes from ``FLEETFEED_BENCH_BASE``:

* ``fleetfeed`` (default): ``generators.MultiSlotDataGenerator``;
* ``oracle``: ``paddle_generator_oracle.MultiSlotDataGenerator``, the
  plain-Python model of Paddle's class in ``tests/`` (on ``PYTHONPATH``);
* ``paddle``: ``paddle.distributed.fleet.MultiSlotDataGenerator``;
* ``none``: no base class worth the name: samples are made and dropped, which
  measures the reader's own share of the time.

Usage: ``python criteo_reader.py < criteo_raw.tsv``
"""

from __future__ import annotations

import math
import os
import sys

BASE = os.environ.get("FLEETFEED_BENCH_BASE", "fleetfeed")
if BASE == "fleetfeed":
    from generators import MultiSlotDataGenerator
elif BASE == "oracle":
    from paddle_generator_oracle import MultiSlotDataGenerator
elif BASE == "paddle":
    from paddle.distributed.fleet import MultiSlotDataGenerator
elif BASE == "none":

    class MultiSlotDataGenerator:  # type: ignore[no-redef]
        """Runs generate_sample on every stdin line and drops the samples."""

        def run_from_stdin(self) -> None:
            for line in sys.stdin:
                for _sample in self.generate_sample(line)():
                    pass

else:
    raise SystemExit(
        f"FLEETFEED_BENCH_BASE must be fleetfeed, oracle, paddle or none, got {BASE!r}"
    )

DENSE_FIELDS = range(1, 14)
SPARSE_SLOTS = [(f"C{slot}", 13 + slot, slot << 32) for slot in range(1, 27)]


class CriteoReader(MultiSlotDataGenerator):
    """Raw Criteo TSV to dense_feature, C1..C26 and label slots."""

    def generate_sample(self, line):
        def criteo_sample():
            fields = line.rstrip("\n").split("\t")
            dense = [
                math.log1p(max(int(fields[index]), 0)) if fields[index] else 0.0
                for index in DENSE_FIELDS
            ]
            sample = [("dense_feature", dense)]
            for name, index, id_base in SPARSE_SLOTS:
                token = fields[index]
                sample.append((name, [id_base | int(token, 16) if token else 0]))
            sample.append(("label", [int(fields[0])]))
            yield sample

        return criteo_sample


if __name__ == "__main__":
    CriteoReader().run_from_stdin()
