"""examples/criteo/reader.py, run on Paddle's base class (for bench_speed.py).

Paddle's python (/opt/paddle-venv/bin/python) runs this as the pipe command.
The reader's own code is imported unchanged: ``generators`` is pointed at
Paddle's ``MultiSlotDataGenerator`` before the import, so ``CriteoReader``
subclasses Paddle's class with the very same ``generate_sample``.
"""

import os
import sys
import types

from paddle.distributed.fleet import MultiSlotDataGenerator

sys.modules["generators"] = types.SimpleNamespace(MultiSlotDataGenerator=MultiSlotDataGenerator)
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "criteo"))

from reader import CriteoReader

if __name__ == "__main__":
    CriteoReader().run_from_stdin()
