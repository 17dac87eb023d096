"""Reader of mind_interactions.csv: `user_id,item_id,position`.

Slots: user:uint64,item:uint64,position:int64:1
"""

from generators import MultiSlotDataGenerator


class MindReader(MultiSlotDataGenerator):
    def generate_sample(self, line):
        def records():
            user, item, position = line.rstrip("\n").split(",")
            yield [("user", [int(user)]), ("item", [int(item)]), ("position", [int(position)])]

        return records


if __name__ == "__main__":
    MindReader().run_from_stdin()
