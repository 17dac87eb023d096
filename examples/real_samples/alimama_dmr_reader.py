"""Reader of alimama_dmr.csv: 267 comma-separated fields per row.

Fields 0-249 are five behaviour sequences of 50 ids each, 250-263 user and
item ids and attributes, 264 a price (a float), 265 one more id, 266 the click
label.

Slots: history_1..history_5:int64:50,profile:int64:14,price:float32:1,extra:int64:1,label:int64:1
"""

from generators import MultiSlotDataGenerator

SEQUENCE = 50


class AlimamaDmrReader(MultiSlotDataGenerator):
    def generate_sample(self, line):
        def records():
            fields = line.rstrip("\n").split(",")
            histories = [
                (f"history_{i + 1}", [int(v) for v in fields[i * SEQUENCE : (i + 1) * SEQUENCE]])
                for i in range(5)
            ]
            yield [*histories, ("profile", [int(v) for v in fields[250:264]]),
                   ("price", [float(fields[264])]), ("extra", [int(fields[265])]),
                   ("label", [int(fields[266])])]

        return records


if __name__ == "__main__":
    AlimamaDmrReader().run_from_stdin()
