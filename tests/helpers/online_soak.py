"""The online example (examples/online_training) through crashes: slices that
land on a schedule, a ``fleetrun --max_restarts`` job whose processes are
SIGKILLed at random moments, and the checks of its exactly-once promise.

``tests/trainer/test_online_restarts.py`` runs a few slices with two kills,
``benchmarks/soak_online.py`` two days of hourly slices with ten.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import glob
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "online_training"
DONE_FILE = "to.hadoop.done"
PASS_LINE = re.compile(
    r"^day (\d{8}) pass (\d+) \([0-9,]+\): (\d+) records, cluster AUC ([0-9.]+), trained in "
    r"([0-9.]+) s(?:, ([0-9.]+) s after the previous pass( \(preloaded\))?)?$", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The slices of the job: ``days`` days of ``hours`` hourly folders, each of
    ``files`` files of ``lines`` lines, one landing every ``every`` seconds."""

    day: str = "20261127"
    days: int = 1
    hours: int = 4
    lines: int = 1000
    files: int = 2
    every: float = 0.5

    def day_names(self) -> list[str]:
        first = datetime.datetime.strptime(self.day, "%Y%m%d")
        return [(first + datetime.timedelta(days=d)).strftime("%Y%m%d") for d in range(self.days)]

    def slices(self) -> list[tuple[str, str]]:
        return [(day, f"{hour:02}") for day in self.day_names() for hour in range(self.hours)]

    def day_before(self) -> str:
        """The day whose end the untrained model is saved and listed as."""
        first = datetime.datetime.strptime(self.day, "%Y%m%d")
        return (first - datetime.timedelta(days=1)).strftime("%Y%m%d")

    def saves(self) -> list[tuple[int, int]]:
        """donefile.txt's (day, pass) in order: the untrained model as the end
        of the day before, then each day's passes and its base (-1)."""
        return [(int(self.day_before()), -1)] + [
            (int(day), p) for day in self.day_names() for p in [*range(1, self.hours + 1), -1]]

    def job_args(self) -> list[str]:
        return ["--day", self.day, "--days", str(self.days), "--hours",
                f"{{0..{self.hours - 1}}}"]


def env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO))


def make_source(folder: Path, schedule: Schedule, seed: int = 0) -> Path:
    """Every slice of ``schedule``, written at once into ``folder`` (make_slices.py)."""
    subprocess.run(
        [sys.executable, str(EXAMPLE / "make_slices.py"), str(folder), "--day", schedule.day,
         "--days", str(schedule.days), "--hours", str(schedule.hours), "--lines",
         str(schedule.lines), "--files", str(schedule.files), "--every", "0", "--seed",
         str(seed)],
        env=env(), check=True, stdout=subprocess.DEVNULL, timeout=600,
    )
    return folder


class Arrivals(threading.Thread):
    """Lands the source's slices in ``data``, one every ``schedule.every``
    seconds: its files (hard links), then its done file."""

    def __init__(self, source: Path, data: Path, schedule: Schedule) -> None:
        super().__init__(name="slice-arrivals", daemon=True)
        self.source, self.data, self.schedule = source, data, schedule
        self.stopped = threading.Event()

    def run(self) -> None:
        for number, (day, hour) in enumerate(self.schedule.slices()):
            if number and self.stopped.wait(self.schedule.every):
                return
            folder = self.data / day / hour
            folder.mkdir(parents=True, exist_ok=True)
            for part in sorted((self.source / day / hour).glob("part-*.txt")):
                os.link(part, folder / part.name)
            (folder / DONE_FILE).touch()


@dataclasses.dataclass
class Kill:
    at: float  # seconds since the job started
    attempt: int  # fleetrun's attempt the victim belonged to
    victim: str
    listed: str  # donefile.txt's last (day, pass) at that moment


