"""Reader of criteo_slots.txt: `click:0`, 13 x `dense_feature:<float>`, `1:<id>` ... `26:<id>`.

Slots: dense_feature:float32:13,C1..C26:uint64,label:int64:1
"""

from generators import MultiSlotDataGenerator


class CriteoSlotsReader(MultiSlotDataGenerator):
    def generate_sample(self, line):
        def records():
            pairs = [token.split(":") for token in line.split()]
            dense = [float(v) for k, v in pairs if k == "dense_feature"]
            sparse = [(f"C{k}", [int(v)]) for k, v in pairs if k.isdigit()]
            label = [int(v) for k, v in pairs if k == "click"]
            yield [("dense_feature", dense), *sparse, ("label", label)]

        return records


if __name__ == "__main__":
    CriteoSlotsReader().run_from_stdin()
