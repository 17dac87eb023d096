"""Reader of criteo_featidx.txt: 39 x `feat_idx:<int>`, 39 x `feat_value:<float>`, `label:<0/1>`.

Slots: feat_idx:int64:39,feat_value:float32:39,label:int64:1
"""

from generators import MultiSlotDataGenerator


class CriteoFeatIdxReader(MultiSlotDataGenerator):
    def generate_sample(self, line):
        def records():
            pairs = [token.split(":") for token in line.split()]
            yield [
                ("feat_idx", [int(v) for k, v in pairs if k == "feat_idx"]),
                ("feat_value", [float(v) for k, v in pairs if k == "feat_value"]),
                ("label", [int(v) for k, v in pairs if k == "label"]),
            ]

        return records


if __name__ == "__main__":
    CriteoFeatIdxReader().run_from_stdin()
