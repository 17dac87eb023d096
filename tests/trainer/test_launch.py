"""fleetrun: real processes, real ports, every child stopped on every path."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import REPO, reserved_ports, wait_for

# A stand-in for a training script: servers listen on their port until stopped,
# workers record their environment and then do what argv[2] says.
DUMMY = r'''
import json, os, socket, sys, time
out, mode = sys.argv[1], sys.argv[2]
role = os.environ["TRAINING_ROLE"]

def write(name, text):  # whole or not at all: the test reads a file once it exists
    path = os.path.join(out, name)
    with open(path + ".partial", "w") as f:
        f.write(text)
    os.replace(path + ".partial", path)

def wait_for(condition, what):  # the other processes' progress, not a fixed sleep
    deadline = time.monotonic() + 30
    while not condition():
        if time.monotonic() > deadline:
            sys.exit(f"{role}: waited 30s for {what}")
        time.sleep(0.02)

def exists(name):
    return lambda: os.path.exists(os.path.join(out, name))

def exited(pid):  # gone, or a zombie that fleetrun has yet to reap
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True

if role == "PSERVER":
    index = os.environ["PADDLE_PSERVERS_IP_PORT_LIST"].split(",").index(
        os.environ["POD_IP"] + ":" + os.environ["PADDLE_PORT"])
    write(f"server{index}.pid", str(os.getpid()))
    if mode == "noserve":
        time.sleep(60)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((os.environ["POD_IP"], int(os.environ["PADDLE_PORT"])))
    sock.listen(16)
    print("server listening", flush=True)
    if mode in ("server_done", "server_dies"):
        wait_for(exists("worker0.json"), "worker 0 to start")  # the job is running
    if mode == "server_done":
        sys.exit(0)
    if mode == "server_dies":
        print("server giving up", flush=True)
        sys.exit(5)
    time.sleep(60)
else:
    rank = os.environ["PADDLE_TRAINER_ID"]
    keys = ["TRAINING_ROLE", "PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM", "POD_IP", "PADDLE_PORT",
            "PADDLE_PSERVERS_IP_PORT_LIST", "PADDLE_TRAINER_ENDPOINTS", "FLEETFEED_JOB_KEY",
            "OMP_NUM_THREADS"]
    write(f"worker{rank}.json", json.dumps({**{k: os.environ.get(k) for k in keys},
                                            "pid": os.getpid()}))
    if mode == "fail" and rank == "1":
        wait_for(exists("worker0.json"), "worker 0 to start")  # every pid file is written
        print("worker 1 is failing on purpose", flush=True)
        sys.exit(3)
    if mode in ("fail", "hang", "server_dies"):
        time.sleep(60)
    if mode == "server_done":
        with open(os.path.join(out, "server0.pid")) as f:
            server = int(f.read())
        wait_for(lambda: exited(server), "the server to exit")
    print(f"worker {rank} done", flush=True)
'''


@pytest.fixture
def dummy(tmp_path: Path) -> Path:
    script = tmp_path / "dummy.py"
    script.write_text(DUMMY)
    return script


def fleetrun(
    *args: str, cwd: Path, timeout: float = 30, env: dict | None = None
) -> subprocess.CompletedProcess:
    env = dict(env if env is not None else os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "trainer.job.launch", *args], cwd=cwd, env=env,
        capture_output=True, text=True, timeout=timeout, check=False,
    )


def pids(directory: Path) -> list[int]:
    found = [int(p.read_text()) for p in directory.glob("server*.pid")]
    found += [json.loads(p.read_text())["pid"] for p in directory.glob("worker*.json")]
    return found


def assert_all_gone(directory: Path) -> None:
    for pid in pids(directory):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.distributed
def test_ps_job_sets_paddles_environment_and_stops_the_servers(tmp_path, dummy):
    without_omp = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    result = fleetrun("--server_num=1", "--worker_num=2", str(dummy), str(tmp_path), "ok",
                      cwd=tmp_path, env=without_omp)
    assert result.returncode == 0, result.stderr
    assert "all workers exited, stopping the servers" in result.stdout
    envs = [json.loads((tmp_path / f"worker{i}.json").read_text()) for i in range(2)]
    servers = envs[0]["PADDLE_PSERVERS_IP_PORT_LIST"]
    assert re.fullmatch(r"127\.0\.0\.1:\d+", servers)
    worker_endpoints = envs[0]["PADDLE_TRAINER_ENDPOINTS"].split(",")
    assert len(worker_endpoints) == 2
    for index, env in enumerate(envs):
        assert env["TRAINING_ROLE"] == "TRAINER"
        assert env["PADDLE_TRAINER_ID"] == str(index)
        assert env["PADDLE_TRAINERS_NUM"] == "2"
        assert env["PADDLE_PSERVERS_IP_PORT_LIST"] == servers
        assert f"{env['POD_IP']}:{env['PADDLE_PORT']}" == worker_endpoints[index]
        assert re.fullmatch(r"[0-9a-f]{64}", env["FLEETFEED_JOB_KEY"])
        assert env["OMP_NUM_THREADS"] == "1"  # the processes share the cores
    assert envs[0]["FLEETFEED_JOB_KEY"] == envs[1]["FLEETFEED_JOB_KEY"]
    log = tmp_path / "log"
    assert (log / "serverlog.0").read_text() == "server listening\n"
    assert (log / "workerlog.0").read_text() == "worker 0 done\n"
    assert (log / "workerlog.1").read_text() == "worker 1 done\n"
    assert_all_gone(tmp_path)


def test_a_log_dir_other_users_may_write_into_is_refused_and_logs_follow_no_link(
    tmp_path, dummy
):
    # In a shared folder another user could put a link where a log goes (the
    # log then overwrote the file it named) or the restart record that names
    # the checkpoint a restart loads.
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    result = fleetrun("--server_num=1", "--worker_num=1", "--log_dir", str(shared), str(dummy),
                      str(tmp_path), "ok", cwd=tmp_path)
    assert result.returncode != 0
    assert f"--log_dir {shared} is owned by uid {os.geteuid()} with mode 0777; expected a " \
        "folder of this user" in result.stderr
    assert list(shared.iterdir()) == []  # nothing started
    private = tmp_path / "private"
    private.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (private / "serverlog.0").symlink_to(victim)
    result = fleetrun("--server_num=1", "--worker_num=1", "--log_dir", str(private), str(dummy),
                      str(tmp_path), "ok", cwd=tmp_path)
    assert result.returncode != 0
    assert f"cannot write server 0's log {private}/serverlog.0: Too many levels of symbolic " \
        "links (a symbolic link there is not followed)" in result.stderr
    assert victim.read_text() == "keep me"


@pytest.mark.distributed
def test_explicit_endpoints_and_a_second_job_secret(tmp_path, dummy):
    with reserved_ports(1) as (port,):  # the dummy server listens on it
        result = fleetrun(f"--servers=127.0.0.1:{port}", "--workers=127.0.0.1", "--log_dir=logs",
                          str(dummy), str(tmp_path), "ok", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    env = json.loads((tmp_path / "worker0.json").read_text())
    assert env["PADDLE_PSERVERS_IP_PORT_LIST"] == f"127.0.0.1:{port}"
    assert env["PADDLE_TRAINERS_NUM"] == "1"
    assert (tmp_path / "logs" / "workerlog.0").exists()


@pytest.mark.distributed
def test_a_users_omp_num_threads_is_kept(tmp_path, dummy):
    result = fleetrun("--server_num=1", "--worker_num=1", str(dummy), str(tmp_path), "ok",
                      cwd=tmp_path, env=dict(os.environ, OMP_NUM_THREADS="3"))
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "worker0.json").read_text())["OMP_NUM_THREADS"] == "3"


@pytest.mark.distributed
def test_a_failing_worker_stops_the_job_and_shows_its_log(tmp_path, dummy):
    started = time.monotonic()
    result = fleetrun("--server_num=1", "--trainer_num=2", str(dummy), str(tmp_path), "fail",
                      cwd=tmp_path)
    assert time.monotonic() - started < 15
    assert result.returncode == 3
    assert re.search(
        r"fleetrun: worker 1 \(pid \d+\) exited with status 3; stopping the job", result.stderr
    )
    assert "worker 1 is failing on purpose" in result.stderr  # the log tail
    assert len(pids(tmp_path)) == 3
    assert_all_gone(tmp_path)


@pytest.mark.distributed
def test_a_server_that_dies_stops_the_job(tmp_path, dummy):
    result = fleetrun("--server_num=1", "--worker_num=1", str(dummy), str(tmp_path), "server_dies",
                      cwd=tmp_path)
    assert result.returncode == 5
    assert re.search(
        r"server 0 \(pid \d+\) exited with status 5 before the workers finished", result.stderr
    )
    assert "server giving up" in result.stderr
    assert_all_gone(tmp_path)


@pytest.mark.distributed
def test_a_server_that_exits_0_is_not_a_failure(tmp_path, dummy):
    # run_server() returns once every worker called stop_worker(): the server may
    # exit before the workers do.
    result = fleetrun("--server_num=1", "--worker_num=2", str(dummy), str(tmp_path), "server_done",
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "log" / "workerlog.1").read_text() == "worker 1 done\n"
    assert_all_gone(tmp_path)


@pytest.mark.distributed
def test_a_server_that_never_listens_times_out(tmp_path, dummy):
    result = fleetrun("--server_num=1", "--worker_num=1", "--start_timeout=1", str(dummy),
                      str(tmp_path), "noserve", cwd=tmp_path)
    assert result.returncode == 1
    assert re.search(
        r"server 0 \(pid \d+\) did not listen on 127\.0\.0\.1:\d+ within 1s", result.stderr
    )
    assert not list(tmp_path.glob("worker*.json"))  # no worker was started
    assert_all_gone(tmp_path)


@pytest.mark.distributed
def test_ctrl_c_stops_every_process(tmp_path, dummy):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    launcher = subprocess.Popen(
        [sys.executable, "-m", "trainer.job.launch", "--server_num=2", "--worker_num=2",
         str(dummy), str(tmp_path), "hang"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_for(lambda: len(list(tmp_path.glob("worker*.json"))) == 2, "2 workers", timeout=20)
        assert len(pids(tmp_path)) == 4
        launcher.send_signal(signal.SIGINT)
        _, err = launcher.communicate(timeout=20)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
    assert launcher.returncode == 128 + signal.SIGINT
    assert "fleetrun: SIGINT, stopped every process" in err
    assert_all_gone(tmp_path)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--server_num=2", "--servers=127.0.0.1:6001"],
         r"--server_num=2 and --servers \(1 endpoints\) do not match"),
        (["--worker_num=2"], "a parameter-server job needs --server_num or --servers"),
        (["--server_num=1"], "a parameter-server job needs --worker_num or --workers"),
        (["--servers=127.0.0.1:x", "--worker_num=1"],
         r"--servers must be 'ip:port' entries .*found '127.0.0.1:x'"),
        ([], "give --server_num/--worker_num .* or --nproc_per_node"),
        (["--server_num=1", "--worker_num=1", "--nproc_per_node=2"], "not both"),
        (["--servers=10.99.1.1:6001", "--workers=10.99.1.1:6002"],
         r"none of the endpoints 10\.99\.1\.1:6001,10\.99\.1\.1:6002 is on this machine "
         r"\(its addresses: .*127\.0\.0\.1.*\): give this host's with --host"),
        (["--host=127.0.0.9", "--servers=127.0.0.2:6001", "--workers=127.0.0.3:6002"],
         r"--host 127\.0\.0\.9: none of the endpoints 127\.0\.0\.2:6001,127\.0\.0\.3:6002 "
         "is on it"),
        (["--servers=127.0.0.1:6001", "--workers=10.99.1.1"],
         r"--workers: '10\.99\.1\.1' is not on this machine: give its port"),
    ],
)
def test_argument_errors(tmp_path, args, message):
    result = fleetrun(*args, "train.py", cwd=tmp_path)
    assert result.returncode == 2
    assert re.search(message, result.stderr), result.stderr


@pytest.mark.slow
@pytest.mark.distributed
def test_collective_mode_runs_torchrun_and_fails_when_a_rank_fails(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(
        "import os, sys\n"
        # One write per line: the two ranks share torchrun's stdout, and print()
        # of several arguments (unbuffered) may interleave with the other rank's.
        "line = f\"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} "
        "{os.environ['MASTER_ADDR']}\\n\"\n"
        "os.write(1, line.encode())\n"
        "sys.exit(int(sys.argv[1]) if os.environ['RANK'] == '1' else 0)\n"
    )
    ok = fleetrun("--nproc_per_node=2", str(script), "0", cwd=tmp_path, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert "rank 0 of 2 127.0.0.1" in ok.stdout and "rank 1 of 2 127.0.0.1" in ok.stdout
    failed = fleetrun("--nproc_per_node=2", str(script), "7", cwd=tmp_path, timeout=60)
    assert failed.returncode != 0
    assert "exitcode  : 7" in failed.stderr  # torchrun's failure summary names the rank


@pytest.mark.distributed
def test_ctrl_c_stops_a_collective_job(tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text(  # the pid file appears whole (renamed into place)
        "import os, sys, time\n"
        "path = os.path.join(sys.argv[1], f\"rank{os.environ['RANK']}.pid\")\n"
        "open(path + '.partial', 'w').write(str(os.getpid()))\n"
        "os.replace(path + '.partial', path)\n"
        "time.sleep(60)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    launcher = subprocess.Popen(
        [sys.executable, "-m", "trainer.job.launch", "--nproc_per_node=2", str(script),
         str(tmp_path)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_for(lambda: len(list(tmp_path.glob("rank*.pid"))) == 2, "2 rank pid files", timeout=30)
        ranks = [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]
        assert len(ranks) == 2
        launcher.send_signal(signal.SIGINT)
        _, err = launcher.communicate(timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
    assert launcher.returncode == 128 + signal.SIGINT, err
    assert "fleetrun: SIGINT, stopped every process" in err
    for pid in ranks:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


# A job whose workers are loading through a pipe command that never ends: the
# sleep's duration (argv[2]) is unique, so that its processes are found in /proc.
LOADING_JOB = r'''
import os, socket, sys, threading, time
out, marker, where = sys.argv[1], sys.argv[2], sys.argv[3]
if os.environ["TRAINING_ROLE"] == "PSERVER":
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((os.environ["POD_IP"], int(os.environ["PADDLE_PORT"])))
    sock.listen(16)
    time.sleep(60)
else:
    sys.path.insert(0, os.path.join(os.environ["PYTHONPATH"], "tests", "helpers"))
    from support import SMALL_SCHEMA, small_line
    from datafeed import InMemoryDataset
    path = os.path.join(out, f"part-{os.environ['PADDLE_TRAINER_ID']}.txt")
    with open(path, "w") as f:
        f.write(small_line(0))
    dataset = InMemoryDataset()
    dataset.init(use_var=SMALL_SCHEMA, pipe_command=f"cat; sleep {marker}")
    dataset.set_filelist([path])
    if where == "thread":  # as a QueueDataset's producer: no SIGTERM handler of its own
        threading.Thread(target=dataset.load_into_memory, daemon=True).start()
        time.sleep(60)
    else:
        dataset.load_into_memory()
'''


def sleeping(marker: str) -> list[int]:
    """Live ``sleep <marker>`` processes."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                if cmdline.read() != f"sleep\0{marker}\0".encode():
                    continue
            with open(f"/proc/{entry}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(entry))
        except OSError:
            continue
    return found


@pytest.mark.distributed
@pytest.mark.parametrize("where", ["main", "thread"])
def test_ctrl_c_stops_the_workers_pipe_commands_too(tmp_path, where):
    script = tmp_path / "loading.py"
    script.write_text(LOADING_JOB)
    marker = f"1000.{os.getpid()}{time.monotonic_ns() % 10**9}"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    launcher = subprocess.Popen(
        [sys.executable, "-m", "trainer.job.launch", "--server_num=1", "--worker_num=2",
         str(script), str(tmp_path), marker, where],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_for(lambda: len(sleeping(marker)) == 2, "both workers' pipe commands", timeout=30,
                 details=lambda: launcher.poll())
        launcher.send_signal(signal.SIGINT)
        _, err = launcher.communicate(timeout=30)
        assert launcher.returncode == 128 + signal.SIGINT, err
        assert "fleetrun: SIGINT, stopped every process" in err
        assert sleeping(marker) == []
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
        for pid in sleeping(marker):  # a failed test leaves nothing running either
            os.kill(pid, signal.SIGKILL)


def test_a_collective_job_across_hosts_needs_the_master_port(tmp_path):
    result = fleetrun("--nproc_per_node=1", "--nnodes=2", "--master_addr=10.99.1.1",
                      "train.py", cwd=tmp_path)
    assert result.returncode == 1
    assert "--nnodes=2 needs --master_port, the same on every host" in result.stderr


def start_host(
    host: str, servers: str, workers: str, dummy: Path, out: Path, mode: str,
    env: dict | None = None,
) -> subprocess.Popen:
    """One "host"'s fleetrun (--host, or POD_IP when ``env`` sets it)."""
    env = dict(env if env is not None else os.environ, PYTHONPATH=str(REPO))
    chosen = [] if "POD_IP" in env else [f"--host={host}"]
    return subprocess.Popen(
        [sys.executable, "-m", "trainer.job.launch", *chosen, f"--servers={servers}",
         f"--workers={workers}", f"--log_dir=log_{host}", str(dummy), str(out), mode],
        cwd=out, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def finished(launcher: subprocess.Popen, timeout: float = 30) -> tuple[int, str]:
    try:
        _, stderr = launcher.communicate(timeout=timeout)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
    return launcher.returncode, stderr


@pytest.mark.distributed
def test_each_hosts_fleetrun_starts_only_its_own_endpoints(tmp_path, dummy):
    # Two "hosts" on loopback aliases: one picked by --host, one by POD_IP.
    with reserved_ports(2, "127.0.0.2") as (server_a, worker_a), \
            reserved_ports(2, "127.0.0.3") as (server_b, worker_b):
        servers = f"127.0.0.2:{server_a},127.0.0.3:{server_b}"
        workers = f"127.0.0.2:{worker_a},127.0.0.3:{worker_b}"
        host_b_env = dict(os.environ, POD_IP="127.0.0.3")
        launchers = [
            start_host("127.0.0.2", servers, workers, dummy, tmp_path, "ok"),
            start_host("127.0.0.3", servers, workers, dummy, tmp_path, "ok", env=host_b_env),
        ]
        results = [finished(launcher) for launcher in launchers]
    assert [status for status, _ in results] == [0, 0], results
    assert sorted(p.name for p in (tmp_path / "log_127.0.0.2").iterdir()) == [
        "serverlog.0", "workerlog.0"]
    assert sorted(p.name for p in (tmp_path / "log_127.0.0.3").iterdir()) == [
        "serverlog.1", "workerlog.1"]
    for index, (address, port) in enumerate([("127.0.0.2", worker_a), ("127.0.0.3", worker_b)]):
        env = json.loads((tmp_path / f"worker{index}.json").read_text())
        assert env["PADDLE_TRAINER_ID"] == str(index)
        assert (env["POD_IP"], env["PADDLE_PORT"]) == (address, str(port))
        assert env["PADDLE_PSERVERS_IP_PORT_LIST"] == servers
        assert env["PADDLE_TRAINER_ENDPOINTS"] == workers
        assert env["PADDLE_TRAINERS_NUM"] == "2"
    assert (tmp_path / "server1.pid").exists()
    assert_all_gone(tmp_path)


@pytest.mark.distributed
def test_a_host_with_servers_only_ends_when_its_servers_do(tmp_path, dummy):
    # run_server() returns once every worker stopped: on a host without
    # workers, the servers' exit 0 ends that host's part of the job.
    with reserved_ports(1, "127.0.0.2") as (server,), reserved_ports(1, "127.0.0.3") as (worker,):
        servers, workers = f"127.0.0.2:{server}", f"127.0.0.3:{worker}"
        servers_host = start_host("127.0.0.2", servers, workers, dummy, tmp_path, "server_done")
        try:
            wait_for(lambda: (tmp_path / "server0.pid").exists(), "server 0 to start", 30)
        finally:
            if not (tmp_path / "server0.pid").exists():
                finished(servers_host, 0.1)
        workers_host = start_host("127.0.0.3", servers, workers, dummy, tmp_path, "server_done")
        results = [finished(servers_host), finished(workers_host)]
    assert [status for status, _ in results] == [0, 0], results
    assert not (tmp_path / "log_127.0.0.2" / "workerlog.0").exists()
    assert (tmp_path / "log_127.0.0.3" / "workerlog.0").read_text() == "worker 0 done\n"
    assert_all_gone(tmp_path)


def test_fleetrun_and_import_trainer_stay_light():
    """fleetrun starts every process of a job: importing it (and ``trainer``) loads
    neither torch nor the data engine's pyarrow, which the roles load themselves."""
    program = (
        "import sys, trainer, trainer.job.launch\n"
        "print(sorted(m for m in ('torch', 'pyarrow', 'datafeed') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), check=True, timeout=60)
    assert done.stdout.strip() == "[]"


def test_import_generators_stays_light():
    """PaddleRec's reader.py reaches the generator classes through ``fleet``:
    ``generators`` (which ``fleet.MultiSlotDataGenerator`` loads) loads neither
    torch nor pyarrow."""
    program = (
        "import sys, generators\n"
        "heavy = ('torch', 'pyarrow', 'datafeed', 'trainer')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), check=True, timeout=60)
    assert done.stdout.strip() == "[]"


# A rank of a collective job: what it was given, one file per rank.
RANK_ENV = r'''
import json, os, sys
keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES", "TRAINING_ROLE",
        "PADDLE_PSERVERS_IP_PORT_LIST"]
path = os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json")
with open(path + ".partial", "w") as f:
    json.dump({k: os.environ.get(k) for k in keys}, f)
os.replace(path + ".partial", path)
'''


@pytest.mark.distributed
def test_gpus_gives_each_rank_only_its_own_gpu(tmp_path):
    # Paddle's `fleetrun --gpus=0,1 train.py`: one rank per GPU, each seeing its
    # GPU alone as cuda:0. A stale parameter-server environment is dropped.
    script = tmp_path / "rank_env.py"
    script.write_text(RANK_ENV)
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update(TRAINING_ROLE="TRAINER", PADDLE_PSERVERS_IP_PORT_LIST="127.0.0.1:6001")
    result = fleetrun("--gpus=3,5", str(script), str(tmp_path), cwd=tmp_path, env=env, timeout=90)
    assert result.returncode == 0, result.stderr
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks == [
        {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "3",
         "TRAINING_ROLE": None, "PADDLE_PSERVERS_IP_PORT_LIST": None},
        {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "5",
         "TRAINING_ROLE": None, "PADDLE_PSERVERS_IP_PORT_LIST": None},
    ]


@pytest.mark.parametrize(
    ("args", "visible", "message"),
    [
        (["--gpus=0,x"], None,
         r"--gpus must be GPU ids separated by commas \('0,1'\), found '0,x'"),
        (["--gpus=1,1"], None, r"--gpus names a GPU twice: '1,1'"),
        (["--nproc_per_node=3", "--gpus=0,1"], None,
         r"--nproc_per_node=3 and --gpus=0,1 \(2 GPUs\) do not match"),
        (["--server_num=1", "--worker_num=1", "--gpus=0"], None,
         "give either parameter-server options or --nproc_per_node/--gpus, not both"),
        (["--gpus=0,5"], "4,5",
         r"--gpus=0,5: GPU 0 is not in this environment's CUDA_VISIBLE_DEVICES='4,5'"),
    ],
)
def test_gpus_argument_errors(tmp_path, args, visible, message):
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    result = fleetrun(*args, "train.py", cwd=tmp_path, env=env)
    assert result.returncode == 2
    assert re.search(message, result.stderr), result.stderr


@pytest.mark.distributed
def test_a_collective_launch_of_a_script_without_is_collective_fails_naming_the_fix(tmp_path):
    # Without the check every rank ran a job of its own and printed "worker 0 of 1".
    script = tmp_path / "plain_init.py"
    # Each rank also writes its error to a file of its own: the two ranks' tracebacks
    # share one stderr, where they interleave character by character. torchrun
    # stops the other rank when the first fails, so on a loaded machine one rank
    # may be stopped before it writes: at least one file, each of them right.
    script.write_text(
        "import os\n"
        "from trainer import fleet\n"
        "try:\n"
        "    fleet.init()\n"
        "except Exception as error:\n"
        "    with open(f'error{os.environ[\"RANK\"]}.txt', 'w') as out:\n"
        "        out.write(f'{type(error).__name__}: {error}')\n"
        "    raise\n"
        "print(f'worker {fleet.worker_index()} of {fleet.worker_num()}', flush=True)\n"
    )
    result = fleetrun("--nproc_per_node=2", str(script), cwd=tmp_path, timeout=90)
    assert result.returncode != 0
    assert "worker 0 of 1" not in result.stdout
    written = sorted(tmp_path.glob("error*.txt"))
    assert written, result.stdout + result.stderr
    for path in written:
        rank = int(path.stem[len("error"):])
        error = path.read_text()
        assert re.fullmatch(
            rf"RoleError: this process is rank {rank} of WORLD_SIZE=2 \(torchrun, or fleetrun "
            r"--nproc_per_node\), but a parameter-server role maker \(fleet.init\(\) without "
            r"is_collective=True\) .* call fleet.init\(is_collective=True\) for a collective "
            r"job, or start a parameter-server job with fleetrun --server_num=S --worker_num=W",
            error,
        ), error


def console_fleetrun(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """fleetrun as its console script runs: from a folder of its own, first on
    sys.path (``python -m`` would put ``cwd`` there, where the user's module
    would hide fleetfeed's package from fleetrun itself)."""
    launcher = cwd / "bin" / "fleetrun"
    launcher.parent.mkdir(exist_ok=True)
    launcher.write_text("import sys\nfrom trainer.job.launch import main\nsys.exit(main())\n")
    return subprocess.run(
        [sys.executable, str(launcher), *args], cwd=cwd, capture_output=True, text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=30, check=False,
    )


def test_a_script_named_like_a_fleetfeed_package_is_refused_before_anything_starts(tmp_path):
    # Fleet's quick start launches `trainer.py`: here it would hide the trainer package
    # from every process of the job ("'trainer' is not a package").
    script = tmp_path / "trainer.py"
    script.write_text("from trainer import fleet\nfleet.init()\n")
    result = console_fleetrun("--server_num=1", "--worker_num=1", str(script), cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"fleetrun: {script} hides fleetfeed's trainer package: the job's processes run with "
        f"the script's folder, {tmp_path}, first on sys.path, so 'import trainer' there would "
        "load it instead; rename it (train.py, say)"
    )
    assert not (tmp_path / "log").exists()  # nothing was started


def test_a_package_folder_of_the_users_in_the_current_folder_stops_a_collective_job(tmp_path):
    # torchrun's agent starts with `python -m` from the current folder.
    (tmp_path / "jobs").mkdir()
    (tmp_path / "generators").mkdir()
    (tmp_path / "generators" / "__init__.py").write_text("")
    result = console_fleetrun("--nproc_per_node=2", str(tmp_path / "jobs" / "train.py"),
                              cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"fleetrun: {tmp_path / 'generators'} hides fleetfeed's generators package: the job's "
        f"processes run with the current folder (fleetrun starts torchrun with -m), {tmp_path}, "
        "first on sys.path, so 'import generators' there would load it instead; rename it"
    )


def test_hiding_modules_finds_modules_and_packages_not_namespace_folders(tmp_path):
    from trainer.job.launch import hiding_modules

    (tmp_path / "datafeed").mkdir()  # no __init__.py: a package later on the path wins
    assert hiding_modules(str(tmp_path)) == []
    (tmp_path / "datafeed.py").write_text("")
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "__init__.py").write_text("")
    assert hiding_modules(str(tmp_path)) == [
        ("datafeed", str(tmp_path / "datafeed.py")), ("trainer", str(tmp_path / "trainer")),
    ]
    assert hiding_modules(str(REPO)) == []  # fleetfeed's own packages


def test_import_trainer_names_a_module_that_hides_datafeed_or_generators(tmp_path):
    (tmp_path / "datafeed.py").write_text("")
    (tmp_path / "train.py").write_text("from trainer import fleet\n")
    done = subprocess.run(
        [sys.executable, str(tmp_path / "train.py")], capture_output=True, text=True,
        cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=60, check=False,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"ImportError: {tmp_path / 'datafeed.py'} hides fleetfeed's datafeed package: "
        "'import datafeed' finds it first on sys.path (a script's own folder comes first); "
        "rename it"
    )
