"""Records what Paddle's own generators write for every case of
``tests/helpers/paddle_generator_cases.py`` into ``tests/data/paddle_generators/``.

Runs in Paddle's venv, never in fleetfeed's (that venv has no Paddle, this one
no fleetfeed)::

    make record-paddle-fixtures
    # or, with paddlepaddle==3.3.1 installed in .venv-paddle:
    .venv-paddle/bin/python tests/generators/record_paddle_fixtures.py

``--output-dir DIR`` records elsewhere: ``test_generators.py`` does so to compare
fleetfeed with a live Paddle. Paddle's import-time warnings go to the terminal,
never into a recording: every case's stdout is a buffer of its own.
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

HELPERS = Path(__file__).resolve().parents[1] / "helpers"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--output-dir",
        type=Path,
        help="where to write cases.json and the .txt files (default: tests/data/paddle_generators)",
    )
    parser.add_argument(
        "--any-version",
        action="store_true",
        help="record whatever Paddle is installed, not only the pinned version",
    )
    args = parser.parse_args(argv)

    sys.path.insert(0, str(HELPERS))
    import paddle_generator_cases as cases

    try:
        # Imported here, before any case replaces stdout, so that what Paddle
        # prints at import stays out of the recorded bytes.
        import paddle
    except ImportError:
        print(
            f"{sys.executable} has no Paddle: run `make record-paddle-fixtures`, which "
            f"installs paddlepaddle=={cases.PADDLE_VERSION} in .venv-paddle",
            file=sys.stderr,
        )
        return 2
    if paddle.__version__ != cases.PADDLE_VERSION and not args.any_version:
        print(
            f"Paddle {paddle.__version__} is installed, the fixtures are of "
            f"{cases.PADDLE_VERSION}: install paddlepaddle=={cases.PADDLE_VERSION} "
            "(or pass --any-version)",
            file=sys.stderr,
        )
        return 2

    results = cases.run_all("paddle")
    output_dir = args.output_dir or cases.FIXTURES
    recorded_with = {"paddlepaddle": paddle.__version__, "python": platform.python_version()}
    cases.write_recording(results, output_dir, recorded_with)
    errors = sum("error" in result for result in results.values())
    print(
        f"recorded {len(results)} cases ({len(results) - errors} outputs, {errors} errors) "
        f"of Paddle {paddle.__version__} in {output_dir}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
