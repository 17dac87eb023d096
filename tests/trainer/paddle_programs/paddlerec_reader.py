"""The reader of ``paddlerec_paradigm.py``: raw lines ``label<TAB>user<TAB>item<TAB>category``
to MultiSlot records, as a PaddleRec reader subclasses Paddle's generator."""

import sys

import trainer.fleet as fleet


class Reader(fleet.MultiSlotDataGenerator):
    def generate_sample(self, line):
        def reader():
            label, user, item, category = (int(v) for v in line.rstrip("\n").split("\t"))
            # One table for the three fields: each field its own id range.
            yield [("user", [user]), ("item", [(1 << 32) | item]),
                   ("category", [(2 << 32) | category]), ("label", [label])]

        return reader


if __name__ == "__main__":
    Reader().run_from_stdin()
    sys.stdout.flush()
