"""The online loop's driver: the order of PaddleRec's online trainer, kept by
the library so that a crash at any moment trains each record once.

The user's script keeps the model and the step: it gives ``OnlineLoop`` a
function that builds a dataset from a file list and one that trains a loaded
dataset as a pass. The driver owns everything around them, in this order:

- **Start.** ``donefile.txt`` (``online.last_saved_model``) is the job's
  commit log. A server starts from its last listed save, or fresh; a worker
  repairs the serving line of the last listed save (a job that died between
  the two done files), and a job with nothing listed saves and lists the
  untrained model as the end of the day before its first (``<day>/0`` and
  ``<day>/base``, PaddleRec's ``save_first_base``): the first delta counts
  from it, and the first day's deltas name a base the serving side has. The day's passes
  are recorded (``online_schedule.json``) with the output's first day, from
  which days are numbered; a restart in the middle of a day with other passes
  is refused by every process before it serves or trains: its pass numbers
  would name other slices. A new day may bring new passes.
- **Each pass** not listed yet, in order: wait for its slices' done files;
  take the dataset preloaded during the previous pass, or load it; start
  preloading the next pass when its slices are complete; ``set_pass(day
  number)``; point the dumps (``dump_fields``) at ``<output>/dump/<day>/<pass>``;
  train; on worker 0 save the delta (``<day>/delta-<pass>``) and then the
  checkpoint (``<day>/<pass>``); barrier; list the checkpoint in
  ``donefile.txt``, then the delta in ``xbox_patch_done.txt``.
- **Each day's end:** worker 0 shrinks the tables once and saves the day's
  model (``<day>/0``) and base (``<day>/base``); barrier; both are listed
  under a new ``xbox_base_key``, which the next day's deltas carry.

A pass that is not listed when a process dies is trained again, whole, from
the last listed save (``fleetrun --max_restarts`` restarts the job; nothing
here saves with ``dataset=``, so fleetrun records no checkpoint of its own).
Saves and dumps appear whole or not at all and are listed only after they are
complete; done files are replaced whole and list a save once.

``fleet`` is the fleet API (the ``trainer.fleet`` module), passed in: this
package never imports it.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..job import restart
from ..job.errors import TrainerError
from . import online

__all__ = ["DAY_END", "OnlineLoop", "PassInfo"]

log = logging.getLogger(__name__)

DAY_END = -1  # donefile.txt's pass number of a day's base


@dataclasses.dataclass(frozen=True)
class PassInfo:
    """One step of the loop: a pass of a day (``pass_id`` >= 1, its slices'
    folders) or the day's end (``pass_id == DAY_END``)."""

    day: str
    # The tables' pass, so that rules count days unseen: 1 for the output's
    # first day, then one more each calendar day (``OnlineLoop._number_days``);
    # 0 for the untrained model, saved as the end of the day before.
    day_number: int
    pass_id: int
    folders: tuple[str, ...] = ()

    def order(self) -> tuple[int, int]:
        return int(self.day), self.pass_id if self.pass_id != DAY_END else 1 << 30


