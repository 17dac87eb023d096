"""Nobody outside the job gets in, round two (issue 25): every job has a key,
on loopback too; a key file is private and a key is not guessable; reader
commands never see the key; and a peer that holds the key still cannot make a
server write or read outside its checkpoint root.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch
import zmq
from support import reserved_ports, wait_for
from test_ps import JOB_TIMEOUT, Model, start

from datafeed import InMemoryDataset, ReaderError, Slot
from trainer.job import keys
from trainer.job.errors import CheckpointError, RoleError, TrainerError
from trainer.job.role import ClusterRole, Role
from trainer.ps import server as handlers
from trainer.ps.checkpoint.confined import confined_directory
from trainer.ps.runtime import ParameterServerRuntime

KEY = "security-tests-job-key-0123456789abcdef"
NOBODY_UID = NOBODY_GID = 65534


# -- every job has a key ----------------------------------------------------------


def test_a_keyless_job_on_loopback_refuses_to_start_and_says_how_to_make_a_key(monkeypatch):
    monkeypatch.delenv(keys.INSECURE_ENV, raising=False)
    role = ClusterRole(Role.WORKER, 0, 1, ("127.0.0.1:1",))  # no job_secret
    runtime = ParameterServerRuntime(role, None)
    model = Model()
    runtime.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model)
    with pytest.raises(TrainerError) as info:
        runtime.init_worker()
    message = str(info.value)
    assert message.startswith("worker 0 has no job key: give every process of the job the same")
    assert "secrets.token_hex(32)" in message and "loopback is shared" in message
    assert "127.0.0.1:1" in message
    with pytest.raises(TrainerError, match=r"parameter server 0 has no job key"):
        keys.require_key_or_insecure(None, ["127.0.0.1:2"], "parameter server 0")


@pytest.mark.parametrize("given, message", [
    ("", r"expected a job key of at least 16 bytes .*found 0"),
    ("job-secret", r"expected a job key of at least 16 bytes .*found 10"),
    ("k" * 32, r"expected a random job key .*found one of only 1 distinct characters"),
])
def test_a_weak_key_given_in_code_is_refused_as_one_from_the_environment(
    monkeypatch, given, message
):
    # job_secret=os.environ.get("KEY", "") ran with keys anyone could derive.
    monkeypatch.setenv(keys.INSECURE_ENV, "1")  # no way around it
    role = ClusterRole(Role.WORKER, 0, 1, ("127.0.0.1:1",), job_secret=given)
    runtime = ParameterServerRuntime(role, None)
    model = Model()
    runtime.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model)
    with pytest.raises(RoleError, match="worker 0: the job key given: " + message):
        runtime.init_worker()
    keys.require_key_or_insecure(KEY, ["127.0.0.1:1"], "worker 0")  # a strong one runs


def test_insecure_still_runs_keyless_on_a_declared_trusted_network(monkeypatch, caplog):
    monkeypatch.setenv(keys.INSECURE_ENV, "1")
    keys.require_key_or_insecure(None, ["10.0.0.1:6001"], "worker 1")
    assert "worker 1 runs without a job key (FLEETFEED_INSECURE=1)" in caplog.text


# -- key files and keys ------------------------------------------------------------


def key_file(tmp_path: Path, content: bytes, mode: int = 0o600) -> str:
    path = tmp_path / "job.key"
    path.write_bytes(content)
    path.chmod(mode)
    return str(path)


def test_a_private_key_file_is_read(tmp_path):
    assert keys.read_job_key({keys.KEY_FILE_ENV: key_file(tmp_path, KEY.encode() + b"\n")}) == KEY


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_key_file_others_can_read_or_write_is_refused(tmp_path, mode):
    path = key_file(tmp_path, KEY.encode(), mode)
    with pytest.raises(RoleError, match=rf"found mode {mode:04o}: run chmod 600 {path}"):
        keys.read_job_key({keys.KEY_FILE_ENV: path})


def test_a_fifo_or_a_device_as_the_key_file_is_refused_without_reading_it(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)  # nobody writes into it: reading it would hang
    with pytest.raises(RoleError, match=r"expected a regular file, found a FIFO"):
        keys.read_job_key({keys.KEY_FILE_ENV: str(fifo)})
    with pytest.raises(RoleError, match=r"expected a regular file, found a character device"):
        keys.read_job_key({keys.KEY_FILE_ENV: "/dev/zero"})
    with pytest.raises(RoleError, match=r"expected a regular file, found a directory"):
        keys.read_job_key({keys.KEY_FILE_ENV: str(tmp_path)})


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the file to another user")
def test_a_key_file_another_user_owns_is_refused(tmp_path):
    path = key_file(tmp_path, KEY.encode())
    os.chown(path, NOBODY_UID, NOBODY_GID)
    with pytest.raises(RoleError, match=r"expected a file owned by this user .* uid 65534"):
        keys.read_job_key({keys.KEY_FILE_ENV: path})


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"0" * 16, r"expected a random job key .* only 1 distinct characters"),
        (b"abababababababababab", r"only 2 distinct characters"),
        (b"short", r"expected a job key of at least 16 bytes"),
        (b"\xff\xfe" * 20, r"expected the key as text .* not UTF-8"),
    ],
)
def test_weak_or_malformed_keys_are_refused(tmp_path, content, message):
    with pytest.raises(RoleError, match=message):
        keys.read_job_key({keys.KEY_FILE_ENV: key_file(tmp_path, content)})
    if b"\xff" not in content:
        with pytest.raises(RoleError, match=message):
            keys.read_job_key({keys.KEY_ENV: content.decode()})


# -- reader commands never see the key --------------------------------------------

# A pipe command that fails if any job key variable reached it, else copies its input.
KEY_FREE_CAT = (
    f"{sys.executable} -c \"import os, sys; "
    "seen = sorted(k for k in os.environ if k.startswith('FLEETFEED_JOB')); "
    "sys.exit('saw ' + ','.join(seen)) if seen else sys.stdout.write(sys.stdin.read())\""
)
# The same as a download command: the path comes last, after --.
KEY_FREE_DOWNLOAD = KEY_FREE_CAT.replace("sys.stdin.read()", "open(sys.argv[-1]).read()")


def test_reader_and_download_commands_run_without_the_job_key(tmp_path, monkeypatch):
    monkeypatch.setenv(keys.KEY_ENV, KEY)
    monkeypatch.setenv(keys.KEY_FILE_ENV, str(tmp_path / "job.key"))
    monkeypatch.setenv("FLEETFEED_JOB_SECRET", KEY)
    data = tmp_path / "part-0"
    data.write_text("1 5 1 0\n1 7 1 1\n")
    for settings in ({"pipe_command": KEY_FREE_CAT}, {"download_cmd": KEY_FREE_DOWNLOAD}):
        dataset = InMemoryDataset()
        dataset.init(batch_size=2, thread_num=1,
                     use_var=[Slot("ids", "uint64"), Slot("label", "int64", (1,))], **settings)
        dataset.set_filelist([str(data)])
        dataset.load_into_memory()
        assert dataset.get_memory_data_size() == 2, settings
    # The same command does see a variable of the job's own name: the check can fail.
    monkeypatch.setenv("FLEETFEED_JOB_OTHER", "x")
    dataset = InMemoryDataset()
    dataset.init(batch_size=2, thread_num=1, pipe_command=KEY_FREE_CAT,
                 use_var=[Slot("ids", "uint64"), Slot("label", "int64", (1,))])
    dataset.set_filelist([str(data)])
    with pytest.raises(ReaderError, match="saw FLEETFEED_JOB_OTHER"):
        dataset.load_into_memory()


# -- a key holder cannot name a path -------------------------------------------------


def test_a_directory_outside_the_root_or_through_a_link_is_refused(tmp_path):
    root = tmp_path / "root"
    (root / "ok").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "link").symlink_to(outside)
    (root / "file").write_text("x")
    checks = [
        (str(outside), r"is outside this server's checkpoint root"),
        ("../outside", r"is outside this server's checkpoint root"),
        ("ok/../../outside", r"is outside this server's checkpoint root"),
        ("link", r"expected a directory, found a symbolic link or a file"),
        ("link/inner", r"expected a directory, found a symbolic link or a file"),
        ("file/inner", r"expected a directory, found a symbolic link or a file"),
        ("", r"expected a checkpoint directory name"),
        ("a\0b", r"expected a checkpoint directory name"),
        (["list"], r"expected a checkpoint directory name"),
        # The root itself is not checked (a world-writable /tmp may be it): a
        # save there followed a link another user planted in it.
        (".", r"is this server's checkpoint root .* itself: name a directory under it"),
        ("ok/..", r"is this server's checkpoint root .* itself"),
        (str(root), r"is this server's checkpoint root .* itself"),
    ]
    for dirname, message in checks:
        with pytest.raises(CheckpointError, match=message):
            confined_directory(dirname, str(root), create=True)
    assert list(outside.iterdir()) == []  # nothing was made through the link
    made = confined_directory("ok/day1/delta", str(root), create=True)
    assert made == str(root / "ok" / "day1" / "delta")
    assert stat.S_IMODE(os.stat(made).st_mode) == 0o755
    assert confined_directory(str(root / "ok"), str(root), create=False) == str(root / "ok")
    with pytest.raises(CheckpointError, match=r"does not exist"):
        confined_directory("absent", str(root), create=False)
    (root / "open").mkdir(mode=0o777)
    (root / "open").chmod(0o777)
    with pytest.raises(CheckpointError, match=r"found mode 0777: run chmod go-w"):
        confined_directory("open/ckpt", str(root), create=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_a_directory_another_user_owns_is_refused(tmp_path):
    (tmp_path / "theirs").mkdir()
    os.chown(tmp_path / "theirs", NOBODY_UID, NOBODY_GID)
    with pytest.raises(CheckpointError, match=r"owned by uid 65534"):
        confined_directory("theirs/ckpt", str(tmp_path), create=True)


def test_a_key_holders_save_or_load_outside_the_root_writes_and_reads_nothing(
    tmp_path, monkeypatch
):
    """The wire's save and load handlers, as a peer with the key calls them: a
    path outside the root, or through a link planted inside it, is refused."""
    root = tmp_path / "root"
    root.mkdir()
    target = tmp_path / "home" / ".ssh"
    target.mkdir(parents=True)
    (root / "ckpt").symlink_to(target)
    monkeypatch.setenv("FLEETFEED_CHECKPOINT_ROOT", str(root))
    monkeypatch.delenv(keys.INSECURE_ENV, raising=False)
    role = ClusterRole(Role.SERVER, 0, 1, ("127.0.0.1:1",), job_secret=KEY)
    runtime = ParameterServerRuntime(role, None)
    model = Model()
    runtime.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model)
    runtime.init_server()
    handlers.install(runtime.server)
    try:
        for dirname in (str(target), "ckpt", "../home/.ssh"):
            with pytest.raises(CheckpointError):
                handlers.save(dirname, "base")
            with pytest.raises(CheckpointError):
                handlers.load(dirname)
        with pytest.raises(CheckpointError, match=r"expected a save of kind 'base' or 'delta'"):
            handlers.save("fine", "../../x")
        assert list(target.iterdir()) == []
        handlers.save("day1", "base")  # under the root: written
        assert sorted(p.name for p in (root / "day1").iterdir()) == [
            "dense.shard0.pt", "sparse.ps_emb.shard0.arrow", "sparse.ps_wide.shard0.arrow",
        ]
    finally:
        handlers.install(None)


# -- another user of the machine ------------------------------------------------------

# Run as nobody: reads the job's environment and key file, then asks the server
# with NULL security and with a made-up CURVE key. One JSON line of what it got.
OTHER_USER = textwrap.dedent(r"""
    import json, sys
    import zmq
    port, pid, key_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    got = {}
    for name, path in (("environ", f"/proc/{pid}/environ"), ("key file", key_path)):
        try:
            with open(path, "rb") as f:
                got[name] = f.read(64).hex()
        except OSError as err:
            got[name] = type(err).__name__
    request = json.dumps({"v": 1, "id": 1, "op": "describe", "body": [], "tensors": []}).encode()
    for name in ("null", "curve"):
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        if name == "curve":
            public, secret = zmq.curve_keypair()
            server_public, _ = zmq.curve_keypair()
            sock.curve_publickey, sock.curve_secretkey = public, secret
            sock.curve_serverkey = server_public
        sock.connect(f"tcp://127.0.0.1:{port}")
        sock.send_multipart([b"", request])
        got[name] = sock.recv_multipart() if sock.poll(2000) else None
        sock.close()
        ctx.term()
    shown = {k: v if v is None or isinstance(v, str) else "answered" for k, v in got.items()}
    print(json.dumps(shown))
