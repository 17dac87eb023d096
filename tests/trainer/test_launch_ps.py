"""fleetrun with a real parameter-server job (trainer.fleet, RPC, sparse rows):
a server killed mid-training and a worker that raises each stop the whole job
with a non-zero status and a message naming the process, within a minute, and
leave no process behind."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import REPO, wait_for

pytestmark = pytest.mark.distributed
STOP_BOUND_SECONDS = 60  # the bound: "within a minute"

# A training script in Paddle's shape: every role builds the model; servers
# serve, workers train until stopped (or, in "worker_raises", worker 1 raises).
JOB = r'''
import os, sys, time
import torch
from torch import nn
from trainer import fleet
from trainer.nn import SparseEmbedding

out, mode = sys.argv[1], sys.argv[2]

def write_pid(name):  # whole or not at all: the test reads the file once it exists
    path = os.path.join(out, name)
    with open(path + ".partial", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".partial", path)

fleet.init()
torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(SparseEmbedding(4, "emb"), nn.Linear(4, 1))
optimizer = fleet.distributed_optimizer(torch.optim.Adagrad(model.parameters(), lr=0.1))
if fleet.is_server():
    write_pid("server.pid")
    fleet.init_server()
    fleet.run_server()
    sys.exit(0)
fleet.init_worker()
rank = fleet.worker_index()
generator = torch.Generator().manual_seed(rank)
step = 0
while True:
    ids = torch.randint(0, 1000, (64,), generator=generator)
    loss = model(ids).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    step += 1
    if step == 5:
        write_pid(f"worker{rank}.pid")
    # (Once worker 0 is training too, so that the test sees every pid.)
    if mode == "worker_raises" and rank == 1 and step >= 20 and os.path.exists(
        os.path.join(out, "worker0.pid")
    ):
        raise RuntimeError("worker 1 fails on purpose")
    time.sleep(0.01)
'''


@pytest.fixture
def job(tmp_path: Path) -> Path:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    return script


def start_fleetrun(script: Path, tmp_path: Path, mode: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO), FLEETFEED_PS_TIMEOUT="10")
    return subprocess.Popen(
        [sys.executable, "-m", "trainer.job.launch", "--server_num=1", "--worker_num=2",
         str(script), str(tmp_path), mode],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def wait_for_training(
    launcher: subprocess.Popen, tmp_path: Path, timeout: float = 120
) -> list[int]:
    """The pids of the server and both workers, once both workers have trained a few steps."""
    names = ["server.pid", "worker0.pid", "worker1.pid"]

    def logs() -> dict[str, str]:
        return {p.name: p.read_text()[-1500:] for p in (tmp_path / "log").glob("*")}

    def training() -> bool:
        # The files first: a job that trained and then stopped between two
        # looks (a worker that raises) did start.
        exited = launcher.poll() is not None
        if all((tmp_path / n).exists() for n in names):
            return True
        if exited:
            pytest.fail(f"fleetrun exited with status {launcher.poll()} first: {logs()}")
        return False

    wait_for(training, "the job to start training", timeout, interval=0.1, details=logs)
    return [int((tmp_path / n).read_text()) for n in names]


def finish(launcher: subprocess.Popen, timeout: float) -> tuple[int, str]:
    try:
        _, stderr = launcher.communicate(timeout=timeout)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
    return launcher.returncode, stderr


def assert_all_gone(pids: list[int]) -> None:
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def kill_leftovers(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_server_killed_mid_training_stops_the_job(tmp_path, job):
    launcher = start_fleetrun(job, tmp_path, "train")
    pids: list[int] = []
    try:
        pids = wait_for_training(launcher, tmp_path)
        os.kill(pids[0], signal.SIGKILL)
        killed = time.monotonic()
        returncode, stderr = finish(launcher, STOP_BOUND_SECONDS)
        elapsed = time.monotonic() - killed
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
        kill_leftovers(pids)
    assert returncode != 0
    assert re.search(
        rf"fleetrun: server 0 \(pid {pids[0]}\) was killed by SIGKILL before the workers "
        r"finished; stopping the job", stderr,
    ), stderr
    assert elapsed < STOP_BOUND_SECONDS
    assert_all_gone(pids)


@pytest.mark.slow
def test_a_worker_that_raises_stops_the_job(tmp_path, job):
    launcher = start_fleetrun(job, tmp_path, "worker_raises")
    pids: list[int] = []
    try:
        pids = wait_for_training(launcher, tmp_path)
        returncode, stderr = finish(launcher, STOP_BOUND_SECONDS)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
        kill_leftovers(pids)
    # Status 1, Python's for an uncaught exception (not SIGABRT from TensorPipe's
    # threads at interpreter exit: the runtime leaves the RPC group at exit).
    assert returncode == 1
    assert re.search(
        rf"fleetrun: worker 1 \(pid {pids[2]}\) exited with status 1; stopping the job", stderr
    ), stderr
    assert "RuntimeError: worker 1 fails on purpose" in stderr  # its log's tail
    assert_all_gone(pids)  # the server and worker 0 were still running: stopped
