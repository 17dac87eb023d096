"""BST reader: user behaviour sequences (`name:value` tokens) -> MultiSlot records.

Input lines (see examples/data/real/bst_sequences.txt) hold `userid`, a variable
number of `history`, `cate` and `position` tokens, then `target`, `target_cate`,
`target_position` and `label`. Slots, in use_var order:
  userid, history, cate, position, target, target_cate, target_position, label
history, cate and position are sparse (one value per past behaviour); an empty
sequence is padded with a single 0 so that every slot has a value.

Run as a pipe command: pipe_command="python examples/bst/reader.py".
"""

from generators import MultiSlotDataGenerator

SLOTS = [
    "userid", "history", "cate", "position", "target", "target_cate", "target_position", "label"
]


class BSTReader(MultiSlotDataGenerator):
    def generate_sample(self, line):
        def records():
            values = {name: [] for name in SLOTS}
            for token in line.split():
                name, _, value = token.partition(":")
                if name not in values:
                    raise ValueError(f"unknown field {name!r} in token {token!r}")
                values[name].append(int(value))
            yield [(name, values[name] or [0]) for name in SLOTS]

        return records


if __name__ == "__main__":
    BSTReader().run_from_stdin()
