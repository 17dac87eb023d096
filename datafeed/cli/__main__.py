"""``python -m datafeed.cli``: the ``datafeed`` command from a checkout that is not installed."""

import sys

from .commands import main

if __name__ == "__main__":
    sys.exit(main())