@dataclasses.dataclass
class Job:
    workdir: Path
    returncode: int
    seconds: float
    kills: list[Kill]
    restarts: int
    stderr: str

    @property
    def out(self) -> Path:
        return self.workdir / "out"

    def worker_log(self) -> str:
        return (self.workdir / "log" / "workerlog.0").read_text(errors="replace")


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = collections.defaultdict(list)
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as file:
                fields = file.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        tree[int(fields[1])].append(int(stat.split("/")[2]))
    return tree


def _role(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as file:
            variables = dict(v.split(b"=", 1) for v in file.read().split(b"\0") if b"=" in v)
    except OSError:
        return None
    role = variables.get(b"TRAINING_ROLE")
    if role == b"PSERVER":
        return "server 0"
    if role == b"TRAINER":
        return f"worker {variables.get(b'PADDLE_TRAINER_ID', b'?').decode()}"
    return None


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            words = file.read().split(b"\0")
    except OSError:
        return "?"
    if any(w.endswith(b"dumps.py") for w in words):
        return "its dump writer"
    return os.path.basename(words[0].decode(errors="replace")) or "?"


def job_processes(launcher: int) -> list[tuple[int, str]]:
    """The processes fleetrun ``launcher`` started and their children, named."""
    tree = _children()
    found = []
    for pid in tree.get(launcher, []):
        role = _role(pid)
        if role is None:
            continue
        found.append((pid, role))
        stack = list(tree.get(pid, []))
        while stack:
            child = stack.pop()
            found.append((child, f"{_command(child)} of {role}"))
            stack += tree.get(child, [])
    return [(pid, name) for pid, name in found if not _exiting(pid)]


def _exiting(pid: int) -> bool:
    """Whether ``pid`` is gone or a zombie: a kill would do nothing."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def _restarts(stderr: Path) -> int:
    return len(re.findall(r"^fleetrun: restart \d+ of", stderr.read_text(), re.MULTILINE))


def _last_listed(out: Path) -> str:
    try:
        lines = (out / "donefile.txt").read_text().splitlines()
    except OSError:
        return "none"
    fields = lines[-1].split("\t") if lines else []
    return f"day {fields[0]} pass {fields[3]}" if fields else "none"


def run_job(workdir: Path, source: Path, schedule: Schedule, mode: str, kills: int,
            seed: int, wait: tuple[float, float] = (1.0, 12.0), timeout: float = 1800,
            progress: Any = None) -> Job:
    """Runs the example (1 server, 2 workers) in ``workdir`` while the slices
    land, SIGKILLing ``kills`` processes: after each attempt has started its
    workers, a wait drawn from ``wait`` seconds, then a process drawn from the
    job's (the server and workers 3 times in 4, else any of their children)."""
    workdir.mkdir(parents=True)
    arrivals = Arrivals(source, workdir / "data", schedule)
    command = [sys.executable, "-m", "trainer.job.launch", "--server_num=1", "--worker_num=2",
               f"--max_restarts={kills + 2}", str(EXAMPLE / "train.py"), "--data", "data",
               "--out", "out", "--mode", mode, "--timeout", "600", *schedule.job_args()]
    rng = random.Random(seed)
    done: list[Kill] = []
    stderr_path = workdir / "fleetrun.err"
    started = time.monotonic()
    with open(stderr_path, "wb") as stderr:
        launcher = subprocess.Popen(command, cwd=workdir, env=env(), stdout=subprocess.DEVNULL,
                                    stderr=stderr, start_new_session=True)
        arrivals.start()
        try:
            while len(done) < kills and launcher.poll() is None:
                workers = [p for p, r in job_processes(launcher.pid) if r.startswith("worker")]
                if len(workers) < 2:
                    time.sleep(0.05)
                    continue
                deadline = time.monotonic() + rng.uniform(*wait)
                while time.monotonic() < deadline and launcher.poll() is None:
                    time.sleep(0.02)
                processes = job_processes(launcher.pid)
                roles = [(p, r) for p, r in processes if " of " not in r]
                others = [(p, r) for p, r in processes if " of " in r]
                if not roles or launcher.poll() is not None:
                    continue
                pid, victim = rng.choice(others if others and rng.random() < 0.25 else roles)
                attempt = _restarts(stderr_path)
                listed = _last_listed(workdir / "out")
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                done.append(Kill(round(time.monotonic() - started, 2), attempt, victim, listed))
                if progress:
                    progress(f"kill {len(done)}: {victim} at {done[-1].at} s ({listed} listed)")
                # The next kill is in the next attempt (a child that had ended its
                # work may be killed without ending the attempt: then in this one).
                settle = time.monotonic() + 30
                while (_restarts(stderr_path) == attempt and launcher.poll() is None
                       and time.monotonic() < settle):
                    time.sleep(0.05)
            launcher.wait(timeout=max(1.0, timeout - (time.monotonic() - started)))
        finally:
            arrivals.stopped.set()
            if launcher.poll() is None:
                os.killpg(launcher.pid, signal.SIGTERM)
                launcher.wait(timeout=30)
            arrivals.join(timeout=30)
    text = stderr_path.read_text(errors="replace")
    return Job(workdir, launcher.returncode, time.monotonic() - started, done,
               _restarts(stderr_path), text)


# -- the checks ----------------------------------------------------------------------


def _ids_of(files: list[str]) -> collections.Counter:
    ids: collections.Counter = collections.Counter()
    for name in files:
        with open(name) as file:
            ids.update(line.split("\t", 1)[0] if "\t" in line else line.split(" ", 2)[1]
                       for line in file)
    return ids


def check(job: Job, source: Path, schedule: Schedule) -> list[str]:
    """What breaks the promise: each pass trained once (its dumps hold each of
    its slice's records once), saved and listed once, in order; [] when kept."""
    problems = []
    out = job.out
    listed = [(int(f[0]), int(f[3])) for f in
              (line.split("\t") for line in (out / "donefile.txt").read_text().splitlines())]
    if listed != schedule.saves():
        problems.append(f"donefile.txt lists {listed}, expected {schedule.saves()}")
    patches = [json.loads(line)["input"] for line in
               (out / "xbox_patch_done.txt").read_text().splitlines()]
    # The job's --out is "out", relative to its folder, as the done files write it.
    wanted = [f"out/{day}/delta-{p}/000" for day, p in schedule.saves() if p != -1]
    if patches != wanted:
        differs = [(a, b) for a, b in zip(patches, wanted, strict=False) if a != b]
        problems.append(f"xbox_patch_done.txt lists {len(patches)} deltas, expected "
                        f"{len(wanted)} in order; first difference: {differs[:1]}")
    bases = [json.loads(line)["input"] for line in
             (out / "xbox_base_done.txt").read_text().splitlines()]
    if bases != [f"out/{day}/base/000" for day in [schedule.day_before(), *schedule.day_names()]]:
        problems.append(f"xbox_base_done.txt lists {bases}")
    problems += _key_problems(out)
    for day, p in schedule.saves():
        names = ["0", "base"] if p == -1 else [str(p), f"delta-{p}"]
        problems += [f"{day}/{n} has no meta.json" for n in names
                     if not (out / str(day) / n / "meta.json").is_file()]
    for number, (day, hour) in enumerate(schedule.slices()):
        pass_id = number % schedule.hours + 1
        dumped = _ids_of(sorted(glob.glob(str(out / "dump" / day / str(pass_id) / "part-*"))))
        expected = _ids_of(sorted(glob.glob(str(source / day / hour / "part-*.txt"))))
        if dumped != expected:
            twice = sum(1 for n in dumped.values() if n > 1)
            problems.append(f"day {day} pass {pass_id}: dumps hold {sum(dumped.values())} "
                            f"lines for {sum(expected.values())} records ({twice} twice, "
                            f"{len(expected - dumped)} missing)")
    return problems


def _key_problems(out: Path) -> list[str]:
    """Each base under a key above the last, each pass under the key of the
    base before it, and the serving lines under the keys of donefile.txt."""
    problems = []
    listed = [line.split("\t") for line in (out / "donefile.txt").read_text().splitlines()]
    current = 0  # the first line is the untrained model's base
    for day, key, _, pass_id, *_ in listed:
        if int(pass_id) == -1 and int(key) <= current:
            problems.append(f"the base of day {day} has key {key}, not above {current}")
        elif int(pass_id) != -1 and int(key) != current:
            problems.append(f"day {day} pass {pass_id} has key {key}, not its base's {current}")
        current = int(key)
    served = [json.loads(line)["key"] for name in ("xbox_base_done.txt", "xbox_patch_done.txt")
              for line in (out / name).read_text().splitlines()]
    donefile_keys = sorted(key for _, key, *_ in listed)
    if sorted(served) != donefile_keys:
        problems.append(f"the serving lines' keys {sorted(served)} are not donefile.txt's "
                        f"{donefile_keys}")
    return problems


def dumped_auc(out: Path, day: str, pass_id: int, buckets: int = 4096) -> float:
    """The AUC of a pass's dumped predictions (every worker's), with scores
    rounded down to ``buckets`` buckets as StreamingAUC does (ties count half)."""
    labels, scores = [], []
    for name in glob.glob(str(out / "dump" / day / str(pass_id) / "part-*")):
        with open(name) as file:
            for line in file:
                fields = dict(f.split(":", 1) for f in line.rstrip("\n").split("\t")[2:])
                scores.append(float(fields["prob"].split(":")[1]))
                labels.append(int(fields["label"].split(":")[1]))
    bucket = np.floor(np.clip(np.array(scores) * (buckets - 1), 0, buckets - 1)).astype(int)
    positive = np.array(labels) == 1
    pos = np.bincount(bucket[positive], minlength=buckets).astype(np.float64)
    neg = np.bincount(bucket[~positive], minlength=buckets).astype(np.float64)
    below = np.cumsum(neg) - neg
    return float(((pos * below).sum() + 0.5 * (pos * neg).sum()) / (pos.sum() * neg.sum()))


def pass_lines(job: Job) -> dict[tuple[str, int], dict[str, Any]]:
    """Each pass's report by the first worker, the last attempt's where several."""
    passes = {}
    for m in PASS_LINE.finditer(job.worker_log()):
        passes[(m[1], int(m[2]))] = {
            "records": int(m[3]), "auc": float(m[4]), "trained": float(m[5]),
            "gap": float(m[6]) if m[6] else None, "preloaded": bool(m[7]),
        }
    return passes


def tables(dirname: Path) -> dict[str, dict[str, np.ndarray]]:
    """A checkpoint's sparse tables (by id) and dense parameters, as numpy."""
    sys.path.insert(0, str(REPO))
    from trainer.ps.checkpoint import directory
    from trainer.ps.checkpoint.table_files import read_table

    found = {}
    for name in directory.read_meta(str(dirname))["tables"]:
        chunks = list(read_table(str(dirname), name))
        columns = {key: np.concatenate([c[key] for c in chunks])
                   for key in chunks[0] if np.ndim(chunks[0][key])}
        order = np.argsort(columns["ids"])
        found[name] = {key: value[order] for key, value in columns.items()}
    found["dense"] = {str(i): t.numpy() for i, t in directory.dense_values(str(dirname)).items()}
    return found


def table_difference(a: Path, b: Path) -> float:
    """The largest difference between two checkpoints' values (inf: other rows)."""
    first, second = tables(a), tables(b)
    if first.keys() != second.keys():
        return float("inf")
    worst = 0.0
    for name, columns in first.items():
        other = second[name]
        if columns.keys() != other.keys() or (
                "ids" in columns and not np.array_equal(columns["ids"], other["ids"])):
            return float("inf")
        for key, value in columns.items():
            if value.shape != other[key].shape:
                return float("inf")
            if value.size:
                diff = np.abs(value.astype(np.float64) - other[key].astype(np.float64)).max()
                worst = max(worst, float(diff))
    return worst
