"""The online example under ``fleetrun --max_restarts``, with processes SIGKILLed
at random moments while slices land: every record of every slice is trained
once (each pass's dumps hold each of its records once), every pass is saved and
listed once, in order, and in sync mode the tables end equal to those of the
same job run without a failure. benchmarks/soak_online.py runs it for two days
of hourly slices with ten kills."""

from __future__ import annotations

import datetime
import itertools

import numpy as np
import pytest
from online_soak import (
    Schedule,
    check,
    dumped_auc,
    make_source,
    pass_lines,
    run_job,
    table_difference,
    tables,
)

from trainer.ps.checkpoint import directory as checkpoint
from trainer.ps.checkpoint import table_files
from trainer.ps.checkpoint.table_files import read_table

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


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["geo", "async"])
def test_a_pass_is_saved_with_every_workers_updates(tmp_path, mode):
    # A restart resumes from the last listed pass's save, as if every record of
    # the pass were in it. The day's last pass is saved, then (after the day's
    # shrink, which drops rows and decays statistics but leaves values alone)
    # the day's base: with no training between, every row both hold has the
    # same values. A worker's updates still unsent at its pass's end (GEO's
    # steps since its last sync, async's pushes in flight) would land between.
    schedule = Schedule(hours=2, lines=1000, every=0.1)
    source = make_source(tmp_path / "source", schedule)
    job = run_job(tmp_path / "job", source, schedule, mode, kills=0, seed=1)
    assert job.returncode == 0, job.stderr
    last_pass = tables(job.out / f"{schedule.day}/{schedule.hours}")
    base = tables(job.out / f"{schedule.day}/base")
    for name, columns in base.items():
        if name == "dense":
            for index, values in columns.items():
                assert np.array_equal(values, last_pass["dense"][index]), (name, index)
            continue
        kept = np.isin(last_pass[name]["ids"], columns["ids"])
        assert kept.sum() == columns["ids"].size > 0
        for key in ("weights", *(k for k in columns if k.startswith("state."))):
            assert np.array_equal(last_pass[name][key][kept], columns[key]), (name, key)
    # The published deltas form one chain from the job's first save, each
    # naming the state of the one before: the day's checkpoints between them
    # leave it whole. Loading them in order gives the last pass's rows.
    # The untrained model: the end of the day before, saved and listed at the start.
    day_before = datetime.datetime.strptime(schedule.day, "%Y%m%d") - datetime.timedelta(days=1)
    saves = [f"{day_before:%Y%m%d}/base",
             *(f"{schedule.day}/delta-{p}" for p in range(1, schedule.hours + 1))]
    metas = [checkpoint.read_meta(str(job.out / save)) for save in saves]
    for before, delta in itertools.pairwise(metas):
        assert delta["after"] == checkpoint.state_of(before), delta
    # The first save is of the untrained model: no rows yet.
    first = table_files.summary(str(job.out / saves[0]))["tables"]
    assert all(table["rows"] == 0 for table in first.values())
    rows = tables(job.out / saves[1])
    for save in saves[2:]:
        rows = apply_delta(rows, job.out / save)
    for name, columns in last_pass.items():
        for key, values in columns.items():
            assert np.array_equal(rows[name][key], values), (name, key)


def apply_delta(rows: dict, delta) -> dict:
    """``rows`` (``tables``' layout) with the delta checkpoint at ``delta`` applied:
    its rows replace or add theirs, its dropped ids go."""
    changed = tables(delta)
    out = {"dense": changed["dense"]}  # every checkpoint holds the dense values whole
    for name, columns in rows.items():
        if name == "dense":
            continue
        dropped = [c["dropped"] for c in read_table(str(delta), name) if "dropped" in c]
        dropped = np.concatenate(dropped) if dropped else np.zeros(0, np.uint64)
        keep = ~np.isin(columns["ids"], np.concatenate([changed[name]["ids"], dropped]))
        merged = {k: np.concatenate([v[keep], changed[name][k]]) for k, v in columns.items()}
        order = np.argsort(merged["ids"])
        out[name] = {k: v[order] for k, v in merged.items()}
    return out
