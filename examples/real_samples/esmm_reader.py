"""Reader of esmm_fields.txt: `<sample id>,<click>,<conversion>,` then `field:feasign` tokens.

Field names repeat and differ between rows, so every feasign goes into one
sparse slot, keyed by its field: a stable hash of the field name in the high 32
bits, the feasign in the low 32.

Slots: features:uint64,click:int64:1,conversion:int64:1
"""

import zlib

from generators import MultiSlotDataGenerator


class EsmmReader(MultiSlotDataGenerator):
    def generate_sample(self, line):
        def records():
            fields = line.rstrip("\n").split(",")
            features = []
            for token in fields[3:]:
                field, feasign = token.split(":")
                features.append((zlib.crc32(field.encode()) << 32) | (int(feasign) & 0xFFFFFFFF))
            yield [("features", features), ("click", [int(fields[1])]),
                   ("conversion", [int(fields[2])])]

        return records


if __name__ == "__main__":
    EsmmReader().run_from_stdin()
