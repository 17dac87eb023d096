"""Criteo reader: raw Criteo TSV lines -> MultiSlot records.

Slots (in this order, the order of use_var):
  dense_feature  13 floats: log(1 + x) of each integer feature (empty -> 0.0)
  C1 .. C26      one uint64 id each: the column number in the high 32 bits and the
                 hex category in the low 32 bits, so ids never collide across
                 columns (an empty category -> the column's own "missing" id)
  label          one int, 0 or 1

Run as a pipe command: pipe_command="python examples/criteo/reader.py".
"""

import math
import sys

from generators import MultiSlotDataGenerator

DENSE = 13
CATEGORICAL = 26
SLOT_NAMES = ["dense_feature"] + [f"C{i}" for i in range(1, CATEGORICAL + 1)] + ["label"]


class CriteoReader(MultiSlotDataGenerator):
    def generate_sample(self, line):
        def records():
            fields = line.rstrip("\r\n").split("\t")
            if len(fields) != 1 + DENSE + CATEGORICAL:
                raise ValueError(
                    f"expected {1 + DENSE + CATEGORICAL} tab-separated fields, "
                    f"found {len(fields)} in {line[:80]!r}"
                )
            dense = [
                math.log1p(max(int(v), 0)) if v else 0.0 for v in fields[1 : 1 + DENSE]
            ]
            sample = [("dense_feature", dense)]
            for column, value in enumerate(fields[1 + DENSE :], start=1):
                category = int(value, 16) if value else 0xFFFFFFFF
                sample.append((f"C{column}", [(column << 32) | category]))
            sample.append(("label", [int(fields[0])]))
            yield sample

        return records


if __name__ == "__main__":
    CriteoReader().run_from_stdin()
    sys.stdout.flush()
