"""The online example under ``fleetrun --max_restarts``, with processes SIGKILLed
at random moments while slices land: every record of every slice is trained
once (each pass's dumps hold each of its records once), every pass is saved and
listed once, in order, and in sync mode the tables end equal to those of the
same job run without a failure. benchmarks/soak_online.py runs it for two days
of hourly slices with ten kills."""

from __future__ import annotations

import pytest
from online_soak import (
    Schedule,
    check,
    dumped_auc,
    make_source,
    pass_lines,
    run_job,
    table_difference,
)

SCHEDULE = Schedule(hours=4, lines=1000, every=0.3)


@pytest.mark.distributed
@pytest.mark.slow
def test_sigkills_at_random_moments_train_every_record_once_and_change_no_row(tmp_path):
    source = make_source(tmp_path / "source", SCHEDULE)
    clean = run_job(tmp_path / "clean", source, SCHEDULE, "sync", kills=0, seed=1)
    assert clean.returncode == 0, clean.stderr
    assert check(clean, source, SCHEDULE) == []
    # Kills after 1-6 s of each attempt: in its start, a load, a pass, a save.
    crashed = run_job(tmp_path / "crashed", source, SCHEDULE, "sync", kills=2, seed=7,
                      wait=(1.0, 6.0))
    assert crashed.returncode == 0, crashed.stderr
    assert len(crashed.kills) == 2 and crashed.restarts >= 1, (crashed.kills, crashed.stderr)
    assert check(crashed, source, SCHEDULE) == [], crashed.kills
    # Sync training of the same records in the same order: the same rows and
    # values (two runs without a failure measured equal to the bit).
    for save in ["20261127/base"] + [f"20261127/delta-{p}" for p in range(1, 5)]:
        # The published deltas too: a pass trained again publishes the rows it
        # would have published without the failure.
        assert table_difference(clean.out / save, crashed.out / save) <= 1e-5, (
            save, crashed.kills)
    passes = pass_lines(crashed)
    assert [p["records"] for p in passes.values()] == [2000] * 4
    # The dumps' predictions give each pass's cluster AUC (printed to 4 decimals).
    for (day, pass_id), reported in passes.items():
        assert dumped_auc(crashed.out, day, pass_id) == pytest.approx(
            reported["auc"], abs=5e-5), (day, pass_id)
