"""Attacks on the parameter server's wire, made as an outsider would make them.

A real server (``tests/trainer/test_ps.py``'s job script, with a job key) listens on
127.0.0.1; an outside process that does not hold the key tries what worked
against the torch.distributed.rpc transport (read the rendezvous store, join as
a peer, send a call whose argument is a pickle that runs ``os.system``) and
what a ZeroMQ-aware attacker would try (NULL and made-up CURVE handshakes).
Nothing it sends may run or be answered; the server logs each refused peer; and
the job then trains to its usual AUC. A peer that holds the key but sends
messages outside the protocol gets a ``ServerCallError`` and changes nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import zmq
from support import reserved_ports, wait_for
from test_ps import JOB_TIMEOUT, start

from trainer.job import keys
from trainer.job.errors import ServerCallError, TrainerError
from trainer.ps import transport, wire
from trainer.ps.server import HANDLERS

KEY = "attack-tests-job-key-0123456789abcdef"

# The outsider: every way in it knows, each bounded by a timeout. It prints one
# JSON line: what each attempt got back.
OUTSIDER = textwrap.dedent(r"""
    import json, os, pickle, socket, sys, datetime
    import zmq
    host, port, marker = sys.argv[1], int(sys.argv[2]), sys.argv[3]

    class RunsWhenUnpickled:
        def __reduce__(self):
            return (os.system, (f"id > {marker}",))

    evil = pickle.dumps(RunsWhenUnpickled())
    request = json.dumps({"v": 1, "id": 1, "op": "describe", "body": [], "tensors": []}).encode()
    got = {}

    def ask(configure, frames, name):
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        configure(sock)
        sock.connect(f"tcp://{host}:{port}")
        sock.send_multipart(frames)
        got[name] = sock.recv_multipart() if sock.poll(2000) else None
        sock.close()
        ctx.term()

    def null(sock):
        pass

    def made_up_curve(sock):
        public, secret = zmq.curve_keypair()
        server_public, _ = zmq.curve_keypair()
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = (
            server_public, public, secret)

    ask(null, [request], "null describe")
    ask(null, [evil], "null pickle")
    ask(made_up_curve, [request], "curve describe")

    # Raw bytes: a pickle, and torch rpc's old store protocol, straight at the port.
    with socket.create_connection((host, port), timeout=3) as raw:
        raw.settimeout(2)
        raw.sendall(evil)
        answer = b""
        try:
            answer = raw.recv(65536)
            while True:
                more = raw.recv(65536)
                if not more:
                    break
                answer += more
        except OSError:
            pass
    got["raw pickle"] = answer.hex()

    try:
        import torch.distributed as dist
        store = dist.TCPStore(host, port, is_master=False,
                              timeout=datetime.timedelta(seconds=3))
        got["store"] = repr(store.get("server0"))
    except Exception as error:
        got["store"] = f"refused: {type(error).__name__}"
    print(json.dumps({k: (v if isinstance(v, str) or v is None else "answered")
                      for k, v in got.items()}))
