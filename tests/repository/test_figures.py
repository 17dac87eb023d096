"""Every measured figure in the README and the docs is one a script wrote.

A figure (a rate, a duration, a size, a ratio, an AUC) may stand in a page only
inside a quote that ``benchmarks/quote_results.py`` writes from the results a
benchmark script produced, and every quote equals what its source says now.
What the pages may still state as numbers are settings and limits the code
fixes (a default timeout, a frame limit), listed in ``SETTINGS`` with the
constant or test that holds each.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import quote_results  # noqa: E402 - benchmarks/ is not a package

UNIT = (
    r"(?:x\b|%|\s?(?:s|ms|us|µs|min|MB|MiB|GB|GiB|KB|KiB|bytes)\b"
    r"|\s?(?:M\s|k\s)?(?:lines|records|rows|messages)/s)"
)
FIGURE = re.compile(
    r"(?<![\w.\-/])\d[\d,]*(?:\.\d+)?(?:-\d[\d,]*(?:\.\d+)?)?" + UNIT
    + r"|\bAUC (?:of |is |at )?0\.\d+|\b0\.\d{3,}\b"
)
# A quote of quote_results.py, or a block that a benchmark script writes into the
# page itself (results_file.write_section(NAME, ..., page)): its figures are the
# script's. A block of another name is checked as typed text.
BLOCK = re.compile(r"<!-- (?P<name>results:[\w/#]+|\w+):begin -->.*?<!-- (?P=name):end -->", re.S)

# Numbers that are settings or limits of the code, not measurements: each with
# where the code (or a test) fixes it.
SETTINGS = {
    "4 MiB": "trainer/job/store.py MAX_REPLY_BYTES",
    "5 s": "trainer/ps/transport.py HANDSHAKE_DEADLINE_S; launch.STOP_GRACE_SECONDS",
    "10 s": "trainer/ps/transport.py _RefusalLog(every=10.0): one refusal line per period",
    "12 s": "tests/trainer/test_ps_wire_fuzz.py FUZZ_SECONDS: the suite's wire fuzz",
    "30 s": "transport.DEFAULT_CALL_TIMEOUT; libzmq's default ZMQ_HANDSHAKE_IVL (30000 ms)",
    "30s": "transport.DEFAULT_CALL_TIMEOUT, as an error message prints it",
    "300 s": "trainer/collective/process_group.py DEFAULT_TIMEOUT",
    "0.1 s": "trainer/job/launch.py POLL_SECONDS",
    "2 s": "datafeed/source/process.py: how long a closed pipe may stay held open",
    "64 MiB": "datafeed/config/settings.py max_line_bytes's default; trainer/job/store.py "
              "MAX_STORE_BYTES; the RSS growth test_a_store_flood_costs_its_host_little and "
              "test_unauthenticated_connections_announcing_2_gib_cost_the_server_little allow "
              "an outsider; benchmarks/fuzz_ps_wire.py --rss-bound's default",
    "96 MiB": "tests/trainer/test_store_auth.py test_a_store_flood_costs_its_host_little: "
              "the growth it allows a key holder's flood (64 + 32 MiB)",
    "8 MiB": "datafeed/source/ranges.py: the smallest file read as several ranges; "
             "trainer/job/store.py MAX_WAITING_BYTES",
    "1 MiB": "trainer/ps/wire.py MAX_FRAME_BYTES (= MAX_HEADER_BYTES); trainer/job/store.py "
             "MAX_VALUE_BYTES",
    "2 GiB": "the frame the attacks announce: announced=2**31 in test_ps_attacks.py "
             "test_unauthenticated_connections_announcing_2_gib_cost_the_server_little and "
             "test_store_auth.py test_a_store_flood_costs_its_host_little",
    "16 KiB": "datafeed/source/process_groups.py STDERR_TAIL_BYTES",
    "16 MiB": "datafeed/reorder/global_shuffle.py: a sender's chunk; what the 2 GiB attacks "
              "send per connection (payload_bytes=16 << 20)",
    "64 bytes": "trainer/ps/transport.py MAX_FRAME_BYTES = wire.MAX_FRAME_BYTES + 64: CURVE's box",
    "128 bytes": "trainer/job/store.py ENTRY_OVERHEAD",
    "1,024 bytes": "trainer/job/store.py MAX_NAME_BYTES",
    "32 bytes": "a dim-8 row's float32 weights: 8 x 4 bytes",
    "16 bytes": "a row's statistics record / an id index slot; trainer/job/keys.py MIN_KEY_BYTES",
    "4 bytes": "datafeed/reorder/global_shuffle.py _least_record_bytes: a sparse int32 offset",
    "8 bytes": "datafeed/reorder/global_shuffle.py PLAN_BYTES_PER_RECORD",
}


def pages() -> list[Path]:
    return [path for path in quote_results.documents() if path.exists()]


def written_by_a_script(name: str, page: Path) -> bool:
    """Whether a script under benchmarks/ names the block ``name`` and ``page``."""
    if name.startswith("results:"):
        return True  # quote_results.py writes every quote
    return any(
        f'"{name}"' in script.read_text() and page.name in script.read_text()
        for script in (ROOT / "benchmarks").glob("*.py")
    )


def figures_outside_quotes(path: Path, root: Path = ROOT) -> list[str]:
    found = []
    text = BLOCK.sub(
        lambda m: "\n" * m.group(0).count("\n") if written_by_a_script(m["name"], path)
        else m.group(0),
        path.read_text(),
    )
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue  # commands and programs, run by test_docs
        for match in FIGURE.finditer(line):
            if match.group(0).strip() not in SETTINGS:
                found.append(f"{path.relative_to(root)}:{number}: {match.group(0)!r} in {line!r}")
    return found


def test_every_quote_equals_its_source():
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "quote_results.py"), "--check"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("path", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_figure_stands_outside_a_quote(path):
    found = figures_outside_quotes(path)
    assert not found, (
        "figures that no script writes (quote them from benchmarks/results with "
        "benchmarks/quote_results.py, or add a setting to SETTINGS with where the "
        "code fixes it):\n" + "\n".join(found)
    )


def test_the_figure_check_catches_a_typed_figure(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "Loads at 3.80 M lines/s, 3.6x Paddle, held-out AUC 0.91.\n"
        "<!-- results:engine:begin -->\n| 3.80 M lines/s |\n<!-- results:engine:end -->\n"
        "The handshake deadline is 5 s.\n"
        "<!-- made_by_hand:begin -->\n2.5x faster\n<!-- made_by_hand:end -->\n"
    )
    found = figures_outside_quotes(page, tmp_path)
    assert [f.split(": ", 1)[1].split(" in ")[0] for f in found] == [
        "'3.80 M lines/s'", "'3.6x'", "'AUC 0.91'", "'2.5x'"
    ]
