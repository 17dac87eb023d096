"""Reliability: the parser survives hostile input and agrees with the reference.

A bounded mutation-fuzzing run in a subprocess (a crash kills the subprocess,
a hang hits the timeout); ``benchmarks/fuzz_parser.py`` runs the same longer.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import parser_fuzz
from conftest import PYTHON

FUZZER = Path(__file__).with_name("parser_fuzz.py")


def test_fuzzed_input_parses_like_the_reference_and_never_crashes():
    done = subprocess.run(
        [PYTHON, str(FUZZER), "4", "20261122"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts["mismatches"] == 0
    assert counts["inputs"] > 1000
    assert counts["parse_errors"] > 100 and counts["records_compared"] > 1000


def test_the_fuzzer_reports_a_disagreement(monkeypatch):
    # A reference that loses the last record of every text must be caught.
    real = parser_fuzz.reference_parser.parse

    def lossy(*args, **kwargs):
        result = real(*args, **kwargs)
        result.records = result.records[:-1]
        return result

    monkeypatch.setattr(parser_fuzz.reference_parser, "parse", lossy)
    with pytest.raises(AssertionError, match="parsers disagree"):
        parser_fuzz.fuzz(5, seed=1)
