"""The Criteo reader of examples/criteo, as this example's pipe command.

Slots: dense_feature (13 floats), C1..C26 (one uint64 id each, the column in the
high 32 bits), label. See examples/criteo/reader.py.
"""

import os
import sys

EXAMPLES = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(EXAMPLES, "criteo"))

from reader import CriteoReader

if __name__ == "__main__":
    CriteoReader().run_from_stdin()
    sys.stdout.flush()
