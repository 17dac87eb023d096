"""Attacks on the parameter server's wire, made as an outsider would make them.

A real server (``tests/trainer/test_ps.py``'s job script, with a job key) listens on
127.0.0.1; an outside process that does not hold the key tries what worked
against the torch.distributed.rpc transport (read the rendezvous store, join as
a peer, send a call whose argument is a pickle that runs ``os.system``) and
what a ZeroMQ-aware attacker would try (NULL and made-up CURVE handshakes).
Nothing it sends may run or be answered; the server logs each refused peer; and
the job then trains to its usual AUC. A peer that holds the key but sends
messages outside the protocol gets a ``ServerCallError`` and changes nothing.

What a peer can make a server hold or stop (issue 25): unauthenticated
connections that announce a 2 GiB handshake frame or sit idle, one message of a
key holder that used to kill the server's I/O thread, refusals that flooded the
log; and the wire's own limits, checked before anything is allocated. These
start the target of ``tests/helpers/wire_fuzz.py`` (the real handlers, in a
process of its own) where its memory or descriptors are measured.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import Future

import pytest
import torch
import wire_fuzz
import zmq
from support import reserved_ports, wait_for
from test_ps import JOB_TIMEOUT, start

from trainer.job import keys
from trainer.job.errors import ServerCallError, TrainerError
from trainer.ps import transport, wire
from trainer.ps.server import HANDLERS

KEY = "attack-tests-job-key-0123456789abcdef"

# The outsider: every way in it knows, each bounded by a timeout and all at
# once (each waits out its timeout when, as it must, nothing answers). It
# prints one JSON line: what each attempt got back.
OUTSIDER = textwrap.dedent(r"""
    import json, os, pickle, socket, sys, datetime, threading
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

    # Raw bytes: a pickle, and torch rpc's old store protocol, straight at the port.
    def raw_pickle():
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

    def store():
        try:
            import torch.distributed as dist
            client = dist.TCPStore(host, port, is_master=False,
                                   timeout=datetime.timedelta(seconds=3))
            got["store"] = repr(client.get("server0"))
        except Exception as error:
            got["store"] = f"refused: {type(error).__name__}"

    attempts = [
        threading.Thread(target=ask, args=(null, [request], "null describe")),
        threading.Thread(target=ask, args=(null, [evil], "null pickle")),
        threading.Thread(target=ask, args=(made_up_curve, [request], "curve describe")),
        threading.Thread(target=raw_pickle),
        threading.Thread(target=store),
    ]
    for attempt in attempts:
        attempt.start()
    for attempt in attempts:
        attempt.join()
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


def _raw_request(endpoint: str, frames: list[bytes], wait_s: float = 10.0) -> dict:
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
        if not sock.poll(int(wait_s * 1000)):
            return {"no reply": True}
        return json.loads(sock.recv_multipart()[0])
    finally:
        sock.close()
        ctx.term()


def test_a_keyed_peer_outside_the_protocol_gets_an_error_and_runs_nothing(keyed_endpoint):
    recorder, servers, endpoint = keyed_endpoint

    def header(**fields) -> bytes:
        return json.dumps({"v": wire.PROTOCOL_VERSION, "id": 5, **fields}).encode()

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
    # Not JSON at all (a pickle): no reply, nothing run. The errors above came
    # back within milliseconds; 2 s of silence is no reply.
    assert _raw_request(endpoint, [b"\x80\x04\x95" + b"\0" * 16], wait_s=2) == {"no reply": True}
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
    frames = wire.encode({"v": wire.PROTOCOL_VERSION, "id": 9, "op": "push"}, body)
    header, decoded = wire.decode([bytes(f) for f in frames])
    assert header == {"v": wire.PROTOCOL_VERSION, "id": 9, "op": "push"}
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
    keys.require_key_or_insecure(KEY, ["10.1.2.3:1"], "job")  # a key: runs
    # Loopback is no exception (every user of the machine reaches it):
    # tests/trainer/test_job_security.py.
    with pytest.raises(TrainerError, match=r"no job key: .*FLEETFEED_JOB_KEY.*10\.1\.2\.3:1"):
        keys.require_key_or_insecure(None, ["127.0.0.1:1", "10.1.2.3:1"], "job")
    monkeypatch.setenv(keys.INSECURE_ENV, "1")
    keys.require_key_or_insecure(None, ["10.1.2.3:1"], "job")


