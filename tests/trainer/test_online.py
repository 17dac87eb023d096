"""The online loop's parts with Paddle's FleetUtil names: the passes of a day,
the wait for a slice's done file, and the done files listing each save."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import pytest

from trainer.loop.online import (
    DoneFileTimeout,
    last_saved_model,
    online_pass_interval,
    wait_for_done_file,
    write_model_donefile,
    write_xbox_donefile,
)


def test_a_day_of_five_minute_slices_in_passes_of_an_hour() -> None:
    passes = online_pass_interval("20261127", "{0..23}", 5, 12, False)
    assert len(passes) == 24
    assert passes[0] == [f"00{m:02}" for m in range(0, 60, 5)]
    assert passes[23][-1] == "2355"
    # What Paddle's FleetUtil.get_online_pass_interval gives for these arguments:
    # every 5-minute split of the day, 12 to a pass.
    assert [s for p in passes for s in p] == [
        f"{h:02}{m:02}" for h in range(24) for m in range(0, 60, 5)
    ]


def test_hourly_folders_and_hours_that_do_not_start_at_midnight() -> None:
    assert online_pass_interval("{20261127}", "{8..11}", 60, 2, True) == [
        ["08", "09"], ["10", "11"],
    ]
    # Paddle's loop starts at midnight and runs out of splits here (IndexError).
    assert online_pass_interval("1", "{8..9}", 30, 2, False) == [
        ["0800", "0830"], ["0900", "0930"],
    ]
    # Splits that fill no last pass are left out, as in Paddle (with a warning:
    # test_slices_no_pass_reads_are_named).
    assert online_pass_interval("1", "{0..2}", 60, 2, True) == [["00", "01"]]
    # As Paddle: the hours' minutes // split_interval splits (3 h of 120 min: one).
    assert online_pass_interval("1", "{0..2}", 120, 1, True) == [["00"]]
    assert online_pass_interval("1", "{0}", 7, 4, False) == [
        ["0000", "0007", "0014", "0021"], ["0028", "0035", "0042", "0049"],
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("1", "0..23", 5, 12, False), r"hours must be a number, '\{N\}' or a range"),
        (("1", "{5..2}", 5, 12, False), "runs backwards"),
        (("1; rm -rf /", "{0..23}", 5, 12, False), "days must be a number"),
        (("1", "{0..24}", 5, 12, False), "hours must lie in 0..23"),
        (("1", "{0..23}", 0, 12, False), r"split_interval \(minutes\) and split_per_pass must"),
    ],
)
def test_bad_intervals_are_named(args, message) -> None:
    with pytest.raises(ValueError, match=message):
        online_pass_interval(*args)


def test_the_wait_ends_when_the_done_file_appears(tmp_path: Path) -> None:
    folder = tmp_path / "20261127" / "08"
    folder.mkdir(parents=True)
    timer = threading.Timer(0.3, lambda: (folder / "to.hadoop.done").touch())
    timer.start()
    try:
        waited = wait_for_done_file(str(folder), poll_interval=0.05, timeout=30)
    finally:
        timer.cancel()
    assert 0.25 <= waited < 30


def test_a_slice_that_stays_incomplete_times_out_naming_it(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(DoneFileTimeout, match=rf"the slice {tmp_path} is not complete: "
                                              r"_SUCCESS did not appear within 0.3 s"):
        wait_for_done_file(str(tmp_path), "_SUCCESS", poll_interval=0.1, timeout=0.3)
    assert time.monotonic() - started < 5


def test_the_model_done_file_lists_each_save_once(tmp_path: Path) -> None:
    out = str(tmp_path)
    assert last_saved_model(out) == (-1, -1, "", -1)
    assert write_model_donefile(out, 20261127, 1, 1700000000)
    assert write_model_donefile(out, "20261127", 2, 1700000000)
    assert not write_model_donefile(out, 20261127, "1", 1700000000)  # listed already
    assert write_model_donefile(out, 20261127, -1, 1700000000)  # the day's base
    assert (tmp_path / "donefile.txt").read_text() == (
        f"20261127\t1700000000\t{out}/20261127/1/\t1\t0\n"
        f"20261127\t1700000000\t{out}/20261127/2/\t2\t0\n"
        f"20261127\t1700000000\t{out}/20261127/0/\t-1\t0\n"
    )
    assert last_saved_model(out) == (20261127, -1, f"{out}/20261127/0/", 1700000000)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["donefile.txt"]  # no temporaries


def test_the_serving_done_file_takes_only_later_saves(tmp_path: Path) -> None:
    out = str(tmp_path)
    assert write_xbox_donefile(out, 20261127, 3, 1700000000, ["data/08", "data/09"],
                               fs_name="hdfs://nn", worker_num=2, record_count=12345)
    assert not write_xbox_donefile(out, 20261127, 3, 1700000000, "data/08")  # again
    assert not write_xbox_donefile(out, 20261127, 2, 1700000000, "data/07")  # earlier
    assert write_xbox_donefile(out, 20261128, 1, 1700000000, "data/00")
    lines = (tmp_path / "xbox_patch_done.txt").read_text().splitlines()
    first = json.loads(lines[0])
    assert list(first) == [
        "id", "key", "input", "record_count", "partition_type", "job_name", "ins_tag",
        "ins_path", "job_id", "monitor_data", "monitor_path", "mpi_size",
    ]
    assert first["key"] == "1700000000"
    assert first["input"] == f"hdfs://nn{out}/20261127/delta-3/000"
    assert first["record_count"] == "12345" and first["mpi_size"] == "2"
    assert first["ins_path"] == "data/08,data/09"
    assert json.loads(lines[1])["input"].endswith("/20261128/delta-1/000")
    assert len(lines) == 2
    # A base goes to its own file, its id the base key.
    assert write_xbox_donefile(out, 20261128, -1, 1700000500, "data")
    assert not write_xbox_donefile(out, 20261128, -1, 1700000600, "data")
    (base,) = (tmp_path / "xbox_base_done.txt").read_text().splitlines()
    assert json.loads(base)["id"] == "1700000500"
    assert json.loads(base)["input"].endswith("/20261128/base/000")


def test_fleet_util_is_paddles_interface_to_them(tmp_path: Path) -> None:
    from trainer import fleet
    from trainer.fleet import FleetUtil

    fleet.init()  # one local worker: it writes, no barrier
    util = FleetUtil()
    assert util.get_online_pass_interval("1", "{0..1}", 60, 1, True) == [["00"], ["01"]]
    empty = util.get_last_save_model(str(tmp_path), "", "user,pass")
    assert empty[:3] == [-1, -1, ""] and abs(empty[3] - time.time()) < 60  # Paddle's "now"
    util.write_model_donefile(str(tmp_path), 20261127, 5, 1700000000, "", "")
    util.write_xbox_donefile(str(tmp_path), 20261127, 5, 1700000000, "data/05", "", "")
    assert util.get_last_save_model(str(tmp_path), "", "") == [
        20261127, 5, f"{tmp_path}/20261127/5/", 1700000000,
    ]
    (line,) = (tmp_path / "xbox_patch_done.txt").read_text().splitlines()
    assert json.loads(line)["mpi_size"] == "1"


@pytest.mark.parametrize(
    ("path", "fs_name", "expected"),
    [
        ("hdfs:/user/ctr/out", "hdfs://nn:9000", "hdfs://nn:9000/user/ctr/out"),
        ("/user/ctr/out", "hdfs://nn:9000/", "hdfs://nn:9000/user/ctr/out"),
        ("s3://bucket/out", "hdfs://nn:9000", "s3://bucket/out"),
        ("online_out", "", "online_out"),
    ],
)
def test_paddles_paths_on_a_hadoop_file_system_become_uris(path, fs_name, expected) -> None:
    from trainer.fleet import _paddle_path

    assert _paddle_path(path, fs_name) == expected


def test_a_hadoop_path_without_the_file_systems_name_is_refused() -> None:
    from trainer.fleet import FleetUtil

    with pytest.raises(ValueError, match="'afs:/user/x' is a path on a Hadoop file system, "
                                         "but hadoop_fs_name is empty"):
        FleetUtil().get_last_save_model("afs:/user/x", "", "")


def test_a_failing_look_is_waited_through_and_named_at_the_timeout(monkeypatch) -> None:
    from datafeed.source import fs

    looked = []

    def unreachable(path, filesystem=None):  # as a remote store that does not answer
        looked.append(path)
        raise OSError("connection refused")

    monkeypatch.setattr(fs, "exists", unreachable)
    with pytest.raises(DoneFileTimeout, match="the last look failed: connection refused"):
        wait_for_done_file("s3://bucket/d?region=x", "_SUCCESS", 0.05, 2)
    assert len(looked) > 1  # it kept looking
    assert looked[0] == "s3://bucket/d/_SUCCESS?region=x"  # the query stays last


def test_a_long_wait_says_what_it_waits_for_and_why_a_look_failed(monkeypatch, caplog) -> None:
    from datafeed.source import fs
    from trainer.loop import online

    looks = iter([False, False, OSError("permission denied"), False, True])

    def exists(path, filesystem=None):
        found = next(looks)
        if isinstance(found, Exception):
            raise found
        return found

    monkeypatch.setattr(fs, "exists", exists)
    monkeypatch.setattr(online, "WAIT_NOTE_SECONDS", 0.01)
    with caplog.at_level("INFO", logger="trainer.loop.online"):
        wait_for_done_file("/data/20261127/03", "_SUCCESS", 0.02, None)
    notes = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert notes and all("still waiting for /data/20261127/03/_SUCCESS" in m for _, m in notes)
    # Warnings: an INFO line is never seen under Python's default logging.
    assert notes[0][0] == "WARNING" and "failed" not in notes[0][1]
    assert all(level == "WARNING" for level, _ in notes)
    assert any("the last look failed: permission denied" in m for _, m in notes)


class RecordingFleet:
    """The fleet API as OnlineLoop calls it, one worker, recording each call."""

    def __init__(self, server: bool = False) -> None:
        self.calls: list[tuple] = []
        self.server = server
        outer = self

        class Util:
            @staticmethod
            def all_reduce(values, mode):
                return values

            @staticmethod
            def get_file_shard(files):
                return list(files)

        class Strategy:
            trainer_desc_configs: dict = {}

        self.util, self._strategy = Util(), Strategy()

        class Current:
            strategy = outer._strategy

        self._current = Current()

    def current(self):
        return self._current

    def __getattr__(self, name):
        answers = {"is_server": self.server, "is_first_worker": True, "worker_num": 1}

        def call(*args, **kwargs):
            self.calls.append((name, *args, *sorted(kwargs.items())))
            if name == "save_persistables":
                Path(args[0]).mkdir(parents=True, exist_ok=True)
            return answers.get(name)
        return call


class LoadedDataset:
    def __init__(self, files, calls) -> None:
        self.files, self.calls = files, calls

    def load_into_memory(self) -> None:
        self.calls.append(("load", [Path(f).parent.name for f in self.files]))

    def preload_into_memory(self) -> None:
        self.calls.append(("preload", [Path(f).parent.name for f in self.files]))

    def wait_preload_done(self) -> None:
        pass

    def release_memory(self) -> None:
        pass


def online_loop_calls(
    tmp_path: Path, first_day: str = "20261127", server: bool = False, **schedule
) -> list[tuple]:
    from trainer.loop.online_loop import OnlineLoop

    fleet = RecordingFleet(server)
    loop = OnlineLoop(
        fleet, str(tmp_path / "data"), str(tmp_path / "out"), first_day,
        make_dataset=lambda files: LoadedDataset(files, fleet.calls), dump_fields=["prob"],
        **{"hours": "{0..1}", **schedule},
    )
    loop.run(lambda dataset, step: fleet.calls.append(("train", step.pass_id)) or None)
    out = str(tmp_path / "out")
    return [tuple(str(a).replace(out, "OUT") for a in call) for call in fleet.calls
            if call[0] not in ("barrier_worker", "worker_num", "is_server", "is_first_worker")]


def test_the_online_loop_keeps_the_order_and_resumes_after_the_last_listed_pass(
    tmp_path: Path,
) -> None:
    for hour in ("00", "01"):
        folder = tmp_path / "data" / "20261127" / hour
        folder.mkdir(parents=True)
        (folder / "part-0").write_text("")
        (folder / "to.hadoop.done").write_text("")
    assert online_loop_calls(tmp_path) == [
        ("init_worker",), ("worker_group",),
        # The untrained model, saved and listed as the end of the day before.
        ("save_persistables", "OUT/20261126/0"),
        ("save_persistables", "OUT/20261126/base", "('mode', 0)"),
        ("load", "['00']"), ("preload", "['01']"),  # the next pass reads while this one trains
        ("set_pass", "1"), ("train", "1"),
        ("save_persistables", "OUT/20261127/delta-1", "('mode', 1)"),  # the delta first
        ("save_persistables", "OUT/20261127/1"),
        ("set_pass", "1"), ("train", "2"),
        ("save_persistables", "OUT/20261127/delta-2", "('mode', 1)"),
        ("save_persistables", "OUT/20261127/2"),
        ("shrink",), ("save_persistables", "OUT/20261127/0"),
        ("save_persistables", "OUT/20261127/base", "('mode', 0)"),
        ("stop_worker",),
    ]
    listed = [line.split("\t")[3] for line in
              (tmp_path / "out" / "donefile.txt").read_text().splitlines()]
    assert listed == ["-1", "1", "2", "-1"]
    # A job that died after pass 1 was listed: the next attempt trains pass 2 on.
    donefile = tmp_path / "out" / "donefile.txt"
    donefile.write_text("".join(line + "\n" for line in donefile.read_text().splitlines()[:2]))
    calls = online_loop_calls(tmp_path)
    assert [c for c in calls if c[0] in ("train", "save_persistables")] == [
        ("train", "2"), ("save_persistables", "OUT/20261127/delta-2", "('mode', 1)"),
        ("save_persistables", "OUT/20261127/2"), ("save_persistables", "OUT/20261127/0"),
        ("save_persistables", "OUT/20261127/base", "('mode', 0)"),
    ]
    assert [line.split("\t")[3] for line in donefile.read_text().splitlines()] == [
        "-1", "1", "2", "-1"]


def _slices(tmp_path: Path, day: str, hours: list[str]) -> None:
    for hour in hours:
        folder = tmp_path / "data" / day / hour
        folder.mkdir(parents=True)
        (folder / "part-0").write_text("")
        (folder / "to.hadoop.done").write_text("")


def test_a_restart_with_other_passes_is_refused_before_it_skips_a_slice(tmp_path: Path) -> None:
    from trainer.job.errors import TrainerError

    _slices(tmp_path, "20261127", ["00", "01", "02", "03"])
    online_loop_calls(tmp_path, hours="{0..3}")  # four passes of an hour
    donefile = tmp_path / "out" / "donefile.txt"
    # Died after pass 1 (listed after the untrained model).
    donefile.write_text("".join(line + "\n" for line in donefile.read_text().splitlines()[:2]))
    # Two hours a pass: "pass 2" would be hours 02-03, and hour 01 never trained.
    refused = (
        r"resumes day 20261127 after its pass 1 .*whose passes were hours='\{0\.\.3\}', "
        r"split_interval=60, split_per_pass=1, .*\(4 a day, .*split_per_pass=2, .*"
        r"\(2 a day\).*Relaunch with the recorded settings")
    for server in (True, False):  # every process, before it serves or trains
        with pytest.raises(TrainerError, match=refused):
            calls = online_loop_calls(tmp_path, server=server, hours="{0..3}", split_per_pass=2)
    assert donefile.read_text().count("\n") == 2  # nothing trained, nothing listed
    # The same passes go on from pass 2; an output that recorded none is recorded.
    (tmp_path / "out" / "online_schedule.json").unlink()
    calls = online_loop_calls(tmp_path, hours="{0..3}")
    assert [c[1] for c in calls if c[0] == "train"] == ["2", "3", "4"]
    assert json.loads((tmp_path / "out" / "online_schedule.json").read_text())["passes"] == [
        ["00"], ["01"], ["02"], ["03"]]
    # Once the day has ended, the next day may bring other passes, then recorded.
    _slices(tmp_path, "20261128", ["00", "01", "02", "03"])
    calls = online_loop_calls(tmp_path, "20261127", hours="{0..3}", split_per_pass=2, days=2)
    assert [c[1] for c in calls if c[0] == "train"] == ["1", "2"]
    assert [c[1] for c in calls if c[0] in ("load", "preload")] == ["['00', '01']", "['02', '03']"]
    assert json.loads((tmp_path / "out" / "online_schedule.json").read_text())["passes"] == [
        ["00", "01"], ["02", "03"]]
    # A record that is not one is said to be so.
    (tmp_path / "out" / "online_schedule.json").write_text("[1, 2]\n")
    with pytest.raises(TrainerError, match=r"online_schedule.json is not the online loop's "
                       r"record of its passes \(expected a JSON object, found list\)"):
        online_loop_calls(tmp_path, hours="{0..3}")


def test_the_online_loop_refuses_a_second_commit_log(tmp_path: Path, monkeypatch) -> None:
    from trainer.job.errors import TrainerError
    from trainer.loop.online_loop import OnlineLoop

    monkeypatch.setenv("FLEETFEED_RESUME_DIR", str(tmp_path / "ckpt"))
    loop = OnlineLoop(RecordingFleet(), str(tmp_path), str(tmp_path / "out"), "20261127",
                      make_dataset=list)
    with pytest.raises(TrainerError, match=r"do not save with dataset= in an online job"):
        loop.run(lambda dataset, step: None)


def test_each_base_has_its_own_key_and_the_next_days_deltas_carry_it(tmp_path: Path) -> None:
    out = tmp_path / "out"

    def keys(name: str) -> list[tuple[str, str]]:  # (the save's folder, its key)
        lines = (out / name).read_text().splitlines()
        return [("/".join(json.loads(line)["input"].split("/")[-3:-1]),
                 json.loads(line)["key"]) for line in lines]

    for day in ("20261127", "20261128", "20261129"):
        _slices(tmp_path, day, ["00", "01"])
    online_loop_calls(tmp_path, days=2)
    bases, deltas = keys("xbox_base_done.txt"), keys("xbox_patch_done.txt")
    # The untrained model's base first (PaddleRec's save_first_base): the first
    # day's deltas apply to a base the serving side has.
    assert [folder for folder, _ in bases] == ["20261126/base", "20261127/base", "20261128/base"]
    started, first, second = (int(key) for _, key in bases)
    assert second > first > started  # a serving side that keys its bases loads each
    ins_paths = [json.loads(line)["ins_path"] for line in
                 (out / "xbox_base_done.txt").read_text().splitlines()]
    assert ins_paths == ["", f"{tmp_path}/data/20261127", f"{tmp_path}/data/20261128"]
    assert deltas == [("20261127/delta-1", str(started)), ("20261127/delta-2", str(started)),
                      ("20261128/delta-1", str(first)), ("20261128/delta-2", str(first))]
    assert [json.loads(line)["id"] for line in
            (out / "xbox_base_done.txt").read_text().splitlines()] == [
                str(started), str(first), str(second)]
    donefile = [line.split("\t") for line in (out / "donefile.txt").read_text().splitlines()]
    assert [(d[0], d[3], int(d[1])) for d in donefile] == [
        ("20261126", "-1", started),
        ("20261127", "1", started), ("20261127", "2", started), ("20261127", "-1", first),
        ("20261128", "1", first), ("20261128", "2", first), ("20261128", "-1", second)]
    # A restart after a day's end: the next day's deltas carry that base's key.
    online_loop_calls(tmp_path, days=3)
    assert keys("xbox_patch_done.txt")[-2:] == [
        ("20261129/delta-1", str(second)), ("20261129/delta-2", str(second))]
    assert int(keys("xbox_base_done.txt")[-1][1]) > second


def test_a_relaunch_with_a_later_first_day_goes_on_counting_the_days(tmp_path: Path) -> None:
    for day in ("20261127", "20261128", "20261130"):
        _slices(tmp_path, day, ["00", "01"])

    def passes_set(calls: list[tuple]) -> list[str]:
        return [call[1] for call in calls if call[0] == "set_pass"]

    assert passes_set(online_loop_calls(tmp_path, days=2)) == ["1", "1", "2", "2"]
    record = tmp_path / "out" / "online_schedule.json"
    assert json.loads(record.read_text())["first_day"] == "20261127"
    # Relaunched two days on: the tables' pass goes forward (the 29th unseen).
    assert passes_set(online_loop_calls(tmp_path, "20261130")) == ["4", "4"]
    assert json.loads(record.read_text())["first_day"] == "20261127"
    # An output recorded before the first day was: its first listed save's day.
    record.write_text(json.dumps({
        k: v for k, v in json.loads(record.read_text()).items() if k != "first_day"}))
    (tmp_path / "out" / "donefile.txt").write_text("".join(
        line + "\n" for line in (tmp_path / "out" / "donefile.txt").read_text().splitlines()
        if not line.startswith("20261130")))
    assert passes_set(online_loop_calls(tmp_path, "20261130")) == ["4", "4"]
    assert json.loads(record.read_text())["first_day"] == "20261127"
    # A fresh output counts from its own first day.
    _slices(tmp_path / "other", "20261130", ["00", "01"])
    assert passes_set(online_loop_calls(tmp_path / "other", "20261130")) == ["1", "1"]


def test_a_complete_slice_of_other_files_is_refused_and_an_empty_one_warned(
    tmp_path: Path, caplog
) -> None:
    # PaddleRec trains every file of a slice; with a file_pattern that matched
    # none of them, the slice trained nothing and was listed as done.
    from trainer.job.errors import TrainerError

    _slices(tmp_path, "20261127", ["00", "01"])
    (tmp_path / "data" / "20261127" / "01" / "part-0").rename(
        tmp_path / "data" / "20261127" / "01" / "part_0.txt")
    with pytest.raises(TrainerError, match=r"20261127/01: no file matches "
                       r"file_pattern='part-\*', but the slice holds 1 other file\(s\) "
                       r"\(part_0.txt\)"):
        online_loop_calls(tmp_path)
    listed = tmp_path / "out" / "donefile.txt"
    assert not listed.exists() or "20261127\t2" not in listed.read_text()
    (tmp_path / "data" / "20261127" / "01" / "part_0.txt").unlink()
    (tmp_path / "data" / "20261127" / "01" / "_SUCCESS").write_text("")  # a writer's marker
    (tmp_path / "data" / "20261127" / "01" / ".part_0.crc").write_text("")
    with caplog.at_level("WARNING", logger="trainer.loop.online_loop"):
        calls = online_loop_calls(tmp_path)
    assert "20261127/01 is complete (to.hadoop.done) but holds no data file" in caplog.text
    assert ("train", "2") in calls


def test_the_online_loop_refuses_an_output_uri(tmp_path: Path) -> None:
    # The saves go to the servers' local disks: done files on a URI would list
    # folders that do not exist there.
    from trainer.loop.online_loop import OnlineLoop

    with pytest.raises(ValueError, match=r"output must be a local folder, found "
                       r"'file:///srv/out'"):
        OnlineLoop(RecordingFleet(), str(tmp_path), "file:///srv/out", "20261127",
                   make_dataset=list)


@pytest.mark.parametrize(
    ("args", "missed"),
    [
        # 24 hourly folders, passes of 5: the last 4 fill no pass.
        (("1", "{0..23}", 60, 5, True), "the hourly folders 20, 21, 22, 23"),
        # 288 five-minute slices, passes of 7: the last one fills no pass.
        (("1", "{0..23}", 5, 7, False), "the minutes 2355-2359"),
        # Splits of 7 minutes: an hour holds 8, the last 4 minutes are in none.
        (("1", "{0}", 7, 4, False), "the minutes 0056-0059"),
        # Splits of two hours over hourly folders: each reads its first hour only.
        (("1", "{0..3}", 120, 1, True), "the hourly folders 01, 03"),
    ],
)
def test_slices_no_pass_reads_are_named(args, missed, caplog, tmp_path: Path) -> None:
    from trainer.loop.online_loop import OnlineLoop

    with caplog.at_level(logging.WARNING, logger="trainer.loop.online"):
        passes = online_pass_interval(*args)  # Paddle's passes, with a warning
    assert passes and f"no pass of the day reads {missed}" in caplog.text
    with pytest.raises(ValueError, match=f"no pass of the day reads {missed}"):
        online_pass_interval(*args, strict=True)
    # The online loop is fleetfeed's own: it refuses to leave records untrained.
    _, hours, interval, per_pass, hourly = args
    with pytest.raises(ValueError, match=f"reads {missed}, so their records are never"):
        OnlineLoop(RecordingFleet(), str(tmp_path), str(tmp_path / "out"), "20261127",
                   make_dataset=list, hours=hours, split_interval=interval,
                   split_per_pass=per_pass, is_data_hourly_placed=hourly)


def test_passes_that_read_every_slice_say_nothing(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="trainer.loop.online"):
        online_pass_interval("1", "{0..23}", 5, 12, False, strict=True)
        online_pass_interval("1", "{8..11}", 30, 2, True, strict=True)  # a folder a pass
        online_pass_interval("1", "{8..9}", 30, 2, False, strict=True)
    assert caplog.text == ""


def test_an_hourly_folder_that_two_passes_read_is_named(caplog, tmp_path: Path) -> None:
    from trainer.loop.online_loop import OnlineLoop

    # Half-hour splits of hourly folders, a split a pass: each folder in two passes.
    with caplog.at_level(logging.WARNING, logger="trainer.loop.online"):
        assert online_pass_interval("1", "{8..9}", 30, 1, True) == [
            ["08"], ["08"], ["09"], ["09"]]
    assert "more than one pass reads the hourly folders 08, 09" in caplog.text
    with pytest.raises(ValueError, match="trained more than once"):
        OnlineLoop(RecordingFleet(), str(tmp_path), str(tmp_path / "out"), "20261127",
                   make_dataset=list, hours="{8..9}", split_interval=30, split_per_pass=1)