""")


def accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture
def python_for_another_user():
    """A command that runs Python as nobody with pyzmq importable (a copy in a
    directory of its own under /tmp, removed afterwards), or None where this
    machine cannot (not root, no setpriv, no system Python of this version)."""
    system_python = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None or not os.path.exists(system_python):
        yield None
        return
    site = Path(tempfile.mkdtemp(prefix="fleetfeed-other-user-"))
    try:
        zmq_dir = Path(zmq.__file__).parent
        shutil.copytree(zmq_dir, site / "zmq")
        if (zmq_dir.parent / "pyzmq.libs").exists():
            shutil.copytree(zmq_dir.parent / "pyzmq.libs", site / "pyzmq.libs")
        subprocess.run(["chmod", "-R", "a+rX", str(site)], check=True)
        command = [setpriv, f"--reuid={NOBODY_UID}", f"--regid={NOBODY_GID}", "--clear-groups",
                   "env", f"PYTHONPATH={site}", system_python]
        probe = subprocess.run([*command, "-c", "import zmq"], capture_output=True, timeout=30)
        yield command if probe.returncode == 0 else None
    finally:
        shutil.rmtree(site)


@pytest.mark.slow
@pytest.mark.distributed
def test_another_user_of_the_machine_reaches_no_operation_of_a_job(
    tmp_path, python_for_another_user
):
    """A job on loopback, its key in a private file; the machine's user nobody
    can read neither the key file nor the job's environment, and no request of
    it is answered; the job then trains as usual."""
    command = python_for_another_user
    if command is None:
        pytest.skip("needs root, setpriv and /usr/bin/python of this version to run as nobody")
    key_path = key_file(tmp_path, KEY.encode())
    with reserved_ports(1) as (port,):
        base = {"servers": [f"127.0.0.1:{port}"], "workers": 1, "mode": "async",
                "out": str(tmp_path / "result"), "records": 1000, "secret": KEY}
        server = start({**base, "role": "server", "index": 0}, tmp_path, "server0")
        worker = None
        try:
            wait_for(lambda: accepts(port), "the server to listen", timeout=60,
                     details=lambda: (tmp_path / "server0.log").read_text()[-2000:])
            other = subprocess.run(
                [*command, "-c", OTHER_USER, str(port), str(server.pid), key_path],
                capture_output=True, text=True, timeout=60,
            )
            assert other.returncode == 0, other.stderr[-3000:]
            got = json.loads(other.stdout.strip().splitlines()[-1])
            worker = start({**base, "role": "worker", "index": 0}, tmp_path, "worker0")
            assert worker.wait(timeout=JOB_TIMEOUT) == 0, (tmp_path / "worker0.log").read_text()
            assert server.wait(timeout=60) == 0
        finally:
            for proc in (server, worker):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()
    assert got == {"environ": "PermissionError", "key file": "PermissionError",
                   "null": None, "curve": None}, got
    assert json.loads((tmp_path / "result.0").read_text())["auc"] > 0.7


@pytest.fixture
def installed_server(tmp_path, monkeypatch):
    """A server of test_ps's model (tables ps_emb of 8 and ps_wide of 1, one
    dense layer), its handlers installed as the wire calls them; 2 workers."""
    monkeypatch.setenv("FLEETFEED_CHECKPOINT_ROOT", str(tmp_path))
    role = ClusterRole(Role.SERVER, 0, 2, ("127.0.0.1:1",), job_secret=KEY)
    runtime = ParameterServerRuntime(role, None)
    model = Model()
    runtime.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model)
    runtime.init_server()
    handlers.install(runtime.server)
    yield runtime.server
    handlers.install(None)


def test_a_key_holder_cannot_speak_for_another_worker_or_stop_the_server(installed_server):
    # Every worker holds the key: worker_done for each index stopped the server
    # (exit 0, the real workers cut off), and a barrier could be released for
    # the others. An index now belongs to the connection that named it first.
    from trainer.job.errors import ServerCallError
    from trainer.ps import transport

    server = installed_server
    curve = transport.CurveKeys.from_job_key(KEY)
    with reserved_ports(1) as (port,):
        endpoint = f"127.0.0.1:{port}"
        listening = transport.ServerEndpoint(
            endpoint, curve, handlers.HANDLERS, threads=2, name="parameter server 0",
            worker_ops=handlers.WORKER_OPS, worker_num=2,
        )
        honest, hostile = (transport.ServerSet([endpoint], curve, 10.0) for _ in range(2))
        try:
            ids = torch.tensor([3, 4])
            honest.call(0, handlers.pull_step, 0, ["ps_emb"], ids)  # worker 0's connection
            with pytest.raises(ServerCallError, match=r"parameter server 0: worker 0 is "
                               r"another connection's; two processes were given the same"):
                hostile.call(0, handlers.worker_done, 0)
            with pytest.raises(ServerCallError, match=r"expected a worker index in \[0, 2\), "
                               r"found 5"):
                hostile.call(0, handlers.pull_step, 5, ["ps_emb"], ids)
            # The index nobody held is its own now: answered once every worker is done.
            its_done = hostile.request(0, "worker_done", 1)
            honest.call(0, handlers.pull_step, 0, ["ps_emb"], ids)
            assert not server.all_done.is_set()  # worker 0 still serves
            honest.call(0, handlers.worker_done, 0)
            hostile.wait(0, its_done, "worker_done")
            assert server.all_done.is_set()
        finally:
            honest.close()
            hostile.close()
            listening.close()


def test_a_key_holders_push_that_would_corrupt_the_model_is_refused(installed_server):
    server = installed_server
    before = {i: v.clone() for i, v in handlers.pull_dense().items()}
    ids = torch.tensor([3, 4])
    rows_before = handlers.pull_tables(["ps_emb"], ids, True)[0].clone()
    nan = torch.full((2, 8), float("nan"))
    bad_pushes = [
        ({}, {-1: torch.zeros(8)}, r"expected dense indices among .* \[0, 1\], found -1"),
        ({}, {7: torch.zeros(8)}, r"found 7"),
        ({}, {True: torch.zeros(8)}, r"found True"),
        ({}, {0: torch.zeros(3)}, r"dense parameter 0 has 8 values, found 3"),
        ({}, {0: torch.full((8,), float("inf"))}, r"expected finite values, found 8 NaN or inf"),
        # Each float dtype the wire carries, numpy's check and torch's (bfloat16).
        *(
            ({}, {0: torch.tensor([0.0] * 6 + [float("nan"), -float("inf")], dtype=dtype)},
             r"dense parameter 0: expected finite values, found 2 NaN or inf")
            for dtype in (torch.float16, torch.float64, torch.bfloat16)
        ),
        ({}, {0: torch.full((16,), float("inf"))[::2]}, r"found 8 NaN or inf"),  # strided
        ({}, {0: torch._neg_view(torch.full((8,), float("nan")))}, r"found 8 NaN"),  # lazy neg
        ({"ps_emb": (ids, nan)}, {}, r"table 'ps_emb': expected finite values"),
        # Finite as sent, infinite as stored (float32).
        ({}, {0: torch.full((8,), 1e39, dtype=torch.float64)},
         r"dense parameter 0: expected finite values, found 8 NaN or inf"),
        ({"ps_emb": (ids, torch.full((2, 8), -1e39, dtype=torch.float64))}, {},
         r"table 'ps_emb': expected finite values, found 16 NaN or inf"),
        ({"ps_emb": (ids, torch.zeros(2, 9))}, {}, r"expected values of shape \(2, 8\), found"),
        ({"ps_emb": (ids, torch.zeros(3, 8))}, {}, r"expected values of shape \(2, 8\), found"),
    ]
    for sparse, dense, message in bad_pushes:
        with pytest.raises(ValueError, match=message):
            handlers.push(0, sparse, dense)
        with pytest.raises(ValueError, match=message):
            handlers.push_sync(1, sparse, dense)
        with pytest.raises(ValueError, match=message):
            handlers.geo_push(0, sparse, dense)
    for i, values in handlers.pull_dense().items():
        assert torch.equal(values, before[i])
    assert torch.equal(handlers.pull_tables(["ps_emb"], ids, True)[0], rows_before)
    assert server.owned == [0, 1]


def test_a_geo_push_whose_sums_would_overflow_is_refused_unapplied(installed_server):
    ids = torch.tensor([3, 4])
    huge = 3e38  # finite in float32; a few of them added are not
    for sparse, dense, message in [
        ({}, {0: torch.full((8,), huge)},
         r"dense parameter 0 plus its delta would not be finite; nothing was added"),
        ({"ps_emb": (ids, torch.full((2, 8), -huge))}, {},
         r"table 'ps_emb': adding the delta of id \d+ .* would make its row not finite"),
    ]:
        for _ in range(8):
            dense_before = {i: v.clone() for i, v in handlers.pull_dense().items()}
            rows_before = handlers.pull_tables(["ps_emb"], ids, True)[0].clone()
            try:
                handlers.geo_push(0, sparse, dense)
            except ValueError as refused:
                assert re.search(message, str(refused)), refused
                break
        else:
            pytest.fail("eight pushes of 3e38 were all added")
        for i, values in handlers.pull_dense().items():
            assert torch.equal(values, dense_before[i]) and values.isfinite().all()
        rows = handlers.pull_tables(["ps_emb"], ids, True)[0]
        assert torch.equal(rows, rows_before) and rows.isfinite().all()


def test_a_pass_id_beyond_any_day_is_refused_and_saves_go_on(installed_server, tmp_path):
    for bad in (2**80, -1, 1.5, True, "3"):
        with pytest.raises(ValueError, match=r"expected a pass id in \[0, 2\*\*62\]"):
            handlers.set_pass(bad)
    handlers.set_pass(20261127)
    handlers.save("day", "base")
    assert (tmp_path / "day" / "sparse.ps_emb.shard0.arrow").stat().st_size > 0


# -- checkpoint files a key holder (or a disk) could hand a server --------------------


@pytest.fixture
def saved_checkpoint(installed_server, tmp_path) -> Path:
    handlers.push(0, {"ps_emb": (torch.arange(50), torch.ones(50, 8))}, {})
    handlers.save("day", "base")
    return tmp_path / "day"


def test_compressed_checkpoint_files_are_refused_before_they_are_inflated(saved_checkpoint):
    import pyarrow as pa

    from trainer.ps.checkpoint import directory, table_files

    rows = saved_checkpoint / "sparse.ps_emb.shard0.arrow"
    reader = pa.ipc.open_file(pa.memory_map(str(rows)))
    squeezed = saved_checkpoint / "squeezed.arrow"
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_file(str(squeezed), reader.schema, options=options) as writer:
        for i in range(reader.num_record_batches):
            batch, custom = reader.get_batch_with_custom_metadata(i)
            writer.write_batch(batch, custom_metadata=custom)
    table_files.open_shard(str(rows), table="ps_emb", dim=8)  # the original is fine
    with pytest.raises(CheckpointError, match=r"found message \d+ is a compressed record batch"):
        table_files.open_shard(str(squeezed), table="ps_emb", dim=8)

    import zipfile

    dense = saved_checkpoint / "dense.shard0.pt"
    deflated = saved_checkpoint / "deflated.pt"
    with zipfile.ZipFile(dense) as source, zipfile.ZipFile(deflated, "w") as target:
        for entry in source.infolist():
            target.writestr(entry.filename, source.read(entry), zipfile.ZIP_DEFLATED)
    assert directory.load_file(str(dense))["indices"].tolist() == [0, 1]
    with pytest.raises(CheckpointError, match=r"expected torch.save's uncompressed entries"):
        directory.load_file(str(deflated))


def test_a_fifo_or_a_huge_dim_as_a_table_file_is_refused(saved_checkpoint):
    import pyarrow as pa

    from trainer.ps.checkpoint import directory, table_files

    fifo = saved_checkpoint / "fifo.arrow"
    os.mkfifo(fifo)  # no writer: reading it would block forever
    with pytest.raises(CheckpointError, match=r"expected a regular file"):
        table_files.open_shard(str(fifo))
    with pytest.raises(CheckpointError, match=r"expected a regular file"):
        directory.load_file(str(fifo))
    rows = saved_checkpoint / "sparse.ps_emb.shard0.arrow"
    reader = pa.ipc.open_file(pa.memory_map(str(rows)))
    for dim, message in (("9" * 30, r"expected an int >= 0 \(below 10\*\*18\)"),
                         (str(2**40), r"expected at most 1048576")):
        wide = saved_checkpoint / "wide.arrow"
        metadata = {**reader.schema.metadata, b"dim": dim.encode()}
        with pa.ipc.new_file(str(wide), reader.schema.with_metadata(metadata)) as writer:
            writer.write_batch(reader.get_batch(0))
        with pytest.raises(CheckpointError, match=message):
            table_files.open_shard(str(wide))


def test_mutated_table_files_are_refused_with_a_checkpoint_error(saved_checkpoint):
    """Random byte changes, cuts and appends of a good table file: each one is
    accepted (it still checks) or refused with CheckpointError, never another
    error (raw OSError, UnicodeDecodeError, OverflowError were seen before)."""
    import random

    from trainer.ps.checkpoint import table_files

    good = (saved_checkpoint / "sparse.ps_emb.shard0.arrow").read_bytes()
    rng = random.Random(7)
    mutated = saved_checkpoint / "mutated.arrow"
    outcomes = {"accepted": 0, "refused": 0}
    for _ in range(300):
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            choice = rng.random()
            if choice < 0.6:
                data[rng.randrange(len(data))] = rng.randrange(256)
            elif choice < 0.8:
                del data[rng.randrange(len(data)):]
            else:
                data += bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
        mutated.write_bytes(bytes(data))
        try:
            table_files.open_shard(str(mutated), table="ps_emb", dim=8)
            outcomes["accepted"] += 1
        except CheckpointError:
            outcomes["refused"] += 1
    assert outcomes["refused"] > 250, outcomes


def test_worker_done_after_the_last_worker_holds_nothing(installed_server):
    """Once every worker stopped, each further worker_done completes at once
    and keeps no future (100k of them grew a server by 163 MiB before)."""
    server = installed_server
    assert not handlers.worker_done(0).done()
    assert handlers.worker_done(1).done() and server.all_done.is_set()
    for _ in range(1000):
        assert handlers.worker_done(1).result(timeout=1) is None
    assert server._stopped == []