def test_the_job_key_comes_from_the_environment_or_a_file(tmp_path):
    assert keys.read_job_key({}) is None
    assert keys.read_job_key({"FLEETFEED_JOB_KEY": KEY}) == KEY
    path = tmp_path / "job.key"
    path.write_text(KEY + "\n")
    path.chmod(0o600)  # a key file others can read is refused (test_job_security.py)
    assert keys.read_job_key({"FLEETFEED_JOB_KEY_FILE": str(path)}) == KEY
    with pytest.raises(TrainerError, match="at least 16 bytes"):
        keys.read_job_key({"FLEETFEED_JOB_KEY": "short"})
    with pytest.raises(TrainerError, match="cannot read the job key"):
        keys.read_job_key({"FLEETFEED_JOB_KEY_FILE": str(tmp_path / "absent")})
    # Each use gets its own key; none of them is the job key.
    assert keys.derive(KEY, "a") != keys.derive(KEY, "b") and len(keys.derive(KEY, "a")) == 32


def test_a_worker_with_another_jobs_key_gets_no_answer_and_is_told_why(keyed_endpoint):
    _, _, endpoint = keyed_endpoint
    other = transport.ServerSet(
        [endpoint], transport.CurveKeys.from_job_key("another-jobs-key-0123456789"), timeout=5
    )
    try:
        started = time.monotonic()
        with pytest.raises(transport.ServerUnavailableError, match="did not answer") as info:
            other.call(0, HANDLERS["describe"])
        assert time.monotonic() - started < 10
        # Its connection closed during the handshake, and the error says what that means.
        assert transport.NO_HANDSHAKE in str(info.value)
        assert "FLEETFEED_JOB_KEY" in str(info.value)
    finally:
        other.close()


@pytest.mark.parametrize("keyed", [True, False])
def test_a_connection_that_drops_after_its_handshake_says_it_dropped(keyed):
    # A server that goes away mid-job: its connection had handshaken, so the
    # worker is not told about keys.
    key = KEY if keyed else None
    held = threading.Event()

    def hold() -> Future:
        held.set()
        return Future()  # answered never: the server goes first

    with reserved_ports(1) as (port,):
        endpoint = f"127.0.0.1:{port}"
        server = transport.ServerEndpoint(
            endpoint, transport.CurveKeys.from_job_key(key), {"hold": hold},
            threads=1, name="test server", ops={"hold": ()},
        )
        servers = transport.ServerSet([endpoint], transport.CurveKeys.from_job_key(key), 10.0)
        try:
            try:
                future = servers.request(0, "hold")
                assert held.wait(10), "the server never ran the call"
            finally:
                server.close()
            with pytest.raises(transport.ServerUnavailableError) as info:
                servers.wait(0, future, "hold")
        finally:
            servers.close()
    assert "the connection dropped" in str(info.value)
    assert transport.NO_HANDSHAKE not in str(info.value)


# ZMTP 3.0's greeting (rfc.zeromq.org/spec/23) of a peer that offers no security:
# a keyed worker refuses it itself, so ZeroMQ gives that connection up for good.
_NULL_GREETING = b"\xff" + bytes(8) + b"\x7f\x03\x00" + b"NULL".ljust(20, b"\x00") + bytes(32)