class OnlineLoop:
    """Trains passes over time-sliced folders as they complete (see the module).

    Args:
        fleet: the fleet API (the ``trainer.fleet`` module), initialised, with
            the optimizer distributed.
        data: the folder of the slices, ``<data>/<day>/<slice>/``.
        output: where saves, dumps and done files go.
        first_day: ``YYYYMMDD``; ``days`` consecutive days are trained.
        hours, split_interval, split_per_pass, is_data_hourly_placed: the passes
            of a day, as Paddle's ``FleetUtil.get_online_pass_interval``; they
            must read every slice of the hours (Paddle drops the slices that
            fill no last pass).
        make_dataset: a dataset for this worker's share of a pass's files.
        file_pattern: the files of a slice (a glob in its folder).
        done_file: the file that marks a slice complete.
        dump_fields: model outputs dumped per instance (None: no dumps).
        poll_interval, timeout: the wait for a done file (seconds).
    """

    def __init__(
        self, fleet: Any, data: str, output: str, first_day: str, *,
        make_dataset: Callable[[list[str]], Any], days: int = 1, hours: Any = "{0..23}",
        split_interval: int = 60, split_per_pass: int = 1, is_data_hourly_placed: bool = True,
        file_pattern: str = "part-*", done_file: str = "to.hadoop.done",
        dump_fields: Sequence[str] | None = None, poll_interval: float = 1.0,
        timeout: float | None = None,
    ) -> None:
        from datafeed.source import fs  # pyarrow: not at import trainer

        if days < 1:
            raise ValueError(f"days must be at least 1, got {days}")
        if fs.is_uri(output):
            raise ValueError(
                f"output must be a local folder, found {output!r}: the saves go where "
                "save_persistables writes them, to the disks of the servers (or of this "
                "process), and the done files must list those; mount the store there, or "
                "copy the folder out after each pass"
            )
        self.fleet, self.data, self.output = fleet, data, output
        self.make_dataset, self.file_pattern, self.done_file = make_dataset, file_pattern, done_file
        self.dump_fields = list(dump_fields) if dump_fields else None
        self.poll_interval, self.timeout = poll_interval, timeout
        passes = online.online_pass_interval(
            first_day, hours, split_interval, split_per_pass, is_data_hourly_placed,
            strict=True)
        # What a pass number means: a restart must mean the same (_check_schedule);
        # and since which day the days are numbered (_number_days).
        self.schedule = {
            "passes": passes, "hours": str(hours), "split_interval": int(split_interval),
            "split_per_pass": int(split_per_pass),
            "is_data_hourly_placed": bool(is_data_hourly_placed),
            "first_day": first_day,
        }
        start = datetime.datetime.strptime(first_day, "%Y%m%d")
        self.steps: list[PassInfo] = []
        for number in range(1, days + 1):
            day = (start + datetime.timedelta(days=number - 1)).strftime("%Y%m%d")
            for pass_id, slices in enumerate(passes, 1):
                # Hourly folders repeat in passes of splits under an hour: read once.
                folders = tuple(online.join(online.join(data, day), s)
                                for s in dict.fromkeys(slices))
                self.steps.append(PassInfo(day, number, pass_id, folders))
            self.steps.append(PassInfo(day, number, DAY_END))

    def run(self, train_pass: Callable[[Any, PassInfo], str | None]) -> None:
        """Serves (a server process) or trains every step not listed yet (a
        worker), then ``stop_worker()``.

        Raises:
            TrainerError: fleetrun restarted the job from a checkpoint saved
                with ``dataset=`` (a second commit log beside donefile.txt).

        Args:
            train_pass: trains the loaded dataset of a pass on every worker
                (shuffle it, ``train_from_dataset``, reduce its metrics) and
                returns what worker 0 prints about it, or None.
        """
        fleet = self.fleet
        if restart.resume_dir():
            # fleetrun would start the servers from that save while the workers
            # go on after donefile.txt's last pass: records lost or trained twice.
            raise TrainerError(
                f"the online loop resumes from {online.join(self.output, 'donefile.txt')}, "
                f"but fleetrun restarts this job from {restart.resume_dir()}, a checkpoint "
                "saved with save_persistables(..., dataset=...): do not save with dataset= "
                "in an online job (its passes are its checkpoints)"
            )
        last_day, last_pass, last_path, key = online.last_saved_model(self.output)
        recorded = self._recorded_schedule()
        self._check_schedule(recorded, last_day, last_pass)  # every process refuses
        self._number_days(recorded, saved=last_day != -1)
        if fleet.is_server():
            fleet.init_server(last_path if last_day != -1 else None)
            fleet.run_server()
            return
        fleet.init_worker()
        fleet.worker_group()  # fleet.metrics' group forms now, not after the first pass
        first = fleet.is_first_worker()
        listed = PassInfo(str(last_day), 0, last_pass).order()
        start = self._start()
        if first and recorded != self.schedule:
            # Before anything is listed: a restart numbers the days from it.
            os.makedirs(self.output, exist_ok=True)
            online.write_schedule(self.output, self.schedule)
        if last_day != -1:
            if first:
                print(f"online loop: resuming after day {last_day} pass {last_pass}", flush=True)
            done = next((s for s in (start, *self.steps) if s.order() == listed), None)

            def repair() -> None:
                online.finish_done_files(self.output)  # a crash inside a replacement
                online.write_xbox_donefile(
                    self.output, last_day, last_pass, key,
                    self._inputs(done) if done is not None else self.data,
                    worker_num=fleet.worker_num())

            self._on_worker_0(repair)
        else:
            key = int(time.time())
            self._end_day(start, key)
        todo = [step for step in self.steps if step.order() > listed]
        preloaded = None
        trained_until = None
        for index, step in enumerate(todo):
            if step.pass_id == DAY_END:
                # A base of its own key: the serving side tells bases apart by
                # it, and the next day's deltas name the base they apply to.
                key = online.next_base_key(key)
                self._end_day(step, key)
                continue
            dataset, was_preloaded = self._dataset(step, preloaded)
            following = next((s for s in todo[index + 1:] if s.pass_id != DAY_END), None)
            preloaded = None
            if following is not None and self._complete(following):
                preloaded = self.make_dataset(self._files(following))
                preloaded.preload_into_memory()  # read while this pass trains
            fleet.set_pass(step.day_number)
            if self.dump_fields is not None:
                fleet.current().strategy.trainer_desc_configs = {
                    "dump_fields_path": online.join(
                        online.join(online.join(self.output, "dump"), step.day),
                        str(step.pass_id)),
                    "dump_fields": self.dump_fields,
                }
            started = time.time()  # one clock for the processes of a machine
            said = train_pass(dataset, step)
            # From the first worker's start to the last worker's end.
            ended, first_start = fleet.util.all_reduce([time.time(), -started], "max")
            dataset.release_memory()
            # Every worker's updates on the servers (GEO's steps since its last
            # sync, async's pushes in flight) before the pass's saves.
            fleet.barrier_worker()
            if first:
                gap = "" if trained_until is None else (
                    f", {-first_start - trained_until:.3f} s after the previous pass"
                    f"{' (preloaded)' if was_preloaded else ''}")
                print(f"day {step.day} pass {step.pass_id} ({self._slices(step)}): "
                      f"{said + ', ' if said else ''}trained in {ended + first_start:.3f} s{gap}",
                      flush=True)
                # The delta first: a full save counts every row as saved.
                fleet.save_persistables(self._save_dir(step, f"delta-{step.pass_id}"), mode=1)
                fleet.save_persistables(self._save_dir(step, str(step.pass_id)))
            self._publish(step, key)
            trained_until = ended
        fleet.stop_worker()

    def _recorded_schedule(self) -> dict[str, Any] | None:
        """The output's record of its passes and first day; None: none yet."""
        try:
            return online.read_schedule(self.output)
        except (ValueError, TypeError) as error:
            raise TrainerError(
                f"{online.join(self.output, online.SCHEDULE_FILE)} is not the online "
                f"loop's record of its passes ({error}): restore it, or remove it if the "
                "passes have not changed since the last listed one"
            ) from None

    def _check_schedule(
        self, recorded: dict[str, Any] | None, last_day: int, last_pass: int
    ) -> None:
        """Refuses to finish a day begun with other passes (another
        ``split_interval``, ``split_per_pass``, ``hours``...): the pass after the
        last listed one would not start where it ended, and slices would be
        skipped or trained twice. A day that ended, or one this job does not
        train, may go on with new passes."""
        path = online.join(self.output, online.SCHEDULE_FILE)
        same = recorded is not None and recorded.get("passes") == self.schedule["passes"]
        mid_day = last_day != -1 and last_pass != DAY_END and any(
            step.day == str(last_day) for step in self.steps)
        if recorded is not None and not same and mid_day:
            def settings(schedule: dict) -> str:
                return ", ".join(f"{name}={schedule.get(name)!r}" for name in (
                    "hours", "split_interval", "split_per_pass", "is_data_hourly_placed"))

            raise TrainerError(
                f"the online loop resumes day {last_day} after its pass {last_pass} "
                f"({online.join(self.output, 'donefile.txt')}), whose passes were "
                f"{settings(recorded)} ({len(recorded.get('passes', []))} a day, recorded "
                f"in {path}); this job's settings, {settings(self.schedule)}, give "
                f"other passes ({len(self.schedule['passes'])} a day): its next pass "
                "would not start where the last listed one ended, so slices would be "
                "skipped or trained twice. Relaunch with the recorded settings (a new "
                "schedule may start with the next day), or write to a new output folder"
            )

    def _number_days(self, recorded: dict[str, Any] | None, saved: bool) -> None:
        """Numbers the days from the output's first day, so that a relaunch with
        a later ``first_day`` goes on counting (the tables' pass only goes
        forward, and the days between count as unseen). The first day is the
        one ``recorded``, or for an output trained before the record the first
        day its listed saves trained; an output with nothing ``saved`` starts at this
        job's ``first_day``."""
        origin, source = self.schedule["first_day"], "first_day"
        if saved and (recorded or {}).get("first_day") is not None:
            origin, source = recorded["first_day"], online.join(self.output, online.SCHEDULE_FILE)
        elif saved:
            origin = str(online.first_trained_day(self.output))
            source = online.join(self.output, "donefile.txt") + "'s first line"
        try:
            start = datetime.datetime.strptime(str(origin), "%Y%m%d")
        except ValueError:
            raise TrainerError(
                f"expected the online loop's first day as YYYYMMDD, found {origin!r:.40} "
                f"in {source}: restore it"
            ) from None
        self.schedule["first_day"] = origin
        self.steps = [dataclasses.replace(step, day_number=(
            datetime.datetime.strptime(step.day, "%Y%m%d") - start).days + 1)
            for step in self.steps]

    # -- the steps -------------------------------------------------------------------

    def _dataset(self, step: PassInfo, preloaded: Any) -> tuple[Any, bool]:
        for folder in step.folders:
            online.wait_for_done_file(folder, self.done_file, self.poll_interval, self.timeout)
        if preloaded is not None:
            preloaded.wait_preload_done()
            return preloaded, True
        dataset = self.make_dataset(self._files(step))
        dataset.load_into_memory()
        return dataset, False

    def _start(self) -> PassInfo:
        """The untrained model's step: the end of the day before the first."""
        first = datetime.datetime.strptime(self.schedule["first_day"], "%Y%m%d")
        return PassInfo((first - datetime.timedelta(days=1)).strftime("%Y%m%d"), 0, DAY_END)

    def _end_day(self, step: PassInfo, key: int) -> None:
        if self.fleet.is_first_worker():
            if step.day_number > 0:  # nothing to retire before the first day
                self.fleet.shrink()  # once: each call decays the rows' statistics again
            self.fleet.save_persistables(self._save_dir(step, "0"))
            self.fleet.save_persistables(self._save_dir(step, "base"), mode=0)
        self._publish(step, key)

    def _publish(self, step: PassInfo, key: int) -> None:
        """Lists a step's saves, once every worker is past them: the model in
        donefile.txt (the step is done), then the serving side's line (a
        restart adds it if the job died in between)."""
        self.fleet.barrier_worker()
        self._on_worker_0(lambda: online.write_model_donefile(
            self.output, step.day, step.pass_id, key))
        self._on_worker_0(lambda: online.write_xbox_donefile(
            self.output, step.day, step.pass_id, key, self._inputs(step),
            worker_num=self.fleet.worker_num()))

    def _on_worker_0(self, write: Callable[[], object]) -> None:
        if self.fleet.is_first_worker():
            write()
        self.fleet.barrier_worker()

    # -- files -----------------------------------------------------------------------

    def _files(self, step: PassInfo) -> list[str]:
        from datafeed.source import fs  # pyarrow: not at import trainer

        files = []
        for folder in step.folders:
            matched = fs.list_files(folder, self.file_pattern)
            if not matched:
                self._check_empty(folder)
            files += matched
        return self.fleet.util.get_file_shard(files)

    def _check_empty(self, folder: str) -> None:
        """A complete slice with no file of ``file_pattern``: an error when it
        holds other files (their records would never train, the slice listed
        as done), a warning when it holds none."""
        from datafeed.source import fs

        # Hidden names (_SUCCESS, .crc) are a writer's markers, not data, as
        # Hadoop's input formats take them.
        names = [f.rsplit("/", 1)[-1] for f in fs.list_files(folder)]
        others = [n for n in names if n != self.done_file and not n.startswith(("_", "."))]
        if others:
            listed = ", ".join(others[:3])
            more = ", ..." if len(others) > 3 else ""
            raise TrainerError(
                f"{folder}: no file matches file_pattern={self.file_pattern!r}, but the "
                f"slice holds {len(others)} other file(s) ({listed}{more}); "
                "give OnlineLoop the file_pattern of the data files"
            )
        log.warning("%s is complete (%s) but holds no data file: this slice trains nothing",
                    folder, self.done_file)

    def _complete(self, step: PassInfo) -> bool:
        from datafeed.source import fs

        try:
            return all(fs.exists(online.join(f, self.done_file)) for f in step.folders)
        except OSError:
            return False  # a store that did not answer: load it when its turn comes

    def _inputs(self, step: PassInfo) -> list[str] | str:
        """The data a save was trained on, for the serving side's done file."""
        if step.pass_id != DAY_END:
            return list(step.folders)
        return online.join(self.data, step.day) if step.day_number > 0 else []

    def _save_dir(self, step: PassInfo, name: str) -> str:
        return online.join(online.join(self.output, step.day), name)

    @staticmethod
    def _slices(step: PassInfo) -> str:
        return ",".join(os.path.basename(f.rstrip("/")) for f in step.folders)