""")


@pytest.mark.slow
@pytest.mark.distributed
def test_an_outsider_without_the_key_runs_nothing_reads_nothing_and_is_logged(tmp_path):
    marker = tmp_path / "pwned"
    with reserved_ports(1) as (port,):
        eps = [f"127.0.0.1:{port}"]
        base = {"servers": eps, "workers": 1, "mode": "async", "out": str(tmp_path / "result"),
                "records": 2000, "secret": KEY, "epochs": 3}
        server = start({**base, "role": "server", "index": 0}, tmp_path, "server0")
        worker = None
        try:
            wait_for(lambda: _accepts(port), "the server to listen", timeout=60)
            outsider = subprocess.run(
                [sys.executable, "-c", OUTSIDER, "127.0.0.1", str(port), str(marker)],
                capture_output=True, text=True, timeout=60,
            )
            assert outsider.returncode == 0, outsider.stderr[-3000:]
            got = json.loads(outsider.stdout.strip().splitlines()[-1])
            worker = start({**base, "role": "worker", "index": 0}, tmp_path, "worker0")
            assert worker.wait(timeout=JOB_TIMEOUT) == 0, (tmp_path / "worker0.log").read_text()
            assert server.wait(timeout=60) == 0
        finally:
            for proc in (server, worker):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()
    assert not marker.exists(), "the outsider's pickle ran"
    assert got["null describe"] is None and got["null pickle"] is None
    assert got["curve describe"] is None
    # The raw connection gets ZeroMQ's greeting at most (10 bytes of signature
    # and version), never data of the job.
    assert len(bytes.fromhex(got["raw pickle"])) <= 64, got
    assert got["store"].startswith("refused"), got
    log = (tmp_path / "server0.log").read_text()
    # Refusals are logged, rate-limited (a retrying client must not flood the log).
    assert "refused a connection on 127.0.0.1" in log, log[-3000:]
    assert log.count("refused a connection") <= 3, log[-3000:]
    result = json.loads((tmp_path / "result.0").read_text())
    assert result["auc"] > 0.78, result  # the job trained as usual (one worker)


def _accepts(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class _Recorder:
    """Handlers that record what reached them (nothing may, for a bad message)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []
        self.handlers = {name: self._make(name) for name in HANDLERS}

    def _make(self, name: str):
        def handler(*args):
            self.calls.append((name, args))
            return {"ok": name}

        handler.__name__ = name
        return handler


@pytest.fixture
def keyed_endpoint():
    """A listening endpoint with recording handlers, and a worker-side ServerSet."""
    recorder = _Recorder()
    curve = transport.CurveKeys.from_job_key(KEY)
    with reserved_ports(1) as (port,):
        endpoint = f"127.0.0.1:{port}"
        server = transport.ServerEndpoint(endpoint, curve, recorder.handlers, 2, "test server")
        servers = transport.ServerSet([endpoint], curve, timeout=10)
        try:
            yield recorder, servers, endpoint
        finally:
            servers.close()
            server.close()


def _raw_request(endpoint: str, frames: list[bytes]) -> dict:
    """Sends ``frames`` as a keyed worker would, without the encoder's checks."""
    curve = transport.CurveKeys.from_job_key(KEY)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.curve_serverkey = curve.server_public
    sock.curve_publickey = curve.worker_public
    sock.curve_secretkey = curve.worker_secret
    sock.connect(f"tcp://{endpoint}")
    try:
        sock.send_multipart(frames)
        if not sock.poll(10_000):
            return {"no reply": True}
        return json.loads(sock.recv_multipart()[0])
    finally:
        sock.close()
        ctx.term()


def test_a_keyed_peer_outside_the_protocol_gets_an_error_and_runs_nothing(keyed_endpoint):
    recorder, servers, endpoint = keyed_endpoint

    def header(**fields) -> bytes:
        return json.dumps({"v": 1, "id": 5, **fields}).encode()

    cases = {
        "unknown op": [header(op="system", body=["id"], tensors=[])],
        "wrong argument kind": [header(op="table_size", body=[{"$t": 0}],
                                       tensors=[["float32", [1]]]), b"\0" * 4],
        "tensor bytes disagree with shape": [
            header(op="pull_tables", body=[["t"], {"$t": 0}, True], tensors=[["int64", [4]]]),
            b"\0" * 8,
        ],
        "dtype outside the list": [
            header(op="pull_tables", body=[["t"], {"$t": 0}, True], tensors=[["object", [1]]]),
            b"\0" * 8,
        ],
        "unknown tag": [header(op="table_size", body=[{"__reduce__": "os.system"}], tensors=[])],
    }
    for name, frames in cases.items():
        reply = _raw_request(endpoint, frames)
        assert reply.get("id") == 5 and reply["error"]["type"] == "ProtocolError", (name, reply)
    # Not JSON at all (a pickle): no reply, nothing run.
    assert _raw_request(endpoint, [b"\x80\x04\x95" + b"\0" * 16]) == {"no reply": True}
    assert recorder.calls == []
    # The same connection machinery still serves a well-formed call.
    assert servers.call(0, HANDLERS["table_size"], "t") == {"ok": "table_size"}
    assert recorder.calls == [("table_size", ("t",))]