def test_a_worker_that_refuses_a_handshake_is_told_at_once_and_its_other_servers_answer(
    keyed_endpoint,
):
    # The worker's one I/O thread must not wait on the connection ZeroMQ gave
    # up: every server's calls go through it.
    _, _, keyed = keyed_endpoint
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)  # accept() wakes to see the test end
    accepted: list[socket.socket] = []
    done = threading.Event()

    def greet_every_connection() -> None:
        while not done.is_set():
            try:
                peer, _ = listener.accept()
            except TimeoutError:
                continue
            accepted.append(peer)
            with contextlib.suppress(OSError):  # the worker closed it first
                peer.sendall(_NULL_GREETING)

    greeter = threading.Thread(target=greet_every_connection, daemon=True)
    greeter.start()
    keyless = f"127.0.0.1:{listener.getsockname()[1]}"
    servers = transport.ServerSet(
        [keyless, keyed], transport.CurveKeys.from_job_key(KEY), timeout=10
    )
    try:
        for _ in range(3):
            started = time.monotonic()
            with pytest.raises(transport.ServerUnavailableError) as info:
                servers.call(0, HANDLERS["describe"])
            assert transport.NO_HANDSHAKE in str(info.value)
            assert time.monotonic() - started < 5  # told, not timed out (10 s)
            assert isinstance(servers.call(1, HANDLERS["describe"]), dict)
        assert len(accepted) == 1  # given up, not retried
    finally:
        servers.close()
        done.set()
        greeter.join(timeout=5)
        listener.close()
        for peer in accepted:
            peer.close()


def test_the_job_key_never_appears_in_a_roles_repr():
    from trainer.job.role import ClusterRole, Role

    role = ClusterRole(Role.SERVER, 0, 1, ("127.0.0.1:1",), job_secret=KEY)
    assert KEY not in repr(role) and KEY not in str(role)  # fleet.init logs the role
    assert role.job_secret == KEY


# -- issue 25: what an outsider or a key holder can make a server hold or stop ---------


def _worker_describe(endpoint: str, key: str, timeout: float) -> dict:
    """One legitimate call from a fresh worker: the server's description."""
    servers = transport.ServerSet([endpoint], transport.CurveKeys.from_job_key(key), timeout)
    try:
        return servers.call(0, HANDLERS["describe"])
    finally:
        servers.close()


@pytest.mark.slow
@pytest.mark.distributed
def test_unauthenticated_connections_announcing_2_gib_cost_the_server_little(tmp_path):
    # An outsider's handshake frame announcing 2 GiB used to be buffered whole:
    # +256 MB of RSS per connection (issue 25). 20 of them, 16 MiB sent each.
    with reserved_ports(1) as (port,):
        endpoint = f"127.0.0.1:{port}"
        with wire_fuzz.running_target(endpoint, tmp_path / "target.log") as target:
            assert _worker_describe(endpoint, wire_fuzz.FUZZ_KEY, timeout=20)["index"] == 0
            rss_before = target.rss_mib()
            connections, delivered = wire_fuzz.open_announcing_connections(
                "127.0.0.1", port, count=20, announced=2**31, payload_bytes=16 << 20
            )
            try:
                rss_during = target.rss_mib()
                # Its workers are served meanwhile, by the same socket.
                assert _worker_describe(endpoint, wire_fuzz.FUZZ_KEY, timeout=20)["index"] == 0
                rss_during = max(rss_during, target.rss_mib())
            finally:
                for sock in connections:
                    sock.close()
            assert target.alive(), target.log()[-3000:]
    growth = rss_during - rss_before
    assert growth <= 64, (
        f"20 connections announcing 2 GiB ({delivered >> 20} MiB of it taken) grew the "
        f"server's RSS by {growth:.0f} MiB, expected at most 64"
    )


@pytest.mark.slow
@pytest.mark.distributed
def test_idle_connections_neither_lock_workers_out_nor_stay(tmp_path):
    # 1,100 idle TCP connections used every descriptor of a server under
    # `ulimit -n 1024`; a new worker could not connect until they closed.
    import resource
    import socket

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = 1_100 + 200
    if hard != resource.RLIM_INFINITY and hard < max(needed, 2048):
        pytest.skip(f"the open-file hard limit ({hard}) leaves no room for the attack")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, needed), hard))
    idle: list[socket.socket] = []
    try:
        with reserved_ports(1) as (port,):
            endpoint = f"127.0.0.1:{port}"
            with wire_fuzz.running_target(
                endpoint, tmp_path / "target.log", open_files=1024
            ) as target:
                for number in range(1_100):
                    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    sock.setblocking(False)
                    sock.connect_ex(("127.0.0.1", port))  # never waits: backlog or not
                    idle.append(sock)
                    if number % 50 == 49:
                        time.sleep(0.02)  # paced, so that the server accepts each
                time.sleep(1.0)  # let the server accept what it can
                started = time.monotonic()
                answer = _worker_describe(endpoint, wire_fuzz.FUZZ_KEY, timeout=10)
                assert answer["index"] == 0
                assert time.monotonic() - started < 10
                # Connections that never authenticate are closed by the server's
                # handshake deadline (transport.HANDSHAKE_DEADLINE_S).
                connected = [s for s in idle if _connected(s)]
                assert len(connected) >= 1_000, len(connected)
                deadline = time.monotonic() + 15
                still_open = [
                    s for s in connected
                    if not wire_fuzz.closed_by_peer(s, max(0.01, deadline - time.monotonic()))
                ]
                assert not still_open, f"{len(still_open)} idle connections still open after 15s"
                assert target.alive(), target.log()[-3000:]
    finally:
        for sock in idle:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _connected(sock) -> bool:
    try:
        sock.getpeername()
        return True
    except OSError:
        return False


def _request_text(op: str, body: str, tensors: str = "[]") -> bytes:
    """A request header written as text: what json.dumps would refuse to write."""
    return (
        f'{{"v": {wire.PROTOCOL_VERSION}, "id": 5, "op": "{op}", "body": {body}, '
        f'"tensors": {tensors}}}'
    ).encode()


# One message each; every one of them used to kill the server's I/O thread.
STOPPING_MESSAGES = {
    "a 5000-digit integer": [_request_text("table_size", "[" + "9" * 5000 + "]")],
    "JSON nested 100,000 deep": [
        _request_text("table_size", "[" * 100_000 + "]" * 100_000)
    ],
    "a shape [0, 2**63]": [
        _request_text("add_clicks", '["t", {"$t": 0}, {"$t": 0}]', f'[["float32", [0, {2**63}]]]'),
        b"",
    ],
    "a shape whose strides overflow": [
        _request_text("add_clicks", '["t", {"$t": 0}, {"$t": 0}]',
                      f'[["float32", [{2**40}, 0, {2**40}, {2**40}]]]'),
        b"",
    ],
    "a dtype that is a list": [
        _request_text("table_size", '["t"]', '[[["float32"], [1]]]'), b"\0" * 4
    ],
}


@pytest.mark.parametrize("name", sorted(STOPPING_MESSAGES))
def test_no_single_message_from_a_key_holder_stops_the_server(keyed_endpoint, name):
    recorder, servers, endpoint = keyed_endpoint
    holder = wire_fuzz.KeyHolder(endpoint, wire_fuzz.FuzzCounts(), key=KEY, send_timeout_s=10)
    try:
        holder.send(STOPPING_MESSAGES[name])
        holder.check_alive(timeout=10)  # answered after it: the server goes on
        replies = holder.drain(wait_ms=200)
    finally:
        holder.close()
    # Refused with an error reply when its id could be read, else dropped.
    assert all(r.get("id") == 5 and r["error"]["type"] == "ProtocolError" for r in replies), replies
    assert recorder.calls == [("describe", ())]
    assert servers.call(0, HANDLERS["table_size"], "t") == {"ok": "table_size"}


def test_refused_messages_are_logged_at_a_bounded_rate(keyed_endpoint, caplog):
    _, _, endpoint = keyed_endpoint
    holder = wire_fuzz.KeyHolder(endpoint, wire_fuzz.FuzzCounts(), key=KEY, send_timeout_s=10)
    try:
        with caplog.at_level("WARNING", logger="trainer.ps.transport"):
            for _ in range(300):
                holder.send([_request_text("rm", "[]")])
            holder.check_alive(timeout=10)
    finally:
        holder.close()
    refused = [r for r in caplog.records if "refused a message" in r.getMessage()]
    assert 1 <= len(refused) <= 2, [r.getMessage() for r in refused[:5]]