def test_a_handlers_error_reaches_the_caller_as_a_server_call_error(keyed_endpoint):
    recorder, servers, endpoint = keyed_endpoint

    def failing(name: str):
        raise KeyError(f"no table {name!r}")

    recorder.handlers["table_size"] = failing
    with pytest.raises(ServerCallError, match="no table 'absent'") as info:
        servers.call(0, HANDLERS["table_size"], "absent")
    assert info.value.endpoint == endpoint and info.value.remote_type == "KeyError"


def test_the_wire_round_trips_every_kind_it_carries():
    rows = torch.arange(12, dtype=torch.float32).view(3, 4)
    body = [3, "t", True, None, 0.5, {"a": (torch.tensor([1, -2]), rows)}, {7: rows[0]}]
    frames = wire.encode({"v": 1, "id": 9, "op": "push"}, body)
    header, decoded = wire.decode([bytes(f) for f in frames])
    assert header == {"v": 1, "id": 9, "op": "push"}
    assert decoded[:5] == [3, "t", True, None, 0.5]
    ids, values = decoded[5]["a"]
    assert ids.tolist() == [1, -2] and torch.equal(values, rows)
    assert list(decoded[6]) == [7] and torch.equal(decoded[6][7], rows[0])
    with pytest.raises(TypeError, match="cannot send a object"):
        wire.encode({"v": 1, "id": 1}, object())


def test_every_operation_has_a_handler_and_a_signature():
    assert set(HANDLERS) == set(wire.OPS)


def test_a_keyless_job_across_hosts_refuses_to_start_unless_insecure(monkeypatch):
    monkeypatch.delenv(keys.INSECURE_ENV, raising=False)
    keys.require_key_or_insecure(None, ["127.0.0.1:1", "127.0.0.2:2"], "job")  # loopback: runs
    keys.require_key_or_insecure(KEY, ["10.1.2.3:1"], "job")  # a key: runs
    with pytest.raises(TrainerError, match=r"spans hosts \(10\.1\.2\.3:1\).*FLEETFEED_JOB_KEY"):
        keys.require_key_or_insecure(None, ["127.0.0.1:1", "10.1.2.3:1"], "job")
    monkeypatch.setenv(keys.INSECURE_ENV, "1")
    keys.require_key_or_insecure(None, ["10.1.2.3:1"], "job")


def test_the_job_key_comes_from_the_environment_or_a_file(tmp_path):
    assert keys.read_job_key({}) is None
    assert keys.read_job_key({"FLEETFEED_JOB_KEY": KEY}) == KEY
    path = tmp_path / "job.key"
    path.write_text(KEY + "\n")
    assert keys.read_job_key({"FLEETFEED_JOB_KEY_FILE": str(path)}) == KEY
    with pytest.raises(TrainerError, match="at least 16 bytes"):
        keys.read_job_key({"FLEETFEED_JOB_KEY": "short"})
    with pytest.raises(TrainerError, match="cannot read the job key"):
        keys.read_job_key({"FLEETFEED_JOB_KEY_FILE": str(tmp_path / "absent")})
    # Each use gets its own key; none of them is the job key.
    assert keys.derive(KEY, "a") != keys.derive(KEY, "b") and len(keys.derive(KEY, "a")) == 32


def test_a_worker_with_another_jobs_key_gets_no_answer(keyed_endpoint):
    _, _, endpoint = keyed_endpoint
    other = transport.ServerSet(
        [endpoint], transport.CurveKeys.from_job_key("another-jobs-key-0123456789"), timeout=1.5
    )
    try:
        started = time.monotonic()
        with pytest.raises(transport.ServerUnavailableError, match="did not answer"):
            other.call(0, HANDLERS["describe"])
        assert time.monotonic() - started < 5
    finally:
        other.close()


def test_the_job_key_never_appears_in_a_roles_repr():
    from trainer.job.role import ClusterRole, Role

    role = ClusterRole(Role.SERVER, 0, 1, ("127.0.0.1:1",), job_secret=KEY)
    assert KEY not in repr(role) and KEY not in str(role)  # fleet.init logs the role
    assert role.job_secret == KEY