def test_tensors_larger_than_a_frame_travel_in_frames_of_the_limit():
    big = torch.arange(wire.MAX_FRAME_BYTES // 2 + 5, dtype=torch.float32)  # 2 frames and a bit
    body = [big, torch.zeros(0, 3), torch.tensor(1.5), torch.ones(2, dtype=torch.bool)]
    frames = [bytes(f) for f in wire.encode({"v": wire.PROTOCOL_VERSION, "id": 1}, body)]
    assert [len(f) for f in frames[1:]] == [wire.MAX_FRAME_BYTES, wire.MAX_FRAME_BYTES, 20, 0, 4, 2]
    _, decoded = wire.decode(frames)
    assert torch.equal(decoded[0], big) and decoded[1].shape == (0, 3)
    assert decoded[2].item() == 1.5 and decoded[3].tolist() == [True, True]
    # The same bytes cut elsewhere are refused, before anything is allocated.
    recut = [frames[0], frames[1][:-1], frames[1][-1:] + frames[2], *frames[3:]]
    with pytest.raises(wire.ProtocolError, match=r"tensor 0: expected 2097172 bytes .* in 3 fr"):
        wire.decode(recut)


@pytest.mark.parametrize(("text", "expected"), [
    (_request_text("describe", "[" + "9" * 5000 + "]"), "one of 5000 characters"),
    (_request_text("describe", f"[{2**63}]"), "int64's range, found 9223372036854775808"),
    (_request_text("describe", "[NaN]"), "expected finite numbers, found NaN"),
    (_request_text("describe", "[1e999]"), "finite number .* found '1e999'"),
    (_request_text("describe", "[" * 25 + "]" * 25), "nested at most 24 deep, found 26 levels"),
    # Brackets inside strings are text, escaped quotes included.
    (_request_text("describe", '["[[[[[[[[[[[[[[[[[[[[[[[[[[\\"[[[[[[["]'), None),
    (b'{"v": 2, "id": 5, "body": "\\u00e9' + b"\xff" + b'"}', "UTF-8 JSON header"),
    (b'[1, 2]', "JSON object as header, found list"),
    (b'{"v": 2, "id": true}', "integer message id, found True"),
])
def test_a_header_outside_the_limits_is_refused_before_it_is_parsed(text, expected):
    if expected is None:
        header, body = wire.decode([text])
        assert body == ["[" * 26 + '"' + "[" * 7]
        return
    with pytest.raises(wire.ProtocolError, match=expected):
        wire.decode([text])


@pytest.mark.parametrize(("shape", "expected"), [
    ([0, 2**63], "int64's range"),
    ([2**40, 0, 2**40, 2**40], r"multiply to at most 1099511627776 .*found \[1099511627776, 0"),
    ([1, 1, 1, 1, 1], "at most 4 sizes"),
    ([True], "at most 4 sizes >= 0, found \\[True\\]"),
    ([-1], "sizes >= 0, found \\[-1\\]"),
])
def test_a_declared_shape_is_bounded_before_a_tensor_is_allocated(shape, expected):
    text = _request_text("add_clicks", '["t", {"$t": 0}, {"$t": 0}]',
                         "[" + json.dumps(["float32", shape]) + "]")
    with pytest.raises(wire.ProtocolError, match=expected) as info:
        wire.decode([text, b""])
    # Refused after its header was read: the error reply can name the request.
    assert info.value.request_id in (5, None)


def test_the_encoder_refuses_what_a_receiver_would_refuse():
    with pytest.raises(TypeError, match="integer of 64 bits; int64's range expected"):
        wire.encode({"v": wire.PROTOCOL_VERSION, "id": 1}, [2**63])
    with pytest.raises(TypeError, match="integer of 65 bits"):
        wire.encode({"v": wire.PROTOCOL_VERSION, "id": 1}, {2**64: 1})
    with pytest.raises(ValueError, match="header of .* bytes .* at most 1048576"):
        wire.encode({"v": wire.PROTOCOL_VERSION, "id": 1}, ["x" * wire.MAX_HEADER_BYTES])
